"""Make every node's input types agree with its op's schema; convert bfloat16 models.

Before (an exporter lost PyTorch's implicit promotion; onnxruntime says "Could not find an
implementation for Add(14)", TensorRT "ElementWiseOperation SUM must have same input types")::

    acc:int32 ──┐
                Add ── y:float16 (graph output)
    bias:fp16 ──┘

After (computed in the higher precision, the result cast to the type the graph declares, as
``(weight * x).to(dtype)`` would export)::

    acc:int32 ── Cast(float) ──┐
                               Add ── y_float:float ── Cast(float16) ── y:float16
    bias:fp16 ── Cast(float) ──┘

The rules:

- the inputs bound to one type parameter of the schema (``T`` of ``Add``) are promoted to one
  type: integers to the widest integer, any float wins over integers, float16 with bfloat16 or
  with integers of 16 bits and more computes in float32; a type the schema does not allow
  (an int32 ``Reshape`` shape) is cast to the nearest allowed one (int64);
- a fixed node's outputs keep the promoted type unless the exporter declared another type for
  them (its ``value_info``, captured before shape inference guesses one, or a graph output):
  then a Cast to the declared type follows, so the rest of the graph and the model's interface
  are unchanged. Without a declaration the promoted type propagates, as in PyTorch, and where
  it reaches a graph output a Cast restores the output's declared type;
- bfloat16 (``--bf16``): onnxruntime's CPU provider has no bfloat16 kernels and TensorRT runs
  bfloat16 on compute capability 8.0 and newer only. ``fp32`` (the default) rewrites every
  bfloat16 tensor, constant, Cast and interface type to float32, which is exact; ``fp16``
  to float16 (faster; fails when a constant does not fit float16); ``keep`` leaves them.

Types are propagated node by node with onnx's per-node inference, so one pass fixes chains of
conflicts. Nodes of other domains and control-flow nodes keep the types whole-model inference
gives them. A conflict no allowed type can resolve (``And(bool, float)``) raises
:class:`UnsupportedPatternError` naming the node, its inputs and their types.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto

from trt_bridge.choices import Bf16Policy
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.ir.deferred import tensor_array
from trt_bridge.ir.types import declared_types, value_types
from trt_bridge.prepare.change import Change

log = logging.getLogger("trt_bridge.prepare")

FLOATS = {TensorProto.FLOAT16: 16, TensorProto.BFLOAT16: 16, TensorProto.FLOAT: 32, TensorProto.DOUBLE: 64}
_NP_INTS = {
    TensorProto.BOOL: np.bool_, TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8,
    TensorProto.UINT16: np.uint16, TensorProto.INT16: np.int16, TensorProto.UINT32: np.uint32,
    TensorProto.INT32: np.int32, TensorProto.UINT64: np.uint64, TensorProto.INT64: np.int64,
}
_FROM_NP = {np.dtype(v): k for k, v in _NP_INTS.items()}


def type_name(elem_type: int) -> str:
    """'float16', 'float32', 'bfloat16', 'int64'."""
    return {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.DOUBLE: "float64",
            TensorProto.BFLOAT16: "bfloat16"}.get(elem_type, TensorProto.DataType.Name(elem_type).lower())


def _from_type_str(text: str) -> int | None:
    """'tensor(float16)' → TensorProto.FLOAT16 (None for sequences, optionals, ...)."""
    if not text.startswith("tensor(") or not text.endswith(")"):
        return None
    name = text[len("tensor("):-1].upper()
    return TensorProto.DataType.Value(name) if name in TensorProto.DataType.keys() else None


def _bits(t: int) -> int:
    return FLOATS.get(t) or np.dtype(_NP_INTS[t]).itemsize * 8


def promote(types: set[int]) -> int:
    """The type every one of ``types`` converts to without losing range (the precision of integers
    of 32 bits and more in float32 aside, as in PyTorch and numpy)."""
    floats = [t for t in types if t in FLOATS]
    ints = [t for t in types if t in _NP_INTS]
    if len(floats) + len(ints) != len(types):
        raise ValueError(f"no common type for {sorted(type_name(t) for t in types)}")
    if not floats:
        result = np.dtype(np.bool_)
        for t in ints:
            result = np.promote_types(result, _NP_INTS[t])
        return _FROM_NP.get(result, TensorProto.INT64)  # uint64 with a signed type: numpy says float64
    widest = max(FLOATS[t] for t in floats)
    if widest == 16 and (len(set(floats)) > 1 or any(_bits(t) >= 16 and t != TensorProto.BOOL for t in ints)):
        return TensorProto.FLOAT
    return next(t for t in (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
                if t in floats and FLOATS[t] == widest)


def _nearest_allowed(target: int, allowed: set[int]) -> int | None:
    """``target`` if allowed, else the allowed type of the same kind that holds it, else a float."""
    if target in allowed:
        return target
    known = [t for t in allowed if t in FLOATS or t in _NP_INTS]  # not float8, int4, strings
    kind_ok = [t for t in known if (t in FLOATS) == (target in FLOATS) and t != TensorProto.BOOL]
    wider = sorted((t for t in kind_ok if _bits(t) >= _bits(target) and _holds(t, target)), key=_bits)
    if wider:
        return wider[0]
    if target not in FLOATS:
        for t in (TensorProto.FLOAT, TensorProto.DOUBLE):
            if t in allowed:
                return t
    return None


def _holds(wide: int, narrow: int) -> bool:
    if wide in FLOATS or narrow in FLOATS:
        return wide in FLOATS and narrow in FLOATS and (FLOATS[wide] > FLOATS[narrow] or wide == narrow)
    return np.promote_types(_NP_INTS[wide], _NP_INTS[narrow]) == np.dtype(_NP_INTS[wide])


def convert_bf16(model: onnx.ModelProto, policy: Bf16Policy) -> list[Change]:
    """Rewrite every bfloat16 type and value in ``model`` (in place) to the policy's type."""
    if policy is Bf16Policy.KEEP:
        return []
    target = TensorProto.FLOAT if policy is Bf16Policy.FP32 else TensorProto.FLOAT16
    changes: list[Change] = []

    def tensor(t: TensorProto, where: str) -> None:
        if t.data_type != TensorProto.BFLOAT16:
            return
        from onnx import numpy_helper

        values = tensor_array(t).astype(np.float32)
        if target == TensorProto.FLOAT16:
            finite = values[np.isfinite(values)]
            if finite.size and np.abs(finite).max() > np.finfo(np.float16).max:
                raise UnsupportedPatternError(
                    f"{where} '{t.name}' holds bfloat16 values up to {np.abs(finite).max():.3g}, beyond float16's "
                    f"range (65504): use --bf16 fp32 (exact) or --bf16 keep.")
            values = values.astype(np.float16)
        t.CopyFrom(numpy_helper.from_array(values, t.name))

    def value(v: onnx.ValueInfoProto) -> bool:
        tt = v.type.tensor_type
        if v.type.HasField("tensor_type") and tt.elem_type == TensorProto.BFLOAT16:
            tt.elem_type = target
            return True
        return False

    g = model.graph
    interface = [v.name for v in (*g.input, *g.output) if value(v)]
    constants = 0

    def graph(sub: onnx.GraphProto) -> None:  # the main graph and, recursively, If/Loop/Scan bodies
        nonlocal constants
        if sub is not g:
            for v in (*sub.input, *sub.output):
                value(v)
        for v in sub.value_info:
            value(v)
        for init in sub.initializer:
            if init.data_type == TensorProto.BFLOAT16:
                tensor(init, "initializer")
                constants += 1
        for node in sub.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.BFLOAT16:
                    tensor(attr.t, f"{node.op_type} '{node.name}' attribute {attr.name}")
                    changes.append(Change("bf16", node.name, f"bfloat16 constant → {type_name(target)}"))
                elif attr.name in ("to", "output_dtype", "dtype") and attr.type == onnx.AttributeProto.INT \
                        and attr.i == TensorProto.BFLOAT16:
                    attr.i = target
                    changes.append(Change("bf16", node.name, f"{node.op_type} to bfloat16 → {type_name(target)}"))
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graph(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for body in attr.graphs:
                        graph(body)

    graph(g)
    if constants:
        changes.append(Change("bf16", "", f"{constants} bfloat16 initializer(s) → {type_name(target)}"))
    if interface:
        changes.append(Change("bf16", "", f"graph input/output(s) {', '.join(interface)}: bfloat16 → "
                                          f"{type_name(target)} (feed and read {type_name(target)})"))
    return changes


def agree_types(model: onnx.ModelProto, where: str = "model", declared: dict[str, int] | None = None
                ) -> list[Change]:
    """Insert the Casts that make every node's inputs agree with its schema (``model`` in place).

    ``declared``: the types the exporter wrote in value_info, as :func:`trt_bridge.ir.model.load_model`
    captured them before inference; None takes the model's value_info as the exporter's (a model
    fresh from ``onnx.load``). Graph outputs always declare their type.
    """
    g = model.graph
    opsets = {(i.domain or ""): i.version for i in model.opset_import}
    if declared is None:
        declared = declared_types(g.value_info)
    declared = {**declared, **declared_types(g.output)}

    fallback = value_types(model)  # for nodes the walk below cannot infer one by one (other domains, control flow)
    types: dict[str, onnx.TypeProto] = {}
    for v in g.input:
        types[v.name] = v.type
    for init in g.initializer:
        types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))

    new_nodes: list[onnx.NodeProto] = []
    casts: dict[tuple[str, int], str] = {}
    taken = {n.name for n in g.node} | {o for n in g.node for o in n.output} | set(types)
    changes: list[Change] = []

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    def elem(name: str) -> int | None:
        t = types.get(name) or fallback.get(name)
        return t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") and \
            t.tensor_type.elem_type else None

    def cast(name: str, to: int) -> str:
        key = (name, to)
        if key not in casts:
            out = fresh(f"{name}_{type_name(to)}")
            new_nodes.append(onnx.helper.make_node("Cast", [name], [out], fresh(f"{name}_Cast_{type_name(to)}"),
                                                   to=to))
            types[out] = _retyped(types.get(name) or fallback.get(name), to)
            casts[key] = out
        return casts[key]

    for node in g.node:
        schema = _schema(node, opsets)
        fixes, notes = _plan(node, schema, elem, where) if schema is not None else ({}, [])
        if fixes:
            for i, to in fixes.items():
                node.input[i] = cast(node.input[i], to)
        new_nodes.append(node)
        outs = _infer(schema, node, types, opsets) if schema is not None else None
        for out in node.output:
            if not out:
                continue
            t = outs.get(out) if outs else None
            types[out] = t if t is not None else fallback.get(out, onnx.TypeProto())
        if not fixes:
            continue
        text = "; ".join(notes)
        for k, out in enumerate(node.output):
            got, want = elem(out), declared.get(out)
            if out and got and want and got != want:
                computed = fresh(f"{out}_{type_name(got)}")
                node.output[k] = computed
                types[computed] = types[out]
                new_nodes.append(onnx.helper.make_node("Cast", [computed], [out], fresh(f"{out}_Cast"), to=want))
                types[out] = _retyped(types[out], want)
                text += f"; result cast to the declared {type_name(want)}"
        changes.append(Change("types", node.name, text))
    if changes:  # a promotion that reached a graph output: the model's interface keeps its declared type
        producers = {out: node for node in new_nodes for out in node.output}
        for v in g.output:
            got, want = elem(v.name), v.type.tensor_type.elem_type
            node = producers.get(v.name)
            if node is None or not got or not want or got == want:
                continue
            computed = fresh(f"{v.name}_{type_name(got)}")
            node.output[list(node.output).index(v.name)] = computed
            types[computed] = types[v.name]
            new_nodes.append(onnx.helper.make_node("Cast", [computed], [v.name], fresh(f"{v.name}_Cast"), to=want))
            types[v.name] = _retyped(types[v.name], want)
            changes.append(Change("types", node.name, f"graph output '{v.name}' computed in {type_name(got)} after "
                                                       f"the casts above: cast to its declared {type_name(want)}"))
    del g.node[:]
    g.node.extend(new_nodes)
    if changes:  # stale value_info of fixed outputs would contradict the new types
        keep = [v for v in g.value_info if elem(v.name) in (None, v.type.tensor_type.elem_type)]
        del g.value_info[:]
        g.value_info.extend(keep)
    return changes


