"""runtime/exact_integer: uint8 × int8 integer ops run on uint8 weights (+128), which onnxruntime computes exactly
on every CPU (its uint8 × int8 kernels saturate pair sums in int16 on x86 CPUs without VNNI)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trt_bridge.runtime.exact_integer import exact_integer
from trt_bridge.runtime.session import session

RNG = np.random.default_rng(20261128)


def _model(nodes, inputs, outputs, inits, opset=13, ms=False):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def _saturating_weight(shape):
    """int8 weights at the ends of their range, where uint8 × int8 pair sums pass 32767."""
    return RNG.choice(np.array([-128, -127, 127, 126], np.int8), size=shape)


def _initializer_types(model):
    return {i.name: i.data_type for i in model.graph.initializer}


def test_matmul_integer_with_saturating_pairs_is_exact():
    w = _saturating_weight((64, 8))
    model = _model([helper.make_node("MatMulInteger", ["a", "w", "az", "wz"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 64])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [3, 8])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(3, np.uint8), "az"),
                    numpy_helper.from_array(np.array(-2, np.int8), "wz")])
    exact = exact_integer(model)
    node = exact.graph.node[0]
    assert [n.op_type for n in exact.graph.node] == ["MatMulInteger"]
    types = _initializer_types(exact)
    assert types[node.input[1]] == TensorProto.UINT8 and types[node.input[3]] == TensorProto.UINT8
    a = RNG.choice(np.array([250, 255], np.uint8), size=(3, 64))
    want = (a.astype(np.int64) - 3) @ (w.astype(np.int64) + 2)
    assert np.array_equal(session(model).run(None, {"a": a})[0], want)
    assert np.array_equal(ReferenceEvaluator(model).run(None, {"a": a})[0], want)


def test_dynamic_quantize_then_matmul_integer_without_weight_zero_point():
    """onnxruntime's quantize_dynamic shape: the weight's zero point is absent, a uint8 128 is added."""
    w = _saturating_weight((32, 4))
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
                    helper.make_node("MatMulInteger", ["q", "w", "z"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 4])],
                   [numpy_helper.from_array(w, "w")])
    exact = exact_integer(model)
    assert [n.op_type for n in exact.graph.node] == ["DynamicQuantizeLinear", "MatMulInteger"]
    assert len(exact.graph.node[1].input) == 4
    x = np.abs(RNG.standard_normal((2, 32))).astype(np.float32) + 1
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert np.array_equal(session(model).run(None, {"x": x})[0], want)


def test_qlinear_conv_per_channel_is_exact():
    w = _saturating_weight((4, 8, 3, 3))
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(7, np.uint8), "xz"),
             numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.full(4, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
             numpy_helper.from_array(np.array(80.0, np.float32), "ys"),
             numpy_helper.from_array(np.array(128, np.uint8), "yz")]
    model = _model([helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 8, 6, 6])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    exact = exact_integer(model)
    assert [n.op_type for n in exact.graph.node] == ["QLinearConv"]
    x = RNG.choice(np.array([240, 255], np.uint8), size=(1, 8, 6, 6))
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = session(model).run(None, {"x": x})[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1  # requantization may round the other way


def test_matmul_integer_to_float_and_dynamic_quantize_matmul_are_exact():
    w = _saturating_weight((16, 3))
    ws = np.array([0.5, 0.25, 0.125], np.float32)
    mitf = _model([helper.make_node("MatMulIntegerToFloat", ["a", "w", "as", "ws", "az"], ["y"],
                                    domain="com.microsoft")],
                  [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.1, np.float32), "as"),
                   numpy_helper.from_array(ws, "ws"), numpy_helper.from_array(np.array(5, np.uint8), "az")], ms=True)
    exact = exact_integer(mitf)
    assert [n.op_type for n in exact.graph.node] == ["MatMulIntegerToFloat"]
    assert list(exact.graph.node[0].input[4:6]) == ["az", "__trt_bridge_uint8_128"]
    a = np.full((2, 16), 255, np.uint8)
    want = ((a.astype(np.int64) - 5) @ w.astype(np.int64)).astype(np.float64) * 0.1 * ws
    np.testing.assert_allclose(session(mitf).run(None, {"a": a})[0], want, rtol=1e-6)

    dqmm = _model([helper.make_node("DynamicQuantizeMatMul", ["x", "w", "ws"], ["y"], domain="com.microsoft")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(ws, "ws")], ms=True)
    x = np.full((2, 16), 1.0, np.float32)  # one code, 255, zero point 0, scale 1/255
    want = (np.full((2, 16), 255, np.int64) @ w.astype(np.int64)).astype(np.float64) * np.float32(1 / 255) * ws
    np.testing.assert_allclose(session(dqmm).run(None, {"x": x})[0], want, rtol=1e-6)


def test_left_alone_where_nothing_saturates():
    """int8 activations (int8 × int8 kernels are exact), weights computed at run time, and float models."""
    signed = _model([helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
                    [helper.make_tensor_value_info("a", TensorProto.INT8, [1, 4])],
                    [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 2])],
                    [numpy_helper.from_array(np.ones((4, 2), np.int8), "w")])
    assert exact_integer(signed) is None
    runtime = _model([helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
                     [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 4]),
                      helper.make_tensor_value_info("w", TensorProto.INT8, [4, 2])],
                     [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 2])], [])
    assert exact_integer(runtime) is None
    float_model = _model([helper.make_node("Relu", ["x"], ["y"])],
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [])
    assert exact_integer(float_model) is None


def test_a_shared_weight_is_offset_once_and_the_source_is_not_modified():
    w = _saturating_weight((8, 2))
    model = _model([helper.make_node("MatMulInteger", ["a", "w"], ["y1"]),
                    helper.make_node("MatMulInteger", ["a", "w"], ["y2"])],
                   [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 8])],
                   [helper.make_tensor_value_info("y1", TensorProto.INT32, [1, 2]),
                    helper.make_tensor_value_info("y2", TensorProto.INT32, [1, 2])],
                   [numpy_helper.from_array(w, "w")])
    before = model.SerializeToString()
    exact = exact_integer(model)
    assert model.SerializeToString() == before
    assert exact.graph.node[0].input[1] == exact.graph.node[1].input[1] == "w__uint8"
    assert sorted(i.name for i in exact.graph.initializer) == ["__trt_bridge_uint8_128", "w", "w__uint8"]
    onnx.checker.check_model(exact)


@pytest.mark.parametrize("seed", range(3))
def test_random_matmul_integer_matches_int64_math(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 300))
    w = rng.integers(-128, 128, (k, 5), dtype=np.int8)
    wz = rng.integers(-128, 128, 5).astype(np.int8)
    model = _model([helper.make_node("MatMulInteger", ["a", "w", "", "wz"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, k])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 5])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(wz, "wz")])
    a = rng.integers(0, 256, (4, k), dtype=np.uint8)
    want = a.astype(np.int64) @ (w.astype(np.int64) - wz.astype(np.int64))
    assert np.array_equal(session(model).run(None, {"a": a})[0], want)
