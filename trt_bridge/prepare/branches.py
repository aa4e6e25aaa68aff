"""Moving an If branch's nodes into the graph that holds the If (``constant_if``: the branch a constant condition
takes; ``select_branches``: both branches of an If that holds control flow, selected by ``Where``)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from trt_bridge.ir.names import NameAllocator


def names_except(graph: gs.Graph, skip: gs.Graph) -> set[str]:
    """Every tensor and node name of ``graph`` and of the bodies under it, ``skip``'s (and those under it) left out."""
    found = {n.name for n in graph.nodes} | set(graph.tensors().keys())
    for node in graph.nodes:
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, gs.Graph) and sub is not skip:
                    found |= names_except(sub, skip)
    return found


def move_branch(graph: gs.Graph, index: int, branch: gs.Graph, root: gs.Graph) -> list[gs.Node]:
    """Insert ``branch``'s nodes into ``graph`` at ``index`` (``branch`` is left empty); returns them. A node or
    tensor of the branch whose name another graph of the model (``root``: the main graph) uses is renamed, so names
    stay unique model-wide. Nested bodies move with their nodes: they hold tensors as objects, so their outer-scope
    references stay resolved."""
    others = names_except(root, skip=branch)
    names = NameAllocator(root)
    moved = list(branch.nodes)
    for node in moved:
        if node.name in others:
            node.name = names(f"{node.name}/inlined")
        for tensor in node.outputs:
            if tensor.name in others:
                tensor.name = names(f"{tensor.name}/inlined")
    branch.nodes.clear()
    graph.nodes[index:index] = moved
    return moved
