"""Give-back (conversion/give_back.py): with ``--calib-method auto``, the few layers whose own INT8 error stands far
below the median layer's go back to float by default, where the held-out feeds confirm it; checked against
onnxruntime and built by TensorRT-RTX."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db
from test_accuracy_target import HELD_OUT, _hostile
from test_cli import cli

from trt_bridge import samples
from trt_bridge.annotations import Annotations, Site, WeightSpec, drop_layers
from trt_bridge.conversion import convert, give_back
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions


def _weight_readers(path) -> dict[str, bool]:
    """Conv name → whether its weight is int8 (read through a DequantizeLinear)."""
    import onnx

    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}
    return {n.name: producer.get(n.input[1]) is not None and producer[n.input[1]].op_type == "DequantizeLinear"
            for n in model.graph.node if n.op_type == "Conv"}


def test_the_hostile_layer_goes_back_to_float_by_default(tmp_path):
    """conv2 reads a channel 200 above the rest that it all but ignores: its own error is far below the other
    layers', so auto gives it back; conv1 and conv3 stay INT8, and the model is far more accurate."""
    src = save(_hostile(), tmp_path / "hostile.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    calib = str(tmp_path / "calib.npz")
    out, kept = tmp_path / "out.onnx", tmp_path / "int8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=calib), progress=False))
    convert(src, kept, ConvertOptions(calibration=CalibrationOptions(data=calib, give_back=False), progress=False))
    given = report.given_back
    assert given["layers"] == ("conv2",) and given["reason"] == ""
    assert given["isolated_db"]["conv2"] <= given["median_db"] - give_back.GAP_DB
    assert given["scores"][1] > given["scores"][0]  # the held-out feeds confirm it
    assert "gave 1 layer(s) back to float" in report.summary()
    assert _weight_readers(out) == {"conv1": True, "conv2": False, "conv3": True}
    assert _weight_readers(kept) == {"conv1": True, "conv2": True, "conv3": True}
    assert not any("conv2" in q["consumers"] for q in report.quantized)
    reference = run_ort(src, HELD_OUT)
    with_float, all_int8 = snr_db(reference, run_ort(out, HELD_OUT)), snr_db(reference, run_ort(kept, HELD_OUT))
    assert with_float > all_int8 + 15, (all_int8, with_float)  # measured under 20 dB → over 40
    for path in (out, kept):
        assert_qdq_contract(path)
        assert_tensorrt_ready(path)


def _converted(tmp_path, model):
    """(source, output, report) of the default conversion of ``model`` calibrated on 16 feeds."""
    src = save(model, tmp_path / "src.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    out = tmp_path / "out.onnx"
    return src, out, convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                      progress=False))


def test_nothing_is_given_back_where_no_layer_stands_out(tmp_path):
    src, out, report = _converted(tmp_path, samples.conv_net())
    assert report.given_back["layers"] == () and "dB below the median layer's" in report.given_back["reason"]
    assert all(_weight_readers(out).values())
    assert snr_db(run_ort(src, HELD_OUT), run_ort(out, HELD_OUT)) > 30
    assert_tensorrt_ready(out)


def test_the_held_out_feeds_must_confirm_it(tmp_path, monkeypatch):
    """A give-back that does not win on the held-out feeds is not made, and the report says why."""
    monkeypatch.setattr(give_back, "score", lambda model, feeds, outputs: -1.0)
    _, out, report = _converted(tmp_path, _hostile())
    assert report.given_back["layers"] == () and "did not win on the held-out feeds" in report.given_back["reason"]
    assert all(_weight_readers(out).values())
    # declined, the model is the one --no-give-back writes
    plain = tmp_path / "plain.onnx"
    convert(tmp_path / "src.onnx", plain, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz"), give_back=False), progress=False))
    assert out.read_bytes() == plain.read_bytes()
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("flags", [["--no-give-back"], ["--calib-method", "max"]], ids=["no-give-back", "max"])
def test_give_back_is_off_with_its_flag_or_without_auto(tmp_path, flags):
    src = save(_hostile(), tmp_path / "hostile.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    out = tmp_path / "o.onnx"
    result = cli("convert", src, "-o", out, "--calib-data", tmp_path / "calib.npz", "--json", *flags)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["given_back"] is None
    assert all(_weight_readers(out).values())
    assert snr_db(run_ort(src, HELD_OUT), run_ort(out, HELD_OUT)) < 25  # conv2 INT8: measured under 20 dB
    assert_tensorrt_ready(out)


def test_drop_layers_removes_only_their_sites():
    ann = Annotations()
    ann.add_activation("x", Site("a", 0), "a")
    ann.add_activation("x", Site("b", 0), "b")
    ann.add_activation("y", Site("b", 1), "b")
    ann.add_weight(WeightSpec("Wa", [Site("a", 1)], 0, "a"))
    ann.add_weight(WeightSpec("Wb", [Site("b", 1)], 0, "b"))
    drop_layers(ann, ["b"])
    assert {k: v.sites for k, v in ann.activations.items()} == {"x": [Site("a", 0)]}
    assert list(ann.weights) == ["Wa"]


def test_the_accuracy_target_search_keeps_what_give_back_gave(tmp_path):
    """--accuracy-target on top of give-back: the plain conversion gives conv2 back; every later probe excludes it
    too (with give-back off), so excluding more layers never quantizes conv2 again, and a high target is met."""
    from trt_bridge.conversion.accuracy import convert_to_target

    src = save(_hostile(), tmp_path / "hostile.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(16, 2))
    out = tmp_path / "out.onnx"
    report, result = convert_to_target(src, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False), 50.0,
        str(tmp_path / "eval.npz"))
    assert "conv2" not in result.ranking and result.probes[0].snr_db > 40
    assert result.met and result.chosen.snr_db >= 50, result.summary()
    assert not _weight_readers(out)["conv2"]
    assert min(p.snr_db for p in result.probes) > 40  # no probe quantized conv2 again (it scored 11 dB)
    assert_tensorrt_ready(out)
