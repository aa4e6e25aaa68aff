"""lift/float_gemm_plugin.py: a float model's MatMuls → DynamicInt8Gemm nodes (convert --activations dynamic on a
float model: INT8 without calibration data).

The rule is called directly on a small graph (op types, the weight's per-column int8, onnxruntime against the
float model); a float transformer is converted whole and built ahead of time by TensorRT-RTX."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from apply_rule import build_model, lifted, ops_left, run_outputs, tensor_info
from helpers import assert_tensorrt_ready, quantize_static, run_ort, save, snr_db
from onnx import helper
from onnxruntime.quantization import QuantFormat

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, ConvertOptions
from trt_bridge.ir.dynamic_gemm import OP_TYPE, node_arrays
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.float_gemm_plugin import FloatGemmPlugin, quantized_columns

K, N = 32, 12


def _float_model(weight: np.ndarray | None = None):
    """x [2, 5, K] ─ MatMul(W) ─ Add(bias) ─ y;  x ─ MatMul(x^T) ─ scores (activation × activation)"""
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((K, N)).astype(np.float32) if weight is None else weight,
             "bias": rng.standard_normal(N).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
             helper.make_node("Add", ["xw", "bias"], ["y"], name="bias"),
             helper.make_node("Transpose", ["x"], ["xt"], name="t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["scores"], name="scores")]
    return build_model(nodes, [tensor_info("x", [2, 5, K])],
                       [tensor_info("y", [2, 5, N]), tensor_info("scores", [2, 5, 5])], inits)


@pytest.mark.parametrize("granularity", ["tensor", "token"])
def test_a_float_matmul_becomes_one_plugin_node(granularity):
    source = _float_model()
    out, _ = lifted(source, (FloatGemmPlugin(granularity), "matmul"))
    assert ops_left(out) == sorted([OP_TYPE, "MatMul", "Transpose"])
    arrays = node_arrays(next(n for n in out.graph.node if n.op_type == OP_TYPE))
    w = next(onnx.numpy_helper.to_array(i) for i in source.graph.initializer if i.name == "W")
    q, scale = quantized_columns(w)
    assert np.array_equal(arrays["weight"], q) and np.array_equal(arrays["weight_scale"], scale)
    assert np.abs(arrays["weight"]).max() == 127 and not arrays["weight_zero_point"].any()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((2, 5, K)).astype(np.float32)} for _ in range(4)]
    want, got = run_outputs(source, feeds), run_outputs(out, feeds)
    assert snr_db([w_[0] for w_ in want], [g[0] for g in got]) > 35
    for w_, g in zip(want, got):
        assert np.array_equal(w_[1], g[1])  # the activation × activation product is left alone


def test_activation_products_and_bad_weights_are_not_taken():
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(_float_model())
    scores = next(n for n in graph.nodes if n.name == "scores")
    assert FloatGemmPlugin().match(LiftContext(graph), scores) == NOT_MINE
    bad = np.ones((K, N), np.float32)
    bad[0, 0] = np.inf
    graph = gs.import_onnx(_float_model(bad))
    matmul = next(n for n in graph.nodes if n.name == "matmul")
    assert "not a finite float" in FloatGemmPlugin().match(LiftContext(graph), matmul)


@pytest.mark.parametrize("granularity", ["tensor", "token"])
def test_convert_a_float_transformer_without_calibration_data(tmp_path, granularity):
    model = samples.transformer_block(layers=1)
    fpath = save(model, tmp_path / "float.onnx")
    out = tmp_path / "plugin.onnx"
    report = convert(fpath, out, ConvertOptions(activations=ActivationOptions("dynamic", granularity),
                                                progress=False))
    assert report.calibration is None and len(report.plugin["layers"]) == 6
    assert report.precision["counts"]["int8"] == 6
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 30
    assert_tensorrt_ready(out)


def test_a_quantized_source_keeps_its_float_matmuls_float(tmp_path):
    """--activations dynamic on a static Q/DQ source: the float-model rule does not run, the source's choices
    stand (tests/test_plugins.py checks the warning that the plugin took nothing)."""
    fpath = save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    feeds = [{"x": f} for f in samples.sequence_feeds(8, 1, 16, 64)]
    qpath = quantize_static(fpath, tmp_path / "qdq.onnx", feeds, quant_format=QuantFormat.QDQ)
    report = convert(qpath, tmp_path / "out.onnx", ConvertOptions(activations=ActivationOptions("dynamic"),
                                                                  progress=False))
    assert report.plugin["layers"] == [] and "float-gemm-plugin" not in {h.rule for h in report.rules}
    assert report.precision["counts"]["int8"] > 0  # the source's own static INT8
