"""ONNX ops TensorRT's ONNX parser cannot take: the facts lifting (none may survive it), ``trt-bridge check`` (its
'no-importer' rule) and ``trt-bridge build`` (which names them when the parser rejects a model) share, kept here
so that none of them has to import another for a set of op names."""

from __future__ import annotations

#: Ops that TensorRT's ONNX parser rejects, or that lowering must write anew: none may survive lifting.
TENSORRT_REJECTS = frozenset({
    "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul",
    "QuantizeLinear", "DequantizeLinear",
})
#: Ops with no importer in TensorRT's ONNX parser ("UNSUPPORTED_NODE"); convert lifts them.
NO_IMPORTER = TENSORRT_REJECTS - {"QuantizeLinear", "DequantizeLinear"}
