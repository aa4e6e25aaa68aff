"""Integer source weights → a float constant in the lifted graph plus its weight annotation; which input of an
op is its weight, and on which axis its output channels lie; and back: the codes and scales a weight
annotation lowers to (:func:`weight_values`, used by :mod:`trt_bridge.lower.qdq`) and the float weights the
lowered model computes with (:func:`effective_weight`, which smoothing and re-centring reason about before
lowering)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.annotations import QMAX, ScaleSource, Site, WeightSpec
from trt_bridge.errors import InternalError, UnsupportedPatternError
from trt_bridge.formats import (
    FP4,
    FP8,
    INT4,
    INT8,
    QuantFormat,
    broadcast_param,
    numpy_code_format,
    nvfp4_fitted,
    nvfp4_scales,
)
from trt_bridge.ir.store import release_weight
from trt_bridge.ir.tensorrt_ops import output_channel_axis
from trt_bridge.ir.values import FLOAT32_TINY, check_finite_weight
from trt_bridge.lift.base import LiftContext, digest
from trt_bridge.lift.int4_blocks import int4_blocks

#: op type → input index of its weight
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}


def weight_axis(node: gs.Node, rank: int) -> int:
    """The output-channel axis of ``node``'s weight: per-channel scales go there."""
    return output_channel_axis(node.op, node.attrs.get("transB", 0), rank)


def lift_integer_weight(ctx: LiftContext, tensor: gs.Tensor, values: np.ndarray, zero_point: np.ndarray,
                        scale: np.ndarray, axis: int, site: Site, origin: str, ftype=np.float32) -> gs.Constant:
    """The float weight ``(W_q − zero_point) · scale`` (``scale``/``zero_point`` 0-d or per ``axis``) of type ``ftype``,
    shared by every site that lifts the same integers with the same scale, and annotated for lowering."""
    shape = [1] * values.ndim
    shape[axis] = -1
    zp = zero_point.reshape(shape) if zero_point.ndim else zero_point
    sc = scale.reshape(shape) if scale.ndim else scale
    key = ("integer-weight", tensor.name, scale.tobytes(), zero_point.tobytes())
    base = tensor.name.removesuffix("_quantized") or origin
    const = ctx.constant(f"{base}_float", lambda: _dequantized(values, zp, sc).astype(ftype, copy=False), key)
    spec = ctx.annotations.weights.get(const.name)
    if spec is None:
        spec = _weight_spec(const.name, values, zero_point, scale, axis, origin)
        codes = numpy_code_format(values.dtype)
        if codes is not None and codes.nearest.is_float and spec.codes is None:  # E5M2, FNUZ, a zero point
            why = "TensorRT's FP8 is E4M3FN" if not codes.exact else "TensorRT's FP8 has zero point 0"
            ctx.approximate("dequantize-constant", origin, f"{codes.name} weight codes of '{tensor.name}' "
                            f"re-quantized as FP8 E4M3 from their float values ({why})")
    spec.sites.append(site)
    ctx.annotations.add_weight(spec)
    return const


