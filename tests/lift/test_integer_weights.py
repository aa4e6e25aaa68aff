"""lift/weights.py: a source's 8-bit weights become float weights and int8 specs with the very values of the float64
formulas (``(W_q − zero_point) · scale``, rounded to float32 once; channels whose centred integers do not fit
[−127, 127] re-quantized on ``max |c·s| / 127``), computed in float32 and int16 and on the channels that need it only.
Random int8 and uint8 sources, per tensor and per channel, scales from 1e-6 to 10."""

from __future__ import annotations

import numpy as np
import pytest

from trt_bridge.annotations import ScaleSource
from trt_bridge.lift.weights import _dequantized, _weight_spec

QMAX = 127


def _reference_spec(values, zero_point, scale, axis):
    """The float64 formulas, on every channel."""
    shape = [1] * values.ndim
    shape[axis] = -1
    zp = zero_point.reshape(shape) if zero_point.ndim else zero_point
    centred = values.astype(np.int64) - zp
    if np.abs(centred).max(initial=0) <= QMAX:
        return centred.astype(np.int8), np.asarray(scale, np.float32), ScaleSource.EXACT_WEIGHTS
    axes = tuple(i for i in range(centred.ndim) if i != axis)
    fits = np.abs(centred).max(axis=axes) <= QMAX
    scale_vec = np.broadcast_to(scale, fits.shape).astype(np.float64)
    floats = centred * scale_vec.reshape(shape)
    per_channel = np.where(fits, scale_vec, np.abs(floats).max(axis=axes) / QMAX)
    q = np.where(fits.reshape(shape), centred, np.rint(floats / per_channel.reshape(shape)))
    return np.clip(q, -QMAX, QMAX).astype(np.int8), per_channel.astype(np.float32), ScaleSource.REQUANTIZED


@pytest.mark.parametrize("seed", range(6))
def test_the_values_of_the_float64_formulas(seed):
    rng = np.random.default_rng(seed)
    requantized = 0
    for case in range(60):
        shape = tuple(int(d) for d in rng.integers(1, 9, size=rng.integers(2, 5)))
        axis = int(rng.integers(0, len(shape)))
        dtype = (np.uint8, np.int8)[case % 2]
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
        if case % 4 == 1:  # most channels fit, a few do not
            values = (values // 3).astype(dtype)
        channels = shape[axis]
        if case % 3:
            zero_point = rng.integers(info.min, info.max + 1, size=channels).astype(dtype)
            scale = (rng.random(channels) * 10.0 ** rng.integers(-6, 2, size=channels)).astype(np.float32)
        else:
            zero_point = np.array(rng.integers(0, 120), dtype)
            scale = np.array(rng.random() * 0.1, np.float32)
        got = _weight_spec("w", values, zero_point, scale, axis, "origin")
        want = _reference_spec(values, zero_point, scale, axis)
        np.testing.assert_array_equal(got.codes, want[0])
        np.testing.assert_array_equal(got.scale, want[1])
        assert got.source == want[2]
        requantized += got.source is ScaleSource.REQUANTIZED
        shape1 = [1] * values.ndim
        shape1[axis] = -1
        zp = zero_point.reshape(shape1) if zero_point.ndim else zero_point
        sc = scale.reshape(shape1) if scale.ndim else scale
        for sc_type in (np.float32, np.float16):
            s = sc.astype(sc_type)
            np.testing.assert_array_equal(_dequantized(values, zp, s),
                                          ((values.astype(np.float64) - zp) * s).astype(np.float32))
    assert requantized > 10  # the re-quantizing path was exercised
