"""onnxruntime's fused com.microsoft ``EmbedLayerNormalization`` written back as standard ONNX
(``lift/embed_layer_norm.py``) and its quantized form ``QEmbedLayerNormalization`` (``lift/qembed_layer_norm.py``):
against onnxruntime running the fused node (output, mask index, embedding sum), with and without segment
ids, mask and position ids, at opsets with and without LayerNormalization; TensorRT-RTX builds the result.

The tests at the end call the rule directly (``apply_rule``: match, then rewrite, on a small graph; a
decline that leaves graph and context as they were)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from apply_rule import declined, lifted, ops_left  # noqa: E402
from helpers import (  # noqa: E402
    convert_calibrated,
    op_types,
    quantize_dynamic,
    save,
    snr_db,
)

from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.embed_layer_norm import OrtEmbedLayerNorm  # noqa: E402
from trt_bridge.lift.pipeline import lift_model  # noqa: E402
from trt_bridge.runtime.session import session  # noqa: E402

B, S, D, V = 2, 6, 32, 40
RNG = np.random.default_rng(5)


def _embedding_model(segments=True, mask=True, position_ids=False, opset=17, embedding_sum=False, head=False):
    """ids, segment_ids?, mask?, position_ids? ─ EmbedLayerNormalization(word [40, 32], position [20, 32],
    segment [2, 32]?, γ, β) ─ y [B, S, 32], mask_index [B] (int32), embedding_sum?  [─ MatMul(W) ─ z]"""
    inits = {"word": RNG.normal(size=(V, D)).astype(np.float32), "pos": RNG.normal(size=(20, D)).astype(np.float32),
             "segment": RNG.normal(size=(2, D)).astype(np.float32),
             "gamma": (1 + RNG.normal(size=D) / 5).astype(np.float32),
             "beta": (RNG.normal(size=D) / 5).astype(np.float32),
             "W": (RNG.normal(size=(D, D)) / 5).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT32, ["B", "S"])]
    names = ["ids", "", "word", "pos", "", "gamma", "beta", "", ""]
    if segments:
        inputs.append(helper.make_tensor_value_info("segment_ids", TensorProto.INT32, ["B", "S"]))
        names[1], names[4] = "segment_ids", "segment"
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "S"]))
        names[7] = "mask"
    if position_ids:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT32, [1, "S"]))
        names[8] = "position_ids"
    while not names[-1]:
        names.pop()
    outs = ["y", "mask_index"] + (["sum"] if embedding_sum else [])
    nodes = [helper.make_node("EmbedLayerNormalization", names, outs, "embed", domain="com.microsoft", epsilon=1e-5)]
    if head:
        nodes.append(helper.make_node("MatMul", ["y", "W"], ["z"], "head"))
    outputs = [helper.make_tensor_value_info("z" if head else "y", TensorProto.FLOAT, ["B", "S", D]),
               helper.make_tensor_value_info("mask_index", TensorProto.INT32, ["B"])]
    if embedding_sum:
        outputs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["B", "S", D]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()
                                                             if head or n != "W"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(model, count):
    names = {i.name for i in model.graph.input}
    feeds = []
    for _ in range(count):
        feed = {"ids": RNG.integers(0, V, (B, S)).astype(np.int32),
                "segment_ids": RNG.integers(0, 2, (B, S)).astype(np.int32),
                # counted as onnxruntime counts: only the ones (a 2 or a -1 is not a valid token)
                "mask": np.array([[1, 1, 1, 2, 0, 1], [1, 1, -1, 0, 0, 0]], np.int32),
                "position_ids": RNG.integers(0, 20, (1, S)).astype(np.int32)}
        feeds.append({k: v for k, v in feed.items() if k in names})
    return feeds


def _assert_same_outputs(source, lifted, feeds):
    want, got = session(source), session(lifted)
    for feed in feeds:
        for w, g in zip(want.run(None, feed), got.run(None, feed)):
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize(("segments", "mask", "position_ids"),
                         [(True, True, False), (False, True, True), (True, False, False)])
def test_embed_layer_norm_is_written_back_exactly(tmp_path, segments, mask, position_ids, opset):
    model = _embedding_model(segments, mask, position_ids, opset, embedding_sum=segments)
    src = save(model, tmp_path / "embed.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert ctx.fired["ort-embed-layer-norm"] == ["embed"]
    assert all(n.domain in ("", "ai.onnx") for n in lifted.graph.node)
    assert ("LayerNormalization" in op_types(lifted)) == (opset >= 17)
    assert ("ReduceSum" in op_types(lifted)) == mask
    _assert_same_outputs(src, lifted, _feeds(model, 2))


@pytest.mark.parametrize("per_channel", [False, True])
def test_qembed_layer_norm_lifts_to_its_dequantized_tables_and_builds(tmp_path, per_channel):
    model = _embedding_model(head=True)
    fpath = save(model, tmp_path / "float.onnx")
    qpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", per_channel=per_channel,
                             extra_options={"DefaultTensorType": TensorProto.FLOAT})
    assert "QEmbedLayerNormalization" in op_types(qpath)
    lifted, ctx = lift_model(load_model(qpath), qpath)
    assert ctx.fired["qembed-layer-norm"] == ["embed_quant"]
    held = _feeds(model, 4)
    # exactly what onnxruntime's kernel computes from the uint8 tables, the MatMul aside (quantized at run time)
    _assert_same_outputs(_without_head(qpath, tmp_path), _without_head(save(lifted, tmp_path / "lifted.onnx"),
                                                                       tmp_path), held)
    calib = _feeds(model, 16)
    out = tmp_path / "converted.onnx"
    convert_calibrated(qpath, out, calib)
    reference, source, converted = (session(p) for p in (fpath, qpath, out))
    first = lambda sess: [sess.run(None, f)[0] for f in held]  # noqa: E731
    # measured against the float model, source → converted: 37.9 → 36.8 dB per tensor, 39.6 → 38.7 dB per channel
    # (the head's input: one calibrated scale for the source's run-time ones)
    assert snr_db(first(reference), first(converted)) >= snr_db(first(reference), first(source)) - 3.0


def _without_head(path: Path, tmp_path: Path) -> Path:
    """The model with the embedding's output 'y' as its first output (the head MatMul left unread)."""
    import onnx

    model = onnx.load(str(path))
    del model.graph.output[0]
    model.graph.output.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    return save(model, tmp_path / f"{path.stem}.embedding.onnx")


# --- the rule called directly ---------------------------------------------------------------------------------------

def test_rule_writes_the_standard_graph():
    source = _embedding_model()
    out, _ = lifted(source, (OrtEmbedLayerNorm(), "embed"))
    # word and segment rows gathered, positions sliced (0 … S−1: Shape, Gather), summed, normalized; the mask's ones
    # counted (Equal, Cast, ReduceSum)
    assert ops_left(out) == ["Add", "Add", "Cast", "Equal", "Gather", "Gather", "Gather", "LayerNormalization",
                             "ReduceSum", "Shape", "Slice"]
    _assert_same_outputs(source, out, _feeds(source, 3))


def test_rule_declines_a_missing_gamma_untouched():
    source = _embedding_model()
    source.graph.node[0].input[5] = ""
    reason = declined(source, OrtEmbedLayerNorm(), "embed")
    assert reason == "the word and position tables and gamma (inputs 2, 3, 5) must be given"