def _schema(node: onnx.NodeProto, opsets: dict[str, int]):
    domain = node.domain if node.domain != "ai.onnx" else ""
    if domain not in ("",) or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                  for a in node.attribute):
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
    except onnx.defs.SchemaError:
        return None


def _formal(schema, index: int):
    """The formal parameter that input ``index`` binds to (variadic ones repeat the last)."""
    params = schema.inputs
    if not params:
        return None
    return params[min(index, len(params) - 1)]


def _plan(node: onnx.NodeProto, schema, elem, where: str) -> tuple[dict[int, int], list[str]]:
    """input index → the type it must be cast to (empty: the node's types already agree), and why."""
    allowed = {c.type_param_str: {t for t in (_from_type_str(s) for s in c.allowed_type_strs) if t is not None}
               for c in schema.type_constraints}
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(node.input):
        param = _formal(schema, i)
        if not name or param is None:
            continue
        if param.option == onnx.defs.OpSchema.FormalParameterOption.Variadic and not param.is_homogeneous:
            continue
        groups.setdefault(param.type_str, []).append(i)
    fixes: dict[int, int] = {}
    notes: list[str] = []
    for type_str, indices in groups.items():
        known = {i: elem(node.input[i]) for i in indices if elem(node.input[i])}
        present = set(known.values())
        legal = allowed.get(type_str)
        if legal is None:  # a fixed type ("tensor(int64)") instead of a parameter
            fixed = _from_type_str(type_str)
            legal = {fixed} if fixed is not None else None
        if not present or (len(present) == 1 and (legal is None or present <= legal)):
            continue
        try:
            target = promote(present)
        except ValueError:
            target = None
        target = _nearest_allowed(target, legal) if target is not None and legal else target
        if target is None:
            listed = ", ".join(f"'{node.input[i]}' {type_name(t)}" for i, t in known.items())
            error = UnsupportedPatternError(
                f"{where}: {node.op_type} '{node.name}' reads {listed}, and no type that {node.op_type} accepts "
                f"({', '.join(sorted(type_name(t) for t in legal or ()))}) holds them all. Fix the exporter "
                "(cast the inputs explicitly before this op) and re-export.")
            error.node = node.name  # for `check`, which reports it as a finding on that node
            raise error
        cast = ", ".join(f"'{node.input[i]}' {type_name(t)}" for i, t in known.items() if t != target)
        if len(present) > 1:
            listed = ", ".join(f"'{node.input[i]}' {type_name(t)}" for i, t in known.items())
            notes.append(f"{node.op_type} inputs disagree ({listed}): computed in {type_name(target)}")
        else:
            notes.append(f"{node.op_type} does not accept {cast}: cast to {type_name(target)}")
        for i, t in known.items():
            if t != target:
                fixes[i] = target
    return fixes, notes


