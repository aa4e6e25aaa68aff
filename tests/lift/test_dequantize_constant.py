"""Rule dequantize-constant on the weights Qualcomm AIMET's Q/DQ export writes (``sim.to_onnx_qdq()``): float
weights quantized at run time (Q → DQ, per channel), every graph output out of a DequantizeLinear, and the
block-wise int4 weights of its W4 recipes (opset 21 ``block_size``; LPBQ's per-block scales are themselves a
DequantizeLinear of uint8 codes). Each test checks the op types left, accuracy against onnxruntime running
the source, the Q/DQ contract, and that TensorRT-RTX parses and builds the converted model.

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
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info  # noqa: E402
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, save, snr_db  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions  # noqa: E402
from trt_bridge.lift.dequantize_constant import DequantizeConstant  # noqa: E402
from trt_bridge.runtime.session import session  # noqa: E402

RNG = np.random.default_rng(11)
X = [{"x": RNG.normal(size=(1, 16, 32)).astype(np.float32)} for _ in range(8)]


def _act_qdq(name: str, amax: float) -> tuple[list, dict]:
    """AIMET's activation quantizer: uint8, asymmetric around the tensor's range."""
    scale, zp = np.float32(2 * amax / 255), np.uint8(128)
    nodes = [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"], f"{name}_q"),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"],
                              f"{name}_dq")]
    return nodes, {f"{name}_s": np.array(scale), f"{name}_z": np.array(zp)}


def _weight_qdq(name: str, w: np.ndarray, kind: str) -> tuple[list, dict]:
    """A float weight quantized at run time: per channel int8 (axis 1, a MatMul's output channels), or
    int4 per block of 16 input rows (axis 0), or LPBQ: those block scales as uint8 codes × a per-channel
    float scale, dequantized by a DequantizeLinear of their own."""
    inits = {name: w}
    if kind == "per-channel":
        scale, zp, attrs = (np.abs(w).max(axis=0) / 127).astype(np.float32), np.zeros(w.shape[1], np.int8), {"axis": 1}
        inits.update({f"{name}_s": scale, f"{name}_z": zp})
        scale_nodes = []
    else:
        blocks = np.abs(w).reshape(w.shape[0] // 16, 16, w.shape[1]).max(axis=1) / 7  # [blocks, C]
        zp = np.zeros(blocks.shape, np.int8).astype(onnx.helper.tensor_dtype_to_np_dtype(TensorProto.INT4))
        attrs = {"axis": 0, "block_size": 16}
        inits[f"{name}_z"] = zp
        if kind == "block":
            inits[f"{name}_s"] = blocks.astype(np.float32)
            scale_nodes = []
        else:
            meta = (blocks.max(axis=0) / 255).astype(np.float32)
            inits.update({f"{name}_sq": np.clip(np.rint(blocks / meta), 1, 255).astype(np.uint8), f"{name}_ms": meta,
                          f"{name}_mz": np.zeros(w.shape[1], np.uint8)})
            scale_nodes = [helper.make_node("DequantizeLinear", [f"{name}_sq", f"{name}_ms", f"{name}_mz"],
                                            [f"{name}_s"], f"{name}_scale_dq", axis=1)]
    nodes = scale_nodes + [
        helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"], f"{name}_q", **attrs),
        helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"], f"{name}_dq",
                         **attrs)]
    return nodes, inits


def _aimet_like(kind: str) -> onnx.ModelProto:
    """x ─ Q─DQ ─ MatMul(W1: Q─DQ) ─ h ─ Q─DQ ─┬─ out_h                     (every output out of a DQ)
                                                └ Relu ─ r ─ Q─DQ ─ MatMul(W2: Q─DQ) ─ y ─ Q─DQ ─ out_y"""
    w1, w2 = (RNG.normal(size=(32, 48)) / 6).astype(np.float32), (RNG.normal(size=(48, 24)) / 7).astype(np.float32)
    nodes, inits = [], {}
    for part in (_act_qdq("x", 4.0), _weight_qdq("W1", w1, kind), _act_qdq("h", 5.0), _act_qdq("r", 5.0),
                 _weight_qdq("W2", w2, kind), _act_qdq("y", 4.0)):
        nodes += part[0]
        inits.update(part[1])
    nodes += [helper.make_node("MatMul", ["x_dq", "W1_dq"], ["h"], "mm1"),
              helper.make_node("Relu", ["h_dq"], ["r"], "relu"),
              helper.make_node("MatMul", ["r_dq", "W2_dq"], ["y"], "mm2"),
              helper.make_node("Identity", ["h_dq"], ["out_h"], "out_h"),
              helper.make_node("Identity", ["y_dq"], ["out_y"], "out_y")]
    order = {n: i for i, n in enumerate(["x_q", "x_dq", "W1_scale_dq", "W1_q", "W1_dq", "mm1", "h_q", "h_dq", "out_h",
                                         "relu", "r_q", "r_dq", "W2_scale_dq", "W2_q", "W2_dq", "mm2", "y_q", "y_dq",
                                         "out_y"])}
    nodes.sort(key=lambda n: order[n.name])
    graph = helper.make_graph(nodes, "aimet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
                              [helper.make_tensor_value_info("out_h", TensorProto.FLOAT, [1, 16, 48]),
                               helper.make_tensor_value_info("out_y", TensorProto.FLOAT, [1, 16, 24])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21 if kind != "per-channel" else 17)])


#: measured SNR of the converted outputs against onnxruntime running the source, the lower of the two (out_h
#: 35.7/35.3/35.2 dB, out_y 32.8/32.5/32.6 dB: the source's uint8 grids re-rounded to symmetric int8, and the
#: outputs' own Q/DQ gone, as TensorRT's placement has them); bars 3 dB under
MEASURED = {"per-channel": 32.8, "block": 32.5, "lpbq": 32.6}


@pytest.mark.parametrize("kind", ["per-channel", "block", "lpbq"])
def test_run_time_quantized_weights_and_outputs_out_of_dq(tmp_path, kind):
    source = save(_aimet_like(kind), tmp_path / "aimet.onnx")
    onnx.checker.check_model(onnx.load(str(source)), full_check=True)
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert report.rules and {r.rule for r in report.rules} >= {"dequantize-constant", "qdq-pair"}
    assert not report.remaining_blockers
    model = assert_qdq_contract(out)
    assert [o.name for o in model.graph.output] == ["out_h", "out_y"]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weight_dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    # per channel: int8 on axis 1 of the MatMul weight; blocks: the source's int4 codes in its blocks of 16 input
    # rows (axis 0), TensorRT's INT4 weight-only form (the layers' activations float: TensorRT-RTX builds no INT8 ×
    # INT4 layer of these shapes)
    assert len(weight_dqs) == 2
    for dq in weight_dqs:
        attrs = {a.name: a.i for a in dq.attribute}
        if kind == "per-channel":
            assert inits[dq.input[0]].dtype == np.int8 and inits[dq.input[1]].ndim == 1 and attrs["axis"] == 1
        else:
            codes, scale = inits[dq.input[0]], inits[dq.input[1]]
            assert codes.dtype.name == "int4" and scale.shape == (codes.shape[0] // 16, codes.shape[1])
            assert attrs == {"axis": 0, "block_size": 16}
    sources = {q["source"] for q in report.quantized if q["kind"] == "weight"}
    # the source's own codes are kept: int8 (its scale covers ±127) and int4 blocks alike
    assert sources == {"exact-weights"}
    assert op_types(out) <= {"QuantizeLinear", "DequantizeLinear", "MatMul", "Relu", "Identity", "Clip"}
    src, conv = session(source), session(out, simulate_qdq=True)
    expected, got = [src.run(None, f) for f in X], [conv.run(None, f) for f in X]
    for i, name in enumerate(("out_h", "out_y")):
        snr = snr_db([e[i] for e in expected], [g[i] for g in got])
        assert snr > MEASURED[kind] - 3.0, f"{name}: {snr:.1f} dB"
    assert_tensorrt_ready(out)


#               32.0 ─ Mul ─ Cast(int64) ─ Unsqueeze ─┐
#   one = Q(1.0) ─ DQ ─┘                              │
#   x ──────────────────────────────────────────────────────── Reshape(Concat([1, 16], ·)) ─ MatMul(W) ─ y
def test_a_scalar_quantized_at_run_time_stays_a_scalar(tmp_path):
    # AIMET quantizes the float scalars of MobileViT's shape arithmetic; a dequantized scalar that came back as
    # [1] changed the rank of the Reshape shape built from it, and the converted model failed ONNX's checks
    w = RNG.normal(0, 0.2, (32, 24)).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["half", "half_s", "half_z"], ["half_q"]),
             helper.make_node("DequantizeLinear", ["half_q", "half_s", "half_z"], ["half_dq"]),
             helper.make_node("Mul", ["n_f", "half_dq"], ["m"]),
             helper.make_node("Cast", ["m"], ["m_i"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["m_i", "axes"], ["m_1"]),
             helper.make_node("Concat", ["lead", "m_1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    inits = {"n_f": np.array(32.0, np.float32), "half": np.array(1.0, np.float32),
             "half_s": np.array(1 / 127, np.float32), "half_z": np.array(0, np.int8), "axes": np.array([0], np.int64),
             "lead": np.array([1, 16], np.int64), "w": w}
    graph = helper.make_graph(nodes, "scalar", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 24])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "src.onnx")
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in X]))
    out = tmp_path / "out.onnx"
    convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False))
    assert {"Reshape", "MatMul", "QuantizeLinear"} <= op_types(out)
    want = np.concatenate([session(src).run(None, f)[0].ravel() for f in X])
    got = np.concatenate([session(out).run(None, f)[0].ravel() for f in X])
    assert snr_db([want], [got]) > 35.0
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


# --- the rule called directly ---------------------------------------------------------------------------------------

#   W_q int8 [32, 24] ─ DQ(w_s [24], axis 1) ─ w ─ MatMul(x, ·) ─ y      (as_output: w also a graph output)
def _dequantized_weight(as_output: bool = False):
    w_s = (RNG.random(24) * 0.01 + 0.002).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["W_q", "w_s"], ["w"], "dq", axis=1),
             helper.make_node("MatMul", ["x", "w"], ["y"], "matmul")]
    outputs = [tensor_info("y", [1, 16, 24])] + ([tensor_info("w", [32, 24])] if as_output else [])
    return build_model(nodes, [tensor_info("x", [1, 16, 32])], outputs,
                       {"W_q": RNG.integers(-127, 128, (32, 24)).astype(np.int8), "w_s": w_s})


def test_rule_lifts_the_weight_to_float_keeping_its_integers():
    source = _dequantized_weight()
    out, ctx = lifted(source, (DequantizeConstant(), "dq"))
    assert ops_left(out) == ["MatMul"]
    (spec,) = ctx.annotations.weights.values()
    assert (spec.axis, spec.source.value) == (1, "exact-weights")
    assert_same_outputs(source, out, X[:3], rtol=0, atol=0)


def test_rule_declines_a_weight_that_is_a_graph_output_untouched():
    assert declined(_dequantized_weight(as_output=True), DequantizeConstant(), "dq") == "'w' is a graph output"
