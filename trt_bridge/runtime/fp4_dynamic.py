"""TensorRT's dynamic FP4 activations (``TRT_FP4DynamicQuantize``, domain ``trt``: ModelOpt's NVFP4 W4A4 exports)
for onnxruntime, which has no kernel for the ``trt`` domain (nor an FP4 ``DequantizeLinear`` on CPU).

Each ``TRT_FP4DynamicQuantize(x, global scale g; axis=-1, block_size=16, scale_type FLOAT8E4M3FN)`` becomes
standard ops (opset 19+) that compute its two outputs as TensorRT defines them, per block of 16 along the last
axis, in float32::

    amax  = max |x| over the block
    s8    = FP8 E4M3 of amax / 6 / g            (round to nearest even, saturating at 448; subnormals kept)
    d     = s8 · g                             (what DequantizeLinear(s8, g) gives)
    codes = FP4 E2M1 of x / d                  (round to nearest even on 0, 0.5, 1, 1.5, 2, 3, 4, 6; saturating
                                                at ±6; a block whose d is 0 (all zeros, or a scale below FP8's
                                                smallest subnormal) gets codes 0)

and the ``DequantizeLinear`` nodes that read them become the same products in float::

    Before:  x ─ TRT_FP4DynamicQuantize(g) ─┬─ x4:fp4 ───────────────────── DequantizeLinear(s, -1, 16) ─ y
                                            └─ s8:fp8 ─ DequantizeLinear(g) ─ s ─┘
    After:   x ─ Cast(float) ─ Reshape[-1, 16] ─┬─ Abs ─ ReduceMax ─ Div(6) ─ Div(g) ─ Cast(FP8, saturate) ─ s8
                                                │     s8 ─ Cast(float) ─ Mul(g) ─ d
                                                └─ Div(d, or 1 where d = 0) ─ E2M1 ladder (Greater/GreaterOrEqual
                                                   steps summed, ties to even) ─ Mul(Sign) ─ Reshape(x's shape) ─ c
             c ─ Reshape[-1, 16] ─ Mul(Reshape(s, [-1, 1])) ─ Reshape(x's shape) ─ y
             s8 ─ Cast(float) ─ Mul(g) ─ s

The emulation's outputs equal :func:`dequantized` (numpy, ml_dtypes' FP8/FP4 casts) bit for bit. A NaN in a block
makes its scale NaN and so the whole block NaN in numpy; onnxruntime's ReduceMax may skip it (not relied on). An
input of another float type is quantized from its float32 value (TensorRT computes the amax in the input's type).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.errors import UnsupportedPatternError

#: TensorRT's dynamic FP4 quantization op, and the domain of TensorRT's own ONNX ops
OP, DOMAIN = "TRT_FP4DynamicQuantize", "trt"
#: the only block size TensorRT takes for it
BLOCK = 16
#: FP8 E4M3's largest value (the block scales saturate there)
FP8_MAX = 448.0
#: the E2M1 ladder: (threshold, strict, step): |q| above (or, not strict, at) the threshold adds the step. Ties go
#: to the even code (0, 1, 2, 4 at 0.25, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4).
LADDER = ((0.25, True, 0.5), (0.75, False, 0.5), (1.25, True, 0.5), (1.75, False, 0.5),
          (2.5, True, 1.0), (3.5, False, 1.0), (5.0, True, 2.0))


def has_fp4_dynamic(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph holds ``TRT_FP4DynamicQuantize`` nodes."""
    return any(node.op_type == OP for node in model.graph.node)


