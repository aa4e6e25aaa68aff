"""Runtime ranges (lower/runtime_ranges.py, conversion/runtime_choice.py): an activation quantized on the range it has
in each inference, in standard ONNX ops around TensorRT's own INT8 layers. Each rewrite is checked against a numpy
reference of the same quantization (onnxruntime, Q/DQ simulated as TensorRT computes them) and built by
TensorRT-RTX."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from helpers import SHARED_MODELS, assert_tensorrt_ready, quantize_dynamic, run_exact, save, snr_db
from onnx import TensorProto, helper, numpy_helper
from test_cli import cli, error_message

from trt_bridge.annotations import ActivationSpec, Annotations, Site, WeightSpec
from trt_bridge.conversion import convert, runtime_choice
from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions, PrecisionOptions
from trt_bridge.lower import runtime_ranges
from trt_bridge.runtime.session import session
from trt_bridge.samples import conv_net, image_feeds


def _model(nodes, inputs, outputs, weights: dict, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "runtime", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _grid(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """x on its own 255-level grid per slice over ``axes`` (the range holds 0; its middle is a whole step)."""
    hi = np.maximum(x.max(axis=axes, keepdims=True), 0).astype(np.float64)
    lo = np.minimum(x.min(axis=axes, keepdims=True), 0).astype(np.float64)
    step = np.maximum((hi - lo) / 254, 2.0 ** -24)
    k = np.round((hi + lo) / (2 * step))
    return ((np.clip(np.round(x / step - k), -128, 127) + k) * step).astype(np.float32)


def _dequantized_weights(path) -> dict[str, np.ndarray]:
    """Every constant int8 weight of the converted model, dequantized, by the layer input it feeds."""
    model = onnx.load(str(path))
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in values and values[node.input[0]].ndim >= 2:
            q, scale = values[node.input[0]].astype(np.float32), values[node.input[1]]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            shape[axis] = -1
            found[node.output[0]] = q * (scale.reshape(shape) if scale.ndim else scale)
    return found


def _convert_on(tmp_path, model: onnx.ModelProto, name: str = "out.onnx", **precision):
    src = save(model, tmp_path / "float.onnx")
    out = tmp_path / name
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(random=2),
                                              activations=ActivationOptions(runtime_ranges="on"),
                                              precision=PrecisionOptions(**precision), progress=False, check=False))
    return out, report


def _activation_scales(path) -> list[float]:
    model = onnx.load(str(path))
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return [float(values[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear"]


CONVS = {  # name → (conv attributes, input shape, with bias)
    "padded-grouped-strided": ({"pads": [1, 2, 1, 0], "group": 2, "strides": [2, 1], "dilations": [1, 2]},
                               [2, 8, 12, 14], True),
    "no-bias-no-pads": ({}, [1, 8, 9, 9], False),
    "1d": ({"pads": [2, 2]}, [1, 8, 20], True),
}


@pytest.mark.parametrize(("variant", "opset"), [*((v, 17) for v in sorted(CONVS)),
                                                 ("padded-grouped-strided", 10), ("padded-grouped-strided", 19)])
def test_conv_matches_the_reference_and_builds(tmp_path, variant, opset):
    """Opset 10 writes Pad's pads and 17 ReduceMax's axes as attributes, 19 both as inputs."""
    attrs, shape, with_bias = CONVS[variant]
    rng = np.random.default_rng(1)
    group = attrs.get("group", 1)
    kernel = [3] * (len(shape) - 2)
    w = rng.standard_normal((4 * group, shape[1] // group, *kernel)).astype(np.float32) * 0.2
    weights = {"w": w, **({"b": rng.standard_normal(w.shape[0]).astype(np.float32)} if with_bias else {})}
    conv = helper.make_node("Conv", ["x", "w", *(["b"] if with_bias else [])], ["y"], name="conv", **attrs)
    model = _model([conv], [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights, opset)
    out, report = _convert_on(tmp_path, model)
    assert report.runtime_ranges["tensors"] == ["x"] and report.runtime_ranges["reason"] == "--runtime-ranges on"
    converted = onnx.load(str(out))
    ops = [n.op_type for n in converted.graph.node]
    assert {"ReduceMax", "ReduceMin", "Round", "QuantizeLinear", "DequantizeLinear"} <= set(ops)
    assert _activation_scales(out) == [1.0]  # the range lives outside the Q/DQ
    assert ("Pad" in ops) == any(attrs.get("pads", [0]))
    reduce_max = next(n for n in converted.graph.node if n.op_type == "ReduceMax")
    assert (len(reduce_max.input) == 2) == (opset >= 18)  # axes as an input from opset 18
    (layer,) = [n for n in converted.graph.node if n.op_type == "Conv"]
    assert not any(next((a.ints for a in layer.attribute if a.name == "pads"), [0]))
    assert len(layer.input) == 2  # the bias is added after the range is restored

    # a ReLU-like, one-sided input on one sample and a wide two-sided one on the other
    x = rng.standard_normal(shape).astype(np.float32)
    x[0] = np.maximum(x[0], -0.2) * 3
    if shape[0] > 1:
        x[1] *= 40
    (w_int8,) = _dequantized_weights(out).values()
    reference_model = _model([conv], model.graph.input, model.graph.output, {**weights, "w": w_int8}, opset)
    want = session(reference_model).run(None, {"x": _grid(x, tuple(range(1, len(shape))))})[0]
    got = session(out, simulate_qdq=True).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    float_out = session(model).run(None, {"x": x})[0]
    assert snr_db([float_out], [got]) > 30
    assert_tensorrt_ready(out)


def test_matmul_and_gemm_take_a_range_per_row(tmp_path):
    """x[2, 5, 64] ─ MatMul(W) ─ h ─ Reshape ─ Gemm(B', alpha, beta·C): each row on its own grid."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    b = rng.standard_normal((48, 64)).astype(np.float32) * 0.1  # transB: [N, K]
    c = rng.standard_normal(48).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
             helper.make_node("Reshape", ["h", "shape"], ["h2"], name="flat"),
             helper.make_node("Gemm", ["h2", "b", "c"], ["y"], name="gemm", transB=1, alpha=0.5, beta=2.0)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   {"w": w, "b": b, "c": c, "shape": np.array([10, 64], np.int64)})
    out, report = _convert_on(tmp_path, model)
    assert sorted(report.runtime_ranges["tensors"]) == ["h2", "x"]
    assert _activation_scales(out) == [1.0, 1.0]
    x = rng.standard_normal((2, 5, 64)).astype(np.float32) * np.geomspace(0.01, 10, 5, dtype=np.float32)[:, None]
    deq = _dequantized_weights(out)
    w_int8 = next(v for v in deq.values() if v.shape == w.shape)
    b_int8 = next(v for v in deq.values() if v.shape == b.shape)
    h = _grid(x, (-1,)) @ w_int8
    want = 0.5 * _grid(h.reshape(10, 64), (-1,)) @ b_int8.T + 2.0 * c
    got = session(out, simulate_qdq=True).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert_tensorrt_ready(out)


