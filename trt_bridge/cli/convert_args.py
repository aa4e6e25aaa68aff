"""The arguments of ``trt-bridge convert`` (``add_parser``, what its ``--help`` shows): argument groups, one class per
options dataclass (Polygraphy's tools/args style).

Each class adds its flags to a parser (``add_to``) and makes its options from the parsed arguments (``parse``);
the options check their own values (:mod:`trt_bridge.conversion.options`), so the command line and a pipeline
manifest refuse the same values with the same message.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from trt_bridge.choices import (
    BLOCK_SIZE,
    FEED_LIMIT,
    TRT_MODULES,
    Bf16Policy,
    CalibMethod,
    FormatOptions,
    HighPrecision,
    PlacementOptions,
    PlacementPolicy,
)
from trt_bridge.cli.commands import help_of
from trt_bridge.cli.common import add_output_flags
from trt_bridge.conversion.options import (
    ACCURACY_METRICS,
    ACTIVATION_MODES,
    DYNAMIC_GRANULARITIES,
    IO_TYPES,
    PREFER,
    RUNTIME_RANGES,
    AccuracyTarget,
    ActivationOptions,
    CalibrationOptions,
    PrecisionOptions,
    RangeOptions,
    ScaleOptions,
    ScalePolicy,
    SourceOptions,
)
from trt_bridge.errors import TrtBridgeError


class CalibrationArgs:
    """--calib-data, --calib-random, --calib-max, --calib-method, --percentile: :class:`CalibrationOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("calibration")
        group.add_argument("--calib-data", metavar="DATA",
                           help="an .npz keyed by input name, a folder of .npz/.npy feeds, "
                                "or a data-loader script (loader.py or loader.py:function)")
        group.add_argument("--calib-random", type=int, metavar="N",
                           help="calibrate on N random feeds (smoke tests only: scales from noise are poor)")
        group.add_argument("--calib-max", type=int, default=FEED_LIMIT, metavar="N",
                           help="read at most N calibration feeds (default: %(default)s): a data loader that yields "
                                "more, or forever, stops there with a warning")
        group.add_argument("--calib-method", choices=[m.value for m in CalibMethod], default="auto",
                           help="how an activation's range is chosen from its histogram; auto (the default) "
                                "tries max, percentile and mse and keeps the one whose outputs are closest to "
                                "the float model's on held-out calibration feeds (max where another does not "
                                "win by 0.25 dB, or with fewer than 8 feeds)")
        group.add_argument("--percentile", type=float, default=99.99,
                           help="percentile for --calib-method percentile, and the first of auto's two "
                                "percentile candidates (the second clips a tenth as much: 99.999) (default: 99.99)")
        group.add_argument("--no-give-back", dest="give_back", action="store_false",
                           help="with --calib-method auto, keep every layer INT8: by default the few layers (at "
                                "most 5%% of the weighted ones, at least one) whose isolated INT8 SNR is 6 dB or "
                                "more below the median layer's go back to float where the held-out feeds confirm "
                                "a gain")
        group.add_argument("--no-bias-correction", dest="bias_correction", action="store_false",
                           help="with --calib-method auto, keep the convolutions' biases: by default the mean "
                                "shift INT8 activations add to each output channel (measured on 4 calibration "
                                "feeds, where 3 standard errors from zero) is subtracted from its bias where the "
                                "held-out feeds confirm a gain of 0.5 dB")

    def parse(self, args: argparse.Namespace) -> CalibrationOptions:
        return CalibrationOptions(data=args.calib_data, random=args.calib_random,
                                  method=CalibMethod(args.calib_method), percentile=args.percentile,
                                  give_back=args.give_back, bias_correction=args.bias_correction,
                                  max_feeds=args.calib_max)


class ScaleArgs:
    """--scales model|data|FILE, --qat: :class:`ScaleOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("scales")
        group.add_argument("--scales", action="append", metavar="model|data|FILE",
                           help="activation scales of a statically quantized source: 'model' keeps the model's "
                                "(as symmetric int8 covering each range), 'data' re-derives them from the "
                                "calibration data (default: data with --calib-data, else model). A FILE (repeatable; "
                                "a later one wins) is an explicit scale table that wins over everything else: a "
                                "TensorRT calibration cache, a trt-bridge JSON table or an onnxruntime calibration "
                                "table")
        group.add_argument("--qat", metavar="FILE",
                           help="take scales from quantization-aware training: the QAT model's ONNX export (matched "
                                "by tensor names, then by structure) or a ModelOpt state dict of _amax buffers "
                                "(.npz/.safetensors); they win over the model's own scales and over calibration")

    def parse(self, args: argparse.Namespace) -> ScaleOptions:
        policies = [v for v in args.scales or [] if v in ("model", "data")]
        files = tuple(v for v in args.scales or [] if v not in ("model", "data"))
        if len(set(policies)) > 1:
            raise TrtBridgeError("--scales model and --scales data contradict each other; give one.")
        for path in files:
            if not Path(path).is_file():
                raise TrtBridgeError(f"--scales {path}: no such file (and not 'model' or 'data'). Give a scale "
                                     "table: a TensorRT calibration cache, a trt-bridge JSON table or an onnxruntime "
                                     "table.")
        return ScaleOptions(policy=ScalePolicy(policies[0]) if policies else None, files=files, qat=args.qat)


