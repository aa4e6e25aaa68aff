"""Write onnxruntime's fused com.microsoft ``EmbedLayerNormalization`` back as standard ONNX (exact).

``onnxruntime.transformers.optimizer`` fuses a BERT embedding block (word, position and segment
tables summed, then LayerNormalization) into one node that also turns the attention mask into
the key lengths its ``Attention`` reads; TensorRT has no importer for it::

    Before:  input_ids, segment_ids, word [V, D], position [P, D], segment [T, D], γ, β, mask, position_ids
             ─ EmbedLayerNormalization(epsilon) ─ y, mask_index, embedding_sum

    After:   Gather(word, input_ids)
               + Gather(position, position_ids) | Slice(position, rows 0 … S−1)
               [+ Gather(segment, segment_ids)] ─ s [─ embedding_sum] ─ LayerNormalization(γ, β, epsilon) ─ y
             mask ─ Equal(1) ─ Cast(int32) ─ ReduceSum(axis 1) ─ mask_index   (no mask: zeros [B])

Position ``s`` reads row ``s`` of the position table unless ``position_ids`` are given. The mask
index counts each row's ones, as onnxruntime's CPU kernel does. ``QEmbedLayerNormalization``
(``lift/qembed_layer_norm.py``) dequantizes its tables and writes the same graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder, present, used
from trt_bridge.lift.base import NOT_MINE, LiftContext

MS = "com.microsoft"


def write_embed_layer_norm(ctx: LiftContext, node: gs.Node, tables: list[gs.Tensor | None],
                           mask: gs.Tensor | None, position_ids: gs.Tensor | None) -> None:
    """Replace ``node`` by the standard graph; ``tables``: word, position, segment, γ, β (float)."""
    word, position, segment, gamma, beta = tables
    ids, segment_ids = node.inputs[0], present(node, 1)
    outs = list(node.outputs) + [None] * 3
    keep = [used(node, i, ctx.graph) for i in range(3)]
    eps = float(node.attrs.get("epsilon", 1e-12))
    node.outputs.clear()
    node.inputs.clear()
    b = GraphBuilder(ctx.graph, ctx.names, node.name or outs[0].name, word.dtype or np.float32)
    total = b.op("Gather", [word, ids], {"axis": 0})
    if position_ids is not None:
        positions = b.op("Gather", [position, position_ids], {"axis": 0})
    else:
        positions = b.op("Slice", [position, b.ints([0]), b.dim(ids, 1, scalar=False), b.ints([0])])
    total = b.op("Add", [total, positions])
    if segment is not None and segment_ids is not None:
        total = b.op("Add", [total, b.op("Gather", [segment, segment_ids], {"axis": 0})])
    if keep[2]:
        b.op("Identity", [total], out=outs[2])
    b.layer_norm(total, gamma, beta, eps, out=outs[0])
    if keep[1]:
        if mask is None:
            zeros = gs.Constant(ctx.names(f"{b.base}/zero"), np.zeros(1, np.int32))
            b.op("ConstantOfShape", [b.dim(ids, 0, scalar=False)], {"value": zeros}, out=outs[1])
        else:
            one = gs.Constant(ctx.names(f"{b.base}/one"), np.array(1, mask.dtype or np.int32))
            ones = b.op("Cast", [b.op("Equal", [mask, one], dtype=np.bool_)], {"to": 6}, dtype=np.int32)
            b.reduce("ReduceSum", ones, [1], 0, np.int32, out=outs[1])


@dataclass(frozen=True)
class EmbedLayerNormMatch:
    node: gs.Node
    tables: list[gs.Tensor | None]  # word, position, segment, γ, β


class OrtEmbedLayerNorm:
    name = "ort-embed-layer-norm"
    op_types = ("EmbedLayerNormalization",)
    outcome = ("written back by rule 'ort-embed-layer-norm' as Gather + Add + LayerNormalization (the mask "
               "index as ReduceSum)")

    def match(self, ctx: LiftContext, node: gs.Node) -> EmbedLayerNormMatch | str:
        if (node.domain or "") != MS:
            return NOT_MINE
        tables = [present(node, i) for i in range(2, 7)]
        if tables[0] is None or tables[1] is None or tables[3] is None:
            return "the word and position tables and gamma (inputs 2, 3, 5) must be given"
        return EmbedLayerNormMatch(node, tables)

    def rewrite(self, ctx: LiftContext, match: EmbedLayerNormMatch) -> None:
        node = match.node
        write_embed_layer_norm(ctx, node, match.tables, present(node, 7), present(node, 8))