def test_a_sample_does_not_depend_on_its_batch(tmp_path):
    model = conv_net(channels=(8, 8))
    out, report = _convert_on(tmp_path, model)
    assert report.runtime_ranges["tensors"]
    x = image_feeds(2, seed=3)[:, 0]
    x[1] *= 50  # a batch mate with a far wider range
    run = session(out, simulate_qdq=True)
    together = run.run(None, {"x": x})[0]
    alone = run.run(None, {"x": x[:1]})[0]
    np.testing.assert_allclose(together[:1], alone, rtol=1e-5, atol=1e-6)
    assert_tensorrt_ready(out)


def test_float16_keeps_the_range_nodes_in_float32(tmp_path):
    model = conv_net(channels=(8, 8))
    out32, _ = _convert_on(tmp_path, model, "fp32.onnx")
    out16, report = _convert_on(tmp_path, model, "fp16.onnx", high_precision="fp16")
    kept = {k["node"] for k in report.precision["kept_in_float32"]}
    converted = onnx.load(str(out16))
    range_ops = [n.name for n in converted.graph.node if n.op_type in ("ReduceMax", "Round")]
    assert range_ops and set(range_ops) <= kept
    x = image_feeds(4, seed=5)[:, 0]
    want = session(out32, simulate_qdq=True).run(None, {"x": x})[0]
    got = session(out16, simulate_qdq=True).run(None, {"x": x})[0]
    assert snr_db([want], [got.astype(np.float32)]) > 35
    assert_tensorrt_ready(out16)
    assert_tensorrt_ready(out32)


