"""Lower the canonical form to TensorRT-ready explicit quantization.

Before (lifted)::

    x ─────────────┐                 annotations: x → act scale s_x
    W (float) ─ MatMul|Conv ─ y                   W → weight, axis a

After::

    x ─ QuantizeLinear(s_x, 0:int8) ─ DequantizeLinear(s_x, 0) ─┐
    W_q:int8 ─ DequantizeLinear(s_w[per channel], 0, axis=a) ─ MatMul|Conv ─ y

Each annotation's format (:mod:`trt_bridge.formats`: INT8, FP8 E4M3, INT4, FP4), symmetric (zero point 0 of the
codes' type), scales as initializers of the quantized tensor's own float type (float32; float16 in a float16 model,
which needs opset 19: see :func:`needs_opset`; FP8 needs 19 too, blocked INT4 21), per-tensor activations, weights
per tensor, per output channel or per block along the reduction axis (INT4 weight-only)::

    W_q:int4 ─ DequantizeLinear(s[K/128, N], 0, axis=0, block_size=128) ─ MatMul|Gemm ─ y

(:func:`trt_bridge.lift.weights.weight_values`). Integer rounding is half to even; float codes are cast after
saturating to the format's largest value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.annotations import Annotations, ScaleSource
from trt_bridge.errors import InternalError, UnsupportedPatternError
from trt_bridge.formats import FORMATS, FP4, INT8, QuantFormat
from trt_bridge.ir.derived import DerivedValues
from trt_bridge.ir.names import NameAllocator
from trt_bridge.ir.toposort import toposort
from trt_bridge.lift.weights import float_type, representable_scale, scale_axis, weight_values
from trt_bridge.lower import runtime_ranges
from trt_bridge.lower.nvfp4 import fp4_dynamic, two_level_scale


@dataclass(frozen=True)
class QuantizedTensor:
    tensor: str
    kind: str  # "activation" | "weight" | "runtime" (an activation with runtime ranges: scale 1 on its grid)
    scale: float | list[float]
    axis: int | None
    source: str
    consumers: tuple[str, ...]
    dtype: str = "float32"  # the float type of the tensor and its scale
    #: runtime ranges: the nodes written around the layers (kept float32 by --high-precision); not reported
    nodes: tuple[str, ...] = ()
    format: str = "int8"  # trt_bridge.formats: int8, fp8, int4, fp4
    block_size: int = 0  # weights quantized per block (INT4 weight-only): the block's length


#: QuantizeLinear/DequantizeLinear take float16 (and bfloat16) values and scales from opset 19
FP16_QDQ_OPSET = 19


def check_quantizable(graph: gs.Graph, annotations: Annotations) -> None:
    """Raise the clear error for an annotated tensor lowering cannot quantize (bfloat16), before calibration."""
    tensors = graph.tensors()
    for kind, table in (("activation", annotations.activations), ("weight", annotations.weights)):
        for name in sorted(table):
            if name in tensors:
                float_type(tensors[name], kind)


def needs_opset(quantized: list[QuantizedTensor]) -> int:
    """The opset the lowered Q/DQ need: 19 when a scale is float16, the format's own where it needs more (FP8 19,
    blocked INT4 21), else 13."""
    fp16 = FP16_QDQ_OPSET if any(q.dtype == "float16" for q in quantized) else 13
    return max([fp16, *(FORMATS[q.format].min_opset for q in quantized)])


def code_constant(name: str, codes: np.ndarray, fmt: QuantFormat) -> gs.Constant:
    """A constant of ``fmt``'s codes. INT4 and FP4 are packed two to a byte and FP8 has no numpy type
    onnx-graphsurgeon exports, so those go in as the TensorProto onnx writes of them."""
    if fmt is INT8:
        return gs.Constant(name, np.asarray(codes, np.int8))
    return gs.Constant(name, LazyValues(onnx.numpy_helper.from_array(np.asarray(codes, fmt.dtype), name)))


def lower(graph: gs.Graph, annotations: Annotations, scales: dict | None = None,
          names: NameAllocator | None = None, release: bool = False) -> list[QuantizedTensor]:
    """Insert Q/DQ for every placed annotation (in place); return what was quantized. Activations marked
    ``runtime`` get runtime ranges (:mod:`trt_bridge.lower.runtime_ranges`), before the weights are lowered.
    ``scales``: filled with each quantized activation's scale constant (its Q and DQ share it) and float type.
    ``names``: the model's (a control-flow body is lowered as a graph of its own, its names unique model-wide).
    ``release``: the last lowering of these annotations: each weight's codes and float values are let go once its
    codes are written (a 0.85 B-parameter int4 decoder held both forms of every weight at once, +1.7 GB)."""
    names = names or NameAllocator(graph)
    done: list[QuantizedTensor] = []
    runtime = [annotations.activations[name] for name in sorted(annotations.activations)
               if annotations.activations[name].runtime]
    nodes, tensors = ({n.name: n for n in graph.nodes}, graph.tensors()) if runtime else ({}, {})
    for spec in runtime:  # a rewrite keeps every node and tensor the next one matches on
        name = spec.tensor
        found = runtime_ranges.match(nodes, tensors, annotations, spec, {})
        if isinstance(found, str):
            raise InternalError(f"activation '{name}' was given a runtime range, but {found}")
        dtype = np.dtype(float_type(found.x, "activation")).name
        added = runtime_ranges.rewrite(graph, names, annotations, found)
        done.append(QuantizedTensor(name, "runtime", 1.0, None, "runtime", tuple(s.node for s in spec.sites),
                                    dtype, tuple(added)))
    nodes = {n.name: n for n in graph.nodes}
    tensors = graph.tensors()

    for name in sorted(annotations.weights):
        spec = annotations.weights[name]
        ftype = float_type(tensors[name], "weight")
        q, scale = weight_values(spec, tensors[name], ftype)
        fmt = spec.format
        dq_out = gs.Variable(names(f"{name}_dequantized"), dtype=ftype, shape=list(q.shape))
        axis = scale_axis(spec, q.ndim) if scale.ndim else None
        attrs = {} if axis is None else {"axis": axis}
        if spec.block_size and scale.ndim:
            attrs["block_size"] = spec.block_size
        scale_in = two_level_scale(graph, names, name, scale, spec.source is ScaleSource.REQUANTIZED) \
            if fmt is FP4 and scale.ndim else None  # NVFP4's two levels
        graph.nodes.append(gs.Node(
            "DequantizeLinear", names(f"{name}_DequantizeLinear"), attrs,
            [code_constant(names(f"{name}_{fmt.name}"), q, fmt),
             scale_in or gs.Constant(names(f"{name}_scale"), scale),
             code_constant(names(f"{name}_zero_point"), fmt.zero(scale.shape), fmt)], [dq_out]))
        _rewire(nodes, spec.sites, name, dq_out)
        if release and not tensors[name].outputs:  # read by no other node: its codes and float values go
            spec.codes = q = None
            if isinstance(getattr(tensors[name], "_values", None), DerivedValues):
                tensors[name]._values.release()
            del tensors[name]
        done.append(QuantizedTensor(name, "weight", _scale_out(scale), axis, spec.source.value,
                                    tuple(s.node for s in spec.sites), np.dtype(ftype).name, format=fmt.name,
                                    block_size=spec.block_size if scale.ndim else 0))

    for name in sorted(annotations.activations):
        spec = annotations.activations[name]
        if spec.scale is None:
            raise InternalError(f"activation '{name}' reached lowering without a scale")
        if not np.isfinite(spec.scale) or not spec.scale > 0:
            raise UnsupportedPatternError(
                f"activation '{name}' would get scale {spec.scale} (from {spec.source.value if spec.source else '?'})"
                ": a scale must be finite and positive. Check that source of scales (the calibration data for "
                "huge or non-finite values, the scale file, the model).")
        ftype, fmt = float_type(tensors[name], "activation"), spec.format
        if fmt is FP4:  # --fp4: TensorRT's dynamic FP4 quantization, its global scale from the range
            dq_out, scale = fp4_dynamic(graph, names, tensors[name], spec.scale, ftype)
            if scales is not None:
                scales[name] = (scale, ftype)
            _rewire(nodes, spec.sites, name, dq_out)
            done.append(QuantizedTensor(name, "activation", float(scale.values), None,
                                        spec.source.value if spec.source else "", tuple(s.node for s in spec.sites),
                                        np.dtype(ftype).name, format=fmt.name))
            continue
        scale = gs.Constant(names(f"{name}_scale"), representable_scale(fmt.scale_of(spec.scale), ftype))
        if scales is not None:
            scales[name] = (scale, ftype)
        zero = code_constant(names(f"{name}_zero_point"), fmt.zero(), fmt)
        q_out = gs.Variable(names(f"{name}_quantized"), dtype=np.int8 if fmt is INT8 else fmt.onnx_type)
        dq_out = gs.Variable(names(f"{name}_dequantized"), dtype=ftype)
        graph.nodes.append(gs.Node("QuantizeLinear", names(f"{name}_QuantizeLinear"), {},
                                   [tensors[name], scale, zero], [q_out]))
        graph.nodes.append(gs.Node("DequantizeLinear", names(f"{name}_DequantizeLinear"), {},
                                   [q_out, scale, zero], [dq_out]))
        _rewire(nodes, spec.sites, name, dq_out)
        if release and not tensors[name].outputs:  # read by no other node: its codes and float values go
            spec.codes = q = None
            if isinstance(getattr(tensors[name], "_values", None), DerivedValues):
                tensors[name]._values.release()
            del tensors[name]
        done.append(QuantizedTensor(name, "activation", float(scale.values), None,
                                    spec.source.value if spec.source else "", tuple(s.node for s in spec.sites),
                                    np.dtype(ftype).name, format=fmt.name))
    toposort(graph.cleanup())
    return done


def _scale_out(scale: np.ndarray) -> float | list[float]:
    """The report's scale: the value, one per channel, or for blocks the smallest and largest (a weight's blocks
    may number millions)."""
    if scale.ndim > 1:
        return [float(scale.min()), float(scale.max())]
    return float(scale) if scale.ndim == 0 else [float(v) for v in scale]


def _rewire(nodes: dict[str, gs.Node], sites, name: str, new: gs.Tensor) -> None:
    for site in sites:
        node = nodes[site.node]
        if node.inputs[site.index].name != name:
            raise InternalError(f"site {site} does not read '{name}'")
        node.inputs[site.index] = new
