"""Lift an activation's ``QuantizeLinear → DequantizeLinear`` pair to an annotation.

    Before:  x ─ Q(s, z) ─ x_q ─┬ DQ(s, z) ─ Conv
                                └ DQ(s, z) ─ Add
    After:   x ─┬ Conv                annotation: x → activation, sites Conv:0 and Add:k,
                └ Add                 scale covering the source's range, source "model"

The source's codes cover [lo, hi] = [(qmin − z)·s, (qmax − z)·s]; the symmetric
scale that covers the same range is max(|lo|, |hi|)/127 in the annotations' unit (exactly s for int8 with
zero point 0). FP8 E4M3 codes (onnxruntime's, ModelOpt's, Quark's FP8 Q/DQ) keep their format: the annotation
says FP8 and lowering writes the source's scale s back (amax / 448); E5M2 and the FNUZ variants, which TensorRT
has no Q/DQ for, become E4M3 covering the same range (reported in ``approximated``), and so does an FP8 zero point
that is not 0. When lo is 0 (a uint8 zero point of 0, or int8 −128) the Q was also a ReLU: onnxruntime's quantizer
removes Relu/Clip nodes whose clamp the Q already does. The lift then keeps that clamp as an explicit
``Clip(lo, hi)`` (which TensorRT fuses into the producer), so the float graph computes what the source computed.

A per-axis activation pair (NNCF writes one per channel, or per position where it takes
the wrong axis for a channel) has no TensorRT equivalent: TensorRT quantizes activations
per tensor. The nearest thing it builds is one per-tensor scale covering the union of the
channels' ranges; the lift takes that, logs a warning and records it in ``ctx.approximated``
(the report's ``approximated``). A scale that is not a positive finite number (NNCF's, where the
range of an attention mask holding float32's lowest value overflowed) is rejected by TensorRT: the
pair is lifted to the float tensor, unquantized, and recorded the same way.

    Before:  x ─ Q(s[c], z[c], axis) ─ DQ(s[c], z[c], axis) ─ op
    After:   x ─ op      annotation: x → activation, scale max_c(|lo_c|, |hi_c|)/127

INT4 activation codes (an int4/uint4 zero point or ``output_dtype``) become INT8 over the same range, reported in
``approximated``: TensorRT's INT4 is weight-only.

16-bit codes (int16/uint16: AMD Quark's A16W8, written as com.microsoft QuantizeLinear/DequantizeLinear)
have no TensorRT equivalent: they are narrowed to the int8 scale covering the same range and listed in
the report's ``approximated`` entries. Measured against re-calibrating those tensors on data (SNR against
the float model), the source's own range did better on ConvNeXt (30.7 against 30.2 dB) and the suite's
SegFormer slice (28.7 against 27.6 dB), worse on the CRNN-LSTM (41.7 against 42.2 dB), equal on BERT; int8
costs what it costs either way (those int16 sources measured 34.0 and 49.3 dB, the float models converted
to int8 32.5 and 42.5 dB).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX, ScaleSource
from trt_bridge.formats import FP4, INT4, INT8, code_limits, numpy_code_format
from trt_bridge.lift.base import NOT_MINE, LiftContext, read_float
from trt_bridge.lift.fp4_activation_qdq import RULE as FP4_QDQ
from trt_bridge.lift.scale_algebra import constant_values, quantizer_zero_point


def _params(node: gs.Node) -> tuple[np.ndarray, np.ndarray] | None:
    scale = constant_values(node.inputs[1])
    zp = quantizer_zero_point(node)
    if scale is None or zp is None:
        return None
    return scale, zp


def code_range(scale: float | np.ndarray, zp: np.ndarray) -> tuple[float, float]:
    """The float range [lo, hi] that a (scale, zero point) pair's codes (integer or float8) represent; for
    per-axis pairs, the union of the channels' ranges."""
    low, high = code_limits(zp.dtype)
    s = np.asarray(scale, np.float64).reshape(-1)
    z = zp.astype(np.float64).reshape(-1)
    return float(((low - z) * s).min()), float(((high - z) * s).max())


def covering_scale(scale: float, zp: np.ndarray) -> float:
    """The symmetric scale in INT8's unit (amax / 127) that covers the source's range (the source's own for int8,
    zero point 0; for FP8 codes 448·s / 127, which lowering writes back as s)."""
    if np.size(scale) == 1 and zp.dtype == np.int8 and int(zp.reshape(-1)[0]) == 0:
        return float(np.reshape(scale, ()))
    lo, hi = code_range(scale, zp)
    return max(abs(lo), abs(hi)) / QMAX


