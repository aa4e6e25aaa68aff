"""Lift com.microsoft ``QAttention`` (``quantize_dynamic``/QOperator on onnxruntime's fused ``Attention``).

onnxruntime's quantizers turn the optimizer's ``Attention`` into ``QAttention``: its input is quantized
at run time (``DynamicQuantizeLinear``) or with a static ``QuantizeLinear``, and its packed Q/K/V
weight is stored as int8/uint8 codes with a scale and zero point per tensor or per column::

    Before:  x ─ DynamicQuantizeLinear|QuantizeLinear ─ x_q, s_x, z_x
             QAttention(x_q, W_q [D, q+k+v], bias, s_x, s_w, mask_index, z_x, z_w, past) ─ y

    After:   x ─ MatMul(W = (W_q − z_w)·s_w) ─ Add(bias) ─ (the attention of ``lift/ort_attention.py``) ─ y
             annotations: x → activation (calibrated; a static source's scale is kept),
                          W → weight, the source's integers where they fit symmetric int8

The projection is exactly what the kernel computes, (x_q − z_x)(W_q − z_w)·s_x·s_w + bias, with x_q
unquantized; the attention after it is the float ``Attention``'s. A key/value cache is declined
with the reason, as for ``Attention``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site
from trt_bridge.ir.graph_builder import present
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.dynamic_integer import static_activation
from trt_bridge.lift.ort_attention import MS, AttentionSpec, attention_spec, write_attention
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.lift.weights import lift_integer_weight


def _activation(node: gs.Node) -> tuple[gs.Tensor, float | None] | str:
    """The float input of ``node`` and its static scale (None: quantized at run time), or a reason."""
    x_q, scale, zp = node.inputs[0], node.inputs[3], present(node, 6)
    producer = x_q.inputs[0] if len(x_q.inputs) == 1 else None
    if producer is not None and producer.op == "DynamicQuantizeLinear" and producer.outputs[0] is x_q:
        if scale is not producer.outputs[1] or zp is not producer.outputs[2]:
            return (f"input scale/zero point ('{scale.name}', '{zp.name if zp is not None else ''}') are not "
                    f"those of DynamicQuantizeLinear '{producer.name}'")
        return producer.inputs[0], None
    if producer is not None and producer.op == "QuantizeLinear" and producer.outputs[0] is x_q:
        q_scale, k_scale = constant_values(producer.inputs[1]), constant_values(scale)
        if q_scale is None or k_scale is None or not np.array_equal(q_scale.reshape(-1), k_scale.reshape(-1)):
            return f"input scale '{scale.name}' is not the constant scale of QuantizeLinear '{producer.name}'"
        act = static_activation(node, 0, producer, zp)
        return act if isinstance(act, str) else (producer.inputs[0], act.static_scale)
    return f"input '{x_q.name}' is neither produced by DynamicQuantizeLinear nor by a QuantizeLinear"


def _per_column(values: np.ndarray | None, width: int, what: str) -> np.ndarray | str:
    if values is None:
        return f"the weight {what} is not a constant"
    if values.size not in (1, width):
        return f"the weight {what} has {values.size} values; expected 1 or {width} (one per column)"
    return values.reshape(() if values.size == 1 else (width,))


@dataclass(frozen=True)
class QAttentionMatch:
    node: gs.Node
    x: gs.Tensor  # the float input
    static_scale: float | None  # its scale where the source quantized it statically
    w_q: np.ndarray  # the packed Q/K/V weight's integers, its scale and zero point (0-d or per column)
    scale: np.ndarray
    zp: np.ndarray
    spec: AttentionSpec


class QAttention:
    name = "qattention"
    op_types = ("QAttention",)
    outcome = ("lifted by rule 'qattention' to MatMul on the source's int8 packed Q/K/V weights with a "
               "calibrated int8 activation Q/DQ (needs --calib-data for a dynamic source), then standard "
               "ONNX attention")

    def match(self, ctx: LiftContext, node: gs.Node) -> QAttentionMatch | str:
        if (node.domain or "") != MS:
            return NOT_MINE
        act = _activation(node)
        if isinstance(act, str):
            return act
        x, static_scale = act
        w_q = constant_values(node.inputs[1])
        if w_q is None or w_q.ndim != 2:
            return f"weight '{node.inputs[1].name}' is not a constant matrix"
        width = w_q.shape[1]
        scale = _per_column(constant_values(node.inputs[4]), width, "scale")
        zp_in = present(node, 7)
        zp = np.zeros((), np.int64) if zp_in is None else _per_column(constant_values(zp_in), width, "zero point")
        for value in (scale, zp):
            if isinstance(value, str):
                return value
        mask = present(node, 5)
        spec = attention_spec(node, ctx.graph, width, mask, x, past_index=8)
        if isinstance(spec, str):
            return spec
        return QAttentionMatch(node, x, static_scale, w_q, scale, zp, spec)

    def rewrite(self, ctx: LiftContext, match: QAttentionMatch) -> None:
        node, x, static_scale = match.node, match.x, match.static_scale
        base = node.name or node.outputs[0].name
        out, bias, w_tensor, mask = node.outputs[0], present(node, 2), node.inputs[1], present(node, 5)
        node.outputs.clear()
        node.inputs.clear()
        op_name = ctx.names(f"{base}/qkv")
        weight = lift_integer_weight(ctx, w_tensor, match.w_q, match.zp.astype(np.int64),
                                     match.scale.astype(np.float64), 1, Site(op_name, 1), node.name)
        qkv = gs.Variable(ctx.names(f"{base}/qkv_out"), dtype=np.float32)
        ctx.graph.nodes.append(gs.Node("MatMul", op_name, {}, [x, weight], [qkv]))
        if bias is not None:
            biased = gs.Variable(ctx.names(f"{base}/qkv_bias_out"), dtype=np.float32)
            ctx.graph.nodes.append(gs.Node("Add", ctx.names(f"{base}/qkv_bias"), {}, [qkv, bias], [biased]))
            qkv = biased
        write_attention(ctx, base, qkv, match.spec, mask, None, out)
        ctx.annotations.add_activation(x.name, Site(op_name, 0), node.name, scale=static_scale,
                                       source=None if static_scale is None else ScaleSource.MODEL,
                                       dynamic=static_scale is None)
