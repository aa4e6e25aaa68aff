"""Accuracy metrics of a candidate's outputs against a reference's, accumulated feed by feed.

Element-wise tolerances mean nothing for INT8 (onnxruntime simulates Q/DQ in float, TensorRT
runs fused int8 kernels): these are the measures that do. SNR is 10·log10(Σr² / Σ(r−c)²) over
all feeds; cosine similarity of the flattened outputs; the largest and mean absolute error;
the relative error ‖r−c‖/‖r‖; and, for classifier-like outputs ([batch, classes] or [classes]),
how often the top-1 class agrees and how often the reference's top-1 is in the candidate's top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class OutputMetrics:
    output: str
    runner: str  # what was compared against the reference: 'candidate' or 'engine'
    snr_db: float  # inf: identical outputs; nan: an output holds NaN
    cosine: float
    max_abs: float
    mean_abs: float
    rel_error: float
    elements: int
    top1: float | None = None  # fraction of rows whose top-1 class agrees (classifier-like outputs)
    topk: float | None = None  # fraction of rows whose reference top-1 is in the candidate's top-k
    k: int | None = None
    failures: list[str] = field(default_factory=list)  # the gates this output failed

    @property
    def passed(self) -> bool:
        return not self.failures

    def snr_text(self) -> str:
        return snr_text(self.snr_db)

    def line(self) -> str:
        parts = [f"SNR {self.snr_text()} dB", f"cosine {self.cosine:.6f}", f"max |err| {self.max_abs:.4g}",
                 f"mean |err| {self.mean_abs:.4g}", f"rel {self.rel_error:.4g}"]
        if self.top1 is not None:
            parts.append(f"top-1 {100 * self.top1:.1f}%")
            parts.append(f"top-{self.k} {100 * self.topk:.1f}%")
        verdict = "PASS" if self.passed else "FAIL (" + "; ".join(self.failures) + ")"
        return f"{self.runner} '{self.output}': " + ", ".join(parts) + f": {verdict}"


def json_safe(value):
    """``value`` with every non-finite float written as the string 'inf', '-inf' or 'nan': strict JSON has no
    token for them (Python's json would write Infinity and NaN, which strict parsers reject)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def snr_text(value: float | None) -> str:
    """An SNR in dB for text: two decimals, or inf, -inf, nan (None: identical, inf)."""
    if value is None:
        return "inf"
    return f"{value:.2f}" if math.isfinite(value) else str(value)


def classifier_like(values: np.ndarray) -> bool:
    """Float scores shaped [batch, classes] or [classes], with at least two classes."""
    return values.dtype.kind == "f" and 1 <= values.ndim <= 2 and values.shape[-1] >= 2


def _with_error(reference: np.ndarray, candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both in float64 and their difference (inf − inf: NaN, which the accumulators flag)."""
    r = np.asarray(reference, np.float64)
    c = np.asarray(candidate, np.float64)
    if r.shape != c.shape:
        raise ValueError(f"shapes differ: reference {list(r.shape)}, candidate {list(c.shape)}")
    with np.errstate(invalid="ignore"):
        return r, c, r - c


class SnrAccumulator:
    """Streaming signal and error energies for one tensor, feed by feed: the SNR alone (``verify --per-layer``
    and give-back rank hundreds of tensors by it)."""

    def __init__(self):
        self.ref_energy = self.err_energy = 0.0
        self.count = 0
        self.nan = False

    def add(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        r, c, e = _with_error(reference, candidate)
        ref_energy, err_energy = float(np.dot(r.ravel(), r.ravel())), float(np.dot(e.ravel(), e.ravel()))
        if np.isnan(err_energy):  # a NaN in either output is one in the error
            self.nan = True
        self.ref_energy += ref_energy
        self.err_energy += err_energy
        self.count += r.size

    def snr_db(self) -> float:
        """inf when identical, -inf for a zero reference with a non-zero error, nan when a value was NaN."""
        if self.nan:
            return math.nan
        if self.err_energy == 0.0:
            return math.inf
        if self.ref_energy == 0.0 or math.isinf(self.err_energy):  # an infinite error (an Inf output): no signal
            return -math.inf if math.isfinite(self.ref_energy) else math.nan
        return 10.0 * math.log10(self.ref_energy / self.err_energy)


class Accumulator(SnrAccumulator):
    """Streaming sums for one output: feeds are added one at a time, nothing is kept."""

    def __init__(self, k: int = 5):
        super().__init__()  # nan: an output held NaN: every metric is NaN, and every gate fails
        self.k = k
        self.dot = self.cand_energy = 0.0
        self.max_abs = self.abs_sum = 0.0
        self.rows = self.top1 = self.topk = 0
        self.classifier = True
        self.nonfinite = 0  # candidate values that are NaN or ±Inf where the reference's are finite

    def add(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        classifier = classifier_like(np.asarray(reference))
        r, c, e = _with_error(reference, candidate)
        if np.isnan(e).any():  # a NaN in either output is one in the error
            self.nan = True
        self.nonfinite += int(np.count_nonzero(~np.isfinite(c) & np.isfinite(r)))
        with np.errstate(invalid="ignore", over="ignore"):  # ±Inf outputs: their sums are Inf or NaN, quietly
            self.ref_energy += float(np.sum(r * r))
            self.cand_energy += float(np.sum(c * c))
            self.err_energy += float(np.sum(e * e))
            self.dot += float(np.sum(r * c))
        magnitude = np.abs(e)
        if e.size:
            self.max_abs = max(self.max_abs, float(np.max(magnitude)))
        self.abs_sum += float(np.sum(magnitude))
        self.count += r.size
        self.classifier = self.classifier and classifier
        if self.classifier:
            rows_r, rows_c = r.reshape(-1, r.shape[-1]), c.reshape(-1, c.shape[-1])
            best = rows_r.argmax(axis=1)
            self.rows += len(rows_r)
            self.top1 += int(np.sum(best == rows_c.argmax(axis=1)))
            self.k = k = min(self.k, r.shape[-1])  # top-k of k ≥ classes would be trivially 100 %
            top = np.argsort(-rows_c, axis=1, kind="stable")[:, :k]
            self.topk += int(np.sum(np.any(top == best[:, None], axis=1)))

    def result(self, output: str, runner: str) -> OutputMetrics:
        metrics = self._metrics(output, runner)
        if self.nonfinite:  # fails whatever the gates: a non-finite output is no approximation of a finite one
            metrics.failures.append(f"the {runner}'s outputs are non-finite: {self.nonfinite} of {self.count} value(s) "
                                    "NaN or Inf where the reference's are finite")
        return metrics

    def _metrics(self, output: str, runner: str) -> OutputMetrics:
        if self.nan:
            return OutputMetrics(output, runner, math.nan, math.nan, math.nan, math.nan, math.nan, self.count)
        norm = math.sqrt(self.ref_energy * self.cand_energy)
        cosine = self.dot / norm if norm > 0 else (1.0 if self.err_energy == 0 else 0.0)
        metrics = OutputMetrics(
            output, runner, self.snr_db(), cosine, self.max_abs, self.abs_sum / max(self.count, 1),
            math.sqrt(self.err_energy / self.ref_energy) if self.ref_energy > 0 else (0.0 if self.err_energy == 0
                                                                                      else math.inf),
            self.count)
        if self.classifier and self.rows:
            metrics.top1, metrics.topk, metrics.k = self.top1 / self.rows, self.topk / self.rows, self.k
        return metrics


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` in dB (higher is better)."""
    ref = np.asarray(reference, np.float64).ravel()
    err = ref - np.asarray(test, np.float64).ravel()
    noise = float(np.sum(err * err))
    if noise == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(float(np.sum(ref * ref)) / noise))

