"""Statically quantized models: onnxruntime's QOperator and QDQ formats
(lift/qoperator.py, lift/integer_passthrough.py, lift/dequantize_constant.py, lift/qdq_pair.py).

Every model is quantized by onnxruntime's own ``quantize_static``, converted with the model's
own scales, and checked for the op types left, the Q/DQ contract, accuracy against the float
model (at least the source's, less 1 dB) and a TensorRT-RTX parse and SM 8.9 build.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from helpers import (
    assert_qdq_contract,
    assert_tensorrt_ready,
    op_types,
    quantize_static,
    run_ort,
    save,
    snr_db,
)
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions, RangeOptions
from trt_bridge.lift.qdq_pair import covering_scale
from trt_bridge.place.policies import PlacementOptions, PlacementPolicy
from trt_bridge.runtime.session import session

FLOAT_OPS = {"Conv", "Clip", "MaxPool", "Add", "LeakyRelu", "Concat", "Sigmoid", "Mul", "AveragePool",
             "GlobalAveragePool", "Flatten", "Gemm", "Softmax", "QuantizeLinear", "DequantizeLinear", "Sub", "Pad",
             "Identity"}  # Identity: a float graph output that a DequantizeLinear used to produce


def _init(rng, name, shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


#  x[1,3,16,16] ─ Conv ─ Relu ─ MaxPool ─┬─ Conv ─ Add ─ LeakyRelu ─┬─ Conv(3x3) ─┐
#                                        └───────────┘               └─ Conv(1x1) ─ Concat ─┬─ Sigmoid ─ Mul ─┐
#                                                                                          └─────────────────┘
#  ─ AveragePool ─ GlobalAveragePool ─ Flatten ─ Gemm(transB) ─ Softmax ─ y[1,10]
def zoo_net(seed: int = 0) -> onnx.ModelProto:
    """A small net with every op onnxruntime's static quantizer has a QOperator form for."""
    rng = np.random.default_rng(seed)
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "W1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
        node("Relu", ["c1"], ["r1"], "relu1"),
        node("MaxPool", ["r1"], ["p1"], "pool1", kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["p1", "W2", "b2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
        node("Add", ["c2", "p1"], ["a1"], "residual"),
        node("LeakyRelu", ["a1"], ["l1"], "leaky", alpha=0.1),
        node("Conv", ["l1", "W3", "b3"], ["c3"], "conv3a", pads=[1, 1, 1, 1]),
        node("Conv", ["l1", "W4", "b4"], ["c4"], "conv3b"),
        node("Concat", ["c3", "c4"], ["cat"], "concat", axis=1),
        node("Sigmoid", ["cat"], ["sg"], "sigmoid"),
        node("Mul", ["cat", "sg"], ["sw"], "swish"),
        node("AveragePool", ["sw"], ["ap"], "avgpool", kernel_shape=[2, 2], strides=[2, 2]),
        node("GlobalAveragePool", ["ap"], ["gap"], "gap"),
        node("Flatten", ["gap"], ["flat"], "flatten"),
        node("Gemm", ["flat", "Wf", "bf"], ["logits"], "fc", transB=1),
        node("Softmax", ["logits"], ["y"], "softmax", axis=-1),
    ]
    inits = [_init(rng, "W1", (8, 3, 3, 3)), _init(rng, "b1", (8,)), _init(rng, "W2", (8, 8, 3, 3), 0.15),
             _init(rng, "b2", (8,)), _init(rng, "W3", (4, 8, 3, 3), 0.15), _init(rng, "b3", (4,)),
             _init(rng, "W4", (4, 8, 1, 1)), _init(rng, "b4", (4,)), _init(rng, "Wf", (10, 8)), _init(rng, "bf", (10,))]
    graph = helper.make_graph(nodes, "zoo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _outputs(path, feeds, simulate=True):
    sess = session(path, simulate_qdq=simulate)
    return [sess.run(None, f)[0] for f in feeds]


MS_OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
VARIANTS = [
    pytest.param(QuantFormat.QOperator, False, QuantType.QUInt8, QuantType.QUInt8, False, id="qop-u8-per-tensor"),
    pytest.param(QuantFormat.QOperator, True, QuantType.QUInt8, QuantType.QInt8, False, id="qop-u8-per-channel"),
    pytest.param(QuantFormat.QOperator, True, QuantType.QUInt8, QuantType.QUInt8, True, id="qop-reduce-range"),
    pytest.param(QuantFormat.QDQ, False, QuantType.QUInt8, QuantType.QUInt8, False, id="qdq-u8-per-tensor"),
    pytest.param(QuantFormat.QDQ, True, QuantType.QUInt8, QuantType.QInt8, False, id="qdq-u8-per-channel"),
    pytest.param(QuantFormat.QDQ, True, QuantType.QInt8, QuantType.QInt8, True, id="qdq-s8-reduce-range"),
]


@pytest.mark.parametrize("fmt, per_channel, act_type, weight_type, reduce_range", VARIANTS)
def test_zoo_net(tmp_path, fmt, per_channel, act_type, weight_type, reduce_range):
    fpath = save(zoo_net(), tmp_path / "float.onnx")
    calib = [{"x": f} for f in samples.image_feeds(32, 1, (1, 3, 16, 16))]
    qpath = quantize_static(fpath, tmp_path / "static.onnx", calib, quant_format=fmt, per_channel=per_channel,
                            activation_type=act_type, weight_type=weight_type, reduce_range=reduce_range)
    source = onnx.load(str(qpath))
    source_ops = Counter(n.op_type for n in source.graph.node)
    if fmt == QuantFormat.QOperator:
        families = {"QLinearAdd", "QLinearConcat", "QGemm", "QLinearSoftmax", "QLinearGlobalAveragePool",
                    "QLinearAveragePool", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu"}
        assert source_ops["QLinearConv"] == 4 and families <= set(source_ops)
    out = tmp_path / "converted.onnx"
    report = convert(qpath, out, ConvertOptions(progress=False))
    converted = assert_qdq_contract(out)
    assert op_types(converted) <= FLOAT_OPS
    # ReLU was folded into conv1's output quantizer (zero point at qmin): the lift keeps it as a Clip
    assert "Relu" not in source_ops and "Clip" in op_types(converted)
    # Every activation scale is the model's; weights kept exact where they fit int8
    assert {q["source"] for q in report.quantized if q["kind"] == "activation"} == {"model"}
    x_q = next(n for n in source.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    inits = {i.name: numpy_helper.to_array(i) for i in source.graph.initializer}
    x_scale = next(q["scale"] for q in report.quantized if q["tensor"] == "x")
    assert x_scale == pytest.approx(covering_scale(float(inits[x_q.input[1]]), inits[x_q.input[2]]), rel=1e-6)
    weights = [q for q in report.quantized if q["kind"] == "weight"]
    assert len(weights) == 5 and all(q["axis"] in (0, None) for q in weights)  # conv axis 0; Gemm transB → 0
    if weight_type == QuantType.QInt8:
        assert {q["source"] for q in weights} == {"exact-weights"}

    held_out = [{"x": f} for f in samples.image_feeds(16, 2, (1, 3, 16, 16))]
    reference = run_ort(fpath, held_out)
    snr_source = snr_db(reference, _outputs(qpath, held_out, simulate=False))
    snr_converted = snr_db(reference, run_ort(out, held_out))
    assert snr_converted >= snr_source - 1.0, (snr_source, snr_converted)
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("fmt", [QuantFormat.QOperator, QuantFormat.QDQ], ids=["qoperator", "qdq"])
def test_transformer_block(tmp_path, fmt):
    """QLinearMatMul / QDQ MatMuls of a transformer block (activation × activation in attention too)."""
    fpath = save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    calib = [{"x": f} for f in samples.sequence_feeds(16, 1, 16, 64)]
    qpath = quantize_static(fpath, tmp_path / "static.onnx", calib, quant_format=fmt, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    out = tmp_path / "converted.onnx"
    report = convert(qpath, out, ConvertOptions(progress=False))
    converted = assert_qdq_contract(out)
    matmuls = [n for n in converted.graph.node if n.op_type == "MatMul"]
    weight_dq = {n.output[0] for n in converted.graph.node if n.op_type == "DequantizeLinear"
                 and n.input[0] in {i.name for i in converted.graph.initializer}}
    # the six projections read int8 weights; the two attention products stay float (TensorRT placement)
    assert sum(m.input[1] in weight_dq for m in matmuls) == 6
    assert any("MatMul" in d.reason or "placement" in d.reason for d in report.left_in_float)
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    reference = run_ort(fpath, held_out)
    snr_source = snr_db(reference, _outputs(qpath, held_out, simulate=False))
    snr_converted = snr_db(reference, run_ort(out, held_out))
    assert snr_converted >= snr_source - 1.0, (snr_source, snr_converted)
    assert_tensorrt_ready(out)


def test_asymmetric_model_scales_are_recentred_to_full_resolution(tmp_path):
    """uint8 codes with a zero point cover [lo, hi]; symmetric int8 over max(|lo|, |hi|) would spend up
    to a bit of it (a ReLU output: exactly one). Centring on (lo + hi)/2, compensated exactly in the
    next conv's bias, keeps the source's step."""
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")  # conv ─ ReLU ─ conv ─ ReLU ─ conv ─ …
    calib = [{"x": f} for f in samples.image_feeds(32, 1)]
    qpath = quantize_static(fpath, tmp_path / "static.onnx", calib, quant_format=QuantFormat.QOperator,
                            per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    centred, plain = tmp_path / "centred.onnx", tmp_path / "plain.onnx"
    report = convert(qpath, centred, ConvertOptions(progress=False))
    convert(qpath, plain, ConvertOptions(ranges=RangeOptions(recenter=False), progress=False))
    assert len(report.recentered) >= 2
    assert all(r["amax_centered"] < 0.75 * r["amax_symmetric"] for r in report.recentered)
    assert "Sub" in op_types(centred) and "Sub" not in op_types(plain)
    assert {q["source"] for q in report.quantized if q["kind"] == "activation"} == {"model"}
    held_out = [{"x": f} for f in samples.image_feeds(16, 2)]
    reference = run_ort(fpath, held_out)
    snr_centred, snr_plain = snr_db(reference, run_ort(centred, held_out)), snr_db(reference, run_ort(plain, held_out))
    assert snr_centred > snr_plain + 1.0, (snr_plain, snr_centred)
    assert snr_centred >= snr_db(reference, _outputs(qpath, held_out, simulate=False)) - 1.0
    assert_tensorrt_ready(centred)


@pytest.mark.parametrize("fmt", [QuantFormat.QOperator, QuantFormat.QDQ], ids=["qoperator", "qdq"])
def test_intermediate_graph_output_keeps_per_channel_downstream(tmp_path, fmt):
    """A quantized tensor that is also a graph output (here r1) must stay a float output with its name,
    and the convs downstream keep their per-channel int8 weights."""
    model = samples.conv_net()
    r1 = next(v for v in onnx.shape_inference.infer_shapes(model).graph.value_info if v.name == "r1")
    model.graph.output.append(r1)
    fpath = save(model, tmp_path / "float.onnx")
    calib = [{"x": f} for f in samples.image_feeds(16, 1)]
    qpath = quantize_static(fpath, tmp_path / "static.onnx", calib, quant_format=fmt, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    out = tmp_path / "converted.onnx"
    report = convert(qpath, out, ConvertOptions(progress=False))
    converted = assert_qdq_contract(out)
    assert [o.name for o in converted.graph.output] == ["logits", "r1"]
    weights = {q["tensor"]: q for q in report.quantized if q["kind"] == "weight"}
    assert sum(1 for w in weights.values() if w["axis"] == 0 and isinstance(w["scale"], list)) == 3
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    reference = session(fpath).run(None, held_out[0])
    got = session(out).run(None, held_out[0])
    assert [g.shape for g in got] == [r.shape for r in reference]
    assert snr_db([reference[1]], [got[1]]) > 30  # the intermediate output itself
    assert_tensorrt_ready(out)


#  x[1,16,8,8] ─ ConvTranspose(W[16,16,2,2], stride 2) ─ Relu ─ Conv1x1 ─ y[1,16,16,16]
@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_conv_transpose_weight_is_per_channel_on_axis_1(tmp_path, per_channel):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "W", "b"], ["c"], "deconv", strides=[2, 2], kernel_shape=[2, 2]),
         helper.make_node("Relu", ["c"], ["r"], "relu"),
         helper.make_node("Conv", ["r", "W2"], ["y"], "conv", kernel_shape=[1, 1])], "deconv_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
        [_init(rng, "W", (16, 16, 2, 2), 0.2), _init(rng, "b", (16,), 0.1), _init(rng, "W2", (16, 16, 1, 1), 0.2)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    fpath = save(model, tmp_path / "float.onnx")
    calib = [{"x": rng.standard_normal((1, 16, 8, 8)).astype(np.float32)} for _ in range(16)]
    qpath = quantize_static(fpath, tmp_path / "qdq.onnx", calib, quant_format=QuantFormat.QDQ, per_channel=per_channel,
                            weight_type=QuantType.QInt8)
    out = tmp_path / "converted.onnx"
    report = convert(qpath, out, ConvertOptions(progress=False))
    assert_qdq_contract(out)
    weights = {q["tensor"].split("_")[0]: q for q in report.quantized if q["kind"] == "weight"}
    assert set(weights) == {"W", "W2"}
    if per_channel:
        assert weights["W"]["axis"] == 1 and len(weights["W"]["scale"]) == 16  # ConvTranspose: [C_in, C_out, k, k]
        assert weights["W2"]["axis"] == 0
    held_out = [{"x": rng.standard_normal((1, 16, 8, 8)).astype(np.float32)} for _ in range(8)]
    reference = run_ort(fpath, held_out)
    assert snr_db(reference, run_ort(out, held_out)) >= snr_db(reference, _outputs(qpath, held_out, False)) - 1.0
    assert_tensorrt_ready(out)


def _qlinear_unary_model(op: str, attrs: dict, out_shape: list[int], extra_inputs=()):
    """x ─ Q(s, z) ─ com.microsoft ``op`` (x, s, z, [extras], y_s, y_z) ─ DQ ─ y, all uint8."""
    ms = helper.make_node
    nodes = [ms("QuantizeLinear", ["x", "s", "z"], ["x_q"], "q"),
             ms(op, ["x_q", "s", "z", "ys", "yz"], ["y_q"], "qop", domain="com.microsoft", **attrs),
             ms("DequantizeLinear", ["y_q", "ys", "yz"], ["y"], "dq")]
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array(0.02, np.float32), "ys"),  # codes cover [-2, 3.1]
             numpy_helper.from_array(np.array(100, np.uint8), "yz")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=MS_OPSETS)
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op, attrs, out_shape", [
    ("QLinearSigmoid", {}, [2, 8, 6]),
    ("QLinearLeakyRelu", {"alpha": 0.2}, [2, 8, 6]),
    ("QLinearSoftmax", {"axis": -1, "opset": 13}, [2, 8, 6]),
])
def test_qlinear_unary_ops_are_exact(tmp_path, op, attrs, out_shape):
    """Each com.microsoft unary QLinear op becomes its float op between DQ and Q: the lifted model
    computes what onnxruntime's integer kernel computes, up to its rounding (within one output step)."""
    src = save(_qlinear_unary_model(op, attrs, out_shape), tmp_path / "src.onnx")
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(placement=PlacementOptions(policy=PlacementPolicy.PRESERVE),
                                              progress=False))
    assert [r.rule for r in report.rules][:1] == ["qoperator"]
    assert_qdq_contract(out)
    rng = np.random.default_rng(0)
    feeds = [{"x": (rng.standard_normal((2, 8, 6)) * 0.8).astype(np.float32)} for _ in range(4)]
    source = _outputs(src, feeds, simulate=False)
    got = run_ort(out, feeds)
    step = 0.02 * 255 / 127  # the converted output's symmetric int8 step (where it is quantized)
    assert max(float(np.abs(a - b).max()) for a, b in zip(source, got)) <= 1.5 * step
    assert_tensorrt_ready(out)


