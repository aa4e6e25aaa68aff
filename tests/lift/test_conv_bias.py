"""The conv-bias lift rule: onnxruntime's quantize_dynamic adds a Conv's bias after the float epilogue; lifting
folds it back into the Conv, exactly, so placement sees the Conv beside a residual Add.

The tests at the end call the rule directly (``apply_rule``: match, then rewrite, on a small graph; a
decline that leaves graph and context as they were)."""

from __future__ import annotations

import numpy as np
import onnx
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info
from helpers import (
    assert_lift_is_exact,
    assert_qdq_contract,
    assert_tensorrt_ready,
    quantize_dynamic,
    run_exact,
    run_ort,
    save,
    snr_db,
)
from test_multi_output import _feeds, residual_net

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.ir.model import load_model
from trt_bridge.lift.base import NOT_MINE
from trt_bridge.lift.conv_bias import FoldConvBias
from trt_bridge.lift.pipeline import lift_model


#  x ─ ConvInteger ─ Cast ─ Mul(scales) ─ Add(bias [C]) ─ Relu ─ ConvInteger ... ─ Add(bias) ─┐
#                                                                └──────────────────────────── Add(residual) ─ Relu
def test_bias_add_folds_into_the_lifted_conv(tmp_path):
    fpath = save(residual_net(), tmp_path / "float.onnx")
    dyn = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    source_ops = [n.op_type for n in onnx.load(str(dyn)).graph.node]
    assert source_ops.count("Add") == 3  # two bias Adds and the residual
    lifted, ctx = lift_model(load_model(dyn), dyn)
    assert len(ctx.fired["conv-bias"]) == 2
    convs = [n for n in lifted.graph.node if n.op_type == "Conv"]
    assert [len(n.input) for n in convs] == [3, 3]
    assert [n.op_type for n in lifted.graph.node].count("Add") == 1  # the residual only
    # exact: the float model computed with the source's dequantized weights
    assert_lift_is_exact(residual_net(), dyn, _feeds(4, 3))

    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in _feeds(8, 1)]))
    out = tmp_path / "converted.onnx"
    report = convert(dyn, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              progress=False))
    assert_qdq_contract(out)
    # the residual Add now sits right after conv2, so its skip input is quantized for the epilogue fusion
    assert any("residual" in q["consumers"] for q in report.quantized if q["kind"] == "activation")
    held_out = _feeds(8, 2)
    assert snr_db(run_exact(dyn, held_out), run_ort(out, held_out)) > 33  # measured 36.2 dB against the source
    assert_tensorrt_ready(out)


def test_bias_that_is_not_per_channel_stays_an_add(tmp_path):
    """A constant varying along the spatial axes is not a bias: the Add stays."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["c"], "conv", kernel_shape=[1, 1]),
         helper.make_node("Add", ["c", "k"], ["y"], "add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4, 4])],
        [numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.standard_normal((1, 1, 4, 4)).astype(np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    lifted, ctx = lift_model(load_model(save(model, tmp_path / "m.onnx")))
    assert "conv-bias" not in ctx.fired and [n.op_type for n in lifted.graph.node] == ["Conv", "Add"]


# --- the rule called directly ---------------------------------------------------------------------------------------

#   x [1, 3, 8, 8] ─ Conv(W [4, 3, 3, 3], b, pads 1) ─ y ─ Add(c) ─ z
def _conv_add(c: np.ndarray):
    rng = np.random.default_rng(59)
    nodes = [onnx.helper.make_node("Conv", ["x", "W", "b"], ["y"], "conv", pads=[1, 1, 1, 1]),
             onnx.helper.make_node("Add", ["y", "c"], ["z"], "add")]
    inits = {"W": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32), "c": c}
    return build_model(nodes, [tensor_info("x", [1, 3, 8, 8])], [tensor_info("z", [1, 4, 8, 8])], inits,
                       value_info=[tensor_info("y", [1, 4, 8, 8])])


def test_rule_folds_a_per_channel_add_into_the_conv_bias():
    source = _conv_add(np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1) - 1.5)
    out, _ = lifted(source, (FoldConvBias(), "add"))
    assert ops_left(out) == ["Conv"]
    feeds = [{"x": np.random.default_rng(i).normal(size=(1, 3, 8, 8)).astype(np.float32)} for i in range(3)]
    assert_same_outputs(source, out, feeds)


def test_rule_leaves_an_add_that_varies_along_more_than_the_channels_untouched():
    c = np.random.default_rng(61).normal(size=(1, 4, 8, 8)).astype(np.float32)
    assert declined(_conv_add(c), FoldConvBias(), "add") == NOT_MINE  # not its pattern: nothing to report
