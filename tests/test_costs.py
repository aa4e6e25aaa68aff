"""What an engine costs (issue 32): engine size and activation memory from an ahead-of-time TensorRT-RTX build, in
check, convert (against the float model), verify and bench."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import quantize_dynamic, save
from test_cli import cli

from trt_bridge.checks import CheckOptions, check_model
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.samples import conv_net, image_feeds
from trt_bridge.tensorrt.costs import EngineCosts
from trt_bridge.tensorrt.logger import memory_line

pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX builds ahead of time; without it nothing is measured")

from trt_bridge.tensorrt.build import engine_costs  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("costs")
    float_path = save(conv_net(channels=(8, 16)), root / "float.onnx")
    source = quantize_dynamic(float_path, root / "dynamic.onnx")
    np.savez(root / "calib.npz", x=image_feeds(8, seed=0))
    return {"float": float_path, "dynamic": source, "calib": root / "calib.npz", "root": root}


def test_the_builders_memory_lines_are_read():
    assert memory_line("Total Activation Memory: 8219136 bytes") == ("activation_bytes", 8219136)
    assert memory_line("Total Weights Memory: 4868 bytes") == ("weights_bytes", 4868)
    assert memory_line("Total Activation Memory: lots") is None
    assert memory_line("[MemUsageStats] Peak memory usage of TRT CPU/GPU memory allocators: CPU 0 MiB") is None


def test_engine_costs_of_a_float_model(models):
    costs = engine_costs(models["float"], "8.9")
    assert costs.engine_bytes > 10_000 and costs.activation_bytes > 0 and costs.weights_bytes > 0
    assert costs.target.startswith("SM 8.9, tensorrt_rtx")
    smaller = EngineCosts(costs.engine_bytes // 2, costs.activation_bytes, None, costs.target)
    assert smaller.against(costs).startswith("engine ") and "-50 %" in smaller.against(costs)


def test_check_reports_the_costs_and_can_skip_them(models):
    report = check_model(models["float"], CheckOptions())
    assert report.costs is not None and report.costs.engine_bytes > 0
    assert f"costs ({report.costs.target}): engine" in report.summary()
    assert json.loads(report.to_json())["costs"]["activation_bytes"] == report.costs.activation_bytes
    assert check_model(models["float"], CheckOptions(costs=None)).costs is None
    rejected = check_model(models["dynamic"], CheckOptions())  # TensorRT's parser rejects ConvInteger: no build
    assert rejected.costs is None


def test_convert_reports_its_costs_against_the_float_model(models, tmp_path):
    out = tmp_path / "out.onnx"
    report = convert(models["dynamic"], out, ConvertOptions(
        calibration=CalibrationOptions(data=str(models["calib"])), progress=False))
    costs = report.costs
    assert costs["output"]["engine_bytes"] > 0 and costs["float"]["engine_bytes"] > 0 and not costs["float_missing"]
    assert costs["output"] == engine_costs(out, "8.9").to_dict()  # the written model's own build
    line = next(x for x in report.summary().splitlines() if x.strip().startswith("costs ("))
    assert "(float " in line and "ranged in each inference" in line and "given back to float" in line
    assert json.loads(report.to_json())["costs"]["summary"] == costs["summary"]
    skipped = convert(models["dynamic"], tmp_path / "skipped.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(models["calib"])), progress=False, check=False))
    assert skipped.costs is None


def test_verify_and_bench_show_the_costs(models, tmp_path):
    out = tmp_path / "out.onnx"
    assert cli("convert", models["float"], "-o", out, "--calib-data", models["calib"], "-q").returncode == 0
    done = cli("verify", models["float"], out, "--data", models["calib"], "--json", tmp_path / "v.json")
    assert done.returncode == 0, done.stderr
    assert "costs (SM 8.9" in done.stdout and "(reference " in done.stdout
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["costs"]["candidate"]["engine_bytes"] > 0 and data["costs"]["reference"]["engine_bytes"] > 0
    off = cli("verify", models["float"], out, "--data", models["calib"], "--costs", "off")
    assert off.returncode == 0 and "costs (" not in off.stdout
    bench = cli("bench", models["float"], out, "--iterations", "2", "--warmup", "0", "--json", tmp_path / "b.json")
    assert bench.returncode == 0, bench.stderr
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert all(r["costs"]["engine_bytes"] > 0 for r in rows)
    assert bench.stdout.count("TensorRT engine ") == 2


# ---------------------------------------------------------------- --prefer: what auto's runtime ranges may cost

def test_weigh_follows_the_documented_rule(monkeypatch):
    from trt_bridge.conversion import runtime_choice

    sizes = {}
    monkeypatch.setattr(runtime_choice, "engine_sizes", lambda static, runtime: dict(sizes))
    assert runtime_choice.weigh(3.0, None, None, "size")[0] is False
    assert runtime_choice.weigh(-0.1, None, None, "accuracy")[0] is False
    assert runtime_choice.weigh(0.0, None, None, "accuracy")[:2] == (True, "+0.0 dB against the static model")
    assert runtime_choice.weigh(1.0, None, None, "balanced")[0] is True  # 1 dB pays for any growth: no build
    sizes.update(static=10_000_000, runtime=12_000_000)  # +20 %: within the cap
    keep, why, engines = runtime_choice.weigh(0.4, None, None, "balanced")
    assert keep and "engine +20% (10.0 → 12.0 MB" in why and engines == sizes
    sizes.update(runtime=14_000_000)  # +40 %: over the cap, 0.4 dB does not pay for it
    keep, why, engines = runtime_choice.weigh(0.4, None, None, "balanced")
    assert not keep and "not worth an engine +40%" in why and "--prefer accuracy keeps them" in why
    sizes.clear()  # no builder here: kept, and said
    keep, why, _ = runtime_choice.weigh(0.4, None, None, "balanced")
    assert keep and "no TensorRT builder here" in why


def test_engine_sizes_are_built_ahead_of_time(models):
    import onnx

    from trt_bridge.conversion.runtime_choice import engine_sizes

    model = onnx.load(str(models["float"]))
    sizes = engine_sizes(model, model)
    assert sizes["static"] > 0 and sizes["static"] == sizes["runtime"]


@pytest.mark.parametrize("prefer", ["size", "accuracy"])
def test_prefer_size_keeps_calibrated_scales_and_every_layer_int8(models, tmp_path, prefer):
    from trt_bridge.conversion.options import ActivationOptions

    np.savez(tmp_path / "calib.npz", x=image_feeds(24, seed=3) * np.geomspace(0.05, 1, 24, dtype=np.float32)[
        :, None, None, None, None])  # enough feeds for auto to judge on held-out ones
    report = convert(models["dynamic"], tmp_path / "out.onnx", ConvertOptions(
        calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")), activations=ActivationOptions(prefer=prefer),
        progress=False, check=False))
    if prefer == "size":
        assert report.runtime_ranges["tensors"] == [] and "--prefer size" in report.runtime_ranges["reason"]
        assert list(report.given_back["layers"]) == [] and "--prefer size" in report.given_back["reason"]
    else:
        assert "--prefer" not in report.runtime_ranges["reason"]


def test_prefer_is_checked_on_the_command_line_and_in_manifests(models, tmp_path):
    from trt_bridge.conversion.options import ActivationOptions
    from trt_bridge.errors import TrtBridgeError

    with pytest.raises(TrtBridgeError, match="--prefer speed: choose balanced, accuracy or size"):
        ActivationOptions(prefer="speed")
    done = cli("convert", models["dynamic"], "-o", tmp_path / "out.onnx", "--prefer", "speed")
    assert done.returncode == 2 and "invalid choice: 'speed'" in done.stderr
    from trt_bridge.manifest.schema import CONVERT_FIELDS

    assert CONVERT_FIELDS["prefer"][:2] == ("activations", "prefer")
