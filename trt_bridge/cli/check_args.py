"""The arguments of ``trt-bridge check`` (what its ``--help`` shows), listed without importing onnx, numpy or
onnxruntime; the command itself is :mod:`trt_bridge.cli.check`."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import SHAPES_HELP, add_costs_flag, add_plugins_flag, add_shapes_flags

DESCRIPTION = f"""\
Report everything that stops TensorRT from building MODEL as an INT8 engine, one finding per
node: the rule, the node and its tensors (types, shapes), why TensorRT rejects it (with its own
parser's message when tensorrt or tensorrt_rtx is installed) and what `trt-bridge convert` does
about it. Exit status: 0 TensorRT-ready INT8, 1 not, 2 error.

examples:
  trt-bridge check dynamic.onnx
  trt-bridge check model.int8.onnx --json report.json
  trt-bridge check model.onnx --trt off --json
  trt-bridge check unet.onnx --data calib.npz     # also: do these feeds fit the model?
  trt-bridge check model.fp8.onnx --compute-capability 8.6   # FP8 needs 8.9: a blocker
  trt-bridge check decoder.int8.onnx --min-shapes input_ids:1x1 --opt-shapes input_ids:1x64 \
      --max-shapes input_ids:1x256          # the --costs build's shapes, as `trt-bridge build` takes them

The --costs build (where TensorRT's parser takes the model) uses the shapes given as `build` does; a
profile that fails to build where others build is a blocker naming it and its shapes.
{SHAPES_HELP}
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
    p.add_argument("--compute-capability", metavar="X.Y",
                   help="the GPU the model must run on (8.6, 8.9, 12.0, ...): a precision it cannot run (FP8 below "
                        "8.9, FP4 below 10.0) is a blocker; also the --costs build's target unless --costs names one "
                        "(default: the --costs target, 8.9)")
    add_shapes_flags(p, "the --costs build")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    p.add_argument("-q", "--quiet", action="store_true", help="print the one-line verdict only")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the report as JSON to FILE, or to stdout without FILE")
