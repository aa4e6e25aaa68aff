"""Lower the canonical form to TensorRT-ready explicit quantization.

Before (lifted)::

    x ─────────────┐                 annotations: x → act scale s_x
    W (float) ─ MatMul|Conv ─ y                   W → weight, axis a

After::

    x ─ QuantizeLinear(s_x, 0:int8) ─ DequantizeLinear(s_x, 0) ─┐
    W_q:int8 ─ DequantizeLinear(s_w[per channel], 0, axis=a) ─ MatMul|Conv ─ y

Symmetric int8 only (zero point 0), scales as initializers of the quantized tensor's own
float type (float32; float16 in a float16 model, which needs opset 19: see
:func:`needs_opset`), per-tensor activations, weights per tensor or per output channel.
Rounding is half to even.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.annotations import QMAX, Annotations, ScaleSource, WeightSpec
from trt_bridge.errors import InternalError, UnsupportedPatternError
from trt_bridge.ir.names import NameAllocator
from trt_bridge.ir.values import FLOAT32_TINY, check_finite_weight


@dataclass(frozen=True)
class QuantizedTensor:
    tensor: str
    kind: str  # "activation" | "weight"
    scale: float | list[float]
    axis: int | None
    source: str
    consumers: tuple[str, ...]
    dtype: str = "float32"  # the float type of the tensor and its scale


def quantize_weight(values: np.ndarray, axis: int, ftype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per-channel quantization along ``axis``: (int8 values, 1-d scales of type ``ftype``).

    The codes are computed with the scale as the model will store it (float16 in a float16 model), so
    dequantizing gives back what was quantized."""
    reduce_axes = tuple(i for i in range(values.ndim) if i != axis)
    amax = np.abs(values.astype(np.float64)).max(axis=reduce_axes)
    # an all-zero channel takes 1/127 (any scale is exact); one too small for a normal float32 scale the smallest
    # normal (TensorRT takes no subnormal scale; such weights are zero to float32 arithmetic anyway)
    scale = representable_scale(np.where(amax > 0, np.maximum(amax / QMAX, FLOAT32_TINY), 1.0 / QMAX), ftype)
    shape = [1] * values.ndim
    shape[axis] = -1
    q = np.clip(np.rint(values.astype(np.float64) / scale.astype(np.float64).reshape(shape)), -QMAX, QMAX)
    return q.astype(np.int8), scale


#: QuantizeLinear/DequantizeLinear take float16 (and bfloat16) values and scales from opset 19
FP16_QDQ_OPSET = 19


def _float_type(tensor: gs.Tensor, what: str):
    """The numpy float type of a tensor to quantize (float32 when unknown)."""
    dtype = tensor.dtype  # a Constant's type comes from its TensorProto header: the values are not loaded
    if dtype is None:
        return np.float32
    if isinstance(dtype, int):  # an ONNX type numpy lacks: bfloat16
        raise UnsupportedPatternError(
            f"{what} '{tensor.name}' is bfloat16, which trt-bridge does not quantize: convert with --bf16 fp32 "
            "(the default) or --bf16 fp16.")
    dtype = np.dtype(dtype)
    return dtype.type if dtype in (np.float16, np.float32) else np.float32


def check_quantizable(graph: gs.Graph, annotations: Annotations) -> None:
    """Raise the clear error for an annotated tensor lowering cannot quantize (bfloat16), before calibration."""
    tensors = graph.tensors()
    for kind, table in (("activation", annotations.activations), ("weight", annotations.weights)):
        for name in sorted(table):
            if name in tensors:
                _float_type(tensors[name], kind)


def needs_opset(quantized: list[QuantizedTensor]) -> int:
    """The opset the lowered Q/DQ need: 19 when a scale is float16, else 13."""
    return FP16_QDQ_OPSET if any(q.dtype == "float16" for q in quantized) else 13


