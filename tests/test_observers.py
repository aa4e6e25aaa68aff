"""RangeObserver: streaming equals one-shot, clipping behaviour, degenerate inputs, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest

from trt_bridge.calibrate import observers
from trt_bridge.calibrate.observers import HIST_SAMPLES, CalibMethod, RangeObserver

METHODS = [m.value for m in CalibMethod if m is not CalibMethod.AUTO]  # auto is the conversion's choice
HIST_METHODS = ["percentile", "entropy", "mse"]
BINS = 2048


def chunks_with_growing_range(seed: int = 0) -> list[np.ndarray]:
    """Gaussian chunks whose peaks are exactly 1, 2, 4, ..., 32: the histogram range must double
    five times, and the final range (32) is the same whether the data arrives at once or not."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(6):
        peak = float(2**k)
        c = np.clip(rng.standard_normal(20_000) * peak / 4, -peak, peak).astype(np.float32)
        c[0] = peak if k % 2 == 0 else -peak
        out.append(c)
    return out


def observe(method: str, chunks, **kwargs) -> RangeObserver:
    obs = RangeObserver(method, bins=BINS, **kwargs)
    for c in chunks:
        obs.update(c)
    return obs


@pytest.mark.parametrize("method", METHODS)
def test_streaming_max_equals_one_shot(method):
    chunks = chunks_with_growing_range()
    streamed = observe(method, chunks)
    whole = observe(method, [np.concatenate(chunks)])
    assert streamed.max == whole.max == 32.0
    assert streamed.count == whole.count == sum(c.size for c in chunks)


def test_max_method_returns_largest_magnitude_over_all_chunks():
    rng = np.random.default_rng(1)
    chunks = [rng.standard_normal((2, 8)).astype(np.float32) * s for s in (5.0, 1.0, 0.1)]
    chunks[1][0, 0] = -9.5  # the largest magnitude is negative and in the middle chunk
    obs = observe("max", chunks)
    assert obs.amax() == pytest.approx(9.5)
    assert obs.amax() == observe("max", [np.concatenate([c.ravel() for c in chunks])]).amax()


@pytest.mark.parametrize("percentile", [50.0, 99.0, 99.9])
def test_percentile_after_range_doubling_is_within_one_bin_of_numpy(percentile, monkeypatch):
    monkeypatch.setattr(observers, "HIST_SAMPLES", 1 << 20)  # every value in the histogram
    chunks = chunks_with_growing_range()
    magnitudes = np.abs(np.concatenate(chunks))
    bin_width = 32.0 / BINS
    expected = float(np.percentile(magnitudes, percentile))

    streamed = observe("percentile", chunks, percentile=percentile).amax()
    whole = observe("percentile", [np.concatenate(chunks)], percentile=percentile).amax()
    assert abs(streamed - expected) <= bin_width, (streamed, expected, bin_width)
    assert abs(whole - expected) <= bin_width
    assert abs(streamed - whole) <= bin_width


def test_a_large_feed_is_histogrammed_from_a_subset_that_stands_for_all_of_it():
    rng = np.random.default_rng(5)
    big = rng.standard_t(4, 8 * HIST_SAMPLES + 3).astype(np.float32)  # heavy tails: the percentile is sensitive
    obs = observe("percentile", [big], percentile=99.0)
    assert obs.max == pytest.approx(float(np.abs(big).max()))  # min and max see every value
    assert obs.hist.sum() == pytest.approx(big.size, rel=1e-4)  # each sampled value counts for size/samples
    assert obs.amax() == pytest.approx(float(np.percentile(np.abs(big), 99.0)), rel=0.03)
    # the 99.9th percentile rests on ~33 sampled values of the tail: within sampling error
    assert obs.amax(percentile=99.9) == pytest.approx(float(np.percentile(np.abs(big), 99.9)), rel=0.15)


