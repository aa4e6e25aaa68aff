"""A float model's MatMuls into trt-bridge's DynamicInt8Gemm plugin (``convert --activations dynamic`` on a
model with no quantization): INT8 without calibration data.

Before (a float source: nothing quantized)::

    x ─ MatMul(W float [K, N]) [─ Add(bias [N])] ─ y

After::

    x ─ DynamicInt8Gemm(weight = round(W / w_scale), weight_scale = max|W[:, n]| / 127, [bias]) ─ y

The weight is quantized symmetric int8 per output column, as lowering quantizes static weights; the
activation's scale is computed per inference (``--dynamic-granularity``: per tensor, or per token). Only
MatMuls whose weight is a constant 2-D matrix are taken: activation × activation products (attention) stay
float, as static conversion leaves them.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.dynamic_gemm_plugin import DynamicGemmMatch, per_column, write_plugin


def quantized_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` [K, N] as symmetric int8 with one float32 scale per column (1 for an all-zero column)."""
    amax = np.abs(weight).max(axis=0).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    return np.clip(np.rint(weight / scale), -127, 127).astype(np.int8), scale


class FloatGemmPlugin:
    name = "float-gemm-plugin"
    op_types = ("MatMul",)
    outcome = None  # a float model's MatMuls are not a finding of `check`

    def __init__(self, granularity: str = "tensor"):
        self.granularity = granularity

    def match(self, ctx: LiftContext, node: gs.Node) -> DynamicGemmMatch | str:
        x, w = node.inputs[0], node.inputs[1]
        if not isinstance(w, gs.Constant):
            return NOT_MINE  # activation × activation
        weight = w.values
        if weight.ndim != 2 or weight.dtype not in (np.float32, np.float16) or not np.all(np.isfinite(weight)):
            return f"its weight '{w.name}' is not a finite float 2-D matrix"
        end, bias, chain = node.outputs[0], None, (node,)
        readers = end.outputs
        if len(readers) == 1 and readers[0].op == "Add" and end not in ctx.graph.outputs:
            add = readers[0]
            addend = add.inputs[1] if add.inputs[0] is end else add.inputs[0]
            if isinstance(addend, gs.Constant) and addend.values.ndim <= 1 and addend.values.dtype == weight.dtype:
                bias = per_column(addend.values.astype(np.float32), weight.shape[1])
                if bias is not None and bias.size == weight.shape[1] and np.all(np.isfinite(bias)):
                    end, chain = add.outputs[0], (node, add)
                else:
                    bias = None
        q, scale = quantized_columns(weight.astype(np.float32))
        return DynamicGemmMatch(node, x, q, np.zeros(1, np.int32), scale, bias, end, chain)

    def rewrite(self, ctx: LiftContext, match: DynamicGemmMatch) -> None:
        write_plugin(ctx, match, self.granularity)
