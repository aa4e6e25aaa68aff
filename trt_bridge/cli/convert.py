"""``trt-bridge convert``: rewrite a quantized ONNX model into TensorRT-ready INT8 Q/DQ."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.cli.common import add_output_flags

DESCRIPTION = """\
Rewrite a quantized ONNX model (onnxruntime quantize_dynamic: DynamicQuantizeLinear,
MatMulInteger, ConvInteger) into TensorRT-ready explicit quantization: symmetric int8
QuantizeLinear/DequantizeLinear with zero point 0, per-channel int8 weights, float bias.
Activation scales come from calibration data.

examples:
  trt-bridge convert model.onnx --int8 -o model.trt.onnx --calib-data calib.npz
  trt-bridge convert model.onnx --int8 --calib-data feeds/ --report report.json
  trt-bridge convert model.onnx --int8 --calib-data loader.py:load_data --calib-method mse
"""


def add_parser(sub) -> None:
    from trt_bridge.calibration.observers import CalibMethod

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
    acc = p.add_argument_group("accuracy")
    acc.add_argument("--smooth", type=float, default=0.65, metavar="ALPHA",
                     help="SmoothQuant strength for MatMul inputs: move activation outlier channels into the "
                          "per-channel weights (0 < ALPHA < 1; default 0.65)")
    acc.add_argument("--no-smooth", action="store_true", help="do not smooth MatMul inputs")
    acc.add_argument("--no-recenter", action="store_true",
                     help="do not re-centre one-sided activations (keeps the graph free of the extra Sub/Add)")
    p.add_argument("--report", type=Path, metavar="JSON", help="write the conversion report as JSON")
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trt_bridge.calibration.observers import CalibMethod
    from trt_bridge.convert import ConvertOptions, convert
    from trt_bridge.errors import TrtBridgeError
    from trt_bridge.model import check_writable, write_text_atomic

    output = args.output or args.model.with_name(args.model.stem + ".int8.onnx")
    if not 0 < args.percentile <= 100:
        raise TrtBridgeError(f"--percentile must be in (0, 100], got {args.percentile}")
    if not 0 < args.smooth < 1:
        raise TrtBridgeError(f"--smooth must be between 0 and 1 (exclusive), got {args.smooth}")
    if args.report:
        check_writable(args.report, "report")
    options = ConvertOptions(
        calib_data=args.calib_data, calib_random=args.calib_random,
        calib_method=CalibMethod(args.calib_method), percentile=args.percentile,
        smooth=None if args.no_smooth else args.smooth, recenter=not args.no_recenter,
        progress=not args.quiet,
    )
    report = convert(args.model, output, options)
    if args.report:
        write_text_atomic(args.report, report.to_json() + "\n")
    if args.json:
        print(report.to_json())
    elif not args.quiet:
        print(report.summary())
    return 0
