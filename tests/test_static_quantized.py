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
from trt_bridge.convert import ConvertOptions, convert
from trt_bridge.lift.qdq_pair import covering_scale
from trt_bridge.runtime import session

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
        assert {q["source"] for q in weights} == {"exact-int8-weights"}

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
    convert(qpath, plain, ConvertOptions(progress=False, recenter=False))
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
