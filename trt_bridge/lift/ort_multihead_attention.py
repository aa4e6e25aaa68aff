"""Write onnxruntime's fused com.microsoft ``MultiHeadAttention`` back as standard ONNX (exact).

``onnxruntime.transformers.optimizer`` writes it instead of ``Attention`` when asked for
(``FusionOptions.use_multi_head_attention``, and for cross attention): the Q, K and V projections stay
separate MatMuls (which quantizers quantize as any other) and only their bias is packed::

    Before:  q [B, S, D], k [B, L, D], v [B, L, Dv] ─ MultiHeadAttention(bias [D+D+Dv], key_padding_mask,
                                                         attention_bias; num_heads, scale, mask_filter_value) ─ y

    After:   q [+ b_q], k [+ b_k], v [+ b_v] ─ the heads of ``lift/ort_attention.py`` (Reshape, Transpose, MatMul,
             Mul(scale), the padding mask, Softmax, MatMul, Transpose, Reshape) ─ y [B, S, Dv]

The key padding mask takes the forms of ``Attention``'s: key lengths [B], a raw mask [B, L] or
[B, S, L]. Declined, with the reason: packed Q/K/V or K/V inputs, keys and values already split into heads
(4-D), the ``output_qk`` output, and [3B + 2] masks. A node with a key/value cache (``past_key``/``past_value``
given, or ``present_*`` read) is ``lift/ort_multihead_attention_past.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder, present, used
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.ort_attention import MS, AttentionSpec, mask_form, through_casts, write_heads
from trt_bridge.lift.scale_algebra import constant_values


def hidden_size(t: gs.Tensor) -> int | None:
    """The last dimension of ``t``: from its shape, or from the constant weight of the MatMul (and bias
    Add) that produced it."""
    if t.shape is not None and len(t.shape) and isinstance(t.shape[-1], int):
        return t.shape[-1]
    producer = t.inputs[0] if len(t.inputs) == 1 else None
    while producer is not None and producer.op == "Add":
        inner = [x for x in producer.inputs if constant_values(x) is None]
        producer = inner[0].inputs[0] if len(inner) == 1 and len(inner[0].inputs) == 1 else None
    if producer is not None and producer.op == "MatMul":
        weight = constant_values(producer.inputs[1])
        if weight is not None and weight.ndim >= 2:
            return int(weight.shape[-1])
    return None


def cached(node: gs.Node, graph: gs.Graph) -> bool:
    """Whether ``node`` (a MultiHeadAttention) reads or writes a key/value cache (``past_key``/``past_value`` given,
    ``present_*`` read): ``lift/ort_multihead_attention_past.py``'s rule, not this one."""
    return present(node, 6) is not None or present(node, 7) is not None or used(node, 1, graph) or used(node, 2, graph)


def _rank(t: gs.Tensor) -> int | None:
    shape = through_casts(t).shape
    return None if shape is None else len(shape)


def attention_spec(node: gs.Node, query: gs.Tensor, mask: gs.Tensor | None, heads: int,
                   sizes: list[int]) -> AttentionSpec | str:
    """A MultiHeadAttention node's spec (its key padding mask's form, causality, scale, filter value), or why its
    mask is not written back."""
    form = None
    if mask is not None:
        rank = _rank(mask)
        form = "lengths" if rank == 1 else mask_form(mask, query)
        batch = query.shape[0] if query.shape is not None else None
        if rank == 1 and isinstance(batch, int) and through_casts(mask).shape[0] == 3 * batch + 2:
            return f"key_padding_mask '{mask.name}' has the [3B + 2] form, which is not written back"
        if form not in ("lengths", "raw2d", "raw3d"):
            return form
    scale = float(node.attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(sizes[0] // heads))
    return AttentionSpec(heads, tuple(sizes), bool(int(node.attrs.get("unidirectional", 0))), scale,
                         float(node.attrs.get("mask_filter_value", -10000.0)), form)


@dataclass(frozen=True)
class MultiHeadAttentionMatch:
    node: gs.Node
    spec: AttentionSpec


class OrtMultiHeadAttention:
    name = "ort-multihead-attention"
    op_types = ("MultiHeadAttention",)
    outcome = ("written back by rule 'ort-multihead-attention' as standard ONNX (bias Add, Reshape, "
               "Transpose, MatMul, Softmax)")

    def match(self, ctx: LiftContext, node: gs.Node) -> MultiHeadAttentionMatch | str:
        if (node.domain or "") != MS:
            return NOT_MINE
        query, key, value = (present(node, i) for i in range(3))
        if key is None or value is None:
            return "query, key and value are packed into one input; only separate inputs are written back"
        for t in (query, key, value):
            if t.shape is not None and len(t.shape) != 3:
                return f"input '{t.name}' has rank {len(t.shape)}; only [batch, sequence, hidden] inputs are " \
                       "written back"
        if cached(node, ctx.graph):
            return NOT_MINE  # a key/value cache: lift/ort_multihead_attention_past.py
        for index, what in ((8, "past_sequence_length"), (9, "cache_indirection")):
            if present(node, index) is not None:
                return f"input {index} ({what}) is given; only attention without a key/value cache is written back"
        if used(node, 3, ctx.graph):
            return "output 3 (output_qk) is read"
        heads = int(node.attrs.get("num_heads", 0))
        bias, mask = present(node, 3), present(node, 4)
        sizes = [hidden_size(t) for t in (query, key, value)]
        bias_values = None if bias is None else bias.shape
        if any(s is None for s in sizes) and bias_values is not None and isinstance(bias_values[0], int) \
                and bias_values[0] % 3 == 0:
            sizes = [s if s is not None else bias_values[0] // 3 for s in sizes]
        if heads <= 0 or any(s is None for s in sizes) or sizes[0] != sizes[1] or any(s % heads for s in sizes):
            return f"hidden sizes {sizes} of query, key, value do not split into num_heads={heads} heads"
        spec = attention_spec(node, query, mask, heads, sizes)
        return spec if isinstance(spec, str) else MultiHeadAttentionMatch(node, spec)

    def rewrite(self, ctx: LiftContext, match: MultiHeadAttentionMatch) -> None:
        node, spec = match.node, match.spec
        query, key, value = (present(node, i) for i in range(3))
        bias, mask, attention_bias = present(node, 3), present(node, 4), present(node, 5)
        out = node.outputs[0]
        node.outputs.clear()
        node.inputs.clear()
        b = GraphBuilder(ctx.graph, ctx.names, node.name or out.name, query.dtype or out.dtype or np.float32)
        q, k, v = query, key, value
        if bias is not None:
            b_q, b_k, b_v = b.split(bias, list(spec.sizes), axis=0)
            q, k, v = b.op("Add", [q, b_q]), b.op("Add", [k, b_k]), b.op("Add", [v, b_v])
        write_heads(b, q, k, v, spec, mask, attention_bias, out)