@dataclass(frozen=True)
class QDQPairMatch:
    q: gs.Node
    dqs: list[gs.Node]  # every reader of the QuantizeLinear's codes
    scale: np.ndarray
    zp: np.ndarray


class QDQPair:
    name = "qdq-pair"
    op_types = ("QuantizeLinear",)
    outcome = ("lifted by rule 'qdq-pair' to a symmetric Q/DQ (zero point 0) covering the source's range, in its "
               "format where TensorRT runs it (INT8, FP8 E4M3)")

    def match(self, ctx: LiftContext, node: gs.Node) -> QDQPairMatch | str:
        q_out = node.outputs[0]
        if not q_out.outputs and not any(t is q_out for t in ctx.graph.outputs):
            return NOT_MINE  # dead (a weight's Q, already folded by dequantize-constant)
        if constant_values(node.inputs[0]) is not None:
            return NOT_MINE
        params = _params(node)
        if params is None:
            return "the scale and zero point must be constants"
        scale, zp = params
        if node.attrs.get("block_size", 0):
            return "blocked quantization of an activation (TensorRT blocks weights only)"
        if scale.size != 1 and zp.size not in (1, scale.size):
            return f"{zp.size} zero points for {scale.size} scales"
        if any(t is q_out for t in ctx.graph.outputs):
            return f"the quantized tensor '{q_out.name}' is a graph output (TensorRT outputs no uint8/int8 codes)"
        dqs = list(q_out.outputs)
        for dq in dqs:
            if dq.op != "DequantizeLinear" or dq.inputs[0] is not q_out:
                return f"'{q_out.name}' is read by {dq.op} '{dq.name}', not only by DequantizeLinear"
            theirs = _params(dq)
            if theirs is None or not (np.allclose(theirs[0].reshape(-1), scale.reshape(-1))
                                      and np.array_equal(theirs[1].reshape(-1).astype(np.int64),
                                                         zp.reshape(-1).astype(np.int64))):
                return f"DequantizeLinear '{dq.name}' uses other scale/zero point than QuantizeLinear '{node.name}'"
        return QDQPairMatch(node, dqs, scale, zp)

    def rewrite(self, ctx: LiftContext, match: QDQPairMatch) -> None:
        node, dqs, scale, zp = match.q, match.dqs, match.scale, match.zp
        x = node.inputs[0]
        usable = np.isfinite(scale) & (scale > 0)
        if not usable.all():
            bad = float(scale.reshape(-1)[~usable.reshape(-1)][0])
            what = (f"scale {bad:g} of '{x.name}' is not a positive finite number (a range that overflowed "
                    "float32 while calibrating): TensorRT rejects it; the tensor stays in float")
            ctx.approximate(self.name, node.name, what)
            read_float(ctx, dqs, x)
            return
        per_axis = scale.size > 1
        s = scale.astype(np.float64).reshape(-1) if per_axis else float(scale.reshape(()))
        zp = zp.reshape(-1) if per_axis else zp.reshape(())
        lo, hi = code_range(s, zp)
        if per_axis:
            what = (f"per-axis activation quantization of '{x.name}' ({scale.size} scales on axis "
                    f"{node.attrs.get('axis', 1)}): TensorRT quantizes activations per tensor; one scale covering "
                    f"all channels' range [{lo:.4g}, {hi:.4g}] instead")
            ctx.approximate(self.name, node.name, what)
        if lo == 0.0:  # the Q clamps at zero: keep the ReLU it stands for
            clipped = gs.Variable(ctx.names(f"{x.name}_clipped"), dtype=np.float32, shape=x.shape)
            ctx.graph.nodes.append(gs.Node("Clip", ctx.names(f"{node.name}/clip"), {},
                                           [x, ctx.constant(f"{node.name}_lo", np.array(0.0, np.float32),
                                                            ("clip", 0.0)),
                                            ctx.constant(f"{node.name}_hi", np.array(hi, np.float32),
                                                         ("clip", float(np.float32(hi))))], [clipped]))
            x = clipped
        covering = max(abs(lo), abs(hi)) / QMAX if per_axis else covering_scale(s, zp)
        codes = numpy_code_format(zp.dtype)
        fmt = INT8 if codes is None else codes.nearest
        if fmt is INT4:  # TensorRT's INT4 is weight-only: int8 codes over the same range (finer, never clipped)
            fmt = INT8
            ctx.approximate(self.name, node.name, f"{codes.name} activation codes of '{x.name}' become INT8 "
                            f"(TensorRT quantizes INT4 weights only): scale {covering:.6g} covers the source's range "
                            f"[{lo:.6g}, {hi:.6g}]")
        elif codes is not None and not codes.exact and fmt is not INT8:  # E5M2, FNUZ: TensorRT's FP8 is E4M3FN
            ctx.approximate(self.name, node.name, f"{codes.name} activation codes of '{x.name}' become FP8 E4M3 "
                            f"(TensorRT's FP8): scale {fmt.scale_of(covering):.6g} covers the source's range "
                            f"[{lo:.6g}, {hi:.6g}]")
        elif fmt.is_float and np.any(zp.astype(np.float64) != 0):  # recentring is INT8's: FP8 codes lose nothing
            ctx.approximate(self.name, node.name, f"{codes.name} activation codes of '{x.name}' with a non-zero "
                            f"zero point become symmetric FP8 E4M3 (TensorRT's zero point is 0): scale "
                            f"{fmt.scale_of(covering):.6g} covers the source's range [{lo:.6g}, {hi:.6g}]")
        elif zp.dtype.itemsize > 1:  # int16/uint16 (AMD Quark's A16W8, com.microsoft Q/DQ): TensorRT has int8 only
            ctx.approximate(self.name, node.name, f"{zp.dtype} activation codes narrowed to int8 (TensorRT has no "
                            f"{zp.dtype} Q/DQ): scale {covering:.6g} covers the source's range [{lo:.6g}, {hi:.6g}]")
        for site in read_float(ctx, dqs, x):
            ctx.annotations.add_activation(x.name, site, node.name, covering, ScaleSource.MODEL)
        requantized = _take_over_requantized(ctx, node, dqs, x, (lo, hi))
        spec = ctx.annotations.activations.get(x.name)
        if requantized is not None:  # the chain's second clamp is what its readers saw: its range, not the union
            spec.model_range, spec.scale = requantized, max(abs(requantized[0]), abs(requantized[1])) / QMAX
            return
        if spec is not None and spec.origin == node.name:
            spec.format = fmt
            if fmt is FP4:  # an FP4 pair lift/fp4_activation_qdq declined (another reader): reported as those are
                spec.lifted_by = FP4_QDQ
        if spec is not None and spec.source is ScaleSource.MODEL:
            if spec.model_range is None:
                spec.model_range = (lo, hi)
            elif spec.scale < covering or spec.model_range != (lo, hi):  # two Qs on one tensor: the union
                spec.model_range = (min(lo, spec.model_range[0]), max(hi, spec.model_range[1]))
                spec.scale = max(spec.scale, covering)


