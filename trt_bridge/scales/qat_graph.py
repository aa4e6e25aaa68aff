"""The weighted ops and quantized activations of a graph, as QAT matching (:mod:`.qat`) compares them.

Both the QAT export and the target are read with constant subgraphs folded (:func:`folded`), as convert
folds them before lifting. A *weighted op* (:class:`WeightedOp`) is a Conv, ConvTranspose, MatMul or Gemm
with a constant weight (after DQ / Q→DQ / one Transpose), or an integer op of a dynamically quantized
target (ConvInteger, MatMulInteger, DynamicQuantizeMatMul, MatMulIntegerToFloat); its *signature* is its
family and its weight shape (``[in, out]`` for matmuls). Names are compared after :func:`normalized`
strips the exporters' suffixes, and only when :func:`is_stable` (not an exporter's counter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX
from trt_bridge.ir.names import unique_node_names
from trt_bridge.lift.pipeline import fold_constants
from trt_bridge.lift.qdq_pair import covering_scale
from trt_bridge.lift.scale_algebra import constant_values, quantizer_zero_point
from trt_bridge.lift.weights import weight_axis

#: weighted op type → (family, the float op whose weight layout it shares)
WEIGHTED_OPS = {
    "Conv": ("conv", "Conv"), "ConvInteger": ("conv", "Conv"),
    "ConvTranspose": ("conv-transpose", "ConvTranspose"),
    "MatMul": ("matmul", "MatMul"), "Gemm": ("matmul", "Gemm"), "MatMulInteger": ("matmul", "MatMul"),
    "DynamicQuantizeMatMul": ("matmul", "MatMul"), "MatMulIntegerToFloat": ("matmul", "MatMul"),
}
WEIGHT_INPUT = 1  # the weight is input 1 of every op above
NAME_SUFFIXES = ("_DequantizeLinear_Output", "_QuantizeLinear_Output", "_DequantizeLinear", "_QuantizeLinear",
                 "_dequantized", "_quantized", "_fake_quant", "_int8", "_quant")
_COUNTER_NAME = re.compile(r"onnx::.*|\d+|[A-Za-z_]\w*\.\d+")
_INTEGER_PRODUCERS = {"QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv",
                      "QLinearMatMul"}


@dataclass
class WeightedOp:
    """A weighted op: a node with a constant weight."""

    node: str  # the node's name (generated as convert names it when empty)
    op: str
    signature: tuple
    weight: str  # the weight constant's name (before any DQ / Q / Transpose)
    activation: str  # the float tensor that reaches input 0 (through DQ←Q or DynamicQuantizeLinear)
    axis: int  # output-channel axis of the weight as the node sees it
    weight_dq: gs.Node | None = None
    perm: list[int] | None = None  # a Transpose between the DQ and the node


def folded(graph: gs.Graph) -> gs.Graph:
    """``graph`` with constant subgraphs (a Reshape/Transpose of a weight) folded, as convert folds them
    before lifting; Q/DQ stay. Node names are fixed first: generated names count the nodes as loaded."""

    for node, name in zip(graph.nodes, unique_node_names([(n.name, n.op) for n in graph.nodes])):
        node.name = name
    fold_constants(graph)
    return graph


def _producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def normalized(name: str) -> str:
    """``name`` without the exporters' quantization suffixes (NAME_SUFFIXES)."""
    stripped = True
    while stripped:
        stripped = False
        for suffix in NAME_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
    return name


def is_stable(name: str, op: str | None = None) -> bool:
    """Whether ``name`` says what the tensor/node is (not an exporter's counter)."""
    if not name or _COUNTER_NAME.fullmatch(name):
        return False
    return op is None or not re.fullmatch(rf"{re.escape(op)}_\d+", name)


def float_source(tensor: gs.Tensor) -> tuple[gs.Tensor, gs.Node | None]:
    """The float tensor that ``tensor`` (an op's activation input) quantizes, and the QuantizeLinear if any."""
    node = _producer(tensor)
    if node is not None and node.op == "DequantizeLinear" and constant_values(node.inputs[0]) is None:
        q = _producer(node.inputs[0])
        if q is not None and q.op == "QuantizeLinear":
            return q.inputs[0], q
    if node is not None and node.op == "DynamicQuantizeLinear" and tensor is node.outputs[0]:
        return node.inputs[0], None
    return tensor, None


def _constant_shape(tensor: gs.Tensor) -> tuple[int, ...] | None:
    if isinstance(tensor, gs.Constant):
        return tuple(int(d) for d in tensor.shape)
    values = constant_values(tensor)
    return None if values is None else tuple(values.shape)


