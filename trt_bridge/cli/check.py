"""``trt-bridge check``: why TensorRT would not build a model as INT8, and what convert does about it."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.checks import CheckOptions, TrtProbe, check_model
from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_costs_flag,
    add_plugins_flag,
    check_output_path,
    costs_target,
    emit_report,
)

DESCRIPTION = """\
Report everything that stops TensorRT from building MODEL as an INT8 engine, one finding per
node: the rule, the node and its tensors (types, shapes), why TensorRT rejects it (with its own
parser's message when tensorrt or tensorrt_rtx is installed) and what `trt-bridge convert` does
about it. Exit status: 0 TensorRT-ready INT8, 1 not, 2 error.

examples:
  trt-bridge check dynamic.onnx
  trt-bridge check model.int8.onnx --json report.json
  trt-bridge check model.onnx --trt off --json
  trt-bridge check unet.onnx --data calib.npz     # also: do these feeds fit the model?
"""


def add_parser(sub) -> None:
    p = sub.add_parser("check", help=help_of("check"),
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="the ONNX model to check")
    p.add_argument("--data", metavar="DATA",
                   help="also check these feeds (an .npz, a folder, or a loader.py[:fn], as convert --calib-data "
                        "takes) against the model's inputs and the shapes its broadcasting nodes need")
    p.add_argument("--trt", choices=["auto", "off"], default="auto",
                   help="auto (default): also run TensorRT's ONNX parser when installed; off: static rules only")
    add_plugins_flag(p)
    add_costs_flag(p, "the model (where TensorRT's parser takes it)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    p.add_argument("-q", "--quiet", action="store_true", help="print the one-line verdict only")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the report as JSON to FILE, or to stdout without FILE")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_output_path(args.json, [args.model, source_path(args.data), *args.plugins], "report")
    report = check_model(args.model, CheckOptions(TrtProbe(args.trt), args.data, tuple(args.plugins),
                                                     costs_target(args)))
    emit_report(args.json, report.to_json(), report.headline() if args.quiet else report.summary())
    return EXIT_OK if report.ready else EXIT_FAIL