def _take_over_requantized(ctx: LiftContext, node: gs.Node, dqs: list[gs.Node], x: gs.Tensor,
                           first: tuple[float, float]) -> tuple[float, float] | None:
    """A requantization, ``x ─ Q(s1) ─ DQ(s1) ─ d ─ Q(s2) ─ DQ(s2) ─ op``, whose second pair was lifted first (an
    annotation on ``d``, onnxruntime's QOperator writes one where an Identity stood between two QLinear nodes):
    lifting the first pair leaves ``d`` unread, so its annotation's sites now read ``x``. They take one Q/DQ (TensorRT
    quantizes an edge once) over the range both clamps keep, reported as an approximation of the double rounding.
    Returns that range (None: no such chain)."""
    ranges = []
    for dq in dqs:
        out = dq.outputs[0] if dq.outputs else None
        stale = None if out is None else ctx.annotations.activations.get(out.name)
        if stale is None or out.outputs or out is x or stale.source is not ScaleSource.MODEL:
            continue
        del ctx.annotations.activations[out.name]
        for site in stale.sites:
            ctx.annotations.add_activation(x.name, site, stale.origin, stale.scale, stale.source, stale.dynamic)
        second = stale.model_range or (-stale.scale * QMAX, stale.scale * QMAX)
        ranges.append(second)
        if not np.allclose(second, first, rtol=1e-6, atol=0.0):
            ctx.approximate("qdq-pair", node.name, f"requantization of '{x.name}' (range [{first[0]:.4g}, "
                            f"{first[1]:.4g}], then '{out.name}' [{second[0]:.4g}, {second[1]:.4g}] by "
                            f"'{stale.origin}'): one Q/DQ over the range both keep")
    if not ranges:
        return None
    lo, hi = max([first[0]] + [r[0] for r in ranges]), min([first[1]] + [r[1] for r in ranges])
    return (lo, hi) if lo < hi else first
