"""Tiny models of the decoder and onnxruntime-contrib cases ``check`` and ``build`` meet (tests/test_parser_crash.py,
tests/test_decoder_profiles.py), built with onnx.helper."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = helper.make_opsetid("com.microsoft", 1)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), MS])


def rotary(num_heads: int = 0, rank: int = 3, name: str = "rope_q") -> onnx.ModelProto:
    """x [1, 4, 16] ─ Relu ─ com.microsoft.RotaryEmbedding(num_heads, cos/sin caches [16, 4], position_ids [1, 4]) ─ y

    With num_heads 0 on this 3-D input, TensorRT-RTX 1.7.1's parser dies by SIGFPE; rank 4 is [1, 2, 4, 8]."""
    rng = np.random.default_rng(0)
    shape = [1, 4, 16] if rank == 3 else [1, 2, 4, 8]
    caches = [numpy_helper.from_array(rng.random((16, 4), dtype=np.float32), n) for n in ("cos", "sin")]
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Relu", ["x"], ["xr"], name="pre_relu"),
             helper.make_node("RotaryEmbedding", ["xr", "position_ids", "cos", "sin"], ["y"], name=name,
                              domain="com.microsoft", num_heads=num_heads)]
    return _model(nodes, [vi("x", TensorProto.FLOAT, shape), vi("position_ids", TensorProto.INT64, [1, 4])],
                  [vi("y", TensorProto.FLOAT, shape)], caches)


def contrib(op: str) -> onnx.ModelProto:
    """One com.microsoft node: SkipSimplifiedLayerNormalization, Gelu, MultiHeadAttention (one output or with
    past/present), GroupQueryAttention or MatMulNBits (fp16), on [1, 4, 16] activations."""
    vi, f, h16 = helper.make_tensor_value_info, TensorProto.FLOAT, TensorProto.FLOAT16
    node = lambda *a, **k: helper.make_node(*a, name="n", domain="com.microsoft", **k)  # noqa: E731
    x = [1, 4, 16]
    if op == "SkipSimplifiedLayerNormalization":
        gamma = numpy_helper.from_array(np.ones(16, np.float32), "gamma")
        return _model([node(op, ["x", "skip", "gamma"], ["y"], epsilon=1e-5)], [vi("x", f, x), vi("skip", f, x)],
                      [vi("y", f, x)], [gamma])
    if op == "Gelu":
        return _model([node(op, ["x"], ["y"])], [vi("x", f, x)], [vi("y", f, x)])
    if op == "MultiHeadAttention":
        return _model([node(op, ["q", "k", "v"], ["o"], num_heads=2)], [vi(n, h16, x) for n in "qkv"],
                      [vi("o", h16, x)])
    past = [vi("past_key", h16, [1, 2, "past", 8]), vi("past_value", h16, [1, 2, "past", 8])]
    present = [vi("present_key", h16, [1, 2, "total", 8]), vi("present_value", h16, [1, 2, "total", 8])]
    if op == "MultiHeadAttention-past":
        return _model([node("MultiHeadAttention", ["q", "k", "v", "", "", "past_key", "past_value"],
                            ["o", "present_key", "present_value"], num_heads=2)],
                      [*(vi(n, h16, x) for n in "qkv"), *past], [vi("o", h16, x), *present])
    if op == "GroupQueryAttention":
        return _model([node(op, ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
                            ["o", "present_key", "present_value"], num_heads=2, kv_num_heads=2)],
                      [*(vi(n, h16, x) for n in "qkv"), *past, vi("seqlens_k", TensorProto.INT32, [1]),
                       vi("total_sequence_length", TensorProto.INT32, [])], [vi("o", h16, x), *present])
    if op == "MatMulNBits":
        inits = [numpy_helper.from_array(np.zeros((16, 1, 16), np.uint8), "w"),
                 numpy_helper.from_array(np.ones(16, np.float16), "scales")]
        return _model([node(op, ["a", "w", "scales"], ["y"], K=32, N=16, bits=4, block_size=32)],
                      [vi("a", h16, [1, 32])], [vi("y", h16, [1, 16])], inits)
    raise ValueError(op)


