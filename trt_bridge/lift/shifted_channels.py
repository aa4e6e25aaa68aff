"""A MatMul's, Gemm's or Conv's 8-bit weight that symmetric int8 has no exact form for, kept exact as int8 codes plus
a float side path that adds each output channel's shift (a zero point far from the middle, a negative scale's +128)::

    Before:  A ─ MatMul(W = (q − z)·s, per output channel) ─ Y
    After:   A ─ MatMul(W' = k·|s|) ─────────────── + ─ Y      annotation: W' → INT8 per channel, the codes k kept
             A ─ ReduceSum(over K, keepdims) ─ Mul(c) ─┘       c [N]: each channel's shift t·|s| (float)

    Before:  X ─ Conv(W = (q − z)·s [N, C, kh, kw], pads, strides; one group, no dilation) ─ Y
    After:   X ─ Conv(W' = k·|s|) ─────────────────────────────────────────── + ─ Y
             X ─ ReduceSum(over C) ─ AveragePool(kh×kw, pads, strides, zeros counted) ─ Mul(c·kh·kw) ─┘
             (a 1×1 convolution of stride 1 needs no pool: the channel sum is each window's)

with ``(q − z)·s = (k + t)·|s|`` and ``k`` in [−128, 127]: 8-bit codes span at most 256 values, so one integer ``t``
per channel always fits them (0 where they fit as they are). NNCF's weight compression writes such weights: uint8
with a zero point per channel (INT8_ASYM, its default), and int8 with scale = amax / −128 (INT8_SYM). Re-quantizing
those channels moved every weight onto a coarser grid (NNCF INT8_ASYM: 1.9 dB on a MiniLM, 3.2 on a ViT, 6.7 on
YOLOv8n; exact now). A Gemm (``transA`` 0) adds ``alpha·c``; a Conv sums each filter window of the input (an
average pool of the zero-padded channel sum, times the taps). Only weight-only layers (the source quantizes the
weight, not the input: what weight compression writes) get the side path; a layer whose input the source quantizes
too, other ops, and weights whose channels all fit ±127, are left to
:func:`trt_bridge.lift.weights.lift_integer_weight` (the channels that do not fit re-quantized, in int8 next to
the activation's own quantization error). The side path costs a sum over K per row; it stays in the high precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.formats import INT8
from trt_bridge.lift.base import LiftContext, digest

#: the ops whose weight (input 1) this side path serves
OPS = ("MatMul", "Gemm", "Conv")
LOW, HIGH = -128, 127  # int8 codes (TensorRT's DequantizeLinear takes −128)


@dataclass(frozen=True)
class ShiftedChannels:
    codes: np.ndarray  # int8, the weight's shape
    scale: np.ndarray  # float32 [N], positive
    offset: np.ndarray  # float64 [N]: a value added to every weight of the channel (0 where the codes fit)


def shifted_channels(values: np.ndarray, zero_point: np.ndarray, scale: np.ndarray,
                     axis: int) -> ShiftedChannels | None:
    """An 8-bit weight (codes ``values``, per-tensor or per-channel ``zero_point`` and ``scale`` along ``axis``) as
    int8 codes plus a shift per channel, where some channel's codes do not fit symmetric int8 (±127) as they are;
    None where every channel fits (the exact path needs no side path), or a scale is 0 or not finite."""
    if values.ndim < 2 or values.dtype.itemsize != 1 or not np.issubdtype(values.dtype, np.integer):
        return None
    scale = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (values.shape[axis],))
    if not np.all(np.isfinite(scale) & (scale != 0)):
        return None
    zp = np.broadcast_to(np.asarray(zero_point, np.int16).reshape(-1), (values.shape[axis],))
    shape = [1] * values.ndim
    shape[axis] = -1
    # int16 holds any 8-bit difference, its sign turned (as lift/weights' _weight_spec computes it)
    centred = (values.astype(np.int16) - zp.reshape(shape)) * np.where(scale < 0, -1, 1).astype(np.int16).reshape(shape)
    other = tuple(i for i in range(values.ndim) if i != axis)
    lo, hi = centred.min(axis=other).astype(np.int64), centred.max(axis=other).astype(np.int64)
    if np.all((lo >= -127) & (hi <= 127)):
        return None
    shift = np.where(hi > HIGH, hi - HIGH, np.where(lo < LOW, lo - LOW, 0))
    codes = (centred - shift.astype(np.int16).reshape(shape)).astype(np.int8)
    magnitude = np.abs(scale)
    return ShiftedChannels(codes, magnitude.astype(np.float32), shift * magnitude.astype(np.float32).astype(np.float64))


def takes_side_path(ctx: LiftContext, node: gs.Node, weight_shape: tuple[int, ...]) -> bool:
    """Whether ``node`` (reading a weight of ``weight_shape`` at input 1) can take the channel-shift side path: a
    MatMul, a Gemm with ``transA`` 0, or a Conv of one group, no dilation and padding narrower than its window, whose
    input the source does not quantize (weight-only: its int8 kernel would lose the side path's sum). Asked before
    :func:`shifted_channels` computes anything."""
    if node.op not in OPS or (node.op == "Gemm" and int(node.attrs.get("transA", 0))) or (node.op == "Conv" and (
            int(node.attrs.get("group", 1)) != 1 or any(d != 1 for d in node.attrs.get("dilations", [])))):
        return False
    if node.op == "Conv":
        window = [int(k) for k in node.attrs.get("kernel_shape", weight_shape[2:])]
        if any(p >= window[i % len(window)] for i, p in enumerate(node.attrs.get("pads", []))):
            return False  # a pool takes no padding as wide as its window (a Conv does)
    a = node.inputs[0]
    return not (a.inputs and a.inputs[0].op == "DequantizeLinear" or any(
        s.node == node.name and s.index == 0 for spec in ctx.annotations.activations.values() for s in spec.sites))


def lift_shifted_channels(ctx: LiftContext, node: gs.Node, source: gs.Tensor, shifted: ShiftedChannels, axis: int,
                          origin: str, ftype=np.float32) -> None:
    """Make ``node``'s weight (input 1, from ``source``; output channels on ``axis``) the exact codes of ``shifted``
    and add its side path; ``node`` is one :func:`takes_side_path` accepts."""
    a, y = node.inputs[0], node.outputs[0]
    shape = [1] * shifted.codes.ndim
    shape[axis] = -1
    # the codes themselves in the key: two DequantizeLinear of one constant with other zero points (or one weight
    # read along another axis) may share scales and shifts
    key = ("shifted-channel-weight", source.name, digest(shifted.codes), axis, shifted.scale.tobytes(),
           shifted.offset.tobytes(), np.dtype(ftype).name)
    base = source.name.removesuffix("_quantized") or origin
    weight = ctx.constant(f"{base}_float", lambda: (shifted.codes.astype(np.float32)
                                                    * shifted.scale.reshape(shape)).astype(ftype), key)
    spec = ctx.annotations.weights.get(weight.name)
    if spec is None:
        spec = WeightSpec(weight.name, [], axis, origin, codes=shifted.codes, scale=shifted.scale,
                          source=ScaleSource.EXACT_WEIGHTS, format=INT8)
    spec.sites.append(Site(node.name, 1))
    ctx.annotations.add_weight(spec)
    node.inputs[1] = weight
    alpha = float(node.attrs.get("alpha", 1.0)) if node.op == "Gemm" else 1.0
    name = node.name or y.name
    product = gs.Variable(ctx.names(f"{name}/int8_out"), dtype=y.dtype)
    summed = gs.Variable(ctx.names(f"{name}/row_sums"), dtype=y.dtype)
    shift = gs.Variable(ctx.names(f"{name}/channel_shift_out"), dtype=y.dtype)
    y.inputs.clear()
    node.outputs.append(product)
    reduce_axis = -1 if node.op == "MatMul" else 1  # A's K; a Conv's input channels
    if (ctx.graph.opset or 13) >= 13:
        axes = ctx.constant(f"{name}/row_sum_axes", np.array([reduce_axis], np.int64), ("axes", reduce_axis))
        nodes = [gs.Node("ReduceSum", ctx.names(f"{name}/row_sum"), {"keepdims": 1}, [a, axes], [summed])]
    else:
        nodes = [gs.Node("ReduceSum", ctx.names(f"{name}/row_sum"), {"axes": [reduce_axis], "keepdims": 1}, [a],
                         [summed])]
    offset = alpha * shifted.offset
    if node.op == "Conv":  # the channel sum over each filter window: an average pool of the zero-padded sum, × taps
        window = [int(k) for k in node.attrs.get("kernel_shape", shifted.codes.shape[2:])]
        offset = (offset * np.prod(window)).reshape(1, -1, *([1] * len(window)))
        attrs = {"kernel_shape": window, "count_include_pad": 1,
                 **{k: node.attrs[k] for k in ("strides", "pads", "auto_pad") if k in node.attrs}}
        if any(w != 1 for w in window) or any(v != 1 for v in attrs.get("strides", [])) or any(attrs.get("pads", [])) \
                or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            pooled = gs.Variable(ctx.names(f"{name}/window_sums"), dtype=y.dtype)
            nodes.append(gs.Node("AveragePool", ctx.names(f"{name}/window_sum"), attrs, [summed], [pooled]))
            summed = pooled
    offsets = ctx.constant(f"{base}_channel_shifts", offset.astype(ftype), ("channel-shifts",) + key + (alpha,))
    ctx.graph.nodes.extend([*nodes, gs.Node("Mul", ctx.names(f"{name}/channel_shift"), {}, [summed, offsets], [shift]),
                            gs.Node("Add", ctx.names(f"{name}/shifted"), {}, [product, shift], [y])])
