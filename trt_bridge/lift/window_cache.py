"""The standard-ONNX pieces of onnxruntime's windowed key/value cache (``GroupQueryAttention`` with
``sliding_window_cache=1``, onnxruntime-genai's Mistral export): ``lift/group_query_attention.py`` composes them
with ``lift/kv_attention.py``'s rotary and grouped attention.

The cache holds ``C`` rows (its capacity: dimension 2 of ``past_key``, and of ``present_key``), whatever the
sequence length; the window is ``W`` keys (``local_window_size``, C ≥ W). After ``t`` positions, rows
``[0, L(t))`` hold the ``L(t)`` most recent positions in order (row i: position t − L(t) + i) and the rows beyond
are unspecified (onnxruntime leaves what its compaction left there), where, with ``G = C − W + 1``::

    L(t) = t                           t ≤ C
           t − G·⌈(t − C) / G⌉         otherwise       (W ≤ L(t) ≤ C: eviction reclaims G rows at once)

A step of S new tokens on a past of P positions (P = seqlens_k + 1 − S per batch entry) is written as::

    keys      = Concat(past [B, Nkv, C, H], new [B, Nkv, S, H], axis 2)          (C + S rows)
    position  = P − L(P) + j         (j < C: valid where j < L(P))
                P + j − C            (j ≥ C: the new rows)
    mask      = query s (position P + s) sees key j where it is valid and P + s − W < position ≤ P + s
    present   = GatherElements(keys, the rows of the L(P + S) most recent positions) ─ Where(row < L(P + S), ·, 0)

so the attention reads exactly the keys onnxruntime reads (the past's rows beyond L(P) never) and ``present``
holds onnxruntime's rows [0, L) (zeros beyond, where onnxruntime's are unspecified).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder

I64 = np.int64


def resident(b: GraphBuilder, count: gs.Tensor, capacity: gs.Tensor, window: int) -> gs.Tensor:
    """L(``count``) (int64, any shape): how many of ``count`` positions a cache of ``capacity`` rows (an int64
    scalar) holds for a window of ``window`` keys. A capacity under the window (onnxruntime refuses it) gives a
    step of 1, not a division by zero."""
    step = b.op("Max", [b.op("Sub", [capacity, b.const(window - 1, I64)], dtype=I64), b.const(1, I64)], dtype=I64)
    over = b.op("Max", [b.op("Sub", [count, capacity], dtype=I64), b.const(0, I64)], dtype=I64)
    steps = b.op("Div", [b.op("Add", [over, b.op("Sub", [step, b.const(1, I64)], dtype=I64)], dtype=I64), step],
                 dtype=I64)
    return b.op("Sub", [count, b.op("Mul", [steps, step], dtype=I64)], dtype=I64)


def window_step(b: GraphBuilder, past_key: gs.Tensor, past_value: gs.Tensor, k: gs.Tensor, v: gs.Tensor,
                past_len: gs.Tensor, new_len: gs.Tensor, window: int, outs: tuple[gs.Tensor | None, gs.Tensor | None]
                ) -> tuple[gs.Tensor, gs.Tensor, gs.Tensor]:
    """One step of the window cache: the keys and values the attention reads ([B, Nkv, C + S, H]: the past's rows,
    then ``k``, ``v`` [B, Nkv, S, H]), its mask [B, 1, 1, S, C + S] (booleans), and ``present_key`` /
    ``present_value`` [B, Nkv, C, H] written into ``outs`` (where given). ``past_len`` [B] (int64): P per entry."""
    capacity = b.dim(past_key, 2, scalar=True)
    total = b.op("Add", [past_len, new_len], dtype=I64)  # [B]
    held, keep = resident(b, past_len, capacity, window), resident(b, total, capacity, window)  # L(P), L(P + S)
    keys = b.op("Concat", [past_key, k], {"axis": 2})
    values = b.op("Concat", [past_value, v], {"axis": 2})

    def column(t: gs.Tensor) -> gs.Tensor:
        return b.unsqueeze(t, [1], I64)  # [B] → [B, 1]

    # the attention's mask: every key's position, and whether the row holds one
    rows = b.op("Range", [b.const(0, I64), b.op("Add", [capacity, new_len], dtype=I64), b.const(1, I64)], dtype=I64)
    is_past = b.op("Less", [rows, capacity], dtype=np.bool_)  # [C + S]
    first = b.op("Sub", [past_len, held], dtype=I64)  # the position of past row 0
    position = b.op("Where", [is_past, b.op("Add", [column(first), rows], dtype=I64),
                              b.op("Add", [column(past_len), b.op("Sub", [rows, capacity], dtype=I64)], dtype=I64)],
                    dtype=I64)  # [B, C + S]
    valid = b.op("Or", [b.op("Not", [is_past], dtype=np.bool_), b.op("Less", [rows, column(held)], dtype=np.bool_)],
                 dtype=np.bool_)  # [B, C + S]
    queries = b.op("Range", [b.const(0, I64), new_len, b.const(1, I64)], dtype=I64)
    query_pos = b.unsqueeze(b.op("Add", [column(past_len), b.unsqueeze(queries, [0], I64)], dtype=I64), [2], I64)
    position, valid = b.unsqueeze(position, [1], I64), b.unsqueeze(valid, [1], np.bool_)  # [B, 1, C + S]
    seen = b.op("And", [b.op("LessOrEqual", [position, query_pos], dtype=np.bool_),
                        b.op("Greater", [position, b.op("Sub", [query_pos, b.const(window, I64)], dtype=I64)],
                             dtype=np.bool_)], dtype=np.bool_)
    mask = b.unsqueeze(b.op("And", [seen, valid], dtype=np.bool_), [1, 2], np.bool_)  # [B, 1, 1, S, C + S]

    # present row i: the compact row i + L(P) + S − L(P + S) of [past rows < L(P), new rows], in the keys' rows
    slots = b.op("Range", [b.const(0, I64), capacity, b.const(1, I64)], dtype=I64)  # [C]
    shift = b.op("Sub", [b.op("Add", [held, new_len], dtype=I64), keep], dtype=I64)
    compact = b.op("Add", [b.unsqueeze(slots, [0], I64), column(shift)], dtype=I64)  # [B, C]
    source = b.op("Where", [b.op("Less", [compact, column(held)], dtype=np.bool_), compact,
                            b.op("Add", [b.op("Sub", [compact, column(held)], dtype=I64), capacity], dtype=I64)],
                  dtype=I64)
    last = b.op("Sub", [b.op("Add", [capacity, new_len], dtype=I64), b.const(1, I64)], dtype=I64)
    source = b.op("Reshape", [b.op("Min", [source, last], dtype=I64), b.ints([0, 1, -1, 1])], dtype=I64)
    kept = b.op("Reshape", [b.op("Less", [b.unsqueeze(slots, [0], I64), column(keep)], dtype=np.bool_),
                            b.ints([0, 1, -1, 1])], dtype=np.bool_)  # [B, 1, C, 1]
    dims = b.op("Shape", [past_key], dtype=I64)
    presents = []
    for cache, out in ((keys, outs[0]), (values, outs[1])):
        gathered = b.op("GatherElements", [cache, b.op("Expand", [source, dims], dtype=I64)], {"axis": 2})
        presents.append(b.op("Where", [kept, gathered, b.const(0.0)], out=out))
    return keys, values, mask