def lift_block_weight(ctx: LiftContext, tensor: gs.Tensor, values: np.ndarray, zero_point: np.ndarray,
                      scale: np.ndarray, axis: int, block: int, site: Site, origin: str,
                      rule: str = "dequantize-constant", ftype=np.float32) -> gs.Constant:
    """The float weight (of type ``ftype``) of a 2-D blocked DequantizeLinear (``scale``/``zero_point`` blocked
    along the reduction axis, the other one of the output-channel ``axis``; a float zero point too), annotated INT4
    weight-only with blocks of ``block``: the codes kept where ``W_q − zero_point``, its sign turned with a negative
    scale's, fits int4 (int4, and uint4 with zero point 8), the other blocks clipped or re-quantized
    (:func:`trt_bridge.lift.int4_blocks.int4_blocks`, reported by ``rule``)."""
    along = block_axis(axis, values.ndim)
    key = ("block-weight", tensor.name, digest(scale), digest(zero_point), np.dtype(ftype).name)
    base = tensor.name.removesuffix("_quantized") or origin
    seen = ctx.constants.get(key)
    found = None if seen is not None and seen.name in ctx.annotations.weights else \
        int4_blocks(_centred(values, zero_point, along, block), scale, block, along)
    if found is not None and not found.inexact:  # the kept codes are the weight: the source's codes can go
        def compute() -> np.ndarray:
            return dequantize(found.codes, found.scale, along, block).astype(ftype)
    else:
        def compute() -> np.ndarray:
            return _block_floats(values, zero_point, scale, along, block, ftype)
    const = ctx.constant(f"{base}_float", compute, key, values.shape, ftype)  # computed only if read: lowering
    spec = ctx.annotations.weights.get(const.name)                             # writes the codes
    if spec is None:
        found = found or int4_blocks(_centred(values, zero_point, along, block), scale, block, along)
        codes = numpy_code_format(values.dtype)
        if not found.inexact or (codes is not None and codes.nearest is INT4):
            spec = WeightSpec(const.name, [], axis, origin, codes=found.codes, scale=found.scale, format=INT4,
                              block_size=block, source=ScaleSource.EXACT_WEIGHTS)
            if found.inexact:
                spec.source = ScaleSource.REQUANTIZED
                ctx.approximate(rule, origin, f"{found.inexact} of {found.total} blocks of {values.dtype} codes of "
                                f"'{tensor.name}' do not fit int4 once centred on their zero points (and turned "
                                f"with a negative scale): clipped or re-quantized INT4, whichever is nearer, in "
                                f"blocks of {block}")
        else:  # 8-bit blocks: TensorRT takes no 8-bit blocks; per channel keeps more than 4 bits would
            fmt, why = _per_channel_form(values, zero_point, scale, axis, along, block, ftype)
            spec = WeightSpec(const.name, [], axis, origin, format=fmt)
            ctx.approximate(rule, origin, f"block-wise {values.dtype} weights (block_size {block}) of "
                            f"'{tensor.name}' re-quantized as {fmt.label} per output channel, the nearest form "
                            f"TensorRT builds{why}")
    spec.sites.append(site)
    ctx.annotations.add_weight(spec)
    return const


def _per_channel_form(values, zero_point, scale, axis: int, along: int, block: int, ftype) -> tuple[QuantFormat, str]:
    """The per-channel format nearer to an 8-bit block weight: FP8 E4M3 codes keep FP8 where FP8 per channel is the
    nearer (a floating format spans the blocks' different scales; TensorRT builds an FP8 weight-only DequantizeLinear
    and keeps its weights FP8), else INT8; integer codes INT8. Returns the format and what was measured."""
    if np.asarray(values).dtype != FP8.dtype:
        return INT8, ""
    weight = _block_floats(values, zero_point, scale, along, block, np.float64)
    noise = {}
    for fmt in (FP8, INT8):
        codes, scales = quantize_weight(weight, axis, np.float32, fmt)
        noise[fmt] = float(np.sum((dequantize(codes, scales, axis).astype(np.float64) - weight) ** 2))
    signal = float(np.sum(weight ** 2)) or 1.0
    db = {fmt: 10 * np.log10(signal / max(n, 1e-300)) for fmt, n in noise.items()}
    fmt = FP8 if noise[FP8] <= noise[INT8] else INT8
    return fmt, f" (the weight's SNR: FP8 {db[FP8]:.1f} dB, INT8 {db[INT8]:.1f} dB)"


def _centred(values: np.ndarray, zero_point: np.ndarray, along: int, block: int) -> np.ndarray:
    """A block weight's codes less their zero points: int16 for integer zero points, float64 for float ones."""
    zp = broadcast_param(zero_point, values.shape, along, block)
    if np.issubdtype(np.asarray(zero_point).dtype, np.floating):
        return values.astype(np.float64) - zp.astype(np.float64)
    return values.astype(np.int16) - zp.astype(np.int16)


def _block_floats(values: np.ndarray, zero_point: np.ndarray, scale: np.ndarray, along: int, block: int,
                  ftype) -> np.ndarray:
    """What a blocked DequantizeLinear computes, in float64 rounded once to ``ftype``."""
    full_scale = broadcast_param(scale, values.shape, along, block).astype(np.float64)
    return (_centred(values, zero_point, along, block) * full_scale).astype(ftype)


