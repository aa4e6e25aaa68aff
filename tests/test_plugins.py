"""trt-bridge's plugins with TensorRT-RTX (no GPU): the DynamicInt8Gemm plugin's fields, its registration for the
commands that parse, build and run engines (--plugins and the engine's sidecar), and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import quantize_dynamic, save
from onnx import TensorProto, helper, numpy_helper
from trt_bridge.plugins.plugin import PluginFieldError, weights_from_fields
from trt_bridge.plugins.registry import BUILTIN, load_plugin_files, plugin_problem, sidecar_plugins

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.dynamic_gemm import DOMAIN, OP_TYPE, decompose, plugin_attributes
from trt_bridge.runtime.session import session
from trt_bridge.tensorrt import import_tensorrt
from trt_bridge.tensorrt.parse import parse

K, N = 8, 4


def _fields(**change) -> list[tuple[str, np.ndarray]]:
    fields = {"weight": np.arange(K * N, dtype=np.int8) - 16, "out_features": np.array([N], np.int32),
              "weight_zero_point": np.array([3], np.int32), "weight_scale": np.full(N, 0.5, np.float32),
              "bias": np.ones(N, np.float32), "granularity": np.frombuffer(b"token\0", np.int8)}
    fields.update(change)
    return [(k, v) for k, v in fields.items() if v is not None]


def _plugin_model(granularity="tensor", x_type=TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    """x [2, K] ─ DynamicInt8Gemm ─ y [2, N]"""
    rng = np.random.default_rng(0)
    made = plugin_attributes(rng.integers(-128, 128, (K, N)).astype(np.int8), np.array(2), np.array(0.01),
                             rng.standard_normal(N).astype(np.float32), granularity)
    made.update(attrs)
    node = helper.make_node(OP_TYPE, ["x"], ["y"], name="gemm", domain=DOMAIN, **made)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_type, [2, K])],
                              [helper.make_tensor_value_info("y", x_type, [2, N])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def test_fields_make_the_weights():
    w = weights_from_fields(_fields())
    assert (w["k"], w["n"], w["granularity"]) == (K, N, "token")
    assert w["weight"].shape == (K, N) and w["weight"].dtype == np.int8
    assert weights_from_fields(_fields(bias=None))["bias"] is None


@pytest.mark.parametrize(("change", "message"), [
    ({"weight": None}, "missing attribute"),
    ({"out_features": np.array([5], np.int32)}, "do not describe one"),
    ({"weight_scale": np.full(3, 0.5, np.float32)}, "do not describe one"),
    ({"weight_scale": np.array([0.0], np.float32)}, "finite and positive"),
    ({"bias": np.array([np.nan] * N, np.float32)}, "finite"),
    ({"weight_zero_point": np.array([200], np.int32)}, "int8 values"),
    ({"granularity": np.frombuffer(b"row\0", np.int8)}, "granularity 'row'"),
])
def test_bad_fields_are_refused_with_a_reason(change, message):
    with pytest.raises(PluginFieldError, match=message):
        weights_from_fields(_fields(**change))


@pytest.mark.parametrize("granularity", ["tensor", "token"])
@pytest.mark.parametrize("x_type", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["fp32", "fp16"])
def test_a_plugin_model_parses_builds_and_runs_as_its_decomposition(tmp_path, granularity, x_type):
    from trt_bridge.tensorrt.build import build_engine

    path = save(_plugin_model(granularity, x_type), tmp_path / "plugin.onnx")
    assert parse(path).ok
    assert len(build_engine(path, compute_capability="SM89")) > 0
    x = np.random.default_rng(1).standard_normal((2, K)).astype(np.float16 if x_type == TensorProto.FLOAT16
                                                                 else np.float32)
    y = session(path).run(None, {"x": x})[0]
    assert y.dtype == x.dtype and y.shape == (2, N) and np.all(np.isfinite(y))
    plain = decompose(onnx.load(str(path)))
    assert not any(n.domain == DOMAIN for n in plain.graph.node)


def test_a_node_with_bad_attributes_is_rejected_by_the_parser(tmp_path):
    bad = _plugin_model(weight_scale=numpy_helper.from_array(np.array([-1.0], np.float32), "weight_scale"))
    path = save(bad, tmp_path / "bad.onnx")
    result = parse(path)
    assert not result.ok and any("plugin" in e.lower() for e in result.errors)


def test_build_records_the_plugin_in_the_sidecar_and_registers_it_again(tmp_path):
    fpath = save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    out = tmp_path / "plugin.onnx"
    convert(dpath, out, ConvertOptions(activations=ActivationOptions("dynamic", "token"), progress=False))
    engine = tmp_path / "plugin.engine"
    result = subprocess.run([sys.executable, "-m", "trt_bridge", "build", str(out), "-o", str(engine),
                             "--compute-capability", "8.9", "-q"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    recorded = json.loads(Path(f"{engine}.json").read_text())["plugins"]
    assert recorded == [{"source": BUILTIN, "name": OP_TYPE, "version": "1", "namespace": "trt_bridge"}]
    trt = import_tensorrt()
    assert [r.source for r in sidecar_plugins(trt, recorded)] == [BUILTIN]


def test_plugin_files(tmp_path):
    trt = import_tensorrt()
    with pytest.raises(TrtBridgeError, match="no such file"):
        load_plugin_files(trt, [tmp_path / "missing.so"])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(TrtBridgeError, match="running it failed.*no GPU here"):
        load_plugin_files(trt, [broken])
    fine = tmp_path / "mine.py"
    fine.write_text("LOADED = True\n")
    record, = load_plugin_files(trt, [fine])
    assert record.source == str(fine.resolve()) and len(record.sha256) == 64
    # an engine's sidecar names the file: gone, or changed since, is refused with the fix
    listed = [record.to_dict()]
    fine.write_text("LOADED = False\n")
    with pytest.raises(TrtBridgeError, match="changed since the engine was built"):
        sidecar_plugins(trt, listed)
    fine.unlink()
    with pytest.raises(TrtBridgeError, match="pass its new path with --plugins"):
        sidecar_plugins(trt, listed)


def test_cli_refuses_a_missing_plugin_file_in_one_line(tmp_path):
    path = save(_plugin_model(), tmp_path / "plugin.onnx")
    result = subprocess.run([sys.executable, "-m", "trt_bridge", "build", str(path), "-o", str(tmp_path / "e"),
                             "--compute-capability", "8.9", "--plugins", str(tmp_path / "nope.so")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "nope.so: no such file" in result.stderr and "Traceback" not in result.stderr


def test_the_plugin_is_available_here():
    assert plugin_problem(import_tensorrt()) is None
    assert "not installed" in plugin_problem(None)


@pytest.mark.parametrize("granularity", ["tensor", "token"])
@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
def test_the_kernels_reference_is_the_decomposition_bit_for_bit(granularity, per_column):
    """The numpy reference the GPU kernels are held to (plugins/reference.py) computes what onnxruntime computes
    for the node's decomposition (and onnx's exact reference evaluator, whatever the CPU)."""
    from onnx.reference import ReferenceEvaluator
    from trt_bridge.plugins import reference

    rng = np.random.default_rng(5)
    k, n = 96, 40
    weight = rng.integers(-128, 128, (k, n)).astype(np.int8)
    zero_point = rng.integers(-4, 5, n if per_column else 1).astype(np.int32)
    scale = rng.uniform(1e-3, 1e-2, n if per_column else 1).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    node = helper.make_node(OP_TYPE, ["x"], ["y"], name="gemm", domain=DOMAIN,
                            **plugin_attributes(weight, zero_point, scale, bias, granularity))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    sess, exact = session(model), ReferenceEvaluator(decompose(model))
    for scale_of_x in (0.01, 1.0, 40.0):
        x = (rng.standard_normal((3, 7, k)) * scale_of_x).astype(np.float32)
        x[0, 0] = 0  # an all-zero row: scale 1 in token mode
        want = reference.dynamic_gemm(x, weight, np.broadcast_to(zero_point, n), np.broadcast_to(scale, n), bias,
                                      granularity)
        assert np.array_equal(exact.run(None, {"x": x})[0], want)
        assert np.array_equal(sess.run(None, {"x": x})[0], want)


def test_pipeline_with_dynamic_activations(tmp_path):
    """A manifest's convert table takes activations: dynamic; the pipeline converts without calibration data,
    checks, verifies against the float model, and builds an SM 8.9 engine whose sidecar lists the plugin."""
    save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "dynamic.onnx", per_channel=True)
    np.savez(tmp_path / "eval.npz", x=samples.sequence_feeds(4, 2, 16, 64)[:, 0])
    (tmp_path / "m.yaml").write_text(
        "output: out\nmodels:\n  - name: enc\n    source: dynamic.onnx\n    reference: float.onnx\n"
        "    eval_data: eval.npz\n    convert: {activations: dynamic, dynamic_granularity: token}\n"
        "    gates: {min_snr: 25}\n    bench: {iterations: 3, warmup: 1}\n"
        "targets:\n  - name: ada\n    compute_capabilities: ['8.9']\n")
    result = subprocess.run([sys.executable, "-m", "trt_bridge", "pipeline", "m.yaml", "-q"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = {(s["step"], s["target"]): s["status"] for s in
             json.loads((tmp_path / "out" / "pipeline.json").read_text())["steps"]}
    for key in [("convert", None), ("check", None), ("verify", None), ("build", "ada")]:
        assert steps[key] == "passed", (key, steps)
    sidecar = json.loads((tmp_path / "out" / "enc" / "enc.ada.engine.json").read_text())
    assert [p["name"] for p in sidecar["plugins"]] == [OP_TYPE]


def test_dynamic_activations_on_a_model_without_dynamic_matmuls_says_so(tmp_path, caplog):
    """A static Q/DQ source: nothing for the plugin (its float MatMuls stay as the quantizer left them)."""
    from helpers import quantize_static
    from onnxruntime.quantization import QuantFormat

    fpath = save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    feeds = [{"x": f} for f in samples.sequence_feeds(8, 1, 16, 64)]
    qpath = quantize_static(fpath, tmp_path / "qdq.onnx", feeds, quant_format=QuantFormat.QDQ)
    with caplog.at_level("WARNING", logger="trt_bridge"):
        report = convert(qpath, tmp_path / "out.onnx", ConvertOptions(activations=ActivationOptions("dynamic"),
                                                                      progress=False))
    assert report.plugin["layers"] == []
    assert "found no MatMul to put into the plugin" in caplog.text


@pytest.mark.parametrize(("change", "in_check", "in_build"), [
    ({"granularity": "row"}, "granularity 'row' is not one of tensor, token", "Could not create the plugin"),
    ({"k": K + 1}, f"has {K + 1} features, its weight {K} rows", f"input has {K + 1} features"),
], ids=["granularity", "features"])
def test_an_inconsistent_plugin_node_is_refused_everywhere(tmp_path, change, in_check, in_build):
    """check names the node (a blocker), build exits 1 with the reason, verify refuses to run it: no traceback,
    no engine, no result."""
    from trt_bridge.checks import check_model

    model = _plugin_model()
    if "granularity" in change:
        attr = next(a for a in model.graph.node[0].attribute if a.name == "granularity")
        attr.s = change["granularity"].encode()
    if "k" in change:
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = change["k"]
    path = save(model, tmp_path / "bad.onnx")
    report = check_model(path)
    assert not report.ready and any(in_check in f.why for f in report.blockers)

    def run(*argv):
        result = subprocess.run([sys.executable, "-m", "trt_bridge", *argv], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        return result.stderr

    assert in_build in run("build", str(path), "-o", str(tmp_path / "bad.engine"), "--compute-capability", "8.9")
    assert not (tmp_path / "bad.engine").exists()
    assert "error" in run("verify", str(path), str(path), "--random", "2")


def test_enqueue_hands_the_kernels_what_tensorrt_gives(monkeypatch):
    """The runtime half of the plugin without a GPU: the weights go to the GPU once per context (at the first
    enqueue), and every enqueue launches the kernels on TensorRT's stream with its pointers, the row count of
    the last shape change, the input's type and the node's granularity. (tests/gpu runs the kernels themselves.)"""
    from trt_bridge.plugins import kernels
    from trt_bridge.plugins.plugin import plugin_classes

    calls = []

    class FakeKernels:
        def upload(self, packed, scale, bias):
            calls.append(("upload", packed.n, scale.shape, None if bias is None else bias.shape))
            return "device weights"

        def run(self, *args):
            calls.append(("run", *args))

    monkeypatch.setattr(kernels, "GemmKernels", FakeKernels)
    trt = import_tensorrt()
    creator = plugin_classes(trt)[1]()
    plugin = creator.create_plugin("gemm", _fields(), trt.TensorRTPhase.RUNTIME).attach_to_context(None)
    desc = trt.PluginTensorDesc()
    desc.dims, desc.type = trt.Dims([2, 3, K]), trt.DataType.HALF
    plugin.on_shape_change([desc], [desc])
    for stream in (7, 8):
        plugin.enqueue([desc], [desc], [1000], [2000], 3000, stream)
    assert calls == [("upload", N, (N,), (N,)),
                     ("run", 7, 1000, True, 6, "device weights", "token", 2000, 3000),
                     ("run", 8, 1000, True, 6, "device weights", "token", 2000, 3000)]
