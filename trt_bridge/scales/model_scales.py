"""The scales of a converted model: its symmetric int8 Q/DQ read back into a :class:`ScaleTable`,
and the re-centred activations given back under the network's own tensors (``scales export``)."""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import numpy_helper

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.model import constant_protos
from trt_bridge.scales.table import QMAX, ScaleEntry, ScaleTable


def scales_of_model(model: onnx.ModelProto, source: str = "model") -> ScaleTable:
    """The scales of a converted (trt-bridge output, or any symmetric int8 Q/DQ) model.

    Activations: every ``QuantizeLinear`` of a non-constant tensor, keyed by that tensor (the
    Q's input: the float tensor quantized). Weights: every ``DequantizeLinear`` of a constant
    int8 tensor, keyed by the original weight name: lowering names the int8 initializer
    ``<weight>_int8`` (``<weight>_int8_<n>`` on a clash), and the suffix is stripped; a
    ``QuantizeLinear`` of a constant float tensor (QAT style) is keyed by that tensor.
    Per-channel weight scales keep the DQ's axis (made non-negative). Non-zero zero points or
    missing int8 zero points (asymmetric or uint8 quantization) are errors: convert the model first.
    Only scales and zero points are loaded; weight values are never read.
    """
    constants = Constants(model)
    table = ScaleTable()

    def put(entry: ScaleEntry, node: onnx.NodeProto) -> None:
        old = table.get(entry.tensor)
        if old is None:
            table.add(entry)
        elif old != entry:
            raise TrtBridgeError(f"tensor '{entry.tensor}' is quantized with two different scales (the second by "
                                 f"{node.op_type} '{node.name}'); give it one scale.")

    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or not node.input:
            continue
        x = node.input[0]
        if node.op_type == "QuantizeLinear":
            scale = qdq_scale(node, constants)
            if x in constants:
                put(_weight_entry(x, node, scale, constants.rank(x), source), node)
            else:
                if scale.ndim:
                    raise TrtBridgeError(f"QuantizeLinear '{node.name}' quantizes activation '{x}' per channel; "
                                         "TensorRT quantizes activations per tensor.")
                put(ScaleEntry(x, float(scale) * QMAX, None, "activation", source), node)
        elif x in constants:  # a DequantizeLinear of constant (int8) weights
            if constants.dtype(x) != np.int8:
                raise TrtBridgeError(f"DequantizeLinear '{node.name}' dequantizes '{x}' of type {constants.dtype(x)}; "
                                     "trt-bridge reads symmetric int8 weights only. Convert the model first.")
            scale = qdq_scale(node, constants)
            put(_weight_entry(weight_name(x), node, scale, constants.rank(x), source), node)
    return table


def uncentered(table: ScaleTable, model: onnx.ModelProto) -> tuple[ScaleTable, list[str]]:
    """``table`` with each activation convert re-centred (``x ─ Sub(c) [─ Pad] ─ Q``) given back under the
    network's own tensor ``x``, with the range that covers it, ``amax = |c| + amax_centred``
    (= max(|lo|, |hi|) for a range [lo, hi] centred on c): the scale TensorRT ≤ 10, onnxruntime's TensorRT
    provider and ``convert --scales`` expect for ``x``. Returns the table and the names given back.
    A tensor with a scale of its own keeps the larger of the two."""
    producers = {o: n for n in model.graph.node for o in n.output}
    constants = Constants(model)
    originals: dict[str, float] = {}
    replaced = []
    for name, entry in table.entries.items():
        if entry.kind != "activation" or entry.per_channel:
            continue
        tensor = name
        while tensor in producers and producers[tensor].op_type == "Pad":
            tensor = producers[tensor].input[0]
        node = producers.get(tensor)
        if node is None or node.op_type != "Sub" or len(node.input) != 2 or node.input[1] not in constants:
            continue
        center = constants.array(node.input[1])
        if center.size != 1:
            continue
        amax = abs(float(center.ravel()[0])) + float(entry.amax)
        original = node.input[0]
        originals[original] = max(originals.get(original, 0.0), amax)
        replaced.append(name)
    if not replaced:
        return table, []
    out = ScaleTable()
    for name, entry in table.entries.items():
        if name in replaced:
            continue
        if name in originals:
            entry = ScaleEntry(name, max(float(entry.amax), originals.pop(name)), None, "activation", entry.source)
        out.add(entry)
    source = next(iter(table.entries.values())).source
    for name, amax in originals.items():
        out.add(ScaleEntry(name, amax, None, "activation", source))
    return out, replaced


def weight_name(int8_name: str) -> str:
    """The weight an int8 initializer lowering wrote holds: ``<weight>_int8[_<n>]`` without the suffix."""
    stripped = re.sub(r"_int8(_\d+)?$", "", int8_name)
    return stripped or int8_name


def _weight_entry(name: str, node: onnx.NodeProto, scale: np.ndarray, rank: int, source: str) -> ScaleEntry:
    amax = scale.astype(np.float64) * QMAX  # exact for float32/float16 scales
    if scale.ndim == 0:
        return ScaleEntry(name, float(amax), None, "weight", source)
    axis = qdq_axis(node, rank)
    return ScaleEntry(name, tuple(amax.tolist()), axis, "weight", source)


def qdq_axis(node: onnx.NodeProto, rank: int) -> int:
    """The (non-negative) axis attribute of a per-channel Q/DQ (ONNX's default is 1)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return axis + rank if axis < 0 else axis


def qdq_scale(node: onnx.NodeProto, constants: Constants) -> np.ndarray:
    """The node's scale (0-d or 1-d, its own float type), after checking its zero point is an int8 0."""
    if len(node.input) < 2 or node.input[1] not in constants:
        raise TrtBridgeError(f"{node.op_type} '{node.name}' has no constant scale; TensorRT needs build-time "
                             "constant scales (initializers).")
    scale = constants.array(node.input[1])
    if scale.ndim > 1:
        raise TrtBridgeError(f"{node.op_type} '{node.name}' has a {scale.ndim}-d scale (blocked quantization); "
                             "trt-bridge reads per-tensor and per-channel int8 scales only.")
    zp = constants.array(node.input[2]) if len(node.input) > 2 and node.input[2] in constants else None
    x = node.input[0]
    int8 = zp.dtype == np.int8 if zp is not None else (
        node.op_type == "DequantizeLinear" and x in constants and constants.dtype(x) == np.int8)
    if not int8 or (zp is not None and np.any(zp != 0)):
        raise TrtBridgeError(f"{node.op_type} '{node.name}' is not symmetric int8 (zero point "
                             f"{'missing' if zp is None else zp.tolist()}); read the scales of a converted model "
                             "(trt-bridge convert makes every zero point an int8 0).")
    return scale


class Constants:
    """A model's initializers and Constant node values by name, converted to numpy on demand
    (weights are only asked for their type and rank, so their values are never copied)."""

    def __init__(self, model: onnx.ModelProto):
        self._protos: dict[str, onnx.TensorProto] = constant_protos(model)

    def __contains__(self, name: object) -> bool:
        return name in self._protos

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self._protos[name])

    def rank(self, name: str) -> int:
        return len(self._protos[name].dims)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._protos[name].dims)

    def dtype(self, name: str) -> np.dtype:
        return onnx.helper.tensor_dtype_to_np_dtype(self._protos[name].data_type)
