"""Fold a per-channel constant Add after a lifted Conv into the Conv's bias.

onnxruntime's ``quantize_dynamic`` drops a Conv's bias from ``ConvInteger`` and adds it after the
float epilogue; lifting then leaves ``Conv → Add(bias)``. TensorRT fuses a bias either way, but the
separate Add hides the Conv from placement's residual rule (a residual ``Add`` can fuse into the Conv
epilogue only when the Conv feeds it directly), and it costs a kernel where TensorRT does not fuse::

    Before:  x ─ Conv(W[, b0]) ─ y ─ Add(c: [C] / [C,1,1] / [1,C,1,1]) ─ z
    After:   x ─ Conv(W, b0 + c) ─ z

Only an Add of a constant that varies along the output channels alone is folded, and only when
the Conv's output has no other reader and is not a graph output. Exact up to float rounding order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.scale_algebra import constant_values


@dataclass(frozen=True)
class ConvBiasMatch:
    add: gs.Node
    conv: gs.Node
    bias: np.ndarray  # the Conv's bias plus the added constant, in the constant's type


class FoldConvBias:
    name = "conv-bias"
    op_types = ("Add",)
    outcome = None  # no words of its own: check says "lifted by" the rule

    def match(self, ctx: LiftContext, node: gs.Node) -> ConvBiasMatch | str:
        if len(node.inputs) != 2:
            return NOT_MINE
        for index in (0, 1):
            y, c = node.inputs[index], node.inputs[1 - index]
            conv = y.inputs[0] if len(y.inputs) == 1 else None
            if conv is None or conv.op != "Conv" or len(conv.outputs) != 1:
                continue
            values = constant_values(c)
            if values is None or not np.issubdtype(values.dtype, np.floating):
                continue
            if len(y.outputs) != 1 or any(t is y for t in ctx.graph.outputs):
                return NOT_MINE
            bias = _per_channel(values, conv, y)
            if bias is None:
                return NOT_MINE
            old = constant_values(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2].name else None
            if len(conv.inputs) > 2 and conv.inputs[2].name and old is None:
                return NOT_MINE
            total = bias.astype(np.float64) + (0.0 if old is None else old.astype(np.float64))
            return ConvBiasMatch(node, conv, total.astype(values.dtype))
        return NOT_MINE

    def rewrite(self, ctx: LiftContext, match: ConvBiasMatch) -> None:
        conv = match.conv
        const = gs.Constant(ctx.names(f"{conv.name}_bias_folded"), match.bias)
        if len(conv.inputs) > 2:
            conv.inputs[2] = const
        else:
            conv.inputs.append(const)
        z = match.add.outputs[0]
        match.add.outputs.clear()
        conv.outputs[0] = z


def _per_channel(values: np.ndarray, conv: gs.Node, y: gs.Tensor) -> np.ndarray | None:
    """``values`` as the Conv's [C] bias, if it varies along the output channels only."""
    weight = conv.inputs[1] if len(conv.inputs) > 1 else None
    if weight is None or weight.shape is None or not isinstance(weight.shape[0], int):
        return None
    channels = int(weight.shape[0])
    rank = len(y.shape) if y.shape is not None else len(weight.shape)
    if values.ndim > rank:
        return None
    shape = (1,) * (rank - values.ndim) + tuple(values.shape)
    if len(shape) < 2 or any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(values.reshape(-1), (channels,)).copy()
