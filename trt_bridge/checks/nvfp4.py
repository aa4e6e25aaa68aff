"""How ``check`` reads NVFP4 (``convert --fp4``, ModelOpt's NVFP4 exports): TensorRT's dynamic FP4 activations,
whose ``DequantizeLinear`` nodes read codes and scales computed per inference, and FP4 weights whose block scales are
a ``DequantizeLinear`` of FP8 E4M3 constants (two levels, which TensorRT folds at build time)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.ir.deferred import tensor_array
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.runtime.fp4_dynamic import OP as FP4_DYNAMIC


def two_level_values(tensor: gs.Tensor) -> np.ndarray | None:
    """A scale's values: a constant's, or those of a DequantizeLinear of constants (NVFP4's FP8 block scales times
    their global scale, which TensorRT folds at build time); None when computed at run time."""
    values = constant_values(tensor)
    made = tensor.inputs[0] if values is None and getattr(tensor, "inputs", None) else None
    if made is None or made.op != "DequantizeLinear" or len(made.inputs) < 2:
        return values
    codes, scale = _exact(made.inputs[0]), constant_values(made.inputs[1])
    if codes is None or scale is None:
        return None
    return codes.astype(np.float32) * scale.astype(np.float32)


def _exact(tensor: gs.Tensor) -> np.ndarray | None:
    """A constant's values in their own type (FP8 codes as ml_dtypes' float8, read from their TensorProto; through
    onnx-graphsurgeon they are cast, with a warning for each), else :func:`constant_values`'."""
    lazy = getattr(tensor, "_values", None) if isinstance(tensor, gs.Constant) else None
    if isinstance(lazy, LazyValues):
        return tensor_array(lazy.tensor)
    return constant_values(tensor)


def in_fp4_dynamic(node: gs.Node) -> bool:
    """A DequantizeLinear of TensorRT's dynamic FP4 activation: of its codes or its FP8 block scales, which
    ``TRT_FP4DynamicQuantize`` computes per inference (its scale is computed, its codes are FP4 by definition)."""
    def made_by_it(tensor) -> bool:
        return bool(getattr(tensor, "inputs", None)) and tensor.inputs[0].op == FP4_DYNAMIC

    return node.op == "DequantizeLinear" and bool(node.inputs) and made_by_it(node.inputs[0])


#: where TensorRT runs dynamic FP4 activations: the GPUs, and the TensorRT releases that build them (TensorRT 10.8
#: is the first for Blackwell; TensorRT-RTX 1.7.1 builds them here for SM 12.0 and refuses SM 8.9)
FP4_TARGETS = "compute capability 10.0 and newer (B200 10.0, RTX 50-series 12.0)"
FP4_BUILDERS = "TensorRT 10.8 and newer, TensorRT-RTX 1.x (12.0)"


def fp4_activations(model: onnx.ModelProto) -> dict | None:
    """``check``'s note on TensorRT's dynamic FP4 activations in ``model``'s main graph: how many, the first
    nodes, the targets and builders that run them, and the summary's line; None without any."""
    nodes = [n.name or n.output[0] for n in model.graph.node if n.op_type == FP4_DYNAMIC]
    if not nodes:
        return None
    line = (f"FP4 activations: {len(nodes)} quantized per inference by TensorRT ({FP4_DYNAMIC}, NVFP4 blocks of 16, "
            f"e.g. '{nodes[0]}'): they run on {FP4_TARGETS}, built by {FP4_BUILDERS}")
    return {"count": len(nodes), "nodes": nodes[:8], "targets": FP4_TARGETS, "builders": FP4_BUILDERS, "line": line}
