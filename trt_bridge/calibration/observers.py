"""Streaming range observers for symmetric int8 activation scales.

Each observer sees a tensor's values one feed at a time and keeps O(bins) state:
a running max and, for the histogram methods, a histogram of |x| over [0, hi].
When a feed exceeds ``hi`` the range doubles and adjacent bins merge pairwise,
which is exact (no interpolation), so memory never grows with the number of feeds.

Methods (the returned value is ``amax``; the scale is ``amax / 127``):

* ``max``: the largest |x| seen.
* ``percentile``: the |x| below which ``percentile`` % of the values lie.
* ``entropy``: TensorRT's KL-divergence search over 128-level quantizations.
* ``mse``: the clipping threshold minimising the expected squared error of
  quantize→dequantize under the observed histogram.
"""

from __future__ import annotations

import enum

import numpy as np

QMAX = 127


class CalibMethod(str, enum.Enum):
    MAX = "max"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MSE = "mse"


class RangeObserver:
    def __init__(self, method: CalibMethod = CalibMethod.MSE, percentile: float = 99.99, bins: int = 2048):
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {percentile}")
        self.method, self.percentile, self.bins = CalibMethod(method), percentile, bins
        self.max = 0.0
        self.hist = np.zeros(bins, np.float64)
        self.hi = 0.0  # upper edge of the histogram; 0 until a non-zero value is seen
        self.count = 0

    def update(self, values: np.ndarray) -> None:
        mag = np.abs(np.asarray(values, dtype=np.float32).ravel())
        if mag.size == 0:
            return
        finite = np.isfinite(mag)
        if not finite.all():
            mag = mag[finite]
            if mag.size == 0:
                return
        self.count += mag.size
        batch_max = float(mag.max())
        self.max = max(self.max, batch_max)
        if self.method is CalibMethod.MAX or batch_max == 0.0 and self.hi == 0.0:
            if self.method is not CalibMethod.MAX and self.hi == 0.0:
                self.hist[0] += mag.size
            return
        if self.hi == 0.0:
            self.hi = batch_max
        while batch_max > self.hi:
            self.hist = np.concatenate([self.hist.reshape(-1, 2).sum(axis=1), np.zeros(self.bins // 2)])
            self.hi *= 2.0
        counts, _ = np.histogram(mag, bins=self.bins, range=(0.0, self.hi))
        self.hist += counts

    def amax(self) -> float:
        if self.max == 0.0:
            return 0.0
        if self.method is CalibMethod.MAX:
            return self.max
        edges = np.linspace(0.0, self.hi, self.bins + 1)
        if self.method is CalibMethod.PERCENTILE:
            cdf = np.cumsum(self.hist) / self.hist.sum()
            idx = int(np.searchsorted(cdf, self.percentile / 100.0))
            return float(min(edges[min(idx + 1, self.bins)], self.max))
        if self.method is CalibMethod.MSE:
            return float(min(_mse_amax(self.hist, edges), self.max))
        return float(min(_entropy_amax(self.hist, edges), self.max))


def _mse_amax(hist: np.ndarray, edges: np.ndarray, candidates: int = 256) -> float:
    centers = (edges[:-1] + edges[1:]) / 2
    nz = hist > 0
    centers, weights = centers[nz], hist[nz]
    last = int(np.nonzero(nz)[0][-1]) + 1
    # Candidate thresholds from a small fraction of the observed range up to its end.
    cand = np.unique(np.linspace(max(last // 32, 1), last, candidates).round().astype(int))
    amax = edges[cand][:, None]
    step = amax / QMAX
    deq = np.minimum(np.rint(centers[None, :] / step), QMAX) * step
    err = ((centers[None, :] - deq) ** 2 * weights[None, :]).sum(axis=1)
    return float(amax[int(np.argmin(err)), 0])


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
