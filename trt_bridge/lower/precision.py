"""``convert --high-precision fp16|bf16``: the part of the graph INT8 leaves alone, in float16 or bfloat16,
written into the model.

TensorRT 11 (and TensorRT-RTX) run every layer in the type the ONNX gives it, so a converted model whose
non-quantized layers are float32 runs them in FP32. This pass writes them in float16 with onnxconverter-
common's converter (casts at the boundaries, float16 constants clamped to its range), keeping in float32:

- the numerically sensitive ops: normalization statistics, Softmax, Pow, Exp, Log, reductions, Sqrt and
  Reciprocal (the pieces of a decomposed LayerNorm);
- float shape arithmetic (float16 would round a dimension);
- every node that reads or writes a tensor whose calibrated range exceeds float16's safe range (half of
  65504, so that one more Add does not overflow), found by one pass over the calibration feeds;
- the graph's inputs and outputs (their types are the model's interface), unless ``--io-types``;
- the INT8 layers that compensate a re-centred input (and their bias Adds): their bias carries c·ΣW, which
  cancels against the shifted input only if it and the weight scales are exact (``exact``).
  :func:`trt_bridge.calibrate.recenter.recenter` makes the shifted tensor's scale representable in the low-precision
  type and, for a non-negative tensor, the centre 128 steps, so a ReLU's zeros stay on the int8 grid.

Q/DQ keep the converter from splitting them: where it would put a Cast between a DequantizeLinear and
its float16 reader (or between a float16 producer and a QuantizeLinear), the Q/DQ instead take a float16
scale and read or write float16 directly (opset 19), so TensorRT still fuses them into INT8 kernels.
Every node kept in float32 is reported with its reason.

bfloat16 is the same rewrite with the type changed afterwards: every float16 tensor, constant, scale and
Cast becomes bfloat16, each constant rounded from its original float32 value (never through float16, whose
range clamp bfloat16 does not need). bfloat16 has float32's range, so no layer is kept for its range.
onnxruntime's CPU provider has no bfloat16 kernels: :func:`emulate_bfloat16` gives the float32 model that
rounds every bfloat16 result as TensorRT stores it, which is what ``verify`` and the accuracy target run.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

import numpy as np
import onnx

from trt_bridge.errors import MissingDependencyError, TrtBridgeError

log = logging.getLogger("trt_bridge.lower.precision")

SENSITIVE = frozenset({
    "LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization",
    "Softmax", "LogSoftmax", "Pow", "Exp", "Log", "Sqrt", "Reciprocal", "ReduceMean", "ReduceSum",
    "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd",
    "CumSum", "Range", "Resize", "Upsample", "NonMaxSuppression", "TopK", "RoiAlign",
})
FP16_SAFE = 32752.0  # half of float16's largest finite value


class HighPrecision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


@dataclass(frozen=True)
class KeptInFloat32:
    node: str
    op: str
    reason: str


def to_low_precision(model: onnx.ModelProto, kind: HighPrecision | str, ranges: dict[str, float] | None = None,
                     keep_io_types: bool = True, exact: dict[str, str] | None = None
                     ) -> tuple[onnx.ModelProto, list[KeptInFloat32]]:
    """``model`` (a lowered INT8 Q/DQ model, opset ≥ 13) with its float part in ``kind`` (fp16 or bf16; see the
    module doc). ``ranges``: tensor → largest magnitude seen on the calibration feeds (float16 only);
    ``exact``: INT8 layers (and their bias Adds) that compensate a re-centred input → that input. They stay
    float32: their bias carries c·ΣW, a large constant that cancels against the shifted input, and rounding it
    (or their weight scales) to 8 or 11 bits would leave an error of the size of c·ΣW's last bit."""
    kind = HighPrecision(kind)
    if kind is HighPrecision.FP32:
        return model, []
    from trt_bridge.ir.model import declared_types, default_opset

    op_of = {n.name: n.op_type for n in model.graph.node}
    kept = [KeptInFloat32(node, op_of[node], f"INT8 layer compensating the re-centred '{tensor}': its bias c·ΣW "
                                             "and weight scales stay exact")
            for node, tensor in sorted((exact or {}).items()) if node in op_of]
    if kind is HighPrecision.FP16:
        return to_float16(model, ranges, keep_io_types, extra=kept)
    from onnx import version_converter

    interface = declared_types((*model.graph.input, *model.graph.output))
    source = default_opset(model)
    opset = max(19, source)
    # opset 22 gave bfloat16 to Conv, pooling and most activations: upgrade where that lets a layer run in it
    if opset < BF16_OPSET and any(_lacks_bfloat16(n, opset) and not _lacks_bfloat16(n, BF16_OPSET)
                                  for n in model.graph.node):
        opset = BF16_OPSET
    if opset != source:
        model = version_converter.convert_version(model, opset)
    extra, taken = list(kept), {k.node for k in kept}
    for n in model.graph.node:
        if n.name in taken or n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if _lacks_bfloat16(n, opset):
            extra.append(KeptInFloat32(n.name, n.op_type, f"{n.op_type} has no bfloat16 type in ONNX opset {opset}"))
        elif n.op_type in TENSORRT_NO_BF16:
            extra.append(KeptInFloat32(n.name, n.op_type, TENSORRT_NO_BF16[n.op_type]))
    originals = _float_constants(model)
    converted, kept = to_float16(model, None, keep_io_types, scale_suffix="bf16", extra=extra)
    _retype_float16(converted, originals, interface if keep_io_types else {})
    return converted, kept


