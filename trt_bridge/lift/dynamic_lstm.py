"""Lift com.microsoft ``DynamicQuantizeLSTM`` (``quantize_dynamic`` on an LSTM) to a float ONNX ``LSTM``.

    Before:  X, W_q [D, I, 4H], R_q [D, H, 4H] (int8|uint8, transposed), B, …, W_scale, W_zp, R_scale, R_zp
             ─ com.microsoft.DynamicQuantizeLSTM ─ Y, Y_h, Y_c
    After:   X, W = ((W_q − W_zp)·W_scale)ᵀ [D, 4H, I], R = ((R_q − R_zp)·R_scale)ᵀ [D, 4H, H], B, …
             ─ LSTM ─ Y, Y_h, Y_c

The scales and zero points are per direction ([D]) or per gate row ([D, 4H]). The float
LSTM computes what the source meant with its own (dequantized) weights; TensorRT's ONNX
parser imports LSTM, and it stays in higher precision (TensorRT has no INT8 recurrence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import LiftContext, PendingConstant
from trt_bridge.lift.scale_algebra import constant_values


def _per_row(a: np.ndarray, directions: int, rows: int) -> np.ndarray | None:
    """A scale or zero point, broadcastable to the weight [directions, inputs, rows]."""
    a = a.astype(np.float64)
    if a.size == 1:
        return a.reshape(())
    if a.size == directions:
        return a.reshape(directions, 1, 1)
    if a.size == directions * rows:
        return a.reshape(directions, 1, rows)
    return None


def _dequantized(node: gs.Node, q: int, qparams: int, name: str) -> PendingConstant | str:
    """The float weight of input ``q``, whose scale and zero point are inputs ``qparams`` and ``qparams + 1``."""
    values, scale, zp = (constant_values(node.inputs[i]) if len(node.inputs) > i and node.inputs[i].name else None
                         for i in (q, qparams, qparams + 1))
    if values is None or scale is None:
        return f"{name} and its scale must be constants"
    if values.ndim != 3:
        return f"{name} has rank {values.ndim}, expected 3 ([directions, inputs, 4·hidden])"
    zp = np.zeros((), np.int64) if zp is None else zp
    d, _, rows = values.shape
    s, z = _per_row(scale, d, rows), _per_row(zp, d, rows)
    if s is None or z is None:
        return (f"{name}'s scale or zero point has shape {list(scale.shape)} / {list(zp.shape)}; "
                f"expected [{d}] or [{d}, {rows}]")
    floats = ((values.astype(np.float64) - z) * s).transpose(0, 2, 1).astype(np.float32)
    source = node.inputs[q]
    return PendingConstant(f"{source.name}_float", np.ascontiguousarray(floats), ("lstm", source.name, node.name))


@dataclass(frozen=True)
class DynamicLSTMMatch:
    node: gs.Node
    weights: tuple[PendingConstant, PendingConstant]  # W and R, dequantized and transposed


class DynamicQuantizeLSTM:
    name = "dynamic-lstm"
    op_types = ("DynamicQuantizeLSTM",)
    outcome = None  # no words of its own: check says "lifted by" the rule

    def match(self, ctx: LiftContext, node: gs.Node) -> DynamicLSTMMatch | str:
        # inputs: X, W_q, R_q, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zp, R_scale, R_zp
        weights = []
        for index, qparams, name in ((1, 8, "W"), (2, 10, "R")):
            w = _dequantized(node, index, qparams, name)
            if isinstance(w, str):
                return w
            weights.append(w)
        return DynamicLSTMMatch(node, tuple(weights))

    def rewrite(self, ctx: LiftContext, match: DynamicLSTMMatch) -> None:
        node = match.node
        weights = [w.make(ctx) for w in match.weights]
        inputs = [node.inputs[0], *weights, *node.inputs[3:8]]
        while inputs and inputs[-1].name == "":
            inputs.pop()
        outputs = list(node.outputs)
        node.outputs.clear()
        node.inputs.clear()
        attrs = {k: v for k, v in node.attrs.items() if k != "layout"}
        ctx.graph.nodes.append(gs.Node("LSTM", ctx.names(f"{node.name}_float"), attrs, inputs, outputs))
