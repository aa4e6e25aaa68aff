"""The dynamic-quantization lift (lift/dynamic_integer.py), end to end through convert().

Every model here is quantized by onnxruntime's own ``quantize_dynamic`` (or built by
hand for other exporters' epilogues), converted, then checked for: the op types
left, the Q/DQ contract (int8, zero point 0, axes), numerical closeness to the float
model in onnxruntime, and that TensorRT-RTX parses and builds it ahead of time.

The tests at the end call the rule directly (``apply_rule``: match, then rewrite, on a small graph; a
decline that leaves graph and context as they were)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from apply_rule import (
    assert_same_outputs,
    build_model,
    declined,
    dynamic_grid_feed,
    lifted,
    ops_left,
    tensor_info,
)
from helpers import (
    assert_lift_is_exact,
    assert_qdq_contract,
    assert_tensorrt_ready,
    op_types,
    quantize_dynamic,
    run_exact,
    run_ort,
    save,
    snr_db,
)
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions, RangeOptions
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.lift.dynamic_integer import DynamicIntegerOp

#: the static conversion these tests check (a dynamic source would otherwise get runtime ranges)
STATIC = ActivationOptions(runtime_ranges="off")

# On Gaussian test feeds a static per-tensor scale (max over 512 calibration feeds) is up
# to ~1.7x coarser than the range a dynamic model measures on each feed, which costs up
# to ~4.6 dB here. That gap is the price of static INT8, not of the lift (checked exact by
# assert_lift_is_exact); the 1 dB bar of issue 2 is held on real models (tests/corpus).
STATIC_VS_DYNAMIC_DB = 5.0
REJECTED = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "Cast"}
VARIANTS = [
    pytest.param(False, QuantType.QUInt8, id="per-tensor-uint8"),
    pytest.param(False, QuantType.QInt8, id="per-tensor-int8"),
    pytest.param(True, QuantType.QUInt8, id="per-channel-uint8"),
    pytest.param(True, QuantType.QInt8, id="per-channel-int8"),
]


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "test", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _feeds(name, shape, count, seed, one_sided=False):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((count, *shape)).astype(np.float32)
    return np.abs(data) * 2 if one_sided else data


def _roundtrip(tmp_path, float_model, feeds_name, shape, per_channel=False, weight_type=QuantType.QUInt8,
               one_sided=False, **options):
    """float model → quantize_dynamic → convert; returns (paths, snr_dynamic, snr_converted)."""
    fpath = save(float_model, tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", per_channel=per_channel, weight_type=weight_type)
    calib = _feeds(feeds_name, shape, 512, 1, one_sided)
    np.savez(tmp_path / "calib.npz", **{feeds_name: calib})
    out = tmp_path / "converted.onnx"
    report = convert(dpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                activations=STATIC, progress=False, **options))
    held_out = [{feeds_name: f} for f in _feeds(feeds_name, shape, 16, 2, one_sided)]
    ref = run_ort(fpath, held_out)
    assert_lift_is_exact(float_model, dpath, held_out)
    return dpath, out, report, snr_db(ref, run_exact(dpath, held_out)), snr_db(ref, run_ort(out, held_out))


def _weight_dq(model: onnx.ModelProto, weight_prefix: str):
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].startswith(weight_prefix) \
                and node.input[0] in inits:
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            return inits[node.input[0]], inits[node.input[1]], axis
    raise AssertionError(f"no weight DequantizeLinear for {weight_prefix}")


# x[2,64] ─ MatMul(W[64,8]) ─ Add(b) ─ y
def matmul_model(seed=0):
    rng = np.random.default_rng(seed)
    return _model(
        [helper.make_node("MatMul", ["x", "W"], ["m"], "mm"), helper.make_node("Add", ["m", "b"], ["y"], "bias")],
        [_vi("x", [2, 64])], [_vi("y", [2, 8])],
        [numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32) * 0.15, "W"),
         numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")])


@pytest.mark.parametrize("per_channel, weight_type", VARIANTS)
def test_matmul(tmp_path, per_channel, weight_type):
    dpath, out, report, snr_dyn, snr_out = _roundtrip(tmp_path, matmul_model(), "x", [2, 64], per_channel,
                                                       weight_type)
    assert "MatMulInteger" in op_types(dpath)
    ops = op_types(out)
    assert not ops & REJECTED
    assert {"QuantizeLinear", "DequantizeLinear", "MatMul", "Add"} <= ops
    model = assert_qdq_contract(out)
    q, scale, axis = _weight_dq(model, "W")
    if per_channel or weight_type == QuantType.QUInt8:
        assert axis == 1 and scale.shape == (8,) or axis is None and scale.shape == ()
    if weight_type == QuantType.QInt8:
        # symmetric int8 source weights are kept bit-exact
        source = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(dpath)).graph.initializer}
        np.testing.assert_array_equal(q, source["W_quantized"])
        assert report.quantized[0]["source"] == "exact-weights"
    assert snr_out > 38 and snr_out >= snr_dyn - STATIC_VS_DYNAMIC_DB, (snr_dyn, snr_out)
    assert_tensorrt_ready(out)


# x[16,16] ─ Gemm(W[8,16], transB=1, b) ─ y      (onnxruntime turns it into MatMulInteger + Add)
def test_gemm(tmp_path):
    rng = np.random.default_rng(3)
    model = _model([helper.make_node("Gemm", ["x", "W", "b"], ["y"], "gemm", transB=1)],
                   [_vi("x", [16, 16])], [_vi("y", [16, 8])],
                   [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32) * 0.3, "W"),
                    numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")])
    _, out, _, snr_dyn, snr_out = _roundtrip(tmp_path, model, "x", [16, 16], True, QuantType.QInt8)
    assert not op_types(out) & REJECTED
    q, scale, axis = _weight_dq(assert_qdq_contract(out), "W")
    assert q.shape == (16, 8) and axis == 1 and scale.shape == (8,)
    assert snr_out > 38 and snr_out >= snr_dyn - STATIC_VS_DYNAMIC_DB, (snr_dyn, snr_out)
    assert_tensorrt_ready(out)


# x[1,3,8,8] ─ Conv(W[4,3,3,3], b, pads 1) ─ Relu ─ Conv(W2[6,4,3,3], stride 2) ─ y
def conv_model(seed=0, auto_pad=False):
    rng = np.random.default_rng(seed)
    pad = {"auto_pad": "SAME_UPPER"} if auto_pad else {"pads": [1, 1, 1, 1]}
    return _model(
        [helper.make_node("Conv", ["x", "W", "b"], ["c"], "conv1", **pad),
         helper.make_node("Relu", ["c"], ["r"], "relu"),
         helper.make_node("Conv", ["r", "W2"], ["y"], "conv2", strides=[2, 2])],
        [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 6, 3, 3])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "W"),
         numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
         numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32) * 0.3, "W2")])


@pytest.mark.parametrize("per_channel, weight_type", VARIANTS)
def test_conv(tmp_path, per_channel, weight_type):
    dpath, out, report, snr_dyn, snr_out = _roundtrip(tmp_path, conv_model(), "x", [1, 3, 8, 8], per_channel,
                                                       weight_type)
    assert "ConvInteger" in op_types(dpath)
    assert not op_types(out) & REJECTED
    model = assert_qdq_contract(out)
    for prefix, channels in (("W_", 4), ("W2", 6)):
        _, scale, axis = _weight_dq(model, prefix)
        assert scale.shape == () or (axis == 0 and scale.shape == (channels,))
    assert len([q for q in report.quantized if q["kind"] == "activation"]) == 2
    assert snr_out > 34 and snr_out >= snr_dyn - STATIC_VS_DYNAMIC_DB, (snr_dyn, snr_out)
    assert_tensorrt_ready(out)


def test_one_sided_input_is_recentred_exactly(tmp_path):
    """An input in [0, 6] is shifted before its Q; padding becomes an explicit Pad (SAME_UPPER conv)."""
    dpath, out, report, snr_dyn, snr_out = _roundtrip(tmp_path, conv_model(auto_pad=True), "x", [1, 3, 8, 8],
                                                       one_sided=True)
    assert {r["tensor"] for r in report.recentered} >= {"x"}
    ops = op_types(out)
    assert {"Sub", "Pad"} <= ops and not ops & REJECTED
    assert_qdq_contract(out)
    assert snr_out >= snr_dyn - 1.0, (snr_dyn, snr_out)
    # without re-centring, symmetric int8 loses a bit on this input
    plain = tmp_path / "plain.onnx"
    convert(dpath, plain, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                         ranges=RangeOptions(recenter=False), activations=STATIC, progress=False))
    held_out = [{"x": f} for f in _feeds("x", [1, 3, 8, 8], 16, 2, True)]
    ref = run_ort(tmp_path / "float.onnx", held_out)
    assert snr_out > snr_db(ref, run_ort(plain, held_out)) + 1.0
    assert "Sub" not in op_types(plain)
    assert_tensorrt_ready(out)


# x[16,8] ─ MatMul(W) ─ Relu ─ MatMul(W) ─ y        (one weight initializer used twice)
def test_shared_weights(tmp_path):
    rng = np.random.default_rng(5)
    model = _model([helper.make_node("MatMul", ["x", "W"], ["a"], "mm1"), helper.make_node("Relu", ["a"], ["r"]),
                    helper.make_node("MatMul", ["r", "W"], ["y"], "mm2")],
                   [_vi("x", [16, 8])], [_vi("y", [16, 8])],
                   [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.4, "W")])
    _, out, report, snr_dyn, snr_out = _roundtrip(tmp_path, model, "x", [16, 8], True, QuantType.QInt8)
    converted = assert_qdq_contract(out)
    weight_dqs = [n for n in converted.graph.node if n.op_type == "DequantizeLinear" and "W" in n.input[0]
                  and n.input[0] in {i.name for i in converted.graph.initializer}]
    assert len(weight_dqs) == 1  # one int8 copy, one DQ, two consumers
    consumers = [n for n in converted.graph.node if weight_dqs[0].output[0] in n.input]
    # give-back may leave one reader in float (measured on the held-out feeds: mm1, 39.0 → 43.3 dB)
    assert len(consumers) == 2 - len(report.given_back["layers"]) >= 1
    assert snr_out > 35 and snr_out >= snr_dyn - STATIC_VS_DYNAMIC_DB
    assert_tensorrt_ready(out)


def test_transformer_block_one_dql_feeds_three_projections(tmp_path):
    model = samples.transformer_block(layers=1)
    dpath, out, report, snr_dyn, snr_out = _roundtrip(tmp_path, model, "x", [1, 16, 64])
    source = onnx.load(str(dpath))
    dqls = [n for n in source.graph.node if n.op_type == "DynamicQuantizeLinear"]
    shared = [n for n in dqls if sum(n.output[0] in m.input for m in source.graph.node) == 3]
    assert shared, "onnxruntime should share one DynamicQuantizeLinear across q, k, v"
    converted = assert_qdq_contract(out)
    assert not op_types(converted) & REJECTED
    ln_out = shared[0].input[0]
    q_nodes = [n for n in converted.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == ln_out]
    assert len(q_nodes) == 1
    dq = next(n for n in converted.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q_nodes[0].output[0])
    assert sum(dq.output[0] in n.input for n in converted.graph.node if n.op_type == "MatMul") == 3
    assert snr_out > 25 and snr_out >= snr_dyn - STATIC_VS_DYNAMIC_DB, (snr_dyn, snr_out)
    assert_tensorrt_ready(out)


# x ─ Conv ─ Relu ─┬─ hidden (graph output)
#                  └─ Conv ─ y
def test_intermediate_graph_output_keeps_per_channel_downstream(tmp_path):
    rng = np.random.default_rng(7)
    model = _model(
        [helper.make_node("Conv", ["x", "W1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["hidden"], "relu"),
         helper.make_node("Conv", ["hidden", "W2"], ["y"], "conv2")],
        [_vi("x", [1, 4, 6, 6])], [_vi("y", [1, 5, 4, 4]), _vi("hidden", [1, 8, 6, 6])],
        [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3, "W1"),
         numpy_helper.from_array(rng.standard_normal((5, 8, 3, 3)).astype(np.float32) * 0.3, "W2")])
    dpath, out, _, snr_dyn, snr_out = _roundtrip(tmp_path, model, "x", [1, 4, 6, 6], False, QuantType.QUInt8)
    converted = assert_qdq_contract(out)
    _, scale, axis = _weight_dq(converted, "W2")
    assert axis == 0 and scale.shape == (5,)
    assert [o.name for o in converted.graph.output] == ["y", "hidden"]
    assert snr_out > 30
    assert_tensorrt_ready(out)


def _hand_built_epilogue(per_channel_conv: bool):
    """Another exporter's dynamic int8 pattern: the bias is quantized at run time and added to the
    int32 accumulator, and the scales are applied in two separate multiplies.

        x ─ DynamicQuantizeLinear ─ (x_q, s_x, z_x)
        W_q:int8, b ─ Floor(b / (s_x·s_w)) ─ Cast(int32) ─┐
        MatMulInteger|ConvInteger(x_q, W_q, z_x) ─ acc ─ Add ─ Cast(float) ─ Mul(s_x) ─ Mul(s_w) ─ y
    """
    rng = np.random.default_rng(11)
    if per_channel_conv:
        w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
        s_w = (np.abs(w).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
        w_q = np.rint(w / s_w[:, None, None, None]).astype(np.int8)
        bias = rng.standard_normal(4).astype(np.float32)
        op = helper.make_node("ConvInteger", ["x_q", "W_q", "x_zp"], ["acc"], "conv_int", pads=[1, 1, 1, 1])
        shape_in, shape_out = [1, 3, 6, 6], [1, 4, 6, 6]
        s_w_init = numpy_helper.from_array(s_w.reshape(1, 4, 1, 1), "s_w")
        bias_init = numpy_helper.from_array(bias.reshape(1, 4, 1, 1), "bias")
    else:
        w = rng.standard_normal((16, 8)).astype(np.float32) * 0.3
        s_w = np.float32(np.abs(w).max() / 127)
        w_q = np.rint(w / s_w).astype(np.int8)
        bias = rng.standard_normal(8).astype(np.float32)
        op = helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp"], ["acc"], "matmul_int")
        shape_in, shape_out = [2, 16], [2, 8]
        s_w_init = numpy_helper.from_array(np.array(s_w, np.float32), "s_w")
        bias_init = numpy_helper.from_array(bias, "bias")
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
        helper.make_node("Mul", ["s_x", "s_w"], ["s_xw"], "scale_product"),
        helper.make_node("Div", ["bias", "s_xw"], ["bias_acc_f"], "bias_div"),
        helper.make_node("Floor", ["bias_acc_f"], ["bias_acc_r"], "bias_floor"),
        helper.make_node("Cast", ["bias_acc_r"], ["bias_acc"], "bias_cast", to=TensorProto.INT32),
        op,
        helper.make_node("Add", ["acc", "bias_acc"], ["acc_b"], "acc_bias"),
        helper.make_node("Cast", ["acc_b"], ["acc_f"], "acc_cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc_f", "s_x"], ["partial"], "mul_sx"),
        helper.make_node("Mul", ["partial", "s_w"], ["y"], "mul_sw"),
    ]
    model = _model(nodes, [_vi("x", shape_in)], [_vi("y", shape_out)],
                   [numpy_helper.from_array(w_q, "W_q"), s_w_init, bias_init])
    return model, w, bias, shape_in


@pytest.mark.parametrize("conv", [False, True], ids=["matmul-scalar-scale", "conv-per-channel-scale"])
def test_integer_epilogue_of_other_exporters(tmp_path, conv):
    model, w, bias, shape = _hand_built_epilogue(conv)
    onnx.checker.check_model(model, full_check=True)
    src = save(model, tmp_path / "dyn.onnx")
    np.savez(tmp_path / "calib.npz", x=_feeds("x", shape, 16, 1))
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              activations=STATIC, progress=False))
    converted = assert_qdq_contract(out)
    ops = op_types(converted)
    assert not ops & (REJECTED | {"Floor", "Div"})
    assert report.rules[0].nodes == ["conv_int" if conv else "matmul_int"]
    # the int8 weights are the exporter's own, and the bias comes back as the float bias
    q, scale, axis = _weight_dq(converted, "W_q")
    np.testing.assert_array_equal(q, numpy_helper.to_array(next(i for i in model.graph.initializer
                                                                if i.name == "W_q")))
    assert (axis == 0 and scale.shape == (4,)) if conv else scale.shape == ()
    feeds = [{"x": f} for f in _feeds("x", shape, 8, 2)]
    import onnxruntime as ort

    # float reference: the same layer in float with the exporter's (dequantized) weights
    if conv:
        ref_model = _model([helper.make_node("Conv", ["x", "W", "b"], ["y"], pads=[1, 1, 1, 1])],
                           [_vi("x", shape)], [_vi("y", [1, 4, 6, 6])],
                           [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "b")])
        ref = run_ort(ref_model, feeds)
    else:
        ref = [f["x"] @ w + bias for f in feeds]
    assert snr_db(ref, run_ort(out, feeds)) > 30
    assert snr_db(ref, run_ort(src, feeds)) > 30  # the hand-built source is itself right
    assert ort is not None
    assert_tensorrt_ready(out)


def test_unsupported_pattern_names_the_node(tmp_path):
    """A MatMulInteger fed by a plain integer graph input has no float meaning to lift."""
    rng = np.random.default_rng(0)
    model = _model([helper.make_node("MatMulInteger", ["a", "W"], ["acc"], "odd_matmul"),
                    helper.make_node("Cast", ["acc"], ["y"], "cast", to=TensorProto.FLOAT)],
                   [_vi("a", [2, 4], TensorProto.UINT8)], [_vi("y", [2, 3])],
                   [numpy_helper.from_array(rng.integers(0, 255, (4, 3)).astype(np.uint8), "W")])
    src = save(model, tmp_path / "odd.onnx")
    with pytest.raises(UnsupportedPatternError, match="MatMulInteger 'odd_matmul'.*neither a constant"):
        convert(src, tmp_path / "out.onnx", ConvertOptions(calibration=CalibrationOptions(random=2), progress=False))
    assert not (tmp_path / "out.onnx").exists()


def _weights_as_constant_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The paddle2onnx export style: every weight is a Constant node, not an initializer."""
    constants = [helper.make_node("Constant", [], [i.name], f"const_{i.name}", value=i)
                 for i in model.graph.initializer]
    del model.graph.initializer[:]
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(constants + nodes)
    return model


