"""How ``check`` reads NVFP4 (``convert --fp4``, ModelOpt's NVFP4 exports): TensorRT's dynamic FP4 activations,
whose ``DequantizeLinear`` nodes read codes and scales computed per inference, and FP4 weights whose block scales are
a ``DequantizeLinear`` of FP8 E4M3 constants (two levels, which TensorRT folds at build time)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.runtime.fp4_dynamic import OP as FP4_DYNAMIC


def two_level_values(tensor: gs.Tensor) -> np.ndarray | None:
    """A scale's values: a constant's, or those of a DequantizeLinear of constants (NVFP4's FP8 block scales times
    their global scale, which TensorRT folds at build time); None when computed at run time."""
    values = constant_values(tensor)
    made = tensor.inputs[0] if values is None and getattr(tensor, "inputs", None) else None
    if made is None or made.op != "DequantizeLinear" or len(made.inputs) < 2:
        return values
    codes, scale = constant_values(made.inputs[0]), constant_values(made.inputs[1])
    if codes is None or scale is None:
        return None
    return codes.astype(np.float32) * scale.astype(np.float32)


def in_fp4_dynamic(node: gs.Node) -> bool:
    """A DequantizeLinear of TensorRT's dynamic FP4 activation: of its codes or its FP8 block scales, which
    ``TRT_FP4DynamicQuantize`` computes per inference (its scale is computed, its codes are FP4 by definition)."""
    def made_by_it(tensor) -> bool:
        return bool(getattr(tensor, "inputs", None)) and tensor.inputs[0].op == FP4_DYNAMIC

    return node.op == "DequantizeLinear" and bool(node.inputs) and made_by_it(node.inputs[0])
