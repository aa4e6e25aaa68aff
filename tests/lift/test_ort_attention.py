"""onnxruntime's fused com.microsoft ``Attention`` written back as standard ONNX (``lift/ort_attention.py``):
every mask form its CPU kernel takes, ``unidirectional``, ``qkv_hidden_sizes``, ``attention_bias``, against
onnxruntime running the fused node; TensorRT-RTX parses and builds the result; a key/value cache is declined
with its reason.

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
from trt_bridge.lift.ort_attention import OrtAttention  # noqa: E402
from trt_bridge.lift.pipeline import lift_model  # noqa: E402

B, S, D, N = 2, 6, 16, 2
RNG = np.random.default_rng(0)
MASKS = {  # form -> (declared shape, a feed with a fully masked query row where the form allows one)
    None: (None, None),
    "raw2d": (["B", "S"], np.array([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 2]], np.int32)),
    "raw3d": (["B", "S", "S"], (np.random.default_rng(1).random((B, S, S)) > 0.4).astype(np.int32)),
    "lengths": (["B"], np.array([4, 6], np.int32)),
    "end-start": ([2 * B], np.array([5, 6, 1, 2], np.int32)),
}


def _attention_model(form, unidirectional=0, sizes=None, opset=17, attention_bias=False):
    """x [B, S, 16] ─ Attention(W [16, q+k+v], bias, mask_index?, attention_bias?; 2 heads) ─ y [B, S, v]"""
    q, k, v = sizes or (D, D, D)
    inits = {"W": (RNG.normal(size=(D, q + k + v)) / 3).astype(np.float32),
             "bias": (RNG.normal(size=q + k + v) / 10).astype(np.float32)}
    batch = B if form == "end-start" else "B"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, "S", D])]
    names = ["x", "W", "bias", "", "", ""]
    if form is not None:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, MASKS[form][0]))
        names[3] = "mask"
    if attention_bias:
        inputs.append(helper.make_tensor_value_info("ab", TensorProto.FLOAT, [1, N, "S", "S"]))
        names[5] = "ab"
    while not names[-1]:
        names.pop()
    attrs = {"num_heads": N, "unidirectional": unidirectional} | ({"qkv_hidden_sizes": [q, k, v]} if sizes else {})
    node = helper.make_node("Attention", names, ["y"], "attention", domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                  [batch, "S", v])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(form, count, attention_bias=False):
    feeds = []
    for _ in range(count):
        feed = {"x": RNG.normal(size=(B, S, D)).astype(np.float32)}
        if form is not None:
            feed["mask"] = MASKS[form][1]
        if attention_bias:
            feed["ab"] = RNG.normal(size=(1, N, S, S)).astype(np.float32)
        feeds.append(feed)
    return feeds


@pytest.mark.parametrize("opset", [12, 17])
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("form", list(MASKS))
def test_attention_is_written_back_exactly(tmp_path, form, unidirectional, opset):
    sizes = (D, D, 8) if form == "raw2d" else None  # v narrower than q and k: qkv_hidden_sizes
    bias = form == "raw3d"
    src = save(_attention_model(form, unidirectional, sizes, opset, bias), tmp_path / "attention.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert ctx.fired["ort-attention"] == ["attention"]
    assert all(n.domain in ("", "ai.onnx") for n in lifted.graph.node)
    assert {"MatMul", "Softmax", "Split"} <= op_types(lifted)
    feeds = _feeds(form, 2, bias)
    for want, got in zip(run_ort(src, feeds), run_ort(lifted, feeds)):  # onnxruntime runs the fused op natively
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["raw2d", "lengths"])
def test_converted_attention_builds_in_tensorrt(tmp_path, form):
    src = save(_attention_model(form, unidirectional=1), tmp_path / "attention.onnx")
    calib = _feeds(form, 8)
    out = tmp_path / "attention.int8.onnx"
    convert_calibrated(src, out, calib)
    held = _feeds(form, 4)
    assert snr_db(run_ort(src, held), run_ort(out, held)) > 34  # measured 39.2 dB (raw2d), 37.6 dB (lengths)


def test_a_key_value_cache_is_declined_with_its_reason(tmp_path):
    model = _attention_model(None)
    node = model.graph.node[0]
    node.input.extend(["", "past"])
    node.output.append("present")
    model.graph.input.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, "B", N, "P", D // N]))
    model.graph.output.append(helper.make_tensor_value_info("present", TensorProto.FLOAT, None))
    src = save(model, tmp_path / "cached.onnx")
    with pytest.raises(UnsupportedPatternError, match=r"Attention 'attention'.*key/value cache 'past'"):
        lift_model(onnx.load(str(src)), src)


def test_a_mask_index_whose_form_cannot_be_told_is_declined_with_its_reason(tmp_path):
    """A 1-D mask_index of a length unrelated to the batch: key lengths [B] or end/start positions [2B]?"""
    model = _attention_model("lengths")
    mask = next(i for i in model.graph.input if i.name == "mask")
    mask.CopyFrom(helper.make_tensor_value_info("mask", TensorProto.INT32, ["M"]))
    src = save(model, tmp_path / "ambiguous.onnx")
    with pytest.raises(UnsupportedPatternError, match=r"Attention 'attention'.*cannot be told apart"):
        lift_model(onnx.load(str(src)), src)


# --- the rule called directly ---------------------------------------------------------------------------------------

def test_rule_writes_standard_onnx():
    source = _attention_model("lengths")
    out, _ = lifted(source, (OrtAttention(), "attention"))
    # projection, split into heads, scores, the key lengths' mask (Cast, Range to the sequence length, Less, Where),
    # softmax, context
    assert ops_left(out) == ["Add", "Add", "Cast", "Gather", "Less", "MatMul", "MatMul", "MatMul", "Mul", "Range",
                             "Reshape", "Reshape", "Reshape", "Reshape", "Shape", "Softmax", "Split", "Transpose",
                             "Transpose", "Transpose", "Transpose", "Unsqueeze", "Unsqueeze", "Where"]
    assert_same_outputs(source, out, _feeds("lengths", 3))


def test_rule_declines_rotary_embedding_untouched():
    source = _attention_model("lengths")
    source.graph.node[0].attribute.append(helper.make_attribute("do_rotary", 1))
    assert declined(source, OrtAttention(), "attention") == "attribute do_rotary=1 is not written back"
