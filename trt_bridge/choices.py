"""The choices and limits the options offer, in plain Python: the command line's parsers list them (and the options'
dataclasses check against them) without importing numpy, onnx or onnxruntime, so ``trt-bridge convert --help``
stays light. Each is re-exported by the module that uses it (``trt_bridge.calibrate.observers.CalibMethod``, ...).
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field

from trt_bridge.errors import OptionError, TrtBridgeError

#: the most feeds a source gives by default (``convert --calib-max``): a data loader that yields forever stops there
FEED_LIMIT = 512

#: how the DynamicInt8Gemm plugin scales its input: one scale per tensor, or one per token (row)
GRANULARITIES = ("tensor", "token")

#: what --block-size takes by default: TensorRT's INT4 weight-only kernels take 32, 64 or 128 (ModelOpt's default)
BLOCK_SIZE = 128
#: the formats --int8/--fp8 name for activations
ACTIVATION_FORMATS = ("int8", "fp8", "fp4")
#: the formats a weight-only flag names
WEIGHT_ONLY_FORMATS = ("int4",)


def compute_capability_digits(text: str) -> str:
    """'8.9' / 'SM89' / 'sm_89' / '89' / '12.0' → '89' / '120' (what ``--compute-capability`` takes)."""
    match = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d))?", str(text).strip().lower())
    if match and match.group(2) is not None:
        return match.group(1) + match.group(2)
    if match and len(match.group(1)) >= 2:
        return match.group(1)
    raise TrtBridgeError(f"--compute-capability '{text}' is not a compute capability such as 8.9 or 12.0.")


def compute_capability(text: str) -> float:
    """'8.9' / 'SM89' / 'sm_89' / '89' / '12.0' → 8.9 / 12.0."""
    digits = compute_capability_digits(text)
    return float(f"{digits[:-1]}.{digits[-1]}")


class CalibMethod(str, enum.Enum):
    MAX = "max"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MSE = "mse"
    AUTO = "auto"


class HighPrecision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class Bf16Policy(str, enum.Enum):
    KEEP = "keep"
    FP16 = "fp16"
    FP32 = "fp32"


class PlacementPolicy(str, enum.Enum):
    TENSORRT = "tensorrt"
    PRESERVE = "preserve"


@dataclass(frozen=True)
class PlacementOptions:
    """Which tensors get Q/DQ: the policy (``--placement``) and the op types and nodes added or left out."""

    policy: PlacementPolicy = field(default=PlacementPolicy.TENSORRT, metadata={"key": "placement"})
    include_ops: str | None = None  # regex on op types whose float inputs are quantized too
    exclude_ops: str | None = None  # regex on op types never quantized
    exclude_nodes: str | None = None  # regex (searched) on node names never quantized

    def __post_init__(self) -> None:
        for flag in ("include_ops", "exclude_ops", "exclude_nodes"):
            pattern = getattr(self, flag)
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise TrtBridgeError(f"--{flag.replace('_', '-')} '{pattern}' is not a regular expression: "
                                         f"{exc}") from exc


#: the TensorRT modules a conversion can be written for (--trt-module)
TRT_MODULES = ("tensorrt", "tensorrt_rtx")


@dataclass(frozen=True)
class FormatOptions:
    """``--int8``/``--fp8`` (activations and their layers' weights), ``--int4`` (MatMul/Gemm weights in blocks) and
    ``--block-size``."""

    activations: str | None = field(default=None, metadata={"key": "precision"})  # None: the source's, else INT8
    weights: str | None = None  # "int4": weight-only blocks for MatMul/Gemm
    block_size: int = BLOCK_SIZE
    #: the GPU the output must run on (--compute-capability X.Y): FP4 sources stay FP4 for 10.0 and newer, else
    #: INT4 blocks; also the target of convert's own check. None: no target (FP4 approximated)
    compute_capability: str | None = None
    #: the TensorRT the engine is built with (--trt-module): tensorrt_rtx writes only the quantized forms its support
    #: matrix runs (conversion/builder_forms.py); None or tensorrt: datacenter TensorRT's (W8A8 INT8 everywhere)
    trt_module: str | None = None
    #: with --fp4 (--fp8-nodes REGEX): the layers, by node name, whose activations are FP8 instead of FP4 (the
    #: accuracy target's fallback under --fp4)
    fp8_nodes: str | None = None

    def __post_init__(self) -> None:
        if self.fp8_nodes is not None:
            if self.activations != "fp4":
                raise OptionError("--fp8-nodes names the layers --fp4 writes in FP8 instead: give it with --fp4.")
            try:
                re.compile(self.fp8_nodes)
            except re.error as exc:
                raise OptionError(f"--fp8-nodes '{self.fp8_nodes}' is not a regular expression: {exc}") from exc
        if self.trt_module is not None and self.trt_module not in TRT_MODULES:
            raise TrtBridgeError(f"--trt-module {self.trt_module}: choose {' or '.join(TRT_MODULES)}.")
        if self.compute_capability is not None:
            compute_capability(self.compute_capability)  # a bad value fails before any work
        if self.activations == "fp4" and (self.compute_capability is None
                                          or compute_capability(self.compute_capability) < 10.0):
            said = ("no --compute-capability was given" if self.compute_capability is None
                    else f"--compute-capability {self.compute_capability} runs no FP4")
            raise OptionError(f"--fp4 (NVFP4 W4A4) runs on compute capability 10.0 and newer (B200 10.0, RTX "
                              f"50-series 12.0), and {said}: add --compute-capability 10.0 or 12.0, or use --fp8 "
                              "(8.9+) or --int4 (INT4 weight-only, 7.5+).")
        if self.activations is not None and self.activations not in ACTIVATION_FORMATS:
            raise TrtBridgeError(f"precision {self.activations}: choose int8, fp8 or fp4 (--int8, --fp8, --fp4).")
        if self.weights is not None and self.weights not in WEIGHT_ONLY_FORMATS:
            raise TrtBridgeError(f"weights {self.weights}: only int4 (--int4) is a weight-only format.")
        check_bound("block_size", self.block_size)
        if self.block_size & (self.block_size - 1):
            raise TrtBridgeError(BOUNDS["block_size"].message(self.block_size))


#: the most feeds any option asks for (--calib-max, --calib-random, --eval-random, verify --random, --layer-feeds)
MAX_FEEDS = 1_000_000


@dataclass(frozen=True)
class Bound:
    """The values a numeric option takes: ``low`` to ``high`` (``open_low``/``open_high``: that end excluded),
    integers where ``integer``; ``says`` replaces the generic range in the message (``{value}`` is the value)."""

    flag: str
    low: float
    high: float
    integer: bool = True
    open_low: bool = False
    open_high: bool = False
    says: str = ""

    def holds(self, value) -> bool:
        low_ok = value > self.low if self.open_low else value >= self.low
        high_ok = value < self.high if self.open_high else value <= self.high
        return low_ok and high_ok

    def message(self, value) -> str:
        if self.says:
            return self.says.format(value=value, flag=self.flag)
        if self.integer:
            low = "0 or more" if self.low == 0 else f"at least {self.low}"
            return f"{self.flag} must be {low} and at most {self.high}, got {value!r}."
        ends = ("(" if self.open_low else "[", ")" if self.open_high else "]")
        return f"{self.flag} must be in {ends[0]}{self.low:g}, {self.high:g}{ends[1]}, got {value!r}"


#: every numeric option of every command (argparse ``dest`` → its bound), checked where it enters: the command line
#: and the Python API (``trt_bridge.cli.common.check_bounds``) and each options dataclass (:func:`check_bound`).
#: ``tests/test_bounds.py`` fails for a numeric flag missing here.
BOUNDS = {
    # convert
    "calib_random": Bound("--calib-random", 1, MAX_FEEDS),
    "calib_max": Bound("--calib-max", 1, MAX_FEEDS),
    "eval_random": Bound("--eval-random", 1, MAX_FEEDS),
    "percentile": Bound("--percentile", 0, 100, False, open_low=True),
    "smooth": Bound("--smooth", 0, 1, False, True, True,
                    "{flag} must be between 0 and 1 (exclusive), got {value!r}"),
    "accuracy_target": Bound("--accuracy-target", -1000, 1000, False,
                             says="{flag} must be a finite number of dB from -1000 to 1000 (or a cosine similarity "
                                  "up to 1), got {value!r}"),
    "block_size": Bound("--block-size", 2, 4096,
                        says="{flag} must be a power of two from 2 to 4096 (TensorRT's INT4 kernels take 32, 64 or "
                             "128), got {value!r}"),
    # verify
    "random": Bound("--random", 1, MAX_FEEDS),
    "seed": Bound("--seed", 0, 2**128 - 1, says="{flag} must be a non-negative integer below 2**128, got {value!r}."),
    "top_k": Bound("--top-k", 1, 1_000_000),
    "prompts": Bound("--prompts", 1, 100_000),
    "steps": Bound("--steps", 1, 2**20),
    "prompt_length": Bound("--prompt-length", 1, 2**20),
    "min_token_agreement": Bound("--min-token-agreement", 0, 100, False,
                                 says="{flag} is a percentage from 0 to 100, got {value!r}"),
    "layer_batch": Bound("--layer-batch", 1, 100_000),
    "layer_feeds": Bound("--layer-feeds", 1, MAX_FEEDS),
    # bench
    "iterations": Bound("--iterations", 1, 10_000_000),
    "warmup": Bound("--warmup", 0, 10_000_000),
    "duration": Bound("--duration", 0, 86_400, False,
                      says="{flag} must be a finite number of seconds (0 or more, at most 86400: a day), got "
                           "{value!r}."),
    "threads": Bound("--threads", 1, 1024),
    # build (and the costs builds of check, verify, bench)
    "workspace": Bound("--workspace", 1, 2**40,
                       says="{flag} {value}: give a positive size of at most 1T (1099511627776 bytes), such as 1G or "
                            "512M."),
    "optimization_level": Bound("--builder-optimization-level", 0, 5,
                                says="{flag} {value}: TensorRT takes 0 to 5 (default 3; higher builds longer and may "
                                     "find faster kernels)."),
}

#: the largest dimension and the most elements of one input in --shapes, --min/--opt/--max-shapes (TensorRT's
#: dimensions and volumes are int32 in its kernels: 2**31 - 1)
MAX_DIMENSION = 2**31 - 1
MAX_VOLUME = 2**31 - 1


def check_bound(dest: str, value) -> None:
    """Refuse ``value`` for the option ``dest`` (a key of :data:`BOUNDS`) outside its bound, or of the wrong kind (a
    float for an integer, NaN, a bool); None (the option not given) passes."""
    if value is None:
        return
    bound = BOUNDS[dest]
    if bound.integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise TrtBridgeError(f"{bound.flag} takes an integer, got {value!r}.")
    if not bound.integer and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TrtBridgeError(f"{bound.flag} takes a number, got {value!r}.")
    if not bound.integer and not math.isfinite(value) or not bound.holds(value):
        raise TrtBridgeError(bound.message(value))