#   x[1,3,8,8] ─ Conv(W: Constant node) ─ Relu ─ Conv(W2: Constant node) ─ y   (dims '?' in the input)
def test_weights_quantized_at_run_time_and_unnamed_dims(tmp_path):
    """quantize_dynamic puts a DynamicQuantizeLinear on weights that are Constant nodes (it takes them
    for activations): the lifted weight is the float constant, re-quantized per channel. Two '?' input
    dims must not tell TensorRT that height equals width."""
    model = conv_model(seed=2)
    del model.graph.node[0].input[2]  # onnxruntime only quantizes a biased conv with an initializer weight
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "b"))
    model = _weights_as_constant_nodes(model)
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, ("N", 3, "?", "?")):
        dim.Clear()
        if isinstance(value, str):
            dim.dim_param = value
        else:
            dim.dim_value = value
    model.graph.output[0].type.tensor_type.ClearField("shape")
    fpath = save(model, tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    source = onnx.load(str(dpath))
    dql_inputs = {n.input[0] for n in source.graph.node if n.op_type == "DynamicQuantizeLinear"}
    assert {"W", "W2"} <= dql_inputs  # the weights are quantized at run time

    np.savez(tmp_path / "calib.npz", x=_feeds("x", [1, 3, 8, 8], 32, 1))
    out = tmp_path / "converted.onnx"
    report = convert(dpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                activations=STATIC, progress=False))
    converted = assert_qdq_contract(out)
    assert not op_types(converted) & REJECTED
    assert len(report.rules[0].nodes) == 2
    for prefix, channels in (("W_", 4), ("W2", 6)):
        _, scale, axis = _weight_dq(converted, prefix)
        assert axis == 0 and scale.shape == (channels,)
    assert {q["tensor"] for q in report.quantized if q["kind"] == "activation"} == {"x", "r_centered"}
    dims = [d.dim_param or d.dim_value for d in converted.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 3, 0, 0]  # no name, no value: unknown
    held_out = [{"x": f} for f in _feeds("x", [1, 3, 8, 8], 8, 2)]
    reference = run_ort(fpath, held_out)
    assert snr_db(reference, run_ort(out, held_out)) > 25
    from trt_bridge.tensorrt.build import build_engine

    assert build_engine(out, shapes={"x": (1, 3, 8, 12)})  # height ≠ width builds


