"""``trt-bridge convert``: rewrite a quantized ONNX model into TensorRT-ready INT8 Q/DQ."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import EXIT_FAIL, EXIT_OK, add_output_flags, check_output_path
from trt_bridge.cli.convert_args import (
    AccuracyTargetArgs,
    ActivationArgs,
    CalibrationArgs,
    PlacementArgs,
    PrecisionArgs,
    RangeArgs,
    ScaleArgs,
)
from trt_bridge.conversion import convert
from trt_bridge.conversion.accuracy import convert_to_target
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.conversion.stages import input_files
from trt_bridge.ir.files import write_text_atomic

DESCRIPTION = """\
Rewrite an ONNX model into TensorRT-ready explicit quantization: symmetric int8
QuantizeLinear/DequantizeLinear with zero point 0, per-channel int8 weights, float bias.
Sources: dynamically quantized models (DynamicQuantizeLinear, MatMulInteger, ConvInteger),
static QOperator models (QLinearConv, QLinearMatMul, com.microsoft QLinear*/QGemm), Q/DQ
models with uint8 or non-zero zero points, and float models. Activation scales come from
the model or from calibration data.

examples:
  trt-bridge convert dynamic.onnx --int8 -o model.trt.onnx --calib-data calib.npz
  trt-bridge convert qoperator.onnx --int8 -o model.trt.onnx          # the model's own scales
  trt-bridge convert qdq.onnx --int8 --calib-data feeds/ --scales data --report report.json
  trt-bridge convert float.onnx --int8 --calib-data loader.py:load_data --exclude-nodes 'head'
  trt-bridge convert dynamic.onnx --activations dynamic -o model.plugin.onnx   # no calibration data
"""


CALIBRATION, SCALES, PLACEMENT, RANGES, TARGET, PRECISION, ACTIVATIONS = (
    CalibrationArgs(), ScaleArgs(), PlacementArgs(), RangeArgs(), AccuracyTargetArgs(), PrecisionArgs(),
    ActivationArgs())


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help=help_of("convert"),
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="the input ONNX model (never modified)")
    p.add_argument("--int8", action="store_true", default=True,
                   help="emit INT8 explicit quantization (the default and, for now, only target)")
    p.add_argument("-o", "--output", type=Path,
                   help="output model (default: MODEL.int8.onnx beside the input)")
    for group in (CALIBRATION, SCALES, PLACEMENT, RANGES, TARGET, PRECISION, ACTIVATIONS):
        group.add_to(p)
    p.add_argument("--report", type=Path, metavar="JSON", help="write the conversion report as JSON (as --json FILE)")
    p.add_argument("--skip-check", action="store_true",
                   help="do not run `trt-bridge check` (and TensorRT's parser, when installed) on the output")
    add_output_flags(p)
    p.set_defaults(run=run)


def options_from_args(args: argparse.Namespace) -> ConvertOptions:
    """The conversion's options, each group checked as it is made (in the order the flags were always checked)."""
    calibration, ranges, placement = CALIBRATION.parse(args), RANGES.parse(args), PLACEMENT.parse(args)
    return ConvertOptions(calibration=calibration, scales=SCALES.parse(args), placement=placement, ranges=ranges,
                          precision=PRECISION.parse(args), activations=ACTIVATIONS.parse(args),
                          check=not args.skip_check, progress=not args.quiet)


def run(args: argparse.Namespace) -> int:
    output = args.output or args.model.with_name(args.model.stem + ".int8.onnx")
    options = options_from_args(args)
    reads = [args.model, *input_files(options), source_path(args.eval_data)]
    check_output_path(output, reads[1:], "output model")  # the model itself: the conversion's own check
    # --report FILE and --json FILE both write the report (to each file given)
    report_paths = [Path(p) for p in (args.report, args.json) if p not in (None, "-")]
    for i, report_path in enumerate(report_paths):
        check_output_path(report_path, [*reads, output, output.with_name(output.name + ".data"),
                                        *report_paths[:i]], "report")
    target = TARGET.parse(args)
    if target.target is not None:
        report, result = convert_to_target(args.model, output, options, target.target, target.data, target.random,
                                           target.metric)
        report.accuracy = {**asdict(result), "summary": result.summary()}
    else:
        report = convert(args.model, output, options)
    for report_path in report_paths:
        write_text_atomic(report_path, report.to_json() + "\n")
    if args.json == "-":
        print(report.to_json())
    elif not args.quiet:
        print(report.summary())
    if report.accuracy is not None and not report.accuracy["met"]:
        print(f"trt-bridge convert: {output} is written, but it misses the accuracy target: "
              f"{report.accuracy['summary']}", file=sys.stderr)
        return EXIT_FAIL
    if report.remaining_blockers:
        print(f"trt-bridge convert: {output} is written, but TensorRT would not build it as INT8: "
              + "; ".join(report.remaining_blockers[:3]), file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK
