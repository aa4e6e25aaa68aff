"""Precision as a value (trt_bridge/formats.py, place/formats.py, lower/qdq.py): each format's codes, the format
each annotation is lowered in, and the Q/DQ written for it (op types, code types, opsets), numerically equal to
onnxruntime and built by TensorRT-RTX for SM 8.9."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db
from onnx import TensorProto, helper

from trt_bridge.annotations import ActivationSpec, Annotations, ScaleSource, Site, WeightSpec
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.formats import FP4, FP8, INT4, INT8, code_format, code_limits, numpy_code_format
from trt_bridge.lift.weights import dequantize, quantize_blocks, quantize_weight
from trt_bridge.place.formats import FormatOptions, assign_formats
from trt_bridge.place.policies import PlacementOptions

RNG = np.random.default_rng(7)


def test_each_format_knows_its_codes():
    assert (INT8.qmax, FP8.qmax, INT4.qmax, FP4.qmax) == (127, 448.0, 7, 6.0)
    assert [f.min_opset for f in (INT8, FP8, INT4, FP4)] == [13, 19, 21, 23]
    assert not FP8.runs_on(8.6) and FP8.runs_on(8.9) and not FP4.runs_on(8.9) and FP4.runs_on(12.0)
    # saturating casts: nothing becomes NaN, integers round half to even
    np.testing.assert_array_equal(FP8.codes(np.array([1e6, -1e6, 0.5]), np.array(1.0)).astype(np.float32),
                                  [448, -448, 0.5])
    np.testing.assert_array_equal(INT4.codes(np.array([2.5, 3.5, 100.0, -100.0]), np.array(1.0)).astype(np.int8),
                                  [2, 4, 7, -7])
    assert code_limits(ml_dtypes.float8_e4m3fn) == (-448.0, 448.0) and code_limits(np.uint8) == (0.0, 255.0)
    assert code_format(TensorProto.FLOAT8E5M2).nearest is FP8 and not code_format(TensorProto.FLOAT8E5M2).exact
    assert code_format(TensorProto.UINT4).nearest is INT4 and code_format(TensorProto.INT32) is None
    assert numpy_code_format(ml_dtypes.int4).name == "int4" and numpy_code_format(np.float32) is None


def test_blocks_run_along_the_reduction_axis_and_dequantize_back():
    w = RNG.normal(size=(100, 24)).astype(np.float32)  # 100 rows: the last block of 32 is short
    codes, scale = quantize_weight(w, 1, np.float32, INT4, 32)  # MatMul weight [K, N]: channels on axis 1
    assert codes.dtype == INT4.dtype and scale.shape == (4, 24)
    back = dequantize(codes, scale, 0, 32)
    # each value within half a step of its block's scale, once clipped to the block's range [-8, 7] steps (the
    # scale search may clip a block's tails where that is nearer in squared error)
    steps = np.repeat(scale, 32, axis=0)[:100]
    assert np.all(np.abs(back - np.clip(w, -8 * steps, 7 * steps)) <= steps / 2 + 1e-6)
    gemm_codes, gemm_scale = quantize_blocks(w.T, 1, 32)  # Gemm transB weight [N, K]: blocks along axis 1
    np.testing.assert_array_equal(gemm_codes.T.astype(np.int8), quantize_blocks(w, 0, 32)[0].astype(np.int8))
    assert gemm_scale.shape == (24, 4)


def _mlp(tmp_path, k=64, n=48):
    """x[4, k] ─ MatMul(W1) ─ Relu ─ MatMul(W2) ─ y; and a Conv branch that --int4 leaves alone."""
    w1 = RNG.normal(0, 0.2, (k, n)).astype(np.float32)
    w2 = RNG.normal(0, 0.2, (n, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], "mm1"), helper.make_node("Relu", ["h"], ["r"], "relu"),
             helper.make_node("MatMul", ["r", "W2"], ["y"], "mm2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                              [onnx.numpy_helper.from_array(w1, "W1"), onnx.numpy_helper.from_array(w2, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return save(model, tmp_path / "mlp.onnx")


def test_int4_float_model_needs_no_data_and_keeps_activations_float(tmp_path):
    source = _mlp(tmp_path)
    out = tmp_path / "mlp.int4.onnx"
    report = convert(source, out, ConvertOptions(progress=False, formats=FormatOptions(weights="int4", block_size=32)))
    model = assert_qdq_contract(out)
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert {n.op_type for n in model.graph.node} == {"DequantizeLinear", "MatMul", "Relu"}  # no activation Q/DQ
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for dq in dqs:
        assert inits[dq.input[0]].dtype == INT4.dtype
        assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 32}
    assert {q["format"] for q in report.quantized} == {"int4"}
    assert report.check["headline"].endswith("INT4 weight-only") or "INT4 weight-only" in report.check["headline"]
    feeds = [{"x": RNG.normal(size=(4, 64)).astype(np.float32)} for _ in range(4)]
    # what the model computes is the float model with its weights rounded per block: exact to float32 rounding
    want = []
    for f in feeds:
        w1 = dequantize(*quantize_weight(onnx.numpy_helper.to_array(onnx.load(str(source)).graph.initializer[0]), 1,
                                         np.float32, INT4, 32), 0, 32)
        w2 = dequantize(*quantize_weight(onnx.numpy_helper.to_array(onnx.load(str(source)).graph.initializer[1]), 1,
                                         np.float32, INT4, 32), 0, 32)
        want.append(np.maximum(f["x"] @ w1, 0) @ w2)
    got = [o[0] for o in (run_ort(out, [f]) for f in feeds)]
    assert snr_db(want, got) > 100
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 15  # 4-bit weights: a coarse but useful model
    assert_tensorrt_ready(out)


def test_fp8_float_model_is_fp8_in_every_layer(tmp_path):
    source = _mlp(tmp_path)
    data = tmp_path / "calib.npz"
    np.savez(data, x=RNG.normal(size=(16, 4, 64)).astype(np.float32))
    out = tmp_path / "mlp.fp8.onnx"
    report = convert(source, out, ConvertOptions(progress=False, calibration=CalibrationOptions(data=str(data)),
                                                 formats=FormatOptions(activations="fp8")))
    model = assert_qdq_contract(out)
    assert model.opset_import[0].version >= 19
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    zero_types = {inits[n.input[2]].dtype.name for n in model.graph.node
                  if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    assert zero_types == {"float8_e4m3fn"}
    assert {q["format"] for q in report.quantized} == {"fp8"}
    feeds = [{"x": RNG.normal(size=(4, 64)).astype(np.float32)} for _ in range(4)]
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 20
    assert_tensorrt_ready(out)


def test_assign_formats_follows_the_flags_and_the_layers():
    x, w = gs.Variable("x", np.float32, [4, 8]), gs.Constant("W", np.ones((8, 8), np.float32))
    y = gs.Variable("y", np.float32, [4, 8])
    graph = gs.Graph([gs.Node("MatMul", "mm", inputs=[x, w], outputs=[y])], [x], [y])

    def annotated():
        ann = Annotations()
        ann.add_activation("x", Site("mm", 0), "q", 0.1, ScaleSource.MODEL)
        ann.add_weight(WeightSpec("W", [Site("mm", 1)], 1, "dq", codes=np.ones((8, 8), np.int8),
                                  scale=np.ones(8, np.float32), source=ScaleSource.EXACT_WEIGHTS))
        return ann

    ann = annotated()
    assert assign_formats(graph, ann, FormatOptions()) == []  # the lifted formats stay
    assert ann.weights["W"].codes is not None
    ann = annotated()
    changes = assign_formats(graph, ann, FormatOptions(activations="fp8"))
    assert ann.activations["x"].format is FP8 and ann.weights["W"].format is FP8
    assert ann.weights["W"].codes is None and ann.weights["W"].source is ScaleSource.REQUANTIZED
    assert {(c.kind, c.was, c.format) for c in changes} == {("activation", "int8", "fp8"), ("weight", "int8", "fp8")}
    ann = annotated()
    changes = assign_formats(graph, ann, FormatOptions(weights="int4", block_size=4))
    assert ann.weights["W"].format is INT4 and ann.weights["W"].block_size == 4
    assert "x" not in ann.activations  # weight-only: the source's activation Q/DQ of that layer dropped, reported
    assert ("activation", "none") in {(c.kind, c.format) for c in changes}


@pytest.mark.parametrize("kwargs, message", [
    ({"activations": "int4"}, "choose int8, fp8 or fp4"),
    ({"weights": "fp8"}, "only int4"),
    ({"block_size": 48}, "power of two"),
])
def test_bad_format_options_are_refused(kwargs, message):
    with pytest.raises(TrtBridgeError, match=message):
        FormatOptions(**kwargs)


def test_int4_on_a_model_without_matmul_weights_is_refused(tmp_path):
    w = RNG.normal(size=(8, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["y"], "conv")], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [onnx.numpy_helper.from_array(w, "W")])
    source = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "conv.onnx")
    with pytest.raises(TrtBridgeError, match="--int4 quantizes the constant 2-D weights of MatMul and Gemm"):
        convert(source, tmp_path / "out.onnx", ConvertOptions(progress=False, formats=FormatOptions(weights="int4")))
    assert not (tmp_path / "out.onnx").exists()


def test_what_placement_adds_to_an_fp8_source_is_fp8():
    x, w = gs.Variable("x", np.float32, [4, 8]), gs.Constant("W", np.ones((8, 8), np.float32))
    h, y = gs.Variable("h", np.float32, [4, 8]), gs.Variable("y", np.float32, [4, 8])
    graph = gs.Graph([gs.Node("MatMul", "mm", inputs=[x, w], outputs=[h]),
                      gs.Node("MatMul", "mm2", inputs=[h, w], outputs=[y])], [x], [y])
    ann = Annotations()
    ann.add_activation("x", Site("mm", 0), "q", 0.1, ScaleSource.MODEL)
    ann.activations["x"].format = FP8
    ann.activations["h"] = ActivationSpec("h", [Site("mm2", 0)], "mm2", placed=True)
    ann.add_weight(WeightSpec("W", [Site("mm", 1), Site("mm2", 1)], 1, "dq"))
    assign_formats(graph, ann, FormatOptions())
    assert ann.activations["h"].format is FP8 and ann.weights["W"].format is FP8


def test_int4_with_data_is_weight_only_and_respects_exclusions(tmp_path):
    """--int4 --calib-data: the MatMul weights INT4 (AWQ may round them), nothing else quantized (placement's INT8
    sites on the Conv dropped); --exclude-nodes keeps a MatMul float."""
    w = RNG.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w1, w2 = RNG.normal(0, 0.2, (8 * 36, 64)).astype(np.float32), RNG.normal(0, 0.2, (64, 16)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], "conv"), helper.make_node("Relu", ["c"], ["r"], "relu"),
             helper.make_node("Flatten", ["r"], ["f"], "flat"), helper.make_node("MatMul", ["f", "W1"], ["h"], "fc1"),
             helper.make_node("MatMul", ["h", "W2"], ["y"], "fc2")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              [onnx.numpy_helper.from_array(a, n) for a, n in ((w, "W"), (w1, "W1"), (w2, "W2"))])
    source = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "net.onnx")
    data = tmp_path / "calib.npz"
    np.savez(data, x=RNG.normal(size=(16, 1, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(
        progress=False, calibration=CalibrationOptions(data=str(data)), formats=FormatOptions(weights="int4"),
        placement=PlacementOptions(exclude_nodes="fc2")))
    model = assert_qdq_contract(out)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert "QuantizeLinear" not in {n.op_type for n in model.graph.node}
    assert len(dqs) == 1 and inits[dqs[0].input[0]].dtype == INT4.dtype  # fc1's weight only
    assert {q["format"] for q in report.quantized} == {"int4"}
    assert_tensorrt_ready(out)


def test_fp8_leaves_convolutions_tensorrt_has_no_fp8_kernel_for():
    """--fp8: a Conv with 16 or fewer channels on a side, or a filter over 32 taps, stays in the high precision
    (YOLOv8n: 32.1 → 34.5 dB, its stem and two 16-channel convs no longer FP8); others are FP8."""
    def conv(name, x, w_shape):
        y = gs.Variable(f"{name}_y", np.float32)
        return gs.Node("Conv", name, inputs=[x, gs.Constant(f"{name}_w", np.ones(w_shape, np.float32))], outputs=[y])

    x = gs.Variable("x", np.float32, [1, 32, 8, 8])
    nodes = [conv("wide", x, (32, 32, 3, 3)), conv("narrow", x, (16, 32, 3, 3)), conv("big", x, (32, 32, 7, 7))]
    graph = gs.Graph(nodes, [x], [n.outputs[0] for n in nodes])
    ann = Annotations()
    for n in nodes:
        ann.add_activation("x", Site(n.name, 0), "q", 0.1, ScaleSource.MODEL)
        ann.add_weight(WeightSpec(f"{n.name}_w", [Site(n.name, 1)], 0, n.name))
    changes = assign_formats(graph, ann, FormatOptions(activations="fp8"))
    assert ann.activations["x"].sites == [Site("wide", 0)] and set(ann.weights) == {"wide_w"}
    assert ann.weights["wide_w"].format is FP8
    reasons = {c.tensor: c.reason for c in changes if c.format == "none"}
    assert "16 output channels" in reasons["narrow_w"] and "49-tap filter" in reasons["big_w"]
    ann = Annotations()  # INT8 keeps them all
    for n in nodes:
        ann.add_activation("x", Site(n.name, 0), "q", 0.1, ScaleSource.MODEL)
    assign_formats(graph, ann, FormatOptions(activations="int8"))
    assert len(ann.activations["x"].sites) == 3


def _w4_per_channel(tmp_path):
    """x ─ MatMul(DQ(W int4 [64, 64], per-channel scale on axis 1)) ─ Gemm(DQ(V int4 [48, 64], axis 0), transB) ─ y:
    AIMET's W4 export (int4 codes in per-channel DequantizeLinear, opset 21)."""
    codes = {"w": RNG.integers(-8, 8, (64, 64)), "v": RNG.integers(-8, 8, (48, 64))}
    scales = {"w": RNG.uniform(0.01, 0.05, 64), "v": RNG.uniform(0.01, 0.05, 48)}
    inits = [helper.make_tensor(f"{n}_q", TensorProto.INT4, codes[n].shape, codes[n].reshape(-1).tolist())
             for n in codes] + [helper.make_tensor(f"{n}_s", TensorProto.FLOAT, [scales[n].size],
                                                   scales[n].astype(np.float32)) for n in scales]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w"], "dq_w", axis=1),
             helper.make_node("DequantizeLinear", ["v_q", "v_s"], ["v"], "dq_v", axis=0),
             helper.make_node("MatMul", ["x", "w"], ["h"], "fc1"),
             helper.make_node("Gemm", ["h", "v"], ["y"], "fc2", transB=1)]
    graph = helper.make_graph(nodes, "w4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 48])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return save(model, tmp_path / "w4.onnx"), codes, scales


def test_int4_keeps_a_sources_per_channel_int4_codes_as_blocks(tmp_path):
    """--int4 on int4 per-channel weights keeps the codes bit for bit in blocks (each channel's scale repeated per
    block): exact against onnxruntime running the source (it re-quantized them from the float values: 0.3–0.4 dB
    on AIMET's W4A8 MiniLM); without --int4 they stay exact INT8 per channel."""
    source, codes, scales = _w4_per_channel(tmp_path)
    feeds = [{"x": RNG.normal(size=(4, 64)).astype(np.float32)} for _ in range(4)]
    out = tmp_path / "int4.onnx"
    report = convert(source, out, ConvertOptions(formats=FormatOptions(weights="int4", block_size=32),
                                                 progress=False))
    assert {q["source"] for q in report.quantized} == {"exact-weights"} and not report.approximated
    model = assert_qdq_contract(out)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    dqs = {n.name: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    assert len(dqs) == 2 and {n.op_type for n in model.graph.node} == {"DequantizeLinear", "MatMul", "Gemm"}
    for dq in dqs.values():
        q, s = inits[dq.input[0]], inits[dq.input[1]]
        attrs = {a.name: a.i for a in dq.attribute}
        name = "w" if q.shape == (64, 64) else "v"
        axis = 0 if name == "w" else 1  # the blocks run along the reduction axis
        assert q.dtype == ml_dtypes.int4 and attrs == {"axis": axis, "block_size": 32}
        np.testing.assert_array_equal(q.astype(np.int64), codes[name])
        np.testing.assert_array_equal(s, np.repeat(np.expand_dims(scales[name].astype(np.float32), axis), 2, axis))
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 120
    assert_tensorrt_ready(out)
    plain = convert(source, tmp_path / "int8.onnx", ConvertOptions(progress=False))
    assert {q["source"] for q in plain.quantized} == {"exact-weights"}
    assert snr_db(run_ort(source, feeds), run_ort(tmp_path / "int8.onnx", feeds)) > 120
