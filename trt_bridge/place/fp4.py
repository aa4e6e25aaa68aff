"""``--fp4``: NVFP4 W4A4 where TensorRT runs it, FP8 elsewhere (compute capability 10.0 and newer).

TensorRT runs FP4 for matrix multiplications: an activation quantized per inference in blocks of 16 along its last
axis (``TRT_FP4DynamicQuantize``, FP8 E4M3 block scales under one calibrated FP32 global scale) times a weight of FP4
E2M1 blocks of 16 along the reduction axis. An activation goes FP4 when every layer that reads it is such a GEMM:
input 0 of a MatMul, or of a Gemm that does not transpose it, whose other input is a constant 2-D weight with a
reduction axis that blocks of 16 divide. Every other quantized activation (convolutions, attention's activation ×
activation MatMuls, a tensor one of whose readers is not such a GEMM) is FP8::

    Before (placement):  x ─ Q/DQ ─ MatMul(W)           y ─ Q/DQ ─ Conv(K)
    After:               x ─ FP4 per inference (16) ─ MatMul(W: FP4 blocks of 16)
                         y ─ FP8 Q/DQ ─ Conv(K: FP8 per channel)

The weights follow their layers' activation format (:mod:`trt_bridge.place.formats`). Sensitive layers are what
placement and the accuracy target leave in float, as with INT8.
"""

from __future__ import annotations

import re

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations
from trt_bridge.formats import FP4, FP8

#: TensorRT's dynamic FP4 block: 16 values along the last axis
BLOCK = FP4.block_size


def fp4_reader(node: gs.Node, index: int) -> str | None:
    """Why TensorRT's FP4 GEMM cannot take input ``index`` of ``node`` as its activation (None: it can)."""
    if node.op not in ("MatMul", "Gemm") or index != 0:
        return f"{node.op} input {index} is not a GEMM's activation"
    if node.op == "Gemm" and node.attrs.get("transA", 0):
        return "a Gemm with transA transposes its activation"
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    shape = getattr(weight, "shape", None)
    if not isinstance(weight, gs.Constant) or shape is None or len(shape) != 2:
        return "its weight is not a constant 2-D tensor"
    k = shape[1] if node.op == "Gemm" and node.attrs.get("transB", 0) else shape[0]
    if k % BLOCK:
        return f"its reduction axis ({k}) is not a multiple of {BLOCK}"
    return None


def fp4_activations(graph: gs.Graph, annotations: Annotations, fp8_nodes: str | None = None) -> dict[str, str]:
    """Set each quantized activation's format (in place): FP4 where every reader is an FP4 GEMM that ``fp8_nodes``
    (a regular expression of node names, --fp8-nodes) does not name, else FP8; return the FP8 ones with the
    reason."""
    nodes = {n.name: n for n in graph.nodes}
    named = re.compile(fp8_nodes) if fp8_nodes else None
    fp8: dict[str, str] = {}
    for name in sorted(annotations.activations):
        spec = annotations.activations[name]
        why = next((w for s in spec.sites if (w := fp4_reader(nodes[s.node], s.index) if s.node in nodes
                                              else "its reader is in a control-flow body")), None)
        if why is None and named is not None and any(named.search(s.node) for s in spec.sites):
            why = "--fp8-nodes names its reader"
        spec.format = FP4 if why is None else FP8
        if why is not None:
            fp8[name] = why
    return fp8


def global_scale(int8_scale: float) -> np.ndarray:
    """The FP32 global scale of an FP4 activation whose range is ±amax (``int8_scale`` = amax / 127): amax / (6 ·
    448), so a block holding amax gets FP8's largest block scale."""
    return np.asarray(FP4.scale_of(int8_scale) / FP8.qmax, np.float32)
