"""Placement on float sources (placement.py): exactly which tensors get Q/DQ, and the overrides.

Float models are converted with calibration data; the tests check the set of quantized
activations and weights, the shared Concat scale, accuracy against the float model in
onnxruntime, and a TensorRT-RTX build.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, RangeOptions, ScaleOptions, ScalePolicy
from trt_bridge.place.policies import PlacementOptions, PlacementPolicy


#  x[1,16,8,8] ─ Conv1 ─ Relu ─ r1 ─┬─ Conv2 ─ c2 ─ Add ─ Relu ─ r2 ─┬─ Conv3 ─ c3 ─┐
#                                   └──────────────┘ (skip)          └─ Conv4 ─ c4 ─ Concat ─ cat ─ Conv5 ─ y
#  (channels: 16 everywhere, 32 after the Concat; ``c`` scales them all down, below what int8 kernels want)
def residual_concat_net(seed: int = 0, c: int = 16) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(name, shape):
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), name)

    node = helper.make_node
    nodes = [node("Conv", ["x", "W1"], ["c1"], "conv1", pads=[1, 1, 1, 1]), node("Relu", ["c1"], ["r1"], "relu1"),
             node("Conv", ["r1", "W2"], ["c2"], "conv2", pads=[1, 1, 1, 1]), node("Add", ["c2", "r1"], ["a"], "add"),
             node("Relu", ["a"], ["r2"], "relu2"), node("Conv", ["r2", "W3"], ["c3"], "conv3", pads=[1, 1, 1, 1]),
             node("Conv", ["r2", "W4"], ["c4"], "conv4"), node("Concat", ["c3", "c4"], ["cat"], "concat", axis=1),
             node("Conv", ["cat", "W5"], ["y"], "conv5")]
    graph = helper.make_graph(nodes, "residual_concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                       [1, c, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])],
                              [w("W1", (c, c, 3, 3)), w("W2", (c, c, 3, 3)), w("W3", (c, c, 3, 3)),
                               w("W4", (c, c, 1, 1)), w("W5", (c, 2 * c, 1, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _convert(tmp_path, model, feeds, **placement):
    src = save(model, tmp_path / "float.onnx")
    name = model.graph.input[0].name
    np.savez(tmp_path / "calib.npz", **{name: feeds})
    out = tmp_path / "int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              placement=PlacementOptions(**placement),
                                              ranges=RangeOptions(recenter=False), progress=False))
    return src, out, report


def _quantized(report):
    acts = {q["tensor"]: q for q in report.quantized if q["kind"] == "activation"}
    weights = {q["tensor"]: q for q in report.quantized if q["kind"] == "weight"}
    return acts, weights


def test_conv_net_with_residual_add_and_concat(tmp_path):
    src, out, report = _convert(tmp_path, residual_concat_net(), samples.image_feeds(32, 1, (1, 16, 8, 8)))
    acts, weights = _quantized(report)
    # inputs of weighted ops; the residual skip r1 at the Add; the Concat's inputs with its output
    assert set(acts) == {"x", "r1", "r2", "c3", "c4", "cat"}
    assert set(acts["r1"]["consumers"]) == {"conv2", "add"}
    assert set(acts["r2"]["consumers"]) == {"conv3", "conv4"}
    assert acts["c3"]["consumers"] == ("concat",) and acts["cat"]["consumers"] == ("conv5",)
    # nothing on the outputs of weighted ops that feed no quantized op (c2 → Add), nor on y
    assert {"c2", "a", "y", "c1"}.isdisjoint(acts)
    # one shared scale across the Concat's inputs and output: the largest, so nothing clips
    assert acts["c3"]["scale"] == acts["c4"]["scale"] == acts["cat"]["scale"]
    assert set(weights) == {"W1", "W2", "W3", "W4", "W5"}
    assert all(w["axis"] == 0 and len(w["scale"]) == 16 for w in weights.values())
    assert all(q["source"] == "calibration" for q in acts.values())
    assert_qdq_contract(out)
    held_out = [{"x": f} for f in samples.image_feeds(16, 2, (1, 16, 8, 8))]
    assert snr_db(run_ort(src, held_out), run_ort(out, held_out)) > 30
    assert_tensorrt_ready(out)


def test_transformer_block(tmp_path):
    """Weighted MatMul inputs only: not LayerNormalization, Softmax, nor the attention products."""
    model = samples.transformer_block(layers=1)
    src, out, report = _convert(tmp_path, model, samples.sequence_feeds(16, 1, 16, 64))
    acts, weights = _quantized(report)
    assert set(acts) == {"layer0.ln1.out", "layer0.ctx.m", "layer0.ln2.out", "layer0.gelu"}
    assert set(acts["layer0.ln1.out"]["consumers"]) == {"layer0.attn.q/MatMul", "layer0.attn.k/MatMul",
                                                        "layer0.attn.v/MatMul"}
    assert len(weights) == 6 and all(w["axis"] == 1 for w in weights.values())
    attention = [x for x in report.left_in_float if "attention" in x.reason]
    assert len(attention) == 2  # q·kᵀ and softmax·v stay float
    assert_qdq_contract(out)
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    assert snr_db(run_ort(src, held_out), run_ort(out, held_out)) > 30
    assert_tensorrt_ready(out)


def test_include_and_exclude(tmp_path):
    feeds = samples.image_feeds(16, 1, (1, 16, 8, 8))
    _, out, report = _convert(tmp_path, residual_concat_net(), feeds, exclude_nodes="conv[34]$",
                              exclude_ops="Concat")
    acts, weights = _quantized(report)
    assert set(weights) == {"W1", "W2", "W5"} and set(acts) == {"x", "r1", "cat"}
    assert_tensorrt_ready(out)
    _, out, report = _convert(tmp_path, residual_concat_net(), feeds, include_ops="Relu")
    acts, _ = _quantized(report)
    assert {"c1", "a"} <= set(acts)  # the Relus' inputs, on request
    assert_tensorrt_ready(out)


def test_layers_too_small_for_int8_kernels_stay_float_unless_asked(tmp_path):
    """4-channel convs gain nothing from int8 in TensorRT: left in float (with the reason), or forced."""
    feeds = samples.image_feeds(16, 1, (1, 4, 8, 8))
    _, out, report = _convert(tmp_path, residual_concat_net(c=4), feeds)
    acts, weights = _quantized(report)
    assert not weights and not acts
    assert len([x for x in report.left_in_float if "too small" in x.reason]) == 5
    _, out, report = _convert(tmp_path, residual_concat_net(c=4), feeds, include_ops="Conv")
    acts, weights = _quantized(report)
    assert len(weights) == 5 and {"x", "r1", "r2", "cat"} <= set(acts)
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


def test_include_ops_matmul_quantizes_attention(tmp_path):
    _, out, report = _convert(tmp_path, samples.transformer_block(layers=1), samples.sequence_feeds(8, 1, 16, 64),
                              include_ops="MatMul")
    acts, _ = _quantized(report)
    assert len(acts) > 4 and not [x for x in report.left_in_float if "attention" in x.reason]
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


def test_preserve_keeps_every_quantized_edge_of_a_static_source(tmp_path):
    from helpers import quantize_static
    from onnxruntime.quantization import QuantFormat
    from test_static_quantized import zoo_net

    fpath = save(zoo_net(), tmp_path / "float.onnx")
    calib = [{"x": f} for f in samples.image_feeds(16, 1, (1, 3, 16, 16))]
    qpath = quantize_static(fpath, tmp_path / "qdq.onnx", calib, quant_format=QuantFormat.QDQ)
    reports = {}
    for policy in PlacementPolicy:
        out = tmp_path / f"{policy.value}.onnx"
        reports[policy] = convert(qpath, out, ConvertOptions(placement=PlacementOptions(policy=policy), progress=False))
        assert_qdq_contract(out)
        assert_tensorrt_ready(out)
    kept = {p: {q["tensor"] for q in r.quantized if q["kind"] == "activation"} for p, r in reports.items()}
    assert kept[PlacementPolicy.TENSORRT] < kept[PlacementPolicy.PRESERVE]
    consumers = {c for q in reports[PlacementPolicy.PRESERVE].quantized for c in q["consumers"]}
    assert {"sigmoid", "softmax", "gap"} <= {c.split("/")[0] for c in consumers} | consumers
    assert reports[PlacementPolicy.TENSORRT].placement == "tensorrt"


@pytest.mark.parametrize("scales", ["model", "data"])
def test_scales_from_the_model_or_from_data(tmp_path, scales):
    from helpers import quantize_static
    from onnxruntime.quantization import QuantFormat
    from test_static_quantized import zoo_net

    fpath = save(zoo_net(), tmp_path / "float.onnx")
    calib = samples.image_feeds(32, 1, (1, 3, 16, 16))
    qpath = quantize_static(fpath, tmp_path / "qop.onnx", [{"x": f} for f in calib], quant_format=QuantFormat.QOperator)
    np.savez(tmp_path / "calib.npz", x=calib)
    out = tmp_path / "out.onnx"
    report = convert(qpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                scales=ScaleOptions(policy=ScalePolicy(scales)), progress=False))
    sources = {q["source"] for q in report.quantized if q["kind"] == "activation"}
    assert sources == {"model" if scales == "model" else "calibration"} and report.scales == scales
    held_out = [{"x": f} for f in samples.image_feeds(16, 2, (1, 3, 16, 16))]
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 35
    assert_tensorrt_ready(out)
