"""bfloat16 emulation for onnxruntime, whose CPU provider has no bfloat16 kernels.

A model with bfloat16 layers (``convert --high-precision bf16``) runs in onnxruntime as its float32
emulation: bfloat16 constants widened to float32 (exactly), and every bfloat16 result rounded to bfloat16
and widened back under its own name, as TensorRT stores it after computing in float32. ``verify``, the
accuracy target and calibration over a converted model run that emulation
(:func:`trt_bridge.runtime.session.session`, :class:`trt_bridge.calibrate.session.CalibrationSession`).
"""

from __future__ import annotations

import numpy as np
import onnx

from trt_bridge.ir.types import elem_types, skeleton

EMULATED = "trt-bridge:bfloat16-emulated"  # metadata key of an emulate_bfloat16 result


def has_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether ``model`` computes anything in bfloat16, in its main graph or a control-flow body (a cheap scan: no
    shape inference); an emulation's own rounding Casts do not count."""
    if any(p.key == EMULATED for p in model.metadata_props):
        return False
    return _graph_has_bfloat16(model.graph)


def _graph_has_bfloat16(g: onnx.GraphProto) -> bool:
    bf16 = onnx.TensorProto.BFLOAT16
    return (any(i.data_type == bf16 for i in g.initializer)
            or any(v.type.tensor_type.elem_type == bf16 for v in (*g.input, *g.output, *g.value_info))
            or any(a.name == "to" and a.i == bf16 for n in g.node if n.op_type == "Cast" for a in n.attribute)
            or any(_graph_has_bfloat16(b) for n in g.node for b in _bodies(n)))


def _bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [b for a in node.attribute for b in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))]


def emulate_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The float32 model that computes what ``model``'s bfloat16 layers compute, for onnxruntime's CPU provider
    (which has no bfloat16 kernels): bfloat16 constants become float32 (exactly), and every result that is
    bfloat16 is rounded to bfloat16 (a Cast there and back) under its own name, as TensorRT stores it after
    computing in float32. ``None`` if ``model`` has no bfloat16. The bodies of control flow (If branches) too,
    their types from onnx's shape inference."""
    if not has_bfloat16(model):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.metadata_props.add(key=EMULATED, value="1")
    inferred = None
    if any(_bodies(n) for n in model.graph.node):
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton(model), check_type=False, strict_mode=False).graph
        except Exception:  # noqa: BLE001 - best effort: the bodies' own value_info only
            inferred = None
    _emulate_graph(out.graph, elem_types(model), inferred, top=True)
    return out


def _emulate_graph(g: onnx.GraphProto, tensors: dict[str, int], inferred: onnx.GraphProto | None, top: bool) -> None:
    bf16, f32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    for init in g.initializer:
        if init.data_type == bf16:
            init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init).astype(np.float32),
                                                       init.name))
    nodes = []
    for inp in g.input if top else ():  # a bfloat16 input is fed in float32 and rounded on the way in
        if inp.type.tensor_type.elem_type == bf16:
            inp.type.tensor_type.elem_type = f32
            for node in g.node:
                node.input[:] = [f"{inp.name}__rounded" if i == inp.name else i for i in node.input]
            nodes += [onnx.helper.make_node("Cast", [inp.name], [f"{inp.name}__bf16"], name=f"{inp.name}__round",
                                            to=bf16),
                      onnx.helper.make_node("Cast", [f"{inp.name}__bf16"], [f"{inp.name}__rounded"],
                                            name=f"{inp.name}__widen", to=f32)]
    same = inferred is not None and len(inferred.node) == len(g.node)
    for k, node in enumerate(g.node):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == bf16:
                attr.t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(attr.t).astype(np.float32),
                                                             attr.t.name))
        theirs = _bodies(inferred.node[k]) if same else []
        for j, body in enumerate(_bodies(node)):
            source = theirs[j] if j < len(theirs) else body
            inner = {**tensors, **{v.name: v.type.tensor_type.elem_type
                                   for v in (*source.value_info, *source.output, *body.value_info, *body.output)}}
            _emulate_graph(body, inner, source if source is not body else None, top=False)
        nodes.append(node)
        if node.op_type == "Constant":
            continue
        cast_to_bf16 = node.op_type == "Cast" and any(a.name == "to" and a.i == bf16 for a in node.attribute)
        for k_out, name in enumerate(node.output):
            if not cast_to_bf16 and tensors.get(name) != bf16:
                continue
            raw = f"{name}__raw"
            node.output[k_out] = raw
            if cast_to_bf16:  # the Cast itself rounds: keep it, then widen
                nodes.append(onnx.helper.make_node("Cast", [raw], [name], name=f"{name}__widen", to=f32))
                continue
            nodes.append(onnx.helper.make_node("Cast", [raw], [f"{name}__bf16"], name=f"{name}__round", to=bf16))
            nodes.append(onnx.helper.make_node("Cast", [f"{name}__bf16"], [name], name=f"{name}__widen", to=f32))
    del g.node[:]
    g.node.extend(nodes)
    for v in g.output:
        if v.type.tensor_type.elem_type == bf16:
            v.type.tensor_type.elem_type = f32
    del g.value_info[:]
