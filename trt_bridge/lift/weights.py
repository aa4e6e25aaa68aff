"""Integer source weights → a float constant in the lifted graph plus its weight annotation; which input of an
op is its weight, and on which axis its output channels lie; and back: the int8 values and scales a weight
annotation lowers to (:func:`weight_values`, used by :mod:`trt_bridge.lower.qdq`) and the float weights the
lowered model computes with (:func:`effective_weight`, which smoothing and re-centring reason about before
lowering)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.annotations import QMAX, ScaleSource, Site, WeightSpec
from trt_bridge.errors import InternalError, UnsupportedPatternError
from trt_bridge.ir.tensorrt_ops import output_channel_axis
from trt_bridge.ir.values import FLOAT32_TINY, check_finite_weight
from trt_bridge.lift.base import LiftContext

#: op type → input index of its weight
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}


def weight_axis(node: gs.Node, rank: int) -> int:
    """The output-channel axis of ``node``'s weight: per-channel scales go there."""
    return output_channel_axis(node.op, node.attrs.get("transB", 0), rank)


def lift_integer_weight(ctx: LiftContext, tensor: gs.Tensor, values: np.ndarray, zero_point: np.ndarray,
                        scale: np.ndarray, axis: int, site: Site, origin: str) -> gs.Constant:
    """The float weight ``(W_q − zero_point) · scale`` (``scale``/``zero_point`` 0-d or per ``axis``),
    shared by every site that lifts the same integers with the same scale, and annotated for lowering."""
    shape = [1] * values.ndim
    shape[axis] = -1
    zp = zero_point.reshape(shape) if zero_point.ndim else zero_point
    sc = scale.reshape(shape) if scale.ndim else scale
    key = ("integer-weight", tensor.name, scale.tobytes(), zero_point.tobytes())
    base = tensor.name.removesuffix("_quantized") or origin
    const = ctx.constant(f"{base}_float", lambda: _dequantized(values, zp, sc), key)
    spec = ctx.annotations.weights.get(const.name)
    if spec is None:
        spec = _weight_spec(const.name, values, zero_point, scale, axis, origin)
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
    """Keep the source's integers wherever ``W_q − zero_point`` fits symmetric int8.

    Symmetric int8 sources are kept bit-exact. For uint8 (or zero-point) sources, each
    output channel whose centred integers fit in [-127, 127] is kept exact with the
    source's scale; only the channels that do not fit are re-quantized (symmetric, per
    channel).
    """
    shape = [1] * values.ndim
    shape[axis] = -1
    zp = zero_point.reshape(shape) if zero_point.ndim else zero_point
    # int16 holds any 8-bit difference (a quarter of int64's memory traffic on a 26 MB CRNN)
    wide = np.int16 if values.dtype in (np.int8, np.uint8) and zp.dtype in (np.int8, np.uint8) else np.int64
    centred = values.astype(wide) - zp.astype(wide)
    if not np.all(scale > 0):
        return WeightSpec(name, [], axis, origin)
    reduce_axes = tuple(i for i in range(centred.ndim) if i != axis)
    amax = np.abs(centred).max(axis=reduce_axes, initial=0)  # per channel
    if amax.max(initial=0) <= QMAX:
        return WeightSpec(name, [], axis, origin, int8=centred.astype(np.int8),
                          scale=np.asarray(scale, np.float32), source=ScaleSource.EXACT_WEIGHTS)
    fits = amax <= QMAX
    scale_vec = np.broadcast_to(scale, fits.shape).astype(np.float64)
    # a channel's largest |c·s| (rounding keeps the order of the products, so it is the largest |c| times s)
    requant = amax * scale_vec / QMAX
    per_channel = np.where(fits, scale_vec, requant)
    # only the channels that do not fit are re-quantized: rint(c·s / s'), on those channels alone
    bad = np.flatnonzero(~fits)
    where = [slice(None)] * centred.ndim
    where[axis] = bad
    q = centred.copy()
    q[tuple(where)] = np.clip(np.rint(centred[tuple(where)] * scale_vec[bad].reshape(shape)
                                      / per_channel[bad].reshape(shape)), -QMAX, QMAX)
    return WeightSpec(name, [], axis, origin, int8=q.astype(np.int8),
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


def quantize_weight(values: np.ndarray, axis: int, ftype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per-channel quantization along ``axis``: (int8 values, 1-d scales of type ``ftype``).

    The codes are computed with the scale as the model will store it (float16 in a float16 model), so
    dequantizing gives back what was quantized."""
    reduce_axes = tuple(i for i in range(values.ndim) if i != axis)
    amax = np.abs(values.astype(np.float64)).max(axis=reduce_axes)
    # an all-zero channel takes 1/127 (any scale is exact); one too small for a normal float32 scale the smallest
    # normal (TensorRT takes no subnormal scale; such weights are zero to float32 arithmetic anyway)
    scale = representable_scale(np.where(amax > 0, np.maximum(amax / QMAX, FLOAT32_TINY), 1.0 / QMAX), ftype)
    shape = [1] * values.ndim
    shape[axis] = -1
    q = np.clip(np.rint(values.astype(np.float64) / scale.astype(np.float64).reshape(shape)), -QMAX, QMAX)
    return q.astype(np.int8), scale


def representable_scale(scale: np.ndarray, ftype) -> np.ndarray:
    """``scale`` in the Q/DQ's float type, never 0: a float16 scale below float16's smallest subnormal
    would round to 0, which TensorRT rejects ("Scale coefficients must all be positive")."""
    tiny = np.finfo(ftype).smallest_subnormal
    return np.asarray(np.maximum(np.asarray(scale, np.float64), tiny), dtype=ftype)


def weight_values(spec: WeightSpec, tensor: gs.Tensor, ftype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The int8 values and scales (of type ``ftype``) that the weight ``spec`` on ``tensor`` lowers to: the
    source's own integers where the lift kept them, else ``tensor`` quantized per channel (and ``spec.source``
    marked re-quantized)."""
    if spec.int8 is not None and spec.scale is not None:
        return spec.int8, representable_scale(np.asarray(spec.scale, np.float64), ftype)
    if not isinstance(tensor, gs.Constant):
        raise InternalError(f"weight '{spec.tensor}' is not a constant at lowering")
    spec.source = ScaleSource.REQUANTIZED
    # A weight still in its TensorProto is read without keeping the float copy on the Constant (the int8 one
    # replaces it): a model over 2 GB would otherwise hold every weight twice while lowering.
    lazy = getattr(tensor, "_values", None)
    values = np.asarray(lazy.load() if isinstance(lazy, LazyValues) else tensor.values)
    check_finite_weight(spec.tensor, values)
    return quantize_weight(values, spec.axis, ftype)


def effective_weight(spec: WeightSpec, tensor: gs.Tensor) -> np.ndarray:
    """The float weights the lowered model computes with: int8 values times their scales."""
    q, scale = weight_values(spec, tensor, float_type(tensor, "weight"))
    if scale.ndim == 0:
        return q.astype(np.float32) * scale
    shape = [1] * q.ndim
    shape[spec.axis] = -1
    return q.astype(np.float32) * scale.reshape(shape)
