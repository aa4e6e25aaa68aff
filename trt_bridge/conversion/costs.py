"""The written model's engine costs against the float model's (the report's ``costs``).

``check`` builds the written model ahead of time for ``COST_TARGET`` and reports its engine size and activation
memory (:func:`trt_bridge.checks.tensorrt_run.measure_costs`); the float model the source was lifted to, kept aside
before lowering (:func:`keep_float`), is built the same way as the reference. The report adds what makes the difference:
activations whose range is computed in each inference, layers given back to float.
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
