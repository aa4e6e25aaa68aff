"""The standard-ONNX pieces that onnxruntime's decoder attention ops are written back with: rotary embedding, the
key/value cache update, the causal (and padding, and sliding-window) mask aligned for a past, and grouped-query
attention over the cache. ``lift/group_query_attention.py`` and ``lift/ort_multihead_attention.py`` (with a
past) compose them.

Shapes: queries ``[B, N, S, H]``, keys and values ``[B, Nkv, T, H]`` (N a multiple of Nkv), where S is the new
tokens and T the cache after the update. Everything is standard ONNX at any opset ≥ 13 (onnxruntime runs it at
every version this package supports; TensorRT imports each op), so the lifted model is compared with its source
in onnxruntime before any precision decision; the attention is the MatMul → Softmax → MatMul form TensorRT
builds in every float type::

    rotary:   x [.., d] ─ Slice(rotated part, pass-through part) ─ x₁, x₂ (halves, or even/odd when interleaved)
              cos, sin = Gather(cache, positions)
              (x₁·cos − x₂·sin, x₂·cos + x₁·sin) ─ Concat (interleaved: re-paired) ─ Concat(pass-through)

    cache:    present[b, :, t] = past[b, :, t]              t < past_len[b]
                                 new[b, :, t − past_len[b]]  past_len[b] ≤ t < past_len[b] + S
                                 0                           otherwise
              (Pad(past) ─ GatherElements(new, clipped t − past_len) ─ Where ─ Where: one Concat where every
              past_len[b] is the past's length; TensorRT fuses neither differently)

    attention: q [B, Nkv, N/Nkv, S, H] × kᵀ [B, Nkv, 1, H, T] ─ Mul(scale) [─ softcap] ─ Where(mask, ·, lowest)
               ─ Softmax ─ × v [B, Nkv, 1, T, H] ─ [B, S, N·H]

The mask lets query s of batch b see key j where ``j < past_len[b] + s + 1`` (causal, aligned to the lower
right: the past is before the queries), and ``j ≥ past_len[b] + s + 1 − window`` for a sliding window of
``window`` keys (onnxruntime's ``local_window_size``, the query's own key included); a query never loses its own
key, so no row is empty.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder

I64 = np.int64


def lowest_score(dtype) -> float:
    """The score a masked key gets: ``dtype``'s lowest value; for float32 the lowest that bfloat16 also holds
    (float32's own rounds to -inf in bfloat16, a non-finite constant that ``--high-precision bf16`` refuses)."""
    dtype = np.dtype(dtype or np.float32)
    return float(ml_dtypes.finfo(ml_dtypes.bfloat16 if dtype == np.float32 else dtype).min)


def split_heads(b: GraphBuilder, x: gs.Tensor, heads: int, size: int) -> gs.Tensor:
    """``x`` [B, S, heads·size] as [B, heads, S, size]."""
    return b.op("Transpose", [b.op("Reshape", [x, b.ints([0, 0, heads, size])])], {"perm": [0, 2, 1, 3]})


def merge_heads(b: GraphBuilder, x: gs.Tensor, hidden: int, out: gs.Tensor | None = None) -> gs.Tensor:
    """``x`` [B, heads, S, size] as [B, S, heads·size] (``out`` where given)."""
    return b.op("Reshape", [b.op("Transpose", [x], {"perm": [0, 2, 1, 3]}), b.ints([0, 0, hidden])], out=out)


def scalar_i64(b: GraphBuilder, t: gs.Tensor) -> gs.Tensor:
    """``t`` (an integer scalar or a one-element tensor) as an int64 scalar."""
    return b.op("Reshape", [b.op("Cast", [t], {"to": 7}, dtype=I64), b.ints([])], dtype=I64)


def rotary_tables(b: GraphBuilder, positions: gs.Tensor, cos: gs.Tensor, sin: gs.Tensor, rotary_dim: int,
                  heads_axis: int = 1) -> tuple[gs.Tensor, gs.Tensor]:
    """The cos and sin rows of ``positions`` [B, S] (int64) from the caches [max positions, ≥ rotary_dim/2], as
    [B, 1, S, rotary_dim/2] (``heads_axis`` 2: [B, S, 1, rotary_dim/2]): one pair serves every input rotated at
    those positions (a layer's queries and keys)."""
    def table(cache: gs.Tensor) -> gs.Tensor:
        rows = b.op("Gather", [cache, positions], {"axis": 0})
        rows = b.op("Slice", [rows, b.ints([0]), b.ints([rotary_dim // 2]), b.ints([-1])])
        return b.unsqueeze(rows, [heads_axis], b.dtype)

    return table(cos), table(sin)


def rotary(b: GraphBuilder, x: gs.Tensor, tables: tuple[gs.Tensor, gs.Tensor], rotary_dim: int, head_size: int,
           interleaved: bool, out: gs.Tensor | None = None) -> gs.Tensor:
    """Rotary embedding of ``x`` [B, heads, S, head_size] (or [B, S, heads, head_size], with tables made for that
    layout) with the cos and sin ``tables`` of :func:`rotary_tables`: the first ``rotary_dim`` channels rotate, the
    rest pass (into ``out`` where given)."""
    half = rotary_dim // 2
    c, s = tables
    rotated = x if rotary_dim == head_size else b.op("Slice", [x, b.ints([0]), b.ints([rotary_dim]), b.ints([-1])])
    if interleaved:  # channel pairs (2i, 2i+1)
        pairs = b.op("Reshape", [rotated, b.ints([0, 0, 0, half, 2])])
        x1, x2 = (b.op("Reshape", [t, b.ints([0, 0, 0, half])]) for t in b.split(pairs, [1, 1], axis=-1))
    else:  # halves (i, i + half)
        x1, x2 = b.split(rotated, [half, half], axis=-1)
    y1 = b.op("Sub", [b.op("Mul", [x1, c]), b.op("Mul", [x2, s])])
    y2 = b.op("Add", [b.op("Mul", [x2, c]), b.op("Mul", [x1, s])])
    whole = rotary_dim == head_size
    if interleaved:
        y = b.op("Reshape", [b.op("Concat", [b.unsqueeze(y1, [4], b.dtype), b.unsqueeze(y2, [4], b.dtype)],
                                  {"axis": -1}), b.ints([0, 0, 0, rotary_dim])], out=out if whole else None)
    else:
        y = b.op("Concat", [y1, y2], {"axis": -1}, out=out if whole else None)
    if whole:
        return y
    rest = b.op("Slice", [x, b.ints([rotary_dim]), b.ints([head_size]), b.ints([-1])])
    return b.op("Concat", [y, rest], {"axis": -1}, out=out)


def update_cache(b: GraphBuilder, past: gs.Tensor | None, new: gs.Tensor, past_len: gs.Tensor, new_len: gs.Tensor,
                 length: gs.Tensor, out: gs.Tensor | None = None) -> gs.Tensor:
    """The cache [B, Nkv, ``length``, H] after writing ``new`` [B, Nkv, S, H] at each batch entry's
    ``past_len`` [B] (int64) behind ``past`` [B, Nkv, P, H] (None: no past); zeros beyond."""
    steps = b.op("Range", [b.const(0, I64), length, b.const(1, I64)], dtype=I64)  # [T]
    rel = b.op("Sub", [b.unsqueeze(steps, [0], I64), b.unsqueeze(past_len, [1], I64)], dtype=I64)  # [B, T]
    last = b.op("Sub", [new_len, b.const(1, I64)], dtype=I64)
    index = b.op("Max", [b.op("Min", [rel, last], dtype=I64), b.const(0, I64)], dtype=I64)
    index = b.op("Reshape", [index, b.ints([0, 1, -1, 1])], dtype=I64)  # [B, 1, T, 1]
    dims = b.op("Shape", [new], dtype=I64)
    shape = b.op("Concat", [b.op("Slice", [dims, b.ints([0]), b.ints([2])], dtype=I64), b.unsqueeze(length, [0], I64),
                            b.op("Slice", [dims, b.ints([3]), b.ints([4])], dtype=I64)], {"axis": 0}, dtype=I64)
    gathered = b.op("GatherElements", [new, b.op("Expand", [index, shape], dtype=I64)], {"axis": 2})
    inside = b.op("And", [b.op("GreaterOrEqual", [rel, b.const(0, I64)], dtype=np.bool_),
                          b.op("Less", [rel, new_len], dtype=np.bool_)], dtype=np.bool_)
    inside = b.op("Reshape", [inside, b.ints([0, 1, -1, 1])], dtype=np.bool_)
    written = b.op("Where", [inside, gathered, b.const(0.0)], out=None if past is not None else out)
    if past is None:
        return written
    grow = b.op("Sub", [length, b.dim(past, 2, scalar=True)], dtype=I64)
    zeros = b.ints([0, 0, 0, 0, 0, 0])
    pads = b.op("Concat", [zeros, b.unsqueeze(grow, [0], I64), b.ints([0])], {"axis": 0}, dtype=I64)
    padded = b.op("Pad", [past, pads])
    before = b.op("Reshape", [b.op("Less", [rel, b.const(0, I64)], dtype=np.bool_), b.ints([0, 1, -1, 1])],
                  dtype=np.bool_)
    return b.op("Where", [before, padded, written], out=out)


def causal_mask(b: GraphBuilder, past_len: gs.Tensor, new_len: gs.Tensor, length: gs.Tensor,
                window: int) -> gs.Tensor:
    """[B, 1, 1, S, T] booleans: query s of batch b sees key j where j < past_len[b] + s + 1 (and
    j ≥ past_len[b] + s + 1 − ``window`` where ``window`` > 0: the last ``window`` keys)."""
    queries = b.op("Range", [b.const(0, I64), new_len, b.const(1, I64)], dtype=I64)  # [S]
    keys = b.op("Range", [b.const(0, I64), length, b.const(1, I64)], dtype=I64)  # [T]
    limit = b.op("Add", [b.unsqueeze(past_len, [1], I64), b.op("Add", [b.unsqueeze(queries, [0], I64),
                                                                      b.const(1, I64)], dtype=I64)], dtype=I64)
    limit = b.unsqueeze(limit, [2], I64)  # [B, S, 1]
    visible = b.op("Less", [keys, limit], dtype=np.bool_)  # [B, S, T]
    if window > 0:
        first = b.op("Sub", [limit, b.const(window, I64)], dtype=I64)
        visible = b.op("And", [visible, b.op("GreaterOrEqual", [keys, first], dtype=np.bool_)], dtype=np.bool_)
    return b.unsqueeze(visible, [1, 2], np.bool_)


def grouped_attention(b: GraphBuilder, q: gs.Tensor, k: gs.Tensor, v: gs.Tensor, mask: gs.Tensor, heads: int,
                      kv_heads: int, head_size: int, scale: float, softcap: float, out: gs.Tensor) -> gs.Tensor:
    """Attention of ``q`` [B, heads, S, H] over ``k``, ``v`` [B, kv_heads, T, H] (query head h reads key/value
    head h // (heads / kv_heads), as onnxruntime groups them) where ``mask`` [B, 1, 1, S, T] is true; ``out``
    [B, S, heads·H]."""
    group = heads // kv_heads
    q5 = b.op("Reshape", [q, b.ints([0, kv_heads, group, -1, head_size])])
    k5 = b.op("Transpose", [b.unsqueeze(k, [2], b.dtype)], {"perm": [0, 1, 2, 4, 3]})
    scores = b.op("Mul", [b.op("MatMul", [q5, k5]), b.const(scale)])
    if softcap > 0:
        scores = b.op("Mul", [b.op("Tanh", [b.op("Div", [scores, b.const(softcap)])]), b.const(softcap)])
    scores = b.op("Where", [mask, scores, b.const(lowest_score(b.dtype))])
    probs = b.op("Softmax", [scores], {"axis": -1})
    context = b.op("MatMul", [probs, b.unsqueeze(v, [2], b.dtype)])  # [B, Nkv, group, S, H]
    context = b.op("Reshape", [context, b.ints([0, heads, -1, head_size])])
    return merge_heads(b, context, heads * head_size, out=out)
