"""Lift QOperator ops (onnxruntime's static ``QOperator`` format) to float ops between DQ and Q.

Every QLinear op computes "dequantize the inputs, run the float op, quantize the
result". This rule writes exactly that, with standard ``DequantizeLinear`` /
``QuantizeLinear`` nodes carrying the source's scales and zero points; the Q/DQ
rules (``dequantize_constant``, ``qdq_pair``) then turn them into float weights and
activation annotations::

    Before:  x_q ─ QLinearConv(x_s, x_zp, W_q, w_s, w_zp, y_s, y_zp, B:int32) ─ y_q
    After:   x_q ─ DQ(x_s, x_zp) ─┐
             W_q ─ DQ(w_s, w_zp, axis 0) ─ Conv ─ Q(y_s, y_zp) ─ y_q
             B·x_s·w_s (float) ───┘

The same holds for QLinearMatMul, com.microsoft QGemm (float or quantized output,
int32 C at scale alpha·a_s·b_s), QLinearAdd/Mul, QLinearConcat, QLinearSigmoid,
QLinearLeakyRelu, QLinearSoftmax, QLinearGlobalAveragePool, QLinearAveragePool,
and QLinearWhere. ``TABLE`` lists each op's quantized inputs
(data, scale, zero point), its other inputs and its float op.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import LiftContext, PendingConstant
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.lift.weights import weight_axis


@dataclass(frozen=True)
class QOp:
    float_op: str
    #: float op input order: ("q", data, scale, zp) for a quantized input, ("f", index) for a plain one,
    #: ("bias", index) for an int32 bias at scale input_scale·weight_scale
    inputs: tuple[tuple, ...]
    output: tuple[int, int] | None  # (y_scale, y_zp) input indices; None: float output
    attrs: tuple[str, ...] = ()
    domain: str = ""
    variadic: bool = False  # QLinearConcat: (x, s, zp) triples from input 2 on


_STD, _MS = "", "com.microsoft"
TABLE: dict[tuple[str, str], QOp] = {
    (_STD, "QLinearConv"): QOp("Conv", (("q", 0, 1, 2), ("q", 3, 4, 5), ("bias", 8)), (6, 7),
                               ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")),
    (_STD, "QLinearMatMul"): QOp("MatMul", (("q", 0, 1, 2), ("q", 3, 4, 5)), (6, 7)),
    (_MS, "QGemm"): QOp("Gemm", (("q", 0, 1, 2), ("q", 3, 4, 5), ("bias", 6)), (7, 8),
                        ("alpha", "transA", "transB")),
    (_MS, "QLinearAdd"): QOp("Add", (("q", 0, 1, 2), ("q", 3, 4, 5)), (6, 7)),
    (_MS, "QLinearMul"): QOp("Mul", (("q", 0, 1, 2), ("q", 3, 4, 5)), (6, 7)),
    (_MS, "QLinearSigmoid"): QOp("Sigmoid", (("q", 0, 1, 2),), (3, 4)),
    (_MS, "QLinearLeakyRelu"): QOp("LeakyRelu", (("q", 0, 1, 2),), (3, 4), ("alpha",)),
    (_MS, "QLinearSoftmax"): QOp("Softmax", (("q", 0, 1, 2),), (3, 4), ("axis",)),
    (_MS, "QLinearGlobalAveragePool"): QOp("GlobalAveragePool", (("q", 0, 1, 2),), (3, 4)),
    (_MS, "QLinearAveragePool"): QOp("AveragePool", (("q", 0, 1, 2),), (3, 4),
                                     ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads",
                                      "strides")),
    (_MS, "QLinearConcat"): QOp("Concat", (), (0, 1), ("axis",), variadic=True),
    (_MS, "QLinearWhere"): QOp("Where", (("f", 0), ("q", 1, 2, 3), ("q", 4, 5, 6)), (7, 8)),
}


def _given(node: gs.Node, index: int) -> gs.Tensor | None:
    if index >= len(node.inputs) or not node.inputs[index].name:
        return None
    return node.inputs[index]


@dataclass(frozen=True)
class QOperatorMatch:
    node: gs.Node
    spec: QOp
    bias: gs.Tensor | PendingConstant | None  # the float bias (None: no bias input)


class QOperatorOps:
    name = "qoperator"
    op_types = tuple(sorted({op for _, op in TABLE}))
    outcome = "lifted by rule 'qoperator' to the float op between symmetric int8 Q/DQ (int32 bias → float)"

    def match(self, ctx: LiftContext, node: gs.Node) -> QOperatorMatch | str:
        spec = TABLE.get((node.domain or "", node.op))
        if spec is None:
            return f"{node.op} in domain '{node.domain}' is not a QOperator op this rule knows"
        if node.attrs.get("channels_last", 0):
            return "channels_last layouts are not lifted (no standard ONNX equivalent without Transposes)"
        if node.op == "QLinearSoftmax" and (int(node.attrs.get("opset", 13)) < 13) != (int(ctx.graph.opset) < 13):
            # the float Softmax takes the graph's opset semantics (2-D coercion before 13); both must agree
            return (f"QLinearSoftmax with opset-{node.attrs.get('opset')} semantics in an opset-{ctx.graph.opset} "
                    "graph is not lifted")
        for index in _scale_inputs(node, spec):
            if constant_values(node.inputs[index]) is None:
                return f"scale/zero point input {index} ('{node.inputs[index].name}') is not a constant"
        bias_entry = next((e for e in spec.inputs if e[0] == "bias"), None)
        bias = None if bias_entry is None else _given(node, bias_entry[1])
        if bias is not None:
            bias = _float_bias(node, spec, bias)
            if isinstance(bias, str):
                return bias
        return QOperatorMatch(node, spec, bias)

    def rewrite(self, ctx: LiftContext, match: QOperatorMatch) -> None:
        node, spec = match.node, match.spec
        base = node.name or node.outputs[0].name
        float_inputs: list[gs.Tensor] = []
        new_nodes: list[gs.Node] = []
        quantized = [(i, i + 1, i + 2) for i in range(2, len(node.inputs), 3)] if spec.variadic else []
        entries = [("q", *t) for t in quantized] if spec.variadic else list(spec.inputs)
        for entry in entries:
            kind = entry[0]
            if kind == "f":
                float_inputs.append(node.inputs[entry[1]])
            elif kind == "q":
                data, scale, zp = (node.inputs[i] if i < len(node.inputs) else None for i in entry[1:])
                axis = _weight_axis(spec.float_op, len(float_inputs), node, data)
                out = gs.Variable(ctx.names(f"{data.name}_dequantized"), dtype=np.float32)
                attrs = {"axis": axis} if axis is not None else {}
                new_nodes.append(gs.Node("DequantizeLinear", ctx.names(f"{base}/dq{len(float_inputs)}"), attrs,
                                         [data, scale] + ([zp] if zp is not None and zp.name else []), [out]))
                float_inputs.append(out)
            elif match.bias is not None:  # the bias, as a float
                bias = match.bias
                float_inputs.append(bias.make(ctx) if isinstance(bias, PendingConstant) else bias)

        attrs = {k: v for k, v in node.attrs.items() if k in spec.attrs}
        y = node.outputs[0]
        y_scale = _given(node, spec.output[0]) if spec.output else None
        y.inputs.clear()
        if y_scale is None:  # QGemm with a float output
            new_nodes.append(gs.Node(spec.float_op, ctx.names(f"{base}/float"), attrs, float_inputs, [y]))
        else:
            result = gs.Variable(ctx.names(f"{base}/float_out"), dtype=np.float32)
            new_nodes.append(gs.Node(spec.float_op, ctx.names(f"{base}/float"), attrs, float_inputs, [result]))
            y_zp = _given(node, spec.output[1])
            new_nodes.append(gs.Node("QuantizeLinear", ctx.names(f"{base}/q"), {},
                                     [result, y_scale] + ([y_zp] if y_zp is not None else []), [y]))
        ctx.graph.nodes.extend(new_nodes)
        node.inputs.clear()  # detach the source node, so its inputs' consumers are the new nodes only
        node.outputs.clear()


def _scale_inputs(node: gs.Node, spec: QOp) -> list[int]:
    if spec.variadic:
        indices = [0, 1] + [i for start in range(2, len(node.inputs), 3) for i in (start + 1, start + 2)]
    else:
        indices = [i for e in spec.inputs if e[0] == "q" for i in e[2:]]
        if spec.output:
            indices += list(spec.output)
    return [i for i in indices if i < len(node.inputs) and node.inputs[i].name]


def _weight_axis(float_op: str, position: int, node: gs.Node, data: gs.Tensor) -> int | None:
    """The per-channel axis of a weight's DequantizeLinear (None for activations / per-tensor)."""
    if position != 1 or float_op not in ("Conv", "MatMul", "Gemm"):
        return None
    scale_index = 4  # w_scale / b_scale of QLinearConv, QLinearMatMul and QGemm
    scale = constant_values(node.inputs[scale_index])
    if scale is None or scale.size == 1:
        return None
    return weight_axis(gs.Node(float_op, attrs=dict(node.attrs)), len(data.shape) if data.shape is not None else 2)


