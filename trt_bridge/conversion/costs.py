"""The written model's engine costs against the float model's (the report's ``costs``).

``check`` builds the written model ahead of time for ``COST_TARGET`` and reports its engine size and activation
memory (:func:`trt_bridge.checks.tensorrt_run.measure_costs`); the float model the source was lifted to, kept aside
before lowering (:func:`keep_float`), is built the same way as the reference. The report adds what makes the difference:
activations whose range is computed in each inference, layers given back to float. An engine larger than the float
model's is a warning naming why and what writes a smaller one (:func:`larger_than_float`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from trt_bridge.ir.save import save_model
from trt_bridge.tensorrt.build import costs_or_none
from trt_bridge.tensorrt.costs import COST_TARGET


def keep_float(lifted: onnx.ModelProto) -> tempfile.TemporaryDirectory:
    """A temporary folder holding ``lifted`` as ``float.onnx`` (removed when :func:`against_float` is done)."""
    folder = tempfile.TemporaryDirectory(prefix="trt-bridge-float-")
    save_model(lifted, Path(folder.name) / "float.onnx")
    return folder


def against_float(costs, float_copy: tempfile.TemporaryDirectory | None, large: bool,
                  target: str | None = None, profiles: tuple = ()) -> dict | None:
    """The report's ``costs``: ``costs`` (the written model's, :class:`~trt_bridge.tensorrt.costs.EngineCosts` or
    None) against the float model in ``float_copy``'s (None: not kept), built for the same ``target`` (convert's
    --compute-capability; None: ``COST_TARGET``) and ``profiles`` (the check's)."""
    if costs is None:
        if float_copy is not None:
            float_copy.cleanup()
        return None
    reference, why = None, "a model over 2 GB is not built twice" if large else ""
    if float_copy is not None:
        with float_copy:
            reference = costs_or_none(Path(float_copy.name) / "float.onnx", target or COST_TARGET, profiles=profiles)
        why = "" if reference is not None else "TensorRT could not build the float model"
    text = costs.against(reference) if reference is not None else costs.text()
    return {"target": costs.target, "output": costs.to_dict(),
            "float": None if reference is None else reference.to_dict(), "float_missing": why, "summary": text}


def larger_than_float(record: dict | None, builders: list[dict] | None, trt_module: str | None) -> str | None:
    """The warning for a quantized engine larger than the float model's (``record``: :func:`against_float`'s;
    ``builders``: the check's views, :func:`trt_bridge.checks.targets.builder_views`; ``trt_module``: convert's
    --trt-module): how much larger, the quantized layers the builder used here runs in float, and the fix. None when
    it is not larger, or either was not measured."""
    if not record or not record.get("float"):
        return None
    mine, theirs = record["output"]["engine_bytes"], record["float"]["engine_bytes"]
    if not mine or not theirs or mine <= theirs:
        return None
    text = f"the engine is {100 * (mine - theirs) / theirs:.0f} % larger than the float model's"
    used = next((v for v in builders or () if v["used"]), None)
    in_float = 0 if used is None else sum(g["count"] for g in used["groups"] if not g["quantized"])
    if used is not None and in_float:
        text += (f": {used['builder']}, the builder used here, runs {in_float} of its {used['quantized_layers']} "
                 "quantized layer(s) in float, and their Q/DQ cost it size")
    if used is not None and used["module"] == "tensorrt_rtx" and trt_module is None:
        text += ("; --trt-module tensorrt_rtx writes only the forms TensorRT-RTX runs (the layers it runs in float "
                 "given back, INT8 GEMMs weight-only)")
    elif in_float:
        text += "; --high-precision fp16 halves the float layers, --exclude-nodes gives layers back by name"
    return text
