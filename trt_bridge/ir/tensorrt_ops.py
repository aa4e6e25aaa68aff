"""ONNX ops TensorRT's ONNX parser cannot take: the facts lifting (none may survive it), ``trt-bridge check`` (its
'no-importer' rule) and ``trt-bridge build`` (which names them when the parser rejects a model) share, kept here
so that none of them has to import another for a set of op names."""

from __future__ import annotations

#: Ops that TensorRT's ONNX parser rejects, or that lowering must write anew: none may survive lifting.
TENSORRT_REJECTS = frozenset({
    "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul",
    "QuantizeLinear", "DequantizeLinear",
})
#: Ops whose input 1 is a weight with one output-channel axis (where per-channel scales go)
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def output_channel_axis(op: str, trans_b: int, rank: int) -> int:
    """The output-channel axis of a weighted op's weight (input 1) of rank ``rank``: 0 for Conv, 1 for
    ConvTranspose, by ``transB`` for Gemm, the last for MatMul."""
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "Gemm":
        return 0 if trans_b else 1
    return rank - 1


#: Ops with no importer in TensorRT's ONNX parser ("UNSUPPORTED_NODE"); convert lifts them.
NO_IMPORTER = TENSORRT_REJECTS - {"QuantizeLinear", "DequantizeLinear"}
