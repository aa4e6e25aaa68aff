"""Lift a dynamically quantized activation that is moved as integers and dequantized again.

onnxruntime's ``quantize_dynamic`` lets data-movement ops (``Transpose``, ``Reshape``, …) run on
the uint8 codes of a ``DynamicQuantizeLinear`` when their reader is quantized too, and dequantizes
with the same run-time scale and zero point where the reader is not (SegFormer's sequence reduction,
attention reshapes)::

    Before:  x ─ DynamicQuantizeLinear ─ x_q ─ [Transpose|Reshape|…]* ─ DQ(x_scale, x_zp) ─ y
                                       ├ x_scale ────────────────────────┘
                                       └ x_zp ───────────────────────────┘
    After:   x ─ [Transpose|Reshape|…]* ─ y

The float graph computes what the source meant (x moved, without the run-time rounding);
placement then decides where TensorRT quantizes, as for every other activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.dequantize_gathered import DATA_MOVEMENT, replay


@dataclass(frozen=True)
class DynamicPassThroughMatch:
    dq: gs.Node
    moves: list[gs.Node]  # the data-movement nodes, the DequantizeLinear's side first
    x: gs.Tensor  # the float input of DynamicQuantizeLinear


class DynamicPassThrough:
    name = "dynamic-pass-through"
    op_types = ("DequantizeLinear",)
    outcome = None  # no words of its own: check says "lifted by" the rule

    def match(self, ctx: LiftContext, node: gs.Node) -> DynamicPassThroughMatch | str:
        nodes: list[gs.Node] = []
        t = node.inputs[0]
        while len(t.inputs) == 1 and t.inputs[0].op in DATA_MOVEMENT and t.inputs[0].outputs[0] is t:
            nodes.append(t.inputs[0])
            t = t.inputs[0].inputs[0]
        producer = t.inputs[0] if len(t.inputs) == 1 else None
        if producer is None or producer.op != "DynamicQuantizeLinear" or producer.outputs[0] is not t:
            return NOT_MINE
        scale = node.inputs[1]
        zp = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
        if scale is not producer.outputs[1] or zp is not producer.outputs[2]:
            return (f"it dequantizes the codes of DynamicQuantizeLinear '{producer.name}' with another scale or "
                    "zero point than the ones that quantizer computed")
        return DynamicPassThroughMatch(node, nodes, producer.inputs[0])

    def rewrite(self, ctx: LiftContext, match: DynamicPassThroughMatch) -> None:
        node, nodes, current = match.dq, match.moves, match.x
        replay(ctx, nodes[::-1], current, node.outputs[0])
        if not nodes:  # DQ right after the quantizer: its readers read x
            out = node.outputs[0]
            for consumer in list(out.outputs):
                consumer.inputs[:] = [current if inp is out else inp for inp in consumer.inputs]
            if any(graph_out is out for graph_out in ctx.graph.outputs):
                ctx.graph.nodes.append(gs.Node("Identity", ctx.names(f"{node.name}_float"), {}, [current], [out]))
        node.outputs.clear()