#  c:bool, x ─ Q ─┐, w ─ Q ─┐ ─ com.microsoft QLinearWhere ─ DQ ─ y
def test_qlinear_where(tmp_path):
    ms = helper.make_node
    nodes = [ms("QuantizeLinear", ["x", "s", "z"], ["x_q"], "qx"), ms("QuantizeLinear", ["w", "s", "z"], ["w_q"], "qw"),
             ms("QLinearWhere", ["c", "x_q", "s", "z", "w_q", "s", "z", "s", "z"], ["y_q"], "where",
                domain="com.microsoft"),
             ms("DequantizeLinear", ["y_q", "s", "z"], ["y"], "dq")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [4, 8]),
                                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
                               numpy_helper.from_array(np.array(128, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=MS_OPSETS)
    model.ir_version = 8
    src = save(model, tmp_path / "where.onnx")
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(placement=PlacementOptions(policy=PlacementPolicy.PRESERVE),
                                              progress=False))
    assert report.rules[0].rule == "qoperator" and "Where" in op_types(out)
    assert_qdq_contract(out)
    rng = np.random.default_rng(0)
    feeds = [{"c": rng.random((4, 8)) > 0.5, "x": rng.standard_normal((4, 8)).astype(np.float32),
              "w": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)]
    step = 0.02 * 128 / 127
    assert max(float(np.abs(a - b).max()) for a, b in zip(_outputs(src, feeds, False), run_ort(out, feeds))) <= step
    assert_tensorrt_ready(out)


