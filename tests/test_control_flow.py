"""Control flow: models whose If branches and Loop bodies read outer-scope tensors sort, lift and convert; the
bodies are placed, calibrated and lowered as graphs of their own (conversion/bodies.py).

The model is a small streaming voice-activity detector shaped like Silero VAD (tests/control_flow_models.py): the
sample rate picks an If branch of Conv → Conv → LSTM → MatMul layers whose weights are Constant nodes in the branch,
reading the audio and the LSTM state from the outer graph; its dynamic form is onnxruntime's
``quantize_dynamic(EnableSubgraph)``, which quantizes the branches' activation once, in the main graph.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from control_flow_models import constants_as_initializers, vad_feeds, vad_model
from helpers import assert_qdq_contract, assert_tensorrt_ready, quantize_dynamic, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.conversion import convert
from trt_bridge.conversion.bodies import expose
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.ir.model import load_model
from trt_bridge.ir.toposort import toposort
from trt_bridge.runtime.session import session

INTEGER_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM"}


def _branches(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    found = []

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for attr in node.attribute:
                for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    found.append(body)
                    visit(body)

    visit(model.graph)
    return found


def _calib(tmp_path, count: int = 24):
    """Calibration feeds at both sample rates, saved as ``calib.npz``."""
    feeds = vad_feeds(count // 2, seed=1) + vad_feeds(count // 2, seed=3, rate=8000)
    path = tmp_path / "calib.npz"
    np.savez(path, **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    return path


def _held_out(rate: int) -> list[dict[str, np.ndarray]]:
    return vad_feeds(12, seed=5, rate=rate)


# --- sorting: a body's outer-scope names -----------------------------------------------------------------------------

def test_a_body_sorts_on_its_own_and_keeps_the_outer_producers_out():
    """ir/toposort on an If branch (no subgraph of its own: the fast path) orders the branch's nodes, and leaves the
    main-graph node producing the outer-scope tensor it reads where it is."""
    graph = gs.import_onnx(vad_model())
    branch = next(n for n in graph.nodes if n.op == "If").attrs["then_branch"]
    own = {n.name for n in branch.nodes}
    random.Random(3).shuffle(branch.nodes)
    theirs = [n.name for n in branch.copy().toposort().nodes]  # onnx-graphsurgeon knows foreign tensors
    toposort(branch)
    assert [n.name for n in branch.nodes] == theirs and set(theirs) == own
    assert {n.name for n in graph.nodes} == {"front", "gain", "is16k", "If_0", "prob"}


def test_a_shuffled_float_model_with_control_flow_loads_sorted(tmp_path):
    """The main graph's nodes out of order, the If before the node producing what its branches read, and a branch's
    nodes reversed (onnxruntime sorts both itself; onnx refuses them): load sorts them (the branches' outer-scope
    names count as the If's inputs), and the model still computes the same."""
    model = vad_model()
    for graph in (model.graph, _branches(model)[0]):
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(reversed(nodes))
    path = save(model, tmp_path / "shuffled.onnx")
    loaded = load_model(path)
    order = [n.name for n in loaded.graph.node]
    assert order.index("gain") < order.index("If_0") and order.index("is16k") < order.index("If_0")
    onnx.checker.check_model(loaded, full_check=True)
    feeds = _held_out(16000)[:2]
    for want, got in zip(run_ort(vad_model(), feeds), run_ort(loaded, feeds)):
        np.testing.assert_array_equal(got, want)


# --- calibration: branch tensors passed out ---------------------------------------------------------------------------

def test_expose_passes_branch_tensors_out_of_the_if():
    """The branch taken gives its tensor; the other gives an empty one; main-graph tensors are themselves."""
    model = vad_model()
    wanted = {"sr16k/relu", "sr8k/relu", "xs"}
    exposed = expose(model, wanted, {})
    assert exposed["xs"] == "xs" and set(exposed) == wanted
    onnx.checker.check_model(model)
    names = [exposed["sr16k/relu"], exposed["sr8k/relu"]]
    model.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names)
    sess = session(model)
    feed = _held_out(16000)[0]
    then_value, else_value = sess.run(names, feed)
    assert then_value.shape == (1, 16, 64) and else_value.size == 0
    feed["sr"] = np.array(8000, np.int64)
    then_value, else_value = sess.run(names, feed)
    assert then_value.size == 0 and else_value.shape == (1, 16, 64)


