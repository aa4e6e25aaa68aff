"""The type parameters of an ONNX node's schema that :mod:`trt_bridge.lower.float16_types` assigns float16 or float32
to: which inputs and outputs one parameter binds (a *group*), which inputs take one float type only, and whether a
float32 value is bound to a parameter without float16."""

from __future__ import annotations

import onnx
from onnx import TensorProto

FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
RETYPEABLE = (FLOAT, HALF)
#: (op, input index) read only for its shape or its own type: it takes any type
FREE_INPUTS = frozenset({("Shape", 0), ("Size", 0), ("Cast", 0), ("CastLike", 0), ("EyeLike", 0)})
#: ops whose float output type is set by an attribute, not by an input: they follow their readers
ATTRIBUTE_TYPED = frozenset({"Cast", "ConstantOfShape"})


def schema_of(node: onnx.NodeProto, opsets: dict[str, int]):
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    if domain:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get("", 1), "")
    except onnx.defs.SchemaError:
        return None


def type_groups(node: onnx.NodeProto, opsets: dict[str, int], types: dict[str, int]
            ) -> list[tuple[list[int], list[int]]]:
    """``node``'s float groups: (input indices, output indices) bound to one type parameter that takes float16 and
    float32 and now holds float16 or float32 values (a Cast's input, a Shape's data: none)."""
    schema = schema_of(node, opsets)
    if schema is None:  # another domain (the plugin): every float value is one group
        ins = [k for k, i in enumerate(node.input) if i and types.get(i) in RETYPEABLE]
        outs = [k for k, o in enumerate(node.output) if o and types.get(o) in RETYPEABLE]
        return [(ins, outs)] if ins or outs else []
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[list[int], list[int]]] = {}
    for k, name in enumerate(node.input):
        param = formal(schema.inputs, k)
        if name and param is not None and (node.op_type, k) not in FREE_INPUTS:
            bound.setdefault(param.type_str, ([], []))[0].append(k)
    for k, name in enumerate(node.output):
        param = formal(schema.outputs, k)
        if name and param is not None:
            bound.setdefault(_output_param(node, k, param.type_str), ([], []))[1].append(k)
    found = []
    for param, (ins, outs) in bound.items():
        if not {"tensor(float)", "tensor(float16)"} <= allowed.get(param, set()):
            continue
        held = {types.get(node.input[k]) for k in ins} | {types.get(node.output[k]) for k in outs}
        held.discard(None)
        if held and held <= set(RETYPEABLE):
            if not ins and node.op_type not in ATTRIBUTE_TYPED:
                continue  # an output typed by an attribute we do not rewrite (RandomNormal's dtype, ...)
            found.append((ins, outs))
    return found


def _output_param(node: onnx.NodeProto, k: int, param: str) -> str:
    """The type parameter output ``k`` is bound to: a DequantizeLinear of opset 23+ without ``output_dtype`` writes
    its scale's type (its ``T3`` is ``T2`` then), so its ``y`` goes with ``x_scale``."""
    if node.op_type == "DequantizeLinear" and k == 0 and param == "T3" and not next(
            (a.i for a in node.attribute if a.name == "output_dtype"), 0):
        return "T2"
    return param


def fixed_slots(node: onnx.NodeProto, opsets: dict[str, int]) -> list[tuple[int, int]]:
    """(input index, type) of ``node``'s inputs that take one float type only (``tensor(float)``)."""
    schema = schema_of(node, opsets)
    if schema is None:
        return []
    fixed = {"tensor(float)": FLOAT, "tensor(float16)": HALF}
    return [(k, fixed[p.type_str]) for k, name in enumerate(node.input)
            if name and (p := formal(schema.inputs, k)) is not None and p.type_str in fixed]


def formal(params, index: int):
    """The formal parameter of input or output ``index`` (the last one where it is variadic), or None."""
    if not params:
        return None
    if index < len(params):
        return params[index]
    last = params[-1]
    return last if last.option == onnx.defs.OpSchema.FormalParameterOption.Variadic else None


def lacks_float16(node: onnx.NodeProto, opsets: dict[str, int], types: dict[str, int]) -> bool:
    """Whether a float32 value of ``node`` is bound to a type parameter (or a fixed type) without float16."""
    schema = schema_of(node, opsets)
    if schema is None:
        return False
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for params, names in ((schema.inputs, node.input), (schema.outputs, node.output)):
        for k, name in enumerate(names):
            param = formal(params, k)
            if not name or param is None or (node.op_type, k) in FREE_INPUTS or types.get(name) != FLOAT:
                continue
            if param.type_str in allowed and "tensor(float16)" not in allowed[param.type_str]:
                return True  # (a fixed "tensor(float)" input is cast to, not a reason)
    return False
