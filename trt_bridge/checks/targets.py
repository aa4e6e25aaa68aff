"""``check``'s target: a precision the target GPU cannot run is a blocker naming the target.

TensorRT runs FP8 Q/DQ on compute capability 8.9 and newer, INT4 weight-only on 7.5 and newer and FP4 on 10.0 and
newer (:attr:`trt_bridge.formats.QuantFormat.min_compute`); TensorRT-RTX refuses to build them for older targets
(FP4 for SM 8.9: "no implementation"). ``check`` names the precisions the model's layers run in
(:func:`trt_bridge.lower.layer_precisions.layer_precisions`, else its Q/DQ's code types for a model over 2 GB) and
holds each to the target: ``--compute-capability``, else the ``--costs`` build's. :func:`builder_views` says what
each builder runs those layers as (:func:`trt_bridge.tensorrt.target.builder_view`).
"""

from __future__ import annotations

import onnx

from trt_bridge.checks.findings import Finding, Severity
from trt_bridge.choices import compute_capability
from trt_bridge.formats import FORMATS, INT4, INT8, QuantFormat, code_format
from trt_bridge.tensorrt.target import builder_view

#: layer_precisions' names → the format each runs in
_PRECISIONS = {"int8": INT8, "int8-w": INT8, "fp8": FORMATS["fp8"], "int4": INT4, "int4-w": INT4, "fp4": FORMATS["fp4"],
               "fp4-w": FORMATS["fp4"]}


def model_formats(model: onnx.ModelProto | None, precisions: dict | None) -> dict[QuantFormat, int]:
    """The formats the model quantizes in → how many layers run in each (or, for a model over 2 GB whose layers
    are not read, how many Q/DQ use it)."""
    found: dict[QuantFormat, int] = {}
    if precisions is not None:
        for kind, count in precisions.get("counts", {}).items():
            if kind in _PRECISIONS:
                found[_PRECISIONS[kind]] = found.get(_PRECISIONS[kind], 0) + count
        return found
    if model is None:
        return found
    types = {i.name: i.data_type for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            codes = code_format(types.get(node.input[2], 0))
            if codes is not None:
                found[codes.nearest] = found.get(codes.nearest, 0) + 1
    return found


def target_findings(formats: dict[QuantFormat, int], target: str | None, layers: bool = True) -> list[Finding]:
    """A blocker for each format the target cannot run (none without a target)."""
    if target is None:
        return []
    cc = compute_capability(target)
    findings = []
    for fmt, count in formats.items():
        if fmt.runs_on(cc):
            continue
        what = f"{count} layer(s)" if layers else f"{count} Q/DQ node(s)"
        fix = ("with --int8, re-quantizes them in INT8, which every target runs (from the source's ranges, or "
               "--calib-data)" if fmt.activations else f"it keeps {fmt.label} weights {fmt.label}")
        findings.append(Finding(
            "precision-target", Severity.BLOCKER, "", "", [],
            f"{what} run in {fmt.label}, which TensorRT runs on compute capability {fmt.min_compute:g} and newer "
            f"only: the target is compute capability {cc:g} (--compute-capability; build for {fmt.min_compute:g} "
            "or newer to keep it)", fix, fmt.activations))
    return findings


def builder_views(precisions: dict | None, used: str | None, target: str | None,
                  compute_capability: str | None) -> list[dict] | None:
    """The layers as datacenter TensorRT runs them, and as TensorRT-RTX does unless datacenter TensorRT is the
    builder ``used`` (the module whose parser ran; None: none ran, both are shown). TensorRT-RTX's are for
    ``target`` (the check's target or its costs build's), datacenter TensorRT's for ``compute_capability``
    (--compute-capability; None: the GPU it runs on). None for a model whose layers are not read (over 2 GB)."""
    if precisions is None:
        return None
    views = [builder_view(precisions, "tensorrt", compute_capability, used == "tensorrt")]
    if used != "tensorrt":
        views.append(builder_view(precisions, "tensorrt_rtx", target, used == "tensorrt_rtx"))
    return views
