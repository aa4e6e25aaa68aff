"""Repairs to onnxconverter-common's float16 output, for :func:`trt_bridge.lower.precision.to_float16`.

The converter renames the outputs of the nodes it keeps in float32, can leave a graph output in float16, and
splits every Q/DQ at the float16 boundary with a Cast. These put the names and output types back and fold
those Casts into float16 (or bfloat16) Q/DQ, so TensorRT still fuses them into INT8 kernels.
"""

from __future__ import annotations

import numpy as np
import onnx

from trt_bridge.errors import TrtBridgeError


def restore_names(model: onnx.ModelProto, named: dict[str, list[str]], suffix: str) -> None:
    """The converter renames the outputs of the nodes it keeps in float32 (``<node>_output_cast_0``) and gives
    the original name to its Cast into float16. Give the float32 result its name back (it is the value the
    source computes, which ``verify --per-layer`` aligns by name) and call the cast copy ``<name>_<suffix>``.
    A Q/DQ with a Cast after it is left to :func:`qdq_in_float16`; graph outputs keep their names."""
    g = model.graph
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output}
    taken = set(producer) | {i.name for i in g.input} | {i.name for i in g.initializer}
    renames: dict[str, str] = {}  # the cast copy's old name (the original) → its new name
    for node in g.node:
        if node.name not in named:
            continue
        for k, (now, original) in enumerate(zip(node.output, named[node.name])):
            if now == original or original in outputs or now in outputs:
                continue
            cast = producer.get(original)
            if cast is None and original not in taken:  # the converter dropped its Cast pair: only renamed
                node.output[k] = original
                renames[now] = original
                continue
            if node.op_type in ("QuantizeLinear", "DequantizeLinear") or cast is None or cast.op_type != "Cast" \
                    or list(cast.input) != [now]:
                continue
            copy = f"{original}_{suffix}"
            while copy in taken:
                copy += "_"
            taken.add(copy)
            node.output[k] = original
            cast.input[0], cast.output[0] = original, copy
            renames[original] = copy
            renames[now] = original
    if not renames:
        return
    for node in g.node:
        if node.op_type == "Cast" and node.output[0] in renames.values() and node.input[0] in renames:
            continue  # the casts rewired above
        node.input[:] = [renames.get(i, i) for i in node.input]
    for info in g.value_info:  # the float16 type goes with the copy, the float32 one with the original name
        info.name = renames.get(info.name, info.name)


def restore_output_types(model: onnx.ModelProto, types: dict[str, int]) -> None:
    """The converter can leave a graph output in float16 behind a float32 node it was told to keep (then
    casting a value beyond float16's range): give every output its original type back, at the last Cast."""
    producer = {o: n for n in model.graph.node for o in n.output}
    for output in model.graph.output:
        want = types.get(output.name)
        if not want or output.type.tensor_type.elem_type == want:
            continue
        node = producer.get(output.name)
        if node is not None and node.op_type == "Cast":
            for attr in node.attribute:
                if attr.name == "to":
                    attr.i = want
        else:
            raise TrtBridgeError(f"the float16 rewrite changed the type of output '{output.name}'; please report it.")
        output.type.tensor_type.elem_type = want