def lower(graph: gs.Graph, annotations: Annotations) -> list[QuantizedTensor]:
    """Insert Q/DQ for every placed annotation (in place); return what was quantized."""
    names = NameAllocator(graph)
    nodes = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()
    done: list[QuantizedTensor] = []

    for name in sorted(annotations.weights):
        spec = annotations.weights[name]
        ftype = _float_type(tensors[name], "weight")
        q, scale = _weight_values(spec, tensors[name], ftype)
        dq_out = gs.Variable(names(f"{name}_dequantized"), dtype=ftype, shape=list(q.shape))
        zero = np.zeros(scale.shape, np.int8)
        attrs = {"axis": spec.axis} if scale.ndim == 1 else {}
        graph.nodes.append(gs.Node(
            "DequantizeLinear", names(f"{name}_DequantizeLinear"), attrs,
            [gs.Constant(names(f"{name}_int8"), q), gs.Constant(names(f"{name}_scale"), scale),
             gs.Constant(names(f"{name}_zero_point"), zero)], [dq_out]))
        _rewire(nodes, spec.sites, name, dq_out)
        done.append(QuantizedTensor(name, "weight", _scale_out(scale), spec.axis if scale.ndim else None,
                                    spec.source.value, tuple(s.node for s in spec.sites), np.dtype(ftype).name))

    for name in sorted(annotations.activations):
        spec = annotations.activations[name]
        if spec.scale is None:
            raise InternalError(f"activation '{name}' reached lowering without a scale")
        if not np.isfinite(spec.scale) or not spec.scale > 0:
            raise UnsupportedPatternError(
                f"activation '{name}' would get scale {spec.scale} (from {spec.source.value if spec.source else '?'})"
                ": a scale must be finite and positive. Check that source of scales (the calibration data for "
                "huge or non-finite values, the scale file, the model).")
        ftype = _float_type(tensors[name], "activation")
        scale = gs.Constant(names(f"{name}_scale"), representable_scale(np.array(spec.scale), ftype))
        zero = gs.Constant(names(f"{name}_zero_point"), np.array(0, np.int8))
        q_out = gs.Variable(names(f"{name}_quantized"), dtype=np.int8)
        dq_out = gs.Variable(names(f"{name}_dequantized"), dtype=ftype)
        graph.nodes.append(gs.Node("QuantizeLinear", names(f"{name}_QuantizeLinear"), {},
                                   [tensors[name], scale, zero], [q_out]))
        graph.nodes.append(gs.Node("DequantizeLinear", names(f"{name}_DequantizeLinear"), {},
                                   [q_out, scale, zero], [dq_out]))
        _rewire(nodes, spec.sites, name, dq_out)
        done.append(QuantizedTensor(name, "activation", float(scale.values), None,
                                    spec.source.value if spec.source else "", tuple(s.node for s in spec.sites),
                                    np.dtype(ftype).name))
    graph.cleanup().toposort()
    return done


def _weight_values(spec: WeightSpec, tensor: gs.Tensor, ftype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    if spec.int8 is not None and spec.scale is not None:
        return spec.int8, representable_scale(np.asarray(spec.scale, np.float64), ftype)
    if not isinstance(tensor, gs.Constant):
        raise InternalError(f"weight '{spec.tensor}' is not a constant at lowering")
    spec.source = ScaleSource.REQUANTIZED
    # A weight still in its TensorProto is read without keeping the float copy on the Constant (the int8 one
    # replaces it): a model over 2 GB would otherwise hold every weight twice while lowering.
    lazy = getattr(tensor, "_values", None)
    values = np.asarray(lazy.load() if isinstance(lazy, LazyValues) else tensor.values)
    check_finite_weight(spec.tensor, values)
    return quantize_weight(values, spec.axis, ftype)


def representable_scale(scale: np.ndarray, ftype) -> np.ndarray:
    """``scale`` in the Q/DQ's float type, never 0: a float16 scale below float16's smallest subnormal
    would round to 0, which TensorRT rejects ("Scale coefficients must all be positive")."""
    tiny = np.finfo(ftype).smallest_subnormal
    return np.asarray(np.maximum(np.asarray(scale, np.float64), tiny), dtype=ftype)


def effective_weight(spec: WeightSpec, tensor: gs.Tensor) -> np.ndarray:
    """The float weights the lowered model computes with: int8 values times their scales."""
    q, scale = _weight_values(spec, tensor, _float_type(tensor, "weight"))
    if scale.ndim == 0:
        return q.astype(np.float32) * scale
    shape = [1] * q.ndim
    shape[spec.axis] = -1
    return q.astype(np.float32) * scale.reshape(shape)


def _scale_out(scale: np.ndarray) -> float | list[float]:
    return float(scale) if scale.ndim == 0 else [float(v) for v in scale]


def _rewire(nodes: dict[str, gs.Node], sites, name: str, new: gs.Tensor) -> None:
    for site in sites:
        node = nodes[site.node]
        if node.inputs[site.index].name != name:
            raise InternalError(f"site {site} does not read '{name}'")
        node.inputs[site.index] = new
