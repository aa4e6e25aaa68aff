"""Conversion options: each sub-options checks itself, ``trt-bridge convert``'s argument groups fill them, and a
pipeline manifest's ``convert:`` table takes the same keys and refuses the same values with the same message."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from trt_bridge.calibrate.observers import CalibMethod
from trt_bridge.cli import build_parser
from trt_bridge.cli.convert import options_from_args
from trt_bridge.conversion.options import (
    AccuracyTarget,
    ActivationOptions,
    CalibrationOptions,
    ConvertOptions,
    PrecisionOptions,
    RangeOptions,
    ScaleOptions,
    ScalePolicy,
    SourceOptions,
    option_key,
)
from trt_bridge.errors import TrtBridgeError
from trt_bridge.manifest.schema import CONVERT_KEYS, ManifestError, load_manifest
from trt_bridge.place.formats import FormatOptions
from trt_bridge.place.policies import PlacementOptions, PlacementPolicy
from trt_bridge.prepare.types import Bf16Policy
from trt_bridge.samples import conv_net


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["convert", "model.onnx", *argv])


#: (flags, manifest table, the message both give)
REFUSED = [
    (["--percentile", "100.5"], {"percentile": 100.5}, "--percentile must be in (0, 100], got 100.5"),
    (["--smooth", "1.5"], {"smooth": 1.5}, "--smooth must be between 0 and 1 (exclusive), got 1.5"),
    (["--exclude-nodes", "conv[("], {"exclude_nodes": "conv[("},
     "--exclude-nodes 'conv[(' is not a regular expression"),
    (["--include-ops", "(Add"], {"include_ops": "(Add"}, "--include-ops '(Add' is not a regular expression"),
    (["--io-types", "fp16"], {"io_types": "fp16"}, "--io-types fp16 gives the model's inputs and outputs the type of "
                                                   "--high-precision, which is fp32"),
]


def test_the_command_line_defaults_are_the_options_defaults():
    """The argument groups map 1:1 onto the dataclasses: no flag given, the options are the dataclasses' own."""
    assert options_from_args(_args()) == ConvertOptions()
    assert options_from_args(_args("-q", "--skip-check")) == ConvertOptions(progress=False, check=False)


def test_each_flag_lands_in_its_group(tmp_path):
    table = tmp_path / "t.cache"
    table.write_text("TRT-8601-EntropyCalibration2\n")
    options = options_from_args(_args(
        "--calib-data", "c.npz", "--calib-method", "percentile", "--percentile", "99.9", "--scales", "data",
        "--scales", str(table), "--qat", "q.onnx", "--placement", "preserve", "--exclude-ops", "Concat",
        "--no-smooth", "--no-recenter", "--high-precision", "bf16", "--io-types", "bf16", "--bf16", "keep",
        "--runtime-ranges", "on"))
    assert options == ConvertOptions(
        calibration=CalibrationOptions(data="c.npz", method=CalibMethod.PERCENTILE, percentile=99.9),
        scales=ScaleOptions(policy=ScalePolicy.DATA, files=(str(table),), qat="q.onnx"),
        placement=PlacementOptions(policy=PlacementPolicy.PRESERVE, exclude_ops="Concat"),
        ranges=RangeOptions(smooth=None, recenter=False),
        precision=PrecisionOptions(high_precision="bf16", io_types="bf16", bf16=Bf16Policy.KEEP),
        activations=ActivationOptions(runtime_ranges="on"))


@pytest.mark.parametrize(("flags", "table", "message"), REFUSED)
def test_the_command_line_and_a_manifest_refuse_alike(tmp_path, flags, table, message):
    with pytest.raises(TrtBridgeError) as cli:
        options_from_args(_args(*flags))
    assert str(cli.value).startswith(message)
    (tmp_path / "m.onnx").write_bytes(conv_net().SerializeToString())
    body = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in table.items())
    (tmp_path / "m.yaml").write_text(f"models:\n  - {{name: a, source: m.onnx, convert: {{{body}}}}}\n")
    with pytest.raises(ManifestError) as manifest:
        load_manifest(tmp_path / "m.yaml")
    assert str(manifest.value) == f"{tmp_path / 'm.yaml'}: models[0]: convert: {cli.value}"


