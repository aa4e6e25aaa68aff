"""Lift ops that a QOperator model runs directly on quantized integers.

onnxruntime's QOperator format leaves ops that commute with quantization (MaxPool,
Reshape, Transpose, Resize, Pad, Split, ...) running on the uint8 tensors, with the
input's scale and zero point implied for the output. Written as float ops between
the same DQ and Q, they mean the same (DequantizeLinear is monotonic and
element-wise), and the Q/DQ rules can lift them like every other pair::

    Before:  … ─ Q(s, z) ─ x_q ─ MaxPool ─ y_q ─ …
    After:   … ─ Q(s, z) ─ x_q ─ DQ(s, z) ─ MaxPool ─ Q(s, z) ─ y_q ─ …

A constant Pad value ``c`` (an integer code) becomes the float ``(c − z)·s``.
ArgMax reads the dequantized input and keeps its int64 output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.scale_algebra import constant_values, quantizer_zero_point

#: ops whose output is quantized with the input's own scale and zero point
#: (GatherElements, GatherND: Intel Neural Compressor runs them on the codes too; ReduceMax, ReduceMin commute
#: with DequantizeLinear, which is increasing, as MaxPool does)
PASS_THROUGH = frozenset({
    "MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Resize", "Split", "Slice",
    "Gather", "GatherElements", "GatherND", "Pad", "Identity", "DepthToSpace", "SpaceToDepth", "Expand", "Tile",
    "Upsample", "ReduceMax", "ReduceMin",
})
#: ops that read a quantized tensor but produce no quantized output
INDEX_OUTPUT = frozenset({"ArgMax", "ArgMin"})


def _quantizer(tensor: gs.Tensor) -> gs.Node | None:
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is None or producer.op != "QuantizeLinear" or producer.outputs[0] is not tensor:
        return None
    return producer


@dataclass(frozen=True)
class IntegerPassThroughMatch:
    node: gs.Node
    qparams: list[gs.Tensor]  # the QuantizeLinear's scale [and zero point], for the new DQ and Qs
    #: a constant Pad's value in float (None: not a constant Pad), and whether it replaces input 2 (else it is
    #: appended after the pads)
    pad_value: float | None = None
    pad_replaces: bool = False


class IntegerPassThrough:
    name = "integer-pass-through"
    op_types = tuple(sorted(PASS_THROUGH | INDEX_OUTPUT))
    outcome = "lifted by rule 'integer-pass-through': the op runs on the float values between Q/DQ"

    def match(self, ctx: LiftContext, node: gs.Node) -> IntegerPassThroughMatch | str:
        if not node.inputs:
            return "no inputs"
        q = _quantizer(node.inputs[0])
        if q is None:
            return NOT_MINE  # a float op: nothing to lift
        scale = constant_values(q.inputs[1])
        zp_t = q.inputs[2] if len(q.inputs) > 2 and q.inputs[2].name else None
        zp = quantizer_zero_point(q)
        if scale is None or zp is None or scale.size != 1 or zp.size != 1:
            return f"QuantizeLinear '{q.name}' is not per tensor with constant scale and zero point"
        if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1].outputs:
            return "MaxPool's Indices output is used"
        qparams = [q.inputs[1]] + ([zp_t] if zp_t is not None else [])
        if node.op == "Pad" and len(node.inputs) > 2 and node.inputs[2].name:
            code = constant_values(node.inputs[2])
            if code is None:
                return "the Pad value is not a constant"
            value = (float(code.reshape(())) - float(zp.reshape(()))) * float(scale.reshape(()))
            return IntegerPassThroughMatch(node, qparams, value, pad_replaces=True)
        if node.op == "Pad" and (node.attrs.get("mode", "constant") in ("constant", b"constant")):
            if len(node.inputs) < 2:
                return "Pad without a pads input (opset < 11) is not lifted"
            return IntegerPassThroughMatch(node, qparams, -float(zp.reshape(())) * float(scale.reshape(())))  # code 0
        return IntegerPassThroughMatch(node, qparams)

    def rewrite(self, ctx: LiftContext, match: IntegerPassThroughMatch) -> None:
        node, qparams = match.node, match.qparams
        base = node.name or node.outputs[0].name
        x = gs.Variable(ctx.names(f"{node.inputs[0].name}_dequantized"), dtype=np.float32)
        new_nodes = [gs.Node("DequantizeLinear", ctx.names(f"{base}/dq"), {}, [node.inputs[0], *qparams], [x])]
        inputs = [x] + list(node.inputs[1:])
        if match.pad_value is not None:
            pad = gs.Constant(ctx.names(f"{base}/pad_value"), np.array(match.pad_value, np.float32))
            if match.pad_replaces:
                inputs[2] = pad
            else:
                inputs = inputs[:2] + [pad]
        outputs = list(node.outputs)
        if node.op in INDEX_OUTPUT:
            for out in outputs:
                out.inputs.clear()
            new_nodes.append(gs.Node(node.op, ctx.names(f"{base}/float"), dict(node.attrs), inputs, outputs))
        else:
            floats = [gs.Variable(ctx.names(f"{base}/float_out{i}"), dtype=np.float32) for i in range(len(outputs))]
            for out in outputs:
                out.inputs.clear()
            new_nodes.append(gs.Node(node.op, ctx.names(f"{base}/float"), dict(node.attrs), inputs, floats))
            for i, (f, out) in enumerate(zip(floats, outputs)):
                if node.op == "MaxPool" and i == 1:
                    continue
                new_nodes.append(gs.Node("QuantizeLinear", ctx.names(f"{base}/q{i}"), {}, [f, *qparams], [out]))
        ctx.graph.nodes.extend(new_nodes)
        node.inputs.clear()  # detach the source node, so its inputs' consumers are the new nodes only
        node.outputs.clear()
