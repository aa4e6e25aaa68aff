"""``trt-bridge pipeline``: convert → check → build → verify → bench for every model × target of a manifest."""

from __future__ import annotations

import argparse
import sys

from trt_bridge.cli.common import EXIT_FAIL, EXIT_OK, check_output_path, emit_report
from trt_bridge.cli.pipeline_args import add_parser  # noqa: F401 - the command's parser, as trt_bridge.api builds it
from trt_bridge.manifest import PipelineOptions, check_summary_path, run_pipeline
from trt_bridge.manifest.schema import load_manifest


def run(args: argparse.Namespace) -> int:
    def progress(step) -> None:
        print(f"[{step.status.value:>7}] {step.model} {step.label}: {step.message}", file=sys.stderr, flush=True)

    manifest = load_manifest(args.manifest, args.output)  # checked before anything is written
    reads = [args.manifest] + [p for m in manifest.models for p in (m.source, m.reference, m.calib_data, m.eval_data)]
    check_output_path(args.json, reads, "summary")
    check_summary_path(manifest, args.json, PipelineOptions(tuple(args.model), output=args.output))
    report = run_pipeline(args.manifest, PipelineOptions(tuple(args.model), None if args.quiet else progress,
                                                         args.output, tuple(args.plugins)))
    emit_report(args.json, report.to_json(), report.summary().splitlines()[0] if args.quiet else report.summary())
    return EXIT_OK if report.passed else EXIT_FAIL
