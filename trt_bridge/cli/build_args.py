"""The arguments of ``trt-bridge build`` (what its ``--help`` shows), listed without importing onnx, numpy or
onnxruntime; the command itself is :mod:`trt_bridge.cli.build`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import SHAPES_HELP, add_output_flags, add_plugins_flag, add_shapes_flags

DESCRIPTION = f"""\
Build a TensorRT engine from MODEL (e.g. the output of `trt-bridge convert`) with TensorRT's Python API:
datacenter TensorRT 10.x/11.x (`tensorrt`) builds for the GPU of this machine; TensorRT-RTX (`tensorrt_rtx`)
also builds ahead of time, without a GPU, for the compute capabilities given with --compute-capability.
Networks are strongly typed (the only mode of TensorRT 11 and TensorRT-RTX): each layer runs in the type
the ONNX model gives it, so Q/DQ layers run in INT8.

Beside ENGINE goes ENGINE.json, the sidecar: TensorRT module and version, the target (compute capabilities,
or this machine's GPU), profiles, inputs and outputs, the model's SHA-256, flags, build time, trt-bridge
version, and `created` (UTC time of the build, so two builds' sidecars differ in that field). Check it
before running the engine elsewhere: an engine runs only with the TensorRT it was built with, on its target.

{SHAPES_HELP}
When a build with several profiles fails, each is built alone: a profile that fails where others build
is named, with its shapes.

exit status: 0 engine written; 1 TensorRT rejects the model (its parser's findings, in `check`'s format,
or its builder's errors are printed); 2 usage or environment error (a bad flag or shape, no TensorRT,
datacenter TensorRT without a GPU, a flag the installed TensorRT lacks).

examples:
  trt-bridge build model.int8.onnx -o model.engine --compute-capability 8.9 --compute-capability 12.0
  trt-bridge build model.int8.onnx -o model.engine --min-shapes x:1x3x224x224 --opt-shapes x:8x3x224x224 \\
      --max-shapes x:32x3x224x224 --timing-cache ci/timing.cache
  trt-bridge build bert.int8.onnx -o bert.engine --shapes input_ids:1x128,attention_mask:1x128 --json
  trt-bridge build decoder.onnx -o decoder.engine --compute-capability 8.9   # prefill and decode profiles
"""

SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def add_parser(sub) -> None:
    p = sub.add_parser("build", help=help_of("build"),
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="the ONNX model (TensorRT-ready: see `trt-bridge check`)")
    p.add_argument("-o", "--output", type=Path, metavar="ENGINE",
                   help="the engine file (default: MODEL with the suffix .engine, beside the model)")
    add_shapes_flags(p, "the engine")
    target = p.add_argument_group("target and builder")
    target.add_argument("--compute-capability", action="append", metavar="X.Y",
                        help="TensorRT-RTX: build ahead of time for this compute capability (8.9, 12.0, ...; "
                             "repeatable, or comma-separated); without it, TensorRT-RTX's portable default")
    target.add_argument("--timing-cache", metavar="FILE",
                        help="load TensorRT's timing cache from FILE when it exists, save it after the build "
                             "(TensorRT-RTX: its timing cache is a no-op, the file is kept)")
    target.add_argument("--workspace", type=_size, metavar="SIZE", help="workspace memory limit: 1G, 512M, bytes")
    target.add_argument("--builder-optimization-level", type=int, metavar="N", dest="optimization_level",
                        help="0..5 (TensorRT's default 3): higher builds longer and may find faster kernels")
    target.add_argument("--version-compatible", action="store_true",
                        help="an engine that later TensorRT versions run (datacenter TensorRT)")
    target.add_argument("--hardware-compatibility", metavar="LEVEL",
                        help="none, ampere+ or same-compute-capability (datacenter TensorRT 8.6+)")
    target.add_argument("--weakly-typed", action="store_true",
                        help="TensorRT 8.6/10.x only: no strong typing; sets the INT8 and FP16 builder flags")
    add_plugins_flag(target)
    target.add_argument("--trt-module", choices=["tensorrt", "tensorrt_rtx"],
                        help="build with this module when both are installed (default: tensorrt_rtx for "
                             "--compute-capability or without a GPU, else tensorrt)")
    add_output_flags(p)


def _size(text: str) -> int:
    match = SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size such as 1G, 512M or 1073741824")
    number, unit = match.groups()
    return int(float(number) * 1024 ** "bkmgt".index((unit or "b").lower()))
