"""An AveragePool whose window covers its whole input is a GlobalAveragePool.

Before:                                                        After:
  x[N, C, 2, 2] ─ AveragePool(kernel 320×320, strides 320,       x[N, C, 2, 2] ─ GlobalAveragePool ─ y[N, C, 1, 1]
                              ceil_mode=1, pads 0) ─ y[N, C, 1, 1]

Exporters write global pooling this way: transformers' EfficientNet pools with
``nn.AvgPool2d(hidden_dim, ceil_mode=True)``, a window sized by the channel count rather than
the feature map. TensorRT refuses pooling windows of 100,000 elements or more ("Parameter check
failed ... volume(windowSize) < maxKernelDimsProduct"), whatever the input's size. With no
padding, the window clipped to the input averages every element of it, exactly what
GlobalAveragePool computes. Only nodes with static spatial dimensions, no padding and a 1×…×1
output are rewritten.
"""

from __future__ import annotations

import math

import onnx_graphsurgeon as gs

from trt_bridge.ir.types import infer_shapes
from trt_bridge.prepare.change import Change

#: why a pool's window cannot be compared with its input yet (shapes unknown until constants are folded)
UNKNOWN_RANK, UNKNOWN_DIMS = "its input's rank is unknown", "its input's spatial dimensions are not static"


def _covers_input(node: gs.Node) -> str | None:
    """Why ``node`` is not a global average pool, or None when it is one."""
    shape = node.inputs[0].shape
    kernel = list(node.attrs.get("kernel_shape", []))
    if shape is None or len(shape) != len(kernel) + 2:
        return UNKNOWN_RANK
    spatial = shape[2:]
    if not all(isinstance(d, int) and d > 0 for d in spatial):
        return UNKNOWN_DIMS
    if any(p != 0 for p in node.attrs.get("pads", [])) or node.attrs.get("auto_pad", "NOTSET") not in (
            "NOTSET", "VALID", b"NOTSET", b"VALID"):
        return "it pads its input"
    if any(d != 1 for d in node.attrs.get("dilations", [])):
        return "it is dilated"
    strides = list(node.attrs.get("strides", [1] * len(kernel)))
    ceil = bool(node.attrs.get("ceil_mode", 0))
    for d, k, s in zip(spatial, kernel, strides):
        if k < d:
            return "its window is smaller than its input"
        out = (math.ceil if ceil else math.floor)((d - k) / s) + 1
        if out != 1:
            return "its output is not 1 along every spatial axis"
    return None


class GlobalAveragePool:
    name = "global-average-pool"

    def apply(self, graph: gs.Graph) -> list[Change]:
        changes = []
        for node in [n for n in graph.nodes if n.op == "AveragePool" and (n.domain or "") in ("", "ai.onnx")]:
            if _covers_input(node) is not None:
                continue
            kernel = "×".join(str(k) for k in node.attrs["kernel_shape"])
            node.op = "GlobalAveragePool"
            node.attrs.clear()
            changes.append(Change(self.name, node.name, f"AveragePool with a {kernel} window over its whole "
                                  f"{'×'.join(str(d) for d in node.inputs[0].shape[2:])} input written as "
                                  "GlobalAveragePool (TensorRT refuses windows of 100,000 elements or more)"))
        return changes


def after_folding(graph: gs.Graph) -> list[Change]:
    """The same rewrite once constants are folded: an exporter that computes its padding at run time (transformers'
    EfficientNet) leaves the pool's input shape unknown until the padding is a constant. Shapes are inferred again
    only where an AveragePool's input is not static, on the graph's skeleton (no weights copied to C++)."""
    if not any(n.op == "AveragePool" for n in graph.nodes):
        return []
    pools = [n for n in graph.nodes if n.op == "AveragePool" and _covers_input(n) in (UNKNOWN_RANK, UNKNOWN_DIMS)]
    if not pools:
        return GlobalAveragePool().apply(graph)
    inferred = infer_shapes(gs.export_onnx(graph, do_type_check=False))
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in inferred.graph.value_info if v.type.tensor_type.HasField("shape")}
    del inferred
    for node in pools:
        shape = shapes.get(node.inputs[0].name)
        if shape is not None and all(isinstance(d, int) and d > 0 for d in shape[2:]):
            node.inputs[0].shape = [d if d is not None else f"unk_{i}" for i, d in enumerate(shape)]
    return GlobalAveragePool().apply(graph)
