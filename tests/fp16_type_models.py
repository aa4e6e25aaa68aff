"""Small models shaped like the decoder exports whose ``--high-precision fp16`` conversion broke ONNX's type rules
(issue items 3 and 38): float arithmetic on values cast from integers, next to float16-able layers.

Llama-style rotary (Optimum's ``LlamaRotaryEmbedding``)::

    position_ids:int64 ─Unsqueeze─Cast(float)──────────────────┐
    inv_freq const [1, d/2, 1] ─Expand([Shape(position_ids)[0], d/2, 1])─MatMul─ Transpose ─ Concat(f, f) ─┬─ Cos ─┐
    x ─MatMul(Wq)─ q ──────────────────────────────────────────────────────────────┼───── Mul ──┐
    x ─MatMul(Wk)─ k ───────────────────────────────────────────────────────────── Sin ── Mul ── Add ─MatMul(Wo)─ y

T5-style relative position bias (``_relative_position_bucket``) and attention mask::

    x ─Shape─Gather(1)─Range(0, S)─ (mem - ctx) ─Abs─Cast(float)─Div(8)─Log─Div(log 16)─Mul(8)─Cast(int64)─Add(8)
       ─Min(15)─ Where(small, rel, large) ─Gather(table)─Transpose─ bias [1, H, S, S] ──┐
    attention_mask:int64 ─Cast(float)─Sub(1, ·)─Mul(-1e9)── Unsqueeze ──────────────── Add ─┐
    x ─MatMul(Wq)──┐                                                                       │
    x ─MatMul(Wk)─ MatMul(q, kᵀ) ─────────────────────────────────────────────── Add(scores, ·) ─ Softmax ─ MatMul(v)
                                                                                           ─ MatMul(Wo) ─ y

ModelOpt-style mixed precision (float16 where ModelOpt keeps high precision, float32 elsewhere; its FP8 Q/DQ)::

    x:float ─Q/DQ(fp8, float scale)─ Cast(fp16) ─MatMul(DQ(fp8 W, fp16 scale))─ Add(fp16 bias) ─ Cast(float) ─┐
                                                                           LayerNormalization(float) ─ Relu ─┘
                                                                         ─ MatMul(W float) ─ y:float
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEQ, DIM, HEADS = 16, 32, 2


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def _weight(rng, *shape) -> np.ndarray:
    return rng.normal(0.0, 1.0 / np.sqrt(shape[0]), shape).astype(np.float32)


def rotary(seed: int = 0) -> onnx.ModelProto:
    """The Llama-style rotary embedding applied to a projected query (see the module doc)."""
    rng = np.random.default_rng(seed)
    half = DIM // 2
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, DIM, 2, dtype=np.float32) / DIM)).reshape(1, half, 1)
    nodes = [
        helper.make_node("MatMul", ["x", "Wq"], ["q"], "/q_proj/MatMul"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], "/k_proj/MatMul"),
        helper.make_node("Unsqueeze", ["position_ids", "axis1"], ["pos_u"], "/model/rotary_emb/Unsqueeze"),
        helper.make_node("Cast", ["pos_u"], ["pos_f"], "/model/rotary_emb/Cast", to=TensorProto.FLOAT),
        helper.make_node("Shape", ["position_ids"], ["pos_shape"], "/model/rotary_emb/Shape"),
        helper.make_node("Gather", ["pos_shape", "zero"], ["batch"], "/model/rotary_emb/Gather", axis=0),
        helper.make_node("Concat", ["batch", "freq_dims"], ["freq_shape"], "/model/rotary_emb/Concat_shape", axis=0),
        helper.make_node("Expand", ["inv_freq", "freq_shape"], ["inv_freq_b"], "/model/rotary_emb/Expand"),
        helper.make_node("MatMul", ["inv_freq_b", "pos_f"], ["freqs_t"], "/model/rotary_emb/MatMul"),
        helper.make_node("Transpose", ["freqs_t"], ["freqs"], "/model/rotary_emb/Transpose", perm=[0, 2, 1]),
        helper.make_node("Concat", ["freqs", "freqs"], ["emb"], "/model/rotary_emb/Concat", axis=-1),
        helper.make_node("Cos", ["emb"], ["cos"], "/model/rotary_emb/Cos"),
        helper.make_node("Sin", ["emb"], ["sin"], "/model/rotary_emb/Sin"),
        helper.make_node("Mul", ["q", "cos"], ["q_cos"], "/model/q_cos"),
        helper.make_node("Mul", ["k", "sin"], ["k_sin"], "/model/k_sin"),
        helper.make_node("Add", ["q_cos", "k_sin"], ["rot"], "/model/rot"),
        helper.make_node("MatMul", ["rot", "Wo"], ["y"], "/o_proj/MatMul"),
    ]
    graph = helper.make_graph(
        nodes, "rotary",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, DIM]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, SEQ])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, DIM])],
        [_init("Wq", _weight(rng, DIM, DIM)), _init("Wk", _weight(rng, DIM, DIM)), _init("Wo", _weight(rng, DIM, DIM)),
         _init("inv_freq", inv_freq), _init("axis1", np.array([1], np.int64)), _init("zero", np.array([0], np.int64)),
         _init("freq_dims", np.array([half, 1], np.int64))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def rotary_feeds(count: int, seed: int, start: int = 0) -> list[dict[str, np.ndarray]]:
    """``x`` random, ``position_ids`` a run of positions from ``start`` + k·SEQ (rotary angles up to thousands)."""
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0.0, 1.0, (1, SEQ, DIM)).astype(np.float32),
             "position_ids": (start + k * 97 + np.arange(SEQ, dtype=np.int64)).reshape(1, SEQ)} for k in range(count)]


def t5_bias(seed: int = 0) -> onnx.ModelProto:
    """One attention with T5's relative position buckets and its float attention mask (see the module doc)."""
    rng = np.random.default_rng(seed)
    buckets, exact, distance = 16, 8, 128
    f32 = lambda v: np.array(v, np.float32)  # noqa: E731
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], "/Shape"),
        helper.make_node("Gather", ["x_shape", "one"], ["seq"], "/Gather", axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["pos"], "/Range"),
        helper.make_node("Unsqueeze", ["pos", "axis1"], ["ctx"], "/Unsqueeze_ctx"),
        helper.make_node("Unsqueeze", ["pos", "axis0"], ["mem"], "/Unsqueeze_mem"),
        helper.make_node("Sub", ["mem", "ctx"], ["rel"], "/Sub_rel"),
        helper.make_node("Abs", ["rel"], ["rel_abs"], "/Abs"),
        helper.make_node("Less", ["rel_abs", "exact_i"], ["small"], "/Less"),
        helper.make_node("Cast", ["rel_abs"], ["rel_f"], "/Cast", to=TensorProto.FLOAT),
        helper.make_node("Div", ["rel_f", "exact_f"], ["rel_div"], "/Div"),
        helper.make_node("Log", ["rel_div"], ["rel_log"], "/Log"),
        helper.make_node("Div", ["rel_log", "log_ratio"], ["rel_norm"], "/Div_1"),
        helper.make_node("Mul", ["rel_norm", "span"], ["rel_scaled"], "/Mul"),
        helper.make_node("Cast", ["rel_scaled"], ["rel_large_i"], "/Cast_1", to=TensorProto.INT64),
        helper.make_node("Add", ["rel_large_i", "exact_i"], ["large"], "/Add"),
        helper.make_node("Min", ["large", "last"], ["large_c"], "/Min"),
        helper.make_node("Where", ["small", "rel_abs", "large_c"], ["bucket"], "/Where"),
        helper.make_node("Gather", ["table", "bucket"], ["bias_ssh"], "/Gather_bias", axis=0),
        helper.make_node("Transpose", ["bias_ssh"], ["bias_hss"], "/Transpose_bias", perm=[2, 0, 1]),
        helper.make_node("Unsqueeze", ["bias_hss", "axis0"], ["bias"], "/Unsqueeze_bias"),
        # the attention mask: (1 - mask) * -1e9, as float arithmetic on the integer mask
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], "/Cast_mask", to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one_f", "mask_f"], ["inv_mask"], "/Sub"),
        helper.make_node("Mul", ["inv_mask", "neg_big"], ["mask_bias_2d"], "/Mul_mask"),
        helper.make_node("Unsqueeze", ["mask_bias_2d", "axes12"], ["mask_bias"], "/Unsqueeze_mask"),
        helper.make_node("Add", ["bias", "mask_bias"], ["position_bias"], "/Add_mask"),
        # one attention, H heads of DIM/H
        helper.make_node("MatMul", ["x", "Wq"], ["q"], "/q/MatMul"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], "/k/MatMul"),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], "/v/MatMul"),
        helper.make_node("Reshape", ["q", "heads_shape"], ["q_h"], "/q/Reshape"),
        helper.make_node("Reshape", ["k", "heads_shape"], ["k_h"], "/k/Reshape"),
        helper.make_node("Reshape", ["v", "heads_shape"], ["v_h"], "/v/Reshape"),
        helper.make_node("Transpose", ["q_h"], ["q_t"], "/q/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k_h"], ["k_t"], "/k/Transpose", perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v_h"], ["v_t"], "/v/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores"], "/scores/MatMul"),
        helper.make_node("Add", ["scores", "position_bias"], ["biased"], "/scores/Add"),
        helper.make_node("Softmax", ["biased"], ["probs"], "/Softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v_t"], ["ctx_h"], "/ctx/MatMul"),
        helper.make_node("Transpose", ["ctx_h"], ["ctx_t"], "/ctx/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "model_shape"], ["ctx_m"], "/ctx/Reshape"),
        helper.make_node("MatMul", ["ctx_m", "Wo"], ["y"], "/o/MatMul"),
    ]
    inits = [
        _init("zero", i64(0)), _init("one", i64(1)), _init("axis0", i64([0])), _init("axis1", i64([1])),
        _init("axes12", i64([1, 2])), _init("exact_i", i64(exact)), _init("last", i64(buckets - 1)),
        _init("exact_f", f32(exact)), _init("log_ratio", f32(np.log(distance / exact))),
        _init("span", f32(buckets - exact)), _init("one_f", f32(1.0)), _init("neg_big", f32(-1e9)),
        _init("table", rng.normal(0.0, 1.0, (buckets, HEADS)).astype(np.float32)),
        _init("Wq", _weight(rng, DIM, DIM)), _init("Wk", _weight(rng, DIM, DIM)), _init("Wv", _weight(rng, DIM, DIM)),
        _init("Wo", _weight(rng, DIM, DIM)), _init("heads_shape", i64([1, -1, HEADS, DIM // HEADS])),
        _init("model_shape", i64([1, -1, DIM])),
    ]
    graph = helper.make_graph(
        nodes, "t5_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", DIM]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", DIM])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def t5_feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    mask = np.ones((1, SEQ), np.int64)
    mask[0, -3:] = 0  # padding: those keys get -1e9
    return [{"x": rng.normal(0.0, 1.0, (1, SEQ, DIM)).astype(np.float32), "attention_mask": mask}
            for _ in range(count)]


def modelopt_mixed(seed: int = 0) -> onnx.ModelProto:
    """ModelOpt's FP8 export style: float16 layers between Casts in a float32 model (see the module doc)."""
    rng = np.random.default_rng(seed)
    import ml_dtypes

    w1 = _weight(rng, DIM, DIM)
    w1_scale = np.float16(np.abs(w1).max() / 448.0)
    w1_codes = (w1 / np.float32(w1_scale)).astype(ml_dtypes.float8_e4m3fn)
    fp8_zero = np.array(0, ml_dtypes.float8_e4m3fn)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "fp8_zero"], ["x_q"], "/fc1/input_quantizer/Q"),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "fp8_zero"], ["x_dq"], "/fc1/input_quantizer/DQ"),
        helper.make_node("Cast", ["x_dq"], ["x_h"], "/fc1/Cast", to=TensorProto.FLOAT16),
        helper.make_node("DequantizeLinear", ["w1_codes", "w1_scale", "fp8_zero"], ["w1"], "/fc1/weight_quantizer/DQ"),
        helper.make_node("MatMul", ["x_h", "w1"], ["h1"], "/fc1/MatMul"),
        helper.make_node("Add", ["h1", "b1"], ["h1b"], "/fc1/Add"),
        helper.make_node("Cast", ["h1b"], ["h1f"], "/fc1/Cast_1", to=TensorProto.FLOAT),
        helper.make_node("LayerNormalization", ["h1f", "ln_g", "ln_b"], ["ln"], "/ln", axis=-1),
        helper.make_node("Relu", ["ln"], ["act"], "/act"),
        helper.make_node("MatMul", ["act", "W2"], ["y"], "/fc2/MatMul"),
    ]
    inits = [
        _init("x_scale", np.array(4.0 / 448.0, np.float32)), _init("fp8_zero", fp8_zero),
        _init("w1_codes", w1_codes), _init("w1_scale", np.array(w1_scale, np.float16)),
        _init("b1", rng.normal(0.0, 0.1, DIM).astype(np.float16)),
        _init("ln_g", np.ones(DIM, np.float32)), _init("ln_b", np.zeros(DIM, np.float32)),
        _init("W2", _weight(rng, DIM, DIM)),
    ]
    graph = helper.make_graph(
        nodes, "modelopt_mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, DIM])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, DIM])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def dense_feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0.0, 1.0, (1, SEQ, DIM)).astype(np.float32)} for _ in range(count)]
