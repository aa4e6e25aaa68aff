"""The choices and limits the options offer, in plain Python: the command line's parsers list them (and the options'
dataclasses check against them) without importing numpy, onnx or onnxruntime, so ``trt-bridge convert --help``
stays light. Each is re-exported by the module that uses it (``trt_bridge.calibrate.observers.CalibMethod``, ...).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from trt_bridge.errors import TrtBridgeError

#: the most feeds a source gives by default (``convert --calib-max``): a data loader that yields forever stops there
FEED_LIMIT = 512

#: how the DynamicInt8Gemm plugin scales its input: one scale per tensor, or one per token (row)
GRANULARITIES = ("tensor", "token")

#: what --block-size takes by default: TensorRT's INT4 weight-only kernels take 32, 64 or 128 (ModelOpt's default)
BLOCK_SIZE = 128
#: the formats --int8/--fp8 name for activations
ACTIVATION_FORMATS = ("int8", "fp8")
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

    def __post_init__(self) -> None:
        if self.compute_capability is not None:
            compute_capability(self.compute_capability)  # a bad value fails before any work
        if self.activations is not None and self.activations not in ACTIVATION_FORMATS:
            raise TrtBridgeError(f"precision {self.activations}: choose int8 or fp8 (--int8, --fp8).")
        if self.weights is not None and self.weights not in WEIGHT_ONLY_FORMATS:
            raise TrtBridgeError(f"weights {self.weights}: only int4 (--int4) is a weight-only format.")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2 \
                or self.block_size & (self.block_size - 1):
            raise TrtBridgeError(f"--block-size must be a power of two of at least 2 (TensorRT's INT4 kernels take "
                                 f"32, 64 or 128), got {self.block_size!r}")
