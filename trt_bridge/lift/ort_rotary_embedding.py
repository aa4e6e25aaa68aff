"""Write onnxruntime's com.microsoft ``RotaryEmbedding`` back as standard ONNX (exact).

onnxruntime-genai's builder writes it before a ``MultiHeadAttention`` (where it does not fuse rotary into
``GroupQueryAttention``), and ``onnxruntime.transformers`` fuses it into Llama-style exports. TensorRT-RTX
imports the op but its parser dies (SIGFPE) on a 3-D input with ``num_heads=0``; the standard ops it stands for
import everywhere (``lift/kv_attention.py``, ``rotary``)::

    Before:  x [B, S, hidden] or [B, N, S, H], position_ids [B, S] (or [1]: an offset), cos_cache, sin_cache
             [max positions, d/2] ─ RotaryEmbedding(interleaved, num_heads, rotary_embedding_dim) ─ y

    After:   x ─ [Reshape [B, S, N, H]] ─ rotary of the first d channels at the positions
               (an offset p gives p + s) ─ [Reshape [B, S, hidden]] ─ y

``num_heads=0`` on a 3-D input takes the head size from the caches (d = head size). Declined, with the reason:
``is_packed_batching``, a ``scale`` other than 1, caches whose width does not fit the head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.kv_attention import I64, rotary, rotary_tables

MS = "com.microsoft"


@dataclass(frozen=True)
class RotaryMatch:
    node: gs.Node
    rank: int  # 3 or 4
    heads: int  # 0 where the input is 4-D
    head_size: int
    rotary_dim: int
    interleaved: bool
    offset: bool  # position_ids is one offset [1], not [B, S]


def _width(t: gs.Tensor) -> int | str | None:
    return t.shape[-1] if t.shape is not None and len(t.shape) else None


class OrtRotaryEmbedding:
    name = "ort-rotary-embedding"
    op_types = ("RotaryEmbedding",)
    outcome = "written back by rule 'ort-rotary-embedding' as standard ONNX (Gather of the caches, Mul, Add, Concat)"

    def match(self, ctx: LiftContext, node: gs.Node) -> RotaryMatch | str:
        if (node.domain or "") != MS:
            return NOT_MINE  # the standard RotaryEmbedding (opset 23) is TensorRT's to import
        if int(node.attrs.get("is_packed_batching", 0)):
            return "attribute is_packed_batching=1 is not written back"
        if float(node.attrs.get("scale", 1.0)) != 1.0:
            return f"attribute scale={float(node.attrs['scale'])} is not written back"
        x, cos, sin = node.inputs[0], node.inputs[2], node.inputs[3]
        rank = len(x.shape) if x.shape is not None else None
        if rank not in (3, 4):
            return f"input '{x.name}' has rank {rank}; [batch, sequence, hidden] or [batch, heads, sequence, head] " \
                   "is written back"
        ranks = None if node.inputs[1].shape is None else len(node.inputs[1].shape)
        if ranks not in (1, 2):
            return f"position_ids '{node.inputs[1].name}' has rank {ranks}; [batch, sequence] or an offset [1] is " \
                   "written back"
        half = _width(cos)
        if not isinstance(half, int) or half != _width(sin):
            return f"cos_cache '{cos.name}' and sin_cache '{sin.name}' need one known width (d/2)"
        heads, width = int(node.attrs.get("num_heads", 0)), _width(x)
        rotary_dim = int(node.attrs.get("rotary_embedding_dim", 0))
        if rank == 4:
            head_size = width
        elif heads > 0:
            head_size = width // heads if isinstance(width, int) and width % heads == 0 else None
        else:  # num_heads=0: the caches give the head size (rotary over every channel)
            head_size = 2 * half
            heads = width // head_size if isinstance(width, int) and width % head_size == 0 else 0
        if not isinstance(head_size, int) or (rank == 3 and heads <= 0):
            return f"input '{x.name}' of width {width} does not split into heads of the caches' width {2 * half}"
        rotary_dim = rotary_dim or head_size
        if rotary_dim != 2 * half or rotary_dim > head_size:
            return (f"the caches' width {half} is not half of rotary_embedding_dim {rotary_dim} (≤ head size "
                    f"{head_size})")
        return RotaryMatch(node, rank, heads if rank == 3 else 0, head_size, rotary_dim,
                           bool(int(node.attrs.get("interleaved", 0))), ranks == 1)

    def rewrite(self, ctx: LiftContext, match: RotaryMatch) -> None:
        node = match.node
        x, positions, cos, sin = node.inputs[:4]
        out = node.outputs[0]
        node.outputs.clear()
        node.inputs.clear()
        b = GraphBuilder(ctx.graph, ctx.names, node.name or out.name, x.dtype or out.dtype or np.float32)
        positions = b.op("Cast", [positions], {"to": 7}, dtype=I64)
        if match.offset:  # positions offset + s for every batch entry
            steps = b.op("Range", [b.const(0, I64), b.dim(x, 1, scalar=True), b.const(1, I64)], dtype=I64)
            offset = b.op("Reshape", [positions, b.ints([1, 1])], dtype=I64)
            positions = b.op("Add", [offset, b.unsqueeze(steps, [0], I64)], dtype=I64)
        if match.rank == 4:  # [B, N, S, H]
            tables = rotary_tables(b, positions, cos, sin, match.rotary_dim)
            rotary(b, x, tables, match.rotary_dim, match.head_size, match.interleaved, out=out)
            return
        heads = b.op("Reshape", [x, b.ints([0, 0, match.heads, match.head_size])])  # [B, S, N, H]
        tables = rotary_tables(b, positions, cos, sin, match.rotary_dim, heads_axis=2)
        y = rotary(b, heads, tables, match.rotary_dim, match.head_size, match.interleaved)
        b.op("Reshape", [y, b.ints([0, 0, match.heads * match.head_size])], out=out)
