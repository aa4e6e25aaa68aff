"""com.microsoft ``QAttention`` (``lift/qattention.py``), as onnxruntime's own quantizers write it from a fused
``Attention``: the lifted float graph computes the source's projection on its own integer weights exactly,
the conversion builds in TensorRT-RTX and keeps the source's accuracy.

The tests at the end call the rule directly (``apply_rule``: match, then rewrite, on a small graph; a
decline that leaves graph and context as they were)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from apply_rule import (  # noqa: E402
    assert_same_outputs,
    build_model,
    declined,
    dynamic_grid_feed,
    lifted,
    ops_left,
    tensor_info,
)
from helpers import (  # noqa: E402
    convert_calibrated,
    op_types,
    quantize_dynamic,
    run_ort,
    save,
    snr_db,
)

from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.pipeline import lift_model  # noqa: E402
from trt_bridge.lift.qattention import QAttention  # noqa: E402

B, S, D, N = 1, 8, 32, 4


def _float_model(rng):
    """x [1, 8, 32] ─ MatMul(W0) ─ h ─ Attention(W [32, 96], bias, lengths [1]; 4 heads) ─ MatMul(W1) ─ y

    (the MatMuls around it give the quantizers an activation to quantize and a consumer to requantize for)
    """
    inits = {"W0": (rng.normal(size=(D, D)) / 5).astype(np.float32),
             "W": (rng.normal(size=(D, 3 * D)) / 5).astype(np.float32),
             "bias": (rng.normal(size=3 * D) / 10).astype(np.float32),
             "W1": (rng.normal(size=(D, D)) / 5).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], "proj"),
             helper.make_node("Attention", ["h", "W", "bias", "lengths"], ["a"], "attention", domain="com.microsoft",
                              num_heads=N),
             helper.make_node("MatMul", ["a", "W1"], ["y"], "out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D]),
                                           helper.make_tensor_value_info("lengths", TensorProto.INT32, [B])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, D])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()],
                              value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, [B, S, D])])
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports)


def _feeds(rng, count):
    return [{"x": rng.normal(size=(B, S, D)).astype(np.float32),
             "lengths": np.array([rng.integers(4, S + 1)], np.int32)} for _ in range(count)]


def _dequantized_reference(quantized: Path, float_model: onnx.ModelProto) -> onnx.ModelProto:
    """The float model with every weight replaced by the source's dequantized integers (per column where
    per channel): the QAttention's packed weight and the MatMuls' around it."""
    q = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(quantized)).graph.initializer}
    reference = onnx.ModelProto()
    reference.CopyFrom(float_model)
    for init in reference.graph.initializer:
        stem = "Attention_0_qkv_weight" if init.name == "W" and "W_quantized" not in q else init.name
        if f"{stem}_quantized" in q:
            codes, scale = q[f"{stem}_quantized"].astype(np.float64), q[f"{stem}_scale"].astype(np.float64)
            zp = q[f"{stem}_zero_point"].astype(np.float64)
            init.CopyFrom(numpy_helper.from_array(((codes - zp) * scale).astype(np.float32), init.name))
    return reference


def _with_static_input(qpath: Path, fmodel: onnx.ModelProto, calib: list[dict]) -> Path:
    """The dynamic source with the QAttention's DynamicQuantizeLinear replaced by a static uint8
    QuantizeLinear (a scale and zero point covering the calibration range), as a static quantizer writes it:

        h ─ QuantizeLinear(s, z) ─ h_q ─┐
                     s, z (constants) ──┴ QAttention
    """
    from trt_bridge.runtime.session import session

    model = onnx.load(str(qpath))
    dql = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear"
               and any(c.op_type == "QAttention" and c.input[0] == n.output[0] for c in model.graph.node))
    probe = onnx.ModelProto()
    probe.CopyFrom(fmodel)
    probe.graph.output.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, None))
    sess = session(probe)
    h = np.concatenate([sess.run(["h"], f)[0].ravel() for f in calib])
    lo, hi = min(float(h.min()), 0.0), max(float(h.max()), 0.0)
    scale = np.float32((hi - lo) / 255)
    zp = np.uint8(round(-lo / scale))
    model.graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), dql.output[1]),
                                    numpy_helper.from_array(np.array(zp, np.uint8), dql.output[2])])
    quantize = helper.make_node("QuantizeLinear", [dql.input[0], dql.output[1], dql.output[2]], [dql.output[0]],
                                "h_quantize")
    nodes = [quantize if n is dql else n for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return save(model, qpath.with_name("static_input.onnx"))


@pytest.mark.parametrize("mode", ["dynamic", "dynamic-per-channel", "dynamic-uint8", "static-input"])
def test_qattention_lifts_to_the_source_weights_and_builds(tmp_path, mode):
    rng = np.random.default_rng(3)
    fmodel = _float_model(rng)
    fpath = save(fmodel, tmp_path / "float.onnx")
    calib = _feeds(rng, 16)
    from onnxruntime.quantization import QuantType

    qpath = quantize_dynamic(fpath, tmp_path / "quantized.onnx", per_channel=mode.endswith("channel"),
                             weight_type=QuantType.QUInt8 if mode.endswith("uint8") else QuantType.QInt8,
                             extra_options={"DefaultTensorType": TensorProto.FLOAT})
    if mode == "static-input":  # onnxruntime's static quantizers leave Attention float: no QLinear rule for it
        qpath = _with_static_input(qpath, fmodel, calib)
    assert "QAttention" in op_types(qpath)
    lifted, ctx = lift_model(load_model(qpath), qpath)
    assert ctx.fired["qattention"] == ["attention_quant"]
    assert "QAttention" not in op_types(lifted) and "Softmax" in op_types(lifted)
    held = _feeds(rng, 4)
    # the lifted graph is the float model on the source's dequantized weights, whatever quantized its input
    reference = _dequantized_reference(qpath, fmodel)
    for want, got in zip(run_ort(reference, held), run_ort(lifted, held)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    out = tmp_path / "converted.onnx"
    convert_calibrated(qpath, out, calib)
    reference = run_ort(fpath, held)
    source, converted = snr_db(reference, run_ort(qpath, held)), snr_db(reference, run_ort(out, held))
    # measured against the float model, source → converted: dynamic 30.2 → 28.5 dB (a random-weight block, where
    # run-time scales beat static ones), per channel 34.3 → 33.4 dB, static input (the MatMuls dynamic) 32.2 → 31.4 dB
    # the converted SNR against the float model, 3 dB under what was measured (source → converted): a random-weight
    # block, where the dynamic source's run-time scales beat one calibrated scale by 1-2 dB; the static input's
    # source (one uint8 scale over the whole range) is beaten by the calibrated conversion. (The source's own SNR
    # depends on the CPU: onnxruntime's integer kernels saturate 16-bit sums without VNNI.)
    measured = {"dynamic": (30.18, 28.46), "dynamic-per-channel": (32.23, 30.17), "dynamic-uint8": (31.40, 29.02),
                "static-input": (24.40, 28.46)}[mode]
    assert converted >= measured[1] - 3.0, f"{mode}: converted {converted:.1f} dB, source {source:.1f} dB"
    if mode == "static-input":
        assert converted >= source - 1.0


# --- the rule called directly ---------------------------------------------------------------------------------------

#   x [1, 8, 32] ─ DynamicQuantizeLinear ─ x_q, x_s, x_zp
#   QAttention(x_q, W_q int8 [32, 96], bias, x_s, w_s [96], lengths, x_zp, w_zp; 4 heads) ─ y [1, 8, 32]
#   (codes_given: x_q uint8, an input, with constant x_s and x_zp)
def _qattention(codes_given: bool = False):
    rng = np.random.default_rng(83)
    inits = {"W_q": rng.integers(-127, 128, (D, 3 * D)).astype(np.int8), "w_zp": np.zeros(3 * D, np.int8),
             "w_s": (rng.random(3 * D) * 0.004 + 0.002).astype(np.float32),
             "bias": (rng.normal(size=3 * D) / 10).astype(np.float32)}
    nodes = [helper.make_node("QAttention", ["x_q", "W_q", "bias", "x_s", "w_s", "lengths", "x_zp", "w_zp"], ["y"],
                              "qattention", domain="com.microsoft", num_heads=N)]
    if codes_given:
        inits |= {"x_s": np.float32(0.02), "x_zp": np.uint8(128)}
        x = tensor_info("x_q", [B, S, D], TensorProto.UINT8)
    else:
        nodes.insert(0, helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_s", "x_zp"], "dql"))
        x = tensor_info("x", [B, S, D])
    return build_model(nodes, [x, tensor_info("lengths", [B], TensorProto.INT32)], [tensor_info("y", [B, S, D])], inits,
                       microsoft=True)


def test_rule_lifts_the_projection_and_writes_the_attention():
    source = _qattention()
    out, ctx = lifted(source, (QAttention(), "qattention"))
    assert "MatMul" in ops_left(out) and all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    assert ops_left(out).count("MatMul") == 3  # the projection, the scores, the context
    assert ctx.annotations.activations["x"].scale is None  # calibrated later
    rng = np.random.default_rng(89)
    feeds = [{"x": dynamic_grid_feed(rng, (B, S, D)), "lengths": np.array([rng.integers(4, S + 1)], np.int32)}
             for _ in range(3)]
    assert_same_outputs(source, out, feeds, rtol=1e-4, atol=1e-4)


def test_rule_declines_codes_from_elsewhere_untouched():
    reason = declined(_qattention(codes_given=True), QAttention(), "qattention")
    assert reason == "input 'x_q' is neither produced by DynamicQuantizeLinear nor by a QuantizeLinear"