def lift_fp4_block_weight(ctx: LiftContext, tensor: gs.Tensor, values: np.ndarray, zero_point: np.ndarray,
                          scale: np.ndarray, axis: int, block: int, site: Site, origin: str) -> gs.Constant:
    """The float weight of a 2-D blocked FP4 (E2M1) DequantizeLinear (NVFP4/MXFP4: ``scale`` blocked along the
    reduction axis, one float per block, a two-level scale already multiplied out by the lift), annotated FP4 in
    blocks of ``block`` with the codes and the float32 block scales kept (where the zero point is 0 and every scale
    positive; else re-quantized FP4 from the float values, reported). Placement keeps them FP4 for a target that
    runs it, else approximates them as INT4 blocks (:mod:`trt_bridge.place.formats`)."""
    along = block_axis(axis, values.ndim)
    full_scale, zp = (broadcast_param(p, values.shape, along, block) for p in (scale, zero_point))
    centred = values.astype(np.float64) - np.asarray(zp, np.float64)
    key = ("fp4-block-weight", tensor.name, scale.tobytes(), zero_point.tobytes())
    base = tensor.name.removesuffix("_quantized") or origin
    const = ctx.constant(f"{base}_float", lambda: (centred * full_scale.astype(np.float64)).astype(np.float32), key)
    spec = ctx.annotations.weights.get(const.name)
    if spec is None:
        exact = not np.any(np.asarray(zero_point, np.float64)) and bool(np.all(scale > 0))
        spec = WeightSpec(const.name, [], axis, origin, format=FP4, block_size=block)
        if exact:
            spec.codes, spec.scale = np.ascontiguousarray(values, FP4.dtype), np.ascontiguousarray(scale, np.float32)
            spec.source = ScaleSource.EXACT_WEIGHTS
        else:
            ctx.approximate("dequantize-constant", origin, f"FP4 weight codes of '{tensor.name}' have a zero "
                            "point or a scale that is not positive, which TensorRT's FP4 has not: re-quantized "
                            f"FP4 from their float values in blocks of {block}")
    spec.sites.append(site)
    ctx.annotations.add_weight(spec)
    return const