def test_interleaved_data_is_not_aliased_by_the_subset():
    """Every other value a hundred times smaller (a Bayer-like pattern): an even stride would see one phase."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 128, 128)).astype(np.float32)
    x[..., 0::2] *= 0.01
    for method in ("percentile", "mse"):
        amax = observe(method, [x], percentile=99.9).amax()
        assert amax > 0.5 * float(np.percentile(np.abs(x), 99.9)), method


def test_percentile_100_is_the_max_even_when_the_subset_misses_it():
    rng = np.random.default_rng(9)
    v = rng.standard_normal(4 * HIST_SAMPLES).astype(np.float32)
    v[1] = 50.0
    assert observe("percentile", [v], percentile=100.0).amax() == 50.0
    assert observe("auto", [v]).amax(method="percentile", percentile=100.0) == 50.0


@pytest.mark.parametrize("method", HIST_METHODS)
def test_a_value_on_a_bin_edge_at_the_top_still_counts(method):
    """Half the values are 6.0, which float32 binning puts on the lower edge of a bin whose middle lies above
    the max: that bin must still count (it held the max), and entropy must not fail on an empty fold."""
    obs = observe(method, [np.full(2048, 0.001, np.float32), np.full(2048, 6.0, np.float32)])
    assert obs.amax() > 5.9


def test_an_auto_observer_keeps_a_histogram_and_answers_for_any_method():
    rng = np.random.default_rng(6)
    x = rng.standard_t(2, 50_000).astype(np.float32)
    auto = observe("auto", [x])
    for method in HIST_METHODS + ["max"]:
        assert auto.amax(method=method) == observe(method, [x]).amax()
    with pytest.raises(ValueError, match="resolved by the conversion"):
        auto.amax()
    with pytest.raises(ValueError, match="kept no histogram"):
        observe("max", [x]).amax(method="percentile")


def test_percentile_100_is_the_max():
    chunks = chunks_with_growing_range(seed=3)
    assert observe("percentile", chunks, percentile=100.0).amax() == pytest.approx(32.0)


def test_histogram_counts_every_value_after_doubling():
    chunks = chunks_with_growing_range()
    obs = observe("percentile", chunks)
    assert obs.hist.sum() == sum(c.size for c in chunks)


@pytest.mark.parametrize("method, below", [("mse", 1.0), ("entropy", 0.9)])
def test_heavy_tailed_distribution_is_clipped_below_its_max(method, below):
    """Student t with 1.5 degrees of freedom: rare huge outliers. MSE clips little: the bulk lies far below one
    step at any of these scales (its error does not shrink with the step), while the top outlier's clipping
    error grows with the clip."""
    rng = np.random.default_rng(0)
    x = rng.standard_t(1.5, 200_000).astype(np.float32)  # rare huge outliers
    obs = observe(method, np.array_split(x, 10))
    amax = obs.amax()
    assert obs.max == pytest.approx(float(np.abs(x).max()))
    assert 0 < amax < below * obs.max
    assert amax >= float(np.percentile(np.abs(x), 90))  # clipped, but not into the bulk


@pytest.mark.parametrize("method", ["mse", "entropy"])
def test_gaussian_keeps_at_least_the_99th_percentile(method):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(200_000).astype(np.float32)
    obs = observe(method, np.array_split(x, 10))
    amax = obs.amax()
    assert float(np.percentile(np.abs(x), 99)) <= amax <= obs.max


@pytest.mark.parametrize("method", METHODS)
def test_all_zero_tensors(method):
    obs = observe(method, [np.zeros((4, 8), np.float32) for _ in range(3)])
    assert obs.max == 0.0
    assert obs.amax() == 0.0
    assert obs.count == 96


@pytest.mark.parametrize("method", METHODS)
def test_zeros_before_values_are_counted(method):
    """Zeros seen before the range is known still weigh in once non-zero values arrive."""
    values = np.linspace(0.01, 1.0, 100, dtype=np.float32)
    obs = observe(method, [np.zeros(900, np.float32), values], percentile=50.0)
    assert obs.count == 1000
    assert obs.max == pytest.approx(1.0)
    if method == "percentile":
        assert obs.amax() <= 2.0 / BINS  # the median of 90 % zeros is (within a bin) 0
    else:
        assert 0 < obs.amax() <= 1.0


@pytest.mark.parametrize("method", METHODS)
def test_nan_and_inf_are_ignored(method):
    clean = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    clean[0] = 3.5
    dirty = clean.copy()
    dirty = np.concatenate([dirty, np.array([np.nan, np.inf, -np.inf, np.nan], np.float32)])
    a = observe(method, [dirty])
    b = observe(method, [clean])
    assert a.max == b.max == pytest.approx(3.5)
    assert a.count == b.count == 1000
    assert np.isfinite(a.amax()) and a.amax() == pytest.approx(b.amax())


@pytest.mark.parametrize("method", METHODS)
def test_only_non_finite_values_leave_the_observer_empty(method):
    obs = observe(method, [np.array([np.nan, np.inf], np.float32), np.array([], np.float32)])
    assert obs.count == 0 and obs.max == 0.0 and obs.amax() == 0.0


@pytest.mark.parametrize("method", HIST_METHODS)
def test_memory_does_not_grow_with_updates(method):
    rng = np.random.default_rng(0)
    obs = RangeObserver(method, bins=BINS)
    obs.update(rng.standard_normal(100).astype(np.float32))
    size, nbytes = obs.hist.size, obs.hist.nbytes
    for i in range(100):
        obs.update(rng.standard_normal(256).astype(np.float32) * (1.0 + i))  # the range keeps growing
    assert obs.hist.size == size and obs.hist.nbytes == nbytes
    assert obs.count == 100 + 100 * 256
    assert obs.hist.sum() == obs.count


def test_invalid_percentile_is_rejected():
    with pytest.raises(ValueError, match="percentile"):
        RangeObserver("percentile", percentile=0.0)
    with pytest.raises(ValueError, match="percentile"):
        RangeObserver("percentile", percentile=100.5)


def test_tiny_activations_are_histogrammed():
    """A range under 6e-36 overflows float32's bins / 2R: every value still lands in a bin (it raised before)."""
    obs = RangeObserver(CalibMethod.PERCENTILE)
    tiny = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 1e-38
    obs.update(tiny)
    obs.update(tiny * 0.5)
    assert obs.hist.sum() == 2 * tiny.size
    assert 0 < obs.amax() <= np.abs(tiny).max()
