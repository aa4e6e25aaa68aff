"""The quantized forms one builder runs (``--trt-module tensorrt_rtx``): what TensorRT-RTX's support matrix lists,
and nothing it would run in float.

TensorRT-RTX runs INT8 and INT4 only as weight-only GEMMs (8.6+), FP8 GEMMs on 8.9+, FP4 GEMMs on 12.0, and every
convolution in float (:data:`trt_bridge.tensorrt.target.SUPPORT`). A Q/DQ it does not run quantized is not free:
MobileNetV2-12's INT8 conversion builds a 18.2 MiB engine for SM 8.9 against 13.7 MiB for its float model, with
its 52 convolutions given back 13.0 MiB. So for that builder each quantized layer becomes the form it runs::

    Before:  x → Q → DQ → Conv(DQ(W int8))      x → Q → DQ → MatMul(DQ(W int8))      x → Q → DQ → Add
    After:   x → Conv(W float)                  x → MatMul(DQ(W int8))               x → Add
             (given back: in float)             (INT8 weight-only GEMM)              (in float)

An FP8 GEMM on 8.9+ and an INT4/FP4 weight-only GEMM stay as they are; a format the target's compute capability
cannot run goes back to float, and so does an INT8 GEMM whose weight is too small to pay for its dequantization
(``MIN_WEIGHT_ONLY``). Each change is reported (``formats``: kind ``layer``, the new form and why).
Datacenter TensorRT (the default) runs W8A8 INT8 convolutions and GEMMs: nothing changes for it.
"""

from __future__ import annotations

import numpy as np

from trt_bridge.annotations import Annotations, drop_layers
from trt_bridge.choices import compute_capability
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.lower.layer_precisions import kind_of_op
from trt_bridge.place.formats import FormatChange, assign_formats
from trt_bridge.tensorrt.target import BUILDERS, KIND_LABELS, runs_as

RTX = "tensorrt_rtx"
#: a weight-only GEMM pays from this many weight elements: TensorRT-RTX's SM 8.9 engine of a 320-element INT8
#: weight-only GEMM is 1.9 KB larger than in float (its dequantization), int8 saving 3 bytes an element
MIN_WEIGHT_ONLY = 4096


def asked_precision(node: str, annotations: Annotations) -> str | None:
    """The precision the annotations ask ``node`` to run in, as ``layer_precisions`` names it: the format of its
    quantized data input ('int8', 'fp8', 'fp4'), else of a weight read with its activations in float ('int4-w',
    'fp4-w', 'int8-w'); None: no quantized input."""
    data = [spec.format for spec in annotations.activations.values() for s in spec.sites if s.node == node]
    if data:
        return data[0].name
    weights = [spec.format for spec in annotations.weights.values() for s in spec.sites if s.node == node]
    return f"{weights[0].name}-w" if weights else None


def builder_forms(graph, annotations: Annotations, module: str | None, target: str | None = None,
                  body: bool = False, where: str = "the model") -> list[FormatChange]:
    """Rewrite ``annotations`` (in place) into the forms ``module`` runs on ``target`` (a compute capability; None:
    any it supports) and return what changed, one entry per layer. Only TensorRT-RTX changes anything: its layers
    that run in float are given back (no Q/DQ: float activations and weights), its INT8 GEMMs become weight-only
    (the activation's Q/DQ removed, the INT8 weight kept). A main graph (not a control-flow ``body``) left with
    nothing quantized is refused, naming ``where`` (the source's path): the float model is what that builder runs."""
    if module != RTX:
        return []
    compute = None if target is None else float(compute_capability(target))
    ops = {node.name: node.op for node in graph.nodes}
    tensors = graph.tensors()
    sites = sorted({s.node for table in (annotations.activations, annotations.weights)  # this graph's: a body's
                    for spec in table.values() for s in spec.sites if s.node in ops})  # layers are its own pass's
    changes: list[FormatChange] = []
    to_float: list[str] = []
    for node in sites:
        precision = asked_precision(node, annotations)
        kind = kind_of_op(ops.get(node, ""))
        if precision is None:
            continue
        runs, _, why = runs_as(module, precision, kind, compute)
        label = f"{precision.upper()} {KIND_LABELS[kind]}"
        if runs is None:
            to_float.append(node)
            changes.append(FormatChange(node, "layer", "float", precision, f"{label}s: {why}"))
        elif runs == "int8-w" and (elements := _weight_elements(tensors, annotations, node)) < MIN_WEIGHT_ONLY:
            to_float.append(node)
            changes.append(FormatChange(node, "layer", "float", precision, f"{label}s: " + (
                f"a weight under {MIN_WEIGHT_ONLY} elements saves less than its dequantization costs" if elements
                else f"{BUILDERS[module]} runs INT8 only as weight-only GEMMs, and this one has no constant weight")))
        elif runs == "int8-w" and precision == "int8":
            drop_layers(annotations, [node], weights=False)  # INT8 weight-only: the activation read in float
            changes.append(FormatChange(node, "layer", "int8-w", precision,
                                        f"{label}s: {BUILDERS[module]}'s INT8 WoQ GEMM, the activation read in float"))
    drop_layers(annotations, to_float)
    if changes and not annotations.activations and not annotations.weights and not body:
        reasons: dict[str, int] = {}
        for change in changes:
            reasons[change.reason] = reasons.get(change.reason, 0) + 1
        why = "; ".join(f"{n} {reason}" for reason, n in sorted(reasons.items(), key=lambda r: (-r[1], r[0])))
        raise UnsupportedPatternError(
            f"{where}: --trt-module {module}: {BUILDERS[module]} runs none of its {len(to_float)} quantized layer(s) "
            f"quantized ({why}): build the float model for it (--high-precision fp16 writes FP16), or drop "
            "--trt-module for datacenter TensorRT's W8A8 INT8")
    return changes


def _weight_elements(tensors: dict, annotations: Annotations, node: str) -> int:
    """The elements of the weights ``node`` reads (0 where their shapes are unknown)."""
    return sum(int(np.prod(tensors[name].shape)) for name, spec in annotations.weights.items()
               if any(s.node == node for s in spec.sites) and name in tensors and tensors[name].shape is not None)


def formats_for(graph, annotations: Annotations, options, approximate, where: str) -> list[FormatChange]:
    """Each annotation's format as ``options`` (:class:`~trt_bridge.conversion.options.ConvertOptions`) ask
    (:func:`~trt_bridge.place.formats.assign_formats`), then the forms its ``--trt-module`` runs; what changed."""
    changes = assign_formats(graph, annotations, options.formats, approximate, options.placement)
    return changes + builder_forms(graph, annotations, options.formats.trt_module,
                                   options.formats.compute_capability, where=where)
