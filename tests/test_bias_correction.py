"""Bias correction (conversion/bias_correction.py): with ``--calib-method auto``, a convolution whose INT8 input shifts
its output channels' means gets the shift subtracted from its bias, where the held-out feeds confirm a gain; checked
against onnxruntime and built by TensorRT-RTX."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper
from test_accuracy_target import HELD_OUT
from test_cli import cli

from trt_bridge import samples
from trt_bridge.conversion import bias_correction, convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, PrecisionOptions


def _shifted(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """conv2 reads one channel 200 above the rest (which it all but ignores), so its int8 step is about 1.6 and the
    other channels (ReLU outputs of 0.1-0.5 plus a little noise) round to the same code on every feed: conv2's
    output moves by W·E[error], a shift the same on every feed.

    #  x ─ conv1 (bias[0] = 200) ─ Relu ─ r ─ conv2 (1x1, positive weights, W[:, 0] · 1e-3) ─ y
    """
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.05
    b1 = rng.uniform(0.1, 0.5, channels).astype(np.float32)
    b1[0] = 200.0
    w2 = rng.uniform(0.5, 1.0, (channels, channels, 1, 1)).astype(np.float32)
    w2[:, 0] *= 1e-3
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2")]
    graph = helper.make_graph(
        nodes, "shifted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 32, 32])],
        [numpy_helper.from_array(v, n) for n, v in
         (("w1", w1), ("b1", b1), ("w2", w2), ("b2", np.zeros(channels, np.float32)))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _convert(tmp_path, name: str, **calibration):
    """(source, output, report): the shifted model converted on 16 feeds, give-back off unless given."""
    src = tmp_path / "shifted.onnx"
    if not src.exists():
        save(_shifted(), src)
        np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    out = tmp_path / name
    options = {"give_back": False, **calibration}
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz"),
                                                                             **options), progress=False))
    return src, out, report


def _conv_bias(path, conv: str) -> np.ndarray:
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name == conv)
    return inits[node.input[2]].astype(np.float64)


def test_the_shift_is_subtracted_from_the_bias(tmp_path):
    src, out, report = _convert(tmp_path, "out.onnx")
    _, plain, plain_report = _convert(tmp_path, "plain.onnx", bias_correction=False)
    corrected = report.bias_corrected
    assert corrected["layers"] == 1 and corrected["channels"] == 16 and corrected["reason"] == ""
    assert corrected["scores"]["after"] >= corrected["scores"]["before"] + bias_correction.MARGIN_DB
    assert plain_report.bias_corrected is None
    assert "corrected the biases of 16 output channel(s) of 1 convolution(s)" in report.summary()
    # the same graph: the same op types and Q/DQ, only conv2's bias differs
    a, b = onnx.load(str(out)), onnx.load(str(plain))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    assert np.array_equal(_conv_bias(out, "conv1"), _conv_bias(plain, "conv1"))
    shift = _conv_bias(plain, "conv2") - _conv_bias(out, "conv2")
    assert np.abs(shift).min() > 0.5  # the small channels all round the same way: W·E[error] in every channel
    # onnxruntime: the corrected output is the uncorrected one minus the shift, channel by channel
    got, before = run_ort(out, HELD_OUT), run_ort(plain, HELD_OUT)
    for g, p in zip(got, before):
        np.testing.assert_allclose(p - g, np.broadcast_to(shift[None, :, None, None], g.shape), rtol=1e-4, atol=1e-4)
    # and against the float model the shift is gone: measured 10.2 → 21.7 dB on these feeds
    reference = run_ort(src, HELD_OUT)
    fixed, shifted = snr_db(reference, got), snr_db(reference, before)
    assert fixed > shifted + 8, (shifted, fixed)
    error = np.concatenate([g - r for g, r in zip(got, reference)])
    # most of the shift is gone on other feeds than it was measured on (measured: a ninth of it is left)
    assert np.abs(error.mean(axis=(0, 2, 3))).mean() < 0.2 * np.abs(shift).mean()
    for path in (out, plain):
        assert_qdq_contract(path)
        assert_tensorrt_ready(path)


def test_float16_models_are_corrected_as_they_are_written(tmp_path):
    """With --high-precision fp16 the centre conv2's input is re-centred on is a float16 number: the shift is
    measured and judged with that centre (with the float32 one it was wrong: measured 7.5 → 2.4 dB)."""
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    src = save(_shifted(), tmp_path / "shifted.onnx")
    outs, reports = {}, {}
    for corrected in (True, False):
        outs[corrected] = tmp_path / f"fp16-{corrected}.onnx"
        reports[corrected] = convert(src, outs[corrected], ConvertOptions(
            calibration=CalibrationOptions(data=str(tmp_path / "calib.npz"), give_back=False,
                                           bias_correction=corrected),
            precision=PrecisionOptions(high_precision="fp16"), progress=False))
    reference = run_ort(src, HELD_OUT)
    fixed, shifted = (snr_db(reference, run_ort(outs[c], HELD_OUT)) for c in (True, False))
    assert fixed > shifted + 4, (shifted, fixed)  # measured 7.5 → 14.1 dB
    assert reports[True].bias_corrected["layers"] == 1 and reports[False].bias_corrected is None
    for path in outs.values():
        assert_tensorrt_ready(path)


def test_a_nan_feed_among_the_first_is_skipped_not_counted(tmp_path):
    """The shifts are measured on the first 4 finite feeds before the held-out ones: a NaN feed 0 is passed over."""
    feeds = samples.image_feeds(17, 1)
    feeds[0][...] = np.nan
    save(_shifted(), tmp_path / "shifted.onnx")
    np.savez(tmp_path / "calib.npz", x=feeds)
    _, out, report = _convert(tmp_path, "out.onnx")
    assert report.calibration["skipped_feeds"] == 1
    assert report.bias_corrected["layers"] == 1, report.bias_corrected
    assert_tensorrt_ready(out)


def test_the_held_out_feeds_must_confirm_it(tmp_path, monkeypatch):
    """A correction that does not win MARGIN_DB on the held-out feeds is not made: the model is the one
    --no-bias-correction writes, byte for byte."""
    monkeypatch.setattr(bias_correction, "score", lambda model, feeds, outputs: -1.0)
    _, out, report = _convert(tmp_path, "out.onnx")
    assert report.bias_corrected["layers"] == 0 and "did not win" in report.bias_corrected["reason"]
    _, plain, _ = _convert(tmp_path, "plain.onnx", bias_correction=False)
    assert out.read_bytes() == plain.read_bytes()
    assert_tensorrt_ready(out)


def test_a_layer_given_back_keeps_its_bias(tmp_path):
    """With give-back on, conv2 goes back to float (its own error is far below conv1's): its bias, measured while
    it was INT8, must not be corrected."""
    src, out, report = _convert(tmp_path, "out.onnx", give_back=True)
    assert report.given_back["layers"] == ("conv2",)
    assert report.bias_corrected["layers"] == 0
    assert np.array_equal(_conv_bias(out, "conv2"), np.zeros(16))
    assert snr_db(run_ort(src, HELD_OUT), run_ort(out, HELD_OUT)) > 40
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("flags", [["--no-bias-correction"], ["--calib-method", "max"]],
                         ids=["no-bias-correction", "max"])
def test_bias_correction_is_off_with_its_flag_or_without_auto(tmp_path, flags):
    src = save(_shifted(), tmp_path / "shifted.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    out = tmp_path / "o.onnx"
    result = cli("convert", src, "-o", out, "--calib-data", tmp_path / "calib.npz", "--no-give-back", "--json", *flags)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["bias_corrected"] is None
    assert snr_db(run_ort(src, HELD_OUT), run_ort(out, HELD_OUT)) < 15  # the shift stays: measured 10.2 dB
    assert_tensorrt_ready(out)


def test_only_significant_shifts_are_kept():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((8, 32))  # zero-mean noise: nothing stands 3 standard errors out, or nearly
    consistent = np.tile(np.linspace(-1, 1, 4), (8, 1)) + 1e-3 * rng.standard_normal((8, 4))
    found = bias_correction.significant_shifts({"noise": noise, "consistent": consistent, "few": consistent[:3]})
    assert set(found) <= {"noise", "consistent"} and "few" not in found  # 3 feeds: a standard error of noise
    np.testing.assert_allclose(found["consistent"], consistent.mean(axis=0))
    assert np.count_nonzero(found.get("noise", np.zeros(32))) <= 1


def test_apply_shifts_gives_each_conv_its_own_bias():
    """A Conv without a bias gets one; a bias constant two Convs share is not changed for the other."""
    x = gs.Variable("x", np.float32, [1, 2, 4, 4])
    w = gs.Constant("w", np.ones((2, 2, 1, 1), np.float32))
    shared = gs.Constant("b", np.array([1.0, 2.0], np.float32))
    y1, y2, y3 = (gs.Variable(n, np.float32) for n in ("y1", "y2", "y3"))
    nodes = [gs.Node("Conv", "a", inputs=[x, w, shared], outputs=[y1]),
             gs.Node("Conv", "b", inputs=[x, w, shared], outputs=[y2]),
             gs.Node("Conv", "c", inputs=[x, w], outputs=[y3])]
    graph = gs.Graph(nodes, [x], [y1, y2, y3])
    changed = bias_correction.apply_shifts(graph, {"a": np.array([0.5, -0.5]), "c": np.array([0.25, 0.25])})
    assert changed == 2
    a, b, c = graph.nodes
    np.testing.assert_array_equal(a.inputs[2].values, [0.5, 2.5])
    assert b.inputs[2] is shared and np.array_equal(shared.values, [1.0, 2.0])
    np.testing.assert_array_equal(c.inputs[2].values, [-0.25, -0.25])
