"""Patterns NNCF (``nncf.quantize``, ONNX backend) writes: an activation Q/DQ pair per axis (it takes the
axis it believes is the channel one, which for a ``[N, tokens, C]`` tensor is the token axis), and
per-channel weights stored as int8 initializers read by a ``DequantizeLinear`` alone, with a negative
``axis``. TensorRT quantizes activations per tensor only: the rule ``qdq-pair`` lifts the per-axis pair
to one per-tensor scale covering all channels' ranges, logs a warning and lists it in the report's
``approximated``; a pair whose scale overflowed to inf (an attention mask's range) is left in float, recorded
the same way. Each test checks the op types left, the numerics against onnxruntime (on the source, or on the
float model it stands for where the source's own numbers are not finite) and TensorRT-RTX's parse and build."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_ort, save, snr_db  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import ConvertOptions  # noqa: E402
from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.pipeline import lift_model

TOKENS, C, N = 16, 32, 48


def _nncf_like(zero_points: bool) -> tuple[onnx.ModelProto, dict]:
    """What NNCF wrote for SegFormer's MLP (tokens 16, channels 32), with its weight pattern:

        x [1, 16, 32] ─ Add(b) ─ h ─ Q(s[16], z[16], axis=1) ─ DQ(s[16], z[16], axis=1) ─ Transpose(0, 2, 1) ─┐
                                                                                                             │
        W_q int8 [16, 48] ─ DQ(s_w[48], axis=-1) ────────────────────────────────────────────────────── MatMul ─ y

    ``zero_points``: NNCF's mixed preset (int8 codes with non-zero zero points, per token here)."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(TOKENS, N)).astype(np.float32) / 4
    s_w = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    h_max = np.linspace(1.0, 3.0, TOKENS).astype(np.float32)  # the per-token ranges NNCF saw differ
    if zero_points:
        s = (2 * h_max / 255).astype(np.float32)
        z = rng.integers(-20, 20, TOKENS).astype(np.int8)
    else:
        s, z = (h_max / 127).astype(np.float32), np.zeros(TOKENS, np.int8)
    inits = {"b": rng.normal(size=(C,)).astype(np.float32) / 10, "s": s, "z": z,
             "W_q": np.clip(np.rint(w / s_w), -127, 127).astype(np.int8), "s_w": s_w}
    nodes = [helper.make_node("Add", ["x", "b"], ["h"], "fc1/Add"),
             helper.make_node("QuantizeLinear", ["h", "s", "z"], ["h_q"], "q_h", axis=1),
             helper.make_node("DequantizeLinear", ["h_q", "s", "z"], ["h_dq"], "dq_h", axis=1),
             helper.make_node("Transpose", ["h_dq"], ["h_t"], "transpose", perm=[0, 2, 1]),
             helper.make_node("DequantizeLinear", ["W_q", "s_w"], ["W"], "dq_w", axis=-1),
             helper.make_node("MatMul", ["h_t", "W"], ["y"], "matmul")]
    graph = helper.make_graph(nodes, "nncf_like",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, C])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, N])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), inits


