"""Fresh node and tensor names for the passes that add nodes to a graph (lifting, preparation, calibration,
lowering)."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs


class NameAllocator:
    """Hands out node and tensor names that do not clash with any in the graph."""

    def __init__(self, graph: gs.Graph):
        self._taken: set[str] = set()
        self._take_all(graph)

    def _take_all(self, graph: gs.Graph) -> None:
        """Every node and tensor name of ``graph`` and of its control-flow bodies (names are unique model-wide)."""
        self._taken |= {n.name for n in graph.nodes} | set(graph.tensors().keys())
        for node in graph.nodes:
            for value in node.attrs.values():
                for sub in value if isinstance(value, list) else [value]:
                    if isinstance(sub, gs.Graph):
                        self._take_all(sub)

    def __call__(self, base: str) -> str:
        name, i = base, 1
        while name in self._taken:
            name = f"{base}_{i}"
            i += 1
        self._taken.add(name)
        return name


def unique_node_names(nodes: list[tuple[str, str]]) -> list[str]:
    """For (name, op type) of each node in graph order: a unique name for each, the nodes' own where they
    have one (``<op>_<index>`` otherwise, a duplicate suffixed with its index)."""
    seen: set[str] = set()
    names = []
    for i, (name, op) in enumerate(nodes):
        name = name or f"{op}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        names.append(name)
        seen.add(name)
    return names


def node_label(node: onnx.NodeProto, index: int) -> str:
    """``node``'s name, or for an unnamed one (at ``index`` in its graph) the name :func:`name_nodes` gives it."""
    return node.name or f"{node.op_type}_{index}"


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique name: rules, sites and reports refer to nodes by name. A node inside a
    control-flow body is named model-wide too (an unnamed one ``<control-flow node>/<attribute>/<op>_<index>``)."""
    for node, name in zip(model.graph.node, unique_node_names([(n.name, n.op_type) for n in model.graph.node])):
        node.name = name
    seen = {n.name for n in model.graph.node}

    def bodies(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for attr in node.attribute:
                for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    for i, inner in enumerate(body.node):
                        name = inner.name or f"{node.name}/{attr.name}/{inner.op_type}_{i}"
                        while name in seen:
                            name = f"{name}_{i}"
                        inner.name = name
                        seen.add(name)
                    bodies(body)

    bodies(model.graph)

