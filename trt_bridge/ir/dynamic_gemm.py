"""The ONNX form of trt-bridge's dynamic INT8 GEMM plugin, and its decomposition into standard ops.

One node computes what onnxruntime's ``quantize_dynamic`` writes for a MatMul, with the scale of the
activation taken at run time::

    x [..., K] ─ DynamicInt8Gemm ─ y [..., N]          (domain trt_bridge; TensorRT: the plugin of that name)
      attributes: weight int8 [K, N], out_features N, weight_zero_point int32 [1|N], weight_scale float
                  [1|N], bias float [N] (optional), granularity "tensor" | "token", plugin_version,
                  plugin_namespace

- ``granularity="tensor"``: DynamicQuantizeLinear's asymmetric uint8 over the whole tensor, exactly
  (:func:`decompose` writes the same ops onnxruntime's quantizer does, so onnxruntime reproduces the dynamic
  source bit for bit; the plugin's kernels compute the same integers with int8 × int8 products).
- ``granularity="token"``: symmetric int8 with one scale per row (token), ``max|x_row| / 127``.

The weights are attributes, not inputs: TensorRT's ONNX parser hands a plugin node's attributes to the
plugin creator as fields (an int8 tensor attribute arrives as an INT8 field), while an int8 initializer input
would become an int8 constant layer, which a strongly typed network only accepts in front of a dequantize.

TensorRT parses the node as the plugin named by its op type (``plugin_version``, ``plugin_namespace``);
onnxruntime runs :func:`decompose`'s standard ops instead (``trt_bridge.runtime.session`` does it for every
session trt-bridge makes).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.choices import GRANULARITIES
from trt_bridge.errors import TrtBridgeError

DOMAIN = "trt_bridge"
OP_TYPE = "DynamicInt8Gemm"  # also the plugin's name
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "trt_bridge"


def _register_schema() -> None:
    """Tell onnx the op's signature, so its checker validates the node (shapes are written by the rule)."""
    if onnx.defs.has(OP_TYPE, DOMAIN):
        return
    attr = onnx.defs.OpSchema.AttrType
    schema = onnx.defs.OpSchema(
        OP_TYPE, DOMAIN, 1, doc=__doc__.split("\n\n")[0],
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
        outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "float activations")],
        attributes=[onnx.defs.OpSchema.Attribute("weight", attr.TENSOR, "int8 [K, N]"),
                    onnx.defs.OpSchema.Attribute("out_features", attr.INT, "N (TensorRT passes the weight flat)"),
                    onnx.defs.OpSchema.Attribute("weight_zero_point", attr.TENSOR, "int32 [1] or [N]"),
                    onnx.defs.OpSchema.Attribute("weight_scale", attr.TENSOR, "float [1] or [N]"),
                    onnx.defs.OpSchema.Attribute("bias", attr.TENSOR, "float [N]", required=False),
                    onnx.defs.OpSchema.Attribute("granularity", attr.STRING, "tensor or token"),
                    onnx.defs.OpSchema.Attribute("plugin_version", attr.STRING, "the plugin's version"),
                    onnx.defs.OpSchema.Attribute("plugin_namespace", attr.STRING, "the plugin's namespace")])
    onnx.defs.register_schema(schema)


_register_schema()


def is_plugin_node(node) -> bool:
    """Whether ``node`` (a NodeProto or an onnx-graphsurgeon node) is a DynamicInt8Gemm."""
    op = getattr(node, "op_type", None) or getattr(node, "op", None)
    return op == OP_TYPE and (node.domain or "") == DOMAIN


