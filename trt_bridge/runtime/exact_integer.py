"""Integer ops onnxruntime computes exactly on every x86 CPU: int8 weights as uint8 offset by 128.

onnxruntime's x86 kernels for uint8 activations × int8 weights (``MatMulInteger``, ``ConvInteger``,
``QLinearConv``, ``QLinearMatMul`` and the com.microsoft ops built on them) multiply with ``VPMADDUBSW`` on CPUs
without VNNI (AVX2, AVX-512F): each pair of products is summed in int16 and saturates (255·127·2 = 64770 >
32767). The same model then computes different numbers from one machine to the next, and none of them what
TensorRT's int32 accumulation computes. Its uint8 × uint8 kernels widen to int16 first and are exact.

Before (an int8 weight, its zero point ``zb`` or none)::

    a (uint8) ─ MatMulInteger(B int8, a_zero_point, zb int8) ─ y

After (the same products: (a - za)·((b + 128) - (zb + 128)) = (a - za)·(b - zb))::

    a (uint8) ─ MatMulInteger(B + 128 uint8, a_zero_point, zb + 128 uint8) ─ y

Only constant weights are rewritten, and only where the activation is uint8 (int8 × int8 kernels do not
saturate). A weight read by several nodes is offset once.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

#: op type (domain-less) → (activation input, its zero point input or None when the op quantizes the activation
#: to uint8 itself, weight inputs with their zero point input)
INTEGER_OPS: dict[tuple[str, str], tuple[int | None, int | None, tuple[tuple[int, int], ...]]] = {
    ("", "MatMulInteger"): (0, 2, ((1, 3),)),
    ("", "ConvInteger"): (0, 2, ((1, 3),)),
    ("", "QLinearConv"): (0, 2, ((3, 5),)),
    ("", "QLinearMatMul"): (0, 2, ((3, 5),)),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, 4, ((1, 5),)),
    ("com.microsoft", "QGemm"): (0, 2, ((3, 5),)),
    ("com.microsoft", "DynamicQuantizeMatMul"): (None, None, ((1, 3),)),
    ("com.microsoft", "QAttention"): (0, 6, ((1, 7),)),
    ("com.microsoft", "DynamicQuantizeLSTM"): (None, None, ((1, 9), (2, 11))),
}


def _key(node: onnx.NodeProto) -> tuple[str, str]:
    return ("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type)


def has_saturating_ops(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s graph has an op :func:`exact_integer` may rewrite (a cheap look, no values read)."""
    return any(_key(n) in INTEGER_OPS for n in model.graph.node)


def _int8_constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    found = {init.name: init for init in model.graph.initializer if init.data_type == TensorProto.INT8}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.t.data_type == TensorProto.INT8:
                    found[node.output[0]] = attr.t
    return found


def _uint8_activations(model: onnx.ModelProto) -> set[str]:
    """Names of the model's uint8 tensors: inputs, declared values, initializers and the outputs of the ops that
    write uint8 (DynamicQuantizeLinear, QuantizeLinear with a uint8 zero point, Cast to uint8)."""
    names = {v.name for v in (*model.graph.input, *model.graph.value_info, *model.graph.output)
             if v.type.tensor_type.elem_type == TensorProto.UINT8}
    names |= {i.name for i in model.graph.initializer if i.data_type == TensorProto.UINT8}
    for node in model.graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            names.add(node.output[0])
        elif node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in names:
            names.add(node.output[0])
        elif node.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.UINT8 for a in node.attribute):
            names.add(node.output[0])
    return names


def exact_integer(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of ``model`` whose uint8 × int8 integer ops take their constant int8 weights as uint8 + 128 (see the
    module docstring), or None when nothing needs it. Nodes inside subgraphs are left as they are."""
    if not has_saturating_ops(model):
        return None
    constants = _int8_constants(model)
    uint8 = _uint8_activations(model)
    plans = []
    for index, node in enumerate(model.graph.node):
        spec = INTEGER_OPS.get(_key(node))
        if spec is None:
            continue
        activation, activation_zero, weights = spec
        if activation is not None:
            zero = node.input[activation_zero] if len(node.input) > activation_zero else ""
            if node.input[activation] not in uint8 and zero not in uint8:
                continue  # int8 activations: int8 × int8 kernels are exact
        chosen = [(w, z) for w, z in weights if len(node.input) > w and node.input[w] in constants
                  and (len(node.input) <= z or not node.input[z] or node.input[z] in constants)]
        if len(chosen) == len(weights):
            plans.append((index, chosen))
    if not plans:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    made: dict[str, str] = {}
    taken = {i.name for i in out.graph.initializer} | {o for n in out.graph.node for o in n.output} | {
        i.name for i in out.graph.input}

    def offset(name: str) -> str:
        if name not in made:
            values = numpy_helper.to_array(constants[name]).astype(np.int16) + 128
            new = f"{name}__uint8"
            while new in taken:
                new += "_"
            taken.add(new)
            out.graph.initializer.append(numpy_helper.from_array(values.astype(np.uint8), new))
            made[name] = new
        return made[name]

    for index, chosen in plans:
        node = out.graph.node[index]
        for w, z in chosen:
            if len(node.input) > z and node.input[z]:
                node.input[z] = offset(node.input[z])
            else:
                while len(node.input) < z:
                    node.input.append("")
                if "__uint8_zero" not in made:
                    made["__uint8_zero"] = "__trt_bridge_uint8_128"
                    out.graph.initializer.append(numpy_helper.from_array(np.array(128, np.uint8),
                                                                         made["__uint8_zero"]))
                if len(node.input) > z:
                    node.input[z] = made["__uint8_zero"]
                else:
                    node.input.append(made["__uint8_zero"])
            node.input[w] = offset(node.input[w])
    return out
