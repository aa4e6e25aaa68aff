"""lift/fused_dynamic_gemm_plugin.py: onnxruntime's fused dynamic MatMuls (DynamicQuantizeMatMul,
MatMulIntegerToFloat) → one DynamicInt8Gemm node (convert --activations dynamic).

The rule is called directly on small graphs; a quantize_dynamic transformer saved by onnxruntime's optimizer is
converted whole, compared with its source in onnxruntime and built ahead of time by TensorRT-RTX."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from apply_rule import build_model, declined, lifted, ops_left, run_outputs, tensor_info
from helpers import assert_tensorrt_ready, quantize_dynamic, save
from onnx import TensorProto, helper

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, ConvertOptions
from trt_bridge.ir.dynamic_gemm import OP_TYPE, node_arrays
from trt_bridge.lift.fused_dynamic_gemm_plugin import FusedDynamicGemmPlugin

K, N = 16, 6


def _source(op: str, weight_type=np.int8, per_column=False, bias=True) -> onnx.ModelProto:
    """x [2, 3, K] ─ DynamicQuantizeMatMul(W, w_scale, w_zp, bias) ─ y, or
    x ─ DynamicQuantizeLinear ─ MatMulIntegerToFloat(q, W, s, w_scale, z, w_zp, bias) ─ y"""
    rng = np.random.default_rng(0)
    info = np.iinfo(weight_type)
    shape = (N,) if per_column else ()
    inits = {"W": rng.integers(info.min, info.max + 1, size=(K, N)).astype(weight_type),
             "w_scale": rng.uniform(0.001, 0.01, size=shape).astype(np.float32),
             "w_zp": (rng.integers(120, 136, size=shape) if weight_type == np.uint8
                      else rng.integers(-5, 6, size=shape)).astype(weight_type),
             "bias": rng.standard_normal(N).astype(np.float32)}
    b = "bias" if bias else ""
    if op == "DynamicQuantizeMatMul":
        nodes = [helper.make_node(op, ["x", "W", "w_scale", "w_zp", b], ["y"], name="fused", domain="com.microsoft")]
    else:
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
                 helper.make_node(op, ["q", "W", "s", "w_scale", "z", "w_zp", b], ["y"], name="fused",
                                  domain="com.microsoft")]
    return build_model(nodes, [tensor_info("x", [2, 3, K])], [tensor_info("y", [2, 3, N])], inits, microsoft=True)


@pytest.mark.parametrize("op", ["DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
@pytest.mark.parametrize("weight_type", [np.int8, np.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
def test_one_plugin_node_computes_what_the_fused_op_did(op, weight_type, per_column):
    source = _source(op, weight_type, per_column)
    out, ctx = lifted(source, (FusedDynamicGemmPlugin(), "fused"))
    assert ops_left(out) == [OP_TYPE]
    arrays = node_arrays(out.graph.node[0])
    assert arrays["weight"].dtype == np.int8 and arrays["bias"] is not None and not ctx.annotations.activations
    rng = np.random.default_rng(1)
    feeds = [{"x": (rng.standard_normal((2, 3, K)) * 3).astype(np.float32)} for _ in range(4)]
    for want, got in zip(run_outputs(source, feeds), run_outputs(out, feeds)):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)


def test_declines_a_bias_that_is_not_constant():
    model = _source("DynamicQuantizeMatMul")
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "bias"))
    model.graph.input.append(tensor_info("bias", [N], TensorProto.FLOAT))
    assert "bias 'bias'" in declined(model, FusedDynamicGemmPlugin(), "fused")


def test_declines_what_the_static_rule_declines():
    model = _source("MatMulIntegerToFloat")
    model.graph.node[1].input[2] = "w_scale"  # the activation scale is not the DynamicQuantizeLinear's
    assert "is not the scale of" in declined(model, FusedDynamicGemmPlugin(), "fused")


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_convert_an_optimized_dynamic_model(tmp_path, per_channel):
    fpath = save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", per_channel=per_channel)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(dpath), options, providers=["CPUExecutionProvider"])
    source = tmp_path / "optimized.onnx"
    out = tmp_path / "plugin.onnx"
    report = convert(source, out, ConvertOptions(activations=ActivationOptions("dynamic"), progress=False))
    assert {hit.rule: len(hit.nodes) for hit in report.rules} == {"fused-dynamic-gemm-plugin": 6, "fused-matmul": 1}
    assert report.calibration is None and len(report.plugin["layers"]) == 6
    feeds = [{"x": f} for f in samples.sequence_feeds(4, 2, 16, 64)]
    # measured: the fused kernels' outputs, bit for bit (onnxruntime 1.32)
    for want, got in zip(run_outputs(onnx.load(str(source)), feeds), run_outputs(onnx.load(str(out)), feeds)):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    assert_tensorrt_ready(out)