BF16_OPSET = 22
#: ops ONNX types in bfloat16 that TensorRT does not build in it (TensorRT-RTX 1.7: "Could not infer output
#: types for operation: deconv" for a bfloat16 ConvTranspose)
TENSORRT_NO_BF16 = {"ConvTranspose": "TensorRT builds no bfloat16 ConvTranspose (deconvolution)"}


def _lacks_bfloat16(node: onnx.NodeProto, opset: int) -> bool:
    """Whether ``node``'s ONNX schema at ``opset`` types a float input or output without bfloat16 (so the node
    cannot be written in it). Nodes of other domains count as lacking it."""
    if (node.domain or "") not in ("", "ai.onnx"):
        return True
    try:
        schema = onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        return True
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for param in (*schema.inputs, *schema.outputs):
        types = allowed.get(param.type_str, {param.type_str})
        if "tensor(float)" in types and "tensor(bfloat16)" not in types:
            return True
    return False


def to_float16(model: onnx.ModelProto, ranges: dict[str, float] | None = None, keep_io_types: bool = True,
               scale_suffix: str = "fp16", extra: list[KeptInFloat32] = ()) -> tuple[onnx.ModelProto,
                                                                                 list[KeptInFloat32]]:
    """``model`` (a lowered INT8 Q/DQ model, opset ≥ 13) with its float part in float16 (see the module doc).
    ``ranges``: tensor → largest magnitude seen on the calibration feeds; ``extra``: more nodes to keep in
    float32, with their reasons."""
    try:
        from onnxconverter_common import float16
    except ImportError as exc:
        raise MissingDependencyError("--high-precision fp16/bf16 writes the model with onnxconverter-common: pip "
                                     "install onnxconverter-common (or 'trt-bridge[fp16]').") from exc
    from onnx import version_converter

    from trt_bridge.ir.model import default_opset

    ranges = ranges or {}
    kept: list[KeptInFloat32] = list(extra)
    block_nodes = [k.node for k in extra]
    blocked = set(block_nodes)
    shape_nodes = _shape_computation(model)
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.name in blocked:
            continue
        if node.name in shape_nodes:
            kept.append(KeptInFloat32(node.name, node.op_type, "it computes a shape (float16 would round it)"))
            block_nodes.append(node.name)
            continue
        if node.op_type in SENSITIVE:
            kept.append(KeptInFloat32(node.name, node.op_type, f"{node.op_type} is numerically sensitive"))
            block_nodes.append(node.name)
            continue
        big = [(t, ranges[t]) for t in (*node.input, *node.output) if ranges.get(t, 0.0) > FP16_SAFE]
        if big:
            tensor, value = max(big, key=lambda item: item[1])
            kept.append(KeptInFloat32(node.name, node.op_type, f"'{tensor}' reaches {value:.4g} on the calibration "
                                                                f"data, beyond float16's safe range ({FP16_SAFE:g})"))
            block_nodes.append(node.name)
    if default_opset(model) < 19:  # float16 Q/DQ scales need opset 19; upgrade while every Q/DQ is still float32
        model = version_converter.convert_version(model, 19)
    import warnings

    named = {n.name: list(n.output) for n in model.graph.node if n.name}
    with warnings.catch_warnings():  # the converter warns for every constant it clamps into float16's range
        warnings.simplefilter("ignore", UserWarning)
        converted = float16.convert_float_to_float16(
            model, keep_io_types=keep_io_types, op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, "QuantizeLinear",
                                                               "DequantizeLinear"],
            node_block_list=block_nodes, min_positive_val=float(np.finfo(np.float16).smallest_subnormal),
            max_finite_val=65504.0, disable_shape_infer=False)
    if keep_io_types:
        _restore_output_types(converted, {o.name: o.type.tensor_type.elem_type for o in model.graph.output})
    _restore_names(converted, named, scale_suffix)
    _qdq_in_float16(converted, scale_suffix)
    return converted, kept


