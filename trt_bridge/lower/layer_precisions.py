"""Which precision TensorRT runs each compute layer of a converted model in, for the report and ``check``.

Under strong typing TensorRT runs every layer in the type the ONNX gives it: a weighted op whose data input
is dequantized runs in the precision of the codes (int8/uint8: INT8, float8: FP8, int4: INT4, float4: FP4), one
whose weight alone is dequantized from int4 INT4 weight-only (INT4-W; from float4 FP4-W, from int8 INT8-W), trt-bridge's
DynamicInt8Gemm plugin INT8 (its GEMM is int8 × int8), any other layer in its output's type (FP32, FP16, BF16).

That is what the model's types ask for; what each builder runs them as (datacenter TensorRT runs W8A8 INT8
convolutions and GEMMs, TensorRT-RTX INT8 only as weight-only GEMMs) is
:func:`trt_bridge.tensorrt.target.builder_view`'s, from the ``groups`` here: the layers by precision, kind of op
(``convolution``, ``gemm``, ``plugin``, ``other``) and the float type they compute in.
"""

from __future__ import annotations

from dataclasses import asdict

import onnx

from trt_bridge.formats import CODE_TYPES, code_format
from trt_bridge.ir.dynamic_gemm import is_plugin_node
from trt_bridge.ir.graphs import bodies, graphs
from trt_bridge.ir.size import is_large
from trt_bridge.ir.types import elem_types
from trt_bridge.runtime.fp4_dynamic import OP as FP4_DYNAMIC

WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
SKIP = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Constant", "Identity", "Reshape", "Transpose",
                  "Flatten", "Squeeze", "Unsqueeze", "Shape", "Gather", "Concat", "Split", "Slice"})


