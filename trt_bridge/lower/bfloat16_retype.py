"""The bfloat16 half of ``--high-precision bf16``: the float16 rewrite's result retyped to bfloat16.

Every float16 tensor, constant, scale and Cast becomes bfloat16, each constant rounded from its original
float32 value (never through float16, whose range clamp bfloat16 does not need); graph inputs and outputs
that were float16 in the source keep that type behind a Cast.
"""

from __future__ import annotations

import numpy as np
import onnx


def float_constants(model: onnx.ModelProto) -> dict:
    """The float32 values of ``model``'s initializers (by name) and node attribute tensors (by node name, attribute
    and index), before the float16 converter rounds and clamps them; those of a control-flow body keyed the same
    behind its path (:func:`body_path` steps)."""
    found: dict = {}

    def walk(graph: onnx.GraphProto, path: tuple) -> None:
        def key(*rest):
            return rest[0] if not path and len(rest) == 1 else (rest if not path else (path, *rest))
        for init in graph.initializer:
            if init.data_type == onnx.TensorProto.FLOAT:
                found[key(init.name)] = init
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == onnx.TensorProto.FLOAT:
                    found[key(node.name, attr.name, 0)] = attr.t
                for i, t in enumerate(attr.tensors):
                    if t.data_type == onnx.TensorProto.FLOAT:
                        found[key(node.name, attr.name, i)] = t
                for j, body in enumerate([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    walk(body, body_path(path, node, attr, j))

    walk(model.graph, ())
    # copies: the converter rewrites these protos in place
    return {k: onnx.numpy_helper.to_array(t).copy() for k, t in found.items()}


def body_path(path: tuple, node: onnx.NodeProto, attr: onnx.AttributeProto, index: int) -> tuple:
    """The path of body ``index`` of ``node``'s attribute ``attr`` inside the graph at ``path`` (the float16 pass
    keeps node names, so a body's path is the same before and after it)."""
    return (*path, (node.name, attr.name, index))


def _bfloat16_tensor(values: np.ndarray, name: str) -> onnx.TensorProto:
    import ml_dtypes

    return onnx.numpy_helper.from_array(np.asarray(values, np.float32).astype(ml_dtypes.bfloat16), name)


def retype_float16(model: onnx.ModelProto, originals: dict, interface: dict[str, int]) -> None:
    """Every float16 type, constant and Cast of ``model`` (the converter's output) as bfloat16, in place.
    Constants are rounded from ``originals`` (their float32 values) where known, and a float16 scale copy
    (``<scale>_bf16``) from its float32 scale. ``interface``: graph inputs and outputs whose original type
    stays (a float16 model's own interface under ``--io-types keep``)."""
    f16, bf16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16

    def retype_tensor(t: onnx.TensorProto, key) -> None:
        if t.data_type != f16:
            return
        values = originals.get(key)
        if values is None:
            values = onnx.numpy_helper.to_array(t).astype(np.float32)
        t.CopyFrom(_bfloat16_tensor(values, t.name))

    def retype_graph(graph: onnx.GraphProto, path: tuple) -> None:
        top = not path

        def key(*rest):
            return rest[0] if top and len(rest) == 1 else (rest if top else (path, *rest))
        for init in graph.initializer:
            base = init.name[:-len("_bf16")] if init.name.endswith("_bf16") else None
            name = init.name if key(init.name) in originals or key(base) not in originals else base
            retype_tensor(init, key(name))
        for node in graph.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i == f16:
                    attr.i = bf16
                if attr.type == onnx.AttributeProto.TENSOR:
                    retype_tensor(attr.t, key(node.name, attr.name, 0))
                for i, t in enumerate(attr.tensors):
                    retype_tensor(t, key(node.name, attr.name, i))
                for j, body in enumerate([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    retype_graph(body, body_path(path, node, attr, j))
        for v in (*graph.value_info, *graph.input, *graph.output):
            tt = v.type.tensor_type
            if tt.elem_type == f16 and not (top and interface.get(v.name) == f16):
                tt.elem_type = bf16

    retype_graph(model.graph, ())
    _keep_interface(model, {k: v for k, v in interface.items() if v == f16})


def _keep_interface(model: onnx.ModelProto, float16_io: dict[str, int]) -> None:
    """Graph inputs and outputs that are float16 in the source keep that type: a Cast to bfloat16 after each
    such input, one to float16 before each such output."""
    g = model.graph
    bf16 = onnx.TensorProto.BFLOAT16
    inputs = {i.name for i in g.input if i.name in float16_io}
    outputs = {o.name for o in g.output if o.name in float16_io}
    if not inputs and not outputs:
        return
    casts = []
    for name in sorted(inputs):
        inner = f"{name}_bf16"
        for node in g.node:
            node.input[:] = [inner if i == name else i for i in node.input]
        casts.append(onnx.helper.make_node("Cast", [name], [inner], name=f"{name}_to_bf16", to=bf16))
    tail = []
    for name in sorted(outputs):
        inner = f"{name}_bf16_result"
        for node in g.node:
            node.input[:] = [inner if i == name else i for i in node.input]
            node.output[:] = [inner if o == name else o for o in node.output]
        tail.append(onnx.helper.make_node("Cast", [inner], [name], name=f"{name}_to_fp16",
                                          to=onnx.TensorProto.FLOAT16))
    nodes = [*casts, *g.node, *tail]
    del g.node[:]
    g.node.extend(nodes)
