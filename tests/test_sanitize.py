"""The sanitize passes (trt_bridge/sanitize/): Dropout, Cast chains, Identity chains.

Each model is built by hand, sanitized as a graph-surgeon graph and exported, then checked
for: the op types left, the Change records, numerical equivalence with onnxruntime, the
graph outputs' names and types, and that TensorRT-RTX parses and builds it ahead of time.
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from helpers import assert_tensorrt_ready, save
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.prepare import SANITIZE_PASSES, Change, sanitize
from trt_bridge.prepare.cast_chain import HOLDS_EVERY_VALUE_OF

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _vi(name, shape, dtype=F32):
    return helper.make_tensor_value_info(name, dtype, shape)


def _weight(name, shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.3, name)


def _sanitized(model: onnx.ModelProto, infer: bool = True) -> tuple[onnx.ModelProto, list[Change]]:
    """Sanitize a copy of ``model``; with ``infer``, on its shape-inferred form (the types and shapes
    of intermediate tensors, as exporters write them in ``value_info``)."""
    source = onnx.ModelProto()
    source.CopyFrom(model)
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(source, strict_mode=True) if infer else source)
    changes = sanitize(graph)
    result = gs.export_onnx(graph)
    onnx.checker.check_model(result, full_check=True)
    return result, changes


def _feeds(model: onnx.ModelProto, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value or 2 for d in value.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if dtype == np.bool_:
            feeds[value.name] = np.asarray(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            feeds[value.name] = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        else:
            feeds[value.name] = (rng.standard_normal(shape) * 3).astype(dtype)
    return feeds


def _run(model: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    """onnxruntime with its graph optimizations off: they would remove Dropout nodes themselves."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    names = [o.name for o in model.graph.output]
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, feeds)))


def _interface(model: onnx.ModelProto) -> list[tuple[str, int, list]]:
    return [(o.name, o.type.tensor_type.elem_type, [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim])
            for o in model.graph.output]


def _assert_equivalent(reference: onnx.ModelProto, sanitized: onnx.ModelProto, seed=0) -> None:
    """Same graph outputs (names, types, shapes) and bit-identical values on random feeds."""
    assert _interface(sanitized) == _interface(reference)
    feeds = _feeds(reference, seed)
    want, got = _run(reference, feeds), _run(sanitized, feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def _ops(model: onnx.ModelProto) -> list[str]:
    return sorted(n.op_type for n in model.graph.node)


def _assert_builds(model: onnx.ModelProto, tmp_path) -> None:
    assert_tensorrt_ready(save(model, tmp_path / "sanitized.onnx"))


# ── Dropout ────────────────────────────────────────────────────────────────────────────────

# x[1,3,8,8] ─ Conv(W) ─ c ─ Dropout(ratio=0.5, training_mode) ─ d ─ Relu ─ y
def dropout_conv_model(training: bool):
    return _model(
        [helper.make_node("Conv", ["x", "W"], ["c"], "conv", pads=[1, 1, 1, 1]),
         helper.make_node("Dropout", ["c", "ratio", "training"], ["d"], "drop"),
         helper.make_node("Relu", ["d"], ["y"], "relu")],
        [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 8, 8])],
        [_weight("W", (4, 3, 3, 3)), numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
         numpy_helper.from_array(np.array(training), "training")])


def test_training_dropout_in_a_conv_net(tmp_path):
    out, changes = _sanitized(dropout_conv_model(training=True))
    assert _ops(out) == ["Conv", "Relu"]
    assert changes == [Change("remove-dropout", "drop",
                              "removed Dropout (ratio=0.5, training_mode=1): inference ignores it")]
    # the source really drops in onnxruntime; the sanitized model is the inference one, exactly
    reference = dropout_conv_model(training=False)
    feeds = _feeds(reference)
    assert not np.array_equal(_run(dropout_conv_model(training=True), feeds)["y"], _run(reference, feeds)["y"])
    _assert_equivalent(reference, out)
    _assert_builds(out, tmp_path)


