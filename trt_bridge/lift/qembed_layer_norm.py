"""Lift com.microsoft ``QEmbedLayerNormalization`` (``quantize_dynamic``/QOperator on ``EmbedLayerNormalization``).

onnxruntime's quantizers store the fused embedding's tables, γ and β as uint8 codes with a scale and
zero point each; the kernel dequantizes them and computes the float ``EmbedLayerNormalization``::

    Before:  input_ids, segment_ids, word_q, position_q, segment_q, γ_q, β_q, mask,
             5 scales, 5 zero points ─ QEmbedLayerNormalization(epsilon) ─ y, mask_index

    After:   the graph of ``lift/embed_layer_norm.py`` on the dequantized tables (q − z)·s, as float
             constants: Gather, Add, LayerNormalization, and the mask's ReduceSum

Nothing in it is a matrix product, so nothing is annotated: the tables' quantization is the source's
rounding of its float values, kept as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import present
from trt_bridge.lift.base import NOT_MINE, LiftContext, PendingConstant
from trt_bridge.lift.embed_layer_norm import MS, write_embed_layer_norm
from trt_bridge.lift.scale_algebra import constant_values

_TABLES = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")


@dataclass(frozen=True)
class QEmbedLayerNormMatch:
    node: gs.Node
    tables: tuple[PendingConstant | None, ...]  # word, position, segment, γ, β dequantized (None: absent)


class QEmbedLayerNorm:
    name = "qembed-layer-norm"
    op_types = ("QEmbedLayerNormalization",)
    outcome = ("lifted by rule 'qembed-layer-norm': its tables dequantized to float, then Gather + Add + "
               "LayerNormalization (the mask index as ReduceSum)")

    def match(self, ctx: LiftContext, node: gs.Node) -> QEmbedLayerNormMatch | str:
        if (node.domain or "") != MS:
            return NOT_MINE
        tables: list[PendingConstant | None] = []
        for i, what in enumerate(_TABLES):
            codes = present(node, 2 + i)
            if codes is None:
                if what in ("segment_embedding", "beta"):
                    tables.append(None)
                    continue
                return f"input {2 + i} ({what}) is missing"
            scale_in, zp_in = present(node, 8 + i), present(node, 13 + i)
            values, scale = constant_values(codes), None if scale_in is None else constant_values(scale_in)
            zp = np.zeros((), np.int64) if zp_in is None else constant_values(zp_in)
            if values is None or scale is None or zp is None or scale.size != 1 or zp.size != 1:
                return f"{what} '{codes.name}' and its scale and zero point must be constants, per tensor"
            floats = ((values.astype(np.float64) - zp.astype(np.float64).reshape(())) * scale.astype(np.float64)
                      .reshape(())).astype(np.float32)
            tables.append(PendingConstant(f"{codes.name.removesuffix('_quantized')}_float", floats,
                                          ("qembed", codes.name, scale.tobytes(), zp.tobytes())))
        return QEmbedLayerNormMatch(node, tuple(tables))

    def rewrite(self, ctx: LiftContext, match: QEmbedLayerNormMatch) -> None:
        tables = [None if table is None else table.make(ctx) for table in match.tables]
        write_embed_layer_norm(ctx, match.node, tables, present(match.node, 7), None)
