"""Carry a source activation scale through the data-movement ops it was quantized in front of.

Quantizers that propagate their quantizers upwards (NNCF: through Transpose, Reshape, MaxPool, …,
"quantization-agnostic" ops) put the Q/DQ pair of a Conv's or MatMul's input in front of the ops
that move the tensor to it. TensorRT quantizes the weighted op's input itself (placement drops the
site on the Transpose), so without this rule that input would be left in float::

    Before:  x ─ Q(s) ─ DQ(s) ─ Transpose ─ Reshape ─ Conv            (after qdq-pair: x annotated at Transpose:0)
    After:   x ─ Transpose ─ t ─ Reshape ─ r ─ Conv                   annotations: x, t and r → scale s
                                                                     (sites Transpose:0, Reshape:0, Conv:0)

    Before:  x ─ Q(s) ─ DQ(s) ─ Pad(0) ─ Conv                         (MobileNetV2's "same" padding)
    After:   x ─ Pad(0) ─ p ─ Conv                                    annotations: x and p → scale s

Exact: these ops only move, select, repeat (nearest Resize, reflect/edge Pad, Pad with 0) or take
the maximum of values, and per-tensor quantization commutes with all of them (the source's DQ
output, moved, is the moved tensor's Q/DQ with the same scale). A tensor the source quantized on its
own keeps its own scale. Placement then keeps the sites TensorRT fuses (the Conv's input) and drops
the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ActivationSpec, ScaleSource, Site
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.dequantize_gathered import DATA_MOVEMENT
from trt_bridge.lift.scale_algebra import constant_values

#: ops whose first output, quantized per tensor, equals the op applied to the quantized first input
#: (Pad and Resize under the conditions :func:`_moves_only` checks)
COMMUTES = DATA_MOVEMENT | {"MaxPool", "DepthToSpace", "SpaceToDepth", "Pad", "Resize"}


def _moves_only(node: gs.Node) -> str | None:
    """Why ``node`` computes values its input does not hold (so the source's scale would not carry), or None."""
    if node.op == "Pad" and node.attrs.get("mode", "constant") == "constant":
        value = constant_values(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
        if len(node.inputs) > 2 and node.inputs[2].name and (value is None or np.any(value != 0)):
            return "Pad writes a constant other than 0 (not exactly on the quantization grid)"
    if node.op == "Resize" and node.attrs.get("mode", "nearest") != "nearest":
        return NOT_MINE  # interpolation makes new values: the input's scale is not the output's
    return None


@dataclass(frozen=True)
class MovedScaleMatch:
    moved: gs.Tensor  # the op's output, to annotate
    spec: ActivationSpec  # the source's annotation of the op's input


class ScaleThroughMovement:
    name = "qdq-through-data-movement"
    op_types = tuple(sorted(COMMUTES))
    outcome = None  # no words of its own: check says "lifted by" the rule

    def match(self, ctx: LiftContext, node: gs.Node) -> MovedScaleMatch | str:
        if not node.inputs or not node.outputs:
            return NOT_MINE
        x, y = node.inputs[0], node.outputs[0]
        spec = ctx.annotations.activations.get(x.name)
        if spec is None or spec.scale is None or spec.source is not ScaleSource.MODEL \
                or Site(node.name, 0) not in spec.sites:
            return NOT_MINE  # the source did not quantize this op's input
        if y.name in ctx.annotations.activations or not y.outputs:
            return NOT_MINE  # the source quantized the moved tensor itself (its own scale wins), or no reader
        if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1].outputs:
            return "MaxPool's indices output is read"
        why = _moves_only(node)
        if why is not None:
            return why
        if y.dtype is not None and not isinstance(y.dtype, int) and not np.issubdtype(np.dtype(y.dtype), np.floating):
            return NOT_MINE
        return MovedScaleMatch(y, spec)

    def rewrite(self, ctx: LiftContext, match: MovedScaleMatch) -> None:
        y, spec = match.moved, match.spec
        for consumer in y.outputs:
            for index, tensor in enumerate(consumer.inputs):
                if tensor is y:
                    ctx.annotations.add_activation(y.name, Site(consumer.name, index), spec.origin, spec.scale,
                                                   ScaleSource.MODEL)
        moved = ctx.annotations.activations[y.name]
        moved.model_range, moved.format = spec.model_range, spec.format  # an FP8 source's scale stays FP8
