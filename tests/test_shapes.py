"""Broadcast-shape validation: the model's own broadcasts (``broadcast_conflicts``) and calibration
feeds whose shapes break a broadcasting node (``open_feeds(..., model=...)``, convert, the CLI)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.calibrate.feed_sources import open_feeds
from trt_bridge.calibrate.feeds import model_inputs
from trt_bridge.errors import CalibrationDataError, TrtBridgeError
from trt_bridge.ir.shapes import BroadcastChecker, BroadcastConflict, broadcast_conflicts, feed_shape_conflicts

OPSET = [helper.make_opsetid("", 17)]


def const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def make(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=OPSET)


#   t[N] ─ Unsqueeze(axis 1) ─ [N,1] ─ Mul ─ [N,160] ─ Mul ─ Sin ─ emb
#                      freqs[1,160] ───┘                 │
#                      scale[2,160] ─────────────────────┘
#        /time_proj/Mul              /time_proj/Mul_1
#
# A UNet-style timestep projection exported for a batch of 2: t of shape [1] or [2]
# runs, t of shape [3] cannot broadcast against scale[2,160].
def timestep_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Unsqueeze", ["t", "axes"], ["/time_proj/Unsqueeze_output_0"], "/time_proj/Unsqueeze"),
        helper.make_node("Mul", ["/time_proj/Unsqueeze_output_0", "freqs"], ["/time_proj/Mul_output_0"],
                         "/time_proj/Mul"),
        helper.make_node("Mul", ["/time_proj/Mul_output_0", "scale"], ["/time_proj/Mul_1_output_0"],
                         "/time_proj/Mul_1"),
        helper.make_node("Sin", ["/time_proj/Mul_1_output_0"], ["emb"], "/time_proj/Sin"),
    ]
    inits = [const("axes", np.array([1], np.int64)),
             const("freqs", np.linspace(0, 1, 160, dtype=np.float32).reshape(1, 160)),
             const("scale", np.ones((2, 160), np.float32))]
    model = make(nodes, [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N"])],
                 [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", 160])], inits)
    onnx.checker.check_model(model, full_check=True)
    return model


TIMESTEP_CONFLICT = ("Mul '/time_proj/Mul_1': shapes [3, 160] ('/time_proj/Mul_output_0') and [2, 160] ('scale') "
                     "cannot broadcast (dimension 3 vs 2 at output axis 0)")


def timestep_error(where: str) -> str:
    return (f"{where}: input 't' with shape [3] (the model declares [N]) breaks {TIMESTEP_CONFLICT}. "
            "Give 't' the shape the model expects, one for which these shapes agree at output axis 0 "
            "(or re-export the model for the shape you calibrate with).")


def timestep_npz(path, batch: int):
    """One feed: t of shape [batch] (rank + 1 in the file: one feed per index of axis 0)."""
    np.savez(path, t=np.arange(batch, dtype=np.float32).reshape(1, batch))
    return path


# ---------------------------------------------------------------- feeds against the model's broadcasts


def test_timestep_declared_shapes_have_no_conflict():
    assert broadcast_conflicts(timestep_model()) == []


@pytest.mark.parametrize("batch", [1, 2])
def test_timestep_feeds_that_broadcast_pass(tmp_path, batch):
    model = timestep_model()
    assert broadcast_conflicts(model, {"t": (batch,)}) == []
    source = open_feeds(str(timestep_npz(tmp_path / "c.npz", batch)), None, model_inputs(model), model=model)
    source.check()
    assert [f["t"].shape for f in source] == [(batch,)]


def test_timestep_conflict_names_node_shapes_axis_and_input():
    [conflict] = broadcast_conflicts(timestep_model(), {"t": (3,)})
    assert conflict == BroadcastConflict(
        node="/time_proj/Mul_1", op="Mul", output="/time_proj/Mul_1_output_0",
        inputs=("/time_proj/Mul_output_0", "scale"), shapes=((3, 160), (2, 160)), axis=0, dims=(3, 2),
        reaches_from=("t",))
    assert conflict.message() == TIMESTEP_CONFLICT
    assert feed_shape_conflicts(timestep_model(), {"t": (3,)}) == [conflict]


def test_timestep_bad_feed_fails_check_with_input_node_and_shapes(tmp_path):
    model = timestep_model()
    path = timestep_npz(tmp_path / "c.npz", 3)
    source = open_feeds(str(path), None, model_inputs(model), model=model)
    with pytest.raises(CalibrationDataError) as info:
        source.check()
    assert str(info.value) == timestep_error(f"{path} (feed 0)")


def test_without_the_model_feeds_are_not_checked_for_broadcasts(tmp_path):
    model = timestep_model()
    source = open_feeds(str(timestep_npz(tmp_path / "c.npz", 3)), None, model_inputs(model))
    source.check()  # the existing callers' behaviour: names, rank, fixed dims and dtype only
    # and iterating does not raise either: the one feed comes through with its conflicting shape, unchanged
    feeds = list(source)
    assert [f["t"].shape for f in feeds] == [(3,)]
    np.testing.assert_array_equal(feeds[0]["t"], np.arange(3, dtype=np.float32))


def test_a_later_feed_with_other_shapes_is_checked_too(tmp_path):
    model = timestep_model()
    folder = tmp_path / "feeds"
    folder.mkdir()
    np.savez(folder / "a.npz", t=np.zeros(2, np.float32))
    np.savez(folder / "b.npz", t=np.zeros(3, np.float32))
    source = open_feeds(str(folder), None, model_inputs(model), model=model)
    source.check()
    with pytest.raises(CalibrationDataError) as info:
        list(source)
    assert str(info.value) == timestep_error(str(folder / "b.npz"))


def test_one_shape_inference_per_distinct_feed_shapes(tmp_path, monkeypatch):
    model = timestep_model()
    np.savez(tmp_path / "c.npz", t=np.zeros((6, 2), np.float32))
    source = open_feeds(str(tmp_path / "c.npz"), None, model_inputs(model), model=model)
    calls = []
    find = BroadcastChecker._find
    monkeypatch.setattr(BroadcastChecker, "_find", lambda self, overrides: calls.append(overrides) or
                        find(self, overrides))
    assert len(list(source)) == 6 and len(list(source)) == 6
    assert calls == [{}, {"t": (2,)}]  # the declared shapes once, the feeds' shapes once


def test_convert_reports_the_bad_feed(tmp_path):
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions

    onnx.save(timestep_model(), tmp_path / "unet.onnx")
    path = timestep_npz(tmp_path / "c.npz", 3)
    with pytest.raises(CalibrationDataError) as info:
        convert(tmp_path / "unet.onnx", tmp_path / "out.onnx", ConvertOptions(
            calibration=CalibrationOptions(data=str(path)), progress=False))
    assert str(info.value) == timestep_error(f"{path} (feed 0)")
    assert not (tmp_path / "out.onnx").exists()


def test_cli_reports_the_bad_feed(tmp_path, capsys):
    from trt_bridge.cli import main

    onnx.save(timestep_model(), tmp_path / "unet.onnx")
    path = timestep_npz(tmp_path / "c.npz", 3)
    assert main(["convert", str(tmp_path / "unet.onnx"), "--calib-data", str(path), "-o",
                 str(tmp_path / "out.onnx")]) == 2
    assert capsys.readouterr().err.strip() == f"trt-bridge convert: error: {timestep_error(f'{path} (feed 0)')}"


def test_check_with_data_reports_the_bad_feed(tmp_path, capsys):
    """`trt-bridge check MODEL --data FEEDS`: the same finding, exit 1; good feeds add nothing."""
    from trt_bridge.checks import CheckOptions, TrtProbe, check_model
    from trt_bridge.cli import main

    onnx.save(timestep_model(), tmp_path / "unet.onnx")
    bad, good = timestep_npz(tmp_path / "bad.npz", 3), timestep_npz(tmp_path / "good.npz", 2)
    report = check_model(tmp_path / "unet.onnx", CheckOptions(TrtProbe.OFF, str(bad)))
    feed = next(f for f in report.findings if f.rule == "feed")
    assert feed.why == timestep_error(f"{bad} (feed 0)") and not feed.fixable
    assert main(["check", str(tmp_path / "unet.onnx"), "--data", str(bad), "--trt", "off"]) == 1
    assert f"[feed] model: {timestep_error(f'{bad} (feed 0)')}" in capsys.readouterr().out
    good_report = check_model(tmp_path / "unet.onnx", CheckOptions(TrtProbe.OFF, str(good)))
    assert [f.rule for f in good_report.findings] == ["not-int8"]


#   x[B,4] ─ Add ─ y            bias[3,4] fixed by the exporter: with B=2 the graph
#   bias[3,4] ┘                 cannot run whatever the feeds are
def model_with_own_conflict(batch: int | str = 2) -> onnx.ModelProto:
    return make([helper.make_node("Add", ["x", "bias"], ["y"], "add")],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                [const("bias", np.ones((3, 4), np.float32))])


def test_conflicts_the_model_already_has_are_not_blamed_on_the_feeds(tmp_path):
    model = model_with_own_conflict(batch=2)
    assert len(broadcast_conflicts(model)) == 1
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 4), np.float32))
    open_feeds(str(tmp_path / "c.npz"), None, model_inputs(model), model=model).check()


# ---------------------------------------------------------------- the model's own broadcasts


#   x[2,3,4] ─ Add ─ Relu ─ Mul ─ y     Add: bias[5,4] vs x at output axis 1 (3 vs 5);
#   bias[5,4] ─┘            │           onnx infers no shape for Add's output, so the
#   z[7] ───────────────────┘           Mul after it is not checked; Sub is, in graph order
#   x ─ Sub ─ w                         Sub: x vs k[2,1,6] at output axis 2 (4 vs 6)
#   k[2,1,6] ┘
def static_conflict_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "bias"], ["a"], "add"),
             helper.make_node("Relu", ["a"], ["r"], "relu"),
             helper.make_node("Mul", ["r", "z"], ["y"], "mul"),
             helper.make_node("Sub", ["x", "k"], ["w"], "sub")]
    return make(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                        helper.make_tensor_value_info("z", TensorProto.FLOAT, [7])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                 helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
                [const("bias", np.ones((5, 4), np.float32)), const("k", np.ones((2, 1, 6), np.float32))])


def test_static_conflicts_are_reported_with_node_shapes_and_axis():
    add, sub = broadcast_conflicts(static_conflict_model())
    assert (add.node, add.op, add.inputs, add.shapes, add.axis, add.dims, add.reaches_from) == (
        "add", "Add", ("x", "bias"), ((2, 3, 4), (5, 4)), 1, (3, 5), ("x",))
    assert add.message() == ("Add 'add': shapes [2, 3, 4] ('x') and [5, 4] ('bias') cannot broadcast "
                             "(dimension 3 vs 5 at output axis 1)")
    assert (sub.node, sub.axis, sub.dims) == ("sub", 2, (4, 6))


#   x[N,3] ─ Expand ─ y          shape = Constant [2, 4]: 3 cannot become 4
#   shape ───┘
def expand_model(target: list[int]) -> onnx.ModelProto:
    nodes = [helper.make_node("Constant", [], ["shape"], "target", value=const("v", np.array(target, np.int64))),
             helper.make_node("Expand", ["x", "shape"], ["y"], "expand")]
    return make(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def test_expand_with_a_bad_shape_constant():
    [conflict] = broadcast_conflicts(expand_model([2, 4]))
    assert conflict.message() == ("Expand 'expand': shapes [N, 3] ('x') and [2, 4] (value of 'shape') cannot "
                                  "broadcast (dimension 3 vs 4 at output axis 1)")
    assert conflict.reaches_from == ("x",)
    assert broadcast_conflicts(expand_model([5, 1, 3])) == []


#   x[2,3,4] ─ PRelu ─ y          slope[4,1] must broadcast to x: 4 vs 3 at axis 1
#   slope ─────┘
#   a[2,3,4] ─ MatMul ─ m         batch dims: 2 vs 5 at output axis 0
#   b[5,4,6] ──┘
def prelu_matmul_model() -> onnx.ModelProto:
    nodes = [helper.make_node("PRelu", ["x", "slope"], ["y"], "prelu"),
             helper.make_node("MatMul", ["x", "b"], ["m"], "matmul")]
    return make(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                 helper.make_tensor_value_info("m", TensorProto.FLOAT, None)],
                [const("slope", np.ones((4, 1), np.float32)), const("b", np.ones((5, 4, 6), np.float32))])


def test_prelu_slope_and_matmul_batch_dims():
    prelu, matmul = broadcast_conflicts(prelu_matmul_model())
    assert (prelu.inputs, prelu.axis, prelu.dims) == (("x", "slope"), 1, (3, 4))
    assert matmul.message() == ("MatMul 'matmul': shapes [2, 3, 4] ('x') and [5, 4, 6] ('b') cannot broadcast "
                                "(dimension 2 vs 5 at output axis 0)")


# ---------------------------------------------------------------- no false positives


#   x[B,S,8] ─ MatMul ─ Add ─ Mul ─ Reshape ─ y       w[8,8], bias[8]
#   mask[B,S] ─ Unsqueeze(-1) ────┘      │            the Reshape target is computed from
#   x ─ Shape ─ Slice[0:2] ─ Concat(-1) ─┘            Shape(x): data propagation carries it
def dynamic_model() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], "matmul"),
             helper.make_node("Add", ["h", "bias"], ["hb"], "add"),
             helper.make_node("Unsqueeze", ["mask", "last"], ["m"], "unsqueeze"),
             helper.make_node("Mul", ["hb", "m"], ["hm"], "mul"),
             helper.make_node("Shape", ["x"], ["s"], "shape"),
             helper.make_node("Slice", ["s", "zero", "two"], ["bs"], "slice"),
             helper.make_node("Concat", ["bs", "minus_one"], ["target"], "concat", axis=0),
             helper.make_node("Reshape", ["hm", "target"], ["y"], "reshape")]
    inits = [const("w", np.ones((8, 8), np.float32)), const("bias", np.ones(8, np.float32)),
             const("last", np.array([-1], np.int64)), const("zero", np.array([0], np.int64)),
             const("two", np.array([2], np.int64)), const("minus_one", np.array([-1], np.int64))]
    model = make(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8]),
                         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["B", "S"])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 8])], inits)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_no_conflicts_in_a_model_with_dynamic_dims():
    checker = BroadcastChecker(dynamic_model())
    assert checker.conflicts() == []
    assert checker.conflicts({"x": (2, 5, 8), "mask": (2, 5)}) == []
    assert checker.conflicts({"x": (1, 5, 8), "mask": (2, 1)}) == []  # each side broadcasts the other's 1
    [conflict] = checker.conflicts({"x": (2, 5, 8), "mask": (3, 5)})
    assert (conflict.node, conflict.dims, conflict.reaches_from) == ("mul", (2, 3), ("mask", "x"))


def test_unknown_input_name_is_a_user_error():
    with pytest.raises(TrtBridgeError, match="'z' is not an input of the model; its inputs are: t"):
        broadcast_conflicts(timestep_model(), {"z": (1,)})


def test_no_conflicts_in_the_shared_models(shared_models):
    paths = sorted(shared_models.glob("*.onnx"))
    assert paths
    for path in paths:
        model = onnx.load(str(path))
        checker = BroadcastChecker(model)
        assert checker.conflicts() == [], path.name
        ones = {name: tuple(d if isinstance(d, int) else 1 for d in shape)
                for name, shape in checker.inputs.items() if shape is not None}
        assert checker.conflicts(ones) == [], path.name
