"""A ``Squeeze`` without axes gets the axes its input's shape says, as TensorRT needs them::

    Before (opset 9, torch's ``x.squeeze()`` on a batch of one):   After:
      x [1, C, T] ─ Squeeze ─ y [C, T]                             x [1, C, T] ─ Squeeze(axes [0]) ─ y [C, T]
                                                                   (opset 13+: axes a constant input)

ONNX squeezes every dimension that is 1 *at run time*; TensorRT fixes the output's rank when it builds, so it refuses
a Squeeze without axes on an input with a dynamic dimension ("ISqueezeLayer without an axes input requires dimension
2 to not be 1 at runtime, because squeezing it would change the output rank"): an opset-9 recurrent model (Conv +
bidirectional GRU, a dynamic length) converts, parses, and does not build. The axes written are the dimensions that
are 1 in the inferred shape, the reading TensorRT itself would take (a dynamic dimension is not squeezed: the
exporter's graph never gives it 1, or the rank of what follows would change with the input). Declined where the
input's rank is unknown or no dimension is known to be 1. ``Unsqueeze`` always carries its axes (an attribute before
opset 13, an input after), so only Squeeze needs this; the main graph only, as every sanitizing pass.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.types import infer_shapes
from trt_bridge.prepare.change import Change

NAME = "squeeze-axes"


def _without_axes(node: gs.Node, opset: int) -> bool:
    if node.op != "Squeeze" or (node.domain or "") not in ("", "ai.onnx"):
        return False
    if opset >= 13:
        return len(node.inputs) < 2 or not node.inputs[1].name
    return "axes" not in node.attrs


def match(node: gs.Node, opset: int) -> str | None:
    """Why ``node`` is not a Squeeze whose axes can be written (None when it is one)."""
    if not _without_axes(node, opset):
        return "not a Squeeze without axes"
    shape = node.inputs[0].shape
    if shape is None:
        return "its input's rank is unknown"
    if not any(d == 1 for d in shape):
        return "no dimension of its input is known to be 1"
    return None


def rewrite(node: gs.Node, opset: int) -> Change:
    """Write the axes of ``node`` (a Squeeze :func:`match` accepted) as its opset takes them."""
    shape = node.inputs[0].shape
    axes = [i for i, d in enumerate(shape) if d == 1]
    if opset >= 13:
        node.inputs[1:] = [gs.Constant(f"{node.name}/axes", np.array(axes, np.int64))]
    else:
        node.attrs["axes"] = axes
    dims = "×".join(str(d) for d in shape)
    return Change(NAME, node.name, f"Squeeze without axes on a {dims} input written with axes {axes} (TensorRT "
                                   "fixes the output's rank when it builds: it refuses a Squeeze without axes on "
                                   "dynamic shapes)")


class SqueezeAxes:
    name = NAME

    def apply(self, graph: gs.Graph) -> list[Change]:
        opset = graph.opset or 13
        found = [n for n in graph.nodes if _without_axes(n, opset)]
        if not found:
            return []
        changes: list[Change] = []
        while found:  # onnx infers no rank past a Squeeze without axes: each one written gives the next its shape
            if any(match(n, opset) is not None for n in found):  # inferred again on the graph's skeleton
                _infer(graph, [n.inputs[0] for n in found])
            done = [n for n in found if match(n, opset) is None]
            if not done:
                break
            changes += [rewrite(n, opset) for n in done]
            found = [n for n in found if n not in done]
        return changes


def _infer(graph: gs.Graph, tensors: list[gs.Tensor]) -> None:
    inferred = infer_shapes(gs.export_onnx(graph, do_type_check=False))
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                       for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
              if v.type.tensor_type.HasField("shape")}
    del inferred
    for tensor in tensors:
        if tensor.name in shapes:
            tensor.shape = shapes[tensor.name]