# x ─ QuantizeLinear(s, zp) ─ MatMulInteger(W_q int8, a_zp) ─ Cast ─ Mul(s·s_w) ─ y
def _static_ql_model(q_zp: np.ndarray, a_zp: int | None):
    rng = np.random.default_rng(11)
    w_q = rng.integers(-127, 128, (16, 8)).astype(np.int8)
    s, s_w = np.float32(0.02), np.float32(0.01)
    mm_inputs = ["x_q", "W_q"] + ([] if a_zp is None else ["a_zp"])
    inits = [numpy_helper.from_array(w_q, "W_q"), numpy_helper.from_array(np.array(s, np.float32), "s"),
             numpy_helper.from_array(q_zp, "q_zp"), numpy_helper.from_array(np.array(s * s_w, np.float32), "s_xw")]
    if a_zp is not None:
        inits.append(numpy_helper.from_array(np.array(a_zp, q_zp.dtype), "a_zp"))
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "q_zp"], ["x_q"], "ql"),
                    helper.make_node("MatMulInteger", mm_inputs, ["acc"], "mm_int"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], "cast", to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_xw"], ["y"], "rescale")],
                   [_vi("x", [4, 16])], [_vi("y", [4, 8])], inits)
    return model, s


@pytest.mark.parametrize("q_zp, covering", [(np.array(128, np.uint8), 128 / 127), (np.array(0, np.int8), 1.0),
                                            (np.array(3, np.int8), 131 / 127)], ids=["uint8-zp128", "int8-zp0",
                                                                                     "int8-zp3"])
