"""Type fixes: inputs that contradict their op's schema, bfloat16 models, float16 models end to end."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, save, snr_db
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, PrecisionOptions
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.prepare.model import prepare
from trt_bridge.prepare.types import Bf16Policy, agree_types, promote
from trt_bridge.runtime.session import session

RNG = np.random.default_rng(0)
W1 = (RNG.standard_normal((64, 64)) * 0.1).astype(np.float32)
BIAS = (RNG.standard_normal(64) * 0.1).astype(np.float16)
W2 = (RNG.standard_normal((64, 32)) * 0.1).astype(np.float16)


def _mixed_add(working: bool) -> onnx.ModelProto:
    """The exporter lost an implicit cast: a float32 projection and its float16 bias meet in one Add.

    #  x:f32[1,64] ─ MatMul(W1:f32) ─ acc:f32 ─┐
    #                           bias:f16[64] ─ Add '/self_attn/q_proj/Add' ─ y:f16 ─ Relu ─ MatMul(W2:f16) ─ out:f16

    ``working``: the variant that exports fine, ``(acc + bias.float()).half()``: Cast(bias → f32), Add in
    float32, Cast(→ f16).
    """
    if working:
        nodes = [helper.make_node("MatMul", ["x", "W1"], ["acc"], "/self_attn/q_proj/MatMul"),
                 helper.make_node("Cast", ["bias"], ["bias32"], "cast_bias", to=TensorProto.FLOAT),
                 helper.make_node("Add", ["acc", "bias32"], ["y32"], "/self_attn/q_proj/Add"),
                 helper.make_node("Cast", ["y32"], ["y"], "cast_y", to=TensorProto.FLOAT16)]
    else:
        nodes = [helper.make_node("MatMul", ["x", "W1"], ["acc"], "/self_attn/q_proj/MatMul"),
                 helper.make_node("Add", ["acc", "bias"], ["y"], "/self_attn/q_proj/Add")]
    nodes += [helper.make_node("Relu", ["y"], ["r"], "relu"),
              helper.make_node("MatMul", ["r", "W2"], ["out"], "/out_proj/MatMul")]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [1, 32])],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(BIAS, "bias"), numpy_helper.from_array(W2, "W2")],
        value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(count)]


def test_mixed_add_computes_in_float32_and_casts_to_the_declared_type():
    model = _mixed_add(working=False)
    with pytest.raises(Exception, match="Could not find an implementation for Add|bound to different types"):
        session(model)  # what the user saw
    changes = agree_types(model)
    assert [(c.pass_name, c.node, c.what) for c in changes] == [
        ("types", "/self_attn/q_proj/Add", "Add inputs disagree ('acc' float32, 'bias' float16): computed in "
                                           "float32; result cast to the declared float16")]
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Cast", "Add", "Cast", "Relu", "MatMul"]
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    working = session(_mixed_add(working=True))
    fixed = session(model)
    for feed in _feeds(4, 1):
        np.testing.assert_array_equal(fixed.run(None, feed)[0], working.run(None, feed)[0])


def test_integer_accumulator_and_float16_bias():
    """int32 + float16: neither holds the other, so the Add runs in float32 (the issue's Add(14) failure)."""
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["acc"], "mmi"),
         helper.make_node("Add", ["acc", "bias"], ["y"], "add")], "g",
        [helper.make_tensor_value_info("a", TensorProto.INT8, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 4])],
        [numpy_helper.from_array(np.arange(16, dtype=np.int8).reshape(4, 4), "w"),
         numpy_helper.from_array(np.full(4, 0.5, np.float16), "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    changes = agree_types(model)
    assert changes[0].what == ("Add inputs disagree ('acc' int32, 'bias' float16): computed in float32; result cast "
                               "to the declared float16")
    a = np.arange(8, dtype=np.int8).reshape(2, 4)
    got = session(model).run(None, {"a": a})[0]
    want = (a.astype(np.int32) @ np.arange(16, dtype=np.int32).reshape(4, 4) + 0.5).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def test_promotion_without_a_declared_type_reaches_the_graph_output(tmp_path):
    """No value_info for the Add's output: it stays float32 (loading infers int32 for it, like input 0, which is
    not a declaration), Relu follows in float32, and the graph output gets its declared float16 back.

    #  a:int8[2,4] ─ MatMulInteger(w) ─ acc:int32 ─┐
    #                             bias:f16[4] ─ Add ─ y ─ Relu ─ out:f16 (graph output)
    """
    from trt_bridge.ir.model import load_model

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["acc"], "mmi"),
         helper.make_node("Add", ["acc", "bias"], ["y"], "add"),
         helper.make_node("Relu", ["y"], ["out"], "relu")], "g",
        [helper.make_tensor_value_info("a", TensorProto.INT8, [2, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [2, 4])],
        [numpy_helper.from_array(np.arange(-8, 8, dtype=np.int8).reshape(4, 4), "w"),
         numpy_helper.from_array(np.full(4, -0.5, np.float16), "bias")])
    declared: dict[str, int] = {}
    model = load_model(save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                            tmp_path / "m.onnx"), declared)
    assert declared == {}  # the exporter wrote no value_info; inference's guesses are not declarations
    changes = agree_types(model, declared=declared)
    assert [c.what for c in changes] == [
        "Add inputs disagree ('acc' int32, 'bias' float16): computed in float32",
        "graph output 'out' computed in float32 after the casts above: cast to its declared float16"]
    assert [n.op_type for n in model.graph.node] == ["MatMulInteger", "Cast", "Cast", "Add", "Relu", "Cast"]
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    a = np.arange(-4, 4, dtype=np.int8).reshape(2, 4)
    want = np.maximum(a.astype(np.int32) @ np.arange(-8, 8, dtype=np.int32).reshape(4, 4) - 0.5, 0)
    np.testing.assert_array_equal(session(model).run(None, {"a": a})[0], want.astype(np.float16))


