"""Fixed-point requantization factors of a converted model, for integer-only back ends.

A quantized layer accumulates ``acc = Σ x_q · w_q`` in int32; its float value is
``acc · s_in · s_w``, and the next QuantizeLinear (scale ``s_out``) wants
``round(acc · real)`` with ``real = s_in · s_w / s_out``. Integer pipelines apply ``real`` as
an int32 multiplier and a shift (the gemmlowp / TFLite convention)::

    real ≈ M = (M0 / 2^31) · 2^-n          M0 ∈ [2^30, 2^31): an int32 read as a Q0.31 fraction in [0.5, 1)
    out  = (acc · M0 + 2^(30+n)) >> (31 + n)     64-bit product, round half up

``n`` (``shift``) is a right shift; it is negative for ``real ≥ 1`` (then ``31 + n`` may still
be positive; :func:`requantize` handles every case). Rounding M0 to an integer costs at most
``2^-31`` relative error (``error`` in each row).

Which layers: every Conv, ConvTranspose, MatMul and Gemm whose data input comes from a
DequantizeLinear (per tensor) and whose weight comes from a DequantizeLinear of constants,
and whose output reaches a QuantizeLinear through single-consumer ops that keep the integer
grid's scale (:data:`PASS_THROUGH`: bias and re-centering Add/Sub of a constant or a
dequantized tensor, Relu, Clip, Pad, MaxPool, reshapes). Per-channel weights give one
multiplier and shift per output channel. Layers whose output is not requantized (the
network's last layer, or one followed by pooling, Softmax, ...) have no row.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.errors import TrtBridgeError
from trt_bridge.scales.files import write_text_file
from trt_bridge.scales.model_scales import Constants, qdq_scale, qdq_scale_format, refuse_fp4

#: op types whose weight input (index 1) a Requantization is computed for
WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")
#: ops between a weighted op and the next QuantizeLinear that leave the scale of the integer grid alone
PASS_THROUGH = frozenset({"Add", "Sub", "Relu", "Clip", "Pad", "MaxPool", "Identity", "Reshape", "Transpose",
                          "Flatten", "Squeeze", "Unsqueeze"})
Q31 = 31


@dataclass(frozen=True)
class Requantization:
    """One layer's requantization: ``real = s_in · s_w / s_out ≈ multiplier · 2^-(31 + shift)``."""

    node: str
    op: str
    s_in: float
    s_w: float | tuple[float, ...]
    s_out: float
    multiplier: int | tuple[int, ...]
    shift: int | tuple[int, ...]
    real: float | tuple[float, ...]
    error: float  # the largest relative error |M − real| / real over the channels
    output: str = ""  # the tensor whose QuantizeLinear gives s_out

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def quantize_multiplier(m: float) -> tuple[int, int]:
    """``(M0, n)`` with ``M0 ∈ [2^30, 2^31)`` and ``m ≈ M0 · 2^-(31 + n)`` (relative error ≤ 2^-31).

    ``n`` is negative for ``m ≥ 1``. ``m`` must be positive and finite."""
    m = float(m)
    if not math.isfinite(m) or m <= 0:
        raise TrtBridgeError(f"requantization factor {m!r} must be positive and finite "
                             "(a zero or negative scale in the model?).")
    fraction, exponent = math.frexp(m)  # m = fraction · 2^exponent, fraction ∈ [0.5, 1)
    m0 = round(fraction * (1 << Q31))
    if m0 == 1 << Q31:  # fraction rounded up to 1.0
        m0 //= 2
        exponent += 1
    return m0, -exponent


def multiplier_value(multiplier: int, shift: int) -> float:
    """The real number ``multiplier · 2^-(31 + shift)`` a (multiplier, shift) pair stands for."""
    return math.ldexp(multiplier, -(Q31 + shift))


def requantize(acc, multiplier: int, shift: int) -> np.ndarray:
    """``round(acc · multiplier · 2^-(31 + shift))`` in exact integer arithmetic (round half up):
    what an integer back end computes from int32 accumulators. Returns int64 (or Python ints
    in an object array when the result does not fit)."""
    acc = np.asarray(acc)
    total = Q31 + int(shift)
    fits = acc.dtype.kind in "iu" and 1 <= total <= 62 and (acc.size == 0 or int(np.abs(acc).max()) < 1 << 31)
    if fits:  # |acc · M0| < 2^62 and the rounding term ≤ 2^61: no int64 overflow
        return (acc.astype(np.int64) * np.int64(multiplier) + (np.int64(1) << (total - 1))) >> total
    values = [int(a) * int(multiplier) for a in acc.ravel().tolist()]
    if total > 0:
        values = [(v + (1 << (total - 1))) >> total for v in values]
    else:
        values = [v << -total for v in values]
    return np.array(values, dtype=object).reshape(acc.shape)