# x[1,3,8,8] ─ Conv(W) ─ c ─ Dropout(training_mode) ─ y      (graph output)
#                        └─ Relu ─ r                          (graph output)
def dropout_output_model(training: bool):
    return _model(
        [helper.make_node("Conv", ["x", "W"], ["c"], "conv"),
         helper.make_node("Relu", ["c"], ["r"], "relu"),
         helper.make_node("Dropout", ["c", "", "training"], ["y"], "drop")],
        [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 6, 6]), _vi("r", [1, 4, 6, 6])],
        [_weight("W", (4, 3, 3, 3)), numpy_helper.from_array(np.array(training), "training")])


def test_dropout_writing_a_graph_output(tmp_path):
    out, changes = _sanitized(dropout_output_model(training=True))
    assert _ops(out) == ["Conv", "Relu"]
    assert changes == [Change("remove-dropout", "drop", "removed Dropout (training_mode=1): inference ignores it; "
                              "graph output 'y' is now written by Conv 'conv'")]
    assert [n.output[0] for n in out.graph.node if n.op_type == "Conv"] == ["y"]
    _assert_equivalent(dropout_output_model(training=False), out)
    _assert_builds(out, tmp_path)


# x[2,16] ─ Dropout(training_mode) ─ y       (graph input straight to a graph output)
#        └─ Relu ─ r
def dropout_passthrough_model(training: bool):
    return _model(
        [helper.make_node("Dropout", ["x", "", "training"], ["y"], "drop"), helper.make_node("Relu", ["x"], ["r"])],
        [_vi("x", [2, 16])], [_vi("y", [2, 16]), _vi("r", [2, 16])],
        [numpy_helper.from_array(np.array(training), "training")])


def test_dropout_from_a_graph_input_to_a_graph_output_becomes_identity(tmp_path):
    out, changes = _sanitized(dropout_passthrough_model(training=True))
    assert _ops(out) == ["Identity", "Relu"]
    assert changes == [Change("remove-dropout", "drop", "replaced Dropout (training_mode=1) with Identity: inference "
                              "ignores it; a node stays as its output 'y' is a graph output and its input 'x' is a "
                              "graph input")]
    _assert_equivalent(dropout_passthrough_model(training=False), out)
    _assert_builds(out, tmp_path)


# x[2,16] ─ MatMul(W) ─ m ─ Dropout(training_mode) ─ d ───────────┐
#                                └─ mask ─ Cast(float) ─ mf ─ Mul ─ y
def dropout_mask_model(training: bool, batch: int | str = 2):
    return _model(
        [helper.make_node("MatMul", ["x", "W"], ["m"], "mm"),
         helper.make_node("Dropout", ["m", "", "training"], ["d", "mask"], "drop"),
         helper.make_node("Cast", ["mask"], ["mf"], "cast", to=F32),
         helper.make_node("Mul", ["d", "mf"], ["y"], "mul")],
        [_vi("x", [batch, 16])], [_vi("y", [batch, 16])],
        [_weight("W", (16, 16)), numpy_helper.from_array(np.array(training), "training")])


def test_dropout_with_a_used_mask(tmp_path):
    out, changes = _sanitized(dropout_mask_model(training=True))
    assert _ops(out) == ["Cast", "MatMul", "Mul"]
    assert changes == [Change("remove-dropout", "drop", "removed Dropout (training_mode=1): inference ignores it; "
                              "its mask is a constant all-true bool[2, 16]")]
    mask = next(i for i in out.graph.initializer if i.name == "drop_mask")
    assert numpy_helper.to_array(mask).all()
    _assert_equivalent(dropout_mask_model(training=False), out)
    _assert_builds(out, tmp_path)


def test_dropout_with_a_used_mask_of_dynamic_shape_is_kept(caplog):
    model = dropout_mask_model(training=True, batch="N")
    with caplog.at_level(logging.WARNING, logger="trt_bridge.prepare"):
        out, changes = _sanitized(model)
    assert changes == []
    assert _ops(out) == _ops(model)
    assert "kept Dropout 'drop': its mask 'mask' is read and its shape" in caplog.text
    assert "model.eval()" in caplog.text


