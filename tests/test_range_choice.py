"""--calib-method auto: the range method chosen by the output error on held-out calibration feeds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_tensorrt_ready, run_ort, save, snr_db
from onnx import helper, numpy_helper

from trt_bridge.calibrate.observers import CalibMethod, RangeObserver
from trt_bridge.calibrate.session import HeldOut
from trt_bridge.cli import main
from trt_bridge.conversion import bias_correction, convert, range_choice
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.conversion.range_choice import HELD_OUT_VALUES, MIN_FEEDS

SHAPE = [1, 8, 64, 64]  # 32768 values per feed: one held-out feed judges clipping


def conv_net(seed: int = 0, small_input: bool = False) -> onnx.ModelProto:
    """x ─ Conv(8→16, 3×3) ─ Relu ─ Conv(16→8, 1×1) ─ y
    with ``small_input``:   v[1, 16] ─ MatMul(W[16, 16]) ─ w   (16 values per feed)"""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((8, 16, 1, 1)).astype(np.float32) * 0.3
    w3 = rng.standard_normal((16, 16)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], "conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], "relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], "conv2")]
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, SHAPE)]
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 64, 64])]
    weights = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    if small_input:
        nodes.append(helper.make_node("MatMul", ["v", "w3"], ["w"], "matmul"))
        inputs.append(helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, [1, 16]))
        outputs.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [1, 16]))
        weights.append(numpy_helper.from_array(w3, "w3"))
    graph = helper.make_graph(nodes, "net", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gaussian(count: int, seed: int) -> np.ndarray:
    """Normal inputs: the max of a million values sits near 5σ, a 99.99th percentile near 4σ; the levels max
    spends on the rare tail cost more than clipping it does (about 1 dB here)."""
    return np.random.default_rng(seed).standard_normal((count, *SHAPE)).astype(np.float32)


def _convert(tmp_path, feeds: np.ndarray, method: str = "auto", name: str = "out.onnx", model=None):
    fpath = save(model or conv_net(), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=feeds)
    out = tmp_path / name
    report = convert(fpath, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz"), method=CalibMethod(method)),
        progress=False))
    return fpath, out, report


def _snr(fpath, out, feeds) -> float:
    held_out = [{"x": f} for f in feeds]
    return snr_db(run_ort(fpath, held_out), run_ort(out, held_out))


def test_long_tails_choose_a_clipping_range_that_is_more_accurate_on_new_inputs(tmp_path):
    fpath, out, report = _convert(tmp_path, gaussian(32, 1))
    chosen = report.calibration["method"]
    assert chosen in ("percentile", "mse"), report.calibration["auto"]
    assert report.calibration["auto"].startswith(f"auto: {chosen}")
    assert "held-out SNR on" in report.calibration["auto"] and "max " in report.calibration["auto"]
    assert any(f"calibration: 32 feed(s), method auto: {chosen}" in line for line in report.summary().splitlines())
    _, out_max, _ = _convert(tmp_path, gaussian(32, 1), "max", "max.onnx")
    evaluation = gaussian(8, 2)
    assert _snr(fpath, out, evaluation) > _snr(fpath, out_max, evaluation) + 0.5
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("scores, chosen", [
    ({"max": 30.0, "percentile 99.99": 30.2, "percentile 99.999": 30.1, "mse": 29.0}, "max"),  # within the margin
    ({"max": 30.0, "percentile 99.99": 29.0, "percentile 99.999": 31.0, "mse": 30.9}, "percentile 99.999"),
    ({"max": 30.0, "percentile 99.99": 29.0, "percentile 99.999": 30.0, "mse": 30.5}, "mse"),
])
def test_a_candidate_must_beat_max_by_the_margin(tmp_path, monkeypatch, scores, chosen):
    judged = iter(scores.values())
    monkeypatch.setattr(range_choice, "score", lambda model, feeds, outputs: next(judged))
    # the ranges alone: bias correction (after the choice, on by default) declined
    monkeypatch.setattr(bias_correction, "score", lambda model, feeds, outputs: -np.inf)
    fpath, out, report = _convert(tmp_path, gaussian(32, 1))
    assert report.calibration["auto"].startswith(f"auto: {chosen} (held-out SNR on ")
    assert report.calibration["method"] == chosen.split()[0]
    assert report.calibration["percentile"] == (float(chosen.split()[1]) if " " in chosen else None)
    if chosen == "max":  # the same scales as --calib-method max: the same model
        _, out_max, _ = _convert(tmp_path, gaussian(32, 1), "max", "max.onnx")
        assert out.read_bytes() == out_max.read_bytes()
    held_out = [{"x": f} for f in gaussian(4, 2)]
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 30
    assert_tensorrt_ready(out)


def test_too_few_feeds_or_values_fall_back_to_max_and_say_why(tmp_path):
    _, _, report = _convert(tmp_path, gaussian(MIN_FEEDS - 1, 1))
    assert report.calibration["method"] == "max"
    assert f"fewer than {MIN_FEEDS} to judge by" in report.calibration["auto"]

    small = conv_net()  # 3×4×4 inputs: 16 held-out feeds hold far fewer values than clipping shows in
    small.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 4
    small.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 4
    small.graph.output[0].type.tensor_type.shape.dim[2].dim_value = 4
    small.graph.output[0].type.tensor_type.shape.dim[3].dim_value = 4
    feeds = np.random.default_rng(0).standard_normal((64, 1, 8, 4, 4)).astype(np.float32)
    _, out, report = _convert(tmp_path, feeds, model=small, name="small.onnx")
    assert report.calibration["method"] == "max"
    assert f"fewer than {HELD_OUT_VALUES} values in the 8 held-out feed(s) kept" in report.calibration["auto"]
    assert_tensorrt_ready(out)


def test_an_activation_too_small_to_judge_keeps_its_max_while_the_others_get_the_chosen_range(tmp_path):
    x = gaussian(32, 1)
    v = np.random.default_rng(1).uniform(-1, 1, (32, 1, 16)).astype(np.float32)
    fpath = save(conv_net(small_input=True), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=x, v=v)
    out = tmp_path / "out.onnx"
    report = convert(fpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                progress=False))
    assert report.calibration["method"] in ("percentile", "mse"), report.calibration["auto"]
    assert "1 small activation(s) keep max" in report.calibration["auto"]
    scales = {q["tensor"]: q["scale"] for q in report.quantized if q["kind"] == "activation"}
    assert scales["v"] == pytest.approx(np.abs(v).max() / 127, rel=1e-6)  # its max
    assert scales["x"] < np.abs(x).max() / 127 * 0.9  # the large input is clipped
    held_out = [{"x": a, "v": b} for a, b in zip(gaussian(4, 2), v[:4])]
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 20
    assert_tensorrt_ready(out)


def test_auto_is_deterministic(tmp_path):
    feeds = gaussian(16, 3)
    _, a, _ = _convert(tmp_path, feeds, name="a.onnx")
    _, b, _ = _convert(tmp_path, feeds, name="b.onnx")
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("total, size", [(None, 8), (7, None), (8, 2), (16, 4), (31, 4), (64, 8), (1000, 8)])
def test_the_held_out_size_is_a_power_of_two_up_to_a_quarter(total, size):
    split = HeldOut.split(total)
    assert (split.size if split else None) == size
    if split and total:
        observers = {"t": RangeObserver("auto")}
        for index in range(total):
            split.before(index, observers)
            observers["t"].update(np.full(4, float(index + 1), np.float32))
        assert split.snapshot["t"].max == total - size  # the observers as they stood before the held-out feeds
        assert split.keeps(total - size) and not split.keeps(total - size - 1)


def test_the_cli_defaults_to_auto_and_still_takes_max(tmp_path, capsys):
    fpath = save(conv_net(), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=gaussian(16, 4))
    assert main(["convert", str(fpath), "-o", str(tmp_path / "a.onnx"), "--calib-data",
                 str(tmp_path / "calib.npz"), "--json", str(tmp_path / "a.json")]) == 0
    assert "method auto: " in capsys.readouterr().out
    assert main(["convert", str(fpath), "-o", str(tmp_path / "m.onnx"), "--calib-data",
                 str(tmp_path / "calib.npz"), "--calib-method", "max"]) == 0
    text = capsys.readouterr().out
    assert "method max," in text and "method auto" not in text


# --- what a hostile review found ------------------------------------------------------------------------------

def test_a_float16_model_below_opset_19_gets_its_candidates_at_opset_19(tmp_path):
    """The written model's float16 Q/DQ need opset 19; the candidates are finished the same way."""
    model = conv_net()
    for t in model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    fpath = save(model, tmp_path / "fp16.onnx")
    feeds = gaussian(16, 1).astype(np.float16)
    np.savez(tmp_path / "calib.npz", x=feeds)
    out = tmp_path / "out.onnx"
    report = convert(fpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                progress=False))
    assert "held-out SNR on 4 feed(s)" in report.calibration["auto"], report.calibration["auto"]
    held_out = [{"x": f} for f in gaussian(4, 2).astype(np.float16)]
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 30
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("bad, judged", [([31], "held-out SNR on 7 feed(s)"),  # 8 held out, 1 left out
                                         (list(range(24, 32)), "every held-out feed was left out (NaN or Inf)")])
