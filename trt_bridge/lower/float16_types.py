"""Which tensors of a lowered model are float16, decided per type parameter of each node; Casts only where the
chosen types meet (for :func:`trt_bridge.lower.precision.to_float16`).

Every node's inputs and outputs bound to one type parameter of its ONNX schema (``T`` of ``MatMul``, ``T1`` of
``QuantizeLinear``: ``x`` and ``y_scale``) form a *group* that must hold one type. A node computes in float16 (low)
or float32 (high), and each of its float groups takes that type, so no node can read float16 beside float32. The
value a group reads that has the other type is a boundary::

    before (float32 source, the MatMul kept float32)        after
    x ──────────────────────────┐                           x ── Cast(fp16) ── x_fp16 ──┐
    W (constant) ── Mul(low) ── h ── MatMul(high)   →       W_fp16 ── Mul ── h:fp16 ── Cast(float) ── h_fp32 ── MatMul

A constant takes the other type as a converted copy (in place when every reader wants it; clamped to float16's
range, a Q/DQ scale kept positive and its float32 original rounded to the same value, so that a Q and a DQ of one
pair that end up in different types agree exactly); any other tensor gets one Cast, shared by its readers.

Who decides:

- *compute* nodes: low unless ``high`` names them (the caller's list: sensitive, shape and position arithmetic,
  out of float16's range, exact INT8 compensation, ...) or a float group's type parameter has no float16;
- *data movement* (Reshape, Transpose, Concat, ...): high when a value it moves arrives in float32 from a compute
  node, so float32 results are not rounded to float16 on the way to a float32 reader;
- *followers of their readers*: a ``DequantizeLinear``, a float ``Cast`` and ``ConstantOfShape`` write the type
  every reader wants (float16 only if all of them read float16), so a float16 reader reads a float16 DQ directly and
  TensorRT still fuses it into an INT8 kernel, and a ``Cast(int → float)`` produces its readers' type;
- *followers of their producer*: a ``QuantizeLinear`` quantizes its input in the type it arrives in.

Inputs read only for their shape (``Shape``, ``Size``) and a ``Cast``'s input take any type. Integer, boolean and
other non-float values are never touched. Graph inputs and outputs keep their declared types (``keep_io_types``),
behind a Cast where the graph computes another; otherwise float32 ones become float16. A Cast left between equal
types is removed. Nodes of other domains (trt-bridge's plugin) have one group of all their float values.
"""

from __future__ import annotations

import numpy as np
import onnx

from trt_bridge.ir.node_index import body_reads
from trt_bridge.ir.types import value_types
from trt_bridge.lower.type_groups import (
    ATTRIBUTE_TYPED,
    FLOAT,
    HALF,
    RETYPEABLE,
    fixed_slots,
    lacks_float16,
    type_groups,
)

HALF_MAX = float(np.finfo(np.float16).max)

#: ops that only move or select values: they keep the type their values arrive in
MOVERS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Concat", "Split",
                    "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad", "DepthToSpace",
                    "SpaceToDepth", "ReverseSequence"})