#: op → the inputs that are shapes, sizes or indices rather than data
SHAPE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,),
                "Range": (0, 1, 2), "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1,), "TopK": (1,),
                "Unsqueeze": (1,), "Squeeze": (1,), "ReduceMean": (1,), "ReduceSum": (1,), "OneHot": (1,),
                "NonMaxSuppression": (2,), "Split": (1,)}


def _shape_computation(model: onnx.ModelProto) -> set[str]:
    """The nodes whose values end up as a shape, size or index (walking back from those inputs): shape
    arithmetic exporters route through float ops, which float16 would round (a 0 where a dimension was)."""
    from trt_bridge.ir.model import value_types

    floats = {name for name, t in value_types(model).items()
              if t.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)}
    producer = {o: n for n in model.graph.node for o in n.output}
    todo = [n.input[i] for n in model.graph.node for i in SHAPE_INPUTS.get(n.op_type, ()) if i < len(n.input)]
    seen: set[str] = set()
    found: set[str] = set()
    while todo:
        node = producer.get(todo.pop())
        if node is None or node.name in seen or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        seen.add(node.name)
        if any(o in floats for o in node.output):  # integer shape arithmetic is not converted anyway
            found.add(node.name)
        if node.op_type != "Shape":  # a Shape reads data only for its dimensions
            todo.extend(i for i in node.input if i)
    return found


def _restore_names(model: onnx.ModelProto, named: dict[str, list[str]], suffix: str) -> None:
    """The converter renames the outputs of the nodes it keeps in float32 (``<node>_output_cast_0``) and gives
    the original name to its Cast into float16. Give the float32 result its name back (it is the value the
    source computes, which ``verify --per-layer`` aligns by name) and call the cast copy ``<name>_<suffix>``.
    A Q/DQ with a Cast after it is left to :func:`_qdq_in_float16`; graph outputs keep their names."""
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


def _restore_output_types(model: onnx.ModelProto, types: dict[str, int]) -> None:
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


def _qdq_in_float16(model: onnx.ModelProto, suffix: str = "fp16") -> None:
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


def _float_constants(model: onnx.ModelProto) -> dict:
    """The float32 values of ``model``'s top-level initializers (by name) and node attribute tensors (by node
    name, attribute and index), before the float16 converter rounds and clamps them."""
    found: dict = {}
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT:
            found[init.name] = init
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == onnx.TensorProto.FLOAT:
                found[(node.name, attr.name, 0)] = attr.t
            for i, t in enumerate(attr.tensors):
                if t.data_type == onnx.TensorProto.FLOAT:
                    found[(node.name, attr.name, i)] = t
    # copies: the converter rewrites these protos in place
    return {key: onnx.numpy_helper.to_array(t).copy() for key, t in found.items()}


def _bfloat16_tensor(values: np.ndarray, name: str) -> onnx.TensorProto:
    import ml_dtypes

    return onnx.numpy_helper.from_array(np.asarray(values, np.float32).astype(ml_dtypes.bfloat16), name)


def _retype_float16(model: onnx.ModelProto, originals: dict, interface: dict[str, int]) -> None:
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

    def retype_graph(graph: onnx.GraphProto, top: bool) -> None:
        for init in graph.initializer:
            base = init.name[:-len("_bf16")] if init.name.endswith("_bf16") else None
            key = init.name if init.name in originals or base not in originals else base
            retype_tensor(init, key if top else None)
        for node in graph.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i == f16:
                    attr.i = bf16
                if attr.type == onnx.AttributeProto.TENSOR:
                    retype_tensor(attr.t, (node.name, attr.name, 0) if top else None)
                for i, t in enumerate(attr.tensors):
                    retype_tensor(t, (node.name, attr.name, i) if top else None)
                if attr.type == onnx.AttributeProto.GRAPH:
                    retype_graph(attr.g, False)
                for sub in attr.graphs:
                    retype_graph(sub, False)
        for v in (*graph.value_info, *graph.input, *graph.output):
            tt = v.type.tensor_type
            if tt.elem_type == f16 and not (top and interface.get(v.name) == f16):
                tt.elem_type = bf16

    retype_graph(model.graph, True)
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


EMULATED = "trt-bridge:bfloat16-emulated"  # metadata key of an emulate_bfloat16 result


def has_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s top-level graph computes anything in bfloat16 (a cheap scan: no shape inference);
    an emulation's own rounding Casts do not count."""
    bf16 = onnx.TensorProto.BFLOAT16
    g = model.graph
    if any(p.key == EMULATED for p in model.metadata_props):
        return False
    return (any(i.data_type == bf16 for i in g.initializer)
            or any(v.type.tensor_type.elem_type == bf16 for v in (*g.input, *g.output, *g.value_info))
            or any(a.name == "to" and a.i == bf16 for n in g.node if n.op_type == "Cast" for a in n.attribute))