def _feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    scale = np.linspace(1.0, 3.0, TOKENS, dtype=np.float32).reshape(1, TOKENS, 1) / 2.5
    return [{"x": (rng.normal(size=(1, TOKENS, C)) * scale).astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("zero_points", [False, True], ids=["symmetric", "mixed"])
def test_per_axis_activation_becomes_one_covering_scale(tmp_path, caplog, zero_points):
    model, inits = _nncf_like(zero_points)
    source = save(model, tmp_path / "nncf.onnx")
    out = tmp_path / "converted.onnx"
    with caplog.at_level(logging.WARNING, logger="trt_bridge.lift.qdq_pair"):
        report = convert(source, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers
    assert [a["node"] for a in report.approximated] == ["q_h"]
    assert "per-axis activation" in caplog.text and "'h'" in caplog.text
    # (a) every Q left is per tensor; the weight is int8 + per-channel DQ on the MatMul's axis 1 (from -1)
    converted = assert_qdq_contract(out)
    consts = {i.name: numpy_helper.to_array(i) for i in converted.graph.initializer}
    for node in converted.graph.node:
        if node.op_type == "QuantizeLinear":
            assert consts[node.input[1]].size == 1
    weight_dq = [n for n in converted.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in consts
                 and consts[n.input[0]].ndim == 2]
    assert len(weight_dq) == 1 and consts[weight_dq[0].input[1]].shape == (N,)
    assert next(a.i for a in weight_dq[0].attribute if a.name == "axis") == 1
    np.testing.assert_array_equal(consts[weight_dq[0].input[0]], inits["W_q"])  # the source's integers, kept
    # the activation's scale covers the union of the source's per-token ranges
    lo = ((-128 - inits["z"].astype(np.int64)) * inits["s"].astype(np.float64)).min()
    hi = ((127 - inits["z"].astype(np.int64)) * inits["s"].astype(np.float64)).max()
    act = next(q for q in report.quantized if q["kind"] == "activation")
    assert act["scale"] == pytest.approx(max(abs(lo), abs(hi)) / 127, rel=1e-6)
    # (b) close to the source as onnxruntime runs it (per-token codes, 3× finer on the narrowest token than
    # the one covering scale): measured 27.9 dB (symmetric) and 26.4 dB (mixed); the bars are 3 dB under
    feeds = _feeds(6, 1)
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > (23.4 if zero_points else 24.9)
    # (c) TensorRT-RTX parses and builds it
    assert_tensorrt_ready(out)


def test_negative_weight_axis_is_lifted_exactly(tmp_path):
    """The lifted float graph computes the source's dequantized weight, read on axis -1 = 1."""
    model, inits = _nncf_like(False)
    source = save(model, tmp_path / "nncf.onnx")
    lifted, ctx = lift_model(load_model(source), source)
    assert not op_types(lifted) & {"QuantizeLinear", "DequantizeLinear"}
    assert ctx.fired["dequantize-constant"] == ["dq_w"]
    weights = {i.name: numpy_helper.to_array(i) for i in lifted.graph.initializer}
    matmul = next(n for n in lifted.graph.node if n.op_type == "MatMul")
    np.testing.assert_array_equal(weights[matmul.input[1]],
                                  (inits["W_q"].astype(np.float64) * inits["s_w"]).astype(np.float32))
    spec = ctx.annotations.weights[matmul.input[1]]
    assert spec.axis == 1 and spec.codes is not None


def _overflowed_mask_scale() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """NNCF's default preset on BERT's additive attention mask (0 or float32's lowest): its range overflows
    and the pair gets scale inf, which TensorRT rejects (and DequantizeLinear computes 0 · inf = NaN):

        mask [1, 16] ─ Q(inf, −128) ─ DQ(inf, −128) ─┐
        x [1, 16] ──────────────────────────────── Add ─ h ─ Q(s_h) ─ DQ(s_h) ─ MatMul(DQ(W_q, s_w, axis=-1)) ─ y

    Returns (the source, the float model it stands for: the same graph without any Q/DQ)."""
    rng = np.random.default_rng(5)
    w = rng.normal(size=(N, N)).astype(np.float32) / 4
    s_w = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    w_q = np.clip(np.rint(w / s_w), -127, 127).astype(np.int8)
    inits = {"inf": np.array(np.inf, np.float32), "z_mask": np.array(-128, np.int8),
             "s_h": np.array(4.0 / 127, np.float32), "z": np.array(0, np.int8), "W_q": w_q, "s_w": s_w}
    io = ([helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, N]),
           helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])])
    nodes = [helper.make_node("QuantizeLinear", ["mask", "inf", "z_mask"], ["m_q"], "q_mask"),
             helper.make_node("DequantizeLinear", ["m_q", "inf", "z_mask"], ["m"], "dq_mask"),
             helper.make_node("Add", ["x", "m"], ["h"], "add_mask"),
             helper.make_node("QuantizeLinear", ["h", "s_h", "z"], ["h_q"], "q_h"),
             helper.make_node("DequantizeLinear", ["h_q", "s_h", "z"], ["h_dq"], "dq_h"),
             helper.make_node("DequantizeLinear", ["W_q", "s_w"], ["W"], "dq_w", axis=-1),
             helper.make_node("MatMul", ["h_dq", "W"], ["y"], "matmul")]
    source = helper.make_graph(nodes, "mask", *io, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    floats = helper.make_graph([helper.make_node("Add", ["x", "mask"], ["h"], "add_mask"),
                                helper.make_node("MatMul", ["h", "W"], ["y"], "matmul")], "float", *io,
                               [numpy_helper.from_array((w_q * s_w).astype(np.float32), "W")])
    return tuple(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]) for g in (source, floats))


def test_non_finite_scale_leaves_the_tensor_in_float(tmp_path, caplog):
    model, float_model = _overflowed_mask_scale()
    source = save(model, tmp_path / "nncf.onnx")
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.normal(size=(1, N)).astype(np.float32),
              "mask": np.where(rng.random((1, N)) < 0.2, -1.0, 0.0).astype(np.float32)} for _ in range(6)]
    out = tmp_path / "converted.onnx"
    with caplog.at_level(logging.WARNING, logger="trt_bridge.lift.qdq_pair"):
        report = convert(source, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers
    assert [a["node"] for a in report.approximated] == ["q_mask"] and "stays in float" in caplog.text
    # (a) the mask is read in float; the only activation Q left is the MatMul input's, with the source's scale
    converted = assert_qdq_contract(out)
    consts = {i.name: numpy_helper.to_array(i) for i in converted.graph.initializer}
    quantizers = [n for n in converted.graph.node if n.op_type == "QuantizeLinear"]
    assert [consts[q.input[1]].item() for q in quantizers] == [pytest.approx(4.0 / 127)]
    assert not any("mask" in n.input for n in quantizers)
    # (b) against the float model the source stands for: measured 41.7 dB, the bar 3 dB under
    assert snr_db(run_ort(float_model, feeds), run_ort(out, feeds)) > 38.7
    # (c) TensorRT-RTX parses and builds it
    assert_tensorrt_ready(out)
