"""Rule ``qdq-through-data-movement``: a source activation scale quantized in front of data-movement ops
(NNCF propagates its quantizers up through Transpose/Reshape/MaxPool/Pad) is carried to the Conv or MatMul
they feed, so TensorRT quantizes that op's input with the source's own scale instead of leaving it in
float. Checks the op types around the Conv, exact numerics against onnxruntime on the source, and
TensorRT-RTX's parse and build.

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
from apply_rule import build_model, declined, lifted, ops_left, tensor_info, with_activation_qdq  # noqa: E402
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db  # noqa: E402

from trt_bridge.annotations import Site  # noqa: E402
from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import ConvertOptions  # noqa: E402
from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.pipeline import lift_model  # noqa: E402
from trt_bridge.lift.qdq_pair import QDQPair  # noqa: E402
from trt_bridge.lift.scale_through_movement import ScaleThroughMovement  # noqa: E402

HW, C = 8, 32


def _segformer_mlp(own_scale_after: bool) -> tuple[onnx.ModelProto, dict]:
    """SegFormer's Mix-FFN as NNCF quantized it (tokens [1, 64, 32] back to an image for a 3×3 conv):

        x [1, 64, 32] ─ Q(s) ─ DQ(s) ─ Transpose(0, 2, 1) ─ t ─ Reshape [1, 32, 8, 8] ─ r ─ Conv(DQ(W_q, s_w)) ─ y
                                                                 (own_scale_after: r ─ Q(s_r) ─ DQ(s_r) ─ Conv)
    """
    rng = np.random.default_rng(7)
    w = (rng.normal(size=(C, C, 3, 3)) / 12).astype(np.float32)
    s_w = (np.abs(w).reshape(C, -1).max(axis=1) / 127).astype(np.float32)
    inits = {"s": np.array(4.0 / 127, np.float32), "z": np.array(0, np.int8), "s_r": np.array(3.0 / 127, np.float32),
             "shape": np.array([1, C, HW, HW], np.int64), "b": rng.normal(size=(C,)).astype(np.float32) / 10,
             "W_q": np.clip(np.rint(w / s_w.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8), "s_w": s_w}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"], "q_x"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"], "dq_x"),
             helper.make_node("Transpose", ["x_dq"], ["t"], "transpose", perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["r"], "reshape"),
             helper.make_node("DequantizeLinear", ["W_q", "s_w"], ["W"], "dq_w", axis=0)]
    conv_in = "r"
    if own_scale_after:
        nodes += [helper.make_node("QuantizeLinear", ["r", "s_r", "z"], ["r_q"], "q_r"),
                  helper.make_node("DequantizeLinear", ["r_q", "s_r", "z"], ["r_dq"], "dq_r")]
        conv_in = "r_dq"
    nodes.append(helper.make_node("Conv", [conv_in, "W", "b"], ["y"], "dwconv", pads=[1, 1, 1, 1]))
    graph = helper.make_graph(nodes, "mix_ffn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HW * HW, C])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, HW, HW])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), inits


def _feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, HW * HW, C)).astype(np.float32)} for _ in range(count)]


def _conv_input_scale(model: onnx.ModelProto) -> tuple[str, float]:
    """(the tensor the Conv's input Q reads, its scale): the Conv must read DQ(Q(...))."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    dq = producer[conv.input[0]]
    q = producer[dq.input[0]]
    assert (dq.op_type, q.op_type) == ("DequantizeLinear", "QuantizeLinear")
    return producer[q.input[0]].op_type, float(consts[q.input[1]])


def test_source_scale_reaches_the_conv_through_transpose_and_reshape(tmp_path):
    model, inits = _segformer_mlp(own_scale_after=False)
    source = save(model, tmp_path / "nncf.onnx")
    lifted, ctx = lift_model(load_model(source), source)
    assert ctx.fired["qdq-through-data-movement"] == ["transpose", "reshape"]
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers
    converted = assert_qdq_contract(out)
    # (a) the Conv reads Q/DQ of the Reshape's output, with the source's scale (no calibration data given)
    assert _conv_input_scale(converted) == ("Reshape", float(inits["s"]))
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "x" for n in converted.graph.node)
    # (b) exact: moving the source's dequantized values equals quantizing the moved values
    feeds = _feeds(4, 1)
    for want, got in zip(run_ort(source, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # (c) TensorRT-RTX parses and builds it
    assert_tensorrt_ready(out)


def test_a_tensor_quantized_by_the_source_keeps_its_own_scale(tmp_path):
    model, inits = _segformer_mlp(own_scale_after=True)
    source = save(model, tmp_path / "nncf.onnx")
    out = tmp_path / "converted.onnx"
    convert(source, out, ConvertOptions(progress=False))
    converted = assert_qdq_contract(out)
    assert _conv_input_scale(converted) == ("Reshape", float(inits["s_r"]))
    # the source rounds twice (s, then s_r), the output once (s_r): close, not exact; measured 37.5 dB,
    # the bar 3 dB under
    feeds = _feeds(4, 2)
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 34.5
    assert_tensorrt_ready(out)


def _padded_conv(pad_value: float | None) -> onnx.ModelProto:
    """MobileNetV2's explicit "same" padding as NNCF quantized it (the pair in front of the Pad):

        x [1, 32, 8, 8] ─ Q(s) ─ DQ(s) ─ Pad(pads 1, constant pad_value) ─ p ─ Conv(DQ(W_q, s_w), no padding) ─ y
    """
    rng = np.random.default_rng(11)
    w = (rng.normal(size=(C, C, 3, 3)) / 12).astype(np.float32)
    s_w = (np.abs(w).reshape(C, -1).max(axis=1) / 127).astype(np.float32)
    inits = {"s": np.array(4.0 / 127, np.float32), "z": np.array(0, np.int8),
             "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "W_q": np.clip(np.rint(w / s_w.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8), "s_w": s_w}
    pad_inputs = ["x_dq", "pads"]
    if pad_value is not None:
        inits["value"] = np.array(pad_value, np.float32)
        pad_inputs.append("value")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"], "q_x"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"], "dq_x"),
             helper.make_node("Pad", pad_inputs, ["p"], "pad"),
             helper.make_node("DequantizeLinear", ["W_q", "s_w"], ["W"], "dq_w", axis=0),
             helper.make_node("Conv", ["p", "W"], ["y"], "conv")]
    graph = helper.make_graph(nodes, "padded",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, HW, HW])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_source_scale_reaches_the_conv_through_a_zero_pad(tmp_path):
    source = save(_padded_conv(0.0), tmp_path / "nncf.onnx")
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert report.rules and {r.rule: r.nodes for r in report.rules}["qdq-through-data-movement"] == ["pad"]
    converted = assert_qdq_contract(out)
    assert _conv_input_scale(converted) == ("Pad", pytest.approx(4.0 / 127))
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.normal(size=(1, C, HW, HW)).astype(np.float32)} for _ in range(3)]
    for want, got in zip(run_ort(source, feeds), run_ort(out, feeds)):  # exact: 0 is on the int8 grid
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert_tensorrt_ready(out)


