"""``--high-precision fp16|bf16`` inside control flow: each ``If`` branch as a model of its own for the float16
pass (:func:`trt_bridge.lower.precision.to_float16` runs it on the main graph, then on each branch this way).

A branch reads tensors of the graphs around it (Optimum's merged decoder: both branches a whole decoder reading
the main graph's ``input_ids``, ``past_key_values.*``, ...). :func:`branch_model` makes the branch a model whose
inputs are those outer values, typed as the (already converted) outer graph gives them, and whose outputs are the
branch's outputs in their declared types; the float16 pass then keeps both as an interface, so a branch that
computes in float16 casts an outer float32 value at its entry and its results back before returning them. The If's
outputs keep their source types (the main graph's outputs stay a drop-in replacement)::

    before (float32)                                  after (--high-precision fp16)
    x ─┬─ If(cond)                                    x ─┬─ If(cond)
       ├ then: MatMul(x, W) ── Relu ── y:fp32            ├ then: Cast(x) ── MatMul(·, W:fp16) ── Relu ── Cast ── y:fp32
       └ else: MatMul(x, V) ── y:fp32                    └ else: Cast(x) ── MatMul(·, V:fp16) ── Cast ── y:fp32

The branch keeps its own census (numerically sensitive ops, shape and position arithmetic, ranges) in float32.
Loop and Scan bodies carry values from one iteration to the next (their state's type is part of the body's
interface): :func:`refuse_loops` refuses them with their name.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.ir.types import value_types


def subgraphs(graph: onnx.GraphProto) -> Iterator[tuple[onnx.NodeProto, onnx.AttributeProto, onnx.GraphProto]]:
    """Each body directly inside ``graph``: (its node, the attribute, the body)."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield node, attr, attr.g
            for body in attr.graphs:
                yield node, attr, body


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the bodies inside it, at any depth."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from all_nodes(body)


def refuse_loops(model: onnx.ModelProto, kind: str) -> None:
    """Raise for a Loop or Scan anywhere in ``model``: the pass retypes If branches only."""
    loop = next((n for n in all_nodes(model.graph) if n.op_type in ("Loop", "Scan")), None)
    if loop is not None:
        raise UnsupportedPatternError(
            f"--high-precision {kind}: the model has a {loop.op_type} ('{loop.name}'), whose body carries its state "
            f"from one iteration to the next; the {kind} pass retypes If branches only: convert with "
            "--high-precision fp32 (the default).")


def outer_reads(graph: onnx.GraphProto) -> list[str]:
    """The names ``graph`` (and the bodies inside it) reads from outside itself, in first-read order."""
    local = {o for n in graph.node for o in n.output} | {i.name for i in (*graph.input, *graph.initializer)}
    found: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in local:
                found[name] = None
        for _, _, body in subgraphs(onnx.GraphProto(node=[node])):
            found.update((name, None) for name in outer_reads(body) if name not in local)
    found.update((o.name, None) for o in graph.output if o.name not in local)  # a branch may return an outer value
    return list(found)


def graph_names(graph: onnx.GraphProto) -> set[str]:
    """The tensor and node names ``graph`` defines (not those of its bodies)."""
    return {o for n in graph.node for o in n.output} | {n.name for n in graph.node} | \
        {i.name for i in (*graph.input, *graph.initializer)}


def outer_types(model: onnx.ModelProto, around: dict[str, onnx.TypeProto]) -> dict[str, onnx.TypeProto]:
    """The types of the tensors ``model``'s main graph holds (``around``: those of the graphs around it)."""
    types = dict(around)
    types.update(value_types(model))
    for init in model.graph.initializer:
        types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
    return types


def branch_model(model: onnx.ModelProto, owner: onnx.NodeProto, branch: onnx.GraphProto,
                 types: dict[str, onnx.TypeProto]) -> tuple[onnx.ModelProto, list[str]]:
    """``branch`` (a body of ``owner``, an If of ``model``'s main graph) as a model of its own, and the outer
    names made its inputs (typed by ``types``)."""
    outer = outer_reads(branch)
    sub = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name)
    sub.opset_import.extend(model.opset_import)
    sub.graph.CopyFrom(branch)
    for name in outer:
        if name not in types or not types[name].HasField("tensor_type"):
            raise UnsupportedPatternError(
                f"--high-precision: {owner.op_type} '{owner.name}' reads '{name}' from the graph around it, whose "
                "type onnx's shape inference does not give; convert with --high-precision fp32 (the default).")
        sub.graph.input.append(onnx.helper.make_value_info(name, types[name]))
    return sub, outer


def put_back(branch: onnx.GraphProto, converted: onnx.ModelProto, outer: list[str]) -> None:
    """``converted`` (:func:`branch_model`'s model after the pass) as ``branch``, without the outer inputs."""
    g = onnx.GraphProto()
    g.CopyFrom(converted.graph)
    keep = [i for i in g.input if i.name not in set(outer)]
    del g.input[:]
    g.input.extend(keep)
    branch.CopyFrom(g)
