"""``trt-bridge convert``: rewrite a quantized ONNX model into TensorRT-ready INT8 Q/DQ."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.cli.common import add_output_flags

DESCRIPTION = """\
Rewrite an ONNX model into TensorRT-ready explicit quantization: symmetric int8
QuantizeLinear/DequantizeLinear with zero point 0, per-channel int8 weights, float bias.
Sources: dynamically quantized models (DynamicQuantizeLinear, MatMulInteger, ConvInteger),
static QOperator models (QLinearConv, QLinearMatMul, com.microsoft QLinear*/QGemm), Q/DQ
models with uint8 or non-zero zero points, and float models. Activation scales come from
the model or from calibration data.

examples:
  trt-bridge convert dynamic.onnx --int8 -o model.trt.onnx --calib-data calib.npz
  trt-bridge convert qoperator.onnx --int8 -o model.trt.onnx          # the model's own scales
  trt-bridge convert qdq.onnx --int8 --calib-data feeds/ --scales data --report report.json
  trt-bridge convert float.onnx --int8 --calib-data loader.py:load_data --exclude-nodes 'head'
"""


def add_parser(sub) -> None:
    from trt_bridge.calibrate.observers import CalibMethod

    p = sub.add_parser("convert", help="rewrite a quantized model into TensorRT-ready INT8 Q/DQ",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="the input ONNX model (never modified)")
    p.add_argument("--int8", action="store_true", default=True,
                   help="emit INT8 explicit quantization (the default and, for now, only target)")
    p.add_argument("-o", "--output", type=Path,
                   help="output model (default: MODEL.int8.onnx beside the input)")
    calib = p.add_argument_group("calibration")
    calib.add_argument("--calib-data", metavar="DATA",
                       help="an .npz keyed by input name, a folder of .npz/.npy feeds, "
                            "or a data-loader script (loader.py or loader.py:function)")
    calib.add_argument("--calib-random", type=int, metavar="N",
                       help="calibrate on N random feeds (smoke tests only: scales from noise are poor)")
    calib.add_argument("--calib-method", choices=[m.value for m in CalibMethod], default="max",
                       help="how an activation's range is chosen from its histogram (default: max)")
    calib.add_argument("--percentile", type=float, default=99.99,
                       help="percentile for --calib-method percentile (default: 99.99)")
    calib.add_argument("--scales", action="append", metavar="model|data|FILE",
                       help="activation scales of a statically quantized source: 'model' keeps the model's "
                            "(as symmetric int8 covering each range), 'data' re-derives them from the "
                            "calibration data (default: data with --calib-data, else model). A FILE (repeatable; "
                            "a later one wins) is an explicit scale table that wins over everything else: a "
                            "TensorRT calibration cache, a trt-bridge JSON table or an onnxruntime calibration "
                            "table")
    calib.add_argument("--qat", metavar="FILE",
                       help="take scales from quantization-aware training: the QAT model's ONNX export (matched "
                            "by tensor names, then by structure) or a ModelOpt state dict of _amax buffers "
                            "(.npz/.safetensors); they win over the model's own scales and over calibration")
    place = p.add_argument_group("placement")
    place.add_argument("--placement", choices=["tensorrt", "preserve"], default="tensorrt",
                       help="'tensorrt' (default) places Q/DQ where TensorRT fuses best; 'preserve' keeps "
                            "every edge the source quantized")
    place.add_argument("--include-ops", metavar="REGEX",
                       help="also quantize the float inputs of these op types (e.g. 'Add|MatMul')")
    place.add_argument("--exclude-ops", metavar="REGEX", help="never quantize inputs of these op types")
    place.add_argument("--exclude-nodes", metavar="REGEX",
                       help="never quantize inputs of nodes whose name matches (searched; e.g. '^head|/fc')")
    acc = p.add_argument_group("accuracy")
    acc.add_argument("--smooth", type=float, default=0.65, metavar="ALPHA",
                     help="SmoothQuant strength for MatMul inputs: move activation outlier channels into the "
                          "per-channel weights (0 < ALPHA < 1; default 0.65)")
    acc.add_argument("--no-smooth", action="store_true", help="do not smooth MatMul inputs")
    acc.add_argument("--accuracy-target", type=float, metavar="DB",
                     help="give the quantized layers that cost the most accuracy back to higher precision (fewest "
                          "first, by bisection) until the worst output's SNR against MODEL reaches DB")
    acc.add_argument("--accuracy-metric", choices=["snr", "cosine"], default="snr",
                     help="what --accuracy-target measures: the worst output's SNR in dB (default) or its cosine "
                          "similarity to MODEL's (e.g. --accuracy-target 0.999 --accuracy-metric cosine)")
    acc.add_argument("--eval-data", metavar="DATA",
                     help="feeds --accuracy-target measures on (as --calib-data takes them; use held-out data)")
    acc.add_argument("--eval-random", type=int, metavar="N",
                     help="measure --accuracy-target on N random feeds instead (default 8 when no --eval-data)")
    acc.add_argument("--no-recenter", action="store_true",
                     help="do not re-centre one-sided activations (keeps the graph free of the extra Sub/Add)")
    types = p.add_argument_group("types")
    types.add_argument("--high-precision", choices=["fp32", "fp16", "bf16"], default="fp32",
                       help="the type of the layers INT8 leaves alone (TensorRT 11 runs each layer in the type the "
                            "model gives it): fp32 (default), fp16 or bf16 (compute capability 8.0+), with "
                            "normalizations, Softmax, Pow, Exp and reductions kept in fp32 (and, for fp16, tensors "
                            "whose calibrated range exceeds float16's)")
    types.add_argument("--io-types", choices=["keep", "fp16", "bf16"], default="keep",
                       help="keep the model's input/output types (default), or give them the --high-precision type "
                            "too")
    types.add_argument("--bf16", choices=["fp32", "fp16", "keep"], default="fp32",
                       help="what bfloat16 tensors become: fp32 (default; exact, and what onnxruntime's CPU "
                            "calibration and every TensorRT GPU run), fp16 (faster; values must fit), keep")
    p.add_argument("--report", type=Path, metavar="JSON", help="write the conversion report as JSON (as --json FILE)")
    p.add_argument("--skip-check", action="store_true",
                   help="do not run `trt-bridge check` (and TensorRT's parser, when installed) on the output")
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import re
    import sys

    from trt_bridge.calibrate.observers import CalibMethod
    from trt_bridge.cli import EXIT_FAIL, EXIT_OK
    from trt_bridge.convert import ConvertOptions, ScalePolicy, convert
    from trt_bridge.errors import TrtBridgeError
    from trt_bridge.ir.files import write_text_atomic
    from trt_bridge.place.policies import PlacementPolicy
    from trt_bridge.prepare.types import Bf16Policy

    output = args.output or args.model.with_name(args.model.stem + ".int8.onnx")
    if not 0 < args.percentile <= 100:
        raise TrtBridgeError(f"--percentile must be in (0, 100], got {args.percentile}")
    if not 0 < args.smooth < 1:
        raise TrtBridgeError(f"--smooth must be between 0 and 1 (exclusive), got {args.smooth}")
    for flag in ("include_ops", "exclude_ops", "exclude_nodes"):
        pattern = getattr(args, flag)
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise TrtBridgeError(f"--{flag.replace('_', '-')} '{pattern}' is not a regular expression: {exc}") \
                    from exc
    from trt_bridge.calibrate.feed_sources import source_path
    from trt_bridge.cli.common import check_output_path

    policies = [v for v in args.scales or [] if v in ("model", "data")]
    files = tuple(v for v in args.scales or [] if v not in ("model", "data"))
    if len(set(policies)) > 1:
        raise TrtBridgeError("--scales model and --scales data contradict each other; give one.")
    policy = ScalePolicy(policies[0]) if policies else None
    for path in files:
        if not Path(path).is_file():
            raise TrtBridgeError(f"--scales {path}: no such file (and not 'model' or 'data'). Give a scale table: "
                                 "a TensorRT calibration cache, a trt-bridge JSON table or an onnxruntime table.")
    report_path = args.report or (Path(args.json) if args.json not in (None, "-") else None)
    if report_path:
        from trt_bridge.convert import input_files

        probe = ConvertOptions(calib_data=args.calib_data, scale_files=files, qat=args.qat)
        check_output_path(report_path, [args.model, output, output.with_name(output.name + ".data"),
                                        *input_files(args.model, probe), source_path(args.eval_data)], "report")
    options = ConvertOptions(
        calib_data=args.calib_data, calib_random=args.calib_random,
        calib_method=CalibMethod(args.calib_method), percentile=args.percentile,
        smooth=None if args.no_smooth else args.smooth, recenter=not args.no_recenter,
        progress=not args.quiet, placement=PlacementPolicy(args.placement), include_ops=args.include_ops,
        exclude_ops=args.exclude_ops, exclude_nodes=args.exclude_nodes,
        scales=policy, scale_files=files, qat=args.qat, bf16=Bf16Policy(args.bf16),
        check=not args.skip_check, high_precision=args.high_precision, io_types=args.io_types,
    )
    if args.accuracy_target is not None:
        import math
        from dataclasses import asdict

        from trt_bridge.convert.accuracy import convert_to_target

        if not math.isfinite(args.accuracy_target):
            raise TrtBridgeError(f"--accuracy-target must be a finite number of dB, got {args.accuracy_target}")
        if args.accuracy_metric == "cosine" and not -1.0 < args.accuracy_target <= 1.0:
            raise TrtBridgeError(f"--accuracy-target {args.accuracy_target} with --accuracy-metric cosine: a cosine "
                                 "similarity is at most 1 (e.g. 0.999).")
        report, target = convert_to_target(args.model, output, options, args.accuracy_target, args.eval_data,
                                           args.eval_random, args.accuracy_metric)
        report.accuracy = {**asdict(target), "summary": target.summary()}
    elif args.eval_data or args.eval_random or args.accuracy_metric != "snr":
        raise TrtBridgeError("--eval-data, --eval-random and --accuracy-metric are for --accuracy-target; give that "
                             "too.")
    else:
        report = convert(args.model, output, options)
    if report_path:
        write_text_atomic(report_path, report.to_json() + "\n")
    if args.json == "-":
        print(report.to_json())
    elif not args.quiet:
        print(report.summary())
    if report.accuracy is not None and not report.accuracy["met"]:
        print(f"trt-bridge convert: {output} is written, but it misses the accuracy target: "
              f"{report.accuracy['summary']}", file=sys.stderr)
        return EXIT_FAIL
    if report.remaining_blockers:
        print(f"trt-bridge convert: {output} is written, but TensorRT would not build it as INT8: "
              + "; ".join(report.remaining_blockers[:3]), file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK
