"""Opset-9 recurrent models (tests/opset9_models.py): a Squeeze without axes gets its axes in prepare
(prepare/squeeze_axes.py), so TensorRT builds at the dynamic length's both ends, float and converted; and where
TensorRT's builder still refuses a model, neither ``check`` nor convert calls it ready (checks/tensorrt_run.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from helpers import assert_builds_at, run_ort, save, snr_db
from opset9_models import MAX_T, MIN_T, branch_squeeze_model, gru_feeds, gru_model, save_feeds

from trt_bridge.cli import main
from trt_bridge.ir.model import load_model
from trt_bridge.lift.pipeline import lift_model
from trt_bridge.prepare.squeeze_axes import SqueezeAxes, match

PROFILES = {"min": {"x": ((1, 1, MIN_T),) * 3, "state": ((2, 1, 16),) * 3},
            "max": {"x": ((1, 1, MAX_T),) * 3, "state": ((2, 1, 16),) * 3}}


def _squeezes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Each Squeeze's axes (from opset 13 an input: an initializer, or a Constant as onnx's version converter
    writes them)."""
    values = {t.name: onnx.numpy_helper.to_array(t).reshape(-1).tolist() for t in model.graph.initializer}
    values.update({n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t).reshape(-1).tolist()
                   for n in model.graph.node if n.op_type == "Constant"})
    found = {}
    for node in model.graph.node:
        if node.op_type == "Squeeze":
            attr = [list(a.ints) for a in node.attribute if a.name == "axes"]
            found[node.name] = attr[0] if attr else values.get(node.input[1]) if len(node.input) > 1 else None
    return found


def test_squeeze_axes_are_written_from_the_shapes_one_after_the_other():
    """onnx infers no rank past a Squeeze without axes: the second one's input shape is known only once the first
    has its axes. Both get theirs, as opset 9 writes them (an attribute)."""
    graph = gs.import_onnx(gru_model())
    changes = SqueezeAxes().apply(graph)
    assert [c.node for c in changes] == ["squeeze_batch", "squeeze_y"]
    axes = {n.name: n.attrs.get("axes") for n in graph.nodes if n.op == "Squeeze"}
    assert axes == {"squeeze_batch": [0], "squeeze_y": [1]}
    assert match(next(n for n in graph.nodes if n.op == "Relu"), 9) == "not a Squeeze without axes"


def test_the_lifted_opset9_model_is_the_source_and_builds_at_both_lengths(tmp_path):
    """The float model lifted (opset 13: axes are inputs): the source's ops (and the axes' Constants), axes on every
    Squeeze, equal to
    onnxruntime on the source at both ends of the length, and TensorRT-RTX builds it there (the source does not)."""
    src = save(gru_model(), tmp_path / "aec.onnx")
    lifted, _ = lift_model(load_model(src), src)
    ops = sorted(n.op_type for n in lifted.graph.node if n.op_type != "Constant")
    assert ops == sorted(n.op_type for n in gru_model().graph.node)
    assert _squeezes(lifted) == {"squeeze_batch": [0], "squeeze_y": [1]}
    feeds = gru_feeds(4)
    for want, got in zip(run_ort(src, feeds), run_ort(lifted, feeds)):
        assert want.shape == got.shape
        assert abs(want - got).max() < 1e-6
    assert_builds_at(save(lifted, tmp_path / "lifted.onnx"), PROFILES)


def test_float_opset9_gru_converts_ready_and_builds(tmp_path, capsys):
    """float → convert: exit 0, the headline says the builder builds, the output follows the source at both lengths
    (INT8 Conv, the GRU float) and TensorRT-RTX builds it at both."""
    src = save(gru_model(), tmp_path / "aec.onnx")
    calib = save_feeds(tmp_path / "calib", gru_feeds(12, seed=2, lengths=(MIN_T, 40, MAX_T)))
    out = tmp_path / "aec.int8.onnx"
    assert main(["convert", str(src), "-o", str(out), "--calib-data", str(calib)]) == 0
    text = capsys.readouterr().out
    assert "TensorRT-ready INT8 (0 blocker(s)" in text and "builder: builds for SM 8.9" in text
    assert "squeeze-axes 2" in text
    model = onnx.load(str(out))
    assert {"QuantizeLinear", "DequantizeLinear", "GRU", "Squeeze"} <= {n.op_type for n in model.graph.node}
    assert all(axes for axes in _squeezes(model).values())
    feeds = gru_feeds(6, seed=7)
    assert snr_db(run_ort(src, feeds), run_ort(out, feeds)) > 25
    assert_builds_at(out, PROFILES)


def test_a_failed_build_is_a_blocker_in_check_and_in_convert(tmp_path, capsys):
    """A Squeeze without axes in an If branch (no rule rewrites bodies): TensorRT's parser takes the converted model
    and its builder refuses it (at the calibration shapes, convert's check; at its default of 1, check's). convert's
    report and ``check`` say so in the headline, and both exit 1."""
    src = save(branch_squeeze_model(), tmp_path / "branch.onnx")
    out = tmp_path / "branch.int8.onnx"
    calib = save_feeds(tmp_path / "calib", _branch_feeds())
    assert main(["convert", str(src), "-o", str(out), "--calib-data", str(calib)]) == 1
    captured = capsys.readouterr()
    assert "not TensorRT-ready (1 blocker(s)" in captured.out and "builder: fails" in captured.out
    assert "[tensorrt-build]" in captured.out and "TensorRT would not build it" in captured.err
    assert main(["check", str(out)]) == 1  # at TensorRT's default shapes: the Squeeze is what it names
    text = capsys.readouterr().out
    assert "not TensorRT-ready" in text and "builder: fails" in text and "[tensorrt-build]" in text
    assert "ISqueezeLayer without an axes input" in text
    assert "TensorRT-ready INT8" not in text


def _branch_feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(0, 1, (1, 1, 20 + i)).astype(np.float32), "flag": np.array(i % 2 == 0)}
            for i in range(4)]


def test_constant_inputs_name_an_input_of_one_element(tmp_path, capsys):
    """--constant-inputs refuses a name that is no input, and an input of more than one element, naming both."""
    src = save(gru_model(), tmp_path / "aec.onnx")
    calib = save_feeds(tmp_path / "calib", gru_feeds(2))
    for flag, message in (("nope=1", "'nope', which is not an input of the model; its inputs are 'x', 'state'"),
                          ("x=1", "input 'x' has shape [1, 1, None]; only an input of one element")):
        assert main(["convert", str(src), "-o", str(tmp_path / "o.onnx"), "--calib-data", str(calib),
                     "--constant-inputs", flag]) == 2
        assert message in capsys.readouterr().err
