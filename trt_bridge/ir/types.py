"""Types and shapes of a model's tensors: shape inference on a weight-free skeleton, element types, declared types."""

from __future__ import annotations

import onnx

from trt_bridge.formats import FP4, FP8, code_types
from trt_bridge.ir.size import payload_bytes, tensor_bytes


def infer_shapes(model: onnx.ModelProto, strict: bool = False) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` without shipping the weights to C++ and back.

    ``strict``: any inconsistency (types that contradict an op, shapes that do not broadcast) raises;
    otherwise inference is best effort. Shape inference needs the weights' shapes, not their values (except small ones,
    such as Reshape targets, which data propagation reads): it runs on a skeleton
    whose large initializers are graph inputs of the same type and shape, and the
    inferred value_info is copied back.

    Strict inference of a model with control flow runs without data propagation: onnx's propagation keys what it
    learns by tensor name across subgraphs, and fails ("Data for input 0 already exists") on a real model whose
    ``If`` branches share names (Optimum's merged decoders: both branches are the same exported graph).
    """
    bare = skeleton(model)
    inferred = onnx.shape_inference.infer_shapes(bare, check_type=strict, strict_mode=strict,
                                                 data_prop=not (strict and has_subgraphs(model)))
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for target, source in ((model.graph.output, inferred.graph.output),):
        for mine, theirs in zip(target, source):
            if not mine.type.tensor_type.HasField("shape") and theirs.type.tensor_type.HasField("shape"):
                mine.CopyFrom(theirs)
    return model


def has_subgraphs(model: onnx.ModelProto) -> bool:
    """Whether a node of ``model``'s main graph holds a subgraph (If, Loop, Scan)."""
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in model.graph.node
               for a in n.attribute)


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The types of the model's tensors: its own value_info when it has some (a loaded or finalized model
    carries inferred ones), else best-effort shape inference on a weight-free skeleton."""
    source = model.graph
    if not source.value_info and source.node:
        try:
            source = onnx.shape_inference.infer_shapes(skeleton(model), check_type=False, strict_mode=False).graph
        except Exception:  # noqa: BLE001 - best effort: the declared inputs and outputs only
            source = model.graph
    return {v.name: v.type for v in (*source.value_info, *source.output, *source.input)}


#: the floating-point element types
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """:func:`value_types` as element types (``TensorProto`` enums)."""
    return {name: t.tensor_type.elem_type for name, t in value_types(model).items()}


#: the floating-point Q/DQ code types (FP8, FP4, the E8M0 block scale)
FLOAT_CODE_TYPES = code_types(FP8) | code_types(FP4) | {getattr(onnx.TensorProto, "FLOAT8E8M0", FP8.onnx_type)}


def holds_codes(model: onnx.ModelProto, types) -> bool:
    """Whether ``model``'s main graph holds a constant (initializer or Constant node) of one of ``types``."""
    return any(t.data_type in types for t in model.graph.initializer) or any(
        a.t.data_type in types for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
        if a.name == "value")


def float_code_nodes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """The (node name, code type name) of each QuantizeLinear/DequantizeLinear (any domain) of the main graph
    whose codes are floating point (FP8, FP4), read from its zero point, its ``output_dtype`` or its codes."""
    qdq = [n for n in model.graph.node if n.op_type.endswith(("QuantizeLinear", "DequantizeLinear"))]
    if not qdq:
        return []
    types = {**{t.name: t.data_type for t in model.graph.initializer}, **elem_types(model)}
    found = []
    for node in qdq:
        code = types.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if code is None and node.op_type.endswith("DequantizeLinear") and node.input:
            code = types.get(node.input[0])
        if code is None:
            code = next((a.i for a in node.attribute if a.name == "output_dtype"), None)
        if code in FLOAT_CODE_TYPES:
            found.append((node.name or node.output[0], onnx.TensorProto.DataType.Name(code)))
    return found


def declared_types(values) -> dict[str, int]:
    """The element types that ``values`` (value_info, graph outputs) declare; entries without one are left out."""
    return {v.name: v.type.tensor_type.elem_type for v in values
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without its large weights: each becomes a graph input of the same type and shape."""
    skeleton = onnx.ModelProto()
    if payload_bytes(model) < (1 << 20) and not any(t.data_location == onnx.TensorProto.EXTERNAL
                                                    for t in model.graph.initializer):
        skeleton.CopyFrom(model)
        return skeleton
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(skeleton, field, getattr(model, field))
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    graph = skeleton.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    declared = {i.name for i in model.graph.input}
    for tensor in model.graph.initializer:
        if tensor_bytes(tensor) > 1024 or tensor.data_location == onnx.TensorProto.EXTERNAL:
            if tensor.name not in declared:
                graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                                      list(tensor.dims)))
        else:
            graph.initializer.append(tensor)
    return skeleton

