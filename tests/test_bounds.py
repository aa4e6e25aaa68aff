"""Issue 37 (G9): every numeric option of every command has a documented bound (``trt_bridge.choices.BOUNDS``),
checked where it enters: the command line, the Python API and each options dataclass. The audit below fails for a
numeric flag added without a bound."""

from __future__ import annotations

import argparse

import pytest

from trt_bridge.bench import BenchOptions
from trt_bridge.choices import BOUNDS, MAX_DIMENSION, FormatOptions, check_bound
from trt_bridge.cli import build_parser
from trt_bridge.conversion.options import AccuracyTarget, CalibrationOptions, RangeOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.tensorrt.profiles import parse_shapes
from trt_bridge.verification import VerifyOptions
from trt_bridge.verification.generation import GenerationOptions


def _numeric_actions():
    """(command, action) for every flag of every command whose value is a number (int, float or a size)."""
    parser = build_parser(None)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, child in sub.choices.items():
        for action in child._actions:
            if action.type in (int, float) or getattr(action.type, "__name__", "") == "_size":
                yield command, action


def test_every_numeric_option_has_a_bound():
    actions = list(_numeric_actions())
    assert len(actions) >= 20  # convert, verify, bench and build's numeric flags are all found
    missing = sorted({f"{command} {max(a.option_strings, key=len)}" for command, a in actions if a.dest not in BOUNDS})
    assert not missing, f"numeric options without a bound in trt_bridge.choices.BOUNDS: {missing}"
    for command, action in actions:  # the table names the flag the user typed
        assert BOUNDS[action.dest].flag in action.option_strings, (command, action.dest)


@pytest.mark.parametrize("dest", sorted(BOUNDS))
def test_each_bound_takes_its_ends_and_refuses_beyond(dest):
    bound = BOUNDS[dest]
    step = 1 if bound.integer else max(abs(bound.high), 1) * 1e-3
    low = bound.low if not bound.open_low else (bound.low + step if bound.integer else bound.low + step)
    high = bound.high if not bound.open_high else bound.high - step
    if dest == "block_size":
        low, high = 2, 4096
    for ok in (low, high):
        check_bound(dest, int(ok) if bound.integer else float(ok))
    for bad in (bound.low - step if not bound.open_low else bound.low, bound.high + step if not bound.open_high
                else bound.high):
        with pytest.raises(TrtBridgeError, match=bound.flag.replace("-", r"\-")) as info:
            check_bound(dest, int(bad) if bound.integer else float(bad))
        assert "\n" not in str(info.value)
    if bound.integer:
        with pytest.raises(TrtBridgeError, match="takes an integer"):
            check_bound(dest, True)
    else:
        with pytest.raises(TrtBridgeError, match=bound.flag):
            check_bound(dest, float("nan"))


@pytest.mark.parametrize("make, flag", [
    (lambda: FormatOptions(weights="int4", block_size=2**30), "--block-size"),
    (lambda: FormatOptions(block_size=8192), "--block-size"),
    (lambda: CalibrationOptions(max_feeds=10**12), "--calib-max"),
    (lambda: CalibrationOptions(random=10**9, max_feeds=10**6 + 1), "--calib-max"),
    (lambda: CalibrationOptions(random=0), "--calib-random"),
    (lambda: RangeOptions(smooth=float("nan")), "--smooth"),
    (lambda: AccuracyTarget(target=1e308), "--accuracy-target"),
    (lambda: AccuracyTarget(target=20.0, random=10**9), "--eval-random"),
    (lambda: BenchOptions(iterations=10**11).check(), "--iterations"),
    (lambda: BenchOptions(warmup=10**11).check(), "--warmup"),
    (lambda: BenchOptions(duration=1e300).check(), "--duration"),
    (lambda: BenchOptions(threads=10**8).check(), "--threads"),
    (lambda: BenchOptions(seed=2**128).check(), "--seed"),
    (lambda: VerifyOptions(random=10**9), "--random"),
    (lambda: VerifyOptions(layer_feeds=10**11), "--layer-feeds"),
    (lambda: GenerationOptions(steps=10**10), "--steps"),
    (lambda: GenerationOptions(min_token_agreement=101.0), "--min-token-agreement"),
])
def test_options_dataclasses_check_the_same_bounds(make, flag):
    """What a manifest or a Python caller builds directly is bounded as the command line is."""
    with pytest.raises(TrtBridgeError, match=flag):
        make()


def test_shapes_are_bounded():
    assert parse_shapes([f"x:1x{MAX_DIMENSION}"]) == {"x": (1, MAX_DIMENSION)}
    for text in (f"x:{MAX_DIMENSION + 1}", "x:99999999999999999999x3", "x:65536x65536x3", "x:[65536,65536,3]"):
        with pytest.raises(TrtBridgeError, match="at most 2147483647"):
            parse_shapes([text])


def test_the_api_checks_the_bounds(tmp_path):
    import onnx

    import trt_bridge
    from tests.hostile.conftest import float_net

    onnx.save(float_net(), str(tmp_path / "m.onnx"))
    for options, flag in (({"int4": True, "block_size": 2**30}, "--block-size"), ({"calib_random": 10**9,
                                                                                    "calib_max": 10**9},
                                                                                   "--calib-(max|random)")):
        with pytest.raises(TrtBridgeError, match=flag):
            trt_bridge.convert(tmp_path / "m.onnx", tmp_path / "o.onnx", quiet=True, **options)
    assert not (tmp_path / "o.onnx").exists()
    with pytest.raises(TrtBridgeError, match="--top-k"):
        trt_bridge.verify(tmp_path / "m.onnx", tmp_path / "m.onnx", random=2, top_k=10**12)
    with pytest.raises(TrtBridgeError, match="--workspace"):
        trt_bridge.build(tmp_path / "m.onnx", tmp_path / "m.engine", workspace="100000T")
    assert not (tmp_path / "m.engine").exists()
