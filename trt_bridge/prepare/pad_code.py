"""A quantized Pad value written in the other 8-bit type: its bits, read in the data's type.

Intel Neural Compressor 1.0 (QOperator) runs ``Pad`` on the uint8 codes and quantizes the float pad value
with the *weight* type, int8, without saturating: the code it means, ``round(c/s) + z`` (131 for c = 0,
z = 131), wraps to int8 (−125). onnx and onnxruntime reject the node ("Type parameter (T) of Optype (Pad)
bound to different types (tensor(uint8) and tensor(int8))"); promoting both to int16, as the type pass
would, pads with −125 instead of 131. The bits are the intended code modulo 256, so this reads them in
the data's type::

    Before:  x_q:uint8 ─ Pad(pads, value = −125:int8) ─ y_q:uint8 ─ DequantizeLinear(s, z = 131)
    After:   x_q:uint8 ─ Pad(pads, value = 131:uint8) ─ y_q:uint8 ─ DequantizeLinear(s, z = 131)

(and int8 data with a uint8 value the same way). Only constant pad values of the other 8-bit type are
touched; the value keeps its name when nothing else reads it, else the Pad reads a retyped copy. A
warning names each node. Runs on the ModelProto before the type pass (``prepare.model.prepare``).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from trt_bridge.ir.deferred import tensor_array
from trt_bridge.prepare.change import Change

log = logging.getLogger("trt_bridge.prepare")

_OTHER = {TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}


def retype_pad_codes(model: onnx.ModelProto, elem_types: dict[str, int], where: str = "model") -> list[Change]:
    """Rewrite every Pad (main graph) whose 8-bit data and constant pad value disagree; return the changes.
    ``elem_types``: the element type of each tensor (the loaded model's inferred ``value_info``)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    changes = []
    for node in graph.node:
        if node.op_type != "Pad" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
            continue
        data, value = elem_types.get(node.input[0]), inits.get(node.input[2])
        if data not in _OTHER or value is None or value.data_type not in _OTHER or value.data_type == data:
            continue
        codes = tensor_array(value)
        retyped = codes.view(_OTHER[data])  # the same bits: the code meant, modulo 256
        name = value.name if readers[value.name] == 1 else f"{value.name}_{np.dtype(_OTHER[data]).name}"
        tensor = numpy_helper.from_array(retyped, name)
        if name == value.name:
            value.CopyFrom(tensor)
        elif name not in inits:
            graph.initializer.append(tensor)
            inits[name] = tensor
        node.input[2] = name
        what = (f"pad value '{value.name}' {codes.reshape(-1)[:1].tolist()} {np.dtype(codes.dtype).name} read as "
                f"{np.dtype(_OTHER[data]).name} {retyped.reshape(-1)[:1].tolist()} (the same bits), the type of "
                f"its data '{node.input[0]}'")
        log.warning("%s: Pad '%s': %s", where, node.name, what)
        changes.append(Change("pad-code", node.name, what))
    return changes
