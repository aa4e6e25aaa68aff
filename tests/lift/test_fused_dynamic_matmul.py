"""onnxruntime-optimized dynamic models: DynamicQuantizeMatMul, MatMulIntegerToFloat, FusedMatMul
(lift/fused_dynamic_matmul.py, lift/fused_matmul.py).

The tests at the end call the rule directly (``apply_rule``: match, then rewrite, on a small graph; a
decline that leaves graph and context as they were)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
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
    run_ort,
    save,
    snr_db,
)
from onnx import TensorProto, helper, numpy_helper

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.lift.fused_dynamic_matmul import FusedDynamicMatMul

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _optimized(dynamic, out):
    """What onnxruntime writes with `optimized_model_filepath` at the extended level: fused contrib ops."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(dynamic), options, providers=["CPUExecutionProvider"])
    return out


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_optimized_transformer_block(tmp_path, per_channel):
    model = samples.transformer_block(layers=1)
    fpath = save(model, tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", per_channel=per_channel)
    opath = _optimized(dpath, tmp_path / "optimized.onnx")
    ops = Counter((n.domain, n.op_type) for n in onnx.load(str(opath)).graph.node)
    assert ops[("com.microsoft", "DynamicQuantizeMatMul")] and ops[("com.microsoft", "MatMulIntegerToFloat")]
    assert ops[("com.microsoft", "FusedMatMul")] == 1

    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    assert_lift_is_exact(model, opath, held_out)

    np.savez(tmp_path / "calib.npz", x=samples.sequence_feeds(32, 1, 16, 64)[:, 0])
    out = tmp_path / "converted.onnx"
    report = convert(opath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                progress=False))
    fired = {hit.rule: len(hit.nodes) for hit in report.rules}
    assert fired == {"fused-dynamic-matmul": 6, "fused-matmul": 1}
    converted = assert_qdq_contract(out)
    assert not op_types(converted) & {"DynamicQuantizeMatMul", "MatMulIntegerToFloat", "FusedMatMul",
                                      "DynamicQuantizeLinear"}
    reference = run_ort(fpath, held_out)
    snr_source, snr_out = snr_db(reference, run_ort(dpath, held_out)), snr_db(reference, run_ort(out, held_out))
    assert snr_out >= snr_source - 1.0, (snr_source, snr_out)
    assert_tensorrt_ready(out)


#   a[2,3,4,5], b[2,3,6,5] ─ FusedMatMul(alpha=0.5, transB=1) ─ y[2,3,4,6]
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_fused_matmul_with_transpose_and_alpha(tmp_path, dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], "fmm", domain="com.microsoft", alpha=0.5, transB=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", elem, [2, 3, 4, 5]),
                                            helper.make_tensor_value_info("b", elem, [2, 3, 6, 5])],
                              [helper.make_tensor_value_info("y", elem, [2, 3, 4, 6])])
    model = helper.make_model(graph, opset_imports=OPSETS)
    src = save(model, tmp_path / "fmm.onnx")
    out = tmp_path / "out.onnx"
    # a float model needs a scale source (--int8 refuses one without); the activation × activation MatMul stays float
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(random=2), progress=False))
    assert report.rules[0].rule == "fused-matmul"
    converted = onnx.load(str(out))
    assert [n.op_type for n in converted.graph.node] == ["Transpose", "MatMul", "Mul"]
    assert [i.domain for i in converted.opset_import] == [""]
    alpha = next(i for i in converted.graph.initializer if "alpha" in i.name)
    assert alpha.data_type == elem  # Mul(float16, float32) would not type-check
    rng = np.random.default_rng(0)
    feeds = [{"a": rng.standard_normal((2, 3, 4, 5)).astype(dtype),
              "b": rng.standard_normal((2, 3, 6, 5)).astype(dtype)}]
    expected = 0.5 * feeds[0]["a"].astype(np.float32) @ feeds[0]["b"].astype(np.float32).swapaxes(-1, -2)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    np.testing.assert_allclose(run_ort(converted, feeds)[0].astype(np.float32), expected, rtol=tol, atol=tol)
    if dtype == np.float32:
        np.testing.assert_allclose(run_ort(converted, feeds)[0], run_ort(src, feeds)[0], rtol=1e-5, atol=1e-5)
    assert_tensorrt_ready(out)


