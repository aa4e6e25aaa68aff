"""``convert --high-precision fp16|bf16``: the part of the graph INT8 leaves alone, in float16 or bfloat16,
written into the model.

TensorRT 11 (and TensorRT-RTX) run every layer in the type the ONNX gives it, so a converted model whose
non-quantized layers are float32 runs them in FP32. This pass writes them in float16
(:mod:`trt_bridge.lower.float16_types`: one type per type parameter of each node, Casts where float16 meets
float32, float16 constants clamped to its range), keeping in float32:

- the numerically sensitive ops: normalization statistics, Softmax, Pow, Exp, Log, reductions, Sqrt and
  Reciprocal (the pieces of a decomposed LayerNorm);
- float shape arithmetic (float16 would round a dimension);
- float arithmetic on integers cast to float (:func:`integer_arithmetic`: Llama's rotary ``inv_freq @ positions``,
  T5's relative position buckets, ``(1 - mask) · -1e9``): float16 holds integers exactly only up to 2048, so a
  rotary angle at position 3000 would be off by up to a radian. Their result is clipped to float16's range where a
  float16 layer reads it (a -1e9 mask bias would otherwise become -inf);
- every node that reads or writes a tensor whose calibrated range exceeds float16's safe range (half of
  65504, so that one more Add does not overflow), found by one pass over the calibration feeds;
- the graph's inputs and outputs (their types are the model's interface), unless ``--io-types``;
- the INT8 layers that compensate a re-centred input (and their bias Adds): their bias carries c·ΣW, which
  cancels against the shifted input only if it and the weight scales are exact (``exact``).
  :func:`trt_bridge.calibrate.recenter.recenter` makes the shifted tensor's scale representable in the low-precision
  type and, for a non-negative tensor, the centre 128 steps, so a ReLU's zeros stay on the int8 grid.

The Q/DQ follow the layers around them: a DequantizeLinear is float16 (a float16 scale, opset 19) when every
reader is, a QuantizeLinear quantizes its input in the type it arrives in, so TensorRT still fuses them into INT8
kernels. Graph inputs and outputs keep their types (the model stays a drop-in replacement) unless ``--io-types``.
Every node kept in float32 is reported with its reason.

Control flow: the main graph first, then each If branch as a model of its own
(:mod:`trt_bridge.lower.body_precision`): its interface is the outer values it reads, in the types the graph around
gives them (a Cast at the branch's entry where it computes in float16), and its outputs, in their source types (so
the If's outputs, and a merged decoder's graph outputs, keep theirs); the branch's own census (sensitive ops, shape
and position arithmetic, ranges) stays float32 and is reported as ``<If>/<branch>: <node>``. A Loop or Scan is
refused by name (its body's state types are part of its interface).

bfloat16 is the same rewrite with the type changed afterwards: every float16 tensor, constant, scale and
Cast becomes bfloat16, each constant rounded from its original float32 value (never through float16, whose
range clamp bfloat16 does not need). bfloat16 has float32's range, so no layer is kept for its range.
onnxruntime's CPU provider has no bfloat16 kernels: :func:`trt_bridge.runtime.bf16.emulate_bfloat16` gives the
float32 model that rounds every bfloat16 result as TensorRT stores it, which is what ``verify`` and the accuracy
target run. The retyping lives in :mod:`trt_bridge.lower.bfloat16_retype`; the per-layer census in
:mod:`trt_bridge.lower.layer_precisions`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from trt_bridge.choices import HighPrecision
from trt_bridge.ir.model import default_opset
from trt_bridge.ir.types import declared_types, elem_types, infer_shapes, value_types
from trt_bridge.lower.bfloat16_retype import float_constants, retype_float16
from trt_bridge.lower.body_precision import (
    all_nodes,
    branch_model,
    graph_names,
    outer_types,
    put_back,
    refuse_loops,
    subgraphs,
)
from trt_bridge.lower.float16_types import assign_float16

log = logging.getLogger("trt_bridge.lower.precision")

SENSITIVE = frozenset({
    "LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization",
    "Softmax", "LogSoftmax", "Pow", "Exp", "Log", "Sqrt", "Reciprocal", "ReduceMean", "ReduceSum",
    "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd",
    "CumSum", "Range", "Resize", "Upsample", "NonMaxSuppression", "TopK", "RoiAlign",
})
FP16_SAFE = 32752.0  # half of float16's largest finite value


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
    ``exact``: INT8 layers (and their bias Adds) that compensate a re-centred input → that input (and the nodes
    of a runtime range, :mod:`trt_bridge.lower.runtime_ranges`). They stay
    float32: their bias carries c·ΣW, a large constant that cancels against the shifted input, and rounding it
    (or their weight scales) to 8 or 11 bits would leave an error of the size of c·ΣW's last bit."""
    kind = HighPrecision(kind)
    if kind is HighPrecision.FP32:
        return model, []
    refuse_loops(model, kind.value)  # If branches are converted (body_precision); Loop/Scan bodies are not
    _name_nodes(model)
    op_of = {n.name: n.op_type for n in model.graph.node}
    kept = [KeptInFloat32(node, op_of[node], f"INT8 layer compensating the re-centred '{tensor}' (or its grid "
                                             "computed per inference): its bias c·ΣW and weight scales stay exact")
            for node, tensor in sorted((exact or {}).items()) if node in op_of]
    if kind is HighPrecision.FP16:
        return to_float16(model, ranges, keep_io_types, extra=kept)
    from onnx import version_converter

    interface = declared_types((*model.graph.input, *model.graph.output))
    source = default_opset(model)
    opset = max(19, source)
    # opset 22 gave bfloat16 to Conv, pooling and most activations: upgrade where that lets a layer run in it
    if opset < BF16_OPSET and any(_lacks_bfloat16(n, opset) and not _lacks_bfloat16(n, BF16_OPSET)
                                  for n in all_nodes(model.graph)):
        opset = BF16_OPSET
    if opset != source:
        model = version_converter.convert_version(model, opset)
    extra = list(kept) + bfloat16_kept(model.graph.node, opset, {k.node for k in kept})
    originals = float_constants(model)
    converted, kept = to_float16(model, None, keep_io_types, scale_suffix="bf16", extra=extra)
    retype_float16(converted, originals, interface if keep_io_types else {})
    return converted, kept