# --- convert: float and dynamic sources -------------------------------------------------------------------------------

def test_the_float_vad_converts_with_int8_inside_its_branches(tmp_path):
    """The float model: each branch's Convs and MatMul get Q/DQ inside the branch; TensorRT-RTX builds the model;
    both sample rates follow the float model (a finite SNR of at least 25 dB; the issue asks for 10)."""
    src = save(vad_model(), tmp_path / "vad.onnx")
    out = tmp_path / "vad.int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(_calib(tmp_path))),
                                              progress=False))
    assert not report.remaining_blockers
    assert report.control_flow["bodies"] == 2
    converted = assert_qdq_contract(out)
    for branch in _branches(converted):
        ops = [n.op_type for n in branch.node]
        assert ops.count("QuantizeLinear") >= 3 and "LSTM" in ops, branch.name
    for rate in (16000, 8000):
        feeds = _held_out(rate)
        snr = snr_db(run_ort(src, feeds), run_ort(out, feeds))
        assert np.isfinite(snr) and snr > 25, (rate, snr)
    assert_tensorrt_ready(out)


@pytest.fixture(scope="module")
def dynamic_vad(tmp_path_factory):
    """(float model, its quantize_dynamic(EnableSubgraph) form): the Constant weights held as the branches'
    initializers first, as onnxruntime's optimizer leaves them (the quantizer quantizes initializers only)."""
    folder = tmp_path_factory.mktemp("vad")
    float_path = save(vad_model(), folder / "vad.onnx")
    ready = save(constants_as_initializers(vad_model()), folder / "vad.initializers.onnx")
    return float_path, quantize_dynamic(ready, folder / "vad.dynamic.onnx", extra_options={"EnableSubgraph": True})


def test_the_dynamic_vad_converts_within_a_db_of_its_source(dynamic_vad, tmp_path):
    """onnxruntime's dynamic form (ConvInteger, DynamicQuantizeLSTM, MatMulInteger in the branches; the branches'
    DynamicQuantizeLinear in the main graph): lifted in the branches, no integer op left anywhere, Q/DQ inside the
    branches, TensorRT-RTX builds it, and at both sample rates it is within 1 dB of the source's SNR against the
    float model."""
    float_path, dynamic = dynamic_vad
    source = onnx.load(str(dynamic))
    assert {n.op_type for b in _branches(source) for n in b.node} >= {"ConvInteger", "DynamicQuantizeLSTM",
                                                                      "MatMulInteger"}
    out = tmp_path / "vad.int8.onnx"
    report = convert(dynamic, out, ConvertOptions(calibration=CalibrationOptions(data=str(_calib(tmp_path))),
                                                  progress=False))
    assert not report.remaining_blockers
    converted = assert_qdq_contract(out)
    for graph in (converted.graph, *_branches(converted)):
        assert not {n.op_type for n in graph.node} & INTEGER_OPS
    assert all("QuantizeLinear" in {n.op_type for n in b.node} for b in _branches(converted))
    assert report.precision["counts"]["int8"] >= 8  # the branches' layers are counted (and the front Conv)
    for rate in (16000, 8000):
        feeds = _held_out(rate)
        reference = run_ort(float_path, feeds)
        theirs, ours = snr_db(reference, run_ort(dynamic, feeds)), snr_db(reference, run_ort(out, feeds))
        assert ours > theirs - 1.0, (rate, theirs, ours)
    assert_tensorrt_ready(out)


