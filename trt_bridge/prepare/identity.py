"""Identity chains: readers read the source; a graph output is written by the source's producer.

Before:                                        After:
  x ─ Conv ─ c ─ Identity ─ t ─ Relu ─ r         x ─ Conv ─ y ─ Relu ─ r
             └─ Identity ─ y   (graph output)    (the graph output keeps its name; Relu reads it)

An Identity whose output is a graph output stays when its source is a graph input,
a constant or another graph output (an output must be written by a node, and two
outputs cannot be one tensor), or when the graph has subgraphs, which may refer to
the source by name.

``bypass`` is shared with the other passes that remove a node passing a tensor through
(Dropout, a Cast to the type its input already has).
"""

from __future__ import annotations

import logging

import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import redirect
from trt_bridge.prepare.change import Change

log = logging.getLogger("trt_bridge.prepare")


def has_subgraphs(graph: gs.Graph) -> bool:
    return any(isinstance(sub, gs.Graph) for node in graph.nodes for value in node.attrs.values()
               for sub in (value if isinstance(value, list) else [value]))


def is_graph_output(graph: gs.Graph, tensor: gs.Tensor) -> bool:
    return any(t is tensor for t in graph.outputs)


def bypass(graph: gs.Graph, source: gs.Tensor, output: gs.Tensor) -> str | None:
    """Make the readers of ``output`` read ``source`` (equal in value), and detach ``output``
    from its producer. A graph output keeps its name: ``source`` takes it.

    Returns None when done; otherwise the reason it cannot, with the graph untouched.
    """
    if is_graph_output(graph, output):
        where = f"its output '{output.name}' is a graph output and its input '{source.name}'"
        if isinstance(source, gs.Constant):
            return f"{where} is a constant"
        if any(t is source for t in graph.inputs):
            return f"{where} is a graph input"
        if is_graph_output(graph, source):
            return f"{where} is a graph output too"
        if not source.inputs:
            return f"{where} has no producer"
        if has_subgraphs(graph):
            return f"{where} may be referred to by name from a subgraph"
    redirect(list(output.outputs), output, source)
    if is_graph_output(graph, output):
        name, output.name = output.name, f"{output.name}__bypassed"
        for i, tensor in enumerate(graph.outputs):
            if tensor is output:
                graph.outputs[i] = source
        source.name = name
        if output.dtype is not None:
            source.dtype = output.dtype
        if output.shape is not None:
            source.shape = output.shape
    output.inputs.clear()
    return None


def written_by(tensor: gs.Tensor) -> str:
    """'Conv 'conv1'': the node that writes ``tensor``, for messages."""
    return f"{tensor.inputs[0].op} '{tensor.inputs[0].name}'" if tensor.inputs else "no node"


class RemoveIdentity:
    name = "remove-identity"

    def apply(self, graph: gs.Graph) -> list[Change]:
        changes = []
        for node in [n for n in graph.nodes if n.op == "Identity" and (n.domain or "") in ("", "ai.onnx")
                     and len(n.inputs) == 1 and len(n.outputs) == 1]:
            source, output = node.inputs[0], node.outputs[0]
            at_output, was = is_graph_output(graph, output), source.name
            reason = bypass(graph, source, output)
            if reason is not None:
                log.debug("kept Identity '%s': %s", node.name, reason)
                continue
            what = f"removed Identity: readers of '{output.name}' read '{was}'"
            if at_output:
                what = f"removed Identity: graph output '{source.name}' is now written by {written_by(source)}"
            changes.append(Change(self.name, node.name, what))
        return changes


def output_note(at_output: bool, source: gs.Tensor) -> str:
    """After ``bypass`` gave a graph output's name to ``source``: "; graph output 'y' is now written by
    Conv 'conv1'"; else ''."""
    return f"; graph output '{source.name}' is now written by {written_by(source)}" if at_output else ""
