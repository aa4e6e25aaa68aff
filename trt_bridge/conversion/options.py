"""The options of a conversion: frozen sub-options, one per concern, each checking itself when it is made.

``ConvertOptions`` composes them. ``trt-bridge convert`` fills each from one argument group
(:mod:`trt_bridge.cli.convert_args`) and a pipeline manifest from its ``convert:`` table
(:mod:`trt_bridge.manifest.schema`), so both refuse the same values with the same message: the one
``__post_init__`` raises, which names the command-line flag. A field whose manifest key differs from its name
says so in its metadata (see :func:`option_key`).
"""

from __future__ import annotations

import enum
from dataclasses import Field, dataclass, field

from trt_bridge.choices import (
    FEED_LIMIT,
    GRANULARITIES,
    Bf16Policy,
    CalibMethod,
    FormatOptions,
    HighPrecision,
    PlacementOptions,
    check_bound,
)
from trt_bridge.errors import TrtBridgeError

#: what --io-types takes: the model's own input/output types, or the --high-precision type
IO_TYPES = ("keep", "fp16", "bf16")
#: what --accuracy-metric takes
ACCURACY_METRICS = ("snr", "cosine")


def option_key(f: Field) -> str:
    """The name of an options field in a pipeline manifest's ``convert:`` table:
    ``metadata["key"]`` where the field has one, else the field's own name."""
    return f.metadata.get("key", f.name)


class ScalePolicy(str, enum.Enum):
    """Where activation scales that the source model carries come from."""

    MODEL = "model"  # the symmetric int8 scale covering each source (scale, zero point) range
    DATA = "data"  # re-derived from calibration data (recovers the bit lost on one-sided ranges)


@dataclass(frozen=True)
class CalibrationOptions:
    """What calibration runs on (``--calib-data`` or ``--calib-random``) and how it chooses each range."""

    data: str | None = field(default=None, metadata={"key": "calib_data"})  # .npz, folder or loader.py[:fn]
    random: int | None = field(default=None, metadata={"key": "calib_random"})  # N random feeds (smoke tests)
    #: auto: max, percentile or mse, whichever gives the float outputs on held-out calibration feeds
    method: CalibMethod = field(default=CalibMethod.AUTO, metadata={"key": "calib_method"})
    percentile: float = 99.99  # for CalibMethod.PERCENTILE
    #: with auto: the few layers whose INT8 costs most on the held-out feeds go back to float (conversion/give_back.py)
    give_back: bool = True
    #: with auto: convolution biases corrected for the mean shift INT8 activations add (conversion/bias_correction.py)
    bias_correction: bool = True
    #: the most calibration feeds read (--calib-max): a data loader that yields forever stops there, with a warning
    max_feeds: int = field(default=FEED_LIMIT, metadata={"key": "calib_max"})

    def __post_init__(self) -> None:
        check_bound("calib_max", self.max_feeds)
        check_bound("calib_random", self.random)
        check_bound("percentile", self.percentile)


@dataclass(frozen=True)
class ScaleOptions:
    """Where activation scales come from besides calibration: the source model, scale files, a QAT export."""

    #: --scales model|data; None: data when calibration data is given, else model
    policy: ScalePolicy | None = field(default=None, metadata={"key": "scales"})
    #: explicit scale tables (--scales FILE; a later one wins): they win over everything else
    files: tuple[str, ...] = field(default=(), metadata={"key": "scale_files"})
    qat: str | None = None  # a QAT ONNX export or ModelOpt state dict (--qat): wins over the model and calibration


@dataclass(frozen=True)
class RangeOptions:
    """How activation ranges are made to fit int8: SmoothQuant on MatMul inputs, re-centring one-sided ones."""

    smooth: float | None = 0.65  # SmoothQuant alpha for MatMul inputs; None: off
    recenter: bool = True
    split_outliers: bool = True  # a MatMul input's massive channels computed in float (with smooth only)

    def __post_init__(self) -> None:
        check_bound("smooth", self.smooth)


@dataclass(frozen=True)
class PrecisionOptions:
    """The types of what is not INT8: the rest of the graph, the model's inputs and outputs, bfloat16 tensors."""

    high_precision: str = "fp32"  # the non-quantized part of the graph: fp32, fp16 or bf16 (sensitive ops stay fp32)
    io_types: str = "keep"  # with fp16/bf16 high precision: keep the inputs/outputs' types, or that type too
    bf16: Bf16Policy = Bf16Policy.FP32  # what bfloat16 tensors become (onnxruntime's CPU runs no bfloat16)

    def __post_init__(self) -> None:
        choices = [h.value for h in HighPrecision]
        if self.high_precision not in choices:
            raise TrtBridgeError(f"--high-precision {self.high_precision}: choose one of {', '.join(choices)}.")
        if self.io_types not in IO_TYPES:
            raise TrtBridgeError(f"--io-types {self.io_types}: choose keep, fp16 or bf16.")
        if self.io_types != "keep" and self.io_types != self.high_precision:
            raise TrtBridgeError(f"--io-types {self.io_types} gives the model's inputs and outputs the type of "
                                 f"--high-precision, which is {self.high_precision}: pass --high-precision "
                                 f"{self.io_types}, or --io-types keep.")


#: what --activations takes: calibrated Q/DQ, or trt-bridge's dynamic INT8 GEMM plugin
ACTIVATION_MODES = ("static", "dynamic")
#: what --dynamic-granularity takes
DYNAMIC_GRANULARITIES = GRANULARITIES
#: what --runtime-ranges takes
RUNTIME_RANGES = ("auto", "on", "off")
#: what --prefer takes (conversion/runtime_choice.py: weigh)
PREFER = ("balanced", "accuracy", "size")


