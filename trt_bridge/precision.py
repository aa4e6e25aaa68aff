"""``convert --high-precision fp16``: the part of the graph INT8 leaves alone, in float16, written into the model.

TensorRT 11 (and TensorRT-RTX) run every layer in the type the ONNX gives it, so a converted model whose
non-quantized layers are float32 runs them in FP32. This pass writes them in float16 with onnxconverter-
common's converter (casts at the boundaries, float16 constants clamped to its range), keeping in float32:

- the numerically sensitive ops: normalization statistics, Softmax, Pow, Exp, Log, reductions, Sqrt and
  Reciprocal (the pieces of a decomposed LayerNorm);
- every node that reads or writes a tensor whose calibrated range exceeds float16's safe range (half of
  65504, so that one more Add does not overflow), found by one pass over the calibration feeds;
- the graph's inputs and outputs (their types are the model's interface), unless ``--io-types fp16``.

Q/DQ keep the converter from splitting them: where it would put a Cast between a DequantizeLinear and
its float16 reader (or between a float16 producer and a QuantizeLinear), the Q/DQ instead take a float16
scale and read or write float16 directly (opset 19), so TensorRT still fuses them into INT8 kernels.
Every node kept in float32 is reported with its reason.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

import numpy as np
import onnx

from trt_bridge.errors import MissingDependencyError, TrtBridgeError

log = logging.getLogger("trt_bridge.precision")

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


@dataclass(frozen=True)
class KeptInFloat32:
    node: str
    op: str
    reason: str


def to_float16(model: onnx.ModelProto, ranges: dict[str, float] | None = None, keep_io_types: bool = True
               ) -> tuple[onnx.ModelProto, list[KeptInFloat32]]:
    """``model`` (a lowered INT8 Q/DQ model, opset ≥ 13) with its float part in float16 (see the module doc).
    ``ranges``: tensor → largest magnitude seen on the calibration feeds."""
    try:
        from onnxconverter_common import float16
    except ImportError as exc:
        raise MissingDependencyError("--high-precision fp16 writes the model with onnxconverter-common: pip install "
                                     "onnxconverter-common (or 'trt-bridge[fp16]').") from exc
    from onnx import version_converter

    ranges = ranges or {}
    kept: list[KeptInFloat32] = []
    block_nodes = []
    shape_nodes = _shape_computation(model)
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
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
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    if opset < 19:  # float16 Q/DQ scales need opset 19; upgrade while every Q/DQ is still float32
        model = version_converter.convert_version(model, 19)
    import warnings

    with warnings.catch_warnings():  # the converter warns for every constant it clamps into float16's range
        warnings.simplefilter("ignore", UserWarning)
        converted = float16.convert_float_to_float16(
            model, keep_io_types=keep_io_types, op_block_list=[*float16.DEFAULT_OP_BLOCK_LIST, "QuantizeLinear",
                                                               "DequantizeLinear"],
            node_block_list=block_nodes, min_positive_val=float(np.finfo(np.float16).smallest_subnormal),
            max_finite_val=65504.0, disable_shape_infer=False)
    if keep_io_types:
        _restore_output_types(converted, {o.name: o.type.tensor_type.elem_type for o in model.graph.output})
    _qdq_in_float16(converted)
    return converted, kept


#: op → the inputs that are shapes, sizes or indices rather than data
SHAPE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,),
                "Range": (0, 1, 2), "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1,), "TopK": (1,),
                "Unsqueeze": (1,), "Squeeze": (1,), "ReduceMean": (1,), "ReduceSum": (1,), "OneHot": (1,),
                "NonMaxSuppression": (2,), "Split": (1,)}


def _shape_computation(model: onnx.ModelProto) -> set[str]:
    """The nodes whose values end up as a shape, size or index (walking back from those inputs): shape
    arithmetic exporters route through float ops, which float16 would round (a 0 where a dimension was)."""
    from trt_bridge.model import value_types

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


def _qdq_in_float16(model: onnx.ModelProto) -> None:
    """Fold the converter's ``DQ → Cast(fp16)`` and ``Cast(fp32) → Q`` into float16 Q/DQ (in place)."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    inits = {i.name: i for i in g.initializer}
    outputs = {o.name for o in g.output}
    fp16_scales: dict[str, str] = {}
    dead: set[int] = set()
    # the converter casts a float32 node's output to float16 and back where a graph output follows: a lossy
    # round trip (an overflow, for the loud tensors kept in float32) that nothing asked for
    for second in g.node:
        if second.op_type != "Cast" or id(second) in dead:
            continue
        first = producer.get(second.input[0])
        if first is None or first.op_type != "Cast" or id(first) in dead:
            continue
        to_first = next(a.i for a in first.attribute if a.name == "to")
        to_second = next(a.i for a in second.attribute if a.name == "to")
        if to_first == onnx.TensorProto.FLOAT16 and to_second == onnx.TensorProto.FLOAT \
                and not _is_float16(model, first.input[0]):
            second.input[0] = first.input[0]
            second.op_type = "Identity"
            del second.attribute[:]
            if len(readers.get(first.output[0], [])) == 1 and first.output[0] not in outputs:
                dead.add(id(first))
    readers = {}
    for n in g.node:
        if id(n) in dead:
            continue
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def half(scale: str) -> str:
        if scale not in fp16_scales:
            values = onnx.numpy_helper.to_array(inits[scale]).astype(np.float32)
            values = np.maximum(values, np.finfo(np.float16).smallest_subnormal).astype(np.float16)
            name = f"{scale}_fp16"
            while name in inits:
                name += "_"
            g.initializer.append(onnx.numpy_helper.from_array(values, name))
            inits[name] = g.initializer[-1]
            fp16_scales[scale] = name
        return fp16_scales[scale]

    for cast in list(g.node):
        if cast.op_type != "Cast" or id(cast) in dead or not cast.input or cast.input[0] in outputs:
            continue
        to = next(a.i for a in cast.attribute if a.name == "to")
        src = producer.get(cast.input[0])
        if to == onnx.TensorProto.FLOAT16 and src is not None and src.op_type == "DequantizeLinear" \
                and len(readers.get(cast.input[0], [])) == 1 and src.input[1] in inits:
            src.input[1] = half(src.input[1])
            src.output[0] = cast.output[0]
            dead.add(id(cast))
            continue
        users = readers.get(cast.output[0], [])
        if to == onnx.TensorProto.FLOAT and len(users) == 1 and users[0].op_type == "QuantizeLinear" \
                and users[0].input[0] == cast.output[0] and users[0].input[1] in inits \
                and cast.output[0] not in outputs and _is_float16(model, cast.input[0]):
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