def test_an_int32_bias_scale_below_float32s_normal_range_is_a_float_bias(tmp_path):
    # an int32 bias's scale is x_scale · w_scale: onnxruntime's QDQ EfficientNet and MobileViT wrote 1e-41 and
    # 5e-39 (subnormal); it is folded into a float bias, so the model converts (a NaN, zero or negative one is refused)
    fpath = save(zoo_net(), tmp_path / "float.onnx")
    calib = [{"x": f} for f in samples.image_feeds(32, 1, (1, 3, 16, 16))]
    qpath = quantize_static(fpath, tmp_path / "static.onnx", calib, quant_format=QuantFormat.QDQ, per_channel=False,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    model = onnx.load(str(qpath))
    inits = {i.name: i for i in model.graph.initializer}
    bias_dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
                   and inits.get(n.input[0]) is not None and inits[n.input[0]].data_type == TensorProto.INT32)
    inits[bias_dq.input[1]].CopyFrom(numpy_helper.from_array(np.array(1e-41, np.float32), bias_dq.input[1]))
    edited = save(model, tmp_path / "edited.onnx")
    out = tmp_path / "converted.onnx"
    convert(edited, out, ConvertOptions(progress=False))
    assert "DequantizeLinear" in op_types(out)
    held_out = [{"x": f} for f in samples.image_feeds(8, 2, (1, 3, 16, 16))]
    # what the edited source computes (its bias is now ~0), as onnxruntime runs it
    assert snr_db(_outputs(edited, held_out, simulate=False), run_ort(out, held_out)) > 28.0  # measured 31.1
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
