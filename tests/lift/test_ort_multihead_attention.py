"""onnxruntime's fused com.microsoft ``MultiHeadAttention`` written back as standard ONNX
(``lift/ort_multihead_attention.py``): self and cross attention, packed bias, every key padding mask form,
``unidirectional``, against onnxruntime running the fused node; TensorRT-RTX builds the converted model.

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
from apply_rule import assert_same_outputs, declined, lifted, ops_left  # noqa: E402
from helpers import convert_calibrated, op_types, run_ort, save, snr_db  # noqa: E402

from trt_bridge.errors import UnsupportedPatternError  # noqa: E402
from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.ort_multihead_attention import OrtMultiHeadAttention  # noqa: E402
from trt_bridge.lift.pipeline import lift_model  # noqa: E402

B, S, D, N = 2, 6, 16, 2
RNG = np.random.default_rng(7)
MASKS = {None: None, "lengths": ["B"], "raw2d": ["B", "L"], "raw3d": ["B", "S", "L"]}


def _mha_model(form, length, unidirectional=0, bias=True):
    """x [B, S, 16], memory [B, L, 16] (L = S: self attention)
       x ─ MatMul(Wq) ─┐
       m ─ MatMul(Wk) ─┼ MultiHeadAttention(bias?, key_padding_mask?; 2 heads) ─ y [B, S, 16]
       m ─ MatMul(Wv) ─┘
    """
    inits = {n: (RNG.normal(size=(D, D)) / 3).astype(np.float32) for n in ("Wq", "Wk", "Wv")}
    inits["bias"] = (RNG.normal(size=3 * D) / 10).astype(np.float32)
    memory = "x" if length == S else "m"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", D])]
    if memory == "m":
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, ["B", "L", D]))
    names = ["q", "k", "v", "bias" if bias else "", ""]
    if form is not None:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, MASKS[form]))
        names[4] = "mask"
    while not names[-1]:
        names.pop()
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], "q_proj"),
             helper.make_node("MatMul", [memory, "Wk"], ["k"], "k_proj"),
             helper.make_node("MatMul", [memory, "Wv"], ["v"], "v_proj"),
             helper.make_node("MultiHeadAttention", names, ["y"], "mha", domain="com.microsoft", num_heads=N,
                              unidirectional=unidirectional)]
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", D])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items() if bias or n != "bias"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(form, length, count):
    feeds = []
    for _ in range(count):
        feed = {"x": RNG.normal(size=(B, S, D)).astype(np.float32)}
        if length != S:
            feed["m"] = RNG.normal(size=(B, length, D)).astype(np.float32)
        if form == "lengths":
            feed["mask"] = np.array([length - 2, length], np.int32)
        elif form == "raw2d":
            feed["mask"] = (np.arange(length)[None] < np.array([[length - 3], [length]])).astype(np.int32)
        elif form == "raw3d":
            feed["mask"] = (np.random.default_rng(1).random((B, S, length)) > 0.3).astype(np.int32)
        feeds.append(feed)
    return feeds


@pytest.mark.parametrize(("length", "unidirectional"), [(S, 0), (S, 1), (9, 0)], ids=["self", "causal", "cross"])
@pytest.mark.parametrize("form", list(MASKS))
def test_multihead_attention_is_written_back_exactly(tmp_path, form, length, unidirectional):
    src = save(_mha_model(form, length, unidirectional, bias=form != "raw3d"), tmp_path / "mha.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert ctx.fired["ort-multihead-attention"] == ["mha"]
    assert all(n.domain in ("", "ai.onnx") for n in lifted.graph.node) and "Softmax" in op_types(lifted)
    feeds = _feeds(form, length, 2)
    for want, got in zip(run_ort(src, feeds), run_ort(lifted, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_converted_multihead_attention_builds_in_tensorrt(tmp_path):
    src = save(_mha_model("lengths", S), tmp_path / "mha.onnx")
    calib = _feeds("lengths", S, 8)
    out = tmp_path / "mha.int8.onnx"
    convert_calibrated(src, out, calib)
    held = _feeds("lengths", S, 4)
    assert snr_db(run_ort(src, held), run_ort(out, held)) > 33  # measured 36.6 dB


def test_a_key_value_cache_is_declined_with_its_reason(tmp_path):
    model = _mha_model(None, S)
    node = model.graph.node[-1]
    node.input.extend(["", "", "past_key", "past_value"])
    for name in ("past_key", "past_value"):
        model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", N, "P", D // N]))
    src = save(model, tmp_path / "cached.onnx")
    with pytest.raises(UnsupportedPatternError, match=r"MultiHeadAttention 'mha'.*past_key"):
        lift_model(onnx.load(str(src)), src)


# --- the rule called directly ---------------------------------------------------------------------------------------

def test_rule_writes_standard_onnx():
    source = _mha_model("lengths", S)
    out, _ = lifted(source, (OrtMultiHeadAttention(), "mha"))
    # the three projections, the packed bias split and added, heads, scores, the key lengths' mask, softmax, context
    assert ops_left(out) == ["Add", "Add", "Add", "Add", "Cast", "Gather", "Less", "MatMul", "MatMul", "MatMul",
                             "MatMul", "MatMul", "Mul", "Range", "Reshape", "Reshape", "Reshape", "Reshape", "Shape",
                             "Softmax", "Split", "Transpose", "Transpose", "Transpose", "Transpose", "Unsqueeze",
                             "Unsqueeze", "Where"]
    assert_same_outputs(source, out, _feeds("lengths", S, 3))


def test_rule_declines_packed_inputs_untouched():
    source = _mha_model(None, S)
    mha = next(n for n in source.graph.node if n.name == "mha")
    mha.input[1], mha.input[2] = "", ""
    reason = declined(source, OrtMultiHeadAttention(), "mha")
    assert reason == "query, key and value are packed into one input; only separate inputs are written back"
