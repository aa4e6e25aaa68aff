"""The global-average-pool sanitize step (sanitize/global_pool.py) and calibrated scales that would be subnormal,
both found converting transformers' EfficientNet."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_ort, save, snr_db
from onnx import TensorProto, helper

from trt_bridge.calibrate.observers import RangeObserver
from trt_bridge.calibrate.session import CalibrationResult
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.ir.values import FLOAT32_TINY
from trt_bridge.prepare.global_pool import GlobalAveragePool, after_folding


#   x[1,8,H,W] ─ Conv(8→32, 1×1) ─ AveragePool(kernel k×k, strides k×k, ceil_mode=1) ─ Flatten ─ Gemm(32→24) ─ y
def _pooled_net(hw: int = 2, kernel: int = 320, gain: float = 1.0) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = gain * rng.normal(0, 0.5, (32, 8, 1, 1))
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [32, 8, 1, 1], w.ravel()),
             helper.make_tensor("b", TensorProto.FLOAT, [32], rng.normal(0, 0.1, 32)),
             helper.make_tensor("fw", TensorProto.FLOAT, [24, 32], rng.normal(0, 0.3, (24, 32)).ravel())]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("AveragePool", ["c"], ["p"], name="pool", kernel_shape=[kernel, kernel],
                              strides=[kernel, kernel], ceil_mode=1, count_include_pad=1, pads=[0, 0, 0, 0]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fw"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(count: int, seed: int, hw: int = 2) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 8, hw, hw)).astype(np.float32)} for _ in range(count)]


def test_a_window_over_the_whole_input_becomes_global_average_pool_exactly():
    model = _pooled_net()
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(model))
    changes = GlobalAveragePool().apply(graph)
    assert [c.node for c in changes] == ["pool"] and "320×320" in changes[0].what
    rewritten = gs.export_onnx(graph)
    assert "AveragePool" not in op_types(rewritten) and "GlobalAveragePool" in op_types(rewritten)
    feeds = _feeds(4, 1)
    for want, got in zip(run_ort(model, feeds), run_ort(rewritten, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_smaller_window_or_an_unknown_shape_is_left_alone():
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(_pooled_net(hw=4, kernel=2)))
    assert GlobalAveragePool().apply(graph) == []
    graph = gs.import_onnx(_pooled_net())  # no inferred shapes: the pool's input is not known to be covered
    assert GlobalAveragePool().apply(graph) == []
    # once shapes are inferred again (after folding), the same node is rewritten
    assert [c.node for c in after_folding(graph)] == ["pool"]


def test_transformers_efficientnet_pooler_converts_and_builds(tmp_path):
    fpath = save(_pooled_net(), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in _feeds(16, 1)]))
    out = tmp_path / "int8.onnx"
    report = convert(fpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                progress=False))
    assert [c["pass_name"] for c in report.sanitized].count("global-average-pool") == 1
    assert "AveragePool" not in op_types(out) and {"GlobalAveragePool", "QuantizeLinear"} <= op_types(out)
    held_out = _feeds(8, 2)
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 33.0  # measured 36.6
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


def test_a_range_too_small_for_a_normal_scale_gets_the_smallest_normal_one(tmp_path):
    observer = RangeObserver("max")
    observer.update(np.array([7e-37, -3e-37], np.float32))
    result = CalibrationResult({"t": observer}, 1, 0.0, "max")
    assert result.scale("t") == FLOAT32_TINY  # 7e-37 / 127 is subnormal
    # end to end: activations around 1e-37 (a random-weight EfficientNet's projection output reached 7e-37) and
    # weights too small for a normal per-channel scale
    fpath = save(_pooled_net(gain=1e-36), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] * np.float32(1e-30) for f in _feeds(16, 1)]))
    out = tmp_path / "int8.onnx"
    convert(fpath, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False))
    scales = [onnx.numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer if i.name.endswith("scale")]
    assert len(scales) >= 4 and all((s >= FLOAT32_TINY).all() for s in scales)
    assert_tensorrt_ready(out)