def assign_float16(model: onnx.ModelProto, high: set[str], keep_io_types: bool = True, suffix: str = "fp16",
                   saturate: set[str] = frozenset(), reserved: set[str] = frozenset()) -> None:
    """Give ``model`` (opset ≥ 19, main graph only, node names unique) its float16 part in place (module doc).
    ``high``: node names kept in float32; ``saturate``: of those, the nodes whose float32 results are clipped to
    float16's range where a float16 reader casts them (values float16 would turn into ±inf); ``reserved``: names
    the new tensors and nodes must not take (those of the graphs around an If branch). A tensor a control-flow
    body reads keeps its name (its Cast is not bypassed, its initializer not dropped); the bodies themselves are
    :mod:`trt_bridge.lower.body_precision`'s."""
    g = model.graph
    nodes = list(g.node)  # one wrapper per node: the passes below key on id(node)
    types = {name: t.tensor_type.elem_type for name, t in value_types(model).items() if t.HasField("tensor_type")}
    inits = {i.name: i for i in g.initializer}
    types.update({name: i.data_type for name, i in inits.items()})
    constant_nodes = {n.output[0]: n for n in nodes if n.op_type == "Constant" and _value_attr(n) is not None}
    types.update({name: _value_attr(node).data_type for name, node in constant_nodes.items()})
    opsets = {(i.domain or ""): i.version for i in model.opset_import}
    groups = {id(n): type_groups(n, opsets, types) for n in nodes}
    producer = {o: n for n in nodes for o in n.output if o}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in nodes:
        for k, i in enumerate(n.input):
            if i:
                readers.setdefault(i, []).append((n, k))
    io_type = {v.name: _interface_type(v.type.tensor_type.elem_type, keep_io_types) for v in (*g.input, *g.output)}
    outputs = {o.name for o in g.output}

    low: dict[int, bool] = {}  # id(node) → computes in float16
    chosen: dict[str, int] = {}  # tensor → its type once decided
    for v in g.input:
        if types.get(v.name) in RETYPEABLE:
            chosen[v.name] = io_type[v.name]

    def slot_type(node: onnx.NodeProto, k: int) -> int | None:
        """The type ``node`` needs at input ``k`` (None: any, or not a float group)."""
        for ins, _ in groups[id(node)]:
            if k in ins:
                return HALF if low[id(node)] else FLOAT
        return None

    # compute nodes and data movement, in order (the graph is sorted)
    for n in nodes:
        if n.op_type in ATTRIBUTE_TYPED or n.op_type in ("DequantizeLinear", "QuantizeLinear", "Constant"):
            continue
        if n.name in high or lacks_float16(n, opsets, types):
            low[id(n)] = False
        elif n.op_type in MOVERS:
            low[id(n)] = FLOAT not in {chosen.get(n.input[k]) for ins, _ in groups[id(n)] for k in ins
                                       if _computed(n.input[k], producer, io_type)}
        else:
            low[id(n)] = True
        _choose_outputs(n, groups[id(n)], low[id(n)], chosen)
    # followers of their readers, last reader first
    for n in reversed(nodes):
        if n.op_type not in (*ATTRIBUTE_TYPED, "DequantizeLinear") or not groups[id(n)]:
            continue
        out = n.output[0]
        wants = set()
        for reader, k in readers.get(out, []):
            if reader.op_type == "Cast" and id(reader) in low:
                wants.add(HALF if low[id(reader)] else FLOAT)
            elif id(reader) in low and reader.op_type != "QuantizeLinear":
                wanted = slot_type(reader, k)
                if wanted is not None:
                    wants.add(wanted)
        if out in outputs:
            wants.add(io_type[out])
        if n.name in high:
            low[id(n)] = False
        else:
            low[id(n)] = wants == {HALF} or (not wants and types.get(out) == HALF)
        _choose_outputs(n, groups[id(n)], low[id(n)], chosen)
    # followers of their producer
    for n in nodes:
        if n.op_type == "QuantizeLinear":
            low[id(n)] = n.name not in high and chosen.get(n.input[0], types.get(n.input[0])) == HALF
    for n in nodes:
        if id(n) not in low:
            low[id(n)] = False

    _rewrite(model, nodes, groups, low, chosen, types, inits, constant_nodes, readers, io_type, suffix, saturate,
             opsets, reserved)


def _computed(tensor: str, producer: dict, io_type: dict) -> bool:
    """Whether ``tensor`` is a graph input or the result of a node whose type is decided before data movement's."""
    node = producer.get(tensor)
    if node is None:
        return tensor in io_type
    return node.op_type not in (*ATTRIBUTE_TYPED, "DequantizeLinear", "Constant")


def _interface_type(declared: int, keep: bool) -> int:
    return declared if keep or declared != FLOAT else HALF


def _choose_outputs(node: onnx.NodeProto, node_groups, is_low: bool, chosen: dict[str, int]) -> None:
    for _, outs in node_groups:
        for k in outs:
            chosen[node.output[k]] = HALF if is_low else FLOAT


