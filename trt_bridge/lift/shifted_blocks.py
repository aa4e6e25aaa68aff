"""A MatMul's 4-bit block weight that TensorRT's INT4 has no exact form for, kept exact as int4 codes plus a float side
path that adds each block's shift (the zero point other than 8, the sign of a negative scale, a float zero point)::

    Before:  A ─ MatMul(W = (q − z)·s, blocks of b along K) ─ Y
    After:   A ─ MatMul(W' = k·|s|) ─ + ─ Y          annotation: W' → INT4 blocks of b, the codes k kept
             A ─ MatMul(E) ─ MatMul(T) ─┘            E [1, K, K/b]: ones summing each block of A's columns,
                                                     T [1, K/b, N]: each block's shift t·|s| (float)
             (a Shape ─ Reshape after MatMul(T) where A's rank is below 3 or unknown: the leading 1 goes)

with ``(q − z)·s = k·|s| + t·|s|`` (:func:`trt_bridge.lift.int4_blocks.int4_offset_blocks`). The side path costs K/b
of the MatMul's N columns; it stays in the high precision. Used by the rules that lift MatMulNBits and blocked
DequantizeLinear weights of a MatMul or a Gemm (``transA`` 0; its weight kept as it reads it, ``[N, K]`` with
``transB``, and its ``alpha`` scaling the side path: NNCF's int4 Gemm weights were clipped or re-quantized block by
block, 0.75 dB on a MiniLM).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.formats import INT4, broadcast_param
from trt_bridge.lift.base import LiftContext, digest
from trt_bridge.lift.int4_blocks import OffsetBlocks, int4_offset_blocks
from trt_bridge.lift.weights import dequantize

#: output channels worked on at a time: the int16 (or float64) copies of a decoder's lm_head (2048 × 32000) were
#: 0.5 GB at once
COLUMNS = 4096


def shifted_blocks(values: np.ndarray, zero_point: np.ndarray, scale: np.ndarray, block: int) -> OffsetBlocks | None:
    """A [K, N] block weight (codes ``values``, ``zero_point`` and ``scale`` [K/b, N], blocks along K) as exact int4
    codes plus a shift per block, where some block does not fit int4 as it is; None where every block fits (or
    one cannot be shifted into int4: 8-bit codes). Worked out :data:`COLUMNS` output channels at a time."""
    parts = []
    for start in range(0, max(values.shape[1], 1), COLUMNS):
        cols = slice(start, start + COLUMNS)
        zp = broadcast_param(zero_point[:, cols] if np.ndim(zero_point) == 2 else zero_point, values[:, cols].shape,
                             0, block)
        if np.issubdtype(np.asarray(zero_point).dtype, np.floating):
            centred = values[:, cols].astype(np.float64) - np.asarray(zp, np.float64)
        else:
            centred = values[:, cols].astype(np.int16) - np.asarray(zp).astype(np.int16)
        part = int4_offset_blocks(centred, scale[:, cols], block, 0)
        if part is None:
            return None
        parts.append(part)
    if not any(np.any(p.offset) for p in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    return OffsetBlocks(*(np.concatenate([getattr(p, f) for p in parts], axis=1) for f in ("codes", "scale", "offset")))


def lift_shifted_matmul(ctx: LiftContext, matmul: gs.Node, source: gs.Tensor, shifted: OffsetBlocks, block: int,
                        origin: str, ftype=np.float32) -> bool:
    """Make ``matmul``'s weight (input 1, from ``source``) the exact codes of ``shifted`` (blocks along K of the
    [K, N] weight) and add its side path; a Gemm's weight is written as it reads it ([N, K] with ``transB``), its
    ``alpha`` scaling the side path too. False (nothing changed) for a Gemm with ``transA``."""
    gemm = matmul.op == "Gemm"
    if gemm and int(matmul.attrs.get("transA", 0)):
        return False
    transposed = gemm and bool(int(matmul.attrs.get("transB", 0)))
    alpha = float(matmul.attrs.get("alpha", 1.0)) if gemm else 1.0
    key = ("shifted-block-weight", source.name, digest(shifted.codes), digest(shifted.scale), digest(shifted.offset),
           np.dtype(ftype).name, transposed)
    base = source.name.removesuffix("_quantized") or origin
    codes, scale = (shifted.codes.T, shifted.scale.T) if transposed else (shifted.codes, shifted.scale)
    weight = ctx.constant(f"{base}_float", lambda: dequantize(codes, scale, int(transposed), block).astype(ftype),
                          key, codes.shape, ftype)  # computed only if read: lowering writes the codes
    site = Site(matmul.name, 1)
    spec = ctx.annotations.weights.get(weight.name)
    if spec is None:
        spec = WeightSpec(weight.name, [], 0 if transposed else 1, origin, codes=codes, scale=scale,
                          source=ScaleSource.EXACT_WEIGHTS, format=INT4, block_size=block)
    spec.sites.append(site)
    ctx.annotations.add_weight(spec)
    matmul.inputs[1] = weight
    a, y = matmul.inputs[0], matmul.outputs[0]
    name = matmul.name or y.name
    rows, blocks = shifted.codes.shape[0], shifted.offset.shape[0]
    ones = np.zeros((rows, blocks), ftype)
    ones[np.arange(rows), np.arange(rows) // block] = 1
    product = gs.Variable(ctx.names(f"{name}/int4_out"), dtype=y.dtype)
    summed = gs.Variable(ctx.names(f"{name}/block_sums"), dtype=y.dtype)
    shift = gs.Variable(ctx.names(f"{name}/block_shift_out"), dtype=y.dtype)
    y.inputs.clear()
    matmul.outputs.append(product)
    # E and T are 3-D ([1, ·, ·]): no 2-D MatMul weight that --int4 would quantize; a product of A of rank < 3 (or
    # unknown) gains a leading 1, reshaped back to the MatMul's shape
    ctx.graph.nodes.append(gs.Node("MatMul", ctx.names(f"{name}/block_sum"), {}, [
        a, ctx.constant(f"{name}/block_sum_ones", ones[None], ("block-sum-ones", rows, block, np.dtype(ftype).name))],
        [summed]))
    ctx.graph.nodes.append(gs.Node("MatMul", ctx.names(f"{name}/block_shift"), {}, [
        summed, ctx.constant(f"{base}_block_shifts", (alpha * shifted.offset).astype(ftype)[None],
                             ("block-shifts",) + key + (alpha,))],
        [shift]))
    if a.shape is None or len(a.shape) < 3:
        shape = gs.Variable(ctx.names(f"{name}/int4_out_shape"), dtype=np.int64)
        ctx.graph.nodes.append(gs.Node("Shape", ctx.names(f"{name}/int4_shape"), {}, [product], [shape]))
        reshaped = gs.Variable(ctx.names(f"{name}/block_shift_reshaped"), dtype=y.dtype)
        ctx.graph.nodes.append(gs.Node("Reshape", ctx.names(f"{name}/block_shift_reshape"), {}, [shift, shape],
                                       [reshaped]))
        shift = reshaped
    ctx.graph.nodes.append(gs.Node("Add", ctx.names(f"{name}/shifted"), {}, [product, shift], [y]))
    return True