def emulate_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The float32 model that computes what ``model``'s bfloat16 layers compute, for onnxruntime's CPU provider
    (which has no bfloat16 kernels): bfloat16 constants become float32 (exactly), and every result that is
    bfloat16 is rounded to bfloat16 (a Cast there and back) under its own name, as TensorRT stores it after
    computing in float32. ``None`` if ``model`` has no bfloat16. Top-level graph only."""
    from trt_bridge.ir.model import elem_types

    bf16, f32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    if not has_bfloat16(model):
        return None
    tensors = elem_types(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.metadata_props.add(key=EMULATED, value="1")
    g = out.graph
    for init in g.initializer:
        if init.data_type == bf16:
            init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init).astype(np.float32),
                                                       init.name))
    nodes = []
    for inp in g.input:  # a bfloat16 input is fed in float32 and rounded on the way in
        if inp.type.tensor_type.elem_type == bf16:
            inp.type.tensor_type.elem_type = f32
            for node in g.node:
                node.input[:] = [f"{inp.name}__rounded" if i == inp.name else i for i in node.input]
            nodes += [onnx.helper.make_node("Cast", [inp.name], [f"{inp.name}__bf16"], name=f"{inp.name}__round",
                                            to=bf16),
                      onnx.helper.make_node("Cast", [f"{inp.name}__bf16"], [f"{inp.name}__rounded"],
                                            name=f"{inp.name}__widen", to=f32)]
    for node in g.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == bf16:
                attr.t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(attr.t).astype(np.float32),
                                                             attr.t.name))
        nodes.append(node)
        if node.op_type == "Constant":
            continue
        cast_to_bf16 = node.op_type == "Cast" and any(a.name == "to" and a.i == bf16 for a in node.attribute)
        for k, name in enumerate(node.output):
            if not cast_to_bf16 and tensors.get(name) != bf16:
                continue
            raw = f"{name}__raw"
            node.output[k] = raw
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
    return out


def _rounded(values: np.ndarray, kind: str) -> np.ndarray:
    """``values`` (positive scales) rounded to float16 or bfloat16, as float32."""
    if kind == "bf16":
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16).astype(np.float32)
    return np.maximum(values, np.finfo(np.float16).smallest_subnormal).astype(np.float16).astype(np.float32)


def _cast_to(cast: onnx.NodeProto) -> int:
    return next(a.i for a in cast.attribute if a.name == "to")


def observed_ranges(lifted: onnx.ModelProto, feeds, progress: bool) -> dict[str, float]:
    """The largest magnitude of every float tensor of ``lifted`` on ``feeds`` (one onnxruntime pass)."""
    from trt_bridge.calibrate.observers import CalibMethod, RangeObserver
    from trt_bridge.calibrate.session import CalibrationSession
    from trt_bridge.ir.model import FLOAT_TYPES

    floats = {v.name for v in lifted.graph.value_info if v.type.tensor_type.elem_type in FLOAT_TYPES}
    names = sorted({o for n in lifted.graph.node for o in n.output if o in floats})
    if not names:
        return {}
    observers = {t: RangeObserver(CalibMethod.MAX) for t in names}
    with CalibrationSession(lifted, names) as session:
        session.run(observers, feeds, progress, desc="ranges for float16")
    return {t: o.max for t, o in observers.items()}


WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
SKIP = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Constant", "Identity", "Reshape", "Transpose",
                  "Flatten", "Squeeze", "Unsqueeze", "Shape", "Gather", "Concat", "Split", "Slice"})


def layer_precisions(model: onnx.ModelProto) -> dict:
    """Which compute layers TensorRT runs in INT8, FP16, BF16 or FP32, as the model's types dictate (strong
    typing): a weighted op whose data input is dequantized from int8 runs INT8, any other layer in its output's
    type. Data movement (reshapes, casts, Q/DQ themselves) is not counted."""
    from trt_bridge.ir.model import elem_types

    types = elem_types(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    names = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16",
             onnx.TensorProto.DOUBLE: "fp64"}
    layers: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type in SKIP or not node.output:
            continue
        src = producer.get(node.input[0]) if node.input else None
        if node.op_type in WEIGHTED_OPS and src is not None and src.op_type == "DequantizeLinear":
            layers[node.name] = "int8"
            continue
        kind = names.get(types.get(node.output[0], 0))
        if kind is not None:
            layers[node.name] = kind
    counts: dict[str, int] = {}
    for kind in layers.values():
        counts[kind] = counts.get(kind, 0) + 1
    return {"counts": dict(sorted(counts.items())), "layers": layers}


def precision_line(precisions: dict) -> str:
    counts = precisions["counts"]
    return "layers by precision (as TensorRT will run them): " + (
        ", ".join(f"{k.upper()} {v}" for k, v in counts.items()) or "none")