def quantized(x: np.ndarray, global_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """numpy reference of ``TRT_FP4DynamicQuantize(x, global_scale)`` along the last axis: ``(codes, scales)`` as
    ml_dtypes ``float4_e2m1fn`` (x's shape) and ``float8_e4m3fn`` (x's shape with the last axis / 16)."""
    x = np.asarray(x).astype(np.float32)
    if x.shape[-1] % BLOCK:
        raise ValueError(f"the last axis ({x.shape[-1]}) is no multiple of {BLOCK}")
    g = np.float32(global_scale)
    blocks = x.reshape(-1, BLOCK)
    amax = np.max(np.abs(blocks), axis=1, keepdims=True)
    scale = np.clip((amax / np.float32(6)) / g, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    d = scale.astype(np.float32) * g
    q = blocks / np.where(d == 0, np.float32(1), d)
    codes = np.clip(q, -6, 6).astype(ml_dtypes.float4_e2m1fn)
    return codes.reshape(x.shape), scale.reshape(*x.shape[:-1], -1)


def dequantized(x: np.ndarray, global_scale: float) -> np.ndarray:
    """numpy reference of ``DequantizeLinear(codes, DequantizeLinear(scales, g), axis=-1, block_size=16)`` of
    :func:`quantized`: what TensorRT's FP4 activation feeds the next layer (float32)."""
    codes, scale = quantized(x, global_scale)
    d = scale.astype(np.float32).reshape(-1, 1) * np.float32(global_scale)
    return (codes.astype(np.float32).reshape(-1, BLOCK) * d).reshape(codes.shape)


def fp4_dynamic_emulated(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` in which every ``TRT_FP4DynamicQuantize`` and the ``DequantizeLinear`` nodes reading its
    outputs are standard ops computing the same values in float (see the module's docstring); ``model`` itself
    where it holds none. Refused by name (:class:`UnsupportedPatternError`): an opset below 19, an attribute other
    than TensorRT's, and a reader of the FP4 codes other than ``DequantizeLinear``."""
    if not has_fp4_dynamic(model):
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    first = next(n for n in graph.node if n.op_type == OP)
    if opset < 19:
        raise UnsupportedPatternError(f"{first.name or OP}: emulating {OP} for onnxruntime needs ai.onnx opset 19+ "
                                      f"(the model has {opset}); export the model with opset 21 or newer.")
    types = _elem_types(graph)
    codes: dict[str, str] = {}  # FP4 codes output → its float emulation
    scales: set[str] = set()  # FP8 block scales outputs (kept as FP8 tensors)
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == OP:
            nodes.extend(_quantize(node, codes))
            scales.add(node.output[1])
        elif node.op_type == "DequantizeLinear" and node.input and node.input[0] in codes:
            nodes.extend(_codes_dequantized(node, codes[node.input[0]], types))
        elif node.op_type == "DequantizeLinear" and node.input and node.input[0] in scales:
            nodes.extend(_scales_dequantized(node, types))
        else:
            readers = [name for name in node.input if name in codes]
            if readers:
                raise UnsupportedPatternError(f"{node.name or node.op_type}: reads the FP4 codes '{readers[0]}' of "
                                              f"{OP}, which only a DequantizeLinear may read to be emulated for "
                                              "onnxruntime; dequantize them first.")
            nodes.append(node)
    outputs = [o.name for o in graph.output if o.name in codes]
    if outputs:
        raise UnsupportedPatternError(f"graph output '{outputs[0]}': FP4 codes of {OP} cannot be emulated for "
                                      "onnxruntime as an output; output their DequantizeLinear instead.")
    del graph.node[:]
    graph.node.extend(nodes)
    stale = [v for v in graph.value_info if v.name in codes]
    for info in stale:
        graph.value_info.remove(info)
    if not any(n.domain == DOMAIN for n in graph.node):
        kept = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return model


def _quantize(node: onnx.NodeProto, codes: dict[str, str]) -> list[onnx.NodeProto]:
    """Standard ops for one ``TRT_FP4DynamicQuantize`` (its block scales output keeps its name, as FP8)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    label = node.name or node.output[0]
    if int(attrs.get("axis", -1)) != -1 or int(attrs.get("block_size", BLOCK)) != BLOCK or \
            int(attrs.get("scale_type", TensorProto.FLOAT8E4M3FN)) != TensorProto.FLOAT8E4M3FN:
        raise UnsupportedPatternError(f"{label}: {OP} with {attrs} is not TensorRT's form (axis=-1, block_size=16, "
                                      "scale_type FLOAT8E4M3FN); re-export it in that form.")
    x, g = node.input[0], node.input[1]
    p = f"{label}/fp4_emulated"
    c = lambda suffix, value: helper.make_node(  # noqa: E731 - a one-line constant maker
        "Constant", [], [f"{p}/{suffix}"], value=numpy_helper.from_array(np.asarray(value), f"{p}/{suffix}"))
    n = helper.make_node
    out = [c("block", np.array([-1, BLOCK], np.int64)), c("axes", np.array([1], np.int64)),
           c("six", np.float32(6)), c("one", np.float32(1)), c("zero", np.float32(0)), c("last", np.array([-1],
                                                                                                  np.int64)),
           n("Cast", [x], [f"{p}/x"], to=TensorProto.FLOAT), n("Cast", [g], [f"{p}/g"], to=TensorProto.FLOAT),
           n("Shape", [x], [f"{p}/shape"]), n("Shape", [x], [f"{p}/lead"], end=-1),
           n("Concat", [f"{p}/lead", f"{p}/last"], [f"{p}/scale_shape"], axis=0),
           n("Reshape", [f"{p}/x", f"{p}/block"], [f"{p}/blocks"]),
           n("Abs", [f"{p}/blocks"], [f"{p}/abs"]),
           n("ReduceMax", [f"{p}/abs", f"{p}/axes"], [f"{p}/amax"], keepdims=1),
           n("Div", [f"{p}/amax", f"{p}/six"], [f"{p}/amax6"]),
           n("Div", [f"{p}/amax6", f"{p}/g"], [f"{p}/scale"]),
           n("Cast", [f"{p}/scale"], [f"{p}/s8"], to=TensorProto.FLOAT8E4M3FN, saturate=1),
           n("Reshape", [f"{p}/s8", f"{p}/scale_shape"], [node.output[1]]),
           n("Cast", [f"{p}/s8"], [f"{p}/s"], to=TensorProto.FLOAT),
           n("Mul", [f"{p}/s", f"{p}/g"], [f"{p}/d"]),
           n("Equal", [f"{p}/d", f"{p}/zero"], [f"{p}/d0"]),
           n("Where", [f"{p}/d0", f"{p}/one", f"{p}/d"], [f"{p}/safe"]),
           n("Div", [f"{p}/blocks", f"{p}/safe"], [f"{p}/q"]),
           n("Abs", [f"{p}/q"], [f"{p}/a"])]
    steps = []
    for i, (threshold, strict, step) in enumerate(LADDER):
        out += [c(f"t{i}", np.float32(threshold)), c(f"w{i}", np.float32(step)),
                n("Greater" if strict else "GreaterOrEqual", [f"{p}/a", f"{p}/t{i}"], [f"{p}/above{i}"]),
                n("Cast", [f"{p}/above{i}"], [f"{p}/above{i}f"], to=TensorProto.FLOAT),
                n("Mul", [f"{p}/above{i}f", f"{p}/w{i}"], [f"{p}/step{i}"])]
        steps.append(f"{p}/step{i}")
    codes[node.output[0]] = f"{p}/codes"
    return out + [n("Sum", steps, [f"{p}/r"]), n("Sign", [f"{p}/q"], [f"{p}/sign"]),
                  n("Mul", [f"{p}/sign", f"{p}/r"], [f"{p}/code_blocks"]),
                  n("Reshape", [f"{p}/code_blocks", f"{p}/shape"], [f"{p}/codes"])]


def _codes_dequantized(node: onnx.NodeProto, codes: str, types: dict[str, int]) -> list[onnx.NodeProto]:
    """``DequantizeLinear(FP4 codes, block scales, axis=-1, block_size=16)`` as float products."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    label = node.name or node.output[0]
    if int(attrs.get("axis", 1)) != -1 or int(attrs.get("block_size", 0)) != BLOCK or \
            (len(node.input) > 2 and node.input[2]):
        raise UnsupportedPatternError(f"{label}: dequantizes {OP}'s codes with {attrs}, not TensorRT's "
                                      "axis=-1, block_size=16 without zero point; re-export it in that form.")
    p, n = f"{label}/fp4_emulated", helper.make_node
    block = numpy_helper.from_array(np.array([-1, BLOCK], np.int64), f"{p}/block")
    column = numpy_helper.from_array(np.array([-1, 1], np.int64), f"{p}/column")
    out = [n("Constant", [], [block.name], value=block), n("Constant", [], [column.name], value=column),
           n("Shape", [codes], [f"{p}/shape"]), n("Reshape", [codes, block.name], [f"{p}/blocks"]),
           n("Cast", [node.input[1]], [f"{p}/scale"], to=TensorProto.FLOAT),
           n("Reshape", [f"{p}/scale", column.name], [f"{p}/scales"]),
           n("Mul", [f"{p}/blocks", f"{p}/scales"], [f"{p}/y"])]
    wanted = int(attrs.get("output_dtype", 0)) or types.get(node.input[1], TensorProto.FLOAT)
    types[node.output[0]] = wanted
    if wanted == TensorProto.FLOAT:
        return out + [n("Reshape", [f"{p}/y", f"{p}/shape"], [node.output[0]])]
    return out + [n("Reshape", [f"{p}/y", f"{p}/shape"], [f"{p}/y32"]),
                  n("Cast", [f"{p}/y32"], [node.output[0]], to=wanted)]


def _scales_dequantized(node: onnx.NodeProto, types: dict[str, int]) -> list[onnx.NodeProto]:
    """``DequantizeLinear(FP8 block scales, global scale)`` (per tensor) as a float product."""
    label = node.name or node.output[0]
    if any(a.name == "block_size" and a.i for a in node.attribute) or (len(node.input) > 2 and node.input[2]):
        raise UnsupportedPatternError(f"{label}: dequantizes {OP}'s block scales by blocks or with a zero point; "
                                      "TensorRT's form is one global scale.")
    p, n = f"{label}/fp4_emulated", helper.make_node
    wanted = types.get(node.input[1], TensorProto.FLOAT)
    types[node.output[0]] = wanted
    out = [n("Cast", [node.input[0]], [f"{p}/s"], to=TensorProto.FLOAT),
           n("Cast", [node.input[1]], [f"{p}/g"], to=TensorProto.FLOAT)]
    if wanted == TensorProto.FLOAT:
        return out + [n("Mul", [f"{p}/s", f"{p}/g"], [node.output[0]])]
    return out + [n("Mul", [f"{p}/s", f"{p}/g"], [f"{p}/y"]), n("Cast", [f"{p}/y"], [node.output[0]], to=wanted)]


def _elem_types(graph: onnx.GraphProto) -> dict[str, int]:
    """The element type of each tensor the graph declares (initializers, inputs, value_info, Constant nodes)."""
    types = {t.name: t.data_type for t in graph.initializer}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.HasField("tensor_type"):
            types[info.name] = info.type.tensor_type.elem_type
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            types[node.output[0]] = node.attribute[0].t.data_type
    return types