def test_a_pad_that_writes_another_constant_is_declined(tmp_path):
    source = save(_padded_conv(0.5), tmp_path / "nncf.onnx")
    lifted, ctx = lift_model(load_model(source), source)
    assert "qdq-through-data-movement" not in ctx.fired
    assert [(d.node, d.reason) for d in ctx.declined if d.rule == "qdq-through-data-movement"] == [
        ("pad", "Pad writes a constant other than 0 (not exactly on the quantization grid)")]


# --- the rule called directly ---------------------------------------------------------------------------------------

def test_rule_carries_the_scale_to_the_conv():
    source, inits = _segformer_mlp(own_scale_after=False)
    out, ctx = lifted(source, (QDQPair(), "q_x"), (ScaleThroughMovement(), "transpose"),
                      (ScaleThroughMovement(), "reshape"))
    assert ops_left(out) == ["Conv", "DequantizeLinear", "Reshape", "Transpose"]  # (the weight's DQ: another rule's)
    assert {name: (spec.scale, spec.sites) for name, spec in ctx.annotations.activations.items()} == {
        "x": (inits["s"], [Site("transpose", 0)]), "t": (inits["s"], [Site("reshape", 0)]),
        "r": (inits["s"], [Site("dwconv", 0)])}
    # exact: the source's scale on the moved tensors changes nothing the source computed
    for want, got in zip(run_ort(source, _feeds(3, 97)), run_ort(with_activation_qdq(out, ctx.annotations),
                                                                 _feeds(3, 97))):
        np.testing.assert_array_equal(got, want)


#   x [1, 4, 6, 6] ─ Q(s) ─ DQ(s) ─ Pad(1, value 0.5) ─ p ─ Conv(W) ─ y
def _padded_with_a_value():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"], "q"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"], "dq"),
             helper.make_node("Pad", ["x_dq", "pads", "value"], ["p"], "pad"),
             helper.make_node("Conv", ["p", "W"], ["y"], "conv")]
    inits = {"s": np.float32(0.03), "z": np.int8(0), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "value": np.float32(0.5), "W": np.ones((4, 4, 3, 3), np.float32)}
    return build_model(nodes, [tensor_info("x", [1, 4, 6, 6])], [tensor_info("y", [1, 4, 6, 6])], inits)


def test_rule_declines_a_pad_value_off_the_grid_untouched():
    reason = declined(_padded_with_a_value(), ScaleThroughMovement(), "pad", after=((QDQPair(), "q"),))
    assert reason == "Pad writes a constant other than 0 (not exactly on the quantization grid)"