class PlacementArgs:
    """--placement, --include-ops, --exclude-ops, --exclude-nodes: :class:`PlacementOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("placement")
        group.add_argument("--placement", choices=[p.value for p in PlacementPolicy], default="tensorrt",
                           help="'tensorrt' (default) places Q/DQ where TensorRT fuses best; 'preserve' keeps "
                                "every edge the source quantized")
        group.add_argument("--include-ops", metavar="REGEX",
                           help="also quantize the float inputs of these op types (e.g. 'Add|MatMul')")
        group.add_argument("--exclude-ops", metavar="REGEX", help="never quantize inputs of these op types")
        group.add_argument("--exclude-nodes", metavar="REGEX",
                           help="never quantize inputs of nodes whose name matches (searched; e.g. '^head|/fc')")

    def parse(self, args: argparse.Namespace) -> PlacementOptions:
        return PlacementOptions(policy=PlacementPolicy(args.placement), include_ops=args.include_ops,
                                exclude_ops=args.exclude_ops, exclude_nodes=args.exclude_nodes)


class RangeArgs:
    """--smooth, --no-smooth, --no-split-outliers, --no-recenter: :class:`RangeOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("accuracy")
        group.add_argument("--smooth", type=float, default=0.65, metavar="ALPHA",
                           help="SmoothQuant strength for MatMul inputs: move activation outlier channels into the "
                                "per-channel weights (0 < ALPHA < 1; default 0.65)")
        group.add_argument("--no-smooth", action="store_true", help="do not smooth MatMul inputs")
        group.add_argument("--no-split-outliers", dest="split_outliers", action="store_false",
                           help="keep a MatMul input's massive channels (over 3x every other channel's maximum) in "
                                "the int8 path instead of a float side path (with smoothing only)")
        group.add_argument("--no-recenter", action="store_true",
                           help="do not re-centre one-sided activations (keeps the graph free of the extra Sub/Add)")

    def parse(self, args: argparse.Namespace) -> RangeOptions:
        options = RangeOptions(smooth=args.smooth, recenter=not args.no_recenter,  # --smooth is checked either way
                               split_outliers=args.split_outliers)
        return replace(options, smooth=None) if args.no_smooth else options


class AccuracyTargetArgs:
    """--accuracy-target, --accuracy-metric, --eval-data, --eval-random: :class:`AccuracyTarget`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("accuracy target")
        group.add_argument("--accuracy-target", type=float, metavar="DB",
                           help="give the quantized layers that cost the most accuracy back to higher precision "
                                "(fewest first, by bisection) until the worst output's SNR against MODEL reaches DB")
        group.add_argument("--accuracy-metric", choices=ACCURACY_METRICS, default="snr",
                           help="what --accuracy-target measures: the worst output's SNR in dB (default) or its "
                                "cosine similarity to MODEL's (e.g. --accuracy-target 0.999 --accuracy-metric "
                                "cosine)")
        group.add_argument("--eval-data", metavar="DATA",
                           help="feeds --accuracy-target measures on (as --calib-data takes them; use held-out data)")
        group.add_argument("--eval-random", type=int, metavar="N",
                           help="measure --accuracy-target on N random feeds instead (default 8 when no --eval-data)")

    def parse(self, args: argparse.Namespace) -> AccuracyTarget:
        return AccuracyTarget(target=args.accuracy_target, metric=args.accuracy_metric, data=args.eval_data,
                              random=args.eval_random)


class PrecisionArgs:
    """--high-precision, --io-types, --bf16: :class:`PrecisionOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("types")
        group.add_argument("--high-precision", choices=[h.value for h in HighPrecision], default="fp32",
                           help="the type of the layers INT8 leaves alone (TensorRT 11 runs each layer in the type "
                                "the model gives it): fp32 (default), fp16 or bf16 (compute capability 8.0+), with "
                                "normalizations, Softmax, Pow, Exp and reductions kept in fp32 (and, for fp16, "
                                "tensors whose calibrated range exceeds float16's)")
        group.add_argument("--io-types", choices=IO_TYPES, default="keep",
                           help="keep the model's input/output types (default), or give them the --high-precision "
                                "type too")
        group.add_argument("--bf16", choices=["fp32", "fp16", "keep"], default="fp32",
                           help="what bfloat16 tensors become: fp32 (default; exact, and what onnxruntime's CPU "
                                "calibration and every TensorRT GPU run), fp16 (faster; values must fit), keep")

    def parse(self, args: argparse.Namespace) -> PrecisionOptions:
        return PrecisionOptions(high_precision=args.high_precision, io_types=args.io_types,
                                bf16=Bf16Policy(args.bf16))


