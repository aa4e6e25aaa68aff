"""A tiny decoder with a key/value cache, built with onnx.helper, for the generation loop of ``verify``.

One attention layer, one head, Optimum's names::

    input_ids [B,S] ─Gather(E)─► x [B,S,D] ─┬─MatMul(Wq)─► q ─Unsqueeze─► [B,1,S,D] ──────────────┐
                                            ├─MatMul(Wk)─► Unsqueeze ─► Concat(past_key_values.0.key, ·; axis 2)
                                            │                             = present.0.key [B,1,P+S,D] ──┤
                                            └─MatMul(Wv)─► Unsqueeze ─► Concat(past_key_values.0.value, ·)
                                                                          = present.0.value ────────────┤
    scores = q·keyᵀ/√D, masked where key position > position_ids (causal) or attention_mask is 0
    ─► Softmax ─► ·value ─► Squeeze ─► + x ─► MatMul(Wo) ─► logits [B,S,V]

``merged=True`` wraps the cache in Optimum's ``If(use_cache_branch)``: the then-branch concatenates the past,
the else-branch ignores it (so a loop that fed False after prefill would lose its context). ``head_dim`` names
the past's last dimension symbolically, as onnxruntime-genai's ``kv_cache_dim``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, DIM = 32, 8


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"E": rng.standard_normal((VOCAB, DIM)), "Wq": rng.standard_normal((DIM, DIM)) / np.sqrt(DIM),
            "Wk": rng.standard_normal((DIM, DIM)) / np.sqrt(DIM), "Wv": rng.standard_normal((DIM, DIM)) / np.sqrt(DIM),
            "Wo": rng.standard_normal((DIM, VOCAB))}


def decoder(w: dict[str, np.ndarray] | None = None, *, merged: bool = False, head_dim: str | None = None,
            position_ids: bool = True) -> onnx.ModelProto:
    w = weights() if w is None else w
    make = helper.make_node
    past_shape = ["batch", 1, "past_sequence_length", head_dim or DIM]
    present_shape = ["batch", 1, "total_sequence_length", head_dim or DIM]
    nodes = [
        make("Gather", ["E", "input_ids"], ["x"]),
        make("MatMul", ["x", "Wq"], ["q3"]), make("MatMul", ["x", "Wk"], ["k3"]), make("MatMul", ["x", "Wv"], ["v3"]),
        make("Unsqueeze", ["q3", "one"], ["q"]), make("Unsqueeze", ["k3", "one"], ["k_new"]),
        make("Unsqueeze", ["v3", "one"], ["v_new"]),
    ]
    if merged:
        then = helper.make_graph(
            [make("Concat", ["past_key_values.0.key", "k_new"], ["then_k"], axis=2),
             make("Concat", ["past_key_values.0.value", "v_new"], ["then_v"], axis=2)], "with_past", [],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("then_k", "then_v")])
        other = helper.make_graph(
            [make("Identity", ["k_new"], ["else_k"]), make("Identity", ["v_new"], ["else_v"])], "without_past", [],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("else_k", "else_v")])
        nodes.append(make("If", ["use_cache_branch_scalar"], ["present.0.key", "present.0.value"], then_branch=then,
                          else_branch=other))
        nodes.insert(0, make("Squeeze", ["use_cache_branch"], ["use_cache_branch_scalar"]))
    else:
        nodes += [make("Concat", ["past_key_values.0.key", "k_new"], ["present.0.key"], axis=2),
                  make("Concat", ["past_key_values.0.value", "v_new"], ["present.0.value"], axis=2)]
    if not position_ids:  # the positions of the new tokens: past length .. past length + S
        nodes += [make("Shape", ["past_key_values.0.key"], ["past_len"], start=2, end=3),
                  make("Shape", ["input_ids"], ["seq_len"], start=1, end=2),
                  make("Add", ["past_len", "seq_len"], ["end"]),
                  make("Squeeze", ["past_len"], ["past_len0"]), make("Squeeze", ["end"], ["end0"]),
                  make("Range", ["past_len0", "end0", "step"], ["position_ids"])]
    nodes += [
        make("Transpose", ["present.0.key"], ["kT"], perm=[0, 1, 3, 2]),
        make("MatMul", ["q", "kT"], ["raw"]), make("Mul", ["raw", "scale"], ["scores"]),
        # key positions 0..T-1 against each query's position
        make("Shape", ["present.0.key"], ["total"], start=2, end=3), make("Squeeze", ["total"], ["total0"]),
        make("Range", ["zero", "total0", "step"], ["key_pos"]),
        make("Unsqueeze", ["position_ids", "last"], ["query_pos"]),  # [B,S,1] (or [S,1])
        make("LessOrEqual", ["key_pos", "query_pos"], ["causal3"]),
        make("Unsqueeze", ["causal3", "one"], ["causal"]) if position_ids else
        make("Identity", ["causal3"], ["causal"]),
        make("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL),
        make("Unsqueeze", ["mask_bool", "one_two"], ["mask4"]),  # [B,1,1,T]
        make("And", ["causal", "mask4"], ["allowed"]),
        make("Where", ["allowed", "scores", "minus"], ["masked"]),
        make("Softmax", ["masked"], ["probs"], axis=-1),
        make("MatMul", ["probs", "present.0.value"], ["context4"]),
        make("Squeeze", ["context4", "one"], ["context"]),
        make("Add", ["context", "x"], ["hidden"]),
        make("MatMul", ["hidden", "Wo"], ["logits"]),
    ]
    consts = {"one": np.array([1], np.int64), "one_two": np.array([1, 2], np.int64), "last": np.array([-1], np.int64),
              "zero": np.array(0, np.int64), "step": np.array(1, np.int64),
              "scale": np.array(1 / np.sqrt(DIM), np.float32), "minus": np.array(-1e9, np.float32)}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in w.items()]
    inits += [numpy_helper.from_array(v, k) for k, v in consts.items()]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence_length"])]
    if position_ids:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence_length"]))
    inputs += [helper.make_tensor_value_info(f"past_key_values.0.{kv}", TensorProto.FLOAT, past_shape)
               for kv in ("key", "value")]
    if merged:
        inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence_length", VOCAB])]
    outputs += [helper.make_tensor_value_info(f"present.0.{kv}", TensorProto.FLOAT, present_shape)
                for kv in ("key", "value")]
    graph = helper.make_graph(nodes, "tiny_decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def perturbed(seed: int = 0, amount: float = 1.0) -> onnx.ModelProto:
    """The decoder with one weight changed (the output projection, by ``amount`` of its own spread)."""
    w = weights(seed)
    w["Wo"] = w["Wo"] + amount * np.random.default_rng(seed + 100).standard_normal(w["Wo"].shape)
    return decoder(w)


def full_sequence_logits(model_path, ids: np.ndarray) -> np.ndarray:
    """The model's logits for the whole sequence ``ids`` [B,S] at once, on an empty cache (no loop)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path))
    batch, length = ids.shape
    empty = np.zeros((batch, 1, 0, DIM), np.float32)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "past_key_values.0.key": empty,
            "past_key_values.0.value": empty}
    if "position_ids" in {i.name for i in sess.get_inputs()}:
        feed["position_ids"] = np.broadcast_to(np.arange(length), (batch, length)).copy()
    if "use_cache_branch" in {i.name for i in sess.get_inputs()}:
        feed["use_cache_branch"] = np.array([False])
    return sess.run(["logits"], feed)[0]
