"""The example manifest (scripts/pipeline/example.yaml) end to end on this machine: every shared zoo model and the
built-in fixtures converted, checked, verified and benchmarked with onnxruntime, and built ahead of time for SM 8.9."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

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