def _weight(tensor: gs.Tensor) -> tuple[gs.Tensor, tuple[int, ...], gs.Node | None, list[int] | None] | None:
    """(weight constant, shape as the op sees it, its DequantizeLinear, a Transpose's perm) or None."""
    perm, transposed = None, False
    node = _producer(tensor)
    if node is not None and node.op == "Transpose":
        tensor, perm, transposed = node.inputs[0], node.attrs.get("perm"), True
        node = _producer(tensor)
    dq = None
    if node is not None and node.op == "DequantizeLinear":
        dq, tensor = node, node.inputs[0]
        q = _producer(tensor)
        if q is not None and q.op == "QuantizeLinear":
            tensor = q.inputs[0]
    shape = _constant_shape(tensor)
    if shape is None:
        return None
    if transposed:
        perm = list(range(len(shape)))[::-1] if perm is None else perm
        perm = [int(p) % len(shape) for p in perm]
        shape = tuple(shape[p] for p in perm)
    return tensor, shape, dq, perm


def weighted_ops(graph: gs.Graph) -> list[WeightedOp]:
    """The weighted ops of a :func:`folded` graph (whose nodes all have unique names)."""
    ops = []
    for node in graph.nodes:
        if node.op not in WEIGHTED_OPS or len(node.inputs) <= WEIGHT_INPUT:
            continue
        found = _weight(node.inputs[WEIGHT_INPUT])
        if found is None:
            continue  # activation × activation
        weight, shape, dq, perm = found
        family, float_op = WEIGHTED_OPS[node.op]
        norm = shape
        if node.op == "Gemm" and node.attrs.get("transB", 0) and len(shape) == 2:
            norm = (shape[1], shape[0])  # compare as [in, out], like MatMul
        axis = weight_axis(gs.Node(float_op, attrs=dict(node.attrs)), len(shape))
        ops.append(WeightedOp(node.name, node.op, (family, norm), weight.name,
                       float_source(node.inputs[0])[0].name, axis, dq, perm))
    return ops


def activation_amax(graph: gs.Graph, notes: list[str]) -> dict[str, float]:
    """Float tensor entering each activation QuantizeLinear → the symmetric amax covering its codes."""
    amax: dict[str, float] = {}
    for node in graph.nodes:
        if node.op != "QuantizeLinear" or constant_values(node.inputs[0]) is not None:
            continue
        if not any(c.op == "DequantizeLinear" for c in node.outputs[0].outputs):
            continue
        scale, zp = constant_values(node.inputs[1]), quantizer_zero_point(node)
        x = node.inputs[0].name
        if scale is None or zp is None:
            notes.append(f"QuantizeLinear '{node.name}' of '{x}': scale/zero point not constant, skipped")
            continue
        if scale.size != 1 or zp.size != 1:
            notes.append(f"QuantizeLinear '{node.name}' of '{x}': per-axis activation scale, skipped")
            continue
        value = covering_scale(float(scale.reshape(())), zp.reshape(())) * QMAX
        if not (np.dtype(zp.dtype) == np.int8 and int(zp.reshape(())) == 0):
            notes.append(f"'{x}': {zp.dtype} zero point {int(zp.reshape(()))} → covering amax {value:.6g}")
        if x in amax and amax[x] != value:
            notes.append(f"'{x}' is quantized by several QuantizeLinear nodes; the largest amax is kept")
        amax[x] = max(amax.get(x, 0.0), value)
    return amax


def weight_amax(op: WeightedOp, notes: list[str]) -> tuple[float | tuple[float, ...], bool] | None:
    """The QAT op's weight amax (per output channel when possible) and whether it is per channel."""
    dq = op.weight_dq
    if dq.attrs.get("block_size", 0):
        notes.append(f"weight '{op.weight}': blocked quantization, skipped")
        return None
    scale = constant_values(dq.inputs[1])
    zp = quantizer_zero_point(dq)
    source = _producer(dq.inputs[0])
    if source is not None and source.op == "QuantizeLinear" and not (len(dq.inputs) > 2 and dq.inputs[2].name):
        zp = quantizer_zero_point(source)  # the DQ's own input type is unknown without shape inference
    if scale is None or zp is None:
        notes.append(f"weight '{op.weight}': scale/zero point not constant, skipped")
        return None
    scale = scale.astype(np.float64).reshape(-1)
    zps = np.broadcast_to(zp.reshape(-1), scale.shape)
    amax = [covering_scale(float(s), np.asarray(z, zp.dtype)) * QMAX for s, z in zip(scale, zps)]
    if scale.size == 1:
        return amax[0], False
    rank = len(op.signature[1])
    axis = int(dq.attrs.get("axis", 1)) % max(rank, 1)
    if op.perm is not None:
        axis = op.perm.index(axis)
    if axis != op.axis:
        notes.append(f"weight '{op.weight}': per-channel scales on axis {axis}, not the output channels "
                            f"(axis {op.axis}); imported per tensor (their maximum)")
        return max(amax), False
    return tuple(amax), True


def float_tensors(graph: gs.Graph) -> set[str]:
    """Names of the target's non-constant tensors that hold float values (unknown types count as float)."""
    names = {t.name for t in graph.inputs}
    for node in graph.nodes:
        if node.op in _INTEGER_PRODUCERS:
            continue
        for t in node.outputs:
            try:
                floating = t.dtype is None or np.issubdtype(np.dtype(t.dtype), np.floating)
            except TypeError:  # a type numpy does not know (bfloat16, float8): not an integer either
                floating = True
            if floating:
                names.add(t.name)
    return names