def test_reshape_shape_of_the_wrong_integer_type_is_cast():
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], "reshape")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])],
                              [numpy_helper.from_array(np.array([6], np.int32), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert [c.what for c in agree_types(model)] == ["Reshape does not accept 'shape' int32: cast to int64"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(session(model).run(None, {"x": x})[0], x.reshape(6))


@pytest.mark.parametrize(("types", "want"), [
    ({TensorProto.FLOAT, TensorProto.FLOAT16}, TensorProto.FLOAT),
    ({TensorProto.FLOAT16, TensorProto.BFLOAT16}, TensorProto.FLOAT),
    ({TensorProto.INT8, TensorProto.FLOAT16}, TensorProto.FLOAT16),  # int8 fits float16 exactly
    ({TensorProto.INT32, TensorProto.FLOAT16}, TensorProto.FLOAT),
    ({TensorProto.INT64, TensorProto.INT32}, TensorProto.INT64),
    ({TensorProto.UINT8, TensorProto.INT8}, TensorProto.INT16),
    ({TensorProto.BOOL, TensorProto.INT32}, TensorProto.INT32),
])
def test_promotion(types, want):
    assert promote(types) == want


def test_convert_fixes_the_mixed_model_end_to_end(tmp_path):
    """convert: the float32 MatMul gets float32 Q/DQ, the float16 one float16 Q/DQ (opset 19); onnxruntime runs
    it; TensorRT-RTX parses and builds it; it stays close to the working variant."""
    src = save(_mixed_add(working=False), tmp_path / "mixed.onnx")
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in _feeds(16, 2)]))
    out = tmp_path / "mixed.int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              progress=False))
    model = assert_qdq_contract(out)
    assert report.output_opset == 19
    dtypes = {q["tensor"]: q["dtype"] for q in report.quantized}
    assert dtypes == {"x": "float32", "W1": "float32", "r_centered": "float16", "W2": "float16"}
    assert [c["node"] for c in report.sanitized if c["pass_name"] == "types"] == ["/self_attn/q_proj/Add"]
    assert report.check["ready"] and not report.remaining_blockers
    assert {n.op_type for n in model.graph.node} >= {"Cast", "QuantizeLinear", "DequantizeLinear"}
    held_out = _feeds(8, 3)
    reference = [session(_mixed_add(working=True)).run(None, f)[0] for f in held_out]
    got = [session(out).run(None, f)[0] for f in held_out]
    assert got[0].dtype == np.float16
    assert snr_db(reference, got) > 25
    assert_tensorrt_ready(out)


