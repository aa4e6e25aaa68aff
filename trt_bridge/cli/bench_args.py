"""The arguments of ``trt-bridge bench`` (what its ``--help`` shows), listed without importing onnx, numpy or
onnxruntime; the command itself is :mod:`trt_bridge.cli.bench`."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import add_costs_flag, add_plugins_flag

DESCRIPTION = """\
Time TensorRT engines (.engine/.plan/.trt: TensorRT + cuda-python, CUDA events, a CUDA graph
when the engine can be captured; needs an NVIDIA GPU) and ONNX models (onnxruntime with the
chosen execution provider: the baseline) on the same inputs, and report median, mean, min, max,
p90/p95/p99 latency and throughput as trtexec does, one row per model in the order given, with
the speed-up of each row versus the first. Exit 0, or 2 on errors.

examples:
  trt-bridge bench float.onnx model.int8.onnx
  trt-bridge bench model.int8.engine float.engine model.int8.onnx --iterations 500 --transfers include
  trt-bridge bench model.onnx --shapes x:8x3x224x224 --duration 5 --threads 4
  trt-bridge bench a.engine b.engine --markdown latency.md --json bench.json
  cat latency.md >> "$GITHUB_STEP_SUMMARY"        # a CI job summary (--markdown replaces its file)
"""


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help=help_of("bench"), description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="TensorRT engines and/or ONNX models")
    runs = p.add_argument_group("runs")
    runs.add_argument("--iterations", type=int, default=100, metavar="N", help="at least N timed runs (default 100)")
    add_costs_flag(runs, "each ONNX model (shown under the table)")
    runs.add_argument("--warmup", type=int, default=10, metavar="N", help="untimed runs first (default 10)")
    runs.add_argument("--duration", type=float, metavar="S", help="time each model for at least S seconds too")
    inputs = p.add_argument_group("inputs")
    inputs.add_argument("--shapes", nargs="+", action="extend", metavar="NAME:DIMS",
                        help="shapes of dynamic inputs, e.g. x:1x3x224x224 (several: apart or comma-separated; "
                             "default: 1 per dynamic dimension, the engine profile's opt shape for engines)")
    inputs.add_argument("--data", metavar="DATA",
                        help="run on the first feed of DATA (an .npz keyed by input name, a folder of .npz/.npy "
                             "feeds, or a data-loader script), as convert --calib-data takes it; default: random")
    inputs.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    engines = p.add_argument_group("engines")
    engines.add_argument("--transfers", choices=("include", "exclude"), default="exclude",
                         help="time host<->device copies with each inference or not (default exclude; also "
                              "for the cuda/tensorrt providers)")
    engines.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                         help="time plain enqueues instead of a captured CUDA graph")
    add_plugins_flag(engines)
    onnx = p.add_argument_group("ONNX models")
    onnx.add_argument("--provider", choices=("cpu", "cuda", "tensorrt"), default="cpu",
                      help="onnxruntime execution provider (default cpu)")
    onnx.add_argument("--threads", type=int, metavar="N", help="onnxruntime intra-op threads (default: its own)")
    out = p.add_argument_group("output")
    out.add_argument("--json", nargs="?", const="-", metavar="FILE",
                     help="write the report as JSON to FILE, or to stdout without FILE")
    out.add_argument("--markdown", metavar="FILE",
                     help="write the table as markdown (the file is replaced; append it to a CI summary)")
    out.add_argument("-q", "--quiet", action="store_true", help="only the table; only errors in the log")
    out.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