def test_matmul_integer_to_float_needs_dynamic_quantize_linear(tmp_path):
    """An int8 A fed from a graph input has no float meaning: declined with the reason, convert fails clearly."""
    rng = np.random.default_rng(0)
    node = helper.make_node("MatMulIntegerToFloat", ["a_q", "W_q", "a_scale", "w_scale"], ["y"], "mitf",
                            domain="com.microsoft")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a_q", TensorProto.UINT8, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(rng.integers(-100, 100, (4, 3)).astype(np.int8), "W_q"),
         numpy_helper.from_array(np.array(0.1, np.float32), "a_scale"),
         numpy_helper.from_array(np.array(0.02, np.float32), "w_scale")])
    model = helper.make_model(graph, opset_imports=OPSETS)
    with pytest.raises(UnsupportedPatternError, match="MatMulIntegerToFloat 'mitf'.*not come from DynamicQuantize"):
        convert(save(model, tmp_path / "m.onnx"), tmp_path / "out.onnx", ConvertOptions(
            calibration=CalibrationOptions(random=1), progress=False))


def test_matmul_integer_to_float_without_the_activation_zero_point_is_declined(tmp_path):
    """MatMulIntegerToFloat(x_q, W_q, s_x, s_w) without a_zero_point multiplies raw uint8 codes."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "s_x", "x_zp"], "dql"),
             helper.make_node("MatMulIntegerToFloat", ["x_q", "W_q", "s_x", "w_scale"], ["y"], "mitf",
                              domain="com.microsoft")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(rng.integers(-100, 100, (4, 3)).astype(np.int8), "W_q"),
         numpy_helper.from_array(np.array(0.02, np.float32), "w_scale")])
    model = helper.make_model(graph, opset_imports=OPSETS)
    message = "MatMulIntegerToFloat 'mitf'.*zero point .missing. is not 'x_zp'"
    with pytest.raises(UnsupportedPatternError, match=message):
        convert(save(model, tmp_path / "m.onnx"), tmp_path / "out.onnx", ConvertOptions(
            calibration=CalibrationOptions(random=1), progress=False))


# --- the rule called directly ---------------------------------------------------------------------------------------

#   x [4, 16] ─ DynamicQuantizeMatMul(W_q int8 [16, 8], w_s [8], w_zp, b) ─ y
#   (codes_given: a_q uint8 [4, 16], an input ─ MatMulIntegerToFloat(W_q, a_s, w_s, a_zp, w_zp, b) ─ y)
def _fused_dynamic(codes_given: bool = False):
    rng = np.random.default_rng(73)
    inits = {"W_q": rng.integers(-127, 128, (16, 8)).astype(np.int8), "w_zp": np.zeros(8, np.int8),
             "w_s": (rng.random(8) * 0.01 + 0.002).astype(np.float32), "b": rng.normal(size=8).astype(np.float32),
             "a_s": np.float32(0.02), "a_zp": np.uint8(128)}
    if codes_given:
        node = helper.make_node("MatMulIntegerToFloat", ["a_q", "W_q", "a_s", "w_s", "a_zp", "w_zp", "b"], ["y"],
                                "fused", domain="com.microsoft")
        x = tensor_info("a_q", [4, 16], TensorProto.UINT8)
    else:
        node = helper.make_node("DynamicQuantizeMatMul", ["x", "W_q", "w_s", "w_zp", "b"], ["y"], "fused",
                                domain="com.microsoft")
        x = tensor_info("x", [4, 16])
    return build_model([node], [x], [tensor_info("y", [4, 8])], inits, microsoft=True)


def test_rule_lifts_dynamic_quantize_matmul_to_a_float_matmul():
    source = _fused_dynamic()
    out, ctx = lifted(source, (FusedDynamicMatMul(), "fused"))
    assert ops_left(out) == ["Add", "MatMul"]
    assert ctx.annotations.activations["x"].scale is None  # calibrated later
    rng = np.random.default_rng(79)
    assert_same_outputs(source, out, [{"x": dynamic_grid_feed(rng, (4, 16))} for _ in range(3)], rtol=1e-4)


def test_rule_declines_codes_from_elsewhere_untouched():
    reason = declined(_fused_dynamic(codes_given=True), FusedDynamicMatMul(), "fused")
    assert reason == "input 'a_q' does not come from DynamicQuantizeLinear"
