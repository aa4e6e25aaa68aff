"""Streaming range observers for symmetric int8 activation scales.

Each observer sees a tensor's values one feed at a time and keeps O(bins) state:
the running min and max and, for the histogram methods, a signed histogram over
[-R, R]. When a feed exceeds R the range doubles and adjacent bins merge pairwise,
which is exact (no interpolation), so memory never grows with the number of feeds.

Methods (the returned value is ``amax``; the scale is ``amax / 127``):

* ``max``: the largest |x| seen.
* ``percentile``: the |x| below which ``percentile`` % of the values lie.
* ``entropy``: TensorRT's KL-divergence search over 128-level quantizations.
* ``mse``: the clipping threshold minimising the expected squared error of
  quantize→dequantize under the observed histogram.
* ``auto``: keeps the histogram, and the conversion picks one of the above for the
  whole model by the output error on held-out calibration feeds
  (:mod:`trt_bridge.conversion.range_choice`).

A histogram needs no more than ``HIST_SAMPLES`` values of a feed to place a 99.99th
percentile (a fixed pseudo-random subset of larger tensors); the min and max see every value,
and a percentile of 100 is the max.
"""

from __future__ import annotations

import numpy as np

from trt_bridge.annotations import QMAX
from trt_bridge.choices import CalibMethod

#: a histogram takes at most this many of one feed's values (a fixed pseudo-random subset); min and max take them all
HIST_SAMPLES = 1 << 15


class RangeObserver:
    """Running min/max and a signed histogram over [-R, R] (R doubles as needed).

    ``amax(center)`` folds the histogram around ``center`` and applies the method to
    |x − center|: center 0 is plain symmetric quantization; a non-zero center is used
    when a one-sided tensor is re-centred before quantization (see ``recenter``).
    """

    def __init__(self, method: CalibMethod = CalibMethod.PERCENTILE, percentile: float = 99.99,
                 bins: int = 2048):
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        if bins % 2:
            raise ValueError("bins must be even")
        self.method, self.percentile, self.bins = CalibMethod(method), percentile, bins
        self.lo, self.hi = np.inf, -np.inf
        self.hist = np.zeros(2 * bins, np.float64)  # over [-R, R]
        self.R = 0.0
        self._zeros = 0  # zeros seen while R is still 0
        self.count = 0
        self.nonfinite = 0  # NaN and ±Inf values seen (and left out of the range)
        self.infinite = 0  # of which ±Inf
        self._amax: dict = {}  # (center, method, percentile) → amax, until the next update

    @property
    def max(self) -> float:
        """The largest |x| seen (0 before any value)."""
        return 0.0 if self.count == 0 else float(max(abs(self.lo), abs(self.hi)))

    def update(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float32).ravel()
        if v.size == 0:
            return
        lo, hi = float(v.min()), float(v.max())  # NaN if any is; ±inf if any is
        if not (np.isfinite(lo) and np.isfinite(hi)):  # masked or padded rows: the range is the finite values'
            finite = v[np.isfinite(v)]
            self.nonfinite += v.size - finite.size
            self.infinite += int(np.count_nonzero(np.isinf(v)))
            v = finite
            if v.size == 0:
                return
            lo, hi = float(v.min()), float(v.max())
        self.count += v.size
        self._amax.clear()
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        peak = max(abs(lo), abs(hi))
        if self.method is CalibMethod.MAX:
            return
        weight = 1.0  # how many of the feed's values each histogrammed one stands for
        if v.size > HIST_SAMPLES:
            weight = v.size / HIST_SAMPLES
            v = v[_sample(v.size)]
        if peak == 0.0 and self.R == 0.0:
            self._zeros += v.size * weight
            return
        if self.R == 0.0:
            self.R = peak
            self.hist[self.bins] += self._zeros  # the bin starting at 0
        while peak > self.R:
            quarter = self.bins // 2
            merged = self.hist.reshape(-1, 2).sum(axis=1)
            self.hist = np.concatenate([np.zeros(quarter), merged, np.zeros(quarter)])
            self.R *= 2.0
        self.hist += _histogram(v, self.R, 2 * self.bins) * weight

    def amax(self, center: float = 0.0, method: CalibMethod | None = None, percentile: float | None = None
             ) -> float:
        """The clipping threshold for |x − center| under ``method`` and ``percentile`` (default: this
        observer's; a histogram method needs an observer that kept one, i.e. made with any method but max)."""
        method = self.method if method is None else CalibMethod(method)
        percentile = self.percentile if percentile is None else percentile
        if method is CalibMethod.AUTO:
            raise ValueError("method auto is resolved by the conversion; ask for max, percentile, mse or entropy")
        if method is not CalibMethod.MAX and self.method is CalibMethod.MAX:
            raise ValueError(f"a max observer kept no histogram for method {method.value}")
        if self.count == 0:
            return 0.0
        top = float(max(self.hi - center, center - self.lo, 0.0))
        if method is CalibMethod.MAX or top == 0.0 or self.R == 0.0 or (
                method is CalibMethod.PERCENTILE and percentile >= 100.0):
            return top
        key = (center, method, percentile if method is CalibMethod.PERCENTILE else None)
        if key not in self._amax:
            self._amax[key] = self._histogram_amax(center, top, method, percentile)
        return self._amax[key]

    def _histogram_amax(self, center: float, top: float, method: CalibMethod, percentile: float) -> float:
        width = self.R / self.bins
        mids = np.abs(-self.R + width * (np.arange(2 * self.bins) + 0.5) - center)
        # the histogram of |x − center| over [0, top]; every value seen lies within top, so a bin whose middle
        # lies beyond it (the one holding the max) goes into the last bin
        index = np.minimum((mids * (self.bins / top)).astype(np.intp), self.bins - 1)
        hist = np.bincount(index, weights=self.hist, minlength=self.bins)
        fold_edges = np.linspace(0.0, top, self.bins + 1)
        if not hist.any():
            return top
        if method is CalibMethod.PERCENTILE:
            cdf = np.cumsum(hist) / hist.sum()
            idx = int(np.searchsorted(cdf, percentile / 100.0))
            return float(min(fold_edges[min(idx + 1, self.bins)], top))
        if method is CalibMethod.MSE:
            return float(min(_mse_amax(hist, fold_edges), top))
        return float(min(_entropy_amax(hist, fold_edges), top))


