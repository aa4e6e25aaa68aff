"""QuantizeLinear/DequantizeLinear written in a vendor domain: the standard ops they are.

Before:  x ─ com.microsoft.QuantizeLinear(s, z:int16) ─ com.microsoft.DequantizeLinear(s, z) ─ MatMul
         x ─ com.amd.quark.ExtendedQuantizeLinear(s, z) ─ com.amd.quark.ExtendedDequantizeLinear(s, z) ─ Conv
After:   x ─ QuantizeLinear(s, z) ─ DequantizeLinear(s, z) ─ MatMul|Conv

onnxruntime's com.microsoft QuantizeLinear/DequantizeLinear (what AMD Quark and onnxruntime's own
quantizer write for 16-bit codes before opset 21) and AMD Quark's ExtendedQuantizeLinear/
ExtendedDequantizeLinear compute what the standard ops compute, on more integer types: the lift rules
then see them as the standard ops. An Extended op whose zero point is not an integer (bfloat16 or
float16 "quantization") is left, with a warning naming it, and ``convert`` reports it as a blocker.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.prepare.change import Change

log = logging.getLogger("trt_bridge.prepare")

#: (domain, op) → the standard op it is
VENDOR_QDQ = {
    ("com.microsoft", "QuantizeLinear"): "QuantizeLinear",
    ("com.microsoft", "DequantizeLinear"): "DequantizeLinear",
    ("com.amd.quark", "ExtendedQuantizeLinear"): "QuantizeLinear",
    ("com.amd.quark", "ExtendedDequantizeLinear"): "DequantizeLinear",
    ("com.vai.quantize", "VitisQuantizeLinear"): "QuantizeLinear",
    ("com.vai.quantize", "VitisDequantizeLinear"): "DequantizeLinear",
}


def _zero_point_dtype(node: gs.Node) -> np.dtype | None:
    """The zero point's (or, for a DequantizeLinear without one, the codes') numpy type, if known."""
    has_zp = len(node.inputs) > 2 and node.inputs[2].name
    tensor = node.inputs[2] if has_zp else node.inputs[0] if node.op.endswith("DequantizeLinear") else None
    try:
        return np.dtype(tensor.dtype) if tensor is not None and tensor.dtype is not None else None
    except TypeError:  # a type numpy lacks (bfloat16, float8): not an integer
        return np.dtype(np.float32)


class StandardQDQDomain:
    name = "standard-qdq-domain"

    def apply(self, graph: gs.Graph) -> list[Change]:
        changes = []
        for node in graph.nodes:
            standard = VENDOR_QDQ.get((node.domain or "", node.op))
            if standard is None:
                continue
            dtype = _zero_point_dtype(node)
            if node.op.startswith(("Extended", "Vitis")) and not (dtype is None or np.issubdtype(dtype, np.integer)):
                log.warning("%s '%s': its zero point is %s, not an integer: not a QuantizeLinear/DequantizeLinear "
                            "TensorRT can take; quantize that tensor to an integer type instead",
                            node.op, node.name, dtype)
                continue
            changes.append(Change(self.name, node.name, f"{node.domain}.{node.op} is the standard {standard}"))
            node.op, node.domain = standard, None
        return changes
