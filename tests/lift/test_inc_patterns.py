"""What Intel Neural Compressor 1.0's QDQ format writes that onnxruntime itself cannot run, lifted by
``dequantize-constant``: one int32 bias ``DequantizeLinear`` shared by several Conv/Gemm nodes (onnxruntime's
optimizer merged their identical float biases), with the per-channel ``axis`` of a MatMul weight (1) on a
1-D bias. onnxruntime fails at run time ("axis 1 is not in valid range [-1,0]"); the only axis a 1-D bias has
is meant, and the converted model computes the source with ``axis=0``."""

from __future__ import annotations

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

#   x ─ Q ─ DQ ─ Gemm1(W1_q ─ DQ(axis 1)) ─ Q ─ DQ ─ Gemm2(W2_q ─ DQ(axis 1)) ─ y
#                  │                                  │
#   b_quantized:int32 [32] ─ DQ(b_scale [32], axis = 1) ─ b_dequantized ─┘   (one DQ, both Gemms)


def _model(bias_axis: int) -> onnx.ModelProto:
    rng = np.random.default_rng(7)

    def weight(name):
        w = rng.normal(size=(32, 32)) / 6
        scale = np.abs(w).max(0) / 127  # per output column: axis 1 of a [K, N] weight
        return {f"{name}_q": np.rint(w / scale).astype(np.int8), f"{name}_s": scale.astype(np.float32),
                f"{name}_z": np.zeros(32, np.int8)}

    bscale = np.full(32, 0.02 / 127 * 0.01, np.float32)
    inits = {**weight("W1"), **weight("W2"), "sx": np.float32(4 / 127), "sh": np.float32(6 / 127), "z": np.int8(0),
             "b_quantized": np.rint(rng.normal(size=32) / 4 / bscale).astype(np.int32), "b_scale": bscale,
             "b_zero_point": np.zeros(32, np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"], "qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"], "dqx"),
             helper.make_node("DequantizeLinear", ["W1_q", "W1_s", "W1_z"], ["W1"], "dqw1", axis=1),
             helper.make_node("DequantizeLinear", ["W2_q", "W2_s", "W2_z"], ["W2"], "dqw2", axis=1),
             helper.make_node("DequantizeLinear", ["b_quantized", "b_scale", "b_zero_point"], ["b_dequantized"],
                              "b_DequantizeLinear", axis=bias_axis),
             helper.make_node("Gemm", ["xd", "W1", "b_dequantized"], ["h"], "gemm1"),
             helper.make_node("QuantizeLinear", ["h", "sh", "z"], ["hq"], "qh"),
             helper.make_node("DequantizeLinear", ["hq", "sh", "z"], ["hd"], "dqh"),
             helper.make_node("Gemm", ["hd", "W2", "b_dequantized"], ["y"], "gemm2")]
    graph = helper.make_graph(nodes, "shared_bias_axis", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                        [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": np.clip(rng.normal(size=(8, 32)), -3.9, 3.9).astype(np.float32)} for _ in range(count)]


def test_shared_int32_bias_with_a_weight_axis_is_read_on_its_only_axis(tmp_path):
    source = save(_model(bias_axis=1), tmp_path / "inc_qdq.onnx")
    intended = save(_model(bias_axis=0), tmp_path / "intended.onnx")
    with pytest.raises(Exception, match="axis 1 is not in valid range"):
        run_ort(source, _feeds(1, 0))
    lifted, ctx = lift_model(load_model(source), source)
    assert "b_DequantizeLinear" in ctx.fired["dequantize-constant"]
    assert "DequantizeLinear" not in op_types(lifted)
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers
    assert op_types(out) == {"QuantizeLinear", "DequantizeLinear", "Gemm"}
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    held_out = _feeds(4, 3)
    # the source as meant (bias on axis 0), which onnxruntime runs: symmetric int8 with the source's own scales and
    # integers, so the conversion is exact (measured: identical outputs)
    for want, got in zip(run_ort(intended, held_out), run_ort(out, held_out)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- data movement and max/min run on the codes (INC's QOperator Gather family; ReduceMax/ReduceMin) -------------
#
#   x ─ QuantizeLinear(s, z:uint8) ─ GatherElements | GatherND | ReduceMax | ReduceMin ─ DequantizeLinear(s, z)
#                                                                            ─ MatMul(W) ─ y
#
# The op's output carries its input's scale and zero point (the codes are moved, or the largest/smallest one is
# picked: DequantizeLinear is increasing), so it is the float op between the same DQ and Q.

def _codes_model(op: str) -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    inits = {"s": np.float32(6 / 255), "z": np.uint8(120), "W": (rng.normal(size=(32, 32)) / 6).astype(np.float32)}
    inputs = ["xq"]
    attrs = {}
    if op == "GatherElements":
        inits["idx"] = rng.integers(0, 32, size=(4, 16, 32)).astype(np.int64)
        inputs.append("idx")
        attrs["axis"] = 2
    elif op == "GatherND":
        inits["idx"] = rng.integers(0, 16, size=(4, 16, 1)).astype(np.int64)
        inputs.append("idx")
        attrs["batch_dims"] = 1
    else:
        attrs.update(axes=[1], keepdims=1)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], "qx"),
             helper.make_node(op, inputs, ["mq"], "moved_quant", **attrs),
             helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["m"], "dqm"),
             helper.make_node("MatMul", ["m", "W"], ["y"], "proj")]
    graph = helper.make_graph(nodes, "codes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["GatherElements", "GatherND", "ReduceMax", "ReduceMin"])
def test_ops_on_the_codes_are_lifted_between_dq_and_q(tmp_path, op):
    source = save(_codes_model(op), tmp_path / "codes.onnx")
    lifted, ctx = lift_model(load_model(source), source)
    assert "moved_quant" in ctx.fired["integer-pass-through"]
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers
    assert op in op_types(out) and "MatMul" in op_types(out)
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    rng = np.random.default_rng(2)
    held_out = [{"x": rng.uniform(-2.8, 3.1, size=(4, 16, 32)).astype(np.float32)} for _ in range(3)]
    # inside the source's range [−120·s, 135·s]: onnxruntime runs the source on uint8 codes, the conversion
    # re-quantizes the MatMul input to symmetric int8 over the same range (measured 44.8 to 48.8 dB)
    assert snr_db(run_ort(source, held_out), run_ort(out, held_out)) > 41.8
