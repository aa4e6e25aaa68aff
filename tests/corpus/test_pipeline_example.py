"""The example manifest (scripts/pipeline/example.yaml) end to end on this machine: every shared zoo model and the
built-in fixtures converted, checked, verified and benchmarked with onnxruntime, and built ahead of time for SM 8.9."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml
from helpers import run_ort, snr_db

from trt_bridge import samples

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "scripts" / "pipeline" / "example.yaml"


def test_example_manifest(shared_models, tmp_path):
    fixtures = tmp_path / "pipeline-example"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "pipeline" / "make_fixtures.py"), "--out", str(fixtures)],
                   check=True, capture_output=True, timeout=300)
    manifest = yaml.safe_load(EXAMPLE.read_text())
    for model in manifest["models"]:  # the example's paths, anchored here instead of beside the checkout
        for key in ("source", "reference", "calib_data", "eval_data"):
            if key in model:
                name = Path(model[key]).name
                model[key] = str((shared_models if "shared/models" in model[key] else fixtures) / name)
    manifest["output"] = str(tmp_path / "out")
    (tmp_path / "example.yaml").write_text(yaml.safe_dump(manifest))
    result = subprocess.run([sys.executable, "-m", "trt_bridge", "pipeline", str(tmp_path / "example.yaml"), "-q"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "pipeline.json").read_text())
    models = [m["name"] for m in manifest["models"]]
    built = {s["model"] for s in summary["steps"] if s["step"] == "build" and s["target"] == "ada"
             and s["status"] == "passed"}
    assert built == set(models)  # an ahead-of-time engine for every shared model and fixture
    for name in models:
        assert (tmp_path / "out" / name / f"{name}.ada.engine").stat().st_size > 0
    root = ET.parse(tmp_path / "out" / "pipeline.junit.xml").getroot()
    assert root.get("failures") == "0" and root.get("errors") == "0"
    assert len(root.findall("testsuite")) == len(models)
    latency = [r for s in summary["steps"] if s["step"] == "bench" for r in s["details"]["rows"]]
    assert len(latency) == 2 * len(models) and all(r["backend"] == "onnxruntime CPU" for r in latency)
    # the models with a float reference compute its function on inputs held out from calibration (seed 1) and
    # evaluation (seed 2), measured here apart from the pipeline's verify
    # (bar, measured dB); the engines above show TensorRT-RTX builds each
    held_out = {"conv_net": ([{"x": f} for f in samples.image_feeds(8, 3)], 32, 35.7),
                "encoder": ([{"x": f} for f in samples.sequence_feeds(8, 3, 16, 64)], 33, 36.7),
                "mnist-float": ([{"Input3": f} for f in samples.digit_feeds(8, 3)], 38, 42.2),
                "mnist-dynamic": ([{"Input3": f} for f in samples.digit_feeds(8, 3)], 33, 36.8)}
    checked = set()
    for model in manifest["models"]:
        if model["name"] in held_out:
            feeds, bar, measured = held_out[model["name"]]
            reference = run_ort(Path(model.get("reference", model["source"])), feeds)
            converted = run_ort(tmp_path / "out" / model["name"] / f"{model['name']}.int8.onnx", feeds)
            snr = snr_db(reference, converted)
            assert snr > bar, (model["name"], snr, measured)
            checked.add(model["name"])
    assert checked == set(held_out)
