"""Write onnxruntime's com.microsoft ``GroupQueryAttention`` back as standard ONNX (exact).

onnxruntime-genai's model builder writes every decoder layer's attention as one ``GroupQueryAttention``
(rotary inside it, the key/value cache in and out); TensorRT's parser rejects it (a plugin it does not
register). The node is written as the ops it stands for (``lift/kv_attention.py``), keeping the cache's
inputs and outputs, so the user's generation loop drives the converted model unchanged::

    Before:  q [B, S, N·H] (or packed q|k|v), k, v [B, S, Nkv·H], past_key, past_value [B, Nkv, P, H],
             seqlens_k [B] (total lengths − 1), total_sequence_length, cos_cache, sin_cache [M, d/2]
             ─ GroupQueryAttention(num_heads N, kv_num_heads Nkv, do_rotary, rotary_interleaved,
                                   local_window_size, softcap, scale) ─ y [B, S, N·H], present_key, present_value

    After:   first   = S == total_sequence_length          (a first prompt: no past, as onnxruntime decides)
             past[b] = 0 if first else seqlens_k[b] + 1 − S
             q, k, v ─ [Split] ─ Reshape/Transpose [B, heads, S, H]
             q, k    ─ rotary at positions past[b] + s (1 beyond a row's length, as onnxruntime)   [do_rotary]
             present_key   = the cache update of past_key with k at past[b]  (length max(total, P))
             present_value = likewise
             y = grouped attention of q over present_key/value, mask: key j < past[b] + s + 1
                 [and j ≥ past[b] + s + 1 − local_window_size]

A window cache (``sliding_window_cache=1``, onnxruntime-genai's Mistral export) holds C rows at every step
(C = past_key's length ≥ local_window_size W) and evicts internally; it is written with
``lift/window_cache.py``::

    Before:  … past_key, past_value [B, Nkv, C, H] ─ GroupQueryAttention(sliding_window_cache=1, local_window_size W)
    After:   past[b] = seqlens_k[b] + 1 − S  (onnxruntime refuses a right-padded first prompt here)
             keys = Concat(past_key, k), values likewise; mask over their positions: the last W up to the query's
             present_key/value = the L(past[b] + S) most recent positions at rows [0, L), zeros beyond

A query row beyond its batch entry's length (right padding) is undefined in onnxruntime and written as the
mask leaves it. Declined, with the reason: the attributes and inputs onnxruntime added for other models
(smooth_softmax, head_sink, attention_bias, position_ids, quantized caches, q/k norms, query_seqlens, causal=0,
the qk output), a cache of another type than the queries, heads the query width does not split into, and a window
cache without a window or without past inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder, present, used
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.kv_attention import (
    I64,
    causal_mask,
    grouped_attention,
    rotary,
    rotary_tables,
    scalar_i64,
    split_heads,
    update_cache,
)
from trt_bridge.lift.ort_multihead_attention import hidden_size
from trt_bridge.lift.window_cache import window_step

MS = "com.microsoft"

#: inputs this rule does not write back: index → name
_UNSUPPORTED_INPUTS = {9: "position_ids", 10: "attention_bias", 11: "head_sink", 12: "k_scale", 13: "v_scale",
                       14: "q_norm_weight", 15: "k_norm_weight", 16: "query_seqlens"}
#: attributes this rule writes back only at their default: name → default
_DEFAULT_ONLY = {"smooth_softmax": 0, "causal": 1, "qk_output": 0, "kv_cache_bit_width": 0}


@dataclass(frozen=True)
class GroupQueryAttentionSpec:
    heads: int
    kv_heads: int
    head_size: int
    packed: bool
    rotary_dim: int  # 0: no rotary
    interleaved: bool
    window: int  # -1: none
    softcap: float
    scale: float
    window_cache: bool = False  # sliding_window_cache=1: the past and present hold the window (lift/window_cache.py)


@dataclass(frozen=True)
class GroupQueryAttentionMatch:
    node: gs.Node
    spec: GroupQueryAttentionSpec


class GroupQueryAttention:
    name = "group-query-attention"
    op_types = ("GroupQueryAttention",)
    outcome = ("written back by rule 'group-query-attention' as standard ONNX (rotary, the key/value cache update, "
               "a causal mask aligned for the past, MatMul/Softmax attention); the cache inputs and outputs stay")

    def match(self, ctx: LiftContext, node: gs.Node) -> GroupQueryAttentionMatch | str:
        if (node.domain or "") != MS:
            return NOT_MINE
        for index, what in _UNSUPPORTED_INPUTS.items():
            if present(node, index) is not None:
                return f"input {index} ({what}) is given; it is not written back yet"
        for attr, default in _DEFAULT_ONLY.items():
            if attr in node.attrs and int(node.attrs[attr]) != default:
                return f"attribute {attr}={int(node.attrs[attr])} is not written back"
        if used(node, 3, ctx.graph):
            return "output 3 (output_qk) is read"
        window_cache = int(node.attrs.get("sliding_window_cache", 0))
        if window_cache not in (0, 1):
            return f"attribute sliding_window_cache={window_cache} is not 0 or 1"
        if window_cache and int(node.attrs.get("local_window_size", -1)) <= 0:
            return ("sliding_window_cache=1 without a local_window_size > 0 (onnxruntime refuses it); set the "
                    "window the cache holds")
        if window_cache and (present(node, 3) is None or present(node, 4) is None):
            return "sliding_window_cache=1 without past_key and past_value; give both (the window cache)"
        if present(node, 5) is None or present(node, 6) is None:
            return "seqlens_k or total_sequence_length is missing (both are required)"
        heads, kv_heads = int(node.attrs.get("num_heads", 0)), int(node.attrs.get("kv_num_heads", 0))
        if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
            return (f"kv_num_heads={kv_heads} does not divide num_heads={heads}; set both so that each key/value "
                    "head serves num_heads / kv_num_heads query heads")
        query, key, value = (present(node, i) for i in range(3))
        packed = key is None
        if packed != (value is None):
            return "only one of key and value is given; give both, or pack q|k|v into the query"
        if query.shape is not None and len(query.shape) != 3:
            return f"query '{query.name}' has rank {len(query.shape)}; only [batch, sequence, hidden] is written back"
        width = hidden_size(query)
        if width is None or width % (heads + 2 * kv_heads if packed else heads):
            return (f"query '{query.name}' of width {width} does not split into {heads} query heads"
                    + (f" and 2×{kv_heads} key/value heads" if packed else ""))
        head_size = width // (heads + 2 * kv_heads if packed else heads)
        if not packed and hidden_size(key) not in (None, kv_heads * head_size):
            return (f"key '{key.name}' has width {hidden_size(key)}, not kv_num_heads × head size = "
                    f"{kv_heads} × {head_size}")
        for index in (3, 4):
            cache = present(node, index)
            if cache is None:
                continue
            if cache.dtype is not None and query.dtype is not None and np.dtype(cache.dtype) != np.dtype(query.dtype):
                return f"the cache '{cache.name}' is {np.dtype(cache.dtype)}, the queries {np.dtype(query.dtype)}"
            shape = cache.shape
            if shape is not None and (len(shape) != 4 or any(isinstance(d, int) and d != want for d, want in
                                                              ((shape[1], kv_heads), (shape[3], head_size)))):
                return (f"past '{cache.name}' has shape {list(shape)}, expected [batch, kv_num_heads={kv_heads}, "
                        f"past length, head size={head_size}]")
        rotary_dim = 0
        if int(node.attrs.get("do_rotary", 0)):
            cos, sin = present(node, 7), present(node, 8)
            if cos is None or sin is None:
                return "do_rotary=1 but cos_cache or sin_cache is missing; give both caches [max positions, d/2]"
            dims = [t.shape[1] if t.shape is not None and len(t.shape) == 2 else None for t in (cos, sin)]
            if not isinstance(dims[0], int) or dims[0] != dims[1] or not 0 < 2 * dims[0] <= head_size:
                return (f"cos_cache '{cos.name}' / sin_cache '{sin.name}' have widths {dims}: expected one width "
                        f"d/2 with d ≤ head size {head_size}")
            rotary_dim = 2 * dims[0]
        scale = float(node.attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(head_size))
        spec = GroupQueryAttentionSpec(heads, kv_heads, head_size, packed, rotary_dim,
                                       bool(int(node.attrs.get("rotary_interleaved", 0))),
                                       int(node.attrs.get("local_window_size", -1)),
                                       float(node.attrs.get("softcap", 0.0)), scale, bool(window_cache))
        return GroupQueryAttentionMatch(node, spec)

    def rewrite(self, ctx: LiftContext, match: GroupQueryAttentionMatch) -> None:
        node, spec = match.node, match.spec
        query, key, value = (present(node, i) for i in range(3))
        past_key, past_value = present(node, 3), present(node, 4)
        seqlens, total, cos, sin = node.inputs[5], node.inputs[6], present(node, 7), present(node, 8)
        outs = list(node.outputs) + [None] * 3
        keep = [used(node, i, ctx.graph) for i in (1, 2)]
        node.outputs.clear()
        node.inputs.clear()
        b = GraphBuilder(ctx.graph, ctx.names, node.name or outs[0].name, query.dtype or outs[0].dtype or np.float32)
        h, n, nkv = spec.head_size, spec.heads, spec.kv_heads
        if spec.packed:
            query, key, value = b.split(query, [n * h, nkv * h, nkv * h], axis=-1)
        q, k, v = split_heads(b, query, n, h), split_heads(b, key, nkv, h), split_heads(b, value, nkv, h)

        new_len = b.dim(query, 1, scalar=True)
        total_len = scalar_i64(b, total)
        lengths = b.op("Add", [b.op("Cast", [seqlens], {"to": 7}, dtype=I64), b.const(1, I64)], dtype=I64)  # [B]
        first = b.op("Equal", [new_len, total_len], dtype=np.bool_)
        past_len = b.op("Where", [first, b.const(0, I64), b.op("Sub", [lengths, new_len], dtype=I64)], dtype=I64)

        if spec.rotary_dim:
            steps = b.op("Range", [b.const(0, I64), new_len, b.const(1, I64)], dtype=I64)
            positions = b.op("Add", [b.unsqueeze(past_len, [1], I64), b.unsqueeze(steps, [0], I64)], dtype=I64)
            inside = b.op("Or", [b.op("Less", [positions, b.unsqueeze(lengths, [1], I64)], dtype=np.bool_), first],
                          dtype=np.bool_)
            positions = b.op("Where", [inside, positions, b.const(1, I64)], dtype=I64)
            tables = rotary_tables(b, positions, cos, sin, spec.rotary_dim)  # one Gather pair for q and k
            q = rotary(b, q, tables, spec.rotary_dim, h, spec.interleaved)
            k = rotary(b, k, tables, spec.rotary_dim, h, spec.interleaved)

        if spec.window_cache:
            k_all, v_all, mask = window_step(b, past_key, past_value, k, v, past_len, new_len, spec.window,
                                             (outs[1] if keep[0] else None, outs[2] if keep[1] else None))
            grouped_attention(b, q, k_all, v_all, mask, n, nkv, h, spec.scale, spec.softcap, outs[0])
            return
        length = total_len if past_key is None else b.op("Max", [total_len, b.dim(past_key, 2, scalar=True)],
                                                         dtype=I64)
        k_all = update_cache(b, past_key, k, past_len, new_len, length, out=outs[1] if keep[0] else None)
        v_all = update_cache(b, past_value, v, past_len, new_len, length, out=outs[2] if keep[1] else None)
        mask = causal_mask(b, past_len, new_len, length, spec.window)
        grouped_attention(b, q, k_all, v_all, mask, n, nkv, h, spec.scale, spec.softcap, outs[0])
