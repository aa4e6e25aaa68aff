"""``trt-bridge convert MODEL --int8`` where nothing gives activation scales: refused before any work with the
choices named; messages never print an empty node name; the report's scale sources never print empty; bench's
CPU caveat under a quantized model's row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import quantize_dynamic, save
from onnx import TensorProto, helper, numpy_helper
from test_cli import cli, error_message

from trt_bridge.checks import CheckOptions, check_model
from trt_bridge.checks.findings import Finding, Severity
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions
from trt_bridge.conversion.report import ConversionReport
from trt_bridge.errors import CalibrationDataError, ModelLoadError
from trt_bridge.ir.model import load_model
from trt_bridge.samples import conv_net, image_feeds


def _unnamed_matmul_model() -> onnx.ModelProto:
    """x[N, 8] ─ MatMul(W [8, 4]) ─ Add(b) ─ Relu ─ MatMul(W2 [4, 2]) ─ y; no node has a name."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((4, 2)).astype(np.float32), "W2")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h0"]), helper.make_node("Add", ["h0", "b"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def float_conv(tmp_path) -> Path:
    return save(conv_net(channels=(8, 16)), tmp_path / "float.onnx")


def test_a_float_model_without_data_is_refused_before_any_work(float_conv, tmp_path):
    out = tmp_path / "out.onnx"
    before = float_conv.read_bytes()
    result = cli("convert", float_conv, "--int8", "-o", out, "--report", tmp_path / "r.json")
    msg = error_message(result)
    assert str(float_conv) in msg and "nothing was written" in msg
    assert "--calib-data" in msg and "'x' float32 [" in msg  # the inputs the data must hold, with their shapes
    assert "--scales FILE" in msg and "--calib-random N" in msg and "smoke test" in msg
    assert "--activations dynamic, which quantizes its 1 MatMul(s)" in msg  # the classifier head; the convs not
    assert not out.exists() and not (tmp_path / "r.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float.onnx"]
    assert float_conv.read_bytes() == before
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_the_message_counts_the_matmuls_dynamic_activations_would_take(tmp_path):
    path = save(_unnamed_matmul_model(), tmp_path / "mlp.onnx")
    msg = error_message(cli("convert", path, "-o", tmp_path / "out.onnx"))
    assert "--activations dynamic, which quantizes its 2 MatMul(s)" in msg
    assert "'x' float32 [N, 8]" in msg
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(CalibrationDataError, match="nothing was written"):  # the Python API raises the same
        convert(path, tmp_path / "out.onnx", ConvertOptions())


@pytest.mark.parametrize("given", ["data", "random", "dynamic"])
def test_a_float_model_with_a_scale_source_converts_as_before(given, float_conv, tmp_path):
    if given == "data":
        np.savez(tmp_path / "calib.npz", x=image_feeds(4, seed=0))
        options = ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), check=False)
    elif given == "random":
        options = ConvertOptions(calibration=CalibrationOptions(random=2), check=False)
    else:
        float_conv = save(_unnamed_matmul_model(), tmp_path / "mlp.onnx")
        options = ConvertOptions(activations=ActivationOptions(mode="dynamic"), check=False)
    report = convert(float_conv, tmp_path / "out.onnx", options)
    assert (tmp_path / "out.onnx").is_file()
    if given == "dynamic":
        assert report.plugin["layers"] == ["MatMul_0", "MatMul_3"]  # named as check names unnamed nodes
    else:
        assert report.quantized


def test_a_dynamic_source_without_data_or_runtime_ranges_names_every_choice(tmp_path):
    float_path = save(conv_net(channels=(8, 16)), tmp_path / "float.onnx")
    source = quantize_dynamic(float_path, tmp_path / "model.onnx")
    msg = error_message(cli("convert", source, "--runtime-ranges", "off", "-o", tmp_path / "out.onnx"))
    assert "no static scale" in msg and "nothing was written" in msg and "--runtime-ranges off" in msg
    assert "'x' float32 [" in msg and "--scales FILE" in msg and "--calib-random N" in msg
    assert not (tmp_path / "out.onnx").exists()


def test_unnamed_nodes_are_named_by_op_type_and_index_everywhere(tmp_path):
    """The model's own findings, convert's remaining blockers and load errors: never ''."""
    path = save(_unnamed_matmul_model(), tmp_path / "mlp.onnx")
    loaded = load_model(path)
    assert [n.name for n in loaded.graph.node] == ["MatMul_0", "Add_1", "Relu_2", "MatMul_3"]
    checked = check_model(path, CheckOptions())
    assert all(f.where and "''" not in f.where for f in checked.findings)
    assert any(f.rule == "not-int8" and f.where == "model" for f in checked.findings)
    assert "''" not in checked.summary()
    orphan = _unnamed_matmul_model()
    orphan.graph.node[2].input[0] = "nobody"
    with pytest.raises(ModelLoadError) as info:
        load_model(save(orphan, tmp_path / "orphan.onnx"))
    assert "node 'Relu_2' (Relu) reads 'nobody'" in str(info.value)


def test_a_finding_about_the_whole_model_reads_model():
    finding = Finding("not-int8", Severity.BLOCKER, "", "", [], "nothing is quantized", "", True)
    assert finding.where == "model" and finding.lines()[0] == "[not-int8] model: nothing is quantized"
    assert Finding("x", Severity.BLOCKER, "", "Conv", [], "why", "", False).where == "Conv (unnamed)"


def test_scale_sources_say_none_when_nothing_is_quantized():
    report = ConversionReport(input="a.onnx", output="b.onnx", source_opset=17, output_opset=17)
    line = next(x for x in report.summary().splitlines() if "scale sources" in x)
    assert line.rstrip().endswith("scale sources: none")


def test_bench_says_cpu_latency_of_a_quantized_model_is_no_tensorrt_estimate(tmp_path):
    float_path = save(conv_net(channels=(8, 16)), tmp_path / "float.onnx")
    source = quantize_dynamic(float_path, tmp_path / "model.onnx")
    result = cli("bench", float_path, source, "--iterations", "3", "--warmup", "1", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    assert "note: onnxruntime's CPU provider runs quantized (Q/DQ) models as simulated integer math" in result.stdout
    data = json.loads((tmp_path / "b.json").read_text())
    assert [r["simulated"] for r in data["rows"]] == [False, True] and len(data["notes"]) == 1
    float_only = cli("bench", float_path, "--iterations", "3", "--warmup", "1")
    assert float_only.returncode == 0 and "note:" not in float_only.stdout


def test_the_demo_and_readme_show_calibration_data_first():
    """The headline command a reader copies first carries its calibration data."""
    root = Path(__file__).resolve().parents[1]
    first = next(line for line in (root / "README.md").read_text().splitlines()
                 if line.startswith("$ trt-bridge convert"))
    assert "--calib-data" in first