def test_declines_with_a_reason():
    """A tensor another op reads, one read as a MatMul's second input, one whose scale a Concat shares."""
    x = gs.Variable("x", np.float32, [1, 4, 8, 8])
    h = gs.Variable("h", np.float32, [1, 4, 8, 8])
    w = gs.Constant("w", np.ones((4, 4, 1, 1), np.float32))
    y = gs.Variable("y", np.float32, None)
    nodes = [gs.Node("Conv", "conv", {}, [x, w], [h]), gs.Node("Add", "add", {}, [x, h], [y])]
    graph = gs.Graph(nodes, [x], [y], opset=17)
    index = ({n.name: n for n in graph.nodes}, graph.tensors())
    annotations = Annotations(weights={"w": WeightSpec("w", [Site("conv", 1)], 0, "conv")})
    spec = ActivationSpec("x", [Site("conv", 0), Site("add", 0)], "conv")
    assert "Add 'add' reads it as input 0" in runtime_ranges.match(*index, annotations, spec, {})
    spec = ActivationSpec("h", [Site("add", 1)], "add")
    assert "input 1" in runtime_ranges.match(*index, annotations, spec, {})
    spec = ActivationSpec("x", [Site("conv", 0)], "conv")
    assert isinstance(runtime_ranges.match(*index, annotations, spec, {}), runtime_ranges.Match)
    assert runtime_ranges.match(*index, annotations, spec, {"x": "shared"}) == "shared"


@pytest.fixture(scope="module")
def dynamic_source(tmp_path_factory):
    root = tmp_path_factory.mktemp("runtime-ranges")
    float_path = save(conv_net(channels=(8, 16)), root / "float.onnx")
    return float_path, quantize_dynamic(float_path, root / "dynamic.onnx")


def test_a_dynamic_source_converts_without_calibration_data(tmp_path, dynamic_source):
    """The source's own per-inference ranges: no data needed, and the output follows the source."""
    float_path, source = dynamic_source
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    rr = report.runtime_ranges
    assert rr["mode"] == "auto" and rr["tensors"] and rr["reason"].startswith("no calibration data")
    assert rr["considered"] == len(rr["tensors"]) + len(rr["declined"])
    assert report.remaining_blockers == []
    feeds = [{"x": f} for f in image_feeds(8, seed=9)]
    want = run_exact(source, feeds)
    got = [session(out, simulate_qdq=True).run(None, f)[0] for f in feeds]
    floats = [session(float_path).run(None, f)[0] for f in feeds]
    assert snr_db(want, got) > 30
    # its uint8 weights (zero point off 128) are requantized to symmetric int8: that, not the ranges, costs ~1 dB
    assert snr_db(floats, got) > snr_db(floats, want) - 1.5
    assert_tensorrt_ready(out)
    again = tmp_path / "again.onnx"
    convert(source, again, ConvertOptions(progress=False, check=False))
    assert again.read_bytes() == out.read_bytes()


def test_auto_keeps_runtime_ranges_where_inputs_change_scale(tmp_path, dynamic_source):
    """Feeds whose brightness spans 100×: one calibrated scale serves the dark ones badly, runtime ranges do not."""
    float_path, source = dynamic_source
    rng = np.random.default_rng(4)
    def feeds(count, seed):
        return image_feeds(count, seed) * np.geomspace(0.01, 1, count, dtype=np.float32)[rng.permutation(count)][
            :, None, None, None, None]
    np.savez(tmp_path / "calib.npz", x=feeds(32, 1))
    outputs = {}
    for mode in ("auto", "off"):
        out = tmp_path / f"{mode}.onnx"
        report = convert(source, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                     activations=ActivationOptions(runtime_ranges=mode),
                                                     progress=False, check=False))
        outputs[mode] = (out, report)
    auto = outputs["auto"][1].runtime_ranges
    assert auto["tensors"] and auto["scores"]["runtime"] >= auto["scores"]["static"]
    assert outputs["off"][1].runtime_ranges["tensors"] == [] and outputs["off"][1].runtime_ranges["reason"] == "off"
    held = [{"x": f} for f in feeds(16, 2)]
    floats = [session(float_path).run(None, f)[0] for f in held]
    scores = {mode: snr_db(floats, [session(out, simulate_qdq=True).run(None, f)[0] for f in held])
              for mode, (out, _) in outputs.items()}
    assert scores["auto"] > scores["off"] + 2, scores  # 41.4 against 38.5 dB
    assert_tensorrt_ready(outputs["auto"][0])
    assert_tensorrt_ready(outputs["off"][0])


