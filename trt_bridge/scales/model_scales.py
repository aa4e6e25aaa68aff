"""The scales of a converted model: its symmetric INT8 and FP8 Q/DQ read back into a :class:`ScaleTable`
(ranges: amax = scale · qmax of the Q/DQ's format, 127 for int8, 448 for FP8 E4M3; :mod:`trt_bridge.formats`),
and the re-centred activations given back under the network's own tensors (``scales export``)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import onnx

from trt_bridge.errors import TrtBridgeError
from trt_bridge.formats import INT8, QuantFormat, numpy_code_format
from trt_bridge.ir.deferred import tensor_array
from trt_bridge.ir.model import constant_protos
from trt_bridge.runtime.fp4_dynamic import OP as FP4_DYNAMIC
from trt_bridge.scales.table import ScaleEntry, ScaleTable


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

    refuse_fp4(model, constants)
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or not node.input:
            continue
        x = node.input[0]
        if node.op_type == "QuantizeLinear":
            scale, fmt = qdq_scale_format(node, constants)
            if x in constants:
                put(_weight_entry(x, node, scale, constants.rank(x), source, fmt), node)
            else:
                if scale.ndim:
                    raise TrtBridgeError(f"QuantizeLinear '{node.name}' quantizes activation '{x}' per channel; "
                                         "TensorRT quantizes activations per tensor.")
                put(ScaleEntry(x, float(scale) * fmt.qmax, None, "activation", source), node)
        elif x in constants:  # a DequantizeLinear of constant (int8 or FP8) weights
            codes = numpy_code_format(constants.dtype(x))
            if codes is None or not codes.exact or codes.nearest.name not in SCALE_FORMATS:
                raise TrtBridgeError(f"DequantizeLinear '{node.name}' dequantizes '{x}' of type {constants.dtype(x)}; "
                                     "trt-bridge reads symmetric int8 and FP8 E4M3 weights only. Convert the model "
                                     "first.")
            scale, fmt = qdq_scale_format(node, constants)
            put(_weight_entry(weight_name(x), node, scale, constants.rank(x), source, fmt), node)
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
    """The weight an initializer of codes lowering wrote holds: ``<weight>_<format>[_<n>]`` (``_int8``, ``_fp8``,
    ...) without the suffix."""
    stripped = re.sub(r"_(int8|fp8|int4|fp4)(_\d+)?$", "", int8_name)
    return stripped or int8_name


def _weight_entry(name: str, node: onnx.NodeProto, scale: np.ndarray, rank: int, source: str,
                  fmt: QuantFormat = INT8) -> ScaleEntry:
    amax = scale.astype(np.float64) * fmt.qmax  # exact for float32/float16 scales and int8's 127
    if scale.ndim == 0:
        return ScaleEntry(name, float(amax), None, "weight", source)
    axis = qdq_axis(node, rank)
    return ScaleEntry(name, tuple(amax.tolist()), axis, "weight", source)


def qdq_axis(node: onnx.NodeProto, rank: int) -> int:
    """The (non-negative) axis attribute of a per-channel Q/DQ (ONNX's default is 1)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return axis + rank if axis < 0 else axis


#: the formats whose Q/DQ scale tables read (per tensor or per channel): INT4/FP4 blocks have no amax per tensor
SCALE_FORMATS = ("int8", "fp8")


def qdq_scale_format(node: onnx.NodeProto, constants: Constants) -> tuple[np.ndarray, QuantFormat]:
    """The node's scale and the format of its codes (INT8 or FP8 E4M3, read from the zero point's type, else the
    dequantized constant's): its range is ``scale · fmt.qmax``. A non-zero zero point, or codes of another type
    (uint8, E5M2, ...) are errors: those are a source's, which convert makes symmetric INT8 or FP8 E4M3."""
    zp = constants.array(node.input[2]) if len(node.input) > 2 and node.input[2] in constants else None
    x = node.input[0]
    dtype = zp.dtype if zp is not None else (
        constants.dtype(x) if node.op_type == "DequantizeLinear" and x in constants else None)
    codes = None if dtype is None else numpy_code_format(dtype)
    if codes is None or not codes.exact or codes.nearest is INT8 or codes.nearest.name not in SCALE_FORMATS:
        return qdq_scale(node, constants), INT8  # its checks and messages
    scale = _constant_scale(node, constants)
    if zp is not None and np.any(zp.astype(np.float64) != 0):
        raise TrtBridgeError(f"{node.op_type} '{node.name}' has FP8 zero point {zp.astype(np.float32).tolist()}, "
                             "not 0; convert the model first (trt-bridge convert makes every zero point 0).")
    return scale, codes.nearest


def _constant_scale(node: onnx.NodeProto, constants: Constants) -> np.ndarray:
    if len(node.input) < 2 or node.input[1] not in constants:
        raise TrtBridgeError(f"{node.op_type} '{node.name}' has no constant scale; TensorRT needs build-time "
                             "constant scales (initializers).")
    scale = constants.array(node.input[1])
    if scale.ndim > 1:
        raise TrtBridgeError(f"{node.op_type} '{node.name}' has a {scale.ndim}-d scale (blocked quantization); "
                             "trt-bridge reads per-tensor and per-channel int8 and FP8 scales only.")
    return scale


def qdq_scale(node: onnx.NodeProto, constants: Constants) -> np.ndarray:
    """The node's scale (0-d or 1-d, its own float type), after checking its zero point is an int8 0."""
    scale = _constant_scale(node, constants)
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
        return tensor_array(self._protos[name])

    def rank(self, name: str) -> int:
        return len(self._protos[name].dims)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._protos[name].dims)

    def dtype(self, name: str) -> np.dtype:
        return onnx.helper.tensor_dtype_to_np_dtype(self._protos[name].data_type)


def refuse_fp4(model: onnx.ModelProto, constants: Constants) -> None:
    """FP4 in ``model`` (NVFP4 activations quantized per inference, FP4 weight blocks): one line naming the first,
    since no scale table holds them."""
    dynamic = [n for n in model.graph.node if n.op_type == FP4_DYNAMIC]
    if dynamic:  # NVFP4 W4A4 (convert --fp4): block scales computed per inference, which no scale format holds
        raise TrtBridgeError(f"{FP4_DYNAMIC} '{dynamic[0].name}' quantizes '{dynamic[0].input[0]}' in FP4 blocks "
                             f"whose scales TensorRT computes in each inference ({len(dynamic)} such node(s)): no "
                             "scale table (TensorRT's cache, JSON, fixed point) holds them. Export the scales of an "
                             "--int8 or --fp8 conversion instead.")
    fp4 = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input and n.input[0] in constants
           and constants.dtype(n.input[0]) == ml_dtypes.float4_e2m1fn]
    if fp4:
        raise TrtBridgeError(f"DequantizeLinear '{fp4[0].name}' dequantizes FP4 E2M1 blocks of '{fp4[0].input[0]}' "
                             f"({len(fp4)} FP4 weight(s)): the scale tables hold per-tensor and per-channel INT8/FP8 "
                             "scales only. Export the scales of an --int8 or --fp8 conversion instead.")
