"""A source's 4-bit (or narrower) block codes as TensorRT's INT4 weight-only blocks: symmetric int4 codes, positive
scales, zero points 0.

A source block is ``(q − z)·s``: uint4 codes with a zero point (onnxruntime's ``MatMulNBits``, blocked uint4
``DequantizeLinear``), int4 codes without one, and a scale of either sign (onnxruntime's symmetric quantizer divides
each block by its value of largest magnitude over −8, so about half its scales are negative). A block is kept exactly
where its centred codes ``c = q − z``, their sign turned with the scale's, fit int4 ([−8, 7]); TensorRT has no form
for the others (no zero points, no negative scales), which become the nearer of

- the source's scale with the codes clipped to [−8, 7] (a negative-scale block of onnxruntime's loses one step on its
  largest value, turned from −8 to +8), or
- the block re-quantized symmetric from its values (what a uint4 block whose zero point is far from 8 needs),

measured against the block's own values. :func:`int4_blocks` returns the codes, the scales and how many blocks were
not kept exactly (reported by the rule that lifts them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_bridge.formats import INT4, code_limits

#: int4's codes: [−8, 7] (a symmetric quantizer writes [−7, 7]; a source's −8 is kept)
LOW, HIGH = code_limits(INT4.dtype)


@dataclass(frozen=True)
class Int4Blocks:
    codes: np.ndarray  # int4 (ml_dtypes), the weight's shape
    scale: np.ndarray  # float32, positive: the weight's rank, the block axis divided in blocks
    inexact: int  # blocks whose values changed (clipped or re-quantized)
    total: int  # blocks


def int4_blocks(centred: np.ndarray, scale: np.ndarray, block: int, along: int) -> Int4Blocks:
    """Int4 codes and positive scales for the blocks of ``block`` values along axis ``along`` of ``centred`` (the
    source's ``q − z``: integers, or floats for float zero points) with ``scale`` (the weight's rank, ``along``
    divided in blocks; any sign): exact where the codes fit, else the nearer of clipping and re-quantizing."""
    c = np.moveaxis(np.asarray(centred, np.float64), along, 0)
    s = np.moveaxis(np.asarray(scale, np.float64), along, 0)
    length, blocks = c.shape[0], s.shape[0]
    rest = c.shape[1:]
    padded = np.zeros((blocks * block, *rest))
    padded[:length] = c
    cb = padded.reshape(blocks, block, *rest)
    sign = np.where(s < 0, -1.0, 1.0)
    cb = cb * sign[:, None]
    sa = np.abs(s)
    values = cb * sa[:, None]  # what the source computes, block by block (the padding is 0)
    integral = np.all(cb == np.rint(cb), axis=1)
    fits = integral & (cb.min(axis=1) >= LOW) & (cb.max(axis=1) <= HIGH) & (sa > 0)
    zero = sa == 0  # a zero scale: every value 0, any code and positive scale keep them
    # the source's grid, the codes clipped
    clipped = np.clip(np.rint(cb), LOW, HIGH)
    clip_err = np.sum((clipped * sa[:, None] - values) ** 2, axis=1)
    # re-quantized symmetric from the values, per block (amax / 7)
    amax = np.abs(values).max(axis=1)
    rq_scale = np.where(amax > 0, amax / INT4.qmax, 1.0 / INT4.qmax)
    requant = np.clip(np.rint(values / rq_scale[:, None]), -INT4.qmax, INT4.qmax)
    rq_err = np.sum((requant * rq_scale[:, None] - values) ** 2, axis=1)
    use_clip = (fits | (clip_err <= rq_err)) & ~zero
    codes = np.where(use_clip[:, None], clipped, requant)
    codes = np.where(zero[:, None], 0.0, codes)
    out_scale = np.where(use_clip, sa, rq_scale)
    out_scale = np.where(zero, 1.0 / INT4.qmax, out_scale)
    inexact = int(np.count_nonzero(~(fits | zero)))
    codes = codes.reshape(blocks * block, *rest)[:length]
    return Int4Blocks(np.moveaxis(codes, 0, along).astype(INT4.dtype),
                      np.moveaxis(out_scale, 0, along).astype(np.float32), inexact, int(np.prod(s.shape)))


@dataclass(frozen=True)
class OffsetBlocks:
    codes: np.ndarray  # int4, the weight's shape
    scale: np.ndarray  # float32, positive, blocked
    offset: np.ndarray  # float64 [blocks, ...]: a value added to every weight of the block (0 where the codes fit)


def int4_offset_blocks(centred: np.ndarray, scale: np.ndarray, block: int, along: int) -> OffsetBlocks | None:
    """The blocks of :func:`int4_blocks` exactly, as int4 codes plus a value per block: ``(q − z)·s = k·|s| + t·|s|``
    with ``k`` in [−8, 7] and the shift ``t`` (0 where the codes fit as they are). Exact wherever a block's centred
    codes (sign turned with its scale's) span at most 16 consecutive values, as any 4-bit block's do (a float zero
    point included); None where one does not (8-bit codes)."""
    if np.issubdtype(np.asarray(centred).dtype, np.integer) and np.asarray(centred).shape[along] % block == 0:
        return _integer_offset_blocks(np.asarray(centred), scale, block, along)
    c = np.moveaxis(np.asarray(centred, np.float64), along, 0)
    s = np.moveaxis(np.asarray(scale, np.float64), along, 0)
    length, blocks = c.shape[0], s.shape[0]
    padded = np.full((blocks * block, *c.shape[1:]), np.nan)
    padded[:length] = c
    sign = np.where(s < 0, -1.0, 1.0)
    cb = padded.reshape(blocks, block, *c.shape[1:]) * sign[:, None]
    lo, hi = np.nanmin(cb, axis=1), np.nanmax(cb, axis=1)
    if np.any(hi - lo > HIGH - LOW):
        return None
    shift = np.where((hi <= HIGH) & (lo >= LOW) & np.all(np.isnan(cb) | (cb == np.rint(cb)), axis=1), 0.0, hi - HIGH)
    codes = np.nan_to_num(cb - shift[:, None]).reshape(blocks * block, *c.shape[1:])[:length]
    sa = np.abs(s)
    zero = sa == 0  # every value 0: codes 0, any positive scale
    codes = np.where(np.repeat(zero, block, axis=0)[:length], 0.0, np.rint(codes))
    return OffsetBlocks(np.moveaxis(codes, 0, along).astype(INT4.dtype),
                        np.moveaxis(np.where(zero, 1.0 / HIGH, sa), 0, along).astype(np.float32),
                        np.moveaxis(np.where(zero, 0.0, shift * sa), 0, along))


def _integer_offset_blocks(centred: np.ndarray, scale: np.ndarray, block: int, along: int) -> OffsetBlocks | None:
    """:func:`int4_offset_blocks` for integer codes filling whole blocks (every 4-bit source's): the same codes,
    scales and shifts, in int16 arithmetic without the float64 copies and NaN padding of the general case (a 0.85 B
    int4 decoder: 59 s of its 119 s conversion were those)."""
    c = np.moveaxis(centred, along, 0).astype(np.int16)
    s = np.moveaxis(np.asarray(scale, np.float64), along, 0)
    blocks = s.shape[0]
    cb = c.reshape(blocks, block, *c.shape[1:])
    negative = s < 0
    cb = np.where(negative[:, None], -cb, cb)
    lo, hi = cb.min(axis=1), cb.max(axis=1)
    if np.any(hi - lo > HIGH - LOW):
        return None
    shift = np.where((hi <= HIGH) & (lo >= LOW), 0, hi - HIGH).astype(np.int16)
    codes = (cb - shift[:, None]).reshape(c.shape)
    sa = np.abs(s)
    zero = sa == 0  # every value 0: codes 0, any positive scale
    codes = np.where(np.repeat(zero, block, axis=0), 0, codes)
    return OffsetBlocks(np.moveaxis(codes, 0, along).astype(INT4.dtype),
                        np.moveaxis(np.where(zero, 1.0 / HIGH, sa), 0, along).astype(np.float32),
                        np.moveaxis(np.where(zero, 0.0, shift * sa), 0, along))
