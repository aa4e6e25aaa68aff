"""Lift ``DequantizeLinear`` of a quantized table read through ``Gather`` (quantized embeddings).

onnxruntime's ``quantize_dynamic`` (and its QOperator mode, and Intel Neural Compressor's dynamic
mode) quantize embedding tables too: the integer table is gathered by the token ids and the rows
are dequantized afterwards. TensorRT imports no DequantizeLinear of a non-constant integer tensor,
and a table lookup gains nothing from INT8 compute, so the table is dequantized once::

    Before:  T_q:uint8|int8 [V, H] ─ Gather(ids) ─ [Reshape|Transpose|…]* ─ DQ(s, z[, axis]) ─ y
    After:   T = (T_q − z)·s (float) ─ Gather(ids) ─ [Reshape|Transpose|…]* ─ y

Exact: gathering and moving data commute with an element-wise dequantization whose
per-axis scale (if any) sits on an axis the data movement keeps (a Gather's non-indexed
axes, a Transpose's permuted axis). Anything else is declined with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.scale_algebra import constant_values, dequantized, infinite_scale, quantizer_zero_point

#: ops that only move or select elements of their first input (the others are indices or shapes)
DATA_MOVEMENT = frozenset({"Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                           "Slice", "Expand", "Tile"})


def replay(ctx: LiftContext, nodes: list[gs.Node], start: gs.Tensor, end: gs.Tensor) -> None:
    """Copies of the data-movement ``nodes`` (source first) applied to the float ``start``, the last one
    writing ``end`` (whose old producer the caller detaches)."""
    current = start
    for i, source in enumerate(nodes):
        last = i == len(nodes) - 1
        out = end if last else gs.Variable(ctx.names(f"{source.outputs[0].name}_float"), dtype=np.float32)
        ctx.graph.nodes.append(gs.Node(source.op, ctx.names(f"{source.name}_float"), dict(source.attrs),
                                       [current, *source.inputs[1:]], [out]))
        current = out


def _chain(tensor: gs.Tensor) -> tuple[list[gs.Node], np.ndarray] | None:
    """The data-movement nodes (source first) between an integer constant and ``tensor``, and its values;
    None unless one Gather with non-constant indices is among them (a constant chain is folded already)."""
    nodes: list[gs.Node] = []
    t = tensor
    while constant_values(t) is None:
        if len(t.inputs) != 1 or t.inputs[0].op not in DATA_MOVEMENT or t.inputs[0].outputs[0] is not t:
            return None
        nodes.append(t.inputs[0])
        t = t.inputs[0].inputs[0]
    values = constant_values(t)
    if not nodes or not np.issubdtype(values.dtype, np.integer) or not any(n.op == "Gather" for n in nodes):
        return None
    return nodes[::-1], values


def _source_axis(nodes: list[gs.Node], axis: int, rank_out: int, rank_in: int) -> int | str:
    """The table axis that the DQ's ``axis`` (on the chain's output) reads, following the chain back."""
    for node in reversed(nodes):
        if node.op == "Gather":
            g_axis = int(node.attrs.get("axis", 0))
            ind = constant_values(node.inputs[1])
            ind_rank = len(node.inputs[1].shape) if node.inputs[1].shape is not None else (
                None if ind is None else ind.ndim)
            if ind_rank is None:
                return f"the rank of Gather '{node.name}''s indices is unknown"
            data_rank = rank_out - ind_rank + 1
            g_axis %= data_rank
            if g_axis <= axis < g_axis + ind_rank:
                return f"the scale's axis is the one Gather '{node.name}' indexes"
            axis = axis if axis < g_axis else axis - ind_rank + 1
            rank_out = data_rank
        elif node.op == "Transpose":
            perm = node.attrs.get("perm") or list(range(rank_out))[::-1]
            axis = int(perm[axis])
        elif node.op != "Identity":
            return f"a per-axis scale through {node.op} '{node.name}' is not lifted"
    if rank_out != rank_in:
        return "the chain changes the rank of the table"
    return axis


@dataclass(frozen=True)
class GatheredTableMatch:
    dq: gs.Node
    moves: list[gs.Node]  # Gather and the data-movement nodes after it, the table's side first
    floats: np.ndarray  # the dequantized table
    lost: str | None = None  # an Inf scale's words for the report (scale_algebra.infinite_scale)


class DequantizeGathered:
    name = "dequantize-gathered"
    op_types = ("DequantizeLinear",)
    outcome = None  # no words of its own: check says "lifted by" the rule

    def match(self, ctx: LiftContext, node: gs.Node) -> GatheredTableMatch | str:
        found = _chain(node.inputs[0])
        if found is None:
            return NOT_MINE
        nodes, values = found
        if node.attrs.get("block_size", 0):
            return "blocked quantization (block_size) is not lifted"
        scale, zp = constant_values(node.inputs[1]), quantizer_zero_point(node)
        if scale is None or zp is None:
            return "the scale and zero point must be constants"
        shape = [1] * values.ndim
        if scale.size > 1 or zp.size > 1:
            out_rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
            if out_rank is None:
                return f"the rank of '{node.inputs[0].name}' is unknown"
            axis = _source_axis(nodes, int(node.attrs.get("axis", 1)) % out_rank, out_rank, values.ndim)
            if isinstance(axis, str):
                return axis
            shape[axis] = -1
        s = scale.astype(np.float64).reshape(shape if scale.size > 1 else ())
        z = zp.astype(np.float64).reshape(shape if zp.size > 1 else ())
        floats = dequantized(values.astype(np.float64) - z, s).astype(np.float32)
        return GatheredTableMatch(node, nodes, floats, infinite_scale(scale, floats,
                                                                      f"table '{nodes[0].inputs[0].name}'"))

    def rewrite(self, ctx: LiftContext, match: GatheredTableMatch) -> None:
        node, nodes = match.dq, match.moves
        table = nodes[0].inputs[0]
        if match.lost:
            ctx.approximate(self.name, node.name, match.lost)
        floats = ctx.constant(f"{table.name}_float", match.floats, ("dequantized", table.name, node.name))
        replay(ctx, nodes, floats, node.outputs[0])
        node.outputs.clear()  # the new chain now produces the DQ's output