BF16_OPSET = 22
#: ops ONNX types in bfloat16 that TensorRT does not build in it (TensorRT-RTX 1.7: "Could not infer output
#: types for operation: deconv" for a bfloat16 ConvTranspose)
TENSORRT_NO_BF16 = {"ConvTranspose": "TensorRT builds no bfloat16 ConvTranspose (deconvolution)"}


def bfloat16_kept(nodes, opset: int, taken: set[str]) -> list[KeptInFloat32]:
    """The nodes of ``nodes`` (but ``taken``) that stay float32 under bfloat16: no bfloat16 type in ONNX at
    ``opset``, or none in TensorRT."""
    extra = []
    for n in nodes:
        if n.name in taken or n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if _lacks_bfloat16(n, opset):
            extra.append(KeptInFloat32(n.name, n.op_type, f"{n.op_type} has no bfloat16 type in ONNX opset {opset}"))
        elif n.op_type in TENSORRT_NO_BF16:
            extra.append(KeptInFloat32(n.name, n.op_type, TENSORRT_NO_BF16[n.op_type]))
    return extra


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
               scale_suffix: str = "fp16", extra: list[KeptInFloat32] = (), reserved: set[str] = frozenset(),
               around: dict[str, onnx.TypeProto] | None = None) -> tuple[onnx.ModelProto, list[KeptInFloat32]]:
    """``model`` (a lowered INT8 Q/DQ model, opset ≥ 13) with its float part in float16 (see the module doc),
    the main graph first, then each If branch (:mod:`trt_bridge.lower.body_precision`).
    ``ranges``: tensor → largest magnitude seen on the calibration feeds; ``extra``: more nodes to keep in
    float32, with their reasons (of any graph); ``reserved``, ``around``: the names and types of the graphs around
    ``model`` (a branch's)."""
    from onnx import version_converter

    ranges = ranges or {}
    if default_opset(model) < 19:  # float16 Q/DQ scales need opset 19
        model = version_converter.convert_version(model, 19)
    _name_nodes(model)
    model = infer_shapes(model)
    names = {n.name for n in model.graph.node}
    kept: list[KeptInFloat32] = [k for k in extra if k.node in names]  # (a branch's: those of its own nodes)
    high = {k.node for k in kept}
    shape_nodes = _shape_computation(model)
    positions = integer_arithmetic(model)
    floats = {name for name, t in elem_types(model).items() if t in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
    for node in model.graph.node:
        if node.name in high:
            continue
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            if node.name in positions:  # a Q/DQ of an integer-derived value: it stays float32 with its readers
                high.add(node.name)
            continue
        reason = None
        if node.name in shape_nodes:
            reason = "it computes a shape (float16 would round it)"
        elif node.name in positions:
            if any(o in floats for o in node.output):
                reason = (f"it takes part in float arithmetic on '{positions[node.name]}', integers (positions, "
                          "counts) cast to float: float16 would round those beyond 2048")
            high.add(node.name)
        elif node.op_type in SENSITIVE:
            reason = f"{node.op_type} is numerically sensitive"
        else:
            big = [(t, ranges[t]) for t in (*node.input, *node.output) if ranges.get(t, 0.0) > FP16_SAFE]
            if big:
                tensor, value = max(big, key=lambda item: item[1])
                reason = f"'{tensor}' reaches {value:.4g} on the calibration data, beyond float16's safe range " \
                         f"({FP16_SAFE:g})"
        if reason is not None:
            kept.append(KeptInFloat32(node.name, node.op_type, reason))
            high.add(node.name)
    # float16 only: bfloat16 holds float32's range
    saturate = {n.name for n in model.graph.node if n.name in positions and n.op_type in INTEGER_ARITHMETIC} \
        if scale_suffix == "fp16" else set()
    # (a plugin node's attributes, its exact weights, scales and bias, are left as they are: its I/O is float16)
    assign_float16(model, high, keep_io_types, scale_suffix, saturate, reserved)
    if any(True for _ in subgraphs(model.graph)):
        kept += _float16_branches(model, ranges, scale_suffix, extra, set(reserved) | graph_names(model.graph),
                                  outer_types(model, around or {}))
    return model, kept


def _float16_branches(model: onnx.ModelProto, ranges: dict[str, float], scale_suffix: str,
                      extra: list[KeptInFloat32], reserved: set[str], types: dict[str, onnx.TypeProto]
                      ) -> list[KeptInFloat32]:
    """Each If branch of ``model``'s main graph through :func:`to_float16`, as a model whose interface is the
    outer values it reads and its outputs, in their types (:mod:`trt_bridge.lower.body_precision`)."""
    kept = []
    for node, attr, branch in list(subgraphs(model.graph)):
        if node.op_type != "If":  # refused before (refuse_loops); another domain's body stays as it is
            continue
        sub, outer = branch_model(model, node, branch, types)
        names = {n.name for n in all_nodes(sub.graph)}
        inside = [k for k in extra if k.node in names]
        if scale_suffix == "bf16":
            inside += bfloat16_kept(all_nodes(sub.graph), default_opset(sub), {k.node for k in inside})
        converted, found = to_float16(sub, ranges, True, scale_suffix, inside, reserved, types)
        put_back(branch, converted, outer)
        prefix = f"{node.name}/{attr.name}: "
        kept += [KeptInFloat32(prefix + k.node, k.op, k.reason) for k in found]
    return kept


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node (of the main graph and of its bodies) a unique name (the float16 pass keeps nodes
    in float32 by name)."""
    nodes = list(all_nodes(model.graph))
    taken = {n.name for n in nodes if n.name}
    for k, node in enumerate(nodes):
        if not node.name:
            name = f"{node.op_type}_{k}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


#: ops that carry a number computed from integers on as such a number: arithmetic and data movement (a Cos, a
#: Softmax, a normalization or a comparison of it is no position any more, though it reads one)
INTEGER_ARITHMETIC = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Floor", "Ceil", "Round", "Log", "Exp", "Pow", "Sqrt", "Reciprocal",
    "Min", "Max", "Clip", "Mod", "Sum", "Mean", "MatMul", "Gemm", "Where", "ReduceMax", "ReduceMin", "ReduceSum",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "Expand", "Tile", "Pad", "QuantizeLinear", "DequantizeLinear"})


def integer_arithmetic(model: onnx.ModelProto) -> dict[str, str]:
    """The nodes that compute on integers cast to float (node → the Cast's output): Llama's rotary angles
    (``inv_freq @ Cast(position_ids)``), T5's relative position buckets (``Log(Cast(|i - j|) / 8)``), a mask's
    ``(1 - Cast(mask)) · -1e9``. From each ``Cast(integer → float)`` of a computed integer, through arithmetic and data
    movement whose other float inputs are constants or such values too; a node that reads one beside other values
    (``q · cos``'s Cos, ``scores + mask``) reads it in float32 and ends the region. Values computed from constants and
    shapes alone (``Expand(inv_freq, Shape(...))``, T5's bias table gathered at its buckets) count as constants."""
    g = model.graph
    types = elem_types(model)
    literal = {i.name for i in g.initializer} | {n.output[0] for n in g.node if n.op_type == "Constant"}
    static = set(literal)  # constants, shapes, and what is computed from them alone
    integers = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}
    float_types = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    derived: dict[str, str] = {}  # tensor → the Cast output it comes from
    found: dict[str, str] = {}
    for node in g.node:
        if node.op_type == "Cast" and node.input and node.input[0] not in literal \
                and types.get(node.input[0]) in integers and types.get(node.output[0]) in float_types:
            derived[node.output[0]] = found[node.name] = node.output[0]
            continue
        read = [i for i in node.input if i and (types.get(i) in float_types or i in derived)]
        seeds = [derived[i] for i in read if i in derived]
        if seeds:
            found[node.name] = seeds[0]
            carried = node.op_type in INTEGER_ARITHMETIC or (node.op_type == "Cast" and types.get(node.output[0])
                                                              in float_types)  # a float → float Cast carries it
            if carried and all(i in derived or i in static for i in read):
                derived.update({out: seeds[0] for out in node.output if out})
        elif node.op_type in ("Shape", "Size") or (node.input and all(not i or i in static for i in node.input)):
            static.update(out for out in node.output if out)
    # the computed constants they read stay float32 too (Expand(inv_freq) rounded to float16 would be off by
    # position · 2^-11 radians)
    producer = {o: n for n in g.node for o in n.output if o}
    todo = [(i, seed) for n in g.node if n.name in found for i in n.input if i in static and i in producer
            for seed in (found[n.name],)]
    while todo:
        tensor, seed = todo.pop()
        node = producer[tensor]
        if node.name in found or node.op_type == "Constant" or types.get(tensor) not in float_types:
            continue
        found[node.name] = seed
        todo.extend((i, seed) for i in node.input if i in static and i in producer)
    return found


#: op → the inputs that are shapes, sizes or indices rather than data
SHAPE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,),
                "Range": (0, 1, 2), "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1,), "TopK": (1,),
                "Unsqueeze": (1,), "Squeeze": (1,), "ReduceMean": (1,), "ReduceSum": (1,), "OneHot": (1,),
                "NonMaxSuppression": (2,), "Split": (1,)}


def _shape_computation(model: onnx.ModelProto) -> set[str]:
    """The nodes whose values end up as a shape, size or index (walking back from those inputs): shape
    arithmetic exporters route through float ops, which float16 would round (a 0 where a dimension was)."""
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