def test_without_calibration_data_the_dynamic_branches_keep_runtime_ranges(dynamic_vad, tmp_path):
    """No data: the source's dynamic activations in the branches get runtime ranges (no scale needed), the
    model converts and follows the source."""
    float_path, dynamic = dynamic_vad
    out = tmp_path / "vad.int8.onnx"
    report = convert(dynamic, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers
    assert any(q["kind"] == "runtime" for q in report.quantized)
    feeds = _held_out(16000)
    reference = run_ort(float_path, feeds)
    assert snr_db(reference, run_ort(out, feeds)) > snr_db(reference, run_ort(dynamic, feeds)) - 1.0


# --- Loop: lifted, placed, calibrated through a scan output -------------------------------------------------------

#   x ─ Relu ─ xs ─────────────────────┐ (outer scope)
#   h0 ─ Loop(3) body: h ─ MatMul(W) ─ Add(xs) ─ Tanh ─ h   (TensorRT's parser needs the Loop's condition input given)
def _loop_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["hw"], "body_mm"),
         helper.make_node("Add", ["hw", "xs"], ["pre"], "body_add"),
         helper.make_node("Tanh", ["pre"], ["h_out"], "body_tanh"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], "body_cond")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array((rng.normal(0, 1, (16, 16)) / 4).astype(np.float32), "W")])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["xs"], "relu"),
         helper.make_node("Loop", ["trip", "keep_going", "h0"], ["h"], "loop", body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(np.array(3, np.int64), "trip"), numpy_helper.from_array(np.array(True), "keep_going")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _loop_feeds(tmp_path):
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (1, 16)).astype(np.float32), "h0": rng.normal(0, 1, (1, 16)).astype(np.float32)}
             for _ in range(16)]
    np.savez(tmp_path / "calib.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    return feeds, tmp_path / "calib.npz"


def test_expose_passes_a_loop_body_tensor_out_as_a_scan_output():
    """A Loop body's carried input, passed out: its value on every iteration, stacked."""
    model = _loop_model()
    exposed = expose(model, {"h_in", "hw"}, {})
    model.graph.output.extend(helper.make_tensor_value_info(exposed[t], TensorProto.FLOAT, None)
                              for t in ("h_in", "hw"))
    feed = {"x": np.ones((1, 16), np.float32), "h0": np.full((1, 16), 0.5, np.float32)}
    h, h_in, hw = session(model).run(["h", exposed["h_in"], exposed["hw"]], feed)
    assert h_in.shape == (3, 1, 16) and hw.shape == (3, 1, 16)
    np.testing.assert_array_equal(h_in[0], feed["h0"])
    np.testing.assert_allclose(np.tanh(hw[-1] + 1.0), h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["float", "dynamic"])
def test_a_loop_body_is_quantized(form, tmp_path):
    """A Loop body's MatMul (float; or a MatMulInteger of onnxruntime's EnableSubgraph, lifted there) gets Q/DQ in
    the body, calibrated on the values of every iteration; it follows the float model (the dynamic form within 1 dB
    of its source) and TensorRT-RTX builds it."""
    float_path = save(_loop_model(), tmp_path / "loop.onnx")
    src = float_path if form == "float" else quantize_dynamic(float_path, tmp_path / "loop.dynamic.onnx",
                                                              extra_options={"EnableSubgraph": True})
    feeds, calib = _loop_feeds(tmp_path)
    out = tmp_path / "loop.int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(calib)), progress=False))
    assert report.control_flow["bodies"] == 1 and not report.control_flow["float_bodies"]
    (body,) = _branches(onnx.load(str(out)))
    ops = {n.op_type for n in body.node}
    assert {"MatMul", "QuantizeLinear", "DequantizeLinear"} <= ops and not ops & INTEGER_OPS
    reference = run_ort(float_path, feeds)
    ours = snr_db(reference, run_ort(out, feeds))
    assert ours > (25 if form == "float" else snr_db(reference, run_ort(src, feeds)) - 1.0)
    assert_tensorrt_ready(out)


# --- nested If -----------------------------------------------------------------------------------------------------

#   x ─ Relu ─ xs ──────────────────────────────────────────────────┐ (outer scope)
#   If(a) ─ then: If(b) ─ then: Conv(xs, W1) ─ Relu                  │
#         │             └ else: Conv(xs, W2) ─ Relu                  │
#         └ else: Conv(xs, W3) ─ Relu ───────────────────────────────┘
def _nested_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def branch(tag: str) -> onnx.GraphProto:
        w = numpy_helper.from_array((rng.normal(0, 1, (16, 16, 3)) / 7).astype(np.float32), f"{tag}_w")
        return helper.make_graph(
            [helper.make_node("Constant", [], [f"{tag}_w"], f"{tag}_w/const", value=w),
             helper.make_node("Conv", ["xs", f"{tag}_w"], [f"{tag}_conv"], f"{tag}_conv", pads=[1, 1]),
             helper.make_node("Relu", [f"{tag}_conv"], [f"{tag}_out"], f"{tag}_relu")], tag, [],
            [helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT, [1, 16, 32])])

    inner = helper.make_graph([helper.make_node("If", ["b"], ["inner_out"], "inner_if", then_branch=branch("t1"),
                                                else_branch=branch("t2"))], "inner", [],
                              [helper.make_tensor_value_info("inner_out", TensorProto.FLOAT, [1, 16, 32])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["xs"], "relu"),
         helper.make_node("If", ["a"], ["y"], "outer_if", then_branch=inner, else_branch=branch("e1"))], "nested",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32]),
         helper.make_tensor_value_info("a", TensorProto.BOOL, []),
         helper.make_tensor_value_info("b", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_nested_if_branches_are_each_quantized(tmp_path):
    """An If inside an If branch: every branch, the inner ones too, gets its Q/DQ, calibrated through both Ifs;
    every path follows the float model and TensorRT-RTX builds the model."""
    src = save(_nested_model(), tmp_path / "nested.onnx")
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (1, 16, 32)).astype(np.float32), "a": np.array(a), "b": np.array(b)}
             for a in (True, False) for b in (True, False) for _ in range(4)]
    np.savez(tmp_path / "calib.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    out = tmp_path / "nested.int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              progress=False))
    assert not report.remaining_blockers and report.control_flow["bodies"] == 4
    converted = assert_qdq_contract(out)
    convs = [b for b in _branches(converted) if any(n.op_type == "Conv" for n in b.node)]
    assert len(convs) == 3 and all("QuantizeLinear" in {n.op_type for n in b.node} for b in convs)
    for a, b in ((True, True), (True, False), (False, False)):
        held = [{**f, "a": np.array(a), "b": np.array(b)} for f in feeds[:4]]
        assert snr_db(run_ort(src, held), run_ort(out, held)) > 25, (a, b)
    assert_tensorrt_ready(out)


