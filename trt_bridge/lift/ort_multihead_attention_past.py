"""Write onnxruntime's com.microsoft ``MultiHeadAttention`` with a key/value cache back as standard ONNX (exact).

A decoder's self-attention written as ``MultiHeadAttention`` takes the new tokens' keys and values and the cache
(``past_key``/``past_value``, inputs 6 and 7) and gives the cache after the step (``present_key``/``present_value``,
outputs 1 and 2, fed back as the past by the user's loop). The cache is the Concat onnxruntime's CPU kernel does,
the attention reads it, and the presents keep their names::

    Before:  q [B, S, D], k [B, S, D], v [B, S, Dv], past_key, past_value [B, N, P, H]
             ─ MultiHeadAttention(bias, key_padding_mask, attention_bias; num_heads N, unidirectional, scale,
                                  mask_filter_value) ─ y [B, S, Dv], present_key, present_value [B, N, P + S, H]

    After:   q, k, v [─ Add(bias part)] ─ Reshape [B, S, N, H] ─ Transpose [B, N, S, H]
             present_key   = Concat(past_key, k, axis 2)   (present_value likewise)
             scores = q × present_keyᵀ ─ Mul(scale) [─ Add(padding mask over the P + S keys)] [─ Add(attention_bias)]
                      [─ Where(key j > P + s, lowest float)]   (unidirectional: causal, aligned to the lower right)
             y = Softmax(scores) × present_value ─ Transpose ─ Reshape [B, S, Dv]

as onnxruntime 1.32's CPU kernel computes it: the key padding mask covers all P + S keys, as key lengths [B]
(keys at or after the length get ``mask_filter_value``, default −10000, added), a raw mask [B, P + S] or
[B, S, P + S] (0: the filter value added); ``attention_bias`` [B or 1, N or 1, S, P + S] is added; the causal
exclusion replaces the score outright (a query whose visible keys are all padded still attends to them).

Declined, with the reason: ``past_sequence_length``/``cache_indirection`` (the shared-buffer form of
``DecoderMaskedMultiHeadAttention``), keys and values already split into heads (4-D) beside a past, only one of the
past inputs, a past whose presents are not outputs of the node (onnxruntime 1.32's CPU kernel then reads memory it
never wrote), the ``output_qk`` output, and the [3B + 2] mask. Without a past the node is
``lift/ort_multihead_attention.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder, present, used
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.kv_attention import I64, merge_heads, split_heads
from trt_bridge.lift.ort_attention import MS, AttentionSpec
from trt_bridge.lift.ort_multihead_attention import attention_spec, cached, hidden_size


@dataclass(frozen=True)
class PastMultiHeadAttentionMatch:
    node: gs.Node
    spec: AttentionSpec


def _sizes(node: gs.Node, heads: int) -> list[int | None]:
    """The hidden sizes of the query, key and value: from the tensors, the packed bias, or the past's head size."""
    query, key, value, bias, past = (present(node, i) for i in (0, 1, 2, 3, 6))
    sizes = [hidden_size(t) for t in (query, key, value)]
    width = bias.shape[0] if bias is not None and bias.shape is not None else None
    if any(s is None for s in sizes) and isinstance(width, int) and width % 3 == 0:
        sizes = [s if s is not None else width // 3 for s in sizes]
    head = past.shape[3] if past is not None and past.shape is not None and len(past.shape) == 4 else None
    if any(s is None for s in sizes[:2]) and isinstance(head, int):
        sizes = [s if s is not None or i == 2 else head * heads for i, s in enumerate(sizes)]
    return sizes


class OrtMultiHeadAttentionPast:
    name = "ort-multihead-attention-past"
    op_types = ("MultiHeadAttention",)
    outcome = ("written back by rule 'ort-multihead-attention-past' as standard ONNX (the cache Concat of past and "
               "new keys and values, a causal mask aligned for the past, MatMul/Softmax attention); the cache inputs "
               "and outputs stay")

    def match(self, ctx: LiftContext, node: gs.Node) -> PastMultiHeadAttentionMatch | str:
        if (node.domain or "") != MS or not cached(node, ctx.graph):
            return NOT_MINE  # without a cache: lift/ort_multihead_attention.py
        if (present(node, 6) is None) != (present(node, 7) is None):
            return "only one of past_key and past_value is given; give both, or neither"
        for index, what in ((8, "past_sequence_length"), (9, "cache_indirection")):
            if present(node, index) is not None:
                return (f"input {index} ({what}) is given: the shared-buffer cache of DecoderMaskedMultiHeadAttention "
                        "is not written back")
        query, key, value = (present(node, i) for i in range(3))
        if key is None or value is None:
            return "query, key and value are packed into one input; only separate inputs are written back"
        for t in (query, key, value):
            if t.shape is not None and len(t.shape) != 3:
                return (f"input '{t.name}' has rank {len(t.shape)} beside a past; only [batch, sequence, hidden] "
                        "query, key and value are written back")
        outs = node.outputs
        if present(node, 6) is not None and (len(outs) < 3 or not outs[1].name or not outs[2].name):
            return ("past_key/past_value are given but present_key/present_value are not outputs of the node: "
                    "onnxruntime then reads memory it never wrote; declare both presents")
        if used(node, 3, ctx.graph):
            return "output 3 (output_qk) is read"
        heads = int(node.attrs.get("num_heads", 0))
        sizes = _sizes(node, heads)
        if heads <= 0 or any(s is None for s in sizes) or sizes[0] != sizes[1] or any(s % heads for s in sizes):
            return f"hidden sizes {sizes} of query, key, value do not split into num_heads={heads} heads"
        for index, size in ((6, sizes[1]), (7, sizes[2])):
            shape = present(node, index).shape if present(node, index) is not None else None
            if shape is not None and (len(shape) != 4 or any(isinstance(d, int) and d != want for d, want in
                                                             ((shape[1], heads), (shape[3], size // heads)))):
                return (f"past '{present(node, index).name}' has shape {list(shape)}, expected [batch, "
                        f"num_heads={heads}, past length, head size={size // heads}]")
        spec = attention_spec(node, query, present(node, 4), heads, sizes)
        return spec if isinstance(spec, str) else PastMultiHeadAttentionMatch(node, spec)

    def rewrite(self, ctx: LiftContext, match: PastMultiHeadAttentionMatch) -> None:
        node, spec = match.node, match.spec
        query, key, value, bias, mask, attention_bias, past_key, past_value = (
            present(node, i) for i in range(8))
        out, present_key, present_value = (list(node.outputs) + [None, None])[:3]
        present_key, present_value = (t if t is not None and t.name and used(node, i, ctx.graph) else None
                                      for i, t in ((1, present_key), (2, present_value)))
        node.outputs.clear()
        node.inputs.clear()
        b = GraphBuilder(ctx.graph, ctx.names, node.name or out.name, query.dtype or out.dtype or np.float32)
        if bias is not None:
            b_q, b_k, b_v = b.split(bias, list(spec.sizes), axis=0)
            query, key, value = b.op("Add", [query, b_q]), b.op("Add", [key, b_k]), b.op("Add", [value, b_v])
        heads = spec.num_heads
        q = split_heads(b, query, heads, spec.sizes[0] // heads)
        k, v = (_cache(b, past, split_heads(b, new, heads, size // heads), out) for past, new, size, out in
                ((past_key, key, spec.sizes[1], present_key), (past_value, value, spec.sizes[2], present_value)))
        scores = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], {"perm": [0, 1, 3, 2]})]),
                              b.const(spec.scale)])
        total = b.dim(k, 2, scalar=True)
        keys = b.op("Range", [b.const(0, I64), total, b.const(1, I64)], dtype=I64)  # [P + S]
        if mask is not None:
            scores = b.op("Add", [scores, _padding(b, spec, mask, keys)])
        if attention_bias is not None:
            scores = b.op("Add", [scores, attention_bias])
        if spec.unidirectional:  # query s sits at position P + s: the keys after it are excluded outright
            first = b.const(0, I64) if past_key is None else b.dim(past_key, 2, scalar=True)
            queries = b.op("Range", [first, total, b.const(1, I64)], dtype=I64)  # [S]
            future = b.op("Greater", [keys, b.unsqueeze(queries, [1], I64)], dtype=np.bool_)  # [S, P + S]
            scores = b.op("Where", [future, b.const(np.finfo(b.dtype).min), scores])
        probs = b.op("Softmax", [scores], {"axis": -1})
        merge_heads(b, b.op("MatMul", [probs, v]), spec.sizes[2], out=out)


def _cache(b: GraphBuilder, past: gs.Tensor | None, new: gs.Tensor, out: gs.Tensor | None) -> gs.Tensor:
    """The cache after the step, [B, N, P + S, H], into ``out`` where given: the past, then the new rows."""
    if past is not None:
        return b.op("Concat", [past, new], {"axis": 2}, out=out)
    return new if out is None else b.op("Identity", [new], out=out)


def _padding(b: GraphBuilder, spec: AttentionSpec, mask: gs.Tensor, keys: gs.Tensor) -> gs.Tensor:
    """The additive key padding mask over all ``keys`` (the past's and the new ones), broadcastable to the scores
    [B, N, S, P + S]: 0 where a key is attended, else the filter value."""
    zero, filt = b.const(0.0), b.const(spec.mask_filter)
    if spec.mask_form == "lengths":
        lengths = b.op("Cast", [mask], {"to": 7}, dtype=I64)
        valid = b.op("Less", [b.unsqueeze(keys, [0], I64), b.unsqueeze(lengths, [1], I64)], dtype=np.bool_)
        return b.unsqueeze(b.op("Where", [valid, zero, filt]), [1, 2], b.dtype)  # [B, 1, 1, P + S]
    nothing = gs.Constant(b.names(f"{b.base}/zero"), np.array(0, mask.dtype or np.int32))
    valid = b.op("Greater", [mask, nothing], dtype=np.bool_)
    return b.unsqueeze(b.op("Where", [valid, zero, filt]), [1] if spec.mask_form == "raw3d" else [1, 2], b.dtype)
