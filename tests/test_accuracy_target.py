"""`convert --accuracy-target`: the layer made hostile to INT8 is given back to higher precision, and only it."""

from __future__ import annotations

import json

import numpy as np
import onnx
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db
from onnx import numpy_helper
from test_cli import cli

from trt_bridge import samples
from trt_bridge.conversion.accuracy import convert_to_target
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, PrecisionOptions


def _hostile() -> onnx.ModelProto:
    """The sample conv net with one channel of conv1's output 200 above the rest, a channel conv2 all but ignores:
    conv2's per-tensor int8 input scale must cover it and leaves the other channels a few codes.

    #  x ─ conv1 (bias[0] = 200) ─ Relu ─ r1 ─ conv2 (W[:, 0] · 1e-3) ─ Relu ─ conv3 ─ ... ─ logits
    """
    model = samples.conv_net()
    for init in model.graph.initializer:
        values = numpy_helper.to_array(init).copy()
        if init.name == "conv1.bias":
            values[0] = 200.0
        elif init.name == "conv2.weight":
            values[:, 0] *= 1e-3
        else:
            continue
        init.CopyFrom(numpy_helper.from_array(values, init.name))
    return model


#: held out from both the calibration (seed 1) and the search's evaluation (seed 2) data
HELD_OUT = [{"x": f} for f in samples.image_feeds(8, 3)]


def _snr(src, out) -> float:
    """The converted model against its float source on HELD_OUT, measured apart from the code's own report."""
    return snr_db(run_ort(src, HELD_OUT), run_ort(out, HELD_OUT))


def test_the_hostile_layer_and_only_it_is_given_back(tmp_path):
    src = save(_hostile(), tmp_path / "hostile.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(16, 2))
    out = tmp_path / "out.onnx"
    # --no-give-back: auto's give-back would already leave conv2 in float (tests/test_give_back.py); here the search
    # itself must find it
    report, result = convert_to_target(src, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz"), give_back=False), progress=False), 30.0,
        str(tmp_path / "eval.npz"))
    assert result.ranking[0] == "conv2"
    # both rankings find it first; the isolated one ranks every quantized layer
    assert set(result.rankings) == {"added", "isolated"} and result.rankings["isolated"][0] == "conv2"
    assert sorted(result.rankings["isolated"]) == ["conv1", "conv2", "conv3"]
    assert result.probes[0].snr_db < 20  # plain INT8 misses the target
    assert result.met and result.chosen.excluded == ("conv2",) and result.chosen.snr_db > 30
    assert result.chosen.quantized_layers == 2  # conv1 and conv3 stay INT8
    assert not any("conv2" in q["consumers"] for q in report.quantized)
    assert _snr(src, out) > 40  # measured 43.2 dB (plain INT8: under 20)
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


def test_cli_target_already_met_and_report(tmp_path):
    src = save(samples.conv_net(), tmp_path / "net.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(8, 1))
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(8, 2))
    result = cli("convert", src, "-o", tmp_path / "o.onnx", "--calib-data", tmp_path / "calib.npz",
                 "--accuracy-target", "25", "--eval-data", tmp_path / "eval.npz", "--json")
    assert result.returncode == 0, result.stderr
    accuracy = json.loads(result.stdout)["accuracy"]
    assert accuracy["met"] and len(accuracy["probes"]) == 1 and accuracy["chosen"]["excluded"] == []
    assert _snr(src, tmp_path / "o.onnx") > 35  # measured 38.0 dB
    assert_tensorrt_ready(tmp_path / "o.onnx")
    bad = cli("convert", src, "--calib-random", "1", "--eval-random", "4")
    assert bad.returncode == 2 and "are for --accuracy-target" in bad.stderr
    bad = cli("convert", src, "--calib-random", "1", "--accuracy-target", "30", "--accuracy-metric", "cosine")
    assert bad.returncode == 2 and "at most 1" in bad.stderr


def test_cli_cosine_target_gives_back_the_hostile_layer(tmp_path):
    """--accuracy-metric cosine: the same search against the worst output's cosine similarity."""
    src = save(_hostile(), tmp_path / "hostile.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(16, 2))
    result = cli("convert", src, "-o", tmp_path / "o.onnx", "--calib-data", tmp_path / "calib.npz",
                 "--accuracy-target", "0.9995", "--accuracy-metric", "cosine", "--eval-data", tmp_path / "eval.npz",
                 "--no-give-back", "--json")
    assert result.returncode == 0, result.stderr
    accuracy = json.loads(result.stdout)["accuracy"]
    assert accuracy["metric"] == "cosine" and accuracy["met"]
    assert accuracy["probes"][0]["cosine"] < 0.9995 <= accuracy["chosen"]["cosine"]
    assert accuracy["chosen"]["excluded"] == ["conv2"] and accuracy["chosen"]["score"] == accuracy["chosen"]["cosine"]
    assert "cosine 0.9995 met" in accuracy["summary"]
    assert _snr(src, tmp_path / "o.onnx") > 40  # measured 43.2 dB (cosine 0.99998)
    assert_tensorrt_ready(tmp_path / "o.onnx")


def test_isolated_errors_rank_a_broken_scale_first_and_cover_every_layer(tmp_path):
    """Each quantized layer against a copy of itself reading its activations before their Q/DQ: finite for
    every layer of a converted net, and a scale divided by 25 (most of the tensor clipped) ranks worst."""
    from trt_bridge.verification.layers import isolated_errors, quantized_layers

    src = save(samples.conv_net(), tmp_path / "net.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(8, 1))
    out = tmp_path / "net.int8.onnx"
    convert_opts = ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), progress=False,
                                  check=False)
    from trt_bridge.conversion import convert

    convert(src, out, convert_opts)
    assert _snr(src, out) > 35  # measured 38.0 dB
    assert_tensorrt_ready(out)  # the converted model, before its scale is broken below (in memory only)
    model = onnx.load(str(out))
    feeds = [{"x": f} for f in samples.image_feeds(4, 2)]
    plain = isolated_errors(model, feeds)
    layers = {node.name for _, node, acts in quantized_layers(model) if acts}
    assert set(plain) == layers and all(v is not None and 15 < v < 60 for v in plain.values()), plain
    producer = {o: n for n in model.graph.node for o in n.output}
    conv2 = next(n for n in model.graph.node if n.name == "conv2")
    scale = producer[conv2.input[0]].input[1]  # conv2's activation DQ (its Q shares the scale)
    for init in model.graph.initializer:
        if init.name == scale:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) / 25, scale))
    broken = isolated_errors(model, feeds)
    assert min(broken, key=broken.get) == "conv2" and broken["conv2"] < plain["conv2"] - 10


