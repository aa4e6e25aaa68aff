"""``trt-bridge convert``: rewrite a quantized ONNX model into TensorRT-ready INT8 Q/DQ."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.cli.common import EXIT_FAIL, EXIT_OK, check_output_path
from trt_bridge.cli.convert_args import (  # add_parser: as trt_bridge.api builds it
    ACTIVATIONS,
    CALIBRATION,
    FORMATS,
    PLACEMENT,
    PRECISION,
    RANGES,
    SCALES,
    SOURCE,
    TARGET,
    add_parser,  # noqa: F401
)
from trt_bridge.conversion.accuracy import convert_to_target
from trt_bridge.conversion.dynamic_form import convert_as_asked
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.conversion.paths import input_files
from trt_bridge.conversion.report import ConversionReport
from trt_bridge.ir.commit import Outputs


def options_from_args(args: argparse.Namespace) -> ConvertOptions:
    """The conversion's options, each group checked as it is made (in the order the flags were always checked)."""
    calibration, ranges, placement = CALIBRATION.parse(args), RANGES.parse(args), PLACEMENT.parse(args)
    return ConvertOptions(calibration=calibration, scales=SCALES.parse(args), placement=placement, ranges=ranges,
                          precision=PRECISION.parse(args), activations=ACTIVATIONS.parse(args),
                          formats=FORMATS.parse(args), source=SOURCE.parse(args),
                          check=not args.skip_check, progress=not args.quiet)


def output_path(args: argparse.Namespace) -> Path:
    """``-o``, or MODEL.int8.onnx beside the input (MODEL.fp8.onnx with --fp8, MODEL.int4.onnx with --int4)."""
    suffix = "int4" if getattr(args, "weights", None) else getattr(args, "precision", None) or "int8"
    return args.output or args.model.with_name(f"{args.model.stem}.{suffix}.onnx")


def execute(args: argparse.Namespace) -> ConversionReport:
    """The conversion ``args`` asks for, with its report files written; prints nothing (``trt_bridge.convert``)."""
    output = output_path(args)
    options = options_from_args(args)
    reads = [args.model, *input_files(options), source_path(args.eval_data)]
    check_output_path(output, reads[1:], "output model")  # the model itself: the conversion's own check
    # --report FILE and --json FILE both write the report (to each file given)
    report_paths = [Path(p) for p in (args.report, args.json) if p not in (None, "-")]
    for i, report_path in enumerate(report_paths):
        check_output_path(report_path, [*reads, output, output.with_name(output.name + ".data"),
                                        *report_paths[:i]], "report")
    target = TARGET.parse(args)
    with Outputs() as outputs:  # the model, its .data and the reports: committed together once all succeeded
        if target.target is not None:
            report, result = convert_to_target(args.model, output, options, target.target, target.data,
                                               target.random, target.metric, outputs=outputs)
            report.accuracy = {**asdict(result), "summary": result.summary()}
        else:  # with --activations dynamic on 10.0+: the plugin or TensorRT's dynamic FP4, the more accurate
            report = convert_as_asked(args.model, output, options, outputs)
        for report_path in report_paths:
            outputs.stage_text(report_path, report.to_json() + "\n", "report")
        outputs.commit()
    return report


def run(args: argparse.Namespace) -> int:
    report = execute(args)
    output = output_path(args)
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