@dataclass(frozen=True)
class ActivationOptions:
    """How activations are quantized: ``static`` (calibrated Q/DQ, TensorRT's own INT8 layers; or with runtime ranges,
    see ``runtime_ranges``) or
    ``dynamic`` (trt-bridge's DynamicInt8Gemm plugin, for a dynamically quantized source's MatMuls and a float
    model's: scales computed per inference, no calibration data), per tensor (a dynamic source's exact math) or
    per token."""

    mode: str = field(default="static", metadata={"key": "activations"})
    granularity: str = field(default="tensor", metadata={"key": "dynamic_granularity"})
    #: activations quantized on their range in each inference, in standard ops (lower/runtime_ranges.py): auto, for
    #: those a dynamic source quantized so, where the held-out feeds show it beats calibrated scales; on: every
    #: activation that can (no calibration data needed for them); off: calibrated scales only
    runtime_ranges: str = "auto"
    #: how auto weighs accuracy against the engine's cost (conversion/runtime_choice.py weigh): balanced keeps runtime
    #: ranges that grow the engine over 25 % only for 1 dB; accuracy keeps any gain; size keeps none and gives no
    #: layer back to float
    prefer: str = "balanced"

    def __post_init__(self) -> None:
        if self.prefer not in PREFER:
            raise TrtBridgeError(f"--prefer {self.prefer}: choose balanced, accuracy or size.")
        if self.mode not in ACTIVATION_MODES:
            raise TrtBridgeError(f"--activations {self.mode}: choose static or dynamic.")
        if self.runtime_ranges not in RUNTIME_RANGES:
            raise TrtBridgeError(f"--runtime-ranges {self.runtime_ranges}: choose auto, on or off.")
        if self.granularity not in DYNAMIC_GRANULARITIES:
            raise TrtBridgeError(f"--dynamic-granularity {self.granularity}: choose tensor or token.")
        if self.granularity != "tensor" and self.mode != "dynamic":
            raise TrtBridgeError(f"--dynamic-granularity {self.granularity} is for --activations dynamic; give "
                                 "that too.")


@dataclass(frozen=True)
class SourceOptions:
    """What the source is taken as: ``constant_inputs`` ("NAME=VALUE[,NAME=VALUE]") are inputs the output holds as
    those constants (``--constant-inputs``; conversion/constant_inputs.py), so the Ifs that branch on them are
    inlined: one model per value, where TensorRT builds no If whose branches hold what it cannot nest."""

    constant_inputs: str | None = None

    def __post_init__(self) -> None:
        self.values()

    def values(self) -> dict[str, float]:
        """Input name → its constant value."""
        found: dict[str, float] = {}
        for item in (self.constant_inputs or "").split(","):
            if not item.strip():
                continue
            name, equals, text = item.partition("=")
            try:
                value = float(text)
            except ValueError:
                value = float("nan")
            if not equals or not name.strip() or value != value or value in (float("inf"), float("-inf")):
                raise TrtBridgeError(f"--constant-inputs {self.constant_inputs}: give NAME=VALUE pairs separated by "
                                     "commas, each VALUE a finite number (e.g. sr=16000).")
            if name.strip() in found:
                raise TrtBridgeError(f"--constant-inputs {self.constant_inputs}: '{name.strip()}' is given twice.")
            found[name.strip()] = value
        return found


@dataclass(frozen=True)
class ConvertOptions:
    """Every option of a conversion (``trt-bridge convert``'s flags but -o, --report, --json and the accuracy
    target), by concern."""

    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    scales: ScaleOptions = field(default_factory=ScaleOptions)
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    ranges: RangeOptions = field(default_factory=RangeOptions)
    precision: PrecisionOptions = field(default_factory=PrecisionOptions)
    activations: ActivationOptions = field(default_factory=ActivationOptions)
    formats: FormatOptions = field(default_factory=FormatOptions)
    source: SourceOptions = field(default_factory=SourceOptions)
    check: bool = True  # run `trt-bridge check` on the output (with TensorRT's parser when installed)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.activations.mode == "dynamic" and (self.formats.activations == "fp8" or self.formats.weights):
            flag = "--fp8" if self.formats.activations == "fp8" else "--int4"
            raise TrtBridgeError(f"--activations dynamic puts MatMuls into trt-bridge's INT8 plugin, which {flag} "
                                 f"cannot change: drop one of them ({flag} with static activations is TensorRT's own "
                                 "layers).")


@dataclass(frozen=True)
class AccuracyTarget:
    """``convert --accuracy-target``: the accuracy the converted model must reach against the source, and the
    feeds it is measured on (``target`` None: no target, the plain conversion)."""

    target: float | None = None  # the worst output's SNR in dB, or its cosine similarity with metric "cosine"
    metric: str = "snr"
    data: str | None = None  # evaluation feeds, as CalibrationOptions.data takes them (use held-out data)
    random: int | None = None  # N random evaluation feeds instead

    def __post_init__(self) -> None:
        if self.metric not in ACCURACY_METRICS:
            raise TrtBridgeError(f"--accuracy-metric {self.metric}: choose snr or cosine.")
        check_bound("eval_random", self.random)
        if self.target is None:
            if self.data or self.random or self.metric != "snr":
                raise TrtBridgeError("--eval-data, --eval-random and --accuracy-metric are for --accuracy-target; "
                                     "give that too.")
            return
        check_bound("accuracy_target", self.target)
        if self.metric == "cosine" and not -1.0 < self.target <= 1.0:
            raise TrtBridgeError(f"--accuracy-target {self.target} with --accuracy-metric cosine: a cosine "
                                 "similarity is at most 1 (e.g. 0.999).")