def _dequantized(values: np.ndarray, zero_point: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(W_q − zero_point) · scale`` in float32, as if computed in float64 and rounded once. For 8-bit integers and
    a float32 or float16 scale, float32 arithmetic gives those very values at a quarter of the memory traffic: the
    difference is exact, and float32's product is the exact product (at most 9 × 24 bits, exact in float64) rounded
    once, which is what the float64 path rounds too."""
    if values.dtype in (np.int8, np.uint8) and np.issubdtype(zero_point.dtype, np.integer) \
            and scale.dtype in (np.float32, np.float16):
        return (values.astype(np.float32) - zero_point.astype(np.float32)) * scale.astype(np.float32)
    return ((values.astype(np.float64) - zero_point) * scale).astype(np.float32)


def _weight_spec(name: str, values: np.ndarray, zero_point: np.ndarray, scale: np.ndarray, axis: int,
                 origin: str) -> WeightSpec:
    """Keep the source's integers wherever ``W_q − zero_point`` fits symmetric int8 (FP8 E4M3 codes: kept as they
    are where the zero point is 0).

    Symmetric int8 sources are kept bit-exact (a negative scale's sign moved into the codes; its −128, +128 then,
    is the one code that does not fit). For uint8 (or zero-point) sources, each
    output channel whose centred integers fit in [-127, 127] is kept exact with the
    source's scale; only the channels that do not fit are re-quantized (symmetric, per
    channel).
    """
    codes = numpy_code_format(values.dtype)
    if codes is not None and codes.nearest.is_float:  # float8 codes: kept where symmetric, else from the floats
        if not (np.all(zero_point.astype(np.float64) == 0) and np.all(scale > 0) and codes.exact):
            return WeightSpec(name, [], axis, origin, format=codes.nearest)
        return WeightSpec(name, [], axis, origin, codes=values, scale=np.asarray(scale, np.float32),
                          source=ScaleSource.EXACT_WEIGHTS, format=codes.nearest)
    shape = [1] * values.ndim
    shape[axis] = -1
    zp = zero_point.reshape(shape) if zero_point.ndim else zero_point
    # int16 holds any 8-bit difference (a quarter of int64's memory traffic on a 26 MB CRNN)
    wide = np.int16 if values.dtype in (np.int8, np.uint8) and zp.dtype in (np.int8, np.uint8) else np.int64
    centred = values.astype(wide) - zp.astype(wide)
    if not np.all(np.abs(scale) > 0):  # a zero or NaN scale: the weight re-quantized from its float values
        return WeightSpec(name, [], axis, origin)
    if np.any(scale < 0):  # NNCF's symmetric int8 writes scale = amax / −128: the sign moves into the codes
        negative = scale.reshape(shape) < 0 if scale.ndim else scale < 0
        centred, scale = np.where(negative, -centred, centred), np.abs(scale)
    reduce_axes = tuple(i for i in range(centred.ndim) if i != axis)
    amax = np.abs(centred).max(axis=reduce_axes, initial=0)  # per channel
    if amax.max(initial=0) <= QMAX:
        return WeightSpec(name, [], axis, origin, codes=centred.astype(np.int8),
                          scale=np.asarray(scale, np.float32), source=ScaleSource.EXACT_WEIGHTS)
    fits = amax <= QMAX
    scale_vec = np.broadcast_to(scale, fits.shape).astype(np.float64)
    # a channel's largest |c·s| (rounding keeps the order of the products, so it is the largest |c| times s)
    requant = amax * scale_vec / QMAX
    per_channel = np.where(fits, scale_vec, requant)
    # only the channels that do not fit are re-quantized: rint(c·s / s'), on those channels alone (clipping their few
    # codes beyond ±127 instead, though nearer in squared error, cost 0.3 dB on ddddocr's real CRNN: it shrinks
    # exactly the largest weights)
    bad = np.flatnonzero(~fits)
    where = [slice(None)] * centred.ndim
    where[axis] = bad
    q = centred.copy()
    q[tuple(where)] = np.clip(np.rint(centred[tuple(where)] * scale_vec[bad].reshape(shape)
                                      / per_channel[bad].reshape(shape)), -QMAX, QMAX)
    return WeightSpec(name, [], axis, origin, codes=q.astype(np.int8),
                      scale=per_channel.astype(np.float32), source=ScaleSource.REQUANTIZED)


def float_type(tensor: gs.Tensor, what: str):
    """The numpy float type of a tensor to quantize (float32 when unknown); a bfloat16 one is refused
    (``what``: "weight" or "activation", for the message)."""
    dtype = tensor.dtype  # a Constant's type comes from its TensorProto header: the values are not loaded
    if dtype is None:
        return np.float32
    if isinstance(dtype, int):  # an ONNX type numpy lacks: bfloat16
        raise UnsupportedPatternError(
            f"{what} '{tensor.name}' is bfloat16, which trt-bridge does not quantize: convert with --bf16 fp32 "
            "(the default) or --bf16 fp16.")
    dtype = np.dtype(dtype)
    return dtype.type if dtype in (np.float16, np.float32) else np.float32


def quantize_weight(values: np.ndarray, axis: int, ftype=np.float32, fmt: QuantFormat = INT8,
                    block_size: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantization in ``fmt`` (INT8 by default): per channel along ``axis`` (codes, 1-d scales of type
    ``ftype``), or with ``block_size`` per block of that many values along the other axis of a 2-D weight (its
    reduction axis: codes, scales of the weight's rank, that axis divided in blocks).

    The codes are computed with the scale as the model will store it (float16 in a float16 model), so
    dequantizing gives back what was quantized."""
    if block_size:
        return quantize_blocks(values, block_axis(axis, values.ndim), block_size, ftype, fmt)
    reduce_axes = tuple(i for i in range(values.ndim) if i != axis)
    amax = np.abs(values.astype(np.float64)).max(axis=reduce_axes)
    scale = _scale(amax, ftype, fmt)
    shape = [1] * values.ndim
    shape[axis] = -1
    return fmt.codes(values, scale.astype(np.float64).reshape(shape)), scale


