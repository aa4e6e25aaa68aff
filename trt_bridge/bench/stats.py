"""Latency statistics, computed the way ``trtexec`` reports them.

trtexec sorts the per-inference times and, for percentile ``p`` of ``n`` times,
leaves out the slowest ``floor((100 - p) / 100 * n)`` of them and reports the next
one; the median of an even count is the mean of the two middle times. Throughput is
inferences per second of wall-clock time over the whole timed run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trt_bridge.errors import InternalError


def percentile(ordered: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of the ascending ``ordered`` times, as trtexec takes it."""
    if not ordered:
        raise InternalError("percentile of no times")
    if not 0.0 <= p <= 100.0:
        raise InternalError(f"percentile {p} is not in [0, 100]")
    n = len(ordered)
    # (100 - p) * n / 100 in exact-ish arithmetic: 1 - 0.9 is 0.0999... in binary floating point
    excluded = int((100.0 - p) * n / 100.0 + 1e-9)
    return float(ordered[max(n - 1 - excluded, 0)])


def median(ordered: Sequence[float]) -> float:
    if not ordered:
        raise InternalError("median of no times")
    m = len(ordered) // 2
    return float(ordered[m]) if len(ordered) % 2 else (float(ordered[m - 1]) + float(ordered[m])) / 2.0


@dataclass
class LatencyStats:
    """Per-inference latency in milliseconds, throughput in inferences per second."""

    median: float
    mean: float
    min: float
    max: float
    p90: float
    p95: float
    p99: float
    throughput: float
    iterations: int
    total_seconds: float

    @classmethod
    def from_times(cls, times_ms: Sequence[float], total_seconds: float) -> LatencyStats:
        """``times_ms``: one latency per timed inference; ``total_seconds``: wall-clock time of the timed run."""
        ordered = sorted(float(t) for t in times_ms)
        if not ordered:
            raise InternalError("no timed inferences")
        n = len(ordered)
        return cls(
            median=median(ordered), mean=sum(ordered) / n, min=ordered[0], max=ordered[-1],
            p90=percentile(ordered, 90), p95=percentile(ordered, 95), p99=percentile(ordered, 99),
            throughput=n / total_seconds if total_seconds > 0 else 0.0, iterations=n,
            total_seconds=float(total_seconds),
        )
