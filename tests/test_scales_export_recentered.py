"""`scales export` gives a re-centred tensor back under its own name, with the range that covers it (issue 16):
a TensorRT cache (or JSON table) exported from a converted model converts the same source on its own.

    r ─ Sub(c) ─ Pad(−c) ─ Q/DQ(s_c) ─ Conv        exported as   r: (|c| + 127·s_c) / 127 = max(|lo|, |hi|) / 127
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db
from trt_bridge import samples
from trt_bridge.cli import main
from trt_bridge.scales.formats import read_scales


@pytest.fixture(autouse=True)
def _keep_log_levels():
    """The CLI (run in-process here) sets the trt_bridge logger's level; later tests expect it as it was."""
    import logging

    level = logging.getLogger("trt_bridge").level
    yield
    logging.getLogger("trt_bridge").setLevel(level)


@pytest.mark.parametrize("fmt", ["trt-cache", "json"])
def test_exported_scales_convert_the_source_alone(tmp_path, fmt):
    src = save(samples.conv_net(), tmp_path / "float.onnx")
    calib = samples.image_feeds(8, seed=1)
    np.savez(tmp_path / "calib.npz", x=calib)
    report = tmp_path / "report.json"
    assert main(["convert", str(src), "-o", str(tmp_path / "a.onnx"), "--calib-data", str(tmp_path / "calib.npz"),
                 "--report", str(report), "-q"]) == 0
    centred = json.loads(report.read_text())["recentered"]
    assert centred, "the fixture must re-centre something"
    exported = tmp_path / f"a.{fmt}"
    assert main(["scales", "export", str(tmp_path / "a.onnx"), "--format", fmt, "-o", str(exported), "-q"]) == 0
    table = read_scales(exported)
    ranges = json.loads(report.read_text())["calibration"]["ranges"]
    for r in centred:  # the original tensor's symmetric range, not the centred one
        want = max(abs(ranges[r["tensor"]]["min"]), abs(ranges[r["tensor"]]["max"]))
        assert table[r["tensor"]].amax == pytest.approx(want, rel=1e-6)
        assert not any(name.startswith(r["tensor"] + "_") for name in table.activations().entries)

    # the source converts from the exported scales alone, and exporting again gives the same scales
    assert main(["convert", str(src), "-o", str(tmp_path / "b.onnx"), "--scales", str(exported), "-q"]) == 0
    assert main(["scales", "export", str(tmp_path / "b.onnx"), "--format", fmt, "-o", str(tmp_path / f"b.{fmt}"),
                 "-q"]) == 0
    again = read_scales(tmp_path / f"b.{fmt}")
    assert {k: np.float32(e.amax / 127) for k, e in again.activations().entries.items()} == \
        {k: np.float32(e.amax / 127) for k, e in table.activations().entries.items()}
    assert_qdq_contract(tmp_path / "b.onnx")
    assert_tensorrt_ready(tmp_path / "b.onnx")
    feeds = [{"x": f} for f in samples.image_feeds(4, seed=7)]
    # measured 37.6 dB on this net (the exported symmetric scales, no re-centring): the bar is 3 dB under it
    assert snr_db(run_ort(src, feeds), run_ort(tmp_path / "b.onnx", feeds)) > 34.6
