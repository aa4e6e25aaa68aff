"""Finish a model after a pass: drop unused opset imports, upgrade the opset where Q/DQ need it, leave '?'
dimensions unnamed, infer shapes, and run onnx's strict checks on an output."""

from __future__ import annotations

import onnx
from onnx import version_converter

from trt_bridge.errors import InternalError, UnsupportedPatternError
from trt_bridge.ir.dynamic_gemm import DOMAIN as PLUGIN_DOMAIN
from trt_bridge.ir.model import MIN_QDQ_OPSET
from trt_bridge.ir.size import is_large
from trt_bridge.ir.types import infer_shapes, skeleton


def finalize(model: onnx.ModelProto, opset: int, check: bool = False, min_opset: int = MIN_QDQ_OPSET,
             infer: bool = True) -> onnx.ModelProto:
    """Drop unused opset imports, upgrade to opset ≥ ``min_opset``, infer shapes (unless not ``infer``: a model only
    run by onnxruntime, which infers them itself); check when asked."""
    used = {n.domain for n in model.graph.node}
    keep = [imp for imp in model.opset_import if imp.domain in ("", "ai.onnx") or imp.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    if PLUGIN_DOMAIN in used and all(imp.domain != PLUGIN_DOMAIN for imp in keep):  # trt-bridge's plugin nodes
        model.opset_import.append(onnx.helper.make_opsetid(PLUGIN_DOMAIN, 1))
    if opset < min_opset:
        why = "float16 QuantizeLinear/DequantizeLinear" if min_opset > MIN_QDQ_OPSET else \
            "per-channel DequantizeLinear"
        try:
            model = version_converter.convert_version(model, min_opset)
        except Exception as exc:
            raise UnsupportedPatternError(
                f"cannot upgrade the model from opset {opset} to {min_opset} (needed for {why}): {exc}. "
                f"Re-export the model at opset {min_opset} or newer."
            ) from exc
    if model.ir_version < 7:
        model.ir_version = 7
    unname_unknown_dims(model)
    del model.graph.value_info[:]
    if not (infer or check) or is_large(model):
        return model  # protobuf cannot hold a large one for in-memory checks; checked from disk after saving
    try:
        model = infer_shapes(model, strict=check)
        if check:  # on the weightless skeleton: the checker copies a model it is given twice (into C++, parsed)
            onnx.checker.check_model(skeleton(model), full_check=True)
    except Exception as exc:  # the output contract failed: a trt-bridge bug, not the user's
        raise InternalError(f"the converted model fails ONNX's strict checks: {str(exc).strip()}. "
                            "Please report this with the input model.") from exc
    return model


def unname_unknown_dims(model: onnx.ModelProto) -> None:
    """Exporters write '?' for unknown dimensions; TensorRT takes equal names for equal sizes,
    so two '?' dimensions (height and width) would be forced equal. Leave them unnamed."""
    for value in (*model.graph.input, *model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param == "?":
                dim.ClearField("dim_param")

