"""``trt-bridge verify``: accuracy of a converted model (and its engine) against a reference."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    add_costs_flag,
    add_plugins_flag,
    check_output_path,
    check_seed,
    costs_target,
    emit_report,
)
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.files import write_text_atomic
from trt_bridge.verify import VerifyOptions, verify
from trt_bridge.verify.gates import parse_gates
from trt_bridge.verify.html import render

DESCRIPTION = """\
Run REFERENCE (the float model, or the original quantized one) and CANDIDATE (the converted
model) in onnxruntime, and ENGINE in TensorRT when given and a GPU is present, on the same
feeds; report per output SNR (dB), cosine similarity, max/mean absolute and relative error, and
top-1/top-k agreement for classifier-like outputs. Gates make it a CI step: exit 0 when every
gate passes, 1 when one fails, 2 on error. --per-layer ranks the quantized layers by the error
they add and prints the `convert --exclude-nodes` that keeps the worst in higher precision.

examples:
  trt-bridge verify float.onnx model.int8.onnx --data eval.npz --min-snr 30
  trt-bridge verify float.onnx model.int8.onnx --random 16 --seed 1 --min-snr logits=25 --min-cosine 0.999
  trt-bridge verify float.onnx model.int8.onnx --data eval.npz --per-layer --html report.html --json report.json
  trt-bridge verify float.onnx model.int8.onnx --data eval.npz --save-outputs ref.json --save-inputs in.json
  trt-bridge verify float.onnx model.int8.onnx --engine model.engine --load-outputs ref.json --load-inputs in.json
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for flag in ("top_k", "layer_batch", "layer_feeds"):
        if getattr(args, flag) < 1:
            raise TrtBridgeError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    check_seed(args.seed)

    targets = ((args.json, "report"), (args.html, "HTML report"), (args.save_outputs, "outputs file"),
               (args.save_inputs, "inputs file"))
    reads = [args.reference, args.candidate, args.engine, source_path(args.data), args.load_outputs, args.load_inputs,
             *args.plugins]
    for i, (target, what) in enumerate(targets):
        others = [t for j, (t, _) in enumerate(targets) if j != i]
        check_output_path(target, reads + others, what)
    options = VerifyOptions(
        data=args.data, random=args.random, seed=args.seed, engine=args.engine,
        gates=tuple(parse_gates(args.min_snr, args.min_cosine, args.max_abs)), top_k=args.top_k,
        per_layer=args.per_layer, layer_batch=args.layer_batch, layer_feeds=args.layer_feeds,
        save_outputs=args.save_outputs, load_outputs=args.load_outputs, save_inputs=args.save_inputs,
        load_inputs=args.load_inputs, progress=not args.quiet, plugins=tuple(args.plugins),
        costs=costs_target(args),
    )
    report = verify(args.reference, args.candidate, options)
    emit_report(args.json, report.to_json(), report.quiet() if args.quiet else report.summary())
    if args.html:
        write_text_atomic(args.html, render(report))
    return EXIT_OK if report.passed else EXIT_FAIL