def test_held_out_feeds_left_out_for_nan_are_not_judged_on_nor_replaced_by_fitted_ones(tmp_path, bad, judged):
    feeds = gaussian(32, 1)
    feeds[bad, 0, 0, 0, 0] = np.nan
    _, out, report = _convert(tmp_path, feeds)
    assert judged in report.calibration["auto"], report.calibration["auto"]
    assert report.calibration["skipped_feeds"] == len(bad)
    assert_tensorrt_ready(out)


#: a data-loader script of ``count`` Gaussian feeds for conv_net
_LOADER = ("import numpy as np\n"
           "def load_data():\n"
           "    rng = np.random.default_rng(1)\n"
           "    for _ in range({count}):\n"
           "        yield {{'x': rng.standard_normal((1, 8, 64, 64)).astype(np.float32)}}\n")


def test_a_data_loader_of_unknown_length_is_judged_like_the_same_feeds_in_a_file(tmp_path):
    fpath = save(conv_net(), tmp_path / "float.onnx")
    (tmp_path / "loader.py").write_text(
        _LOADER.format(count=32) +
        "def load_few():\n"
        "    return (f for i, f in enumerate(load_data()) if i < 5)\n")
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in _loaded(tmp_path / "loader.py")]))
    outs = {}
    for name, data in (("loader", f"{tmp_path / 'loader.py'}:load_data"), ("file", str(tmp_path / "calib.npz"))):
        outs[name] = tmp_path / f"{name}.onnx"
        report = convert(fpath, outs[name], ConvertOptions(calibration=CalibrationOptions(data=data),
                                                           progress=False))
        assert "held-out SNR on 8 feed(s)" in report.calibration["auto"], report.calibration["auto"]
    assert outs["loader"].read_bytes() == outs["file"].read_bytes()
    assert_tensorrt_ready(outs["loader"])
    report = convert(fpath, tmp_path / "few.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=f"{tmp_path / 'loader.py'}:load_few"), progress=False))
    assert report.calibration["auto"] == f"auto: max (5 calibration feed(s), fewer than {MIN_FEEDS} to judge by)"


def test_a_data_loader_that_refills_one_buffer_converts_like_fresh_arrays(tmp_path):
    """Calibration reads the next feed while it observes this one (onnxruntime runs ahead): a loader that yields
    the same array, refilled for each feed, must give the model its fresh-array twin gives."""
    fpath = save(conv_net(), tmp_path / "float.onnx")
    (tmp_path / "loader.py").write_text(
        _LOADER.format(count=16) +
        "def load_reused():\n"
        "    buffer = np.empty((1, 8, 64, 64), np.float32)\n"
        "    for feed in load_data():\n"
        "        buffer[...] = feed['x']\n"
        "        yield {'x': buffer}\n"
        "def load_view():\n"
        "    return ({'x': memoryview(feed['x'])} for feed in load_reused())\n")
    outs = {}
    for name in ("load_data", "load_reused", "load_view"):
        outs[name] = tmp_path / f"{name}.onnx"
        convert(fpath, outs[name], ConvertOptions(calibration=CalibrationOptions(
            data=f"{tmp_path / 'loader.py'}:{name}"), progress=False))
    assert outs["load_reused"].read_bytes() == outs["load_data"].read_bytes()
    assert outs["load_view"].read_bytes() == outs["load_data"].read_bytes()  # a memoryview np.asarray would not copy
    assert_tensorrt_ready(outs["load_reused"])


def _loaded(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("loader_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.load_data())


def test_outputs_whose_infinities_move_under_quantization_are_not_judged(tmp_path):
    """log(relu(y)) is -inf wherever relu is 0, and quantization moves those places: no SNR of the finite rest
    may stand for such an output, so auto keeps max and says why."""
    model = conv_net()
    model.graph.node[-1].output[0] = "y0"
    model.graph.node.extend([helper.make_node("Relu", ["y0"], ["y1"], "relu2"),
                             helper.make_node("Log", ["y1"], ["y"], "log")])
    _, out, report = _convert(tmp_path, gaussian(32, 1), model=model)
    assert report.calibration["method"] == "max"
    assert "NaN or Inf where the float model's do not" in report.calibration["auto"], report.calibration["auto"]
    assert_tensorrt_ready(out)


def test_percentile_candidates_keep_their_digits(tmp_path):
    fpath = save(conv_net(), tmp_path / "float.onnx")
    np.savez(tmp_path / "calib.npz", x=gaussian(16, 1))
    report = convert(fpath, tmp_path / "out.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz"), percentile=99.99999), progress=False))
    assert "percentile 99.99999 " in report.calibration["auto"]
    assert "percentile 99.999999 " in report.calibration["auto"]