def _rewrite(model, nodes, groups, low, chosen, types, inits, constant_nodes, readers, io_type, suffix, saturate,
             opsets, reserved) -> None:
    g = model.graph
    taken = {o for n in nodes for o in n.output} | {i.name for i in g.input} | set(inits) | \
        {n.name for n in nodes} | set(reserved)
    in_bodies = {name for n in nodes for name in body_reads(n)}  # read by a control-flow body: keep the name

    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    scales = {n.input[1] for n in nodes if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 1}
    # what each input must be
    wanted: list[tuple[onnx.NodeProto, int, int]] = []
    for n in nodes:
        for ins, _ in groups[id(n)]:
            for k in ins:
                wanted.append((n, k, HALF if low[id(n)] else FLOAT))
        wanted.extend((n, k, to) for k, to in fixed_slots(n, opsets))
    # constants: in place where every reader (and the graph, for an output) wants one type, else a copy
    wants_of: dict[str, set[int]] = {}
    for n, k, want in wanted:
        wants_of.setdefault(n.input[k], set()).add(want)
    slots: dict[str, int] = {}
    for n, k, _ in wanted:
        slots[n.input[k]] = slots.get(n.input[k], 0) + 1
    for name, wants in wants_of.items():
        # in place only where no other reader (a Shape, a fixed type) needs the value as it is
        if (name in inits or name in constant_nodes) and len(wants) == 1 and types.get(name) not in wants \
                and types.get(name) in RETYPEABLE and name not in io_type \
                and len(readers.get(name, ())) == slots[name]:
            target = inits[name] if name in inits else _value_attr(constant_nodes[name])
            _retype_constant(target, next(iter(wants)), name in scales, suffix)
            types[name] = next(iter(wants))
    copies: dict[tuple[str, int], str] = {}
    new_nodes: dict[int, list[onnx.NodeProto]] = {}  # id(node) → nodes to insert before it

    def converted(name: str, to: int, before: onnx.NodeProto) -> str:
        key = (name, to)
        if key in copies:
            return copies[key]
        tag = suffix if to == HALF else "fp32"
        if name in inits:
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = fresh(f"{name}_{tag}")
            _retype_constant(copy, to, name in scales, suffix)
            if name in scales and to == HALF:  # the float32 original takes the float16 value (pairs agree)
                original = onnx.numpy_helper.to_array(inits[name]).astype(np.float32)
                inits[name].CopyFrom(onnx.numpy_helper.from_array(_rounded(original, suffix), name))
            g.initializer.append(copy)
            copies[key] = copy.name
        elif name in constant_nodes:
            node = onnx.NodeProto()
            node.CopyFrom(constant_nodes[name])
            node.name = fresh(f"{constant_nodes[name].name or name}_{tag}")
            node.output[0] = fresh(f"{name}_{tag}")
            _retype_constant(_value_attr(node), to, False, suffix)
            new_nodes.setdefault(id(before), []).append(node)
            copies[key] = node.output[0]
        else:
            source = name
            if to == HALF and producer_name.get(name) in saturate:
                clipped = fresh(f"{name}_saturated")
                low_, high_ = fresh(f"{name}_min"), fresh(f"{name}_max")
                g.initializer.extend([onnx.numpy_helper.from_array(np.array(-HALF_MAX, np.float32), low_),
                                      onnx.numpy_helper.from_array(np.array(HALF_MAX, np.float32), high_)])
                new_nodes.setdefault(id(before), []).append(onnx.helper.make_node(
                    "Clip", [name, low_, high_], [clipped], fresh(f"{name}_Clip")))
                source = clipped
            out = fresh(f"{name}_{tag}")
            new_nodes.setdefault(id(before), []).append(
                onnx.helper.make_node("Cast", [source], [out], fresh(f"{name}_Cast_{tag}"), to=to))
            copies[key] = out
        types[copies[key]] = to
        return copies[key]

    producer_name = {o: n.name for n in nodes for o in n.output}
    for n in nodes:  # attribute-typed outputs
        if n.op_type == "Cast" and groups[id(n)]:
            _set_attr(n, "to", HALF if low[id(n)] else FLOAT)
        elif n.op_type == "ConstantOfShape" and groups[id(n)]:
            value = _value_attr(n)
            if value is None:  # the default: one float32 zero
                n.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(
                    np.zeros(1, np.float32), "value")))
                value = _value_attr(n)
            _retype_constant(value, HALF if low[id(n)] else FLOAT, False, suffix)
    for n, k, want in wanted:
        name = n.input[k]
        have = chosen.get(name, types.get(name))
        if have in RETYPEABLE and have != want:
            n.input[k] = converted(name, want, n)
    ordered = []
    for n in nodes:
        ordered.extend(new_nodes.get(id(n), []))
        ordered.append(n)
    nodes = ordered
    # graph outputs in their declared (or float16) type: the graph computes '<output>_<type>', a Cast writes it
    producer_name = {o: n.name for n in nodes for o in n.output}
    for v in g.output:
        have, want = chosen.get(v.name, types.get(v.name)), io_type.get(v.name)
        if have not in RETYPEABLE or want not in RETYPEABLE:
            continue
        if have != want and v.name in producer_name:
            inner = fresh(f"{v.name}_{'fp32' if have == FLOAT else suffix}")
            for n in nodes:
                n.output[:] = [inner if o == v.name else o for o in n.output]
                n.input[:] = [inner if i == v.name else i for i in n.input]
            types[inner] = have
            nodes.append(onnx.helper.make_node("Cast", [inner], [v.name], fresh(f"{v.name}_Cast"), to=want))
        v.type.tensor_type.elem_type = want
    for v in g.input:
        if v.name in io_type and types.get(v.name) in RETYPEABLE:
            v.type.tensor_type.elem_type = io_type[v.name]
    del g.node[:]
    g.node.extend(_drop_noop_casts(nodes, {**types, **chosen}, {o.name for o in g.output} | in_bodies))
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output} | in_bodies
    for init in [i for i in g.initializer if i.name not in used]:
        g.initializer.remove(init)
    del g.value_info[:]


