"""onnxruntime's fused com.microsoft transformer ops, written back as standard ONNX (exact).

``onnxruntime.transformers.optimizer`` fuses transformer subgraphs into com.microsoft ops before
users quantize; TensorRT's ONNX parser has no importer for any of them ("Plugin not found").
Each is rewritten into the standard ops it stands for, which TensorRT imports and fuses again::

    SkipLayerNormalization(x, skip, γ, β, bias)  →  s = x + skip (+ bias); LayerNormalization(s, γ, β)
                                                    (output 3, when used, is s)
    SkipSimplifiedLayerNormalization(x, skip, γ) →  s = x + skip; s / √(mean(s²) + ε) · γ
    SimplifiedLayerNormalization(x, γ)           →  x / √(mean(x²) + ε) · γ
    LayerNormalization(x, γ, β) (contrib, < 17)  →  LayerNormalization's decomposition
    Gelu(x)                                      →  0.5·x·(1 + erf(x/√2))
    BiasGelu(x, b)                               →  Gelu(x + b)
    FastGelu(x[, b])                             →  0.5·y·(1 + tanh(√(2/π)·(y + 0.044715·y³))), y = x (+ b)
    QuickGelu(x, α)                              →  x·sigmoid(α·x)
    BiasAdd(x, b, skip)                          →  x + b + skip

LayerNormalization is written as the ONNX op at opset ≥ 17 (so SmoothQuant finds it) and as its
ReduceMean/Sqrt decomposition below. A node whose mean or inverse-deviation output is read
(training graphs only) is left as it is, and lifting names it.
"""

from __future__ import annotations

import math

import onnx_graphsurgeon as gs

from trt_bridge.ir.graph_builder import GraphBuilder, present
from trt_bridge.ir.names import NameAllocator
from trt_bridge.prepare.change import Change

MS = "com.microsoft"


class _Builder(GraphBuilder):
    """The lift rules' graph builder, with the normalizations and activations onnxruntime fuses."""

    def rms_norm(self, x: gs.Tensor, gamma: gs.Tensor, eps: float, axis: int, out=None) -> gs.Tensor:
        mean_sq = self.reduce("ReduceMean", self.op("Mul", [x, x]), [axis], 1, self.dtype)
        denom = self.op("Sqrt", [self.op("Add", [mean_sq, self.const(eps)])])
        return self.op("Mul", [self.op("Div", [x, denom]), gamma], out=out)

    def gelu(self, x: gs.Tensor, out=None) -> gs.Tensor:
        erf = self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0))])])
        half_x = self.op("Mul", [x, self.const(0.5)])
        return self.op("Mul", [half_x, self.op("Add", [erf, self.const(1.0)])], out=out)

    def fast_gelu(self, x: gs.Tensor, out=None) -> gs.Tensor:
        cube = self.op("Mul", [self.op("Mul", [x, x]), x])
        inner = self.op("Add", [x, self.op("Mul", [cube, self.const(0.044715)])])
        tanh = self.op("Tanh", [self.op("Mul", [inner, self.const(math.sqrt(2.0 / math.pi))])])
        half_x = self.op("Mul", [x, self.const(0.5)])
        return self.op("Mul", [half_x, self.op("Add", [tanh, self.const(1.0)])], out=out)


def _used(node: gs.Node, i: int, graph_outputs: set[str]) -> bool:
    return len(node.outputs) > i and _used_tensor(node.outputs[i], graph_outputs)


class DefuseOrtOps:
    name = "defuse-ort-ops"
    OPS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
           "LayerNormalization", "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "BiasAdd")

    def apply(self, graph: gs.Graph) -> list[Change]:
        changes: list[Change] = []
        names = NameAllocator(graph)
        outputs = {t.name for t in graph.outputs}
        for node in [n for n in graph.nodes if n.domain == MS and n.op in self.OPS]:
            what = self._rewrite(graph, names, node, outputs)
            if what is not None:
                changes.append(Change(self.name, node.name, what))
        return changes

    def _rewrite(self, graph: gs.Graph, names: NameAllocator, node: gs.Node, graph_outputs: set[str]) -> str | None:
        op = node.op
        if op.endswith("LayerNormalization") and not op.startswith("Skip") and (
                _used(node, 1, graph_outputs) or _used(node, 2, graph_outputs)):
            return None  # its mean / inverse deviation are read (training graphs): lifting names it
        if op == "LayerNormalization" and int(node.attrs.get("axis", -1)) != -1:
            return None  # normalized over several trailing axes: lifting names it
        if op.startswith("Skip") and (_used(node, 1, graph_outputs) or _used(node, 2, graph_outputs)):
            return None  # its mean / inverse deviation are read (training graphs): lifting names it
        ins = [present(node, i) for i in range(len(node.inputs))] + [None] * 5
        outs = list(node.outputs)
        x, out = ins[0], outs[0]
        b = _Builder(graph, names, node.name, x.dtype or out.dtype)
        eps = float(node.attrs.get("epsilon", 1e-12 if op.startswith("Skip") else 1e-5))
        axis = int(node.attrs.get("axis", -1))
        node.outputs.clear()  # detached first: the last new node of each chain produces the old tensor
        node.inputs.clear()
        if op.startswith("Skip"):
            total = b.op("Add", [x, ins[1]])
            bias = ins[4] if op == "SkipLayerNormalization" else ins[3]
            if bias is not None:
                total = b.op("Add", [total, bias])
            if len(outs) > 3 and _used_tensor(outs[3], graph_outputs):
                b.op("Identity", [total], out=outs[3])
            if op == "SkipLayerNormalization":
                b.layer_norm(total, ins[2], ins[3], eps, out=out)
                return "SkipLayerNormalization → Add + LayerNormalization"
            b.rms_norm(total, ins[2], eps, -1, out=out)
            return "SkipSimplifiedLayerNormalization → Add + RMS normalization"
        if op == "SimplifiedLayerNormalization":
            b.rms_norm(x, ins[1], eps, axis, out=out)
            return "SimplifiedLayerNormalization → RMS normalization"
        if op == "LayerNormalization":
            b.layer_norm(x, ins[1], ins[2], eps, out=out, axis=axis)
            return "LayerNormalization (onnxruntime's, below opset 17) → its decomposition"
        if op == "BiasAdd":
            b.op("Add", [b.op("Add", [x, ins[1]]), ins[2]], out=out)
            return "BiasAdd → Add + Add"
        if op == "QuickGelu":
            alpha = float(node.attrs.get("alpha", 1.702))
            b.op("Mul", [x, b.op("Sigmoid", [b.op("Mul", [x, b.const(alpha)])])], out=out)
            return "QuickGelu → x·Sigmoid(αx)"
        if op in ("BiasGelu", "FastGelu") and ins[1] is not None:
            x = b.op("Add", [x, ins[1]])
        if op == "FastGelu":
            b.fast_gelu(x, out=out)
            return "FastGelu → tanh approximation of GELU"
        b.gelu(x, out=out)
        return f"{op} → GELU with Erf"


def _used_tensor(tensor: gs.Tensor, graph_outputs: set[str]) -> bool:
    return tensor.name != "" and (bool(tensor.outputs) or tensor.name in graph_outputs)