def plugin_attributes(weight: np.ndarray, zero_point: np.ndarray, scale: np.ndarray, bias: np.ndarray | None,
                      granularity: str) -> dict:
    """The node's attributes (as onnx-graphsurgeon takes them) for ``weight`` int8 [K, N], its ``zero_point`` and
    ``scale`` (one value, kept as [1] so that onnxruntime runs the decomposition as it ran the source, or one
    per column, [N]) and ``bias`` ([N])."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity {granularity!r}: choose one of {', '.join(GRANULARITIES)}")
    n = weight.shape[1]

    def vector(values: np.ndarray, dtype) -> np.ndarray:
        values = np.asarray(values, dtype)
        return values.reshape(1) if values.size == 1 else np.broadcast_to(values, (n,)).copy()

    attrs = {
        "weight": numpy_helper.from_array(np.ascontiguousarray(weight, np.int8), "weight"),
        "out_features": int(n),
        "weight_zero_point": numpy_helper.from_array(vector(zero_point, np.int32), "weight_zero_point"),
        "weight_scale": numpy_helper.from_array(vector(scale, np.float32), "weight_scale"),
        "granularity": granularity, "plugin_version": PLUGIN_VERSION, "plugin_namespace": PLUGIN_NAMESPACE,
    }
    if bias is not None:
        attrs["bias"] = numpy_helper.from_array(np.broadcast_to(bias, (n,)).astype(np.float32), "bias")
    return attrs


class InvalidGemmNode(TrtBridgeError):
    """A DynamicInt8Gemm's attributes (or the plugin's fields) do not describe one int8 GEMM."""


def gemm_weights(values: dict) -> dict:
    """The checked weights of one DynamicInt8Gemm from its attribute ``values`` (arrays, any shape; the
    granularity a str): ``weight`` int8 [K, N], ``weight_zero_point`` and ``weight_scale`` [1] or [N], ``bias``
    [N] or None, ``granularity``, ``k``, ``n``. Raises :class:`InvalidGemmNode` saying what is wrong. TensorRT's
    plugin creator and onnxruntime's decomposition both take a node through here, so neither accepts what the
    other refuses."""
    missing = [name for name in ("weight", "out_features", "weight_zero_point", "weight_scale", "granularity")
               if values.get(name) is None]
    if missing:
        raise InvalidGemmNode(f"missing attribute(s) {', '.join(missing)}")
    granularity = values["granularity"]
    if granularity not in GRANULARITIES:
        raise InvalidGemmNode(f"granularity {granularity!r} is not one of {', '.join(GRANULARITIES)}")
    flat = {name: np.asarray(values[name]).reshape(-1) for name in ("weight", "out_features", "weight_zero_point",
                                                                     "weight_scale")}
    bias = None if values.get("bias") is None else np.asarray(values["bias"], np.float32).reshape(-1)
    weight, scale, zero_point = flat["weight"], flat["weight_scale"], flat["weight_zero_point"]
    n = int(flat["out_features"][0]) if flat["out_features"].size == 1 else 0
    if weight.dtype != np.int8 or scale.dtype != np.float32 or not np.issubdtype(zero_point.dtype, np.integer):
        raise InvalidGemmNode(f"weight {weight.dtype}, weight_scale {scale.dtype}, weight_zero_point "
                              f"{zero_point.dtype}: they must be int8, float32 and int32")
    if n <= 0 or weight.size % n or any(v.size not in (1, n) for v in (scale, zero_point)) \
            or (bias is not None and bias.size != n):
        raise InvalidGemmNode(f"a weight of {weight.size} values, out_features {n}, weight_scale [{scale.size}], "
                              f"weight_zero_point [{zero_point.size}] and bias do not describe one [K, N] matrix")
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0) or (bias is not None and not np.all(np.isfinite(bias))):
        raise InvalidGemmNode("weight scales must be finite and positive, the bias finite")
    if zero_point.min() < -128 or zero_point.max() > 127:
        raise InvalidGemmNode("weight zero points must be int8 values")
    k = weight.size // n
    return {"weight": weight.reshape(k, n), "weight_zero_point": zero_point.astype(np.int32),
            "weight_scale": scale, "bias": bias, "granularity": granularity, "k": k, "n": n}


def node_arrays(node) -> dict:
    """:func:`gemm_weights` of a DynamicInt8Gemm node (a NodeProto or an onnx-graphsurgeon node); raises
    :class:`InvalidGemmNode` naming the node."""
    if isinstance(node, onnx.NodeProto):
        raw = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    else:
        raw = dict(node.attrs)
    values = {}
    for name, value in raw.items():
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode(errors="replace")
        values[name] = getattr(value, "values", value)  # onnx-graphsurgeon's tensor attributes are Constants
    try:
        return gemm_weights(values)
    except InvalidGemmNode as exc:
        error = InvalidGemmNode(f"{OP_TYPE} '{node.name}': {exc}. trt-bridge writes these nodes itself: convert "
                                "the source again with --activations dynamic.")
        error.reason = str(exc)
        raise error from None


def has_plugin_nodes(model: onnx.ModelProto) -> bool:
    return any(is_plugin_node(n) for n in model.graph.node)


def file_has_plugin_nodes(path) -> bool:
    """Whether the ONNX file at ``path`` has DynamicInt8Gemm nodes (False when onnx cannot read it: TensorRT's
    parser then says why)."""
    try:
        return has_plugin_nodes(onnx.load(str(path), load_external_data=False))
    except Exception:  # noqa: BLE001 - unreadable: not ours to report here
        return False


#: onnxruntime's optimizers a session of a per-token decomposition must not run: MatMulIntegerToFloatFusion
#: (1.32) fuses the Mul by a product of scales into MatMulIntegerToFloat, which takes one activation scale per
#: tensor or column, and then computes the per-row scale wrongly
UNFUSED = ("MatMulIntegerToFloatFusion",)


def disabled_optimizers(model: onnx.ModelProto) -> tuple[str, ...]:
    """What onnxruntime must not fuse in :func:`decompose`'s output of ``model`` (before it is decomposed)."""
    token = any(is_plugin_node(n) and node_arrays(n)["granularity"] == "token" for n in model.graph.node)
    return UNFUSED if token else ()