def _scale(amax: np.ndarray, ftype, fmt: QuantFormat) -> np.ndarray:
    # an all-zero channel takes 1/qmax (any scale is exact); one too small for a normal float32 scale the smallest
    # normal (TensorRT takes no subnormal scale; such weights are zero to float32 arithmetic anyway)
    return representable_scale(np.where(amax > 0, np.maximum(amax / fmt.qmax, FLOAT32_TINY), 1.0 / fmt.qmax), ftype)


def block_axis(channel_axis: int, rank: int) -> int:
    """The axis blocks run along in a 2-D weight whose output channels lie on ``channel_axis``: the other one."""
    if rank != 2:
        raise InternalError(f"block-wise weights are 2-D (MatMul/Gemm), got rank {rank}")
    return 1 - channel_axis % 2


def quantize_blocks(values: np.ndarray, axis: int, block_size: int, ftype=np.float32,
                    fmt: QuantFormat = INT8, search: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric ``fmt`` codes per block of ``block_size`` values along ``axis`` (the last block may be short):
    (codes, scales shaped as ``values`` with ``axis`` divided in blocks), as a blocked DequantizeLinear takes them.

    INT4 blocks (unless not ``search``: a caller that chose each block's range itself, AWQ's clip search) take the
    scale of :func:`_int4_scale` and codes over [-8, 7]; other formats, amax / qmax."""
    values = np.asarray(values)
    length = values.shape[axis]
    blocks = -(-length // block_size)
    padded = np.moveaxis(values.astype(np.float64), axis, 0)
    if blocks * block_size != length:
        padded = np.concatenate([padded, np.zeros((blocks * block_size - length, *padded.shape[1:]))])
    grouped = padded.reshape(blocks, block_size, *padded.shape[1:])
    amax = np.abs(grouped).max(axis=1)
    if fmt is INT4 and search:
        scale = _int4_scale(grouped, amax, ftype)
        moved = np.moveaxis(values, axis, 0)
        codes = block_codes(moved, broadcast_param(scale.astype(np.float64), moved.shape, 0, block_size), INT4)
        return np.moveaxis(codes, 0, axis), np.moveaxis(scale, 0, axis)
    scale = _scale(amax, ftype, fmt)
    if fmt is FP4 and ftype == np.float32:  # NVFP4: FP8 block scales under a global one (lowered in two levels)
        scale = nvfp4_fitted(grouped, scale) if search else nvfp4_scales(scale)
    moved = np.moveaxis(values, axis, 0)
    codes = fmt.codes(moved, broadcast_param(scale.astype(np.float64), moved.shape, 0, block_size))
    return np.moveaxis(codes, 0, axis), np.moveaxis(scale, 0, axis)


def fp4_block_scales(values: np.ndarray, block_size: int) -> np.ndarray:
    """Plain FP4 block scales (amax / 6, float32) of ``values`` [K, N] in blocks of ``block_size`` rows: [blocks, N]."""
    blocks = -(-values.shape[0] // block_size)
    padded = np.zeros((blocks * block_size, *values.shape[1:]))
    padded[:values.shape[0]] = values
    return _scale(np.abs(padded.reshape(blocks, block_size, *values.shape[1:])).max(axis=1), np.float32, FP4)


def block_codes(values: np.ndarray, scale: np.ndarray, fmt: QuantFormat) -> np.ndarray:
    """The codes of weight ``values`` at ``scale`` (broadcast to them): INT4 over [-8, 7] (:data:`INT4_LOWEST`),
    other formats as ``fmt`` writes them."""
    if fmt is not INT4:
        return fmt.codes(values, scale)
    return np.clip(np.rint(np.asarray(values, np.float64) / np.asarray(scale, np.float64)), INT4_LOWEST,
                   INT4.qmax).astype(INT4.dtype)


#: the lowest int4 code: a weight block may use it (a DequantizeLinear reads every int4 code; only activations
#: stay symmetric), so a block's codes run over [-8, 7], 16 levels, as onnxruntime's MatMulNBits writes them
INT4_LOWEST = -8
#: the divisors of a block's amax tried for its int4 scale: amax / 7 keeps the block symmetric, amax / 8 spends the
#: 16th level (the largest positive value may then clip to 7), those between trade the two and those beyond clip
#: the tails. On Gaussian blocks of 32 (128) this is 21.27 dB (19.89) against amax / 7's 20.26 (18.61) and
#: onnxruntime's MatMulNBits rounding's 21.32 (19.73), whose negative scales TensorRT refuses
_INT4_DIVISORS = (7.0, 7.25, 7.5, 7.75, 8.0, 8.25, 8.5, 8.75, 9.0)


def _int4_scale(grouped: np.ndarray, amax: np.ndarray, ftype) -> np.ndarray:
    """Each block's int4 scale (``grouped``: [blocks, block_size, ...]): of ``amax`` / 7 … amax / 9, the one whose
    codes over [-8, 7] (round to nearest even) are nearest the block in squared error; ties go to the first."""
    values = grouped.astype(np.float32)
    best = _scale(amax, ftype, INT4)
    best_error = None
    for divisor in _INT4_DIVISORS:
        scale = _scale(amax * (INT4.qmax / divisor), ftype, INT4)
        step = scale.astype(np.float32)[:, None]
        error = np.square(np.clip(np.rint(values / step), INT4_LOWEST, INT4.qmax) * step - values).sum(axis=1)
        if best_error is None:
            best_error = error
            continue
        better = error < best_error
        best = np.where(better, scale, best)
        best_error = np.where(better, error, best_error)
    return best


def dequantize(codes: np.ndarray, scale: np.ndarray, axis: int, block_size: int = 0) -> np.ndarray:
    """``DequantizeLinear(codes, scale, 0)`` in float32: ``scale`` 0-d, 1-d along ``axis`` or blocked along it."""
    return codes.astype(np.float32) * broadcast_param(np.asarray(scale, np.float32), codes.shape, axis, block_size)


def representable_scale(scale: np.ndarray, ftype) -> np.ndarray:
    """``scale`` in the Q/DQ's float type, never 0: a float16 scale below float16's smallest subnormal
    would round to 0, which TensorRT rejects ("Scale coefficients must all be positive")."""
    tiny = np.finfo(ftype).smallest_subnormal
    return np.asarray(np.maximum(np.asarray(scale, np.float64), tiny), dtype=ftype)


def weight_values(spec: WeightSpec, tensor: gs.Tensor, ftype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The codes (of ``spec.format``) and scales (of type ``ftype``) that the weight ``spec`` on ``tensor`` lowers
    to: the source's own codes where the lift kept them, else ``tensor`` quantized per channel or per block (and
    ``spec.source`` marked re-quantized)."""
    if spec.codes is not None and spec.scale is not None:
        return spec.codes, representable_scale(np.asarray(spec.scale, np.float64), ftype)
    if not isinstance(tensor, gs.Constant):
        raise InternalError(f"weight '{spec.tensor}' is not a constant at lowering")
    spec.source = ScaleSource.REQUANTIZED
    # A weight still in its TensorProto is read without keeping the float copy on the Constant (the codes
    # replace it): a model over 2 GB would otherwise hold every weight twice while lowering.
    lazy = getattr(tensor, "_values", None)
    values = np.asarray(lazy.load() if isinstance(lazy, LazyValues) else tensor.values)
    check_finite_weight(spec.tensor, values)
    quantized = quantize_weight(values, spec.axis, ftype, spec.format, spec.block_size)
    release_weight(values)  # a model over 2 GB: the pages just read go (its calibration session maps them too)
    return quantized


def scale_axis(spec: WeightSpec, rank: int) -> int:
    """The axis a weight's DequantizeLinear names: its blocks' axis when blocked, else its channels'."""
    return block_axis(spec.axis, rank) if spec.block_size else spec.axis


def effective_weight(spec: WeightSpec, tensor: gs.Tensor) -> np.ndarray:
    """The float weights the lowered model computes with: the codes times their scales."""
    q, scale = weight_values(spec, tensor, float_type(tensor, "weight"))
    return dequantize(q, scale, scale_axis(spec, q.ndim), spec.block_size)
