"""The canonical form that every lift rule produces.

A lifted model is a plain float graph plus annotations: which tensors are meant to
be quantized, with which scale (if known yet), on which axis, and where that scale
came from. Placement, calibration and lowering work on this form only, so no rule
needs to know about the others.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

import numpy as np

from trt_bridge.formats import INT8, INT8_QMAX, QuantFormat

#: INT8's largest code: the unit ranges travel in (a tensor whose largest magnitude is amax has scale amax / QMAX,
#: whatever its format; :meth:`trt_bridge.formats.QuantFormat.scale_of` gives its own format's scale)
QMAX = INT8_QMAX


class ScaleSource(str, enum.Enum):
    """Where a quantization scale came from (recorded in the report)."""

    CALIBRATION = "calibration"  # observed on calibration feeds
    MODEL = "model"  # taken from a static scale in the source model
    EXACT_WEIGHTS = "exact-weights"  # the source's own symmetric codes (int8, fp8, int4), kept bit-exact
    REQUANTIZED = "requantized-weights"  # float (dequantized) weights quantized symmetric per channel
    FILE = "file"  # an explicit scale table (--scales FILE: TensorRT cache, JSON, onnxruntime table)
    QAT = "qat"  # quantization-aware training: a QAT ONNX export or a ModelOpt state dict (--qat)


@dataclass(frozen=True)
class Site:
    """One input edge that should read a quantized value: ``node.inputs[index]``."""

    node: str
    index: int


@dataclass
class ActivationSpec:
    """A float activation tensor that is quantized per tensor in the output."""

    tensor: str
    sites: list[Site]
    origin: str  # the source node this annotation was lifted from
    scale: float | None = None  # amax / QMAX (INT8's unit, whatever ``format``); None: needs calibration
    source: ScaleSource | None = None
    #: the float range [lo, hi] the source's (scale, zero point) codes cover, when the scale is the model's
    model_range: tuple[float, float] | None = None
    #: the source computed this tensor's scale in every inference (onnxruntime's DynamicQuantizeLinear)
    dynamic: bool = False
    #: lowered with runtime ranges (:mod:`trt_bridge.lower.runtime_ranges`): no scale, no calibration
    runtime: bool = False
    #: the format the output quantizes it in (the source's where TensorRT runs it; placement may change it)
    format: QuantFormat = INT8
    placed: bool = False  # added by placement (the source did not quantize it)
    lifted_by: str = ""  # the lift rule that wrote a source's FP4 activation (its approximations are reported by it)


@dataclass
class WeightSpec:
    """A constant weight tensor (float, in the lifted graph) to be emitted as codes of ``format`` +
    DequantizeLinear.

    ``codes`` and ``scale`` are set when the source model already had exact symmetric codes of that format;
    otherwise lowering quantizes the float values symmetric per output channel along ``axis`` (``block_size`` 0)
    or per block of ``block_size`` values along the weight's reduction axis (INT4, FP4).
    """

    tensor: str
    sites: list[Site]
    axis: int  # output-channel axis for per-channel quantization
    origin: str
    codes: np.ndarray | None = None  # of ``format.dtype``
    #: 0-d (per tensor), 1-d along ``axis``, or blocked: the weight's rank, the reduction axis divided in blocks
    scale: np.ndarray | None = None
    source: ScaleSource = ScaleSource.REQUANTIZED
    format: QuantFormat = INT8
    block_size: int = 0  # 0: per tensor or per channel
    placed: bool = False  # added by placement (the source did not quantize it)


@dataclass
class Annotations:
    activations: dict[str, ActivationSpec] = field(default_factory=dict)
    weights: dict[str, WeightSpec] = field(default_factory=dict)

    def add_activation(self, tensor: str, site: Site, origin: str, scale: float | None = None,
                       source: ScaleSource | None = None, dynamic: bool = False) -> None:
        spec = self.activations.get(tensor)
        if spec is None:
            self.activations[tensor] = ActivationSpec(tensor, [site], origin, scale, source, dynamic=dynamic)
            return
        if site not in spec.sites:
            spec.sites.append(site)
        spec.dynamic = spec.dynamic or dynamic
        if spec.scale is None and scale is not None:
            spec.scale, spec.source = scale, source

    def add_weight(self, spec: WeightSpec) -> None:
        existing = self.weights.get(spec.tensor)
        if existing is None:
            self.weights[spec.tensor] = spec
        else:
            existing.sites.extend(s for s in spec.sites if s not in existing.sites)

    def move_weight_site(self, old: str, site: Site, new: WeightSpec) -> None:
        """``site`` now reads the weight ``new`` (added if new) instead of ``old``; ``old`` goes once no site reads
        it."""
        self.add_weight(replace(new, sites=[site]))
        spec = self.weights[old]
        spec.sites = [s for s in spec.sites if s != site]
        if not spec.sites:
            del self.weights[old]

    def needing_calibration(self) -> list[str]:
        return sorted(name for name, spec in self.activations.items() if spec.scale is None and not spec.runtime)


def drop_layers(annotations: Annotations, layers, weights: bool = True) -> None:
    """Remove every quantization site of ``layers`` (node names) in place: their inputs stay float (with ``weights``
    False, their activations only: the layers become weight-only)."""
    layers = set(layers)
    for table in (annotations.activations, annotations.weights) if weights else (annotations.activations,):
        for name in list(table):
            spec = table[name]
            spec.sites = [s for s in spec.sites if s.node not in layers]
            if not spec.sites:
                del table[name]
