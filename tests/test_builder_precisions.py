"""What each builder runs a quantized layer as (issue 38, "say what each builder runs"): the table of
:mod:`trt_bridge.tensorrt.target` (datacenter TensorRT: W8A8 INT8 convolutions and GEMMs, FP8 on 8.9+, INT4
weight-only GEMMs, FP4 on 10.0+; TensorRT-RTX, by its support matrix: INT8/INT4 weight-only GEMMs on 8.6+, FP8 GEMMs
on 8.9+, FP4 GEMMs on 12.0, quantized convolutions in float), and ``check`` and convert's report stating it per
builder, with the forms TensorRT-RTX runs quantized named where it runs a W8A8 model's INT8 layers otherwise."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import assert_tensorrt_ready, quantize_dynamic, run_ort, save, snr_db

from trt_bridge import samples
from trt_bridge.checks import CheckOptions, TrtProbe, check_model
from trt_bridge.checks.targets import builder_views
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.lower.layer_precisions import layer_precisions
from trt_bridge.tensorrt.target import SUPPORT, builder_view, headline_note, runs_as


@pytest.mark.parametrize(("module", "precision", "kind", "compute", "expected"), [
    # datacenter TensorRT 10/11: W8A8 INT8 everywhere, the newer formats from their compute capability
    ("tensorrt", "int8", "convolution", 7.5, "int8"),
    ("tensorrt", "int8", "gemm", 8.0, "int8"),
    ("tensorrt", "fp8", "gemm", 8.9, "fp8"),
    ("tensorrt", "fp8", "gemm", 8.6, None),
    ("tensorrt", "int4-w", "gemm", 8.0, "int4-w"),
    ("tensorrt", "int4-w", "convolution", 8.9, None),  # INT4 weight-only is a GEMM form
    ("tensorrt", "fp4", "gemm", 10.0, "fp4"),
    ("tensorrt", "fp4", "gemm", 8.9, None),
    # TensorRT-RTX's support matrix: weight-only INT8/INT4 GEMMs (8.6, 8.9, 12.0), FP8 GEMMs, FP4 GEMMs on 12.0
    ("tensorrt_rtx", "int8", "convolution", 8.9, None),
    ("tensorrt_rtx", "int8", "gemm", 8.9, "int8-w"),
    ("tensorrt_rtx", "int8", "gemm", 8.6, "int8-w"),
    ("tensorrt_rtx", "int8", "gemm", 8.0, None),  # Ampere 8.0 is not in its matrix's WoQ rows
    ("tensorrt_rtx", "int8", "gemm", 7.5, None),  # Turing: FP32/FP16 only
    ("tensorrt_rtx", "fp8", "gemm", 8.9, "fp8"),
    ("tensorrt_rtx", "fp8", "convolution", 12.0, None),  # FP8 and FP4: matrix multiplications only
    ("tensorrt_rtx", "int4-w", "gemm", 8.6, "int4-w"),
    ("tensorrt_rtx", "fp4", "gemm", 12.0, "fp4"),
    ("tensorrt_rtx", "fp4", "gemm", 8.9, None),
    ("tensorrt_rtx", "int8", "plugin", 8.9, "int8"),  # trt-bridge's DynamicInt8Gemm: its own int8 kernel
    ("tensorrt", "int8", "plugin", 8.9, "int8"),
])
def test_what_each_builder_runs_each_layer_as(module, precision, kind, compute, expected):
    runs, needs, why = runs_as(module, precision, kind, compute)
    assert runs == expected and needs == 0.0 and why
    if expected is None and module == "tensorrt_rtx" and kind == "convolution":
        assert why == "not in TensorRT-RTX's support matrix"


def test_without_a_target_a_form_says_the_compute_capability_it_needs():
    assert runs_as("tensorrt_rtx", "int8", "gemm") == ("int8-w", 8.6, SUPPORT["tensorrt_rtx", "int8", "gemm"].why)
    assert runs_as("tensorrt", "fp8", "gemm")[:2] == ("fp8", 8.9)
    assert runs_as("tensorrt", "int8", "convolution")[:2] == ("int8", 0.0)
    assert runs_as("tensorrt_rtx", "int8", "convolution")[:2] == (None, 0.0)


PRECISIONS = {"counts": {"fp32": 20, "int8": 6}, "groups": [
    {"precision": "fp32", "op": "other", "float": "fp32", "count": 20},
    {"precision": "int8", "op": "convolution", "float": "fp32", "count": 4},
    {"precision": "int8", "op": "gemm", "float": "fp16", "count": 2}]}


def test_a_builder_view_counts_the_layers_as_that_builder_runs_them():
    datacenter = builder_view(PRECISIONS, "tensorrt")
    assert datacenter["counts"] == {"fp32": 20, "int8": 6} and datacenter["run_as_asked"] == 6
    assert datacenter["alternatives"] is None and headline_note(datacenter) is None
    assert datacenter["line"] == ("as datacenter TensorRT runs them: FP32 20, INT8 6; as the model asks: 4 INT8 "
                                  "convolution(s), 2 INT8 GEMM(s)")
    rtx = builder_view(PRECISIONS, "tensorrt_rtx", "8.9", used=True)
    assert rtx["counts"] == {"fp32": 24, "int8-w": 2}  # the convolutions in their float type, the GEMMs weight-only
    assert (rtx["quantized_layers"], rtx["run_quantized"], rtx["run_as_asked"]) == (6, 2, 0)
    assert rtx["line"].startswith("as TensorRT-RTX runs them (the builder used here, compute capability 8.9): "
                                  "FP32 24, INT8-W 2; 4 INT8 convolution(s) in FP32 (not in TensorRT-RTX's support "
                                  "matrix); 2 INT8 GEMM(s) as INT8 weight-only")
    assert headline_note(rtx) == "TensorRT-RTX runs 4 in float and 2 weight-only of the 6 INT8 layer(s)"
    assert rtx["alternatives"] == (
        "of the model's 6 INT8 layer(s), TensorRT-RTX runs 4 in float and 2 weight-only (its support matrix has no "
        "W8A8 INT8 and no quantized convolutions); the GEMM forms it runs quantized are --int4 (INT4 weight-only, "
        "compute capability 8.6+), --fp8 (FP8, 8.9+) and FP4 (12.0, from an NVFP4 source); it runs convolutions in "
        "float in every format (--high-precision fp16 writes those it can in FP16); datacenter TensorRT runs INT8 as "
        "INT8; convert --trt-module tensorrt_rtx writes only the forms TensorRT-RTX runs")
    gemms = builder_view({"groups": [{"precision": "int4-w", "op": "gemm", "float": "fp32", "count": 3},
                                     {"precision": "int8", "op": "convolution", "float": "fp16", "count": 2}]},
                         "tensorrt_rtx", "8.9", used=True)  # --int4: the GEMMs as asked, the convolutions not
    assert headline_note(gemms) == "TensorRT-RTX runs 2 in float of the 5 quantized layer(s)"
    assert "--int4" not in gemms["alternatives"] and "convolutions in float" in gemms["alternatives"]
    turing = builder_view(PRECISIONS, "tensorrt_rtx", "7.5")
    assert turing["counts"] == {"fp16": 2, "fp32": 24} and turing["run_quantized"] == 0
    # datacenter TensorRT the builder here: its view alone; none ran: both
    assert [v["module"] for v in builder_views(PRECISIONS, "tensorrt", "8.9", None)] == ["tensorrt"]
    assert [v["module"] for v in builder_views(PRECISIONS, None, "8.9", None)] == ["tensorrt", "tensorrt_rtx"]
    assert builder_views(None, "tensorrt_rtx", "8.9", None) is None


@pytest.fixture(scope="module")
def w8a8(tmp_path_factory):
    """A classifier (3 Conv, 1 MatMul) onnxruntime quantized dynamically, converted to W8A8 INT8 (calibrated
    activations, the source's int8 weights), and its report."""
    root = tmp_path_factory.mktemp("w8a8")
    src = save(samples.conv_net(), root / "float.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(4, 0))
    out = root / "model.int8.onnx"
    options = ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False)
    report = convert(quantize_dynamic(src, root / "dynamic.onnx"), out, options)
    return src, out, report


def test_convert_report_says_what_tensorrt_rtx_runs_and_offers_its_forms(w8a8):
    src, out, report = w8a8
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    assert snr_db(run_ort(src, held_out), run_ort(out, held_out)) > 33  # the conversion itself is unchanged
    assert_tensorrt_ready(out)
    assert report.check["ready"] and report.check["parser"]["module"] == "tensorrt_rtx"
    assert report.precision["counts"] == {"fp32": 11, "int8": 4}  # the model's types: kept as they were
    datacenter, rtx = report.builders
    assert (datacenter["module"], datacenter["used"], datacenter["counts"]) == ("tensorrt", False,
                                                                                 {"fp32": 11, "int8": 4})
    assert (rtx["module"], rtx["used"], rtx["compute_capability"]) == ("tensorrt_rtx", True, "8.9")
    assert rtx["counts"] == {"fp32": 14, "int8-w": 1}
    assert {(g["op"], g["count"], g["runs_as"]) for g in rtx["groups"]} == {("convolution", 3, "fp32"),
                                                                             ("gemm", 1, "int8-w")}
    lines = report.summary().splitlines()
    assert "  layers by precision (as the model's types ask): FP32 11, INT8 4" in lines
    assert f"  {rtx['line']}" in lines and f"  warning: {rtx['alternatives']}" in lines
    assert report.check["headline"].endswith("; TensorRT-RTX runs 3 in float and 1 weight-only of the 4 INT8 "
                                             "layer(s)")
    assert json.loads(report.to_json())["builders"][1]["counts"] == {"fp32": 14, "int8-w": 1}


def test_check_states_each_builder_in_its_summary_and_json(w8a8):
    _, out, _ = w8a8
    report = check_model(out)
    assert report.ready and report.parser.module == "tensorrt_rtx"
    assert report.headline().startswith(f"{out}: TensorRT-ready INT8 (0 blocker(s), 0 warning(s); tensorrt_rtx ")
    assert "builder: builds for SM 8.9); TensorRT-RTX runs 3 in float and 1 weight-only of the 4 INT8" \
        in report.headline()
    data = json.loads(report.to_json())
    assert data["precisions"]["counts"] == {"fp32": 11, "int8": 4}  # the existing fields stay
    assert [b["module"] for b in data["builders"]] == ["tensorrt", "tensorrt_rtx"]
    assert set(data["builders"][1]) >= {"builder", "used", "compute_capability", "counts", "groups",
                                        "quantized_layers", "run_quantized", "line", "alternatives"}
    summary = report.summary()
    assert "as datacenter TensorRT runs them: FP32 11, INT8 4; as the model asks: 3 INT8 convolution(s), 1 INT8 " \
           "GEMM(s)" in summary
    assert "warning: of the model's 4 INT8 layer(s), TensorRT-RTX runs 3 in float and 1 weight-only" in summary

    # for an RTX 30 laptop (8.6) the GEMM stays weight-only; for Ampere 8.0 (not in the matrix's WoQ rows) in float;
    # no parser ran: no builder is "used", so the headline names none
    static = check_model(out, CheckOptions(TrtProbe.OFF, costs=None, compute_capability="8.0"))
    assert static.builders[1]["counts"] == {"fp32": 15} and not static.builders[1]["used"]
    assert "TensorRT-RTX runs" not in static.headline()


def test_a_float_model_prints_no_builder_lines(tmp_path):
    """Float layers run as the model's types ask, whatever the builder: nothing to add to the summary (the JSON
    has both views all the same)."""
    src = save(samples.conv_net(), tmp_path / "float.onnx")
    report = check_model(src, CheckOptions(TrtProbe.OFF, costs=None))
    assert "runs them" not in report.summary()
    assert [(v["module"], v["quantized_layers"]) for v in report.builders] == [("tensorrt", 0), ("tensorrt_rtx", 0)]
    groups = layer_precisions(onnx.load(str(src)))["groups"]
    assert {(g["op"], g["count"]) for g in groups} >= {("convolution", 3), ("gemm", 1)}
