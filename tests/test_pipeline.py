"""``trt-bridge pipeline``: a manifest run end to end on this machine (ahead-of-time engines with TensorRT-RTX,
engine runs skipped without a GPU), its JUnit XML, JSON and markdown, gates and manifest errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from helpers import quantize_dynamic, run_ort, save, snr_db
from test_cli import cli

from trt_bridge import samples
from trt_bridge.tensorrt import gpu_present

MANIFEST = """\
output: out
defaults:
  eval_data: eval.npz
  bench: {{iterations: 5, warmup: 1}}
models:
  - name: conv
    source: dynamic.onnx
    reference: float.onnx
    calib_data: calib.npz
    gates: {{min_snr: {min_snr}, min_cosine: 0.99}}
targets:
  - name: ada
    compute_capabilities: ["8.9"]
  - name: this-gpu
    gpu: true
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pipeline")
    save(samples.conv_net(), root / "float.onnx")
    quantize_dynamic(root / "float.onnx", root / "dynamic.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(root / "eval.npz", x=samples.image_feeds(8, 2))
    return root


def _run(workdir: Path, name: str, min_snr: float, *extra):
    manifest = workdir / f"{name}.yaml"
    manifest.write_text(MANIFEST.format(min_snr=min_snr).replace("output: out", f"output: {name}-out"))
    return cli("pipeline", manifest, *extra), workdir / f"{name}-out"


def test_manifest_end_to_end(workdir):
    result, out = _run(workdir, "pass", 25)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = {(s["step"], s["target"]): s for s in json.loads((out / "pipeline.json").read_text())["steps"]}
    assert [k for k in steps] == [("convert", None), ("check", None), ("verify", None), ("bench", None),
                                  ("build", "ada"), ("verify-engine", "ada"), ("bench-engine", "ada"),
                                  ("build", "this-gpu"), ("verify-engine", "this-gpu"), ("bench-engine", "this-gpu")]
    for key in [("convert", None), ("check", None), ("verify", None), ("bench", None), ("build", "ada")]:
        assert steps[key]["status"] == "passed", steps[key]
    # the ahead-of-time engine and its sidecar
    engine = out / "conv" / "conv.ada.engine"
    assert engine.stat().st_size > 0 and json.loads((out / "conv" / "conv.ada.engine.json").read_text())
    assert (out / "timing-cache.ada.bin").is_file()
    # the converted model computes the float one's function, measured here apart from the pipeline's verify
    held_out = [{"x": f} for f in samples.image_feeds(8, 3)]
    converted = run_ort(out / "conv" / "conv.int8.onnx", held_out)
    assert snr_db(run_ort(workdir / "float.onnx", held_out), converted) > 35  # measured 38.2 dB
    # what this machine cannot do is skipped, with the reason
    assert steps[("verify-engine", "ada")]["status"] == "skipped"
    assert "compute capability 8.9 runs on such a GPU only" in steps[("verify-engine", "ada")]["message"]
    if not gpu_present():
        assert steps[("build", "this-gpu")]["message"] == "the target is this machine's GPU, and this machine has none"
        assert steps[("bench-engine", "this-gpu")]["message"] == "no engine: build did not pass"
    # JUnit XML as a CI system reads it
    root = ET.parse(out / "pipeline.junit.xml").getroot()
    assert root.tag == "testsuites" and root.get("tests") == "10" and root.get("failures") == "0"
    cases = root.findall("./testsuite[@name='conv']/testcase")
    assert [c.get("name") for c in cases][:5] == ["convert", "check", "verify", "bench", "build [ada]"]
    assert int(root.get("skipped")) == sum(1 for c in cases if c.find("skipped") is not None) >= 3
    # the markdown summary: steps, accuracy and the onnxruntime latency table
    md = (out / "pipeline.md").read_text()
    assert md.startswith("## trt-bridge pipeline: PASS") and "### Accuracy" in md and "### Latency" in md
    assert "| conv | float.onnx | onnxruntime" in md and "| conv | conv.int8.onnx | onnxruntime" in md
    assert "[skipped] conv verify-engine [ada]" in result.stderr  # progress lines


def test_a_failing_gate_fails_the_run(workdir):
    result, out = _run(workdir, "fail", 99)
    assert result.returncode == 1
    root = ET.parse(out / "pipeline.junit.xml").getroot()
    failure = root.find("./testsuite/testcase[@name='verify']/failure")
    assert failure is not None and "< --min-snr 99" in failure.get("message")
    assert root.get("failures") == "1"
    assert "## trt-bridge pipeline: FAIL" in (out / "pipeline.md").read_text()


@pytest.mark.parametrize(("text", "message"), [
    ("models: []\n", "'models' must be a non-empty list"),
    ("models:\n  - {name: a, source: float.onnx, colour: red}\n", "models[0]: unknown key 'colour'"),
    ("models:\n  - {name: a, source: missing.onnx}\n", "models[0]: source"),
    ("models:\n  - {name: a, source: float.onnx}\ntargets:\n  - {name: t}\n",
     "targets[0]: give compute_capabilities (ahead of time) or gpu: true"),
    ("models:\n  - {name: a, source: float.onnx, gates: {min_snr: high}}\n", "gates.min_snr must be a number"),
    ("models: [\n", "not valid YAML"),
    ("models:\n  - {name: '..', source: float.onnx}\n", "name '..' may hold letters, digits"),
    ("models:\n  - {name: a, source: float.onnx}\ntargets:\n  - {name: ../x, gpu: true}\n", "name '../x' may hold"),
    ("defaults: {bench: {iterations: 5}}\nmodels:\n  - {name: a, source: float.onnx, bench: 5}\n",
     "models[0].bench: expected a mapping"),
])
def test_manifest_errors_name_the_key(workdir, text, message):
    manifest = workdir / "bad.yaml"
    manifest.write_text(text)
    result = cli("pipeline", manifest)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr, result.stderr


def test_the_example_manifest_is_valid():
    """scripts/pipeline/example.yaml parses (its fixtures and the shared models aside) and lists every shared model."""
    import yaml

    example = Path(__file__).resolve().parents[1] / "scripts" / "pipeline" / "example.yaml"
    data = yaml.safe_load(example.read_text())
    sources = {Path(m["source"]).name for m in data["models"]}
    assert {"mnist-12.onnx", "mnist-12-uint8.onnx", "mnist-12-int8.onnx", "mobilenetv2-12-int8.onnx",
            "mlperf-tiny-resnet8-int8.onnx", "mlperf-tiny-dscnn-kws-int8.onnx",
            "mlperf-tiny-autoencoder-int8.onnx"} <= sources
    assert [t["name"] for t in data["targets"]] == ["ada", "this-gpu"]


def test_junit_xml_holds_any_message():
    """Tool output can carry control characters, which XML 1.0 cannot: the report stays well-formed."""
    from trt_bridge.manifest.report import PipelineReport, Status, StepResult

    step = StepResult("a", "t", "build", Status.ERROR, 1.0, "bad \x1b[31mred\x00 <&>", {"error": "trace \x01"})
    report = PipelineReport("m.yaml", "out", [step])
    root = ET.fromstring(report.junit_xml())
    error = root.find("./testsuite/testcase/error")
    assert error.get("message") == "bad [31mred <&>" and error.text == "trace "
    assert "&lt;&amp;&gt;" in report.markdown()


def test_manifest_output_stays_inside_unless_given_on_the_command_line(tmp_path):
    """Issue 16: a manifest's `output` may not leave its folder (`../`, an absolute path elsewhere); `--output DIR`
    chooses any folder explicitly. A YAML alias is fine while the manifest stays small."""
    from trt_bridge.manifest.schema import ManifestError, load_manifest

    folder = tmp_path / "m"
    folder.mkdir()
    save(samples.conv_net(), folder / "float.onnx")
    body = "defaults: &d {calib_random: 2}\nmodels:\n  - {name: a, source: float.onnx, bench: {iterations: 3}}\n"
    for output in ("../out", str(tmp_path / "elsewhere"), "sub/../../out"):
        (folder / "m.yaml").write_text(f"output: '{output}'\n" + body)
        with pytest.raises(ManifestError, match="outside the manifest's folder"):
            load_manifest(folder / "m.yaml")
        assert load_manifest(folder / "m.yaml", tmp_path / "chosen").output == tmp_path / "chosen"
    (folder / "m.yaml").write_text("output: runs/today\n" + body)
    manifest = load_manifest(folder / "m.yaml")
    assert manifest.output == folder / "runs" / "today" and manifest.models[0].calib_random == 2


def test_the_converted_file_is_named_after_its_format(tmp_path):
    from trt_bridge.manifest import converted_name
    from trt_bridge.manifest.schema import load_manifest

    (tmp_path / "m.onnx").write_bytes(samples.conv_net().SerializeToString())
    (tmp_path / "m.yaml").write_text(
        "models:\n  - {name: a, source: m.onnx, calib_random: 2}\n"
        "  - {name: b, source: m.onnx, calib_random: 2, convert: {precision: fp8}}\n"
        "  - {name: c, source: m.onnx, convert: {weights: int4}}\n")
    names = [converted_name(m) for m in load_manifest(tmp_path / "m.yaml").models]
    assert names == ["a.int8.onnx", "b.fp8.onnx", "c.int4.onnx"]
