"""Lift integer matmul/conv with their scaling epilogue back to a float op.

Before (onnxruntime ``quantize_dynamic``; other dynamic quantizers differ in the epilogue)::

    x ─ DynamicQuantizeLinear ─┬ x_q ──────────────┐
                               ├ x_scale ─ Mul(·, w_scale) ─────────────┐
                               └ x_zp ─────────────┤                    │
    W_q (int8|uint8), w_zp ────────────── MatMulInteger|ConvInteger ─ acc:int32
        acc [─ Add(bias_acc)]* ─ Cast(float) [─ Add(bias_acc)]* ─ Mul(x_scale·w_scale) ─ y

After::

    x ─────────────── MatMul|Conv ─ [Add(bias)]* ─ y
    W (float = (W_q − w_zp)·w_scale) ─┘
    annotations: x → activation, scale from calibration (dynamic has none);
                 W → weight, exact int8 (symmetric source) or re-quantized per channel.

The epilogue is not matched by node names or a fixed layout. Starting at the
accumulator, the rule walks forward through Cast/Mul/Div/Add/Sub and tracks the
multiplier applied so far as a :class:`Monomial` of dynamic scales and constants.
The tensor where the multiplier equals the activation scale(s) times a constant is
the float result; the constant is the weight scale (per tensor or per output
channel). Any addend met on the way is "accumulator-scaled": its float value is
recovered by undoing the division that produced it (``Floor(b / (s_x·s_w))`` → b),
or by multiplying a constant integer addend by the remaining multiplier.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.lift.base import LiftContext, PendingConstant
from trt_bridge.lift.scale_algebra import Monomial, constant_values, monomial_of, quantizer_zero_point
from trt_bridge.lift.weights import lift_integer_weight

_ROUNDING = {"Floor", "Round", "Ceil"}
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@dataclass
class _Activation:
    float_tensor: gs.Tensor
    scale: Monomial  # a dynamic symbol, or a constant (static QuantizeLinear)
    static_scale: float | None


@dataclass
class _Weight:
    tensor: gs.Tensor
    values: np.ndarray
    zero_point: np.ndarray


def _zero_point(node: gs.Node, index: int) -> np.ndarray | str:
    if len(node.inputs) <= index or node.inputs[index].name == "":
        return np.zeros((), np.int64)
    values = constant_values(node.inputs[index])
    if values is None:
        return f"zero point input {index} ('{node.inputs[index].name}') is not a constant"
    return values.astype(np.int64)


def _classify(node: gs.Node, index: int) -> _Activation | _Weight | str:
    tensor = node.inputs[index]
    values = constant_values(tensor)
    if values is not None:
        zp = _zero_point(node, index + 2)
        if isinstance(zp, str):
            return zp
        return _Weight(tensor, values, zp)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    zp_in = node.inputs[index + 2] if len(node.inputs) > index + 2 and node.inputs[index + 2].name else None
    if producer is not None and producer.op == "DynamicQuantizeLinear" and producer.outputs[0] is tensor:
        if zp_in is not producer.outputs[2]:
            # uint8 codes without their zero point subtracted are not x/s: nothing float to lift
            return (f"operand {index} comes from DynamicQuantizeLinear '{producer.name}' but "
                    f"{node.op} '{node.name}' does not subtract its zero point "
                    f"'{producer.outputs[2].name}' (input {index + 2} is "
                    f"{'missing' if zp_in is None else repr(zp_in.name)})")
        return _Activation(producer.inputs[0], monomial_of(producer.outputs[1]), None)
    if producer is not None and producer.op == "QuantizeLinear":
        return static_activation(node, index, producer, zp_in)
    return (f"operand {index} ('{tensor.name}') is neither a constant nor produced by "
            "DynamicQuantizeLinear or a per-tensor QuantizeLinear")


def static_activation(node: gs.Node, index: int, producer: gs.Node, zp_in: gs.Tensor | None) -> _Activation | str:
    """An operand quantized by a static per-tensor QuantizeLinear(x, s, zp).

    The integer op computes with (q − a_zp) = round(x/s) + zp − a_zp, which is x/s only
    when a_zp equals the QuantizeLinear's zero point. The codes cover the float range
    [s·(qmin − zp), s·(qmax − zp)]; the symmetric int8 scale that covers it is
    s·max(qmax − zp, zp − qmin)/127 (exactly s for int8 with zero point 0).
    """
    scale = constant_values(producer.inputs[1])
    if scale is None or scale.size != 1:
        return f"QuantizeLinear '{producer.name}' feeding operand {index} is not per tensor with a constant scale"
    q_zp = quantizer_zero_point(producer)
    a_zp = np.zeros((), np.int64) if zp_in is None else constant_values(zp_in)
    if q_zp is None or a_zp is None or q_zp.size != 1 or a_zp.size != 1:
        return f"the zero points of QuantizeLinear '{producer.name}' and {node.op} '{node.name}' must be constants"
    if int(q_zp.reshape(())) != int(a_zp.reshape(())):
        return (f"{node.op} '{node.name}' subtracts zero point {int(a_zp.reshape(()))} from operand {index}, "
                f"but QuantizeLinear '{producer.name}' added {int(q_zp.reshape(()))}")
    info = np.iinfo(q_zp.dtype)
    zp = int(q_zp.reshape(()))
    s = float(scale.reshape(()))
    covering = s if (q_zp.dtype == np.int8 and zp == 0) else s * max(info.max - zp, zp - info.min) / 127.0
    return _Activation(producer.inputs[0], Monomial(np.asarray(s, np.float64)), covering)


def _channel_vector(numeric: np.ndarray, channels: int, out_rank: int | None, spatial: int) -> np.ndarray | None:
    """The weight scale as a 0-d or 1-d array over output channels, if ``numeric`` is one.

    ``numeric`` multiplies the op's output, of rank ``out_rank`` (None: unknown), whose
    channel axis is followed by ``spatial`` axes (a Conv's; 0 for MatMul). It must not
    broadcast the output to a higher rank, and every axis but the channel axis is 1:
    a Conv3d scale shaped [C, 1, 1] lands on the depth axis, not on the channels.
    """
    limit = out_rank if out_rank is not None else (spatial + 2 if spatial else 1)
    if numeric.ndim > limit:
        return None
    if numeric.size == 1:
        return numeric.reshape(())
    shape = numeric.shape
    if len(shape) < spatial + 1 or any(d != 1 for d in shape[len(shape) - spatial:]) \
            or any(d != 1 for d in shape[:len(shape) - spatial - 1]):
        return None
    vec = numeric.reshape(-1)
    return vec if vec.size == channels else None


@dataclass(frozen=True)
class IntegerOpMatch:
    node: gs.Node
    acts: list[_Activation]  # the operands quantized at run time or statically, in input order
    weight: _Weight | None  # the constant integer weight (None: activation × activation, or a float weight)
    w_scale: np.ndarray | None  # its scale, 0-d or per output channel
    float_weight: _Activation | None  # a float constant quantized at run time, lifted as the weight
    addends: list[tuple[_Addend, int]]  # the float values added to the accumulator, with their signs
    end: gs.Tensor  # the float result


class DynamicIntegerOp:
    name = "dynamic-integer-op"
    op_types = ("MatMulInteger", "ConvInteger")
    outcome = ("lifted by rule 'dynamic-integer-op' to a float op on the source's int8 weights, with a "
               "symmetric int8 Q/DQ whose activation scale is calibrated (needs --calib-data)")

    def match(self, ctx: LiftContext, node: gs.Node) -> IntegerOpMatch | str:
        is_conv = node.op == "ConvInteger"
        operands = [_classify(node, 0), _classify(node, 1)]
        for op in operands:
            if isinstance(op, str):
                return op
        acts = [op for op in operands if isinstance(op, _Activation)]
        if not acts or isinstance(operands[0], _Weight):
            return "the left operand is a constant; only activation × weight or activation × activation is lifted"
        weight = operands[1] if isinstance(operands[1], _Weight) else None
        # A float constant quantized at run time (an exporter that kept weights as Constant nodes
        # makes quantize_dynamic treat them as activations): its float value is the weight.
        float_weight = None
        if isinstance(operands[1], _Activation) and constant_values(operands[1].float_tensor) is not None:
            float_weight = operands[1]
        if is_conv and weight is None and float_weight is None:
            return "ConvInteger with a non-constant weight"

        act_scale = Monomial.one()
        for a in acts:
            act_scale = act_scale * a.scale

        channels = None
        if weight is not None:
            channels = weight.values.shape[0] if is_conv else weight.values.shape[-1]
        elif float_weight is not None:
            values = constant_values(float_weight.float_tensor)
            channels = values.shape[0] if is_conv else values.shape[-1]

        spatial = 0
        if is_conv:
            kernel = weight.values if weight is not None else constant_values(float_weight.float_tensor)
            spatial = kernel.ndim - 2
        out_shape = node.outputs[0].shape
        out_rank = spatial + 2 if is_conv else (len(out_shape) if out_shape is not None else None)

        kernel_rank = None
        if weight is not None:
            kernel_rank = weight.values.ndim
        elif float_weight is not None:
            kernel_rank = constant_values(float_weight.float_tensor).ndim
        if not is_conv and kernel_rank is not None and kernel_rank < 2:
            channels = 1  # x[.., K] @ w[K] has no output-channel axis: only a per-tensor scale folds in

        def per_channel(m: Monomial) -> bool:
            if weight is None and float_weight is None:  # activation × activation: nothing to fold into
                return bool(np.allclose((m / act_scale).numeric, 1.0, rtol=1e-5))
            return _channel_vector((m / act_scale).numeric, channels or 1, out_rank, spatial) is not None

        graph_outputs = {t.name for t in ctx.graph.outputs}
        walk = _walk_epilogue(node.outputs[0], act_scale, per_channel, graph_outputs)
        if isinstance(walk, str):
            return walk
        (end, multiplier), addends = walk

        weight_scale = multiplier / act_scale  # symbols cancel; numeric = w_scale
        w_scale = None
        if weight is not None:
            w_scale = _channel_vector(weight_scale.numeric, channels, out_rank, spatial)
            if w_scale is None:
                return (f"the scale multiplying the accumulator has shape {weight_scale.numeric.shape}, "
                        "which is not per tensor or per output channel")
        elif not np.allclose(weight_scale.numeric, 1.0, rtol=1e-5) or weight_scale.numeric.ndim > (out_rank or 1):
            return "the accumulator of two activations is scaled by an unexpected constant"

        float_addends = []
        for other, mult_at, sign in addends:
            value = _float_addend(other, multiplier / mult_at)
            if value is None:
                return (f"cannot tell the float value of '{other.name}', which is added to the "
                        "accumulator before it is scaled back to float")
            float_addends.append((value, sign))

        if end.dtype is not None and np.dtype(end.dtype) != np.float32:
            return f"the float result '{end.name}' is {np.dtype(end.dtype)}, not float32"
        return IntegerOpMatch(node, acts, weight, w_scale, float_weight, float_addends, end)

    def rewrite(self, ctx: LiftContext, match: IntegerOpMatch) -> None:
        node, acts, weight, end = match.node, match.acts, match.weight, match.end
        is_conv = node.op == "ConvInteger"
        float_addends = [(addend.made(ctx), sign) for addend, sign in match.addends]  # first: the names as before
        inputs = [a.float_tensor for a in acts]
        base = node.name or node.outputs[0].name
        op_name = ctx.names(f"{base}/float")
        if weight is not None:
            axis = 0 if is_conv else weight.values.ndim - 1
            inputs.append(lift_integer_weight(ctx, weight.tensor, weight.values, weight.zero_point, match.w_scale,
                                              axis, Site(op_name, 1), node.name))
        attrs = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS} if is_conv else {}
        result = gs.Variable(ctx.names(f"{base}/float_out"), dtype=np.float32)
        new_nodes = [gs.Node("Conv" if is_conv else "MatMul", op_name, attrs, inputs, [result])]
        for addend, sign in float_addends:
            value = addend.tensor(ctx, base, new_nodes)
            out = gs.Variable(ctx.names(f"{base}/bias_out"), dtype=np.float32)
            new_nodes.append(gs.Node("Add" if sign > 0 else "Sub", ctx.names(f"{base}/bias"), {},
                                     [result, value], [out]))
            result = out
        # The last new node produces `end` itself, so its consumers stay wired.
        end.inputs.clear()
        new_nodes[-1].outputs = [end]
        ctx.graph.nodes.extend(new_nodes)

        for i, a in enumerate(acts):
            if a is match.float_weight:
                values = constant_values(a.float_tensor)
                ctx.annotations.add_weight(WeightSpec(a.float_tensor.name, [Site(op_name, i)],
                                                      0 if is_conv else values.ndim - 1, node.name))
                continue
            ctx.annotations.add_activation(
                a.float_tensor.name, Site(op_name, i), node.name, scale=None if a.static_scale is None
                else a.static_scale, source=None if a.static_scale is None else ScaleSource.MODEL,
                dynamic=a.static_scale is None)


def _walk_epilogue(acc: gs.Tensor, act_scale: Monomial, per_channel, graph_outputs: set[str]):
    """Follow the accumulator to the tensor where it is back in float.

    The float result is reached once the multiplier holds exactly the activation
    scale symbols; constant multiplies right after it (a weight scale applied in a
    separate step) are absorbed while the product stays per output channel.
    Returns ``(end tensor, total multiplier, [(addend, multiplier at that point, sign)])``
    or a reason string.
    """
    t, mult, addends = acc, Monomial.one(), []
    for _ in range(32):
        if len(t.outputs) != 1 or t.name in graph_outputs:
            return (f"accumulator-scaled tensor '{t.name}' has {len(t.outputs)} consumers"
                    f"{' and is a graph output' if t.name in graph_outputs else ''}; "
                    "expected one chain ending in a multiply by the scales")
        consumer = t.outputs[0]
        out = consumer.outputs[0]
        if consumer.op == "Cast":
            pass
        elif consumer.op in ("Mul", "Div"):
            other = consumer.inputs[1] if consumer.inputs[0] is t else consumer.inputs[0]
            if consumer.op == "Div" and consumer.inputs[0] is not t:
                return f"'{t.name}' is a divisor in Div '{consumer.name}'"
            m = monomial_of(other)
            if m is None:
                return f"'{other.name}' in {consumer.op} '{consumer.name}' is not a product of scales"
            mult = mult * m if consumer.op == "Mul" else mult / m
            if mult.symbols == act_scale.symbols:
                return _absorb_constant_scales(out, mult, per_channel, graph_outputs), addends
        elif consumer.op in ("Add", "Sub"):
            if consumer.op == "Sub" and consumer.inputs[1] is t:
                return f"'{t.name}' is subtracted in Sub '{consumer.name}'"
            other = consumer.inputs[1] if consumer.inputs[0] is t else consumer.inputs[0]
            addends.append((other, mult, 1 if consumer.op == "Add" else -1))
        else:
            return (f"accumulator-scaled tensor '{t.name}' reaches {consumer.op} '{consumer.name}' "
                    "before it is multiplied back to float")
        t = out
    return f"no multiply by the activation scale found after '{acc.name}'"


def _absorb_constant_scales(t: gs.Tensor, mult: Monomial, per_channel,
                            graph_outputs: set[str]) -> tuple[gs.Tensor, Monomial]:
    while len(t.outputs) == 1 and t.name not in graph_outputs:
        consumer = t.outputs[0]
        if consumer.op not in ("Mul", "Div") or (consumer.op == "Div" and consumer.inputs[0] is not t):
            break
        other = consumer.inputs[1] if consumer.inputs[0] is t else consumer.inputs[0]
        m = monomial_of(other)
        if m is None or m.symbols:
            break
        candidate = mult * m if consumer.op == "Mul" else mult / m
        if not per_channel(candidate):
            break
        t, mult = consumer.outputs[0], candidate
    return t, mult


#: shape-only ops that may sit between a run-time quantized bias and the accumulator it is added to
#: (onnxruntime's first quantizer, producer ``onnx.quantize`` 0.1.0, reshapes it to [1, C, 1, 1])
_SHAPE_OPS = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand")


def _float_addend(tensor: gs.Tensor, remaining: Monomial) -> _Addend | None:
    """The float tensor that ``tensor`` (in accumulator units) stands for, given the
    multiplier ``remaining`` still to be applied to it, and the shape ops to apply to it again."""
    t, reshapes = tensor, []
    while len(t.inputs) == 1 and t.inputs[0].op in ("Cast", *_ROUNDING, *_SHAPE_OPS):
        if t.inputs[0].op in _SHAPE_OPS:
            if any(constant_values(x) is None for x in t.inputs[0].inputs[1:]):
                return None
            reshapes.append(t.inputs[0])
        t = t.inputs[0].inputs[0]
    values = constant_values(t)
    if values is not None:
        if remaining.symbols:
            return None
        scaled = (values.astype(np.float64) * remaining.numeric).astype(np.float32)
        return _Addend(PendingConstant(f"{tensor.name}_float", scaled, ("addend", t.name, remaining.numeric.tobytes())),
                       reshapes[::-1])
    if len(t.inputs) != 1 or t.inputs[0].op not in ("Div", "Mul"):
        return None
    node = t.inputs[0]
    for value, scale in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        m = monomial_of(scale)
        if m is None:
            continue
        if node.op == "Div" and value is node.inputs[0] and m.matches(remaining):
            return _Addend(value, reshapes[::-1])
        if node.op == "Mul" and (m * remaining).matches(Monomial.one()):
            return _Addend(value, reshapes[::-1])
    return None


@dataclass(frozen=True)
class _Addend:
    """A float addend (a constant still to be made, until :meth:`made`), and the shape ops (source order) that
    bring it to the accumulator's layout."""

    value: gs.Tensor | PendingConstant
    reshapes: list[gs.Node]

    def made(self, ctx: LiftContext) -> _Addend:
        return replace(self, value=self.value.make(ctx)) if isinstance(self.value, PendingConstant) else self

    def tensor(self, ctx: LiftContext, base: str, nodes: list[gs.Node]) -> gs.Tensor:
        """The addend in the accumulator's layout, appending the copied shape ops to ``nodes``."""
        current = self.value
        for op in self.reshapes:
            out = gs.Variable(ctx.names(f"{base}/bias_{op.op.lower()}"), dtype=np.float32)
            nodes.append(gs.Node(op.op, ctx.names(f"{base}/bias_{op.op.lower()}"), dict(op.attrs),
                                 [current, *op.inputs[1:]], [out]))
            current = out
        return current