def qdq_in_float16(model: onnx.ModelProto, suffix: str = "fp16") -> None:
    """Fold the converter's ``DQ → Cast(fp16)`` and ``Cast(fp32) → Q`` into float16 Q/DQ (in place); a scale's
    float16 copy is named ``<scale>_<suffix>``."""
    g = model.graph
    producer: dict[str, onnx.NodeProto] = {}
    for n in g.node:  # the first node writing a tensor, as a fold below may leave a dead twin after it
        for o in n.output:
            producer.setdefault(o, n)
    # declared types: value_info first, then inputs, then outputs (the first declaration wins)
    declared = {v.name: v.type.tensor_type.elem_type for v in reversed((*g.value_info, *g.input, *g.output))}

    def is_float16(tensor: str) -> bool:
        if tensor in declared:
            return declared[tensor] == onnx.TensorProto.FLOAT16
        node = producer.get(tensor)
        return node is not None and node.op_type == "Cast" and _cast_to(node) == onnx.TensorProto.FLOAT16

    def readers_of(dead: set[int]) -> dict[str, list[onnx.NodeProto]]:
        found: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            if id(n) not in dead:
                for i in n.input:
                    found.setdefault(i, []).append(n)
        return found

    dead: set[int] = set()
    readers = readers_of(dead)
    inits = {i.name: i for i in g.initializer}
    outputs = {o.name for o in g.output}
    fp16_scales: dict[str, str] = {}
    # the converter casts a float32 node's output to float16 and back where a graph output follows: a lossy
    # round trip (an overflow, for the loud tensors kept in float32) that nothing asked for
    for second in g.node:
        if second.op_type != "Cast" or id(second) in dead:
            continue
        first = producer.get(second.input[0])
        if first is None or first.op_type != "Cast" or id(first) in dead:
            continue
        if _cast_to(first) == onnx.TensorProto.FLOAT16 and _cast_to(second) == onnx.TensorProto.FLOAT \
                and not is_float16(first.input[0]):
            second.input[0] = first.input[0]
            second.op_type = "Identity"
            del second.attribute[:]
            if len(readers.get(first.output[0], [])) == 1 and first.output[0] not in outputs:
                dead.add(id(first))
    readers = readers_of(dead)

    def half(scale: str) -> str:
        """The scale's low-precision copy. Its float32 original takes the same rounded value, so a Q and
        DQ of one pair that end up in different types still agree exactly (a mismatch is a gain error)."""
        if scale not in fp16_scales:
            values = onnx.numpy_helper.to_array(inits[scale]).astype(np.float32)
            rounded = _rounded(values, suffix)
            name = f"{scale}_{suffix}"
            while name in inits:
                name += "_"
            # float16 now; a bfloat16 rewrite (suffix bf16) rounds it again from the original float32 values
            g.initializer.append(onnx.numpy_helper.from_array(
                np.maximum(values, np.finfo(np.float16).smallest_subnormal).astype(np.float16), name))
            inits[name] = g.initializer[-1]
            inits[scale].CopyFrom(onnx.numpy_helper.from_array(rounded, scale))
            fp16_scales[scale] = name
        return fp16_scales[scale]

    for cast in list(g.node):
        if cast.op_type != "Cast" or id(cast) in dead or not cast.input or cast.input[0] in outputs:
            continue
        to = _cast_to(cast)
        src = producer.get(cast.input[0])
        if to == onnx.TensorProto.FLOAT16 and src is not None and src.op_type == "DequantizeLinear" \
                and len(readers.get(cast.input[0], [])) == 1 and src.input[1] in inits:
            src.input[1] = half(src.input[1])
            src.output[0] = cast.output[0]
            producer[cast.output[0]] = src  # it reads the DQ's output, so (sorted) comes after it
            dead.add(id(cast))
            continue
        users = readers.get(cast.output[0], [])
        if to == onnx.TensorProto.FLOAT and len(users) == 1 and users[0].op_type == "QuantizeLinear" \
                and users[0].input[0] == cast.output[0] and users[0].input[1] in inits \
                and cast.output[0] not in outputs and is_float16(cast.input[0]):
            users[0].input[0] = cast.input[0]
            users[0].input[1] = half(users[0].input[1])
            dead.add(id(cast))
    keep = [n for n in g.node if id(n) not in dead]
    used = {i for n in keep for i in n.input} | outputs  # casts the folds above left without readers
    keep = [n for n in keep if n.op_type not in ("Cast", "Identity") or any(o in used for o in n.output)]
    del g.node[:]
    g.node.extend(keep)
    # a scale now read as float16 only by every Q/DQ that used it: the float32 copy may be unused
    used = {i for n in g.node for i in n.input}
    unused = [i for i in g.initializer if i.name not in used]
    for init in unused:
        g.initializer.remove(init)
    del g.value_info[:]


def _rounded(values: np.ndarray, kind: str) -> np.ndarray:
    """``values`` (positive scales) rounded to float16 or bfloat16, as float32."""
    if kind == "bf16":
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16).astype(np.float32)
    return np.maximum(values, np.finfo(np.float16).smallest_subnormal).astype(np.float16).astype(np.float32)


def _cast_to(cast: onnx.NodeProto) -> int:
    return next(a.i for a in cast.attribute if a.name == "to")
