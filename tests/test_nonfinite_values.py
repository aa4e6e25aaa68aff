"""Legitimate non-finite values (reliability, G2–G4): a transformer whose relative-position bias table holds -Inf and
whose padded rows go NaN inside converts in all its forms; what is really broken is still refused.

``tests/data/nonfinite`` holds real exports, written once by ``scripts/nonfinite_transformer.py`` (torch 2.13's
``torch.onnx.export``, onnxruntime 1.32's ``quantize_static``; the script's docstring describes the block), so the
suite needs no torch: ``float.onnx``, ``qdq.onnx``/``qop.onnx`` (onnxruntime's default op types: it quantizes the
-Inf table with scale Inf, and its own attention adds nothing), ``qdq-linear.onnx`` (MatMul/Gemm only), and their
calibration (``calib.npz``) and held-out (``eval.npz``) feeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, snr_db  # noqa: E402

from trt_bridge.calibrate.observers import CalibMethod, RangeObserver  # noqa: E402
from trt_bridge.calibrate.smooth import ChannelMaxObserver  # noqa: E402
from trt_bridge.checks import CheckOptions, check_model  # noqa: E402
from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions  # noqa: E402
from trt_bridge.errors import CalibrationDataError, UnsupportedPatternError  # noqa: E402
from trt_bridge.ir.values import nonfinite_count  # noqa: E402
from trt_bridge.lift.scale_algebra import dequantized  # noqa: E402
from trt_bridge.place.policies import PlacementOptions  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "nonfinite"
TABLE = "bias.weight"  # the relative-position bias table: 8 of its 17 rows -Inf (16 values)


def _feeds(name: str) -> list[dict[str, np.ndarray]]:
    with np.load(DATA / name) as data:
        return [{k: data[k][i] for k in data.files} for i in range(len(data["x"]))]


def _nonfinite(model: onnx.ModelProto) -> dict[str, int]:
    found = {}
    for init in model.graph.initializer:
        values = onnx.numpy_helper.to_array(init)
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            found[init.name] = int(np.count_nonzero(~np.isfinite(values)))
    return found


def _quantized(model: onnx.ModelProto) -> set[str]:
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}


@pytest.fixture(scope="module")
def reference():
    held_out = _feeds("eval.npz")
    return held_out, run_ort(DATA / "float.onnx", held_out)


#: form → the SNR its source scores against the float model on eval.npz (measured: float ∞, qdq and qop 14.1 dB:
#: their attention adds nothing, qdq-linear 43.7 dB)
FORMS = ("float", "qdq", "qop", "qdq-linear")


@pytest.mark.parametrize("form", FORMS)
def test_transformer_with_inf_bias_table_and_nan_rows_converts_builds_and_keeps_its_accuracy(tmp_path, form,
                                                                                             reference):
    held_out, want = reference
    source = DATA / f"{form}.onnx"
    assert all(np.isfinite(y).all() for y in run_ort(source, held_out))  # the source's outputs are finite
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(calibration=CalibrationOptions(data=str(DATA / "calib.npz")),
                                                 progress=False))
    assert not report.remaining_blockers
    assert report.calibration["skipped_feeds"] == 0  # NaN rows inside are no reason to leave a feed out
    model = assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    got = run_ort(out, held_out)
    assert all(np.isfinite(y).all() for y in got)
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in (TABLE,
                                                                                        f"{TABLE}_quantized_float")]
    assert len(gathers) == 1  # the table is read by Gather from a float constant, not dequantized
    assert {n.op_type for n in model.graph.node} >= {"Gather", "Softmax", "Where"}
    softmax_input = next(n.input[0] for n in model.graph.node if n.op_type == "Softmax")
    assert softmax_input not in _quantized(model)
    assert nonfinite_count(model) <= nonfinite_count(onnx.load(str(source)))  # no non-finite value of its own
    converted_snr = snr_db(want, got)
    if form == "float":
        # the table stays float with its 16 -Inf, nothing more non-finite is written; ranges from finite values
        assert _nonfinite(model).get(TABLE) == 16
        assert nonfinite_count(model) == nonfinite_count(onnx.load(str(source))) == 17  # and the mask's -Inf
        assert report.calibration["nonfinite_values"]  # the NaN rows, counted
        assert converted_snr >= 10.0, f"{converted_snr:.1f} dB"  # measured 46.9 dB
    else:
        source_snr = snr_db(want, run_ort(source, held_out))
        # measured, source → converted: qdq 14.1 → 16.0 dB, qop 14.1 → 15.8, qdq-linear 43.7 → 47.5
        assert converted_snr >= source_snr - 1.0, f"{form}: {converted_snr:.1f} dB vs source {source_snr:.1f} dB"
    if form in ("qdq", "qop"):  # the table quantized with scale Inf: read as the nearest finite thing, reported
        assert any("scale inf" in a["what"] and "bias.weight_quantized" in a["what"] for a in report.approximated)


@pytest.mark.parametrize("form", FORMS)
def test_check_agrees_with_convert_on_the_inf_bias_table(form):
    """check names no blocker convert would leave: the Inf scales are ones convert lifts (its 'qdq-scale'
    findings are fixable), and no weight is refused (the float table was, as a non-finite weight)."""
    report = check_model(DATA / f"{form}.onnx", CheckOptions(trt="off"))
    assert all(f.fixable for f in report.findings if f.severity.value == "blocker"), \
        [(f.rule, f.node, f.fix) for f in report.findings if not f.fixable]
    assert not [f for f in report.findings if "convert refuses" in (f.fix or "")]


def test_a_tensor_holding_inf_that_would_be_quantized_stays_float(tmp_path, reference):
    """--include-ops Softmax asks for the Softmax input quantized: it holds the mask's -Inf, which int8 would turn
    into -127·scale (22 dB instead of 47 when it was quantized); it stays float and the report names it."""
    held_out, want = reference
    out = tmp_path / "softmax.onnx"
    report = convert(DATA / "float.onnx", out, ConvertOptions(
        calibration=CalibrationOptions(data=str(DATA / "calib.npz")), placement=PlacementOptions(include_ops="Softmax"),
        progress=False))
    model = onnx.load(str(out))
    softmax_input = next(n.input[0] for n in model.graph.node if n.op_type == "Softmax")
    assert report.calibration["infinite_left_in_float"] == [softmax_input]
    assert softmax_input not in _quantized(model)
    assert snr_db(want, run_ort(out, held_out)) >= 40.0
    assert_tensorrt_ready(out)
    assert json.loads(report.to_json())["calibration"]["nonfinite_values"][softmax_input] > 0
    assert "kept in float for their ±Inf: 1" in report.summary()


# ---- what is still refused (G3, G4)

def _sqrt_model(path: Path, positive: bool = False) -> Path:
    """x ─ MatMul(W) ─ Sqrt ─ y: NaN wherever x·W < 0 (the source's own outputs are NaN); ``positive``: |W|."""
    w = np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32)
    w = np.abs(w) if positive else w
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Sqrt", ["h"], ["y"], name="sqrt")],
        "sqrt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [onnx.numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_source_whose_own_outputs_are_nan_is_refused_saying_so(tmp_path):
    model = _sqrt_model(tmp_path / "sqrt.onnx")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(1).normal(size=(4, 1, 16)).astype(np.float32))
    with pytest.raises(CalibrationDataError, match=r"the source model itself outputs NaN on feed 0 \(output 'y'\)"):
        convert(model, tmp_path / "out.onnx", ConvertOptions(
            calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False))
    assert not (tmp_path / "out.onnx").exists()


