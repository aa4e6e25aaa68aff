"""FP4 weights for onnxruntime, which has no FP4 (E2M1) ``DequantizeLinear`` kernel on CPU (1.32: "Could not find an
implementation for DequantizeLinear(23)").

An FP4 weight is a ``DequantizeLinear`` of constant codes (its block scales constants too, or ModelOpt's NVFP4
two-level ``DequantizeLinear(fp8 scales, global scale)``): what it computes is known before any feed, so a model that
holds FP4 codes runs with each such ``DequantizeLinear`` of constants replaced by its float result, computed in numpy
as the operator defines it (``(x − zero point) · scale`` per tensor, per axis or per block, in float32, the output in
the scale's type). The float weights are exactly the FP4 weights' values, so the measurement is the model's::

    Before:  W_q:fp4 ─ DequantizeLinear(s8:fp8 ─ DequantizeLinear(g) ─ s, axis, block_size) ─ MatMul
    After:   W (float constant, the same values) ─ MatMul
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trt_bridge.formats import FP4, broadcast_param, code_types
from trt_bridge.ir.types import holds_codes

#: the FP4 code type (TensorProto)
FLOAT4_TYPES = code_types(FP4)


def has_float4_codes(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph holds FP4 codes (initializers or Constant nodes)."""
    return holds_codes(model, FLOAT4_TYPES)


def fp4_dequantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose ``DequantizeLinear`` nodes of constants (FP4 weights and their scales) are float
    initializers; any FP4 code left (an activation's Q/DQ) stays, and onnxruntime's error names it."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    values = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                values[node.output[0]] = value
    kept, folded = [], set()
    for node in graph.node:  # in graph order: a scale's DequantizeLinear comes before the weight's
        inputs = [name for name in node.input if name]
        if node.op_type != "DequantizeLinear" or (node.domain or "") not in ("", "ai.onnx") \
                or not all(name in values for name in inputs):
            kept.append(node)
            continue
        result = dequantize(node, [numpy_helper.to_array(values[name]) if name else None for name in node.input])
        tensor = numpy_helper.from_array(result, node.output[0])
        values[node.output[0]] = tensor
        graph.initializer.append(tensor)
        folded.add(node.output[0])
    if not folded:
        return model
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in kept for name in node.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)
    stale = [v for v in graph.value_info if v.name in folded]
    for info in stale:
        graph.value_info.remove(info)
    return model


def dequantize(node: onnx.NodeProto, inputs: list[np.ndarray | None]) -> np.ndarray:
    """``DequantizeLinear`` (opset 23) of constant ``inputs``: ``(x − zero point) · scale`` in float32, per
    tensor, per ``axis`` or per ``block_size`` block along it; the result in the scale's type."""
    x, scale = inputs[0], inputs[1]
    zero = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    axis, block = int(attrs.get("axis", 1)) % max(x.ndim, 1), int(attrs.get("block_size", 0))
    codes = x.astype(np.float32)
    if zero is not None:
        codes = codes - broadcast_param(zero.astype(np.float32), x.shape, axis, block)
    out = codes * broadcast_param(scale.astype(np.float32), x.shape, axis, block)
    return out.astype(scale.dtype if scale.dtype in (np.float16, np.float32) else np.float32)