def test_the_options_check_themselves():
    with pytest.raises(TrtBridgeError, match=r"--percentile must be in \(0, 100\], got 0"):
        CalibrationOptions(percentile=0)
    with pytest.raises(TrtBridgeError, match="--high-precision fp8: choose one of fp32, fp16, bf16."):
        PrecisionOptions(high_precision="fp8")
    with pytest.raises(TrtBridgeError, match="--io-types int8: choose keep, fp16 or bf16."):
        PrecisionOptions(io_types="int8")
    with pytest.raises(TrtBridgeError, match="are for --accuracy-target"):
        AccuracyTarget(data="eval.npz")
    with pytest.raises(TrtBridgeError, match="a cosine similarity is at most 1"):
        AccuracyTarget(target=30.0, metric="cosine")
    with pytest.raises(TrtBridgeError, match="finite number of dB"):
        AccuracyTarget(target=float("nan"))
    assert RangeOptions(smooth=None).smooth is None  # off
    with pytest.raises(TrtBridgeError, match="--runtime-ranges sometimes: choose auto, on or off."):
        ActivationOptions(runtime_ranges="sometimes")


def test_a_manifest_refuses_a_runtime_ranges_value(tmp_path):
    (tmp_path / "m.onnx").write_bytes(conv_net().SerializeToString())
    (tmp_path / "m.yaml").write_text("models:\n  - {name: a, source: m.onnx, convert: {runtime_ranges: sometimes}}\n")
    with pytest.raises(ManifestError, match="runtime-ranges sometimes: choose auto, on or off"):
        load_manifest(tmp_path / "m.yaml")


def test_constant_inputs_are_name_value_pairs():
    assert SourceOptions("sr=16000, gain=0.5").values() == {"sr": 16000.0, "gain": 0.5}
    assert SourceOptions().values() == {}
    for bad in ("sr", "sr=fast", "=3", "sr=inf", "sr=1,sr=2"):
        with pytest.raises(TrtBridgeError, match="--constant-inputs"):
            SourceOptions(bad)


def test_a_manifest_takes_the_options_fields_as_keys(tmp_path):
    keys = {option_key(f) for kind in (CalibrationOptions, ScaleOptions, PlacementOptions, RangeOptions,
                                       PrecisionOptions, ActivationOptions, FormatOptions, SourceOptions)
            for f in fields(kind)}
    assert CONVERT_KEYS == keys - {"calib_data", "calib_random", "scale_files", "qat"}
    (tmp_path / "m.onnx").write_bytes(conv_net().SerializeToString())
    (tmp_path / "m.yaml").write_text(
        "models:\n  - name: a\n    source: m.onnx\n    calib_random: 2\n"
        "    convert: {calib_method: percentile, percentile: 99, placement: preserve, scales: model, smooth: null,\n"
        "              recenter: false, bf16: fp16, high_precision: fp16, io_types: fp16,\n"
        "              activations: dynamic, dynamic_granularity: token, precision: int8, block_size: 64}\n")
    options = load_manifest(tmp_path / "m.yaml").models[0].convert
    assert options == ConvertOptions(
        calibration=CalibrationOptions(random=2, method=CalibMethod.PERCENTILE, percentile=99),
        scales=ScaleOptions(policy=ScalePolicy.MODEL), placement=PlacementOptions(policy=PlacementPolicy.PRESERVE),
        ranges=RangeOptions(smooth=None, recenter=False),
        precision=PrecisionOptions(high_precision="fp16", io_types="fp16", bf16=Bf16Policy.FP16),
        activations=ActivationOptions("dynamic", "token"), formats=FormatOptions("int8", block_size=64))


@pytest.mark.parametrize(("table", "message"), [
    ("{calib_method: median}", "convert.calib_method: 'median' is not one of max, percentile, entropy, mse, auto."),
    ("{percentile: high}", "convert.percentile: expected a number, got 'high'."),
    ("{percentile: .inf}", "convert.percentile: expected a number, got inf."),
    ("{recenter: 1}", "convert.recenter: expected true or false, got 1."),
    ("{exclude_nodes: 3}", "convert.exclude_nodes: expected a string, got 3."),
    ("{placement: null}", "convert.placement: None is not one of tensorrt, preserve."),
    ("{qat: q.onnx}", "convert: unknown key 'qat'"),
])
def test_a_manifest_names_an_ill_typed_option(tmp_path, table, message):
    (tmp_path / "m.onnx").write_bytes(conv_net().SerializeToString())
    (tmp_path / "m.yaml").write_text(f"models:\n  - {{name: a, source: m.onnx, convert: {table}}}\n")
    with pytest.raises(ManifestError, match="models\\[0\\]: ") as info:
        load_manifest(tmp_path / "m.yaml")
    assert message in str(info.value)


@pytest.mark.parametrize("flag", ["--fp8", "--int4"])
def test_the_dynamic_plugin_takes_no_other_format(flag):
    args = build_parser().parse_args(["convert", "m.onnx", "--activations", "dynamic", flag])
    with pytest.raises(TrtBridgeError, match=f"{flag} cannot change"):
        options_from_args(args)