def test_static_quantize_linear_operand_keeps_its_range(tmp_path, q_zp, covering):
    """A static QuantizeLinear's codes stand for x/s only after its own zero point is subtracted; the
    symmetric int8 scale covers the same float range as the source's codes."""
    model, s = _static_ql_model(q_zp, int(q_zp))
    src = save(model, tmp_path / "src.onnx")
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(random=2), progress=False))
    converted = assert_qdq_contract(out)
    assert not op_types(converted) & REJECTED
    act = next(q for q in report.quantized if q["kind"] == "activation")
    assert act["source"] == "model" and act["scale"] == pytest.approx(s * covering, rel=1e-6)
    feeds = [{"x": f} for f in _feeds("x", [4, 16], 8, 2)]
    assert snr_db(run_exact(src, feeds), run_ort(out, feeds)) > 35
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("a_zp, message", [(0, "subtracts zero point 0 from operand 0, but QuantizeLinear 'ql' "
                                                "added 128"),
                                           (None, "subtracts zero point 0 .* added 128")])
def test_static_quantize_linear_with_another_zero_point_is_declined(tmp_path, a_zp, message):
    model, _ = _static_ql_model(np.array(128, np.uint8), a_zp)
    with pytest.raises(UnsupportedPatternError, match=f"MatMulInteger 'mm_int'.*{message}"):
        convert(save(model, tmp_path / "src.onnx"), tmp_path / "out.onnx", ConvertOptions(
            calibration=CalibrationOptions(random=1), progress=False))


