"""``trt-bridge check``: why TensorRT would not build a model as INT8, and what convert does about it."""

from __future__ import annotations

import argparse

from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.checks import CheckOptions, TrtProbe, check_model
from trt_bridge.checks.findings import CheckReport
from trt_bridge.checks.targets import compute_capability
from trt_bridge.cli.check_args import add_parser  # noqa: F401 - the command's parser, as trt_bridge.api builds it
from trt_bridge.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    check_output_path,
    costs_target,
    emit_report,
    profiles_from_args,
)
from trt_bridge.tensorrt.costs import COST_TARGET


def execute(args: argparse.Namespace) -> CheckReport:
    """The check ``args`` asks for; prints and writes nothing (``trt_bridge.check``)."""
    check_output_path(args.json, [args.model, source_path(args.data), *args.plugins], "report")
    costs = costs_target(args)
    target = getattr(args, "compute_capability", None)
    if target is not None:
        compute_capability(target)  # a bad value fails before any work
        if costs == COST_TARGET:  # --costs not given: the engine is built for the target
            costs = target
    profiles = profiles_from_args(args.shapes, args.min_shapes, args.opt_shapes, args.max_shapes)
    return check_model(args.model, CheckOptions(TrtProbe(args.trt), args.data, tuple(args.plugins), costs, target,
                                                profiles))


def run(args: argparse.Namespace) -> int:
    report = execute(args)
    emit_report(args.json, report.to_json(), report.headline() if args.quiet else report.summary())
    return EXIT_OK if report.ready else EXIT_FAIL
