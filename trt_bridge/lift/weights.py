"""Integer source weights → a float constant in the lifted graph plus its weight annotation; which input of an
op is its weight, and on which axis its output channels lie."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX, ScaleSource, Site, WeightSpec
from trt_bridge.lift.base import LiftContext

#: op type → input index of its weight
WEIGHT_INPUT = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}


def weight_axis(node: gs.Node, rank: int) -> int:
    """The output-channel axis of ``node``'s weight: per-channel scales go there."""
    if node.op == "Conv":
        return 0
    if node.op == "ConvTranspose":
        return 1
    if node.op == "Gemm":
        return 0 if node.attrs.get("transB", 0) else 1
    return rank - 1


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
    const = ctx.constant(f"{base}_float", ((values.astype(np.float64) - zp) * sc).astype(np.float32), key)
    spec = ctx.annotations.weights.get(const.name)
    if spec is None:
        spec = _weight_spec(const.name, values, zero_point, scale, axis, origin)
    spec.sites.append(site)
    ctx.annotations.add_weight(spec)
    return const


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
    centred = values.astype(np.int64) - zp
    if not np.all(scale > 0):
        return WeightSpec(name, [], axis, origin)
    if np.abs(centred).max(initial=0) <= QMAX:
        return WeightSpec(name, [], axis, origin, int8=centred.astype(np.int8),
                          scale=np.asarray(scale, np.float32), source=ScaleSource.EXACT_WEIGHTS)
    reduce_axes = tuple(i for i in range(centred.ndim) if i != axis)
    fits = np.abs(centred).max(axis=reduce_axes) <= QMAX
    scale_vec = np.broadcast_to(scale, fits.shape).astype(np.float64)
    floats = centred * scale_vec.reshape(shape)
    requant = np.abs(floats).max(axis=reduce_axes) / QMAX
    per_channel = np.where(fits, scale_vec, requant)
    q = np.where(fits.reshape(shape), centred, np.rint(floats / per_channel.reshape(shape)))
    return WeightSpec(name, [], axis, origin, int8=np.clip(q, -QMAX, QMAX).astype(np.int8),
                      scale=per_channel.astype(np.float32), source=ScaleSource.REQUANTIZED)
