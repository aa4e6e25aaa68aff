"""An ``If`` whose condition is a constant is the branch it takes, inlined into the graph that holds it::

    Before:                                                  After:
      c = Constant(true)                                       x ─ Conv(W) ─ t ─ Relu ─ y    (y keeps the If's
      x ─▶ If(c) ─ y, z                                        x ─ Identity ─ z               output names)
           ├ then: x ─ Conv(W) ─ t ─ Relu ─ y'; z' = x  (reads x from outside)
           └ else: ...

Exporters leave such Ifs in recurrent and audio models once shapes are folded: torch's batch checks on an RNN's
state (Silero VAD's decoder: ``If(Cast(Shape(state)[0]))``, nested in its sample-rate ``If``). onnx-graphsurgeon's
own flattening (``fold_constants(flatten_subgraphs=True)``) rebinds the producer of each branch output to the If's
output, so a branch tensor that is also read inside the branch, or given twice, or that is an outer-scope value or a
constant, is left without a producer ("... is not output of any previous nodes"), and it renames the outer constants
the branch reads. Here every If output is the branch output's own producer's output where that is safe (a local
tensor produced in the branch, read by nothing else, given once), else an ``Identity`` of it; nested bodies move with
their nodes (they read tensors as objects, so their outer-scope references stay resolved); a branch tensor whose name
another graph of the model uses is renamed.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trt_bridge.ir.graphs import graphs
from trt_bridge.ir.names import NameAllocator
from trt_bridge.ir.types import skeleton
from trt_bridge.prepare.branches import move_branch
from trt_bridge.prepare.change import Change

NAME = "constant-if"


def match(node: gs.Node) -> str | None:
    """Why ``node`` is not an If to inline (None when it is one)."""
    if node.op != "If" or (node.domain or "") not in ("", "ai.onnx"):
        return "not an If"
    if not node.inputs or not isinstance(node.inputs[0], gs.Constant):
        return "its condition is computed at run time"
    if np.asarray(node.inputs[0].values).size != 1:
        return "its condition is not a single value"
    branch = node.attrs.get("then_branch" if _taken(node) else "else_branch")
    if not isinstance(branch, gs.Graph) or len(branch.outputs) != len(node.outputs):
        return "its branch does not give one value per output"
    return None


def _taken(node: gs.Node) -> bool:
    return bool(np.asarray(node.inputs[0].values).reshape(-1)[0])


def rewrite(graph: gs.Graph, node: gs.Node, root: gs.Graph) -> Change:
    """Inline the branch ``node`` (an If of ``graph`` that :func:`match` accepted) takes; ``root``: the model's main
    graph (names must be unique across all of it)."""
    which = "then_branch" if _taken(node) else "else_branch"
    branch: gs.Graph = node.attrs[which]
    local = {id(t) for n in branch.nodes for t in n.outputs}
    given = [id(t) for t in branch.outputs]
    outputs, values = list(node.outputs), list(branch.outputs)
    node.inputs.clear()
    node.outputs.clear()
    index = graph.nodes.index(node)
    del graph.nodes[index]
    added = move_branch(graph, index, branch, root)
    names = NameAllocator(root)
    for out, value in zip(outputs, values):
        if id(value) in local and given.count(id(value)) == 1 and not value.outputs and len(value.inputs) == 1:
            producer = value.inputs[0]  # the If's output name stays: a graph output keeps its name
            producer.outputs[[i for i, t in enumerate(producer.outputs) if t is value][0]] = out
        else:
            identity = gs.Node("Identity", names(f"{node.name}/{out.name}/identity"), inputs=[value], outputs=[out])
            graph.nodes.insert(index + len(added), identity)
            added.append(identity)
    return Change(NAME, node.name, f"If on a constant condition ({which[:4]} taken) inlined: {len(added)} node(s)")


def inline_constant_ifs(graph: gs.Graph) -> list[Change]:
    """Inline every If of ``graph`` and of its bodies whose condition is a constant (in place), outer ones first,
    until none is left; the graph is sorted again where one was."""
    changes: list[Change] = []

    def visit(g: gs.Graph) -> None:
        index = 0
        while index < len(g.nodes):
            node = g.nodes[index]
            if match(node) is None:
                changes.append(rewrite(g, node, graph))
                continue  # the branch's nodes now stand at index: an If among them is seen next
            for value in node.attrs.values():
                for sub in value if isinstance(value, list) else [value]:
                    if isinstance(sub, gs.Graph):
                        visit(sub)
            index += 1

    visit(graph)
    if changes:
        graph.toposort()
    return changes


def refresh_shapes(graph: gs.Graph) -> None:
    """Give the tensors of ``graph`` and of its bodies that have no shape the one onnx infers (in place): an inlined
    branch's tensors carry none, and a nested If's condition (``Size(Shape(state)) == 3``: a rank test) folds only
    once its input's rank is known."""
    model = skeleton(gs.export_onnx(graph, do_type_check=False))
    inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    known = {}
    for g in graphs(inferred.graph):
        for info in (*g.value_info, *g.output):
            kind = info.type.tensor_type
            if kind.HasField("shape") and kind.elem_type:
                known[info.name] = ([d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                     for d in kind.shape.dim], kind.elem_type)
    stack = [graph]
    while stack:
        g = stack.pop()
        for tensor in g.tensors().values():
            if isinstance(tensor, gs.Variable) and tensor.shape is None and tensor.name in known:
                shape, elem = known[tensor.name]
                tensor.shape = shape
                if tensor.dtype is None:
                    tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        stack.extend(sub for n in g.nodes for v in n.attrs.values()
                     for sub in (v if isinstance(v, list) else [v]) if isinstance(sub, gs.Graph))
