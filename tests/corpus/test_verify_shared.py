"""`verify` on the converted shared zoo models: its numbers are those of an independent onnxruntime run, and
--per-layer aligns and ranks real models' layers."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_tensorrt_ready, run_ort, snr_db
from test_shared_models import QOPERATOR_MODELS, _feeds

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.verification import VerifyOptions, verify


@pytest.mark.parametrize("name", QOPERATOR_MODELS)
def test_verify_matches_an_independent_snr(shared_models, tmp_path, name):
    source = shared_models / name
    out = tmp_path / "converted.onnx"
    convert(source, out, ConvertOptions(progress=False, check=False))
    feeds = _feeds(name, 4, seed=5)
    (input_name,) = feeds[0]
    np.savez(tmp_path / "eval.npz", **{input_name: np.stack([f[input_name] for f in feeds])})
    report = verify(source, out, VerifyOptions(data=str(tmp_path / "eval.npz"), progress=False,
                                               per_layer=True, layer_feeds=2))
    want = snr_db(run_ort(source, feeds), run_ort(out, feeds))
    assert report.feeds == 4
    assert report.outputs[0].snr_db == pytest.approx(want, abs=1e-6)
    if report.per_layer is not None:
        assert len(report.per_layer.layers) >= 3 and report.per_layer.suggestion
    assert_tensorrt_ready(out)