def _is_float16(model: onnx.ModelProto, tensor: str) -> bool:
    for v in (*model.graph.value_info, *model.graph.input, *model.graph.output):
        if v.name == tensor:
            return v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    producer = next((n for n in model.graph.node if tensor in n.output), None)
    if producer is not None and producer.op_type == "Cast":
        return next(a.i for a in producer.attribute if a.name == "to") == onnx.TensorProto.FLOAT16
    return False


def observed_ranges(lifted: onnx.ModelProto, feeds, progress: bool) -> dict[str, float]:
    """The largest magnitude of every float tensor of ``lifted`` on ``feeds`` (one onnxruntime pass)."""
    from trt_bridge.calibration.observers import CalibMethod, RangeObserver
    from trt_bridge.calibration.runner import CalibrationSession

    floats = {v.name for v in lifted.graph.value_info if v.type.tensor_type.elem_type in (1, 10, 11, 16)}
    names = sorted({o for n in lifted.graph.node for o in n.output if o in floats})
    if not names:
        return {}
    observers = {t: RangeObserver(CalibMethod.MAX) for t in names}
    try:
        with CalibrationSession(lifted, names) as session:
            session.run(observers, feeds, progress, desc="ranges for float16")
    except TrtBridgeError:
        raise
    return {t: o.max for t, o in observers.items()}


WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
SKIP = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Constant", "Identity", "Reshape", "Transpose",
                  "Flatten", "Squeeze", "Unsqueeze", "Shape", "Gather", "Concat", "Split", "Slice"})


def layer_precisions(model: onnx.ModelProto) -> dict:
    """Which compute layers TensorRT runs in INT8, FP16, BF16 or FP32, as the model's types dictate (strong
    typing): a weighted op whose data input is dequantized from int8 runs INT8, any other layer in its output's
    type. Data movement (reshapes, casts, Q/DQ themselves) is not counted."""
    from trt_bridge.model import value_types

    types = {name: t.tensor_type.elem_type for name, t in value_types(model).items()}
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
