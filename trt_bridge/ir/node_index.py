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

    @classmethod
    def of_body(cls, body: onnx.GraphProto, outer: NodeIndex, value_info=()) -> NodeIndex:
        """The index of a control-flow body (an ``If`` branch): its own nodes, readers and outputs, the constants,
        types and shapes of its scope (the outer graph's, then its own; ``value_info``: its tensors' inferred
        types where the body holds none)."""
        ix = cls.__new__(cls)
        ix.nodes = list(body.node)
        ix.producer = {o: i for i, n in enumerate(ix.nodes) for o in n.output if o}
        ix.readers = {}
        for i, n in enumerate(ix.nodes):
            for name in (*n.input, *body_reads(n)):
                ix.readers.setdefault(name, []).append(i)
        ix.outputs = {o.name for o in body.output}
        ix.constants = dict(outer.constants)
        ix.constants.update({t.name: t for t in body.initializer})
        ix.constants.update({n.output[0]: a.t for n in body.node if n.op_type == "Constant" and n.output
                             for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR})
        ix.types, ix.shapes = dict(outer.types), dict(outer.shapes)
        for v in (*value_info, *body.value_info, *body.input, *body.output):
            if v.type.HasField("tensor_type"):
                ix.types[v.name] = v.type.tensor_type.elem_type
                if v.type.tensor_type.HasField("shape"):
                    ix.shapes[v.name] = v.type.tensor_type.shape
        ix.types.update({t.name: t.data_type for t in body.initializer})
        return ix

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


def drop_unused(model: onnx.ModelProto | onnx.GraphProto) -> None:
    """Remove the nodes and initializers nothing reads any more (the fused blocks' constants and shape inputs), from
    a model's main graph or from a graph (a control-flow body: what it does not read may be read outside)."""
    g = model.graph if isinstance(model, onnx.ModelProto) else model
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