# x[1,3,8,8] ─ Conv(W) ─ Dropout(ratio=0.3) ─ d ─ Relu ─ y      (opset 11: ratio attribute, no training_mode)
def old_dropout_model():
    return _model(
        [helper.make_node("Conv", ["x", "W"], ["c"], "conv"),
         helper.make_node("Dropout", ["c"], ["d"], "drop", ratio=0.3),
         helper.make_node("Relu", ["d"], ["y"], "relu")],
        [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 6, 6])], [_weight("W", (4, 3, 3, 3))], opset=11)


def test_old_opset_dropout(tmp_path):
    model = old_dropout_model()
    out, changes = _sanitized(model)
    assert _ops(out) == ["Conv", "Relu"]
    assert changes == [Change("remove-dropout", "drop", "removed Dropout (ratio=0.3): inference ignores it")]
    _assert_equivalent(model, out)  # onnxruntime runs opset 11 Dropout in inference mode
    _assert_builds(out, tmp_path)


def test_opset_6_dropout_names_its_is_test_attribute():
    # x ─ Dropout(is_test=0, ratio=0.2) ─ d ─ Relu ─ y       (onnxruntime runs opset 7 and newer only)
    model = _model([helper.make_node("Dropout", ["x"], ["d"], "drop", is_test=0, ratio=0.2),
                    helper.make_node("Relu", ["d"], ["y"], "relu")], [_vi("x", [4])], [_vi("y", [4])], opset=6)
    out, changes = _sanitized(model)
    assert _ops(out) == ["Relu"] and list(out.graph.node[0].input) == ["x"]
    assert changes == [Change("remove-dropout", "drop", "removed Dropout (ratio=0.2, is_test=0): inference ignores it")]


# ── Identity ───────────────────────────────────────────────────────────────────────────────

# x[1,3,8,8] ─ Conv(W) ─ c ─ Identity ─ i1 ─ Identity ─ i2 ─ Relu ─ r ─ Identity ─ i3 ─ Identity ─ y
#                                                                                       (graph output)
def identity_chains_model():
    return _model(
        [helper.make_node("Conv", ["x", "W"], ["c"], "conv"),
         helper.make_node("Identity", ["c"], ["i1"], "id1"), helper.make_node("Identity", ["i1"], ["i2"], "id2"),
         helper.make_node("Relu", ["i2"], ["r"], "relu"),
         helper.make_node("Identity", ["r"], ["i3"], "id3"), helper.make_node("Identity", ["i3"], ["y"], "id4")],
        [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 6, 6])], [_weight("W", (4, 3, 3, 3))])


def test_identity_chains(tmp_path):
    model = identity_chains_model()
    out, changes = _sanitized(model)
    assert _ops(out) == ["Conv", "Relu"]
    assert changes == [
        Change("remove-identity", "id1", "removed Identity: readers of 'i1' read 'c'"),
        Change("remove-identity", "id2", "removed Identity: readers of 'i2' read 'c'"),
        Change("remove-identity", "id3", "removed Identity: readers of 'i3' read 'r'"),
        Change("remove-identity", "id4", "removed Identity: graph output 'y' is now written by Relu 'relu'"),
    ]
    _assert_equivalent(model, out)
    _assert_builds(out, tmp_path)


# x[2,16] ─ Identity ─ a ─ Identity ─ y      (graph input to graph output: one Identity stays)
#        └─ Relu ─ r
def identity_passthrough_model():
    return _model(
        [helper.make_node("Identity", ["x"], ["a"], "id1"), helper.make_node("Identity", ["a"], ["y"], "id2"),
         helper.make_node("Relu", ["x"], ["r"], "relu")],
        [_vi("x", [2, 16])], [_vi("y", [2, 16]), _vi("r", [2, 16])])


def test_identity_from_a_graph_input_to_a_graph_output_keeps_one(tmp_path):
    model = identity_passthrough_model()
    out, changes = _sanitized(model)
    assert _ops(out) == ["Identity", "Relu"]
    assert changes == [Change("remove-identity", "id1", "removed Identity: readers of 'a' read 'x'")]
    assert [(list(n.input), list(n.output)) for n in out.graph.node if n.op_type == "Identity"] == [(["x"], ["y"])]
    _assert_equivalent(model, out)
    _assert_builds(out, tmp_path)


