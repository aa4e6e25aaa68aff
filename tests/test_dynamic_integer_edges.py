"""Edge cases of the dynamic lift found in review: operand ranks, code types, scales that do not fold.

Each model is hand-built; each test checks numerical agreement with onnx's exact reference
evaluator (the source) and that TensorRT-RTX builds the result.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_exact, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions

REJECTED = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits, opset=17, ir=8):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def _convert(tmp_path, model, feeds, calib=None):
    src = save(model, tmp_path / "src.onnx")
    out = tmp_path / "out.onnx"
    if calib is not None:
        np.savez(tmp_path / "calib.npz", **calib)
    options = ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False) if calib is not None \
        else ConvertOptions(calibration=CalibrationOptions(random=4), progress=False)
    report = convert(src, out, options)
    converted = assert_qdq_contract(out)
    assert not op_types(converted) & REJECTED
    return report, snr_db(run_exact(src, feeds), run_ort(out, feeds)), out


# x[8,8] ─ DQL ─ MatMulInteger(W_q[8]) ─ Cast ─ Mul(s_x) ─ Mul(s_w[8]) ─ y[8]
def test_one_dimensional_weight_keeps_a_vector_scale_on_the_output(tmp_path):
    """x @ w[K] has no channel axis: an [M] scale multiplies the output rows and must stay a Mul."""
    rng = np.random.default_rng(0)
    w_q = rng.integers(-127, 128, (8,)).astype(np.int8)
    s_w = (rng.uniform(0.5, 2, (8,)) * 0.01).astype(np.float32)
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
                    helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp"], ["acc"], "mm"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_x"], ["p"]), helper.make_node("Mul", ["p", "s_w"], ["y"])],
                   [_vi("x", [8, 8])], [_vi("y", [8])],
                   [numpy_helper.from_array(w_q, "W_q"), numpy_helper.from_array(s_w, "s_w")])
    feeds = [{"x": rng.standard_normal((8, 8)).astype(np.float32)} for _ in range(4)]
    _, snr, out = _convert(tmp_path, model, feeds, {"x": rng.standard_normal((64, 8, 8)).astype(np.float32)})
    assert "Mul" in op_types(out) and snr > 35
    assert_tensorrt_ready(out)


# x[4,16] ─ QuantizeLinear(s, output_dtype=INT8, no zero point) ─ MatMulInteger(W_q) ─ Cast ─ Mul ─ y
def test_quantize_linear_output_dtype_without_zero_point_is_int8(tmp_path):
    rng = np.random.default_rng(11)
    s, s_w = np.float32(0.02), np.float32(0.01)
    model = _model([helper.make_node("QuantizeLinear", ["x", "s"], ["x_q"], "ql", output_dtype=TensorProto.INT8),
                    helper.make_node("MatMulInteger", ["x_q", "W_q"], ["acc"], "mm"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_xw"], ["y"])],
                   [_vi("x", [4, 16])], [_vi("y", [4, 8])],
                   [numpy_helper.from_array(rng.integers(-127, 128, (16, 8)).astype(np.int8), "W_q"),
                    numpy_helper.from_array(np.array(s), "s"), numpy_helper.from_array(np.array(s * s_w), "s_xw")],
                   opset=21, ir=10)
    feeds = [{"x": (rng.standard_normal((4, 16)) * 0.8).astype(np.float32)} for _ in range(8)]
    report, snr, out = _convert(tmp_path, model, feeds)
    act = next(q for q in report.quantized if q["kind"] == "activation")
    assert act["scale"] == pytest.approx(0.02) and act["source"] == "model"
    assert snr > 100  # the same int8 codes: exact
    assert_tensorrt_ready(out)


# a[4,8], b[8,4] ─ DQL each ─ MatMulInteger ─ Cast ─ Mul(s_a·s_b) ─ Mul(0.125) ─ y
def test_activation_product_keeps_a_trailing_constant_multiply(tmp_path):
    rng = np.random.default_rng(0)
    model = _model([helper.make_node("DynamicQuantizeLinear", ["a"], ["a_q", "s_a", "a_zp"], "dqa"),
                    helper.make_node("DynamicQuantizeLinear", ["b"], ["b_q", "s_b", "b_zp"], "dqb"),
                    helper.make_node("MatMulInteger", ["a_q", "b_q", "a_zp", "b_zp"], ["acc"], "mm"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["s_a", "s_b"], ["s_ab"]),
                    helper.make_node("Mul", ["acc_f", "s_ab"], ["p"]), helper.make_node("Mul", ["p", "c"], ["y"])],
                   [_vi("a", [4, 8]), _vi("b", [8, 4])], [_vi("y", [4, 4])],
                   [numpy_helper.from_array(np.array(0.125, np.float32), "c")])
    feeds = [{"a": rng.standard_normal((4, 8)).astype(np.float32), "b": rng.standard_normal((8, 4)).astype(np.float32)}
             for _ in range(4)]
    _, snr, out = _convert(tmp_path, model, feeds)
    assert snr > 30
    assert_tensorrt_ready(out)


# x[16] ≥ 1 ─ DQL ─ MatMulInteger(W_q[3,16,8]) ─ Cast ─ Mul(s_x) ─ Mul(s_w) ─ y[3,8]
def test_one_dimensional_activation_into_a_batched_weight_is_not_recentred(tmp_path):
    """c·Σₖ W[b, k, :] would broadcast [3,1,8] against [3,8] and change the rank: no re-centring here."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 16, 8)).astype(np.float32) * 0.3
    s_w = np.float32(np.abs(w).max() / 127)
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
                    helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp"], ["acc"], "bmm"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_x"], ["p"]), helper.make_node("Mul", ["p", "s_w"], ["y"])],
                   [_vi("x", [16])], [_vi("y", [3, 8])],
                   [numpy_helper.from_array(np.rint(w / s_w).astype(np.int8), "W_q"),
                    numpy_helper.from_array(np.array(s_w), "s_w")])
    onnx.checker.check_model(model, full_check=True)
    feeds = [{"x": (np.abs(rng.standard_normal(16)) + 1).astype(np.float32)} for _ in range(4)]
    report, snr, out = _convert(tmp_path, model, feeds,
                                {"x": (np.abs(rng.standard_normal((64, 16))) + 1).astype(np.float32)})
    assert report.recentered == [] and snr > 35
    assert all(r.shape == (3, 8) for r in run_ort(out, feeds))
    # No TensorRT build here: TensorRT-RTX 1.7's parser rejects x[K] @ W[B, K, N] even in a plain
    # float model ("reshape changes volume ... [3,1,8] to [1,8]"), so this checks onnxruntime only.


def test_graph_output_declared_without_a_shape_loads(tmp_path):
    """onnx.checker wants a shape field on graph outputs; onnxruntime does not, and neither do we."""
    rng = np.random.default_rng(0)
    model = _model([helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
                    helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp"], ["acc"], "mm"),
                    helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["acc_f", "s_x"], ["y"])],
                   [_vi("x", [4, 16])], [_vi("y", None)],
                   [numpy_helper.from_array(rng.integers(-127, 128, (16, 8)).astype(np.int8), "W_q")])
    feeds = [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(4)]
    _, snr, out = _convert(tmp_path, model, feeds)
    assert snr > 25
    assert_tensorrt_ready(out)