def _sample(size: int) -> np.ndarray:
    """``HIST_SAMPLES`` positions spread over a feed of ``size`` values, the same for every feed of that size
    (deterministic) and not evenly strided: a stride would alias with interleaved data (every other column
    scaled down, a Bayer pattern) and see only one phase of it."""
    found = _SAMPLES.get(size)
    if found is None:
        found = np.sort(np.random.default_rng(size).integers(0, size, HIST_SAMPLES))
        if len(_SAMPLES) >= 64:
            _SAMPLES.pop(next(iter(_SAMPLES)))
        _SAMPLES[size] = found
    return found


_SAMPLES: dict[int, np.ndarray] = {}


def _histogram(v: np.ndarray, R: float, bins: int) -> np.ndarray:
    """``np.histogram(v, bins, range=(-R, R))`` for values known to lie in [-R, R], in float32 (seven times
    faster on a feed's 65536 values; a value on a bin edge may land in the next bin)."""
    ftype = np.float32 if R < 1e30 else np.float64  # v + R must not overflow
    shifted = v + ftype(R) if v.dtype == ftype else v.astype(ftype) + ftype(R)  # a new array: v is the caller's
    shifted *= ftype(bins / (2.0 * R))
    index = shifted.astype(np.intp)
    np.clip(index, 0, bins - 1, out=index)  # x = R lands on the edge; a tiny R overflows bins / 2R
    return np.bincount(index, minlength=bins)


def _mse_amax(hist: np.ndarray, edges: np.ndarray, candidates: int = 256, block: int = 64) -> float:
    centers = (edges[:-1] + edges[1:]) / 2
    nz = hist > 0
    centers, weights = centers[nz], hist[nz]
    last = int(np.nonzero(nz)[0][-1]) + 1
    # Candidate thresholds from a small fraction of the observed range up to its end.
    cand = np.unique(np.linspace(max(last // 32, 1), last, candidates).round().astype(int))
    amax = edges[cand]
    err = np.empty(len(cand))
    work = np.empty((block, centers.size))  # one block of candidates at a time, in place: it stays in cache
    for start in range(0, len(cand), block):
        step = amax[start:start + block, None] / QMAX
        diff = work[:len(step)]
        np.divide(centers[None, :], step, out=diff)
        np.rint(diff, out=diff)
        np.minimum(diff, QMAX, out=diff)
        diff *= step
        np.subtract(centers[None, :], diff, out=diff)  # each centre less its quantized value
        np.square(diff, out=diff)
        err[start:start + block] = diff @ weights
    return float(amax[int(np.argmin(err))])


def _entropy_amax(hist: np.ndarray, edges: np.ndarray, levels: int = 128, stride: int = 4) -> float:
    hist = hist.copy()
    # Exact zeros (ReLU outputs, padding) pile up in bin 0 and are representable at any
    # scale; left as they are they dominate the divergence and drag the threshold down.
    if hist.size > 1:
        hist[0] = min(hist[0], hist[1])
    last = int(np.nonzero(hist)[0][-1]) + 1
    if last <= levels:
        return float(edges[last])
    best_i, best_kl = last, np.inf
    for i in list(range(levels, last, stride)) + [last]:
        ref = hist[:i].copy()
        ref[i - 1] += hist[i:].sum()
        group = (np.arange(i) * levels) // i
        nonzero = hist[:i] > 0
        group_sum = np.bincount(group, weights=hist[:i], minlength=levels)
        group_nz = np.bincount(group, weights=nonzero, minlength=levels)
        spread = np.where(group_nz > 0, group_sum / np.maximum(group_nz, 1), 0.0)
        cand = np.where(nonzero, spread[group], 0.0)
        p = ref / ref.sum()
        q_total = cand.sum()
        if q_total == 0:
            continue
        q = cand / q_total
        mask = p > 0
        # Bins where p > 0 but q == 0 (only possible for the merged outlier bin) get a small floor.
        kl = float(np.sum(p[mask] * np.log(p[mask] / np.maximum(q[mask], 1e-12))))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return float(edges[best_i])