# x[2,4] ─ Relu ─ r ─ Identity ─ t ─ If(c) ─ y          then: Neg(t)   else: Abs(t)   (t read by name in both)
#                           └─ Identity ─ z   (graph output: kept, the graph has subgraphs)
def identity_subgraph_model():
    then = helper.make_graph([helper.make_node("Neg", ["t"], ["a"])], "then", [], [_vi("a", [2, 4])])
    other = helper.make_graph([helper.make_node("Abs", ["t"], ["b"])], "else", [], [_vi("b", [2, 4])])
    return _model(
        [helper.make_node("Relu", ["x"], ["r"], "relu"), helper.make_node("Identity", ["r"], ["t"], "id1"),
         helper.make_node("If", ["c"], ["y"], "if", then_branch=then, else_branch=other),
         helper.make_node("Identity", ["r"], ["z"], "id2")],
        [_vi("x", [2, 4]), _vi("c", [], TensorProto.BOOL)], [_vi("y", [2, 4]), _vi("z", [2, 4])])


def test_identity_read_by_a_subgraph():
    model = identity_subgraph_model()
    out, changes = _sanitized(model)
    assert _ops(out) == ["Identity", "If", "Relu"]
    assert changes == [Change("remove-identity", "id1", "removed Identity: readers of 't' read 'r'")]
    branches = [a.g for n in out.graph.node if n.op_type == "If" for a in n.attribute]
    assert [list(b.node[0].input) for b in branches] == [["r"], ["r"]]
    for seed in (0, 1, 2):
        _assert_equivalent(model, out, seed)


# ── Cast chains ────────────────────────────────────────────────────────────────────────────

# x:f16[2,8] ─ Cast(float) ─ Cast(float16) ─ h ─ Relu ─ y:f16
def cast_round_trip_model(source, middle):
    return _model(
        [helper.make_node("Cast", ["x"], ["m"], "up", to=middle), helper.make_node("Cast", ["m"], ["h"], "down",
                                                                                   to=source),
         helper.make_node("Relu", ["h"], ["y"], "relu")],
        [_vi("x", [2, 8], source)], [_vi("y", [2, 8], source)])


def test_fp16_fp32_fp16_round_trip_is_removed(tmp_path):
    model = cast_round_trip_model(F16, F32)
    out, changes = _sanitized(model)
    assert _ops(out) == ["Relu"] and list(out.graph.node[0].input) == ["x"]
    assert changes == [Change("fold-cast-chains", "down", "removed the round trip Cast float16→float32→float16: "
                              "float32 holds every float16 value")]
    _assert_equivalent(model, out)
    _assert_builds(out, tmp_path)


def test_fp32_fp16_fp32_round_trip_is_kept(tmp_path):
    model = cast_round_trip_model(F32, F16)
    out, changes = _sanitized(model)
    assert changes == []
    assert _ops(out) == ["Cast", "Cast", "Relu"]
    # the round trip rounds: folding it would change the values
    feeds = _feeds(model)
    assert not np.array_equal(_run(out, feeds)["y"], np.maximum(feeds["x"], 0))
    _assert_equivalent(model, out)
    _assert_builds(out, tmp_path)


# x:f16[2,8] ─ Cast(float) ─ Identity ─ Identity ─ Cast(float16) ─ Relu ─ y:f16
def test_cast_round_trip_through_identities():
    model = _model(
        [helper.make_node("Cast", ["x"], ["m"], "up", to=F32), helper.make_node("Identity", ["m"], ["i1"], "id1"),
         helper.make_node("Identity", ["i1"], ["i2"], "id2"), helper.make_node("Cast", ["i2"], ["h"], "down", to=F16),
         helper.make_node("Relu", ["h"], ["y"], "relu")],
        [_vi("x", [2, 8], F16)], [_vi("y", [2, 8], F16)])
    out, changes = _sanitized(model)
    assert _ops(out) == ["Relu"] and list(out.graph.node[0].input) == ["x"]
    assert [(c.pass_name, c.node) for c in changes] == [("fold-cast-chains", "down")]
    _assert_equivalent(model, out)


