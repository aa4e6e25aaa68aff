"""An index of a model's main graph for pattern rules over ``onnx.ModelProto`` (producers, readers, constants, types
and shapes), and the removal of what nothing reads after a rewrite."""

from __future__ import annotations

import numpy as np
import onnx

from trt_bridge.ir.deferred import tensor_array
from trt_bridge.ir.model import constant_protos
from trt_bridge.ir.types import elem_types, value_types


class NodeIndex:
    """Producers, readers and types of a model's main graph (the names its control-flow bodies read count as
    read)."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.nodes = list(g.node)
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.readers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in n.input:
                self.readers.setdefault(name, []).append(i)
            for name in body_reads(n):
                self.readers.setdefault(name, []).append(i)
        self.outputs = {o.name for o in g.output}
        self.constants = constant_protos(model)
        self.types = elem_types(model)
        self.types.update({t.name: t.data_type for t in g.initializer})
        self.shapes = {name: t.tensor_type.shape for name, t in value_types(model).items()
                       if t.tensor_type.HasField("shape")}

    def node(self, tensor: str, op: str) -> tuple[int, onnx.NodeProto] | None:
        i = self.producer.get(tensor)
        if i is None or self.nodes[i].op_type != op or (self.nodes[i].domain or "") not in ("", "ai.onnx"):
            return None
        return i, self.nodes[i]

    def ints(self, tensor: str) -> list[int] | None:
        """A small integer constant's values (a shape, axes), else None."""
        proto = self.constants.get(tensor)
        if proto is None or int(np.prod(proto.dims)) > 8:
            return None
        return [int(x) for x in tensor_array(proto).reshape(-1)]

    def scalar(self, tensor: str) -> float | None:
        """A one-element constant's value, else None."""
        proto = self.constants.get(tensor)
        if proto is None or int(np.prod(proto.dims)) != 1:
            return None
        return float(tensor_array(proto).astype(np.float64).reshape(-1)[0])

    def rank(self, tensor: str) -> int | None:
        if tensor in self.constants:
            return len(self.constants[tensor].dims)
        shape = self.shapes.get(tensor)
        return None if shape is None else len(shape.dim)

    def dim(self, tensor: str, axis: int) -> int | None:
        shape = self.shapes.get(tensor)
        if shape is None or len(shape.dim) <= axis or not shape.dim[axis].HasField("dim_value"):
            return None
        return shape.dim[axis].dim_value


def body_reads(node: onnx.NodeProto) -> set[str]:
    """The names ``node``'s control-flow bodies read (outer-scope tensors among them)."""
    names: set[str] = set()
    for attr in node.attribute:
        for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for n in body.node:
                names.update(n.input)
                names.update(body_reads(n))
    return names


def drop_unused(model: onnx.ModelProto) -> None:
    """Remove the nodes and initializers nothing reads any more (the fused blocks' constants and shape inputs)."""
    g = model.graph
    while True:
        read = {o.name for o in g.output}
        for n in g.node:
            read.update(n.input)
            read.update(body_reads(n))
        dead = [i for i, n in enumerate(g.node) if not any(o in read for o in n.output if o)]
        if not dead:
            break
        for i in reversed(dead):
            del g.node[i]
    keep = [t for t in g.initializer if t.name in read]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)
