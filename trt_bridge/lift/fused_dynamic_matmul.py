"""Lift onnxruntime's fused dynamic MatMuls (com.microsoft) back to a float MatMul.

A ``quantize_dynamic`` model saved after onnxruntime's graph optimizations carries
fused contrib ops instead of the plain pattern::

    Before:  x ─ DynamicQuantizeMatMul(W_q, w_scale, w_zp, bias) ─ y
             x ─ DynamicQuantizeLinear ─ x_q, s_x, z_x
                 MatMulIntegerToFloat(x_q, W_q, s_x, w_scale, z_x, w_zp, bias) ─ y

    After:   x ─ MatMul(W) [─ Add(bias)] ─ y
             annotations: x → activation (calibrated); W = (W_q − w_zp)·w_scale → weight
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import Site
from trt_bridge.lift.base import LiftContext
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.lift.weights import lift_integer_weight


def _optional(node: gs.Node, index: int) -> gs.Tensor | None:
    if len(node.inputs) <= index or node.inputs[index].name == "":
        return None
    return node.inputs[index]


@dataclass(frozen=True)
class FusedDynamicMatMulMatch:
    node: gs.Node
    x: gs.Tensor  # the float input
    weight: gs.Tensor  # the integer weight, its values, scale and zero point (0-d or per column)
    w_q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    bias: gs.Tensor | None


class FusedDynamicMatMul:
    name = "fused-dynamic-matmul"
    op_types = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat")
    outcome = ("lifted by rule 'fused-dynamic-matmul' to MatMul on the source's int8 weights, with a "
               "calibrated int8 activation Q/DQ (needs --calib-data)")

    def match(self, ctx: LiftContext, node: gs.Node) -> FusedDynamicMatMulMatch | str:
        if (node.domain or "") != "com.microsoft":
            return f"{node.op} in domain '{node.domain}' is not onnxruntime's contrib op"
        if node.op == "DynamicQuantizeMatMul":
            x, w_index, scale_index, zp_index, bias_index = node.inputs[0], 1, 2, 3, 4
        else:
            a_q = node.inputs[0]
            producer = a_q.inputs[0] if len(a_q.inputs) == 1 else None
            if producer is None or producer.op != "DynamicQuantizeLinear" or producer.outputs[0] is not a_q:
                return f"input '{a_q.name}' does not come from DynamicQuantizeLinear"
            if node.inputs[2] is not producer.outputs[1]:
                return (f"input scale '{node.inputs[2].name}' is not the scale of "
                        f"DynamicQuantizeLinear '{producer.name}'")
            a_zp = _optional(node, 4)
            if a_zp is not producer.outputs[2]:
                return (f"input zero point ({'missing' if a_zp is None else repr(a_zp.name)}) is not "
                        f"'{producer.outputs[2].name}' of DynamicQuantizeLinear '{producer.name}': the uint8 "
                        "codes would be multiplied without their zero point subtracted")
            x, w_index, scale_index, zp_index, bias_index = producer.inputs[0], 1, 3, 5, 6

        w_q = constant_values(node.inputs[w_index])
        scale = constant_values(node.inputs[scale_index])
        zp_tensor = _optional(node, zp_index)
        zero_point = np.zeros((), np.int64) if zp_tensor is None else constant_values(zp_tensor)
        if w_q is None or scale is None or zero_point is None:
            return "the weight, its scale and its zero point must be constants"
        if w_q.ndim != 2:
            return f"weight '{node.inputs[w_index].name}' has rank {w_q.ndim}; only 2-D weights are lifted"
        channels = w_q.shape[-1]
        if scale.size not in (1, channels) or zero_point.size not in (1, channels):
            return "weight scale/zero point are neither per tensor nor per output column"
        scale = scale.astype(np.float64).reshape(() if scale.size == 1 else (channels,))
        zero_point = zero_point.astype(np.int64).reshape(() if zero_point.size == 1 else (channels,))
        return FusedDynamicMatMulMatch(node, x, node.inputs[w_index], w_q, scale, zero_point,
                                       _optional(node, bias_index))

    def rewrite(self, ctx: LiftContext, match: FusedDynamicMatMulMatch) -> None:
        node, x, bias = match.node, match.x, match.bias
        base = node.name or node.outputs[0].name
        op_name = ctx.names(f"{base}/float")
        weight = lift_integer_weight(ctx, match.weight, match.w_q, match.zero_point, match.scale, 1, Site(op_name, 1),
                                     node.name)
        y = node.outputs[0]
        result = y if bias is None else gs.Variable(ctx.names(f"{base}/float_out"), dtype=np.float32)
        y.inputs.clear()
        ctx.graph.nodes.append(gs.Node("MatMul", op_name, {}, [x, weight], [result]))
        if bias is not None:
            ctx.graph.nodes.append(gs.Node("Add", ctx.names(f"{base}/bias"), {}, [result, bias], [y]))
        ctx.annotations.add_activation(x.name, Site(op_name, 0), node.name, dynamic=True)
