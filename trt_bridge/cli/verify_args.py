"""The arguments of ``trt-bridge verify`` (what its ``--help`` shows), listed without importing onnx, numpy or
onnxruntime; the command itself is :mod:`trt_bridge.cli.verify`."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import add_costs_flag, add_plugins_flag

DESCRIPTION = """\
Run REFERENCE (the float model, or the original quantized one) and CANDIDATE (the converted
model) in onnxruntime, and ENGINE in TensorRT when given and a GPU is present, on the same
feeds; report per output SNR (dB), cosine similarity, max/mean absolute and relative error, and
top-1/top-k agreement for classifier-like outputs. Gates make it a CI step: exit 0 when every
gate passes, 1 when one fails, 2 on error. --per-layer ranks the quantized layers by the error
they add and prints the `convert --exclude-nodes` that keeps the worst in higher precision.

A decoder with a key/value cache (inputs input_ids, attention_mask, past_key_values.N.key/value)
is compared in a greedy generation loop instead: --prompts N prompts (random ids, or --data with
input_ids), --steps T tokens each, every model feeding back its own cache, the candidate
teacher-forced on the reference's tokens; it reports next-token agreement, the free-running
prefix match and the logits SNR over all steps and per step.

examples:
  trt-bridge verify float.onnx model.int8.onnx --data eval.npz --min-snr 30
  trt-bridge verify float.onnx model.int8.onnx --random 16 --seed 1 --min-snr logits=25 --min-cosine 0.999
  trt-bridge verify float.onnx model.int8.onnx --data eval.npz --per-layer --html report.html --json report.json
  trt-bridge verify float.onnx model.int8.onnx --data eval.npz --save-outputs ref.json --save-inputs in.json
  trt-bridge verify float.onnx model.int8.onnx --engine model.engine --load-outputs ref.json --load-inputs in.json
  trt-bridge verify decoder.onnx decoder.int4.onnx --prompts 8 --steps 64 --min-token-agreement 90
"""


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help=help_of("verify"),
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reference", type=Path, help="the reference ONNX model (float, or the original quantized one)")
    p.add_argument("candidate", type=Path, help="the converted ONNX model")
    p.add_argument("--engine", metavar="ENGINE", help="a TensorRT engine of the candidate to run too (needs a GPU)")
    add_plugins_flag(p)
    feeds = p.add_argument_group("feeds")
    feeds.add_argument("--data", metavar="DATA",
                       help="an .npz keyed by input name, a folder of .npz/.npy feeds, or a data-loader script "
                            "(loader.py or loader.py:function), as convert --calib-data takes")
    feeds.add_argument("--random", type=int, metavar="N", help="N seeded random feeds (default: 8, with a warning)")
    feeds.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    feeds.add_argument("--save-inputs", metavar="FILE", help="save the feeds (Polygraphy's JSON format)")
    feeds.add_argument("--load-inputs", metavar="FILE", help="use feeds saved with --save-inputs")
    gates = p.add_argument_group("gates ([OUTPUT=]VALUE; repeatable; a named output's gate wins over the global one)")
    gates.add_argument("--min-snr", action="append", metavar="[OUTPUT=]DB", help="minimum SNR in dB")
    gates.add_argument("--min-cosine", action="append", metavar="[OUTPUT=]COS", help="minimum cosine similarity")
    gates.add_argument("--max-abs", action="append", metavar="[OUTPUT=]ERR", help="maximum absolute error")
    gates.add_argument("--top-k", type=int, default=5, metavar="K", help="k of the top-k agreement (default 5)")
    add_costs_flag(p, "both ONNX models (shown beside the accuracy)")
    gen = p.add_argument_group("decoders (a greedy generation loop; models with a key/value cache)")
    gen.add_argument("--prompts", type=int, metavar="N",
                     help="N seeded random prompts (default 4), or the first N of --data (default: all)")
    gen.add_argument("--steps", type=int, metavar="T", help="tokens generated per prompt (default 32)")
    gen.add_argument("--prompt-length", type=int, metavar="L", help="tokens per random prompt (default 16)")
    gen.add_argument("--min-token-agreement", type=float, metavar="PCT",
                     help="minimum greedy next-token agreement in percent (teacher-forced); exit 1 below it")
    layers = p.add_argument_group("per-layer localization")
    layers.add_argument("--per-layer", action="store_true",
                        help="rank the quantized layers by the error they add; name the nodes to keep in float")
    layers.add_argument("--layer-batch", type=int, default=64, metavar="N",
                        help="tensors exposed per onnxruntime session (default 64; never all at once)")
    layers.add_argument("--layer-feeds", type=int, default=8, metavar="N",
                        help="feeds used for the per-layer run (default: the first 8)")
    out = p.add_argument_group("output")
    out.add_argument("--save-outputs", metavar="FILE",
                     help="save every runner's outputs (Polygraphy's RunResults JSON) for --load-outputs elsewhere")
    out.add_argument("--load-outputs", metavar="FILE",
                     help="take the reference's outputs from a --save-outputs file instead of running it (the "
                          "candidate and the engine always run); give the inputs they were made from with "
                          "--load-inputs")
    out.add_argument("--json", nargs="?", const="-", metavar="FILE",
                     help="write the report as JSON to FILE, or to stdout without FILE")
    out.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (table and SNR plot)")
    out.add_argument("-q", "--quiet", action="store_true", help="one line per output")
    out.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