def layer_precisions(model: onnx.ModelProto) -> dict:
    """Which compute layers TensorRT runs in INT8, FP16, BF16 or FP32, as the model's types dictate (strong
    typing): a weighted op whose data input is dequantized from int8 runs INT8, any other layer in its output's
    type. Data movement (reshapes, casts, Q/DQ themselves) is not counted; the layers inside control-flow bodies are,
    the If/Loop/Scan nodes holding them are not."""
    types = elem_types(model)
    nodes = [n for g in graphs(model.graph) for n in g.node]  # control-flow bodies' layers too (If/Loop/Scan hold them)
    for body in bodies(model.graph):
        types.update({v.name: v.type.tensor_type.elem_type for v in (*body.value_info, *body.output, *body.input)})
    for graph in graphs(model.graph):  # the code types of weights (initializers, Constant nodes)
        types.update({i.name: i.data_type for i in graph.initializer})
        types.update({n.output[0]: a.t.data_type for n in graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value"})
    producer = {o: n for n in nodes for o in n.output}
    names = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16",
             onnx.TensorProto.DOUBLE: "fp64"}
    layers: dict[str, str] = {}
    groups: dict[tuple[str, str, str], int] = {}  # (precision, kind of op, float type) → layers
    for node in nodes:
        if node.op_type in SKIP or not node.output or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        kind = names.get(types.get(node.output[0], 0))
        precision = _precision(node, producer, types) or kind
        if precision is not None:
            layers[node.name] = precision
            key = (precision, op_kind(node), kind or "fp32")
            groups[key] = groups.get(key, 0) + 1
    counts: dict[str, int] = {}
    for kind in layers.values():
        counts[kind] = counts.get(kind, 0) + 1
    return {"counts": dict(sorted(counts.items())), "layers": layers,
            "groups": [{"precision": p, "op": op, "float": f, "count": n} for (p, op, f), n in sorted(groups.items())]}


def op_kind(node: onnx.NodeProto) -> str:
    """What kind of layer a builder's support matrix lists ``node`` as: ``convolution``, ``gemm`` (MatMul, Gemm,
    MatMulNBits), ``plugin`` (trt-bridge's DynamicInt8Gemm, its own int8 kernel) or ``other``."""
    return "plugin" if is_plugin_node(node) else kind_of_op(node.op_type)


def kind_of_op(op: str) -> str:
    """The support matrix's kind of an op: ``convolution``, ``gemm`` (MatMul, Gemm, MatMulNBits) or ``other``."""
    if op in ("Conv", "ConvTranspose"):
        return "convolution"
    return "gemm" if op in ("MatMul", "Gemm", "MatMulNBits") else "other"


def _precision(node: onnx.NodeProto, producer: dict, types: dict[str, int]) -> str | None:
    """The quantized precision ``node`` runs in (None: it computes in its output's float type)."""
    if is_plugin_node(node):
        return "int8"
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":  # onnxruntime's 4-bit weights
        bits = next((a.i for a in node.attribute if a.name == "bits"), 4)
        return "int4-w" if bits <= 4 else "int8"
    if node.op_type not in WEIGHTED_OPS:
        return None
    src = _through_casts(producer.get(node.input[0]) if node.input else None, producer)
    if src is not None and src.op_type == "DequantizeLinear" and getattr(producer.get(src.input[0]), "op_type",
                                                                         None) == FP4_DYNAMIC:
        return "fp4"  # TensorRT's dynamic FP4 activation (NVFP4 W4A4)
    if src is not None and src.op_type == "DequantizeLinear":
        return CODE_PRECISIONS.get(_code_type(src, types), "int8")
    weight = _through_casts(producer.get(node.input[1]) if len(node.input) > 1 else None, producer)
    four = CODE_PRECISIONS.get(_code_type(weight, types)) if weight is not None and \
        weight.op_type == "DequantizeLinear" else None
    return f"{four}-w" if four in ("int8", "int4", "fp4") else None  # activations in float: weight-only


#: a Q/DQ code type → the precision TensorRT runs the layer it feeds in (the format nearest the codes: uint8 INT8, any
#: float8 FP8, uint4 INT4; 16-bit codes TensorRT does not take: check names them)
CODE_PRECISIONS = {t: code_format(t).nearest.name for t in CODE_TYPES if code_format(t).name not in ("int16", "uint16")}
#: the quantized precisions, in the order a headline names them, and how it names them
QUANTIZED = ("int8", "int8-w", "fp8", "int4-w", "int4", "fp4-w", "fp4")
HEADLINE = {"int8-w": "INT8 weight-only", "int4-w": "INT4 weight-only", "fp4-w": "FP4 weight-only"}


def _through_casts(node: onnx.NodeProto | None, producer: dict) -> onnx.NodeProto | None:
    """``node``, or what the Casts it is a chain of read (a DequantizeLinear whose float16 output a float32 layer
    reads through a Cast, as ModelOpt's FP8 exports write it: the layer still runs in the DQ's format)."""
    while node is not None and node.op_type == "Cast" and node.input:
        node = producer.get(node.input[0])
    return node


def _code_type(dq: onnx.NodeProto, types: dict[str, int]) -> int:
    """The code type a DequantizeLinear reads: its input's, else its zero point's (0: unknown)."""
    return types.get(dq.input[0]) or (types.get(dq.input[2], 0) if len(dq.input) > 2 and dq.input[2] else 0)


def quantized_precision(precisions: dict | None) -> str:
    """The quantized precisions a model's layers run in, for a headline: "INT8", "FP8", "INT8 + INT4-W", ...
    ("INT8" when the layers are not known, a model over 2 GB)."""
    counts = (precisions or {}).get("counts", {})
    found = [HEADLINE.get(kind, kind.upper()) for kind in QUANTIZED if counts.get(kind)]
    return " + ".join(found) or "INT8"


def precision_line(precisions: dict) -> str:
    """The one-line summary of :func:`layer_precisions` that ``convert`` and ``check`` print (what each builder
    runs them as follows it: :func:`trt_bridge.tensorrt.target.builder_view`)."""
    counts = precisions["counts"]
    return "layers by precision (as the model's types ask): " + (
        ", ".join(f"{k.upper()} {v}" for k, v in counts.items()) or "none")


def precision_report(model: onnx.ModelProto, high_precision: str, kept: list | None) -> dict | None:
    """The report's ``precision``: ``--high-precision``, the layers by precision, and the layers kept in float32
    (None for a model over 2 GB, whose layers are not read back)."""
    if is_large(model):
        return None
    report = {"high_precision": high_precision, **layer_precisions(model)}
    if kept is not None:
        report["kept_in_float32"] = [asdict(k) for k in kept]
    return report