# x:f32[2,8] ─ Cast(float) ─ c ─ Relu ─ r ─ Cast(float) ─ y       (the second writes a graph output)
def same_type_cast_model():
    return _model(
        [helper.make_node("Cast", ["x"], ["c"], "cast1", to=F32), helper.make_node("Relu", ["c"], ["r"], "relu"),
         helper.make_node("Cast", ["r"], ["y"], "cast2", to=F32)],
        [_vi("x", [2, 8])], [_vi("y", [2, 8])])


def test_same_type_casts_are_removed(tmp_path):
    model = same_type_cast_model()
    out, changes = _sanitized(model)
    assert _ops(out) == ["Relu"] and list(out.graph.node[0].output) == ["y"]
    assert changes == [
        Change("fold-cast-chains", "cast1", "removed Cast to float32: its input is already float32"),
        Change("fold-cast-chains", "cast2", "removed Cast to float32: its input is already float32; graph output "
               "'y' is now written by Relu 'relu'"),
    ]
    _assert_equivalent(model, out)
    _assert_builds(out, tmp_path)


def test_nothing_folds_on_unknown_types():
    """Without value_info the type of 'r' (a Relu output) is unknown: its Cast stays; 'x' is typed."""
    out, changes = _sanitized(same_type_cast_model(), infer=False)
    assert _ops(out) == ["Cast", "Relu"]
    assert [c.node for c in changes] == ["cast1"]


# x:f16[2,8] ─ Cast(float) ─ w ─ Cast(bfloat16) ─ Cast(float) ─ y
#                            └─ Relu ─ r                           (keeps the first Cast)
def test_fp16_fp32_bf16_becomes_fp16_bf16(tmp_path):
    model = _model(
        [helper.make_node("Cast", ["x"], ["w"], "up", to=F32), helper.make_node("Cast", ["w"], ["b"], "to_bf16",
                                                                                to=BF16),
         helper.make_node("Cast", ["b"], ["y"], "back", to=F32), helper.make_node("Relu", ["w"], ["r"], "relu")],
        [_vi("x", [2, 8], F16)], [_vi("y", [2, 8]), _vi("r", [2, 8])])
    out, changes = _sanitized(model)
    assert _ops(out) == ["Cast", "Cast", "Cast", "Relu"]
    assert next(list(n.input) for n in out.graph.node if n.name == "to_bf16") == ["x"]
    assert changes == [Change("fold-cast-chains", "to_bf16", "folded Cast float16→float32→bfloat16 into Cast "
                              "float16→bfloat16: float32 holds every float16 value")]
    _assert_equivalent(model, out)
    _assert_builds(out, tmp_path)


# w:bf16 (initializer) ─ Cast(float) ─ Cast(bfloat16) ─ Cast(float) ─ Add ─ y      x ─┘
def test_bf16_constant_round_trip_keeps_its_type():
    w = helper.make_tensor("w", BF16, [8], np.linspace(-3, 3, 8).tolist())
    model = _model(
        [helper.make_node("Cast", ["w"], ["a"], "up", to=F32), helper.make_node("Cast", ["a"], ["b"], "down", to=BF16),
         helper.make_node("Cast", ["b"], ["c"], "back", to=F32), helper.make_node("Add", ["x", "c"], ["y"], "add")],
        [_vi("x", [2, 8])], [_vi("y", [2, 8])], [w])
    out, changes = _sanitized(model)
    assert _ops(out) == ["Add", "Cast"]
    assert [(c.node, c.what.split(":")[0]) for c in changes] == [
        ("down", "removed the round trip Cast bfloat16→float32→bfloat16")]
    assert [i.data_type for i in out.graph.initializer] == [BF16]
    _assert_equivalent(model, out)


