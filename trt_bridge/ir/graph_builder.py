"""Append standard ONNX ops to a graph, for the rules that write a fused op back as the ops it stands for.

Every node and tensor gets a fresh name under ``base``; constants take the float type of the
computation (``dtype``; float32 where it is unknown, and new tensors are then left untyped); ops
whose inputs moved from attributes to inputs across opsets (Unsqueeze, Split, ReduceSum, ReduceMean
at 13 and 18) are written for the graph's opset. The lift rules and the preparation step for
onnxruntime's fused ops (``prepare/ort_fused.py``) build with it.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.names import NameAllocator


class GraphBuilder:
    def __init__(self, graph: gs.Graph, names: NameAllocator, base: str, dtype=None):
        self.graph, self.names, self.base = graph, names, base
        self.dtype = np.dtype(dtype) if dtype is not None else None

    def const(self, value, dtype=None) -> gs.Constant:
        return gs.Constant(self.names(f"{self.base}/c"), np.array(value, dtype=dtype or self.dtype or np.float32))

    def ints(self, values: list[int]) -> gs.Constant:
        return gs.Constant(self.names(f"{self.base}/ints"), np.array(values, np.int64))

    def op(self, op: str, inputs: list, attrs: dict | None = None, out: gs.Tensor | None = None,
           dtype=None) -> gs.Tensor:
        if out is None:
            out = gs.Variable(self.names(f"{self.base}/{op}_out"), dtype=dtype if dtype is not None else self.dtype)
        self.graph.nodes.append(gs.Node(op, self.names(f"{self.base}/{op}"), attrs or {}, inputs, [out]))
        return out

    def unsqueeze(self, x: gs.Tensor, axes: list[int], dtype) -> gs.Tensor:
        if self.graph.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)], dtype=dtype)
        return self.op("Unsqueeze", [x], {"axes": axes}, dtype=dtype)

    def split(self, x: gs.Tensor, sizes: list[int], axis: int) -> list[gs.Tensor]:
        outs = [gs.Variable(self.names(f"{self.base}/split_out"), dtype=self.dtype) for _ in sizes]
        if self.graph.opset >= 13:
            node = gs.Node("Split", self.names(f"{self.base}/Split"), {"axis": axis}, [x, self.ints(sizes)], outs)
        else:
            node = gs.Node("Split", self.names(f"{self.base}/Split"), {"axis": axis, "split": sizes}, [x], outs)
        self.graph.nodes.append(node)
        return outs

    def dim(self, x: gs.Tensor, axis: int, scalar: bool) -> gs.Tensor:
        """``x.shape[axis]`` as an int64 scalar, or as a 1-D tensor of one element."""
        index = gs.Constant(self.names(f"{self.base}/axis"), np.array(axis if scalar else [axis], np.int64))
        return self.op("Gather", [self.op("Shape", [x], dtype=np.int64), index], {"axis": 0}, dtype=np.int64)

    def reduce(self, op: str, x: gs.Tensor, axes: list[int], keepdims: int, dtype, out=None) -> gs.Tensor:
        if self.graph.opset >= (13 if op == "ReduceSum" else 18):
            return self.op(op, [x, self.ints(axes)], {"keepdims": keepdims}, out=out, dtype=dtype)
        return self.op(op, [x], {"axes": axes, "keepdims": keepdims}, out=out, dtype=dtype)

    def layer_norm(self, x: gs.Tensor, gamma: gs.Tensor, beta: gs.Tensor | None, eps: float,
                   out: gs.Tensor | None = None, axis: int = -1) -> gs.Tensor:
        """LayerNormalization over ``axis`` (the last one unless told): the ONNX op at opset >= 17, its
        decomposition below."""
        if self.graph.opset >= 17:
            inputs = [x, gamma] + ([beta] if beta is not None else [])
            return self.op("LayerNormalization", inputs, {"axis": axis, "epsilon": eps}, out=out)
        centred = self.op("Sub", [x, self.reduce("ReduceMean", x, [axis], 1, self.dtype)])
        var = self.reduce("ReduceMean", self.op("Mul", [centred, centred]), [axis], 1, self.dtype)
        normed = self.op("Div", [centred, self.op("Sqrt", [self.op("Add", [var, self.const(eps)])])])
        if beta is None:
            return self.op("Mul", [normed, gamma], out=out)
        return self.op("Add", [self.op("Mul", [normed, gamma]), beta], out=out)


def present(node: gs.Node, index: int) -> gs.Tensor | None:
    """Input ``index`` of ``node``, or None where it is absent or empty."""
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index].name else None


def used(node: gs.Node, index: int, graph: gs.Graph) -> bool:
    """Output ``index`` of ``node`` exists and is read (by a node or as a graph output)."""
    if len(node.outputs) <= index or not node.outputs[index].name:
        return False
    t = node.outputs[index]
    return bool(t.outputs) or any(o is t for o in graph.outputs)


def redirect(readers: list[gs.Node], old: gs.Tensor, new: gs.Tensor) -> None:
    """Make each of ``readers`` read ``new`` wherever it read ``old``."""
    for reader in readers:
        for i, tensor in enumerate(reader.inputs):
            if tensor is old:
                reader.inputs[i] = new
