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


#: com.microsoft (onnxruntime contrib) ops TensorRT-RTX 1.7.1's parser imports (each verified with a one-node
#: model: tests/test_check.py): its importers go by op name, so these take ONNX's or their own attributes. Other
#: onnxruntime ops (GroupQueryAttention, MatMulNBits, SkipLayerNormalization, FastGelu) it sends to the plugin
#: registry, which has none of them; MultiHeadAttention only with one output (MHA_SINGLE_OUTPUT).
RTX_IMPORTS_CONTRIB = frozenset({"RotaryEmbedding", "SkipSimplifiedLayerNormalization", "Gelu", "MultiHeadAttention"})
#: TensorRT-RTX's parser on a com.microsoft MultiHeadAttention with past/present outputs
MHA_SINGLE_OUTPUT = "TensorRT-RTX only supports MultiHeadAttention with a single context output"


def rtx_imports_contrib(op: str, outputs: int) -> bool:
    """Whether TensorRT-RTX 1.7.1's parser imports the com.microsoft ``op`` with ``outputs`` outputs in use."""
    return op in RTX_IMPORTS_CONTRIB and (op != "MultiHeadAttention" or outputs == 1)


def rotary_crashes_parser(op: str, domain: str, num_heads: int, rank: int | None) -> bool:
    """A com.microsoft RotaryEmbedding with ``num_heads`` 0 on a 3-D input [batch, sequence, hidden]: TensorRT-RTX
    1.7.1's parser dies by SIGFPE on it (its head size is hidden / num_heads). With num_heads set, or a 4-D input, it
    parses."""
    return op == "RotaryEmbedding" and domain == "com.microsoft" and num_heads == 0 and rank == 3
