"""``trt-bridge bench``: latency and throughput of engines and ONNX models, side by side."""

from __future__ import annotations

import argparse

from trt_bridge.bench import BenchOptions, bench
from trt_bridge.bench.inputs import parse_shapes
from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.cli.bench_args import add_parser  # noqa: F401 - the command's parser, as trt_bridge.api builds it
from trt_bridge.cli.common import (
    EXIT_OK,
    check_output_path,
    check_seed,
    costs_target,
    emit_report,
)
from trt_bridge.ir.files import write_text_atomic


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    outputs = ((args.json, "JSON report"), (args.markdown, "markdown table"))
    for i, (target, what) in enumerate(outputs):
        check_output_path(target, [*args.paths, source_path(args.data), *args.plugins, outputs[1 - i][0]], what)
    options = BenchOptions(iterations=args.iterations, warmup=args.warmup, duration=args.duration,
                           shapes=parse_shapes(args.shapes), data=args.data, seed=args.seed, transfers=args.transfers,
                           cuda_graph=args.cuda_graph, provider=args.provider, threads=args.threads,
                           plugins=tuple(args.plugins), costs=costs_target(args))
    report = bench(args.paths, options)
    emit_report(args.json, report.to_json(), report.table() if args.quiet else report.summary())
    if args.markdown:
        write_text_atomic(args.markdown, report.markdown())
    return EXIT_OK
