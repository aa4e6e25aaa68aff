"""The arguments of ``trt-bridge scales`` (what its ``--help`` shows), listed without importing onnx, numpy or
onnxruntime; the command itself is :mod:`trt_bridge.cli.scales`."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.cli.commands import help_of

DESCRIPTION = """\
Export the scales of a converted (TensorRT-ready Q/DQ) model:
  trt-cache    TensorRT's calibration cache text (TRT-<version>-<algorithm>, then one line per activation:
               the big-endian hex of its float32 scale), as TensorRT <=10, onnxruntime's TensorRT EP and
               ModelOpt read it
  json         trt-bridge's scale table (activations and per-channel weights, amax and axis); convert
               takes it back with --scales FILE
  fixed-point  for every quantized layer, the requantization factor s_in*s_w/s_out as an int32 multiplier
               M0 in [2^30, 2^31) and a right shift n (M = M0*2^-n), with the error of that approximation,
               for integer-only accelerators

examples:
  trt-bridge scales export model.int8.onnx --format trt-cache -o calib.cache
  trt-bridge scales export model.int8.onnx --format json -o scales.json
  trt-bridge scales export model.int8.onnx --format fixed-point -o requant.json
"""


def add_parser(sub) -> None:
    p = sub.add_parser("scales", help=help_of("scales"),
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write the scales of a converted model",
                                description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("model", type=Path, help="a converted model (trt-bridge convert's output)")
    export.add_argument("--format", choices=["trt-cache", "json", "fixed-point"], required=True)
    export.add_argument("-o", "--output", type=Path, required=True, help="the file to write")
    export.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    export.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
