"""Placement policies: which annotated tensors get Q/DQ in the output, and on which edges.

``tensorrt`` (the default) follows TensorRT's explicit-quantization fusion rules:
quantize the data and weight inputs of weighted ops (Conv, ConvTranspose, MatMul,
Gemm) and nothing on their outputs; TensorRT fuses the DQ into the op and the
next Q into its epilogue. Edges the policy drops are reported as left in float.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations

#: op type → input indices that may read a quantized tensor
QUANTIZABLE_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (0, 1),
    "ConvTranspose": (0, 1),
    "MatMul": (0, 1),
    "Gemm": (0, 1),
}


class PlacementPolicy(str, enum.Enum):
    TENSORRT = "tensorrt"


@dataclass(frozen=True)
class LeftInFloat:
    tensor: str
    node: str
    reason: str


def place(graph: gs.Graph, annotations: Annotations,
          policy: PlacementPolicy = PlacementPolicy.TENSORRT) -> list[LeftInFloat]:
    """Restrict annotation sites to what ``policy`` quantizes; return the edges left in float."""
    ops = {n.name: n.op for n in graph.nodes}
    dropped: list[LeftInFloat] = []
    for table in (annotations.activations, annotations.weights):
        for name in sorted(table):
            spec = table[name]
            keep = []
            for site in spec.sites:
                op = ops.get(site.node)
                if op is not None and site.index in QUANTIZABLE_INPUTS.get(op, ()):
                    keep.append(site)
                else:
                    dropped.append(LeftInFloat(name, site.node, f"input {site.index} of {op} is not "
                                               f"quantized under the '{policy.value}' placement"))
            spec.sites = keep
            if not keep:
                del table[name]
    return dropped
