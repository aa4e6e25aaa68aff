"""Gemm biases of every shape ONNX lets C broadcast from, as onnxruntime's QDQ export writes them (issue 38: a
JAX-converted classifier's ``MatMulAddFusion`` Gemm, "Gemm: Invalid bias shape for broadcast").

```
 x [4, 32] ─ Gemm(W, C: [16] | [1, 16] | [4, 1] | [] ; transB, alpha 0.5, beta 2) ─ Relu ─ y [4, 16]
 x [2, 4, 32] ─ MatMul(W) ─ Add(b [16]) ─ Relu   →  onnxruntime's MatMulAddFusion: Reshape ─ Gemm ─ Reshape ─ Relu
```
Each source is onnxruntime's ``quantize_static`` QDQ (uint8 activations, int32 bias); the converted model keeps the
Gemm with its bias's shape, follows the source in onnxruntime, and TensorRT-RTX builds it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import assert_tensorrt_ready, op_types, quantize_static, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions


def _gemm(bias_shape: list[int], trans_b: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (16, 32) if trans_b else (32, 16)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], "fc", transB=trans_b, alpha=0.5, beta=2.0),
             helper.make_node("Relu", ["h"], ["y"], "relu")]
    graph = helper.make_graph(nodes, "jax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(rng.normal(0, 0.1, bias_shape).astype(np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def _fused(tmp_path) -> onnx.ModelProto:
    """A 3-D MatMul + Add as onnxruntime's basic optimizations leave it: Reshape → Gemm → Reshape."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], "mm"), helper.make_node("Add", ["m", "b"], ["h"], "add"),
             helper.make_node("Relu", ["h"], ["y"], "relu")]
    graph = helper.make_graph(nodes, "jax3d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 16])],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (32, 16)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7),
               tmp_path / "matmul_add.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "fused.onnx")
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    assert [n.op_type for n in fused.graph.node] == ["Reshape", "Gemm", "Reshape", "Relu"]
    return fused


@pytest.mark.parametrize("form", ["1xN", "Mx1", "scalar", "fused-3d"])
def test_gemm_bias_shapes_convert_follow_the_source_and_build(form, tmp_path):
    if form == "fused-3d":
        float_model, shape = _fused(tmp_path), (2, 4, 32)
    else:
        float_model = _gemm({"1xN": [1, 16], "Mx1": [4, 1], "scalar": []}[form], trans_b=int(form != "Mx1"))
        shape = (4, 32)
    rng = np.random.default_rng(2)
    feeds = [{"x": np.abs(rng.normal(0, 1, shape)).astype(np.float32)} for _ in range(8)]
    src = quantize_static(save(float_model, tmp_path / "float.onnx"), tmp_path / "qdq.onnx", feeds)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.stack([f["x"] for f in feeds]))
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(calib)), check=False,
                                              progress=False))
    assert not report.remaining_blockers
    assert "Gemm" in op_types(out) and {"QuantizeLinear", "DequantizeLinear"} <= op_types(out)
    bias = {t.name: list(t.dims) for t in onnx.load(str(out)).graph.initializer}
    gemm = next(n for n in onnx.load(str(out)).graph.node if n.op_type == "Gemm")
    assert len(gemm.input) == 3 and gemm.input[2] in bias  # a float bias, as TensorRT takes it
    held = [{"x": np.abs(rng.normal(0, 1, shape)).astype(np.float32)} for _ in range(4)]
    assert snr_db(run_ort(src, held), run_ort(out, held)) > 30
    assert_tensorrt_ready(out)
