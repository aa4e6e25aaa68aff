"""The arguments of ``trt-bridge pipeline`` (what its ``--help`` shows), listed without importing onnx, numpy or
onnxruntime; the command itself is :mod:`trt_bridge.cli.pipeline`."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import add_plugins_flag

DESCRIPTION = """\
Run the engine-build stage of a GPU CI runner from a YAML manifest (models, how to convert them,
gates, and targets: compute capabilities built ahead of time with TensorRT-RTX, or this
machine's GPU). Steps this machine cannot do are skipped with the reason. Writes
OUTPUT/pipeline.junit.xml (for the CI system), pipeline.json and pipeline.md (for the job
summary), and per model the converted model, engines with their sidecars, and the step reports.
Exit status: 0 when every step that ran passed, 1 when a gate or a step failed, 2 on a bad manifest.

examples:
  trt-bridge pipeline scripts/pipeline/example.yaml
  trt-bridge pipeline models.yaml --model resnet8 --json
"""


def add_parser(sub) -> None:
    p = sub.add_parser("pipeline", help=help_of("pipeline"),
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifest", type=Path, help="the YAML manifest (see trt_bridge/pipeline/manifest.py)")
    p.add_argument("--model", action="append", default=[], metavar="NAME", help="run only this model (repeatable)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the summary as JSON to FILE, or to stdout without FILE")
    p.add_argument("--output", type=Path, metavar="DIR",
                   help="write the artifacts to DIR instead of the manifest's output (which must lie inside the "
                        "manifest's folder; DIR may be anywhere)")
    add_plugins_flag(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines; the verdict only")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
