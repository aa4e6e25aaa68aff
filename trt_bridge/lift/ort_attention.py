"""Write onnxruntime's fused com.microsoft ``Attention`` back as standard ONNX (exact).

``onnxruntime.transformers.optimizer`` fuses a BERT self-attention block into one ``Attention``
node with the Q, K and V projections packed into one weight; TensorRT has no importer for it::

    Before:  x [B, S, D] ─ Attention(W [D, q+k+v], bias [q+k+v], mask_index, attention_bias;
                                     num_heads N, qkv_hidden_sizes, unidirectional, scale, mask_filter_value) ─ y

    After:   x ─ MatMul(W) ─ Add(bias) ─ Split(q, k, v)
               q ─ Reshape [B,S,N,h] ─ Transpose(0,2,1,3) ──┐
               k ─ Reshape [B,S,N,h] ─ Transpose(0,2,3,1) ── MatMul ─ Mul(scale) [─ Add(padding mask)]
                   [─ Add(attention_bias)] [─ Where(key after query, lowest float)] ─ Softmax ──┐
               v ─ Reshape [B,S,N,hv] ─ Transpose(0,2,1,3) ───────────────────────────────── MatMul
                   ─ Transpose(0,2,1,3) ─ Reshape [B, S, v] ─ y

The padding mask follows onnxruntime's CPU kernel: a raw mask [B, S] or [B, S, S] gives
``mask_filter_value`` (default −10000) where it is 0, else 0; key lengths [B] mask the keys at or
after each length, and [2B] (end positions, then start positions) also those before each start.
``unidirectional`` excludes the keys after each query outright: the lowest float replaces their
score, so a query whose every visible key is padded still attends to those keys, as in onnxruntime.

Declined, with the reason: a key/value cache (``past``/``present``, ``past_sequence_length``),
rotary embedding, 4-D (Megatron) masks, and masks whose rank or length form cannot be told from
the graph. ``QAttention`` (``lift/qattention.py``) writes its dequantized projection and then the
same graph through :func:`write_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder, present, used
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.kv_attention import lowest_score

MS = "com.microsoft"
#: ops whose output 1 is onnxruntime's 1-D mask index (key lengths per batch entry)
_MASK_INDEX_PRODUCERS = ("EmbedLayerNormalization", "QEmbedLayerNormalization")


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    sizes: tuple[int, int, int]  # hidden sizes of Q, K, V
    unidirectional: bool
    scale: float
    mask_filter: float
    mask_form: str | None  # None, 'lengths', 'end-start', 'raw2d', 'raw3d'


def attention_spec(node: gs.Node, graph: gs.Graph, packed: int | None, mask: gs.Tensor | None, x: gs.Tensor,
                   past_index: int) -> AttentionSpec | str:
    """What ``node`` (Attention or QAttention) computes, or why it is not written back.

    ``packed``: the width of its packed Q/K/V projection (None: unknown)."""
    attrs = node.attrs
    past = present(node, past_index)
    if past is not None:
        return f"input {past_index} ('{past.name}', the key/value cache 'past') is given; only self-attention " \
               "without a cache is written back"
    if used(node, 1, graph):
        return f"output 1 ('{node.outputs[1].name}', the key/value cache 'present') is read"
    for attr in ("do_rotary", "past_present_share_buffer"):
        if int(attrs.get(attr, 0)):
            return f"attribute {attr}={int(attrs[attr])} is not written back"
    heads = int(attrs.get("num_heads", 0))
    if heads <= 0:
        return "attribute num_heads is missing"
    sizes = attrs.get("qkv_hidden_sizes")
    if sizes:
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) != 3:
            return f"qkv_hidden_sizes {list(sizes)} does not have 3 entries"
    elif packed is not None and packed % 3 == 0:
        sizes = (packed // 3,) * 3
    else:
        return f"the packed Q/K/V width {packed} cannot be split into three equal parts"
    if packed is not None and sum(sizes) != packed:
        return f"qkv_hidden_sizes {list(sizes)} do not add up to the packed width {packed}"
    if sizes[0] != sizes[1] or any(s % heads for s in sizes):
        return f"hidden sizes {list(sizes)} (Q and K equal, each a multiple of num_heads={heads}) do not fit"
    form = None if mask is None else mask_form(mask, x)
    if form is not None and form not in ("lengths", "end-start", "raw2d", "raw3d"):
        return form
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(sizes[0] // heads))
    return AttentionSpec(heads, sizes, bool(int(attrs.get("unidirectional", 0))), scale,
                         float(attrs.get("mask_filter_value", -10000.0)), form)


def mask_form(mask: gs.Tensor, x: gs.Tensor) -> str:
    """'lengths', 'end-start', 'raw2d' or 'raw3d', or the reason the form cannot be told."""
    producer = mask.inputs[0] if len(mask.inputs) == 1 else None
    if producer is not None and producer.op in _MASK_INDEX_PRODUCERS and producer.outputs[1] is mask:
        return "lengths"
    if producer is not None and producer.op == "ReduceSum" and not int(producer.attrs.get("keepdims", 1)):
        source = through_casts(producer.inputs[0]).shape  # the optimizer's key lengths: ReduceSum(mask [B, S])
        if source is not None and len(source) == 2:
            return "lengths"
    shape = through_casts(mask).shape
    if shape is None:
        return f"the rank of mask_index '{mask.name}' is unknown"
    if len(shape) == 2:
        return "raw2d"
    if len(shape) == 3:
        return "raw3d"
    if len(shape) != 1:
        return f"mask_index '{mask.name}' has rank {len(shape)} (a 4-D Megatron mask is not written back)"
    batch = x.shape[0] if x.shape is not None else None
    if batch is not None and shape[0] == batch:
        return "lengths"
    if isinstance(batch, int) and isinstance(shape[0], int) and shape[0] == 2 * batch:
        return "end-start"
    return (f"mask_index '{mask.name}' is 1-D of length {shape[0]} for batch {batch}: key lengths [B] or "
            "end/start positions [2B] cannot be told apart")


def through_casts(t: gs.Tensor) -> gs.Tensor:
    """``t``, or the first tensor with a known shape up its chain of Casts (their shapes are the same)."""
    while t.shape is None and len(t.inputs) == 1 and t.inputs[0].op == "Cast":
        t = t.inputs[0].inputs[0]
    return t


def write_attention(ctx: LiftContext, base: str, qkv: gs.Tensor, spec: AttentionSpec, mask: gs.Tensor | None,
                    attention_bias: gs.Tensor | None, out: gs.Tensor) -> None:
    """Append the attention over the packed projection ``qkv`` [B, S, q+k+v], producing ``out``."""
    b = GraphBuilder(ctx.graph, ctx.names, base, qkv.dtype or out.dtype or np.float32)
    q, k, v = b.split(qkv, list(spec.sizes), axis=-1)
    write_heads(b, q, k, v, spec, mask, attention_bias, out)


def write_heads(b: GraphBuilder, q: gs.Tensor, k: gs.Tensor, v: gs.Tensor, spec: AttentionSpec,
                mask: gs.Tensor | None, attention_bias: gs.Tensor | None, out: gs.Tensor) -> None:
    """Append the attention of projected ``q`` [B, S, hidden], ``k``, ``v`` [B, L, hidden], producing ``out``
    [B, S, v hidden]."""
    heads = spec.num_heads
    hq, hv = spec.sizes[0] // heads, spec.sizes[2] // heads

    def heads_of(t: gs.Tensor, size: int, perm: list[int]) -> gs.Tensor:
        return b.op("Transpose", [b.op("Reshape", [t, b.ints([0, 0, heads, size])])], {"perm": perm})

    scores = b.op("MatMul", [heads_of(q, hq, [0, 2, 1, 3]), heads_of(k, hq, [0, 2, 3, 1])])
    scores = b.op("Mul", [scores, b.const(spec.scale)])
    if mask is not None:
        scores = b.op("Add", [scores, _padding_mask(b, spec, mask, k)])
    if attention_bias is not None:
        scores = b.op("Add", [scores, attention_bias])
    if spec.unidirectional:  # key position j > query position i: excluded outright, whatever the mask left
        start, step = b.const(0, np.int64), b.const(1, np.int64)
        queries = b.op("Range", [start, b.dim(q, 1, scalar=True), step], dtype=np.int64)
        keys = b.op("Range", [start, b.dim(k, 1, scalar=True), step], dtype=np.int64)
        future = b.op("Greater", [keys, b.unsqueeze(queries, [1], np.int64)], dtype=np.bool_)  # [S, L]
        scores = b.op("Where", [future, b.const(lowest_score(b.dtype)), scores])
    probs = b.op("Softmax", [scores], {"axis": -1})
    context = b.op("MatMul", [probs, heads_of(v, hv, [0, 2, 1, 3])])
    b.op("Reshape", [b.op("Transpose", [context], {"perm": [0, 2, 1, 3]}), b.ints([0, 0, spec.sizes[2]])], out=out)


def _padding_mask(b: GraphBuilder, spec: AttentionSpec, mask: gs.Tensor, x: gs.Tensor) -> gs.Tensor:
    """The additive mask, broadcastable to the scores [B, N, S, S]: 0 where a key is attended, else the filter."""
    zero, filt = b.const(0.0), b.const(spec.mask_filter)
    if spec.mask_form in ("raw2d", "raw3d"):
        valid = b.op("Greater", [mask, gs.Constant(b.names(f"{b.base}/zero"), np.array(0, mask.dtype or np.int32))],
                     dtype=np.bool_)
        return b.unsqueeze(b.op("Where", [valid, zero, filt]), [1] if spec.mask_form == "raw3d" else [1, 2], b.dtype)
    # key lengths [B], or end positions then start positions [2B]
    ends = b.op("Cast", [mask], {"to": 7}, dtype=np.int64)
    keys = b.op("Range", [b.const(0, np.int64), b.dim(x, 1, scalar=True), b.const(1, np.int64)], dtype=np.int64)
    if spec.mask_form == "end-start":
        batch = b.dim(x, 0, scalar=False)
        starts = b.op("Slice", [ends, batch, b.op("Mul", [batch, b.ints([2])], dtype=np.int64), b.ints([0])],
                      dtype=np.int64)
        ends = b.op("Slice", [ends, b.ints([0]), batch, b.ints([0])], dtype=np.int64)
    valid = b.op("Less", [keys, b.unsqueeze(ends, [1], np.int64)], dtype=np.bool_)  # [B, S]
    if spec.mask_form == "end-start":
        after = b.op("GreaterOrEqual", [keys, b.unsqueeze(starts, [1], np.int64)], dtype=np.bool_)
        valid = b.op("And", [valid, after], dtype=np.bool_)
    return b.unsqueeze(b.op("Where", [valid, zero, filt]), [1, 2], b.dtype)


@dataclass(frozen=True)
class AttentionMatch:
    node: gs.Node
    spec: AttentionSpec


class OrtAttention:
    name = "ort-attention"
    op_types = ("Attention",)
    outcome = ("written back by rule 'ort-attention' as standard ONNX (MatMul, Split, Reshape, Transpose, "
               "Softmax; the mask as onnxruntime's kernel applies it)")

    def match(self, ctx: LiftContext, node: gs.Node) -> AttentionMatch | str:
        if (node.domain or "") != MS:
            return NOT_MINE  # the standard ONNX Attention (opset 23) is TensorRT's to import
        x, weights, mask = node.inputs[0], node.inputs[1], present(node, 3)
        if present(node, 6) is not None:
            return "input 6 (past_sequence_length) is given; only self-attention without a cache is written back"
        if x.shape is not None and len(x.shape) != 3:
            return f"input '{x.name}' has rank {len(x.shape)}, expected 3 ([batch, sequence, hidden])"
        packed = weights.shape[-1] if weights.shape is not None and isinstance(weights.shape[-1], int) else None
        spec = attention_spec(node, ctx.graph, packed, mask, x, past_index=4)
        return spec if isinstance(spec, str) else AttentionMatch(node, spec)

    def rewrite(self, ctx: LiftContext, match: AttentionMatch) -> None:
        node = match.node
        x, weights, bias = node.inputs[0], node.inputs[1], present(node, 2)
        mask, attention_bias = present(node, 3), present(node, 5)
        base = node.name or node.outputs[0].name
        out = node.outputs[0]
        node.outputs.clear()
        node.inputs.clear()
        b = GraphBuilder(ctx.graph, ctx.names, base, x.dtype or out.dtype or np.float32)
        qkv = b.op("MatMul", [x, weights])
        if bias is not None:
            qkv = b.op("Add", [qkv, bias])
        write_attention(ctx, base, qkv, match.spec, mask, attention_bias, out)
