"""Lift onnxruntime's fused dynamic MatMuls (com.microsoft) into one node of trt-bridge's DynamicInt8Gemm plugin
(``convert --activations dynamic``), as :mod:`trt_bridge.lift.dynamic_gemm_plugin` does for the plain ops.

Before (a ``quantize_dynamic`` model saved after onnxruntime's graph optimizations)::

    x ─ DynamicQuantizeMatMul(W_q, w_scale, w_zp, bias) ─ y
    x ─ DynamicQuantizeLinear ─ MatMulIntegerToFloat(x_q, W_q, x_scale, w_scale, x_zp, w_zp, bias) ─ y

After::

    x ─ DynamicInt8Gemm(weight = W_q − 128 if uint8, weight_zero_point, weight_scale, [bias]) ─ y

Both ops compute DynamicQuantizeLinear's uint8 codes, their int32 product with the weight's and the
dequantization in float32: the plugin's per-tensor granularity. onnxruntime's fused kernels may round the
float epilogue in another order than the plugin's (its decomposition is the plain ops), by an ulp or so.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import LiftContext
from trt_bridge.lift.dynamic_gemm_plugin import DynamicGemmMatch, gemm_match, per_column, write_plugin
from trt_bridge.lift.fused_dynamic_matmul import FusedDynamicMatMul
from trt_bridge.lift.scale_algebra import constant_values


class FusedDynamicGemmPlugin:
    name = "fused-dynamic-gemm-plugin"
    op_types = FusedDynamicMatMul.op_types
    outcome = ("lifted by rule 'fused-dynamic-gemm-plugin' to trt-bridge's DynamicInt8Gemm plugin: int8 "
               "weights, activation scales computed per inference (no calibration data)")

    def __init__(self, granularity: str = "tensor"):
        self.granularity = granularity

    def match(self, ctx: LiftContext, node: gs.Node) -> DynamicGemmMatch | str:
        found = FusedDynamicMatMul().match(ctx, node)  # the operands, checked as the static rule checks them
        if isinstance(found, str):
            return found
        n = found.w_q.shape[1]
        if found.w_q.dtype not in (np.int8, np.uint8):
            return f"its weight '{found.weight.name}' is not int8 or uint8"
        scale = per_column(constant_values(node.inputs[2 if node.op == "DynamicQuantizeMatMul" else 3]), n)
        if scale is None or scale.dtype != np.float32:
            return "its weight scale is not a float32 constant per tensor or per column"
        bias = None
        if found.bias is not None:
            bias = per_column(constant_values(found.bias), n)
            if bias is None or bias.dtype != np.float32 or bias.size != n:
                return f"its bias '{found.bias.name}' is not a float32 constant over the output columns"
        return gemm_match(node, found.x, found.w_q, per_column(found.zero_point, n), scale, bias, node.outputs[0],
                          (node,))

    def rewrite(self, ctx: LiftContext, match: DynamicGemmMatch) -> None:
        write_plugin(ctx, match, self.granularity)