# x:S[2,8] ─ Cast(A) ─ c1 ─ Cast(B) ─ y:B        (onnxruntime only: integer and bool interfaces)
# Folded, the outer Cast reads x; a Cast S→S from a graph input to a graph output stays a Cast.
@pytest.mark.parametrize("source, middle, target, folded", [
    # int32 → float → int64 stays: float32 does not hold every int32 (2**24 + 1 comes back as 2**24)
    pytest.param(TensorProto.INT32, F32, TensorProto.INT64, False, id="int32-float-int64-kept"),
    pytest.param(TensorProto.INT16, F16, F32, False, id="int16-float16-float-kept"),
    pytest.param(TensorProto.BOOL, F32, TensorProto.BOOL, True, id="bool-float-bool"),
    pytest.param(TensorProto.UINT8, F16, TensorProto.INT32, True, id="uint8-float16-int32"),
    pytest.param(TensorProto.INT8, F32, F16, True, id="int8-float-float16"),
])
def test_cast_chains(source, middle, target, folded):
    model = _model([helper.make_node("Cast", ["x"], ["c1"], "c1", to=middle),
                    helper.make_node("Cast", ["c1"], ["y"], "c2", to=target)],
                   [_vi("x", [2, 8], source)], [_vi("y", [2, 8], target)])
    out, changes = _sanitized(model)
    name = TensorProto.DataType.Name
    if folded:
        assert [(n.name, list(n.input)) for n in out.graph.node] == [("c2", ["x"])]
        s, a, b = (name(t).lower().replace("float", "float32") if t == F32 else name(t).lower()
                   for t in (source, middle, target))
        assert changes == [Change("fold-cast-chains", "c2", f"folded Cast {s}→{a}→{b} into Cast {s}→{b}: "
                                  f"{a} holds every {s} value")]
    else:
        assert _ops(out) == ["Cast", "Cast"] and changes == []
    for seed in (0, 1):
        _assert_equivalent(model, out, seed)


_NUMPY = {
    TensorProto.BOOL: np.bool_, TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.UINT32: np.uint32,
    TensorProto.INT64: np.int64, TensorProto.UINT64: np.uint64, F16: np.float16, BF16: ml_dtypes.bfloat16,
    F32: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz, TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
}


def _every_value(dtype) -> np.ndarray:
    """Every value of a type of 16 bits or fewer; the extremes and 2^p ± 1 of wider ones."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array([False, True])
    if dtype.itemsize <= 2:
        return np.arange(2 ** (8 * dtype.itemsize), dtype=f"u{dtype.itemsize}").view(dtype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        edges = [2**p + d for p in (24, 53) for d in (-1, 0, 1)]
        return np.array([info.min, info.max, 0, 1] + [e for e in edges if e <= info.max], dtype)
    info = np.finfo(dtype)
    return np.array([info.min, info.max, info.tiny, info.smallest_subnormal, -0.0, np.inf, np.nan, 1 + info.eps,
                     np.pi], dtype)


@pytest.mark.parametrize("source", list(HOLDS_EVERY_VALUE_OF), ids=lambda t: TensorProto.DataType.Name(t))
def test_holds_every_value_table(source):
    """Each entry is exact (every value of S is the same number in A; NaN stays NaN, -0 stays -0),
    and no type is missing from a row where it would be exact on every value of S we enumerate."""
    values = _every_value(_NUMPY[source])
    for middle, dtype in _NUMPY.items():
        if middle == source:
            continue
        with np.errstate(all="ignore"):  # compared as float64, which holds every value compared here
            wide, held = values.astype(np.float64), values.astype(dtype).astype(np.float64)
            same = np.where(np.isnan(wide), np.isnan(held), (held == wide) & (np.signbit(held) == np.signbit(wide)))
        exact = bool(same.all())
        if middle in HOLDS_EVERY_VALUE_OF[source]:
            assert exact, (TensorProto.DataType.Name(source), TensorProto.DataType.Name(middle))
        elif np.dtype(_NUMPY[source]).itemsize <= 2 and np.dtype(_NUMPY[source]) != np.bool_:
            assert not exact, (TensorProto.DataType.Name(source), TensorProto.DataType.Name(middle))


def test_pipeline_order():
    assert [p.name for p in SANITIZE_PASSES] == ["standard-qdq-domain", "defuse-ort-ops", "remove-dropout",
                                                 "fold-cast-chains", "qdq-float-types", "global-average-pool",
                                                 "squeeze-axes",
                                                 "remove-identity"]
