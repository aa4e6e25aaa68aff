"""onnxruntime's fused com.microsoft ``MultiHeadAttention`` written back as standard ONNX
(``lift/ort_multihead_attention.py``): self and cross attention, packed bias, every key padding mask form,
``unidirectional``, against onnxruntime running the fused node; TensorRT-RTX builds the converted model. With a
key/value cache (``lift/ort_multihead_attention_past.py``): prefill (past 0), decode and multi-token steps with each
mask form, attention_bias and scale, a generation loop feeding the presents back, the declines; TensorRT-RTX builds
it at prefill and decode.

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
from apply_rule import assert_same_outputs, declined, lifted, ops_left, run_outputs  # noqa: E402
from helpers import assert_builds_at, convert_calibrated, op_types, run_ort, save, snr_db  # noqa: E402

from trt_bridge.errors import UnsupportedPatternError  # noqa: E402
from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.ort_multihead_attention import OrtMultiHeadAttention  # noqa: E402
from trt_bridge.lift.ort_multihead_attention_past import OrtMultiHeadAttentionPast  # noqa: E402
from trt_bridge.lift.pipeline import lift_model  # noqa: E402
from trt_bridge.runtime.session import session  # noqa: E402

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


def test_a_shared_buffer_cache_is_declined_with_its_reason(tmp_path):
    model = _past_model(None)
    node = model.graph.node[-1]
    node.input.append("past_sequence_length")
    model.graph.input.append(helper.make_tensor_value_info("past_sequence_length", TensorProto.INT32, [1]))
    src = save(model, tmp_path / "shared.onnx")
    with pytest.raises(UnsupportedPatternError, match=r"MultiHeadAttention 'mha'.*past_sequence_length"):
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


# --- with a key/value cache (lift/ort_multihead_attention_past.py) ---------------------------------------------------

H = D // N
PAST_MASKS = {None: None, "lengths": ["B"], "raw2d": ["B", "T"], "raw3d": ["B", "S", "T"]}


def _past_model(form, unidirectional=1, bias=True, attention_bias=False, scale=None):
    """A decoder layer's attention as onnxruntime writes it with a cache:
       x [B, S, 16] ─ MatMul(Wq), MatMul(Wk), MatMul(Wv) ─ MultiHeadAttention(bias?, key_padding_mask?,
       attention_bias?, past_key, past_value [B, 2, P, 8]; 2 heads) ─ y, present_key, present_value [B, 2, P + S, 8]
    """
    inits = {n: (RNG.normal(size=(D, D)) / 3).astype(np.float32) for n in ("Wq", "Wk", "Wv")}
    if bias:
        inits["bias"] = (RNG.normal(size=3 * D) / 10).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", D])]
    names = ["q", "k", "v", "bias" if bias else "", "", "", "past_key", "past_value"]
    if form is not None:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, PAST_MASKS[form]))
        names[4] = "mask"
    if attention_bias:
        inputs.append(helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT, [1, N, "S", "T"]))
        names[5] = "attention_bias"
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", N, "P", H])
               for n in ("past_key", "past_value")]
    attrs = {"num_heads": N, "unidirectional": unidirectional, **({"scale": scale} if scale else {})}
    nodes = [helper.make_node("MatMul", ["x", w], [t], f"{t}_proj") for w, t in (("Wq", "q"), ("Wk", "k"), ("Wv", "v"))]
    nodes.append(helper.make_node("MultiHeadAttention", names, ["y", "present_key", "present_value"], "mha",
                                  domain="com.microsoft", **attrs))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", D])] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", N, "T", H]) for n in ("present_key", "present_value")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _past_feed(form, new, past, attention_bias=False, batch=B):
    total = past + new
    feed = {"x": RNG.normal(size=(batch, new, D)).astype(np.float32),
            "past_key": RNG.normal(size=(batch, N, past, H)).astype(np.float32),
            "past_value": RNG.normal(size=(batch, N, past, H)).astype(np.float32)}
    if form == "lengths":
        feed["mask"] = np.array([max(total - 2, 1), total], np.int32)[:batch]
    elif form == "raw2d":  # entry 0 left-padded by one
        feed["mask"] = np.ones((batch, total), np.int32)
        feed["mask"][0, 0] = 0 if total > 1 else 1
    elif form == "raw3d":
        feed["mask"] = (RNG.random((batch, new, total)) > 0.3).astype(np.int32)
    if attention_bias:
        feed["attention_bias"] = RNG.normal(size=(1, N, new, total)).astype(np.float32)
    return feed


#: (new tokens, past length): a prompt on an empty cache, a decode step, a chunk after a past
STEPS = {"prefill": (5, 0), "decode": (1, 5), "chunk": (3, 4)}


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("form", list(PAST_MASKS))
def test_multihead_attention_with_a_cache_is_written_back_exactly(tmp_path, form, step):
    src = save(_past_model(form), tmp_path / "mha_past.onnx")
    out, ctx = lift_model(load_model(src), src)
    assert ctx.fired["ort-multihead-attention-past"] == ["mha"] and "ort-multihead-attention" not in ctx.fired
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    assert {"Concat", "Softmax", "Where"} <= op_types(out) and "MultiHeadAttention" not in op_types(out)
    assert [o.name for o in out.graph.output] == ["y", "present_key", "present_value"]
    feeds = [_past_feed(form, *STEPS[step]) for _ in range(2)]
    for want, got in zip(run_outputs(src, feeds), run_outputs(out, feeds)):
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", [{"unidirectional": 0}, {"bias": False}, {"attention_bias": True},
                                     {"scale": 0.2}], ids=["bidirectional", "no-bias", "attention-bias", "scale"])
def test_multihead_attention_with_a_cache_variants(variant):
    source = _past_model("raw2d", **variant)
    out, _ = lifted(source, (OrtMultiHeadAttentionPast(), "mha"))
    assert "MultiHeadAttention" not in ops_left(out)
    for step in ("prefill", "chunk"):
        feeds = [_past_feed("raw2d", *STEPS[step], attention_bias=variant.get("attention_bias", False))]
        assert_same_outputs(source, out, feeds)


def test_a_generation_loop_feeds_each_present_back_as_past():
    """Prefill 4 tokens, then 6 decode steps, each model fed its own presents: outputs and caches track the source's."""
    source = _past_model("raw2d")
    out, _ = lifted(source, (OrtMultiHeadAttentionPast(), "mha"))
    sessions = [session(source), session(out)]
    caches = [(np.zeros((B, N, 0, H), np.float32),) * 2 for _ in sessions]
    for step in range(7):
        new = 4 if step == 0 else 1
        past = caches[0][0].shape[2]
        feed = _past_feed("raw2d", new, past)
        runs = [s.run(None, {**feed, "past_key": c[0], "past_value": c[1]}) for s, c in zip(sessions, caches)]
        for w, g in zip(*runs):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        caches = [(r[1], r[2]) for r in runs]
    assert caches[1][0].shape == (B, N, 10, H)