def requantization_table(model: onnx.ModelProto) -> list[Requantization]:
    """The requantization of every quantized weighted layer of a converted model (see the module doc)."""
    constants = Constants(model)
    refuse_fp4(model, constants)  # no integer requantization of FP4
    producers = {out: node for node in model.graph.node for out in node.output if out}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in set(node.input):
            if name:
                consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in model.graph.output}
    rows = []
    for node in model.graph.node:
        if node.op_type not in WEIGHTED or len(node.input) < 2:
            continue
        x_dq, w_dq = producers.get(node.input[0]), producers.get(node.input[1])
        if not _is_dq(x_dq) or not _is_dq(w_dq) or node.input[0] in constants:
            continue
        q = _next_quantize(node.output[0], producers, consumers, outputs, constants)
        formats = {qdq_scale_format(n, constants)[1].label for n in (x_dq, w_dq, q) if n is not None} - {"INT8"}
        if formats:  # FP8 layers compute in floating point: no integer multiplier and shift to export
            raise TrtBridgeError(f"{node.op_type} '{node.name}' is quantized in {', '.join(sorted(formats))}: "
                                 "fixed-point requantization is INT8's (integer multipliers and shifts); export "
                                 "its scales with --format trt-cache or json instead.")
        if q is None:
            continue
        s_in, s_w, s_out = (qdq_scale(n, constants).astype(np.float64) for n in (x_dq, w_dq, q))
        if s_in.ndim or s_out.ndim:
            raise TrtBridgeError(f"{node.op_type} '{node.name}': per-channel activation scales cannot be "
                                 "requantized per tensor; TensorRT quantizes activations per tensor.")
        alpha = next((a.f for a in node.attribute if a.name == "alpha"), 1.0) if node.op_type == "Gemm" else 1.0
        rows.append(_row(node, float(s_in), s_w, float(s_out), alpha, q.input[0]))
    return rows


def _is_dq(node: onnx.NodeProto | None) -> bool:
    return node is not None and node.op_type == "DequantizeLinear"


def _next_quantize(tensor: str, producers, consumers, outputs: set[str], constants: Constants
                   ) -> onnx.NodeProto | None:
    """The QuantizeLinear that ``tensor`` reaches through single-consumer scale-keeping ops, if any."""
    for _ in range(64):  # a chain of pass-through ops is short; the bound only guards against cycles
        users = consumers.get(tensor, [])
        if tensor in outputs or len(users) != 1:
            return None
        user = users[0]
        if user.op_type == "QuantizeLinear" and user.input[0] == tensor:
            return user
        if user.op_type not in PASS_THROUGH or user.input[0] != tensor or not user.output:
            return None
        if user.op_type in ("Add", "Sub"):  # the other operand: a constant (bias, centre) or a dequantized tensor
            other = user.input[1]
            if other == tensor or not (other in constants or _is_dq(producers.get(other))):
                return None
        tensor = user.output[0]
    return None


def _row(node: onnx.NodeProto, s_in: float, s_w: np.ndarray, s_out: float, alpha: float, output: str
         ) -> Requantization:
    reals = [s_in * float(s) * alpha / s_out for s in np.atleast_1d(s_w)]
    pairs = [quantize_multiplier(r) for r in reals]
    error = max(abs(multiplier_value(m0, n) - r) / r for (m0, n), r in zip(pairs, reals))
    if s_w.ndim == 0:
        return Requantization(node.name, node.op_type, s_in, float(s_w), s_out, pairs[0][0], pairs[0][1], reals[0],
                              error, output)
    return Requantization(node.name, node.op_type, s_in, tuple(float(s) for s in s_w), s_out,
                          tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), tuple(reals), error, output)


FIXED_POINT_FORMAT = "trt-bridge-fixed-point"
CONVENTION = ("real = s_in * s_w / s_out ~= multiplier * 2^-(31 + shift); "
              "out = (acc * multiplier + 2^(30 + shift)) >> (31 + shift)")
CSV_COLUMNS = ("node", "op", "output", "channel", "s_in", "s_w", "s_out", "real", "multiplier", "shift", "error")


def write_fixed_point(rows: list[Requantization], path: str | os.PathLike) -> Path:
    """Write the table: CSV (one line per layer and channel) when ``path`` ends in ``.csv``, else JSON
    (``{"format": "trt-bridge-fixed-point", "version": 1, "convention": ..., "layers": [...]}``)."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            per_channel = isinstance(row.real, tuple)
            for c, (s_w, real, m0, n) in enumerate(zip(*(_channels(v) for v in (row.s_w, row.real, row.multiplier,
                                                                                  row.shift)))):
                error = abs(multiplier_value(m0, n) - real) / real
                writer.writerow([row.node, row.op, row.output, c if per_channel else "", repr(row.s_in), repr(s_w),
                                 repr(row.s_out), repr(real), m0, n, repr(error)])
        return write_text_file(path, buf.getvalue(), "fixed-point table")
    doc = {"format": FIXED_POINT_FORMAT, "version": 1, "convention": CONVENTION,
           "layers": [row.to_dict() for row in rows]}
    return write_text_file(path, json.dumps(doc, indent=1) + "\n", "fixed-point table")


def _channels(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)