def test_a_feed_on_which_the_source_outputs_nan_is_skipped_and_counted(tmp_path):
    model = _sqrt_model(tmp_path / "sqrt.onnx", positive=True)
    x = np.abs(np.random.default_rng(1).normal(size=(4, 1, 16))).astype(np.float32)
    x[2] = -1.0  # x·|W| < 0 everywhere: the source outputs NaN on feed 2 only
    np.savez(tmp_path / "calib.npz", x=x)
    report = convert(model, tmp_path / "out.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False))
    assert (report.calibration["skipped_feeds"], report.calibration["feeds"]) == (1, 3)


def test_nan_in_a_weight_that_is_quantized_is_still_refused(tmp_path):
    model = _sqrt_model(tmp_path / "sqrt.onnx")
    m = onnx.load(str(model))
    w = onnx.numpy_helper.to_array(m.graph.initializer[0]).copy()
    w[3, 4] = np.nan
    m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w, "w"))
    onnx.save(m, str(model))
    with pytest.raises(UnsupportedPatternError, match="weight 'w' holds 1 non-finite value"):
        convert(model, tmp_path / "out.onnx", ConvertOptions(calibration=CalibrationOptions(random=2), progress=False))


# ---- the observers: ranges from the finite values, counted

def test_range_observer_takes_its_range_from_the_finite_values_and_counts_the_rest():
    obs = RangeObserver(CalibMethod.PERCENTILE)
    obs.update(np.array([[1.0, -2.0, -np.inf], [np.nan, np.nan, np.nan]], np.float32))
    obs.update(np.array([0.5, np.inf], np.float32))
    assert (obs.lo, obs.hi, obs.count) == (-2.0, 1.0, 3)
    assert (obs.nonfinite, obs.infinite) == (5, 2)
    assert obs.amax(method=CalibMethod.MAX) == 2.0


def test_channel_max_ignores_a_nan_row():
    obs = ChannelMaxObserver()
    obs.update(np.array([[1.0, -3.0], [np.nan, np.nan], [2.0, np.inf]], np.float32))
    assert obs.max.tolist() == [2.0, 3.0]


def test_a_constant_dequantized_with_an_inf_scale_reads_0_at_its_zero_point():
    """onnxruntime quantizes a table holding -Inf with scale Inf (every code at the zero point): 0·Inf would be
    NaN; the lifted constant reads 0 there and keeps the ±Inf of any other code."""
    got = dequantized(np.array([0, 2, -1, 0]), np.array(np.inf))
    assert got.tolist() == [0.0, np.inf, -np.inf, 0.0]
    assert dequantized(np.array([0, 2]), np.array([0.5, 0.25])).tolist() == [0.0, 0.5]