class ActivationArgs:
    """--activations, --dynamic-granularity, --runtime-ranges: :class:`ActivationOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("activations")
        group.add_argument("--activations", choices=ACTIVATION_MODES, default="static",
                           help="static (default): calibrated INT8 Q/DQ that TensorRT fuses into its own layers; "
                                "dynamic: a dynamically quantized source's MatMuls (or a float model's) become "
                                "trt-bridge's DynamicInt8Gemm plugin, which computes the activation scale per "
                                "inference (no calibration data; engines need the plugin where they run); with "
                                "--compute-capability 10.0+ also TensorRT's own dynamic FP4 (no plugin), measured "
                                "beside it, the more accurate written")
        group.add_argument("--dynamic-granularity", choices=DYNAMIC_GRANULARITIES, default="tensor",
                           help="with --activations dynamic: one scale per tensor, the source's exact math "
                                "(default), or one per token (row), usually more accurate")
        group.add_argument("--runtime-ranges", choices=RUNTIME_RANGES, default="auto",
                           help="quantize Conv/MatMul/Gemm inputs on the range each has in every inference, with "
                                "standard ONNX ops around TensorRT's own INT8 layers (no plugin). auto (default): "
                                "the inputs a dynamically quantized source computed at run time, where the held-out "
                                "calibration feeds show it no worse than calibrated scales and --prefer accepts its "
                                "cost (or where no calibration data is given); on: every input that can, no "
                                "calibration data needed for them; off: calibrated scales only")

        group.add_argument("--prefer", choices=PREFER, default="balanced",
                           help="how auto weighs accuracy against the engine's cost: balanced (default) keeps runtime "
                                "ranges that make the engine over 25%% larger than the static one (an ahead-of-time "
                                "TensorRT-RTX build of each) only for a held-out gain of 1 dB; accuracy keeps any "
                                "gain; size keeps calibrated scales only and gives no layer back to float")

    def parse(self, args: argparse.Namespace) -> ActivationOptions:
        return ActivationOptions(mode=args.activations, granularity=args.dynamic_granularity,
                                 runtime_ranges=args.runtime_ranges, prefer=args.prefer)


class FormatArgs:
    """--int8, --fp8, --int4, --block-size: :class:`FormatOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("formats")
        precision = group.add_mutually_exclusive_group()
        precision.add_argument("--int8", dest="precision", action="store_const", const="int8",
                               help="quantize activations, and the weights of the layers they feed, in INT8 (the "
                                    "default for a float or integer source; an FP8 source's activations are "
                                    "re-quantized)")
        precision.add_argument("--fp8", dest="precision", action="store_const", const="fp8",
                               help="quantize them in FP8 E4M3 (compute capability 8.9+; the default for an FP8 "
                                    "source): calibrated as INT8 is, with TensorRT's placement")
        precision.add_argument("--fp4", dest="precision", action="store_const", const="fp4",
                               help="NVFP4 W4A4 (compute capability 10.0+, with --compute-capability): MatMul/Gemm "
                                    "activations quantized per inference in FP4 blocks of 16 (TensorRT's "
                                    "TRT_FP4DynamicQuantize, a calibrated global scale) and their weights in FP4 "
                                    "blocks; the other quantized layers FP8")
        group.add_argument("--fp8-nodes", metavar="REGEX",
                           help="with --fp4: the layers (node names) written FP8 instead of FP4 (--accuracy-target "
                                "under --fp4 moves layers to FP8 this way before any goes to float)")
        group.add_argument("--int4", dest="weights", action="store_const", const="int4",
                           help="2-D MatMul/Gemm weights in INT4 blocks along their reduction axis (INT4 weight-only: "
                                "their activations stay in the high precision; --int8/--fp8 still quantize the other "
                                "layers); the default for a source with INT4 block-wise weights or MatMulNBits")
        group.add_argument("--block-size", type=int, default=BLOCK_SIZE, metavar="N",
                           help="the INT4 block length along the reduction axis (default: %(default)s)")
        group.add_argument("--compute-capability", metavar="X.Y",
                           help="the GPU the output must run on (8.6, 8.9, 12.0, ...): a source's FP4 (NVFP4/MXFP4) "
                                "weights stay FP4 for 10.0 and newer, else become INT4 blocks (reported); the output's "
                                "check holds its precisions to it (FP8 below 8.9, FP4 below 10.0: a blocker) and "
                                "builds its costs for it (default: no target; the check's costs build for 8.9)")
        group.add_argument("--trt-module", choices=TRT_MODULES, default=None,
                           help="the TensorRT the engine will be built with. tensorrt_rtx writes only the quantized "
                                "forms TensorRT-RTX's support matrix runs: its INT8 GEMMs weight-only, the layers it "
                                "runs in float (every quantized convolution, FP8 below 8.9) given back to float, "
                                "each reported; tensorrt (datacenter TensorRT, the default form): W8A8 INT8 "
                                "convolutions and GEMMs")

    def parse(self, args: argparse.Namespace) -> FormatOptions:
        return FormatOptions(activations=args.precision, weights=args.weights, block_size=args.block_size,
                             compute_capability=getattr(args, "compute_capability", None),
                             trt_module=getattr(args, "trt_module", None),
                             fp8_nodes=getattr(args, "fp8_nodes", None))


class SourceArgs:
    """--constant-inputs: :class:`SourceOptions`."""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("source")
        group.add_argument("--constant-inputs", metavar="NAME=VALUE[,...]",
                           help="inputs the output holds as these constants (e.g. sr=16000): the Ifs that branch on "
                                "them are inlined, one output per value (TensorRT builds no If whose branches hold an "
                                "LSTM's state or another If, as Silero VAD's sample-rate If does); calibration feeds "
                                "leave them out")

    def parse(self, args: argparse.Namespace) -> SourceOptions:
        return SourceOptions(constant_inputs=args.constant_inputs)


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
  trt-bridge convert dynamic.onnx --activations dynamic -o model.plugin.onnx   # no calibration data
"""


CALIBRATION, SCALES, PLACEMENT, RANGES, TARGET, PRECISION, ACTIVATIONS, FORMATS, SOURCE = (
    CalibrationArgs(), ScaleArgs(), PlacementArgs(), RangeArgs(), AccuracyTargetArgs(), PrecisionArgs(),
    ActivationArgs(), FormatArgs(), SourceArgs())


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help=help_of("convert"),
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="the input ONNX model (never modified)")
    p.add_argument("-o", "--output", type=Path,
                   help="output model (default: MODEL.int8.onnx beside the input; .fp8/.int4 with --fp8/--int4)")
    FORMATS.add_to(p)
    for group in (CALIBRATION, SCALES, PLACEMENT, RANGES, TARGET, PRECISION, ACTIVATIONS, SOURCE):
        group.add_to(p)
    p.add_argument("--report", type=Path, metavar="JSON", help="write the conversion report as JSON (as --json FILE)")
    p.add_argument("--skip-check", action="store_true",
                   help="do not run `trt-bridge check` (and TensorRT's parser, when installed) on the output")
    add_output_flags(p)