def test_judged_beside_the_candidates_as_after_them(tmp_path, dynamic_source, monkeypatch):
    """Where every activation can have a runtime range, the runtime-range model does not depend on auto's method and
    is scored beside its candidates (one pipeline): the same score and the same output as made after the choice."""
    _, source = dynamic_source
    np.savez(tmp_path / "calib.npz", x=image_feeds(16, seed=5))
    options = ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False,
                             check=False)
    beside = convert(source, tmp_path / "beside.onnx", options)
    assert beside.runtime_ranges["declined"] == {}  # every dynamic activation can: judged beside
    monkeypatch.setattr(runtime_choice, "beside", lambda *args: {})
    after = convert(source, tmp_path / "after.onnx", options)
    assert beside.runtime_ranges == after.runtime_ranges
    assert beside.runtime_ranges["scores"]["runtime"] is not None
    assert (tmp_path / "beside.onnx").read_bytes() == (tmp_path / "after.onnx").read_bytes()


@pytest.mark.parametrize("fmt", ["trt-cache", "json", "fixed-point"])
def test_scales_export_says_runtime_ranges_have_no_static_scale(tmp_path, dynamic_source, fmt):
    """A model whose activations all have runtime ranges has no activation scale to export: the error says why and
    names the flag; the grid's scale 1 is never written as if it were a range."""
    _, source = dynamic_source
    out = tmp_path / "out.onnx"
    convert(source, out, ConvertOptions(progress=False, check=False))
    done = cli("scales", "export", out, "--format", fmt, "-o", tmp_path / "scales.out")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    msg = lines[0]
    assert msg.startswith("trt-bridge scales: error: ") and "runtime ranges" in msg
    assert "--runtime-ranges off" in msg and str(out) in msg
    assert not (tmp_path / "scales.out").exists()
    grids = runtime_ranges.grid_tensors(onnx.load(str(out)))
    assert grids and all(name.endswith("_grid") for name in grids)


def test_scales_export_leaves_runtime_ranges_out_of_a_mixed_model(tmp_path):
    """The input's scale imported from a scale file, the rest with runtime ranges (--runtime-ranges on): the cache
    holds the input's scale alone, and the summary says what was left out."""
    import json

    src = save(conv_net(channels=(8, 16)), tmp_path / "float.onnx")
    static = tmp_path / "static.onnx"
    assert cli("convert", src, "-o", static, "--calib-random", "4", "--runtime-ranges", "off", "-q",
               "--skip-check").returncode == 0
    assert cli("scales", "export", static, "--format", "json", "-o", tmp_path / "all.json").returncode == 0
    table = json.loads((tmp_path / "all.json").read_text())
    table["tensors"] = {k: v for k, v in table["tensors"].items() if k == "x" or v["kind"] == "weight"}
    (tmp_path / "input.json").write_text(json.dumps(table))
    out = tmp_path / "mixed.onnx"
    done = cli("convert", src, "-o", out, "--scales", tmp_path / "input.json", "--runtime-ranges", "on",
               "--skip-check", "--json", tmp_path / "report.json")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runtime_ranges"]["tensors"] and "x" not in report["runtime_ranges"]["tensors"]
    done = cli("scales", "export", out, "--format", "trt-cache", "-o", tmp_path / "calib.cache")
    assert done.returncode == 0, done.stderr
    assert "quantized with runtime ranges have no static scale and are left out" in done.stdout
    cache = (tmp_path / "calib.cache").read_text().splitlines()
    assert [line.split(":")[0] for line in cache[1:]] == ["x"]
    assert_tensorrt_ready(out)


def test_off_asks_for_calibration_data(tmp_path, dynamic_source):
    _, source = dynamic_source
    msg = error_message(cli("convert", source, "-o", tmp_path / "out.onnx", "--runtime-ranges", "off"))
    assert "--calib-data" in msg and "--runtime-ranges off" in msg
    done = cli("convert", source, "-o", tmp_path / "out.onnx", "--skip-check")
    assert done.returncode == 0, done.stderr
    assert "runtime ranges:" in done.stdout
    feeds = [{"x": f} for f in image_feeds(4, seed=6)]
    assert snr_db(run_exact(source, feeds), [session(tmp_path / "out.onnx", simulate_qdq=True).run(None, f)[0]
                                             for f in feeds]) > 30
    assert_tensorrt_ready(tmp_path / "out.onnx")