def _float_bias(node: gs.Node, spec: QOp, bias: gs.Tensor) -> gs.Tensor | PendingConstant | str:
    """An int32 bias at scale input_scale·weight_scale (·alpha for QGemm, whose beta is 1) as a float constant
    (``bias`` itself where it is float already), or why not."""
    values = constant_values(bias)
    if values is None:
        return f"bias '{bias.name}' is not a constant"
    if not np.issubdtype(values.dtype, np.integer):
        return bias  # already float
    x_scale = constant_values(node.inputs[1]).astype(np.float64).reshape(-1)
    w_scale = constant_values(node.inputs[4]).astype(np.float64).reshape(-1)
    alpha = float(node.attrs.get("alpha", 1.0)) if spec.float_op == "Gemm" else 1.0
    scale = x_scale * w_scale * alpha  # 1 or N (per output channel: the bias's last axis)
    if scale.size > 1 and (values.ndim == 0 or values.shape[-1] != scale.size):
        return f"bias '{bias.name}' has shape {list(values.shape)}, which does not match {scale.size} weight scales"
    floats = values.astype(np.float64) * (scale if scale.size > 1 else scale[0])
    return PendingConstant(f"{bias.name}_float", floats.astype(np.float32), ("int32-bias", bias.name, scale.tobytes()))