def _drop_noop_casts(nodes: list[onnx.NodeProto], types: dict[str, int], outputs: set[str]) -> list[onnx.NodeProto]:
    """Casts between equal float types bypassed (a graph output's kept)."""
    rename: dict[str, str] = {}
    keep = []
    for n in nodes:
        n.input[:] = [rename.get(i, i) for i in n.input]
        if n.op_type == "Cast" and n.output[0] not in outputs:
            to = next(a.i for a in n.attribute if a.name == "to")
            if to in RETYPEABLE and types.get(n.input[0]) == to:
                rename[n.output[0]] = n.input[0]
                continue
        keep.append(n)
    return keep


def _value_attr(node: onnx.NodeProto) -> onnx.TensorProto | None:
    return next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)


def _set_attr(node: onnx.NodeProto, name: str, value: int) -> None:
    for a in node.attribute:
        if a.name == name:
            a.i = value


def _retype_constant(t: onnx.TensorProto | None, to: int, scale: bool, suffix: str) -> None:
    """``t`` (float16 or float32) as ``to`` in place: into float16 clamped to its range (a scale kept positive)."""
    if t is None or t.data_type == to:
        return
    values = onnx.numpy_helper.to_array(t)
    if to == HALF:
        values = values.astype(np.float32)
        finite = np.isfinite(values)
        values = np.where(finite, np.clip(values, -HALF_MAX, HALF_MAX), values)
        if scale:
            values = np.maximum(values, np.finfo(np.float16).smallest_subnormal)
        values = values.astype(np.float16)
    else:
        values = values.astype(np.float32)
    t.CopyFrom(onnx.numpy_helper.from_array(values, t.name))


def _rounded(values: np.ndarray, suffix: str) -> np.ndarray:
    """``values`` (positive scales) rounded to float16 or bfloat16, as float32."""
    if suffix == "bf16":
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16).astype(np.float32)
    return np.maximum(values, np.finfo(np.float16).smallest_subnormal).astype(np.float16).astype(np.float32)