@pytest.mark.skipif(not (SHARED_MODELS / "mnist-12-uint8.onnx").is_file(), reason="../shared/models is not present")
def test_the_model_zoo_dynamic_mnist(tmp_path):
    """ONNX Model Zoo's dynamically quantized MNIST (ConvInteger, MatMulInteger): no calibration data."""
    source = SHARED_MODELS / "mnist-12-uint8.onnx"
    out = tmp_path / "mnist.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert report.runtime_ranges["tensors"] and report.remaining_blockers == []
    rng = np.random.default_rng(0)
    feeds = [{"Input3": (rng.random((1, 1, 28, 28)) * 255).astype(np.float32)} for _ in range(4)]
    assert snr_db(run_exact(source, feeds), [session(out, simulate_qdq=True).run(None, f)[0] for f in feeds]) > 30
    assert_tensorrt_ready(out)


#   x ─ Conv0 ─ Sigmoid ─ Split ─┬─ p ───────────────────────┐
#                                └─ q ─┬─ Conv1 ─ Relu ─ r1 ─ Concat ─ cat ─ Conv2 ─ y      (YOLOv8's C2f, small)
#                                      └─────────────────────┘
def _c2f() -> onnx.ModelProto:
    rng = np.random.default_rng(5)

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [w("w0", (16, 3, 3, 3)), w("b0", (16,)), w("w1", (8, 8, 3, 3)), w("b1", (8,)), w("w2", (16, 24, 1, 1)),
             w("b2", (16,)), numpy_helper.from_array(np.array([8, 8], np.int64), "split")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], "conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c0"], ["s0"], "act0"),
             helper.make_node("Split", ["s0", "split"], ["p", "q"], "split", axis=1),
             helper.make_node("Conv", ["q", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], "act1"),
             helper.make_node("Concat", ["p", "q", "r1"], ["cat"], "cat", axis=1),
             helper.make_node("Conv", ["cat", "w2", "b2"], ["y"], "conv2")]
    graph = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_cache_naming_part_of_a_concat_group_converts_without_data(tmp_path):
    """scales export, then convert SOURCE --scales CACHE with no data: the cache of a conversion with runtime ranges
    names only the Concat inputs that got a Q/DQ (YOLOv8n: '/model.18/Split_output_0' had none); the group shares
    one scale, so every member takes the one the cache gives (it failed: "have no static scale")."""
    float_path = save(_c2f(), tmp_path / "float.onnx")
    source = quantize_dynamic(float_path, tmp_path / "dynamic.onnx")
    np.savez(tmp_path / "calib.npz", x=image_feeds(8, seed=1, shape=(1, 3, 16, 16)))
    first = tmp_path / "first.onnx"
    done = cli("convert", source, "-o", first, "--calib-data", tmp_path / "calib.npz", "--runtime-ranges", "on",
               "--skip-check", "-q")
    assert done.returncode == 0, done.stderr
    assert cli("scales", "export", first, "--format", "trt-cache", "-o", tmp_path / "all.cache").returncode == 0
    lines = (tmp_path / "all.cache").read_text().splitlines()
    assert {line.split(":")[0] for line in lines[1:]} >= {"p", "q", "r1", "cat"}
    (tmp_path / "part.cache").write_text("\n".join(line for line in lines if not line.startswith("p:")) + "\n")
    out = tmp_path / "from-cache.onnx"
    done = cli("convert", source, "-o", out, "--scales", tmp_path / "part.cache", "--json", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    scales = {q["tensor"]: (q["scale"], q["source"]) for q in report["quantized"] if q["tensor"] in ("p", "q", "cat")}
    assert len({s for s, _ in scales.values()}) == 1 and {src for _, src in scales.values()} == {"file"}
    feeds = [{"x": f} for f in image_feeds(4, seed=2, shape=(1, 3, 16, 16))]
    floats = [session(float_path).run(None, f)[0] for f in feeds]
    assert snr_db(floats, [session(out).run(None, f)[0] for f in feeds]) > 25
    assert_tensorrt_ready(out)
    small = tmp_path / "small.cache"
    small.write_text(lines[0] + "\n")  # a cache naming none of them: the error says the file gives none
    msg = error_message(cli("convert", source, "-o", tmp_path / "none.onnx", "--scales", small,
                            "--runtime-ranges", "off"))
    assert "the scale file(s) give them none" in msg and "--calib-data" in msg
