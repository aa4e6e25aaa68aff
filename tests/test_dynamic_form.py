"""``--activations dynamic`` for compute capability 10.0+ (conversion/dynamic_form.py, issue 39 item 2): the plugin's
conversion and TensorRT's dynamic FP4 one are both measured against the source; the more accurate is written and
the report says which, with both scores."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_builds_at, quantize_dynamic, run_ort, save, snr_db

import trt_bridge
from trt_bridge import samples
from trt_bridge.conversion import dynamic_form
from trt_bridge.ir.dynamic_gemm import OP_TYPE
from trt_bridge.runtime.fp4_dynamic import OP as FP4_DYNAMIC


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """onnxruntime's quantize_dynamic of a 1-layer transformer block (hidden 64, 16 tokens), its float model and
    held-out feeds."""
    root = tmp_path_factory.mktemp("dynamic-form")
    float_path = save(samples.transformer_block(seed=0, hidden=64, heads=4, seq=16, layers=1), root / "float.onnx")
    dynamic = quantize_dynamic(float_path, root / "dynamic.onnx")
    np.savez(root / "calib.npz", x=samples.sequence_feeds(12, 0, 16, 64))
    return root, float_path, dynamic, [{"x": f} for f in samples.sequence_feeds(6, 9, 16, 64)]


def _ops(path):
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def test_the_plugin_stays_where_tensorrts_dynamic_fp4_measures_less_accurate(source):
    """Measured: the plugin 40.87 dB against the lifted source, TensorRT's dynamic FP4 (W4A4) 20.14 dB."""
    root, float_path, dynamic, held = source
    out = root / "chosen.onnx"
    report = trt_bridge.convert(dynamic, out, activations="dynamic", compute_capability="12.0",
                                calib_data=str(root / "calib.npz"), quiet=True)
    form = report.dynamic_form
    assert form["chosen"] == "plugin" and form["scores"]["fp4"] < form["scores"]["plugin"] - 10, form
    assert "calib.npz" in form["feeds"] and "the plugin stays" in form["reason"]
    assert "dynamic activations: plugin" in report.summary()
    ops = _ops(out)
    assert OP_TYPE in ops and FP4_DYNAMIC not in ops
    reference = run_ort(float_path, held)
    assert snr_db(reference, run_ort(out, held)) > 30


def test_tensorrts_dynamic_fp4_is_written_where_it_measures_at_least_as_accurate(source, monkeypatch):
    """The choice itself: with the FP4 candidate scored higher (``score`` patched: no model here favours FP4), the
    W4A4 conversion is written, no plugin left; it builds for SM 12.0 and stays near the float model."""
    root, float_path, dynamic, held = source
    real = dynamic_form.score
    monkeypatch.setattr(dynamic_form, "score", lambda ref, path, measure: real(ref, path, measure)
                        + (100.0 if path.stem == dynamic_form.FP4 else 0.0))
    out = root / "fp4.onnx"
    report = trt_bridge.convert(dynamic, out, activations="dynamic", compute_capability="12.0", calib_random=8,
                                quiet=True)
    assert report.dynamic_form["chosen"] == "fp4" and "no plugin needed" in report.dynamic_form["reason"]
    assert "8 random feeds" in report.dynamic_form["feeds"]
    ops = _ops(out)
    assert OP_TYPE not in ops and ops.count(FP4_DYNAMIC) >= 3
    assert snr_db(run_ort(float_path, held), run_ort(out, held)) > 12
    assert_builds_at(out, {"static": {"x": ((1, 16, 64),) * 3}}, compute_capability="12.0")


def test_no_target_or_an_older_one_keeps_the_plugin_unjudged(source):
    root, _, dynamic, _ = source
    for target in (None, "8.9"):
        out = root / f"plain-{target}.onnx"
        options = {"compute_capability": target} if target else {}
        report = trt_bridge.convert(dynamic, out, activations="dynamic", quiet=True, **options)
        assert report.dynamic_form is None and OP_TYPE in _ops(out)