def test_float16_inside_the_branches(tmp_path):
    """--high-precision fp16 retypes inside both If branches (lower/body_precision.py): each branch's Convs and
    MatMul read float16, the model's inputs and outputs keep float32, and both sample rates follow the float model."""
    from trt_bridge.conversion.options import PrecisionOptions

    src = save(vad_model(), tmp_path / "vad.onnx")
    out = tmp_path / "vad.fp16.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(_calib(tmp_path))),
                                              precision=PrecisionOptions(high_precision="fp16"), progress=False))
    assert not report.remaining_blockers
    converted = assert_qdq_contract(out)
    assert [v.type.tensor_type.elem_type for v in converted.graph.output] == \
        [v.type.tensor_type.elem_type for v in onnx.load(str(src)).graph.output]
    for branch in _branches(converted):
        casts = [a.i for n in branch.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
        assert TensorProto.FLOAT16 in casts, branch.name
    for rate in (16000, 8000):
        feeds = _held_out(rate)
        snr = snr_db(run_ort(src, feeds), run_ort(out, feeds))
        assert np.isfinite(snr) and snr > 25, (rate, snr)


def test_float16_refuses_a_loop_by_name():
    """A Loop's body carries its state across iterations: the float16 pass names it and says what to do."""
    from trt_bridge.errors import UnsupportedPatternError
    from trt_bridge.lower.precision import to_low_precision

    body = helper.make_graph([helper.make_node("Add", ["s_in", "x"], ["s_out"]),
                              helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2])],
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2])])
    graph = helper.make_graph([helper.make_node("Loop", ["n", "c", "x"], ["y"], "the_loop", body=body)], "loop",
                              [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                               helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(UnsupportedPatternError, match="a Loop .'the_loop'.*If branches only.*--high-precision fp32"):
        to_low_precision(model, "fp16")


def test_check_says_convert_lifts_the_dynamic_branches(dynamic_vad):
    """``check`` on the dynamic source: the If holding integer ops is a blocker convert fixes."""
    from trt_bridge.checks import CheckOptions, TrtProbe, check_model

    report = check_model(dynamic_vad[1], CheckOptions(trt=TrtProbe.OFF))
    (flow,) = [f for f in report.blockers if f.rule == "control-flow"]
    assert flow.node == "If_0" and flow.fixable and "get symmetric int8 Q/DQ there" in flow.fix
    assert all(f.fixable for f in report.blockers)


def test_a_source_quantized_only_inside_a_body_converts_without_data(tmp_path):
    """Every quantized op inside the Loop body, no calibration data: not refused as a float model; the body's
    dynamic activation keeps a range per inference and the model follows its source."""
    float_path = save(_loop_model(), tmp_path / "loop.onnx")
    dynamic = quantize_dynamic(float_path, tmp_path / "loop.dynamic.onnx", extra_options={"EnableSubgraph": True})
    out = tmp_path / "loop.int8.onnx"
    report = convert(dynamic, out, ConvertOptions(progress=False))
    assert [q["kind"] for q in report.quantized if q["kind"] != "weight"] == ["runtime"]
    feeds, _ = _loop_feeds(tmp_path)
    reference = run_ort(float_path, feeds)
    assert snr_db(reference, run_ort(out, feeds)) > snr_db(reference, run_ort(dynamic, feeds)) - 1.0


def test_int4_weights_with_an_if_whose_branches_hold_no_matmul(tmp_path):
    """--int4 quantizes the main graph's MatMul weight; an If whose branches hold no MatMul (a text recognizer's
    shape-dependent If) is no reason to refuse it (it was: "this model has none", raised from the branch)."""
    from trt_bridge.conversion.options import FormatOptions

    rng = np.random.default_rng(2)
    w = (rng.normal(0, 1, (64, 48)) / 8).astype(np.float32)
    then, other = ([helper.make_node(op, ["h"], [f"{tag}_out"], f"{tag}_{op.lower()}")] for op, tag in
                   (("Relu", "t"), ("Neg", "e")))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], "fc"),
         helper.make_node("If", ["a"], ["y"], "if", then_branch=helper.make_graph(
             then, "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [1, 8, 48])]),
             else_branch=helper.make_graph(
             other, "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [1, 8, 48])]))],
        "int4_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64]),
                    helper.make_tensor_value_info("a", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 48])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    src, out = save(model, tmp_path / "float.onnx"), tmp_path / "int4.onnx"
    report = convert(src, out, ConvertOptions(formats=FormatOptions(weights="int4", block_size=32), progress=False))
    assert not report.remaining_blockers and report.control_flow["bodies"] == 2
    converted = assert_qdq_contract(out)
    (dq,) = [n for n in converted.graph.node if n.op_type == "DequantizeLinear"]
    codes = next(i for i in converted.graph.initializer if i.name == dq.input[0])
    assert codes.data_type == TensorProto.INT4 and {a.name: a.i for a in dq.attribute}["block_size"] == 32
    feeds = [{"x": rng.normal(0, 1, (1, 8, 64)).astype(np.float32), "a": np.array(a)} for a in (True, False)]
    assert snr_db(run_ort(src, feeds), run_ort(out, feeds)) > 15  # 4-bit blocks of 32: plain rounding
    assert_tensorrt_ready(out)
