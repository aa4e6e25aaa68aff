"""``trt-bridge build``: a TensorRT engine and its sidecar JSON from a TensorRT-ready ONNX model."""

from __future__ import annotations

import argparse
import json
import sys

from trt_bridge.checks.findings import findings_json, parser_findings
from trt_bridge.cli.build_args import add_parser  # noqa: F401 - the command's parser, as trt_bridge.api builds it
from trt_bridge.cli.common import EXIT_FAIL, EXIT_OK, check_output_path, emit_report, profiles_from_args
from trt_bridge.ir.files import check_regular_input
from trt_bridge.tensorrt.build import BuildResult, EngineBuildError, ModelRejectedError, build
from trt_bridge.tensorrt.options import BuildOptions
from trt_bridge.tensorrt.sidecar import sidecar_path


def execute(args: argparse.Namespace) -> BuildResult:
    """The build ``args`` asks for; prints nothing, raises :class:`EngineBuildError` when TensorRT refuses
    (``trt_bridge.build``)."""
    output = args.output or args.model.with_suffix(".engine")
    if args.timing_cache:
        check_regular_input(args.timing_cache, "timing cache")
    if args.json not in (None, "-"):
        check_output_path(args.json, [args.model, output, sidecar_path(output), args.timing_cache, *args.plugins],
                          "report")
    ccs = tuple(c.strip() for group in args.compute_capability or [] for c in group.split(",") if c.strip())
    options = BuildOptions(
        profiles=profiles_from_args(args.shapes, args.min_shapes, args.opt_shapes, args.max_shapes),
        compute_capabilities=ccs, timing_cache=args.timing_cache, workspace=args.workspace,
        optimization_level=args.optimization_level, version_compatible=args.version_compatible,
        hardware_compatibility=args.hardware_compatibility, weakly_typed=args.weakly_typed,
        progress=not args.quiet, module=args.trt_module, plugins=tuple(args.plugins))
    return build(args.model, output, options)


def run(args: argparse.Namespace) -> int:
    try:
        result = execute(args)
    except EngineBuildError as exc:
        print(f"trt-bridge build: error: {exc}", file=sys.stderr)
        if args.json:
            findings = findings_json(parser_findings(exc.errors)) if isinstance(exc, ModelRejectedError) else []
            emit_report(args.json, json.dumps({"engine": None, "error": str(exc), "findings": findings}, indent=2),
                        None)
        return EXIT_FAIL
    emit_report(args.json, result.to_json(), None if args.quiet else result.summary())
    return EXIT_OK
