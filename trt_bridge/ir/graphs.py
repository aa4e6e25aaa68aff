"""The graphs of a model: the main graph and the control-flow bodies nested in its nodes' attributes (``If``
branches, ``Loop``/``Scan`` bodies), for the passes that read or repair every one of them."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph``, then every graph nested in its nodes' attributes, depth first (a body before the bodies in it)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield from graphs(sub)


def bodies(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Every graph nested in ``graph``'s nodes (:func:`graphs` without ``graph`` itself)."""
    nested = graphs(graph)
    next(nested)
    yield from nested