def decompose(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every DynamicInt8Gemm replaced by standard ops computing the same numbers (a copy;
    ``model`` itself when it has none). What onnxruntime runs in place of the plugin."""
    if not has_plugin_nodes(model):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 13)
    nodes, inits = [], []
    for node in out.graph.node:
        if is_plugin_node(node):
            made, consts = _decomposed(node, opset, _elem_type(out, node.input[0]))
            nodes += made
            inits += consts
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(inits)
    keep = [o for o in out.opset_import if o.domain != DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend(keep)
    return out


def _elem_type(model: onnx.ModelProto, name: str) -> int:
    for value in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        if value.name == name and value.type.tensor_type.elem_type:
            return value.type.tensor_type.elem_type
    for init in model.graph.initializer:
        if init.name == name:
            return init.data_type
    return TensorProto.FLOAT


def _decomposed(node: onnx.NodeProto, opset: int, x_type: int) -> tuple[list, list]:
    """The standard ops of one DynamicInt8Gemm (see the module docstring), named after the node."""
    arrays = node_arrays(node)
    p = f"{node.name or node.output[0]}/"
    zp, scale = arrays["weight_zero_point"], arrays["weight_scale"]
    if zp.size == 1:  # per tensor: scalars, as the source had them
        zp = zp.reshape(())
    if scale.size == 1:
        scale = scale.reshape(())
    consts = [numpy_helper.from_array(arrays["weight"], p + "weight"),
              numpy_helper.from_array(zp.astype(np.int8), p + "weight_zero_point"),
              numpy_helper.from_array(scale, p + "weight_scale")]
    nodes = []
    x = node.input[0]
    if x_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [x], [p + "x32"], to=TensorProto.FLOAT, name=p + "cast_in"))
        x = p + "x32"
    if arrays["granularity"] == "tensor":
        nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [p + "q", p + "s", p + "z"], name=p + "quantize"))
        nodes.append(helper.make_node("MatMulInteger", [p + "q", p + "weight", p + "z", p + "weight_zero_point"],
                                      [p + "acc"], name=p + "matmul"))
    else:
        # int8 codes c run as uint8 c + 128 with zero point 128: uint8 × int8 is the MatMulInteger every
        # onnxruntime CPU kernel has (as for DynamicQuantizeLinear's codes)
        consts += [numpy_helper.from_array(np.array(127, np.float32), p + "qmax"),
                   numpy_helper.from_array(np.array(-127, np.float32), p + "qmin"),
                   numpy_helper.from_array(np.array(0, np.float32), p + "zero"),
                   numpy_helper.from_array(np.array(1, np.float32), p + "one"),
                   numpy_helper.from_array(np.array(128, np.float32), p + "offset"),
                   numpy_helper.from_array(np.array(128, np.uint8), p + "code_zero")]
        nodes.append(helper.make_node("Abs", [x], [p + "abs"], name=p + "abs"))
        if opset >= 18:
            consts.append(numpy_helper.from_array(np.array([-1], np.int64), p + "axes"))
            nodes.append(helper.make_node("ReduceMax", [p + "abs", p + "axes"], [p + "amax"], keepdims=1,
                                          name=p + "amax"))
        else:
            nodes.append(helper.make_node("ReduceMax", [p + "abs"], [p + "amax"], axes=[-1], keepdims=1,
                                          name=p + "amax"))
        nodes += [helper.make_node("Div", [p + "amax", p + "qmax"], [p + "s0"], name=p + "scale"),
                  helper.make_node("Equal", [p + "s0", p + "zero"], [p + "is0"], name=p + "is_zero"),
                  helper.make_node("Where", [p + "is0", p + "one", p + "s0"], [p + "s"], name=p + "scale_or_one"),
                  helper.make_node("Div", [x, p + "s"], [p + "xs"], name=p + "divide"),
                  helper.make_node("Round", [p + "xs"], [p + "xr"], name=p + "round"),
                  helper.make_node("Clip", [p + "xr", p + "qmin", p + "qmax"], [p + "xc"], name=p + "clip"),
                  helper.make_node("Add", [p + "xc", p + "offset"], [p + "xu"], name=p + "offset"),
                  helper.make_node("Cast", [p + "xu"], [p + "q"], to=TensorProto.UINT8, name=p + "codes"),
                  helper.make_node("MatMulInteger", [p + "q", p + "weight", p + "code_zero", p + "weight_zero_point"],
                                   [p + "acc"], name=p + "matmul")]
    nodes += [helper.make_node("Cast", [p + "acc"], [p + "accf"], to=TensorProto.FLOAT, name=p + "acc_float"),
              helper.make_node("Mul", [p + "s", p + "weight_scale"], [p + "prod"], name=p + "scale_product")]
    prod = p + "prod"
    nodes.append(helper.make_node("Mul", [p + "accf", prod], [p + "y0"], name=p + "dequantize"))
    y = p + "y0"
    if arrays["bias"] is not None:
        consts.append(numpy_helper.from_array(arrays["bias"], p + "bias"))
        nodes.append(helper.make_node("Add", [y, p + "bias"], [p + "y1"], name=p + "bias"))
        y = p + "y1"
    if x_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [y], [node.output[0]], to=x_type, name=p + "cast_out"))
    else:
        nodes[-1].output[0] = node.output[0]
    return nodes, consts
