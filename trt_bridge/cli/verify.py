"""``trt-bridge verify``: accuracy of a converted model (and its engine) against a reference."""

from __future__ import annotations

import argparse

from trt_bridge.calibrate.feed_sources import source_path
from trt_bridge.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    check_bounds,
    check_output_path,
    costs_target,
    emit_report,
)
from trt_bridge.cli.verify_args import add_parser  # noqa: F401 - the command's parser, as trt_bridge.api builds it
from trt_bridge.ir.files import write_text_atomic
from trt_bridge.verification import VerifyOptions, VerifyReport, verify
from trt_bridge.verification.gates import parse_gates
from trt_bridge.verification.generation import GenerationOptions
from trt_bridge.verification.html import render


def execute(args: argparse.Namespace) -> VerifyReport:
    """The comparison ``args`` asks for, with its HTML report written; prints nothing (``trt_bridge.verify``)."""
    check_bounds(args)  # --top-k, --layer-batch, --seed, --prompts, ... (as trt-bridge's entry checks them)
    given = {flag: getattr(args, flag) for flag in ("prompts", "steps", "prompt_length", "min_token_agreement")
             if getattr(args, flag) is not None}

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
        costs=costs_target(args), generation=GenerationOptions(**given) if given else None,
    )
    report = verify(args.reference, args.candidate, options)
    if args.html:
        write_text_atomic(args.html, render(report))
    return report


def run(args: argparse.Namespace) -> int:
    report = execute(args)
    emit_report(args.json, report.to_json(), report.quiet() if args.quiet else report.summary())
    return EXIT_OK if report.passed else EXIT_FAIL
