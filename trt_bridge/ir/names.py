"""Fresh node and tensor names for the passes that add nodes to a graph (lifting, preparation, calibration,
lowering)."""

from __future__ import annotations

import onnx_graphsurgeon as gs


class NameAllocator:
    """Hands out node and tensor names that do not clash with any in the graph."""

    def __init__(self, graph: gs.Graph):
        self._taken = {n.name for n in graph.nodes} | set(graph.tensors().keys())

    def __call__(self, base: str) -> str:
        name, i = base, 1
        while name in self._taken:
            name = f"{base}_{i}"
            i += 1
        self._taken.add(name)
        return name