def test_presents_read_without_a_past():
    """No past given, the presents read: they are the new keys and values in heads (onnxruntime's)."""
    source = _past_model(None)
    node = source.graph.node[-1]
    del node.input[6:]
    del source.graph.input[1:]
    out, _ = lifted(source, (OrtMultiHeadAttentionPast(), "mha"))
    assert "Identity" in ops_left(out)
    assert_same_outputs(source, out, [{"x": RNG.normal(size=(B, 5, D)).astype(np.float32)}])


def test_multihead_attention_with_a_cache_builds_in_tensorrt_at_prefill_and_decode(tmp_path):
    out, _ = lifted(_past_model("raw2d"), (OrtMultiHeadAttentionPast(), "mha"))
    path = save(out, tmp_path / "mha_past.onnx")
    assert_builds_at(path, {
        "prefill": {"x": ((1, 1, D), (1, 16, D), (2, 128, D)), "mask": ((1, 1), (1, 16), (2, 128)),
                    "past_key": ((1, N, 0, H),) * 2 + ((2, N, 0, H),),
                    "past_value": ((1, N, 0, H),) * 2 + ((2, N, 0, H),)},
        "decode": {"x": ((1, 1, D),) * 2 + ((2, 1, D),), "mask": ((1, 2), (1, 129), (2, 513)),
                   "past_key": ((1, N, 1, H), (1, N, 128, H), (2, N, 512, H)),
                   "past_value": ((1, N, 1, H), (1, N, 128, H), (2, N, 512, H))},
    })


def _edited(change):
    source = _past_model(None)
    change(source, source.graph.node[-1])
    return source


@pytest.mark.parametrize(("change", "reason"), [
    (lambda m, n: n.input.__setitem__(7, ""), "only one of past_key and past_value is given"),
    (lambda m, n: (n.input.append(""), n.input.append("cache_indirection"),
                   m.graph.input.append(helper.make_tensor_value_info("cache_indirection", TensorProto.INT32,
                                                                      ["B", 1, "M"]))),
     "input 9 (cache_indirection) is given"),
    (lambda m, n: (n.output.pop(), n.output.pop(), m.graph.output.pop(), m.graph.output.pop()),
     "present_key/present_value are not outputs of the node"),
    (lambda m, n: m.graph.input[0].type.tensor_type.shape.dim.add(), "has rank 4 beside a past"),
], ids=["one-past", "cache-indirection", "no-presents", "4-D"])
def test_cache_declines_name_their_reason(change, reason):
    source = _edited(change)
    if reason.startswith("has rank"):  # keys already in heads: [B, N, S, H]
        source.graph.node[-1].input[1] = "x"
    assert reason in declined(source, OrtMultiHeadAttentionPast(), "mha")


def test_the_cache_free_rule_leaves_a_cache_to_the_past_rule():
    assert declined(_past_model(None), OrtMultiHeadAttention(), "mha") == ""  # NOT_MINE: not reported


def test_past_rule_writes_standard_onnx():
    source = _past_model("lengths")
    out, _ = lifted(source, (OrtMultiHeadAttentionPast(), "mha"))
    # the projections, the packed bias split and added, heads, the cache Concats, scores, the key lengths' mask over
    # all keys, the causal exclusion aligned for the past, softmax, context
    assert ops_left(out) == ["Add", "Add", "Add", "Add", "Cast", "Concat", "Concat", "Gather", "Gather", "Greater",
                             "Less", "MatMul", "MatMul", "MatMul", "MatMul", "MatMul", "Mul", "Range", "Range",
                             "Reshape", "Reshape", "Reshape", "Reshape", "Shape", "Shape", "Softmax", "Split",
                             "Transpose", "Transpose", "Transpose", "Transpose", "Transpose", "Unsqueeze", "Unsqueeze",
                             "Unsqueeze", "Unsqueeze", "Where", "Where"]
    assert_same_outputs(source, out, [_past_feed("lengths", *STEPS["decode"])])