def int4_negative_scales() -> onnx.ModelProto:
    """x [1, 64] ─ MatMul(DequantizeLinear(int4 codes [64, 16], scales [2, 16], axis 0, block_size 32)) ─ y,
    with every other scale of the first block row negative (as onnxruntime-genai's NvTensorRtRtx int4 writes)."""
    rng = np.random.default_rng(0)
    codes = rng.integers(-8, 8, (64, 16)).astype(np.int8)
    scales = (rng.random((2, 16)).astype(np.float32) + 0.1) * 0.01
    scales[0, ::2] *= -1
    weight = helper.make_tensor("w", TensorProto.INT4, [64, 16], codes.flatten().tolist())
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dq_w", axis=0, block_size=32),
             helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 64])], [vi("y", TensorProto.FLOAT, [1, 16])],
                              [weight, numpy_helper.from_array(scales, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def decoder(vocab: int = 32, dim: int = 8, head: int = 8, one_token_logits: bool = False) -> onnx.ModelProto:
    """A one-layer, one-head decoder with a KV cache, as onnxruntime-genai and Optimum name its inputs::

        input_ids [batch, sequence] ─ Gather(embed) ─ x ─ MatMul(wq) ─ Unsqueeze ─ q ──────────┐
                                                    ├─ MatMul(wk) ─ Unsqueeze ─ k ─┐          │
        past_key_values.0.key [batch, 1, past, 8] ─────────────── Concat(axis 2) ─ present.0.key ─ Transpose
                                                                                   MatMul(q, kᵀ) ─ + mask ─ Softmax
        attention_mask [batch, past + sequence] ─ Cast ─ (1 − m)·−1e4 ─ Unsqueeze ───┘              │
        past_key_values.0.value ─ Concat(v) ─ present.0.value ────────────────────── MatMul ─ Squeeze ─ MatMul(wo)
                                                                                                   ─ logits

    ``one_token_logits``: the logits are reshaped to [1, 1, vocab], which only a sequence of 1 (decode) allows:
    TensorRT builds the decode profile and fails the prefill one."""
    rng = np.random.default_rng(0)

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    inits = [const("embed", rng.standard_normal((vocab, dim)).astype(np.float32)),
             *(const(w, rng.standard_normal((dim, head)).astype(np.float32)) for w in ("wq", "wk", "wv")),
             const("wo", rng.standard_normal((head, vocab)).astype(np.float32)),
             const("one", np.float32(1)), const("neg", np.float32(-1e4)), const("ax1", np.array([1], np.int64)),
             const("ax12", np.array([1, 2], np.int64)), const("one_token", np.array([1, 1, vocab], np.int64))]
    n = helper.make_node
    nodes = [n("Gather", ["embed", "input_ids"], ["x"], name="embed_tokens"),
             *(n("MatMul", ["x", f"w{p}"], [f"{p}3"], name=f"{p}_proj") for p in "qkv"),
             *(n("Unsqueeze", [f"{p}3", "ax1"], [p], name=f"{p}_heads") for p in "qkv"),
             n("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], name="kv_update_k", axis=2),
             n("Concat", ["past_key_values.0.value", "v"], ["present.0.value"], name="kv_update_v", axis=2),
             n("Transpose", ["present.0.key"], ["kt"], name="k_t", perm=[0, 1, 3, 2]),
             n("MatMul", ["q", "kt"], ["scores"], name="qk"),
             n("Cast", ["attention_mask"], ["maskf"], name="mask_cast", to=TensorProto.FLOAT),
             n("Sub", ["one", "maskf"], ["inv"], name="mask_inv"),
             n("Mul", ["inv", "neg"], ["bias2"], name="mask_bias"),
             n("Unsqueeze", ["bias2", "ax12"], ["bias"], name="mask_heads"),
             n("Add", ["scores", "bias"], ["masked"], name="mask_add"),
             n("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
             n("MatMul", ["probs", "present.0.value"], ["ctx4"], name="pv"),
             n("Squeeze", ["ctx4", "ax1"], ["ctx"], name="merge_heads"),
             n("MatMul", ["ctx", "wo"], ["logits_all" if one_token_logits else "logits"], name="lm_head")]
    if one_token_logits:
        nodes.append(n("Reshape", ["logits_all", "one_token"], ["logits"], name="last_token_only"))
    else:
        inits.pop()  # one_token
    vi, f = helper.make_tensor_value_info, TensorProto.FLOAT
    inputs = [vi("input_ids", TensorProto.INT64, ["batch", "sequence"]),
              vi("attention_mask", TensorProto.INT64, ["batch", "total"]),
              vi("past_key_values.0.key", f, ["batch", 1, "past", head]),
              vi("past_key_values.0.value", f, ["batch", 1, "past", head])]
    outputs = [vi("logits", f, [1, 1, vocab] if one_token_logits else ["batch", "sequence", vocab]),
               vi("present.0.key", f, ["batch", 1, "total", head]),
               vi("present.0.value", f, ["batch", 1, "total", head])]
    return helper.make_model(helper.make_graph(nodes, "decoder", inputs, outputs, inits),
                             opset_imports=[helper.make_opsetid("", 17)])
