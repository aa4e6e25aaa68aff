"""`convert --accuracy-target`: the layer made hostile to INT8 is given back to higher precision, and only it."""

from __future__ import annotations

import json

import numpy as np
import onnx
from helpers import assert_qdq_contract, assert_tensorrt_ready, save
from onnx import numpy_helper
from test_cli import cli

from trt_bridge import samples
from trt_bridge.accuracy import convert_to_target
from trt_bridge.convert import ConvertOptions


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


def test_the_hostile_layer_and_only_it_is_given_back(tmp_path):
    src = save(_hostile(), tmp_path / "hostile.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1))
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(16, 2))
    out = tmp_path / "out.onnx"
    report, result = convert_to_target(src, out, ConvertOptions(calib_data=str(tmp_path / "calib.npz"),
                                                                progress=False), 30.0, str(tmp_path / "eval.npz"))
    assert result.ranking[0] == "conv2"
    assert result.probes[0].snr_db < 20  # plain INT8 misses the target
    assert result.met and result.chosen.excluded == ("conv2",) and result.chosen.snr_db > 30
    assert result.chosen.quantized_layers == 2  # conv1 and conv3 stay INT8
    assert not any("conv2" in q["consumers"] for q in report.quantized)
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
    assert_tensorrt_ready(tmp_path / "o.onnx")
    bad = cli("convert", src, "--calib-random", "1", "--eval-random", "4")
    assert bad.returncode == 2 and "are for --accuracy-target" in bad.stderr