def test_dynamic_operand_without_its_zero_point_is_declined(tmp_path):
    """MatMulInteger(x_q, W_q) with no a_zero_point multiplies raw uint8 codes: not x/s, so no lift."""
    rng = np.random.default_rng(0)
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
                    helper.make_node("MatMulInteger", ["x_q", "W_q"], ["acc"], "mm_int"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], "cast", to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_x"], ["y"], "rescale")],
                   [_vi("x", [2, 4])], [_vi("y", [2, 3])],
                   [numpy_helper.from_array(rng.integers(0, 255, (4, 3)).astype(np.uint8), "W_q")])
    with pytest.raises(UnsupportedPatternError, match="does not subtract its zero point 'x_zp' .input 2 is missing"):
        convert(save(model, tmp_path / "src.onnx"), tmp_path / "out.onnx", ConvertOptions(
            calibration=CalibrationOptions(random=1), progress=False))


# x[2,4,16] ≥ 0 ─ DynamicQuantizeLinear ─ MatMulInteger(W_q[2,16,8]) ─ Cast ─ Mul(s_x) ─ Mul(s_w) ─ y
def test_one_sided_input_of_a_batched_matmul_is_recentred_per_batch(tmp_path):
    """The compensation c·Σₖ W[b, k, :] differs per batch: it must broadcast as [2, 1, 8], not [2, 8]."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((2, 16, 8)).astype(np.float32) * 0.3
    s_w = np.float32(np.abs(w).max() / 127)
    w_q = np.rint(w / s_w).astype(np.int8)
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
                    helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp"], ["acc"], "bmm_int"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], "cast", to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_x"], ["part"], "mul_sx"),
                    helper.make_node("Mul", ["part", "s_w"], ["y"], "mul_sw")],
                   [_vi("x", [2, 4, 16])], [_vi("y", [2, 4, 8])],
                   [numpy_helper.from_array(w_q, "W_q"), numpy_helper.from_array(np.array(s_w), "s_w")])
    src = save(model, tmp_path / "src.onnx")
    np.savez(tmp_path / "calib.npz", x=_feeds("x", [2, 4, 16], 256, 1, one_sided=True))
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              activations=STATIC, progress=False))
    assert [r["tensor"] for r in report.recentered] == ["x"]
    converted = assert_qdq_contract(out)
    assert {"Sub", "Add", "MatMul"} <= op_types(converted) and not op_types(converted) & REJECTED
    feeds = [{"x": f} for f in _feeds("x", [2, 4, 16], 8, 2, one_sided=True)]
    reference = [f["x"] @ (w_q.astype(np.float32) * s_w) for f in feeds]
    assert snr_db(reference, run_exact(src, feeds)) > 35  # the hand-built source is right
    assert snr_db(reference, run_ort(out, feeds)) > 35
    assert_tensorrt_ready(out)


def _scaled_integer_op(conv: bool, scale_shape: tuple[int, ...]):
    """DynamicQuantizeLinear ─ {Conv3d|MatMul}Integer ─ Cast ─ Mul(s_x) ─ Mul(s_w shaped ``scale_shape``)."""
    rng = np.random.default_rng(9)
    if conv:  # x[1,2,3,4,4] ─ ConvInteger(W_q[3,2,1,1,1]) ─ [1,3,3,4,4]
        w_q = rng.integers(-127, 128, (3, 2, 1, 1, 1)).astype(np.int8)
        shape_in, shape_out, op = [1, 2, 3, 4, 4], [1, 3, 3, 4, 4], "ConvInteger"
    else:  # x[4,16] ─ MatMulInteger(W_q[16,8]) ─ [4,8]
        w_q = rng.integers(-127, 128, (16, 8)).astype(np.int8)
        shape_in, shape_out, op = [4, 16], [4, 8], "MatMulInteger"
    s_w = (rng.uniform(0.5, 2.0, scale_shape) * 0.01).astype(np.float32)
    out_shape = list(np.broadcast_shapes(tuple(shape_out), scale_shape))
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
                    helper.make_node(op, ["x_q", "W_q", "x_zp"], ["acc"], "int_op"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], "cast", to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_x"], ["part"], "mul_sx"),
                    helper.make_node("Mul", ["part", "s_w"], ["y"], "mul_sw")],
                   [_vi("x", shape_in)], [_vi("y", out_shape)],
                   [numpy_helper.from_array(w_q, "W_q"), numpy_helper.from_array(s_w, "s_w")])
    return model, shape_in, out_shape


@pytest.mark.parametrize("conv, scale_shape", [(True, (3, 1, 1)), (False, (1, 1, 8))],
                         ids=["conv3d-scale-on-depth", "matmul-scale-of-higher-rank"])
def test_scale_that_is_not_per_output_channel_stays_a_float_multiply(tmp_path, conv, scale_shape):
    """A Conv3d 'scale' [3,1,1] multiplies the depth axis, and a [1,1,8] scale on a rank-2 MatMul
    output makes it rank 3: neither is a per-channel weight scale. The weight is lifted with scale 1
    and the multiply stays, so values and output shape are the source's."""
    model, shape_in, out_shape = _scaled_integer_op(conv, scale_shape)
    onnx.checker.check_model(model, full_check=True)
    src = save(model, tmp_path / "src.onnx")
    np.savez(tmp_path / "calib.npz", x=_feeds("x", shape_in, 64, 1))
    out = tmp_path / "out.onnx"
    convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                     activations=STATIC, progress=False))
    converted = assert_qdq_contract(out)
    assert not op_types(converted) & REJECTED
    mul = [n for n in converted.graph.node if n.op_type == "Mul"]
    assert len(mul) == 1 and "s_w" in mul[0].input
    feeds = [{"x": f} for f in _feeds("x", shape_in, 8, 2)]
    source, result = run_exact(src, feeds), run_ort(out, feeds)
    assert all(r.shape == tuple(out_shape) for r in result)
    assert snr_db(source, result) > 30
    assert_tensorrt_ready(out)