def _bf16_conv_net() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The same two-layer MLP in bfloat16 and (reference) in float32 with bfloat16-rounded weights.

    #  x:bf16[4,64] ─ MatMul(W1) ─ Relu ─ MatMul(W2) ─ y:bf16[4,32]
    """
    rng = np.random.default_rng(4)

    def bf16_round(a):  # round to the nearest bfloat16 (ties to even), kept in float32
        bits = a.astype(np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.view(np.float32)

    w1 = bf16_round(rng.standard_normal((64, 64)) * 0.1)
    w2 = bf16_round(rng.standard_normal((64, 32)) * 0.1)
    models = []
    for elem in (TensorProto.BFLOAT16, TensorProto.FLOAT):
        def init(name, values, elem=elem):
            if elem == TensorProto.FLOAT:
                return numpy_helper.from_array(values, name)
            raw = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
            return helper.make_tensor(name, TensorProto.BFLOAT16, values.shape, raw, raw=True)

        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W1"], ["m1"], "fc1"),
             helper.make_node("Relu", ["m1"], ["r1"], "relu1"),
             helper.make_node("MatMul", ["r1", "W2"], ["y"], "fc2")],
            "bf16", [helper.make_tensor_value_info("x", elem, [4, 64])],
            [helper.make_tensor_value_info("y", elem, [4, 32])], [init("W1", w1), init("W2", w2)])
        models.append(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return models[0], models[1]


@pytest.mark.parametrize("policy", [Bf16Policy.FP32, Bf16Policy.FP16])
def test_bf16_model_is_rewritten_to_a_type_onnxruntime_runs(tmp_path, policy):
    bf16, reference = _bf16_conv_net()
    import onnxruntime as ort

    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
        # onnxruntime's CPU provider has no bfloat16 MatMul (trt_bridge.runtime.session.session would emulate it)
        ort.InferenceSession(bf16.SerializeToString(), providers=["CPUExecutionProvider"])
    emulated = [session(bf16).run(None, {"x": x})[0] for x in np.random.default_rng(9).standard_normal((2, 4, 64))
                .astype(np.float32)]
    assert all(np.isfinite(e).all() for e in emulated)
    prepared = onnx.ModelProto()
    prepared.CopyFrom(bf16)
    changes = prepare(prepared, "bf16.onnx", policy)
    want = "float32" if policy is Bf16Policy.FP32 else "float16"
    assert [c.what for c in changes] == [f"2 bfloat16 initializer(s) → {want}",
                                         f"graph input/output(s) x, y: bfloat16 → {want} (feed and read {want})"]
    feeds = [{"x": np.random.default_rng(i).standard_normal((4, 64)).astype(np.float32)} for i in range(8)]
    dtype = np.float32 if policy is Bf16Policy.FP32 else np.float16
    got = [session(prepared).run(None, {"x": f["x"].astype(dtype)})[0] for f in feeds]
    want_out = [session(reference).run(None, f)[0] for f in feeds]
    if policy is Bf16Policy.FP32:  # exact: bfloat16 values are float32 values
        for g, w in zip(got, want_out):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    else:
        assert snr_db(want_out, got) > 50
    src = save(bf16, tmp_path / "bf16.onnx")
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"].astype(dtype) for f in feeds]))
    out = tmp_path / "bf16.int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              precision=PrecisionOptions(bf16=policy), progress=False))
    assert_qdq_contract(out)
    assert {q["dtype"] for q in report.quantized} == {want}
    converted = [session(out).run(None, {"x": f["x"].astype(dtype)})[0] for f in feeds]
    assert snr_db(want_out, converted) > 25
    assert_tensorrt_ready(out)


def test_bf16_to_fp16_refuses_values_out_of_range():
    bf16, _ = _bf16_conv_net()
    big = np.full((64,), 1e6, np.float32)
    bf16.graph.initializer.append(helper.make_tensor("B", TensorProto.BFLOAT16, [64], (big.view(np.uint32) >> 16)
                                                     .astype(np.uint16).tobytes(), raw=True))
    bf16.graph.node.insert(1, helper.make_node("Add", ["m1", "B"], ["m1b"], "bias"))
    bf16.graph.node[2].input[0] = "m1b"
    with pytest.raises(UnsupportedPatternError, match=r"initializer 'B' holds bfloat16 values up to 9.99e\+05, beyond "
                                                      r"float16's range \(65504\): use --bf16 fp32"):
        prepare(bf16, "m.onnx", Bf16Policy.FP16)


def test_promotion_does_not_depend_on_input_order(tmp_path):
    """Concat(float16, float32) then a float32 MatMul: computed in float32 whichever input comes first (load-time
    inference types the Concat like its first input; that guess is not a declaration), so a float32 value
    beyond float16's range survives.

    #  x:f16[1,4] ─┐
    #  f:f32[1,4] ─ Concat ─ MatMul(W:f32[8,2]) ─ y:f32
    """
    from trt_bridge.ir.model import load_model

    outs = []
    for order in (["x", "f"], ["f", "x"]):
        graph = helper.make_graph(
            [helper.make_node("Concat", order, ["c"], "concat", axis=1),
             helper.make_node("MatMul", ["c", "W"], ["y"], "mm")], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4]),
             helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
            [numpy_helper.from_array(np.full((8, 2), 0.5, np.float32), "W")])
        path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "c.onnx")
        declared: dict[str, int] = {}
        model = load_model(path, declared)
        changes = prepare(model, path, declared=declared)
        assert [c.what for c in changes] == [f"Concat inputs disagree ('{order[0]}' "
                                             f"{'float16' if order[0] == 'x' else 'float32'}, '{order[1]}' "
                                             f"{'float32' if order[0] == 'x' else 'float16'}): computed in float32"]
        feed = {"x": np.ones((1, 4), np.float16), "f": np.full((1, 4), 1e5, np.float32)}
        outs.append(session(model).run(None, feed)[0])
    assert np.all(np.isfinite(outs[0])) and np.array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], np.full((1, 2), 0.5 * (4 + 4e5), np.float32))


def test_float16_weight_scales_never_round_to_zero(tmp_path):
    """A float16 MatMul whose weights are tiny: their per-channel scales are below float16's smallest subnormal.
    They are kept positive and the codes are computed with the stored float16 scale, so TensorRT-RTX takes
    the model and the channels do not compute 0.

    #  x:f16[4,32] ─ MatMul(W:f16[32,16] · 1e-6) ─ y:f16
    """
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((32, 16)) * 1e-6).astype(np.float16)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], "mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 16])],
                              [numpy_helper.from_array(w, "W")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "tiny.onnx")
    out = tmp_path / "tiny.int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(random=4), progress=False))
    model = assert_qdq_contract(out)
    scales = [numpy_helper.to_array(i) for i in model.graph.initializer if i.name.startswith("W_scale")]
    assert scales and all(np.all(s > 0) for s in scales)
    assert report.check["ready"]
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float16)
    got = session(out).run(None, {"x": x})[0].astype(np.float64)
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert np.all(np.abs(got).sum(axis=0) > 0)
    assert snr_db([want], [got]) > 10  # coarse (subnormal scales), but no channel lost
    assert_tensorrt_ready(out)


def test_bf16_keep_is_a_clear_error(tmp_path):
    bf16, _ = _bf16_conv_net()
    src = save(bf16, tmp_path / "bf16.onnx")
    with pytest.raises(UnsupportedPatternError, match=r"activation 'r1' is bfloat16, which trt-bridge does not "
                                                      r"quantize: convert with --bf16 fp32"):
        convert(src, tmp_path / "out.onnx", ConvertOptions(calibration=CalibrationOptions(random=2),
                                                           precision=PrecisionOptions(bf16=Bf16Policy.KEEP),
                                                           progress=False))


def test_bf16_inside_if_branches_is_rewritten(tmp_path):
    """Both branches of an If cast to bfloat16; the Add after it meets a bfloat16 constant.

    #  c:bool ─ If(then: Cast(x → bf16), else: Cast(-x → bf16)) ─ Add(b:bf16) ─ MatMul(W:bf16) ─ y:bf16
    """
    def branch(name, negate):
        nodes = ([helper.make_node("Neg", ["x"], ["nx"], f"{name}_neg")] if negate else []) + [
            helper.make_node("Cast", ["nx" if negate else "x"], [f"{name}_out"], f"{name}_cast",
                             to=TensorProto.BFLOAT16)]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.BFLOAT16,
                                                                                 [2, 16])])

    def bf16(values, name):
        raw = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        return helper.make_tensor(name, TensorProto.BFLOAT16, values.shape, raw, raw=True)

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["picked"], "if", then_branch=branch("then", False),
                          else_branch=branch("else", True)),
         helper.make_node("Add", ["picked", "b"], ["s"], "add"),
         helper.make_node("MatMul", ["s", "W"], ["y"], "mm")], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 16])],
        [bf16(np.ones(16, np.float32), "b"), bf16(rng.standard_normal((16, 16)).astype(np.float32), "W")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "if.onnx")
    out = tmp_path / "if.int8.onnx"
    convert(src, out, ConvertOptions(calibration=CalibrationOptions(random=4), progress=False))
    model = assert_qdq_contract(out)
    assert not any(v.type.tensor_type.elem_type == TensorProto.BFLOAT16 for v in (*model.graph.output,))
    x = rng.standard_normal((2, 16)).astype(np.float32)

    def bf16_values(t):  # the bfloat16 constants as float32, the way the model stores them (truncated)
        return (np.frombuffer(t.raw_data, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.dims)

    inits = {t.name: bf16_values(t) for t in graph.initializer}
    prepared = onnx.load(str(src))
    prepare(prepared, src, Bf16Policy.FP32)  # the rewrite itself: exact in float32
    for c in (True, False):
        want = ((x if c else -x) + inits["b"]) @ inits["W"]  # the branches' Cast to bfloat16 became float32
        np.testing.assert_allclose(session(prepared).run(None, {"c": np.array(c), "x": x})[0], want, rtol=1e-5,
                                   atol=1e-4)
        got = session(out).run(None, {"c": np.array(c), "x": x})[0]
        assert got.dtype == np.float32 and snr_db([want], [got]) > 12  # INT8 after 4 random calibration feeds
    assert_tensorrt_ready(out)


def test_strict_inference_holds_if_branches_that_share_names():
    """Optimum's merged decoders: both ``If`` branches are the same exported graph, so their tensors share names.
    onnx's data propagation fails on that ("Data for input 0 already exists") though the model is valid; the strict
    check of such a model runs without it.

        x [B, 4], c ─ If(then: Shape(x) ─ Gather(1) ─ Cast ─ Mul(x); else: the same names) ─ y
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trt_bridge.ir.finalize import finalize

    def branch(tag):
        nodes = [helper.make_node("Shape", ["x"], ["s"], "/model/Shape"),
                 helper.make_node("Gather", ["s", "idx"], ["g"], "/model/Gather", axis=0),
                 helper.make_node("Cast", ["g"], ["gf"], "/model/Cast", to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["x", "gf"], [f"y_{tag}"], "/model/Mul")]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, None)])

    node = helper.make_node("If", ["c"], ["y"], "if", then_branch=branch("then"), else_branch=branch("else"))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4]),
                                            helper.make_tensor_value_info("c", TensorProto.BOOL, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])],
                              [numpy_helper.from_array(np.array(1, np.int64), "idx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Exception, match="already exists"):  # onnx's own limit, which the check must not trip on
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    checked = finalize(model, 17, check=True)
    assert [o.name for o in checked.graph.output] == ["y"]