def _retyped(t: onnx.TypeProto | None, elem_type: int) -> onnx.TypeProto:
    out = onnx.TypeProto()
    if t is not None:
        out.CopyFrom(t)
    out.tensor_type.elem_type = elem_type
    return out


def _infer(schema, node: onnx.NodeProto, types: dict[str, onnx.TypeProto], opsets) -> dict[str, onnx.TypeProto]:
    from onnx import shape_inference

    inputs = {n: types[n] for n in node.input if n and n in types and types[n].HasField("tensor_type")
              and types[n].tensor_type.elem_type}
    if len(inputs) != len([n for n in node.input if n]):
        return {}
    try:
        return shape_inference.infer_node_outputs(schema, node, inputs, opset_imports=[
            onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    except Exception:  # noqa: BLE001 - the per-node inference needs values some ops read (Reshape); fall back
        return {}


def feed_types(inputs, bf16: Bf16Policy):
    """The input types feeds must have once bfloat16 inputs are rewritten (``--bf16 fp32|fp16``)."""
    if bf16 is Bf16Policy.KEEP:
        return inputs
    target = np.dtype(np.float32 if bf16 is Bf16Policy.FP32 else np.float16)
    return [replace(i, dtype=target) if i.dtype.name == "bfloat16" else i for i in inputs]