def _if_model(then_nodes: list, rng: np.random.Generator) -> onnx.ModelProto:
    then_branch = helper.make_graph(then_nodes, "then", [], [_vi("t", [2, 3])])
    else_branch = helper.make_graph([helper.make_node("Identity", ["z"], ["e"], "else_id")], "else", [],
                                    [_vi("e", [2, 3])])
    return _model([helper.make_node("If", ["cond"], ["y"], "gate", then_branch=then_branch,
                                    else_branch=else_branch)],
                  [_vi("x", [2, 4]), _vi("cond", [], TensorProto.BOOL)], [_vi("y", [2, 3])],
                  [numpy_helper.from_array(rng.integers(-100, 100, (4, 3)).astype(np.int8), "W_q"),
                   numpy_helper.from_array(np.zeros((2, 3), np.float32), "z")])


def test_dynamic_quantization_inside_a_subgraph_is_lifted(tmp_path):
    """A DynamicQuantizeLinear → MatMulInteger in an If branch is lifted there like in the main graph, and the
    branch gets symmetric int8 Q/DQ (convert.bodies): no integer op is left in it, and it follows the source."""
    rng = np.random.default_rng(0)
    model = _if_model([helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "branch_dql"),
                       helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp"], ["acc"], "branch_mm"),
                       helper.make_node("Cast", ["acc"], ["acc_f"], "branch_cast", to=TensorProto.FLOAT),
                       helper.make_node("Mul", ["acc_f", "s_x"], ["t"], "branch_mul")], rng)
    src = save(model, tmp_path / "if.onnx")
    np.savez(tmp_path / "calib.npz", x=_feeds("x", [2, 4], 16, 1), cond=np.ones(16, bool))
    out = tmp_path / "out.onnx"
    convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                     activations=STATIC, progress=False))
    converted = assert_qdq_contract(out)
    branch = next(a.g for a in converted.graph.node[0].attribute if a.name == "then_branch")
    ops = {n.op_type for n in branch.node}
    assert {"MatMul", "QuantizeLinear", "DequantizeLinear"} <= ops and not ops & REJECTED
    feeds = [{"x": f, "cond": np.array(c)} for f in _feeds("x", [2, 4], 4, 2) for c in (True, False)]
    assert snr_db(run_exact(src, feeds), run_ort(out, feeds)) > 30
    assert_tensorrt_ready(out)