def test_search_picks_the_better_ranking_and_refines_its_prefix():
    """The search alone, on a synthetic accuracy model (the SNR is 10 dB plus the gain of each excluded layer):
    bisection over each ranking, the one keeping more layers INT8 wins, and refinement then quantizes again a
    layer the ranking put too early."""
    from trt_bridge.conversion.accuracy import Probe, search

    gain = {"a": 4.0, "b": 3.0, "c": 0.0, "d": 2.0, "e": 0.1, "f": 0.1}
    calls = []

    def probe(excluded, ranking=""):
        calls.append((excluded, ranking))
        snr = 10.0 + sum(gain[x] for x in excluded)
        return Probe(excluded, snr, 6 - len(excluded), ranking, score=snr)

    rankings = {"added": ["e", "f", "a", "b", "d", "c"], "isolated": ["a", "c", "b", "d", "e", "f"]}
    best, name = search(rankings, probe, 18.5)
    assert name == "isolated"  # "added" needs 5 layers (e, f, a, b, d), "isolated" 4 (a, c, b, d)
    assert sorted(best.excluded) == ["a", "b", "d"] and best.snr_db == 19.0  # c was given back for nothing
    assert any(r == "refined" for _, r in calls)
    assert search(rankings, probe, 40.0) == (None, None)  # not even everything in float reaches it


def test_target_under_bf16_high_precision(tmp_path):
    """The same search on a --high-precision bf16 conversion: every probe and ranking runs the bfloat16 emulation,
    and the hostile layer is still the one given back."""
    src = save(_hostile(), tmp_path / "hostile.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(16, 2))
    out = tmp_path / "out.onnx"
    report, result = convert_to_target(src, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz"), give_back=False),
        precision=PrecisionOptions(high_precision="bf16"), progress=False),
                                       28.0, str(tmp_path / "eval.npz"))
    assert result.met and result.chosen.excluded == ("conv2",), result.summary()
    assert report.precision["high_precision"] == "bf16" and report.precision["counts"]["int8"] == 2
    assert _snr(src, out) > 38  # measured 41.3 dB
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