def test_what_no_rule_lifts_inside_a_subgraph_is_named(tmp_path):
    """An op TensorRT cannot import that no rule lifts in an If branch: convert fails naming the node and the If
    that holds it, and writes nothing."""
    model = _if_model([helper.make_node("MatMulInteger", ["x_q", "W_q"], ["acc"], "branch_mm"),
                       helper.make_node("Cast", ["acc"], ["t"], "branch_cast", to=TensorProto.FLOAT)],
                      np.random.default_rng(0))
    model.graph.input.append(_vi("x_q", [2, 4], TensorProto.UINT8))
    src = save(model, tmp_path / "if.onnx")
    with pytest.raises(UnsupportedPatternError) as err:
        convert(src, tmp_path / "out.onnx", ConvertOptions(calibration=CalibrationOptions(random=1), progress=False))
    assert "If 'gate' then_branch / MatMulInteger 'branch_mm'" in str(err.value)
    assert not (tmp_path / "out.onnx").exists()


# --- the rule called directly ---------------------------------------------------------------------------------------

#   x [4, 16] ─ DynamicQuantizeLinear ─┬ x_q ─ MatMulInteger(W_q int8 [16, 8], x_zp) ─ acc ─ Cast ─ Mul ─ Add(b) ─ y
#                                      ├ x_s ─ Mul(w_s [8]) ──────────────────────────────────────┘
#                                      └ x_zp
#   (constant_left: MatMulInteger(A_q uint8 [3, 4], x_q) ─ acc [3, 16] ─ Cast ─ Mul(x_s) ─ y)
def _matmul_integer(constant_left: bool = False):
    rng = np.random.default_rng(67)
    inits = {"W_q": rng.integers(-127, 128, (16, 8)).astype(np.int8), "w_zp": np.zeros(8, np.int8),
             "w_s": (rng.random(8) * 0.01 + 0.002).astype(np.float32), "b": rng.normal(size=8).astype(np.float32),
             "A_q": rng.integers(0, 256, (3, 4)).astype(np.uint8), "a_zp": np.uint8(128)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_s", "x_zp"], "dql")]
    if constant_left:
        nodes += [helper.make_node("MatMulInteger", ["A_q", "x_q", "a_zp", "x_zp"], ["acc"], "mmi"),
                  helper.make_node("Cast", ["acc"], ["acc_f"], "cast", to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["acc_f", "x_s"], ["y"], "rescale")]
        y_shape = [3, 16]
    else:
        nodes += [helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp", "w_zp"], ["acc"], "mmi"),
                  helper.make_node("Cast", ["acc"], ["acc_f"], "cast", to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["x_s", "w_s"], ["scales"], "scales"),
                  helper.make_node("Mul", ["acc_f", "scales"], ["y0"], "rescale"),
                  helper.make_node("Add", ["y0", "b"], ["y"], "bias")]
        y_shape = [4, 8]
    return build_model(nodes, [tensor_info("x", [4, 16])], [tensor_info("y", y_shape)], inits)


def test_rule_lifts_matmul_integer_and_its_epilogue_to_a_float_matmul():
    source = _matmul_integer()
    out, ctx = lifted(source, (DynamicIntegerOp(), "mmi"))
    assert ops_left(out) == ["Add", "MatMul"]
    assert ctx.annotations.activations["x"].scale is None  # calibrated later
    assert [w.source.value for w in ctx.annotations.weights.values()] == ["exact-weights"]
    # on values the run-time grid holds, the source computes the float MatMul on its dequantized weights
    rng = np.random.default_rng(71)
    assert_same_outputs(source, out, [{"x": dynamic_grid_feed(rng, (4, 16))} for _ in range(3)], rtol=1e-4)


def test_rule_declines_a_constant_left_operand_untouched():
    reason = declined(_matmul_integer(constant_left=True), DynamicIntegerOp(), "mmi")
    assert reason == "the left operand is a constant; only activation × weight or activation × activation is lifted"
