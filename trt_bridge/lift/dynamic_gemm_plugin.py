"""Lift a dynamically quantized MatMul into one node of trt-bridge's dynamic INT8 GEMM plugin
(``convert --activations dynamic``): the activation keeps its per-inference scale inside TensorRT.

Before (onnxruntime ``quantize_dynamic``, int8 or uint8 weights, per tensor or per column)::

    x ─ DynamicQuantizeLinear ─┬ x_q ──────────────────────┐
                               ├ x_zp ─────────────────────┤
                               └ x_scale ─ Mul(·, w_scale) ─┼──────────────┐
    W_q, w_zp (constants) ─────────────────── MatMulInteger ─ Cast(float) ─ Mul ─ [Add(bias)] ─ y

After::

    x ─ DynamicInt8Gemm(weight = W_q − 128 if uint8, weight_zero_point, weight_scale, [bias]) ─ y

With ``granularity="tensor"`` the node computes the same integers and the same float32 roundings as the
source (:mod:`trt_bridge.ir.dynamic_gemm`), so the converted model reproduces the source bit for bit in
onnxruntime. uint8 weights become int8 by subtracting 128 from the weight and its zero point, which leaves
every ``W_q − w_zp`` as it was. Only this exact epilogue is taken: another one (a Div, a separate Mul per
scale) falls to the static rule, which lifts it to a calibrated MatMul.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.dynamic_gemm import DOMAIN, OP_TYPE, plugin_attributes
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.scale_algebra import constant_values


@dataclass(frozen=True)
class DynamicGemmMatch:
    node: gs.Node
    x: gs.Tensor  # the float activation DynamicQuantizeLinear reads
    weight: np.ndarray  # int8 [K, N]
    zero_point: np.ndarray  # int32 [N]
    scale: np.ndarray  # float32 [N]
    bias: np.ndarray | None  # float32 [N]
    end: gs.Tensor  # the source's float result, which the plugin node now produces
    chain: tuple[gs.Node, ...]  # MatMulInteger, Cast, Mul [, Add]: replaced by the plugin node


def _only_reader(tensor: gs.Tensor, op: str) -> gs.Node | None:
    readers = tensor.outputs
    return readers[0] if len(readers) == 1 and readers[0].op == op else None


def _other(node: gs.Node, tensor: gs.Tensor) -> gs.Tensor | None:
    """The input of a two-input ``node`` that is not ``tensor``."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    return b if a is tensor else a if b is tensor else None


def per_column(values: np.ndarray | None, n: int) -> np.ndarray | None:
    """``values`` as [1] (one value) or [N] (one per output column, along the last axis only)."""
    if values is None:
        return None
    if values.size == 1:
        return values.reshape(1)
    if values.shape[-1] == n and values.size == n:
        return values.reshape(n)
    return None


class DynamicGemmPlugin:
    name = "dynamic-gemm-plugin"
    op_types = ("MatMulInteger",)
    outcome = ("lifted by rule 'dynamic-gemm-plugin' to trt-bridge's DynamicInt8Gemm plugin: int8 weights, "
               "activation scales computed per inference (no calibration data)")

    def __init__(self, granularity: str = "tensor"):
        self.granularity = granularity

    def match(self, ctx: LiftContext, node: gs.Node) -> DynamicGemmMatch | str:
        if len(node.inputs) < 3:
            return NOT_MINE
        q, w = node.inputs[0], node.inputs[1]
        producer = q.inputs[0] if len(q.inputs) == 1 else None
        if producer is None or producer.op != "DynamicQuantizeLinear" or producer.outputs[0] is not q:
            return f"its input '{q.name}' does not come from DynamicQuantizeLinear"
        if node.inputs[2] is not producer.outputs[2]:
            return f"it does not subtract the zero point of DynamicQuantizeLinear '{producer.name}'"
        weight = constant_values(w)
        if weight is None or weight.ndim != 2 or weight.dtype not in (np.int8, np.uint8):
            return f"its weight '{w.name}' is not a constant 2-D int8/uint8 matrix"
        n = weight.shape[1]
        zp_in = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3].name else None
        zero_point = per_column(np.zeros((), np.int64) if zp_in is None else constant_values(zp_in), n)
        if zero_point is None:
            return "its weight zero point is not a constant per tensor or per column"
        cast = _only_reader(node.outputs[0], "Cast")
        if cast is None or cast.attrs.get("to") != 1 or cast.outputs[0] in ctx.graph.outputs:
            return "its accumulator is not read by one Cast to float"
        mul = _only_reader(cast.outputs[0], "Mul")
        factor = None if mul is None else _other(mul, cast.outputs[0])
        scale_mul = factor.inputs[0] if factor is not None and len(factor.inputs) == 1 else None
        if scale_mul is None or scale_mul.op != "Mul" or len(factor.outputs) > 1:
            return "the float accumulator is not multiplied by Mul(x_scale, w_scale)"
        w_scale = _other(scale_mul, producer.outputs[1])
        scale = per_column(None if w_scale is None else constant_values(w_scale), n)
        if scale is None or scale.dtype != np.float32:
            return "the accumulator's multiplier is not the activation scale times a constant float32 weight scale"
        end, bias, chain = mul.outputs[0], None, (node, cast, mul)
        add = _only_reader(end, "Add")
        if add is not None and end not in ctx.graph.outputs:
            addend = _other(add, end)
            bias = per_column(None if addend is None else constant_values(addend), n)
            if bias is not None and bias.dtype == np.float32 and addend.shape is not None \
                    and len(addend.shape) <= 1:
                end, chain = add.outputs[0], (*chain, add)
            else:
                bias = None
        return gemm_match(node, producer.inputs[0], weight, zero_point, scale, bias, end, chain)

    def rewrite(self, ctx: LiftContext, match: DynamicGemmMatch) -> None:
        write_plugin(ctx, match, self.granularity)


def gemm_match(node: gs.Node, x: gs.Tensor, weight: np.ndarray, zero_point: np.ndarray, scale: np.ndarray,
               bias: np.ndarray | None, end: gs.Tensor, chain: tuple[gs.Node, ...]) -> DynamicGemmMatch | str:
    """The match for an int8 or uint8 ``weight`` [K, N] with its zero point and scale ([1] or [N]), or why not.
    uint8 weights become int8: W_q − w_zp is unchanged by moving both by 128."""
    if weight.dtype == np.uint8:
        weight, zero_point = (weight.astype(np.int16) - 128).astype(np.int8), zero_point.astype(np.int64) - 128
    if zero_point.min() < -128 or zero_point.max() > 127:
        return "its weight zero point is outside the int8 range"
    return DynamicGemmMatch(node, x, weight, zero_point.astype(np.int32), scale, bias, end, chain)


def write_plugin(ctx: LiftContext, match: DynamicGemmMatch, granularity: str) -> None:
    """Replace ``match.chain`` by one DynamicInt8Gemm node reading ``match.x`` and producing ``match.end``."""
    node, end = match.node, match.end
    for replaced in match.chain:  # gone now, so that no later rule visits or walks into them
        replaced.inputs.clear()
        replaced.outputs.clear()
        ctx.graph.nodes.remove(replaced)
    attrs = plugin_attributes(match.weight, match.zero_point, match.scale, match.bias, granularity)
    plugin = gs.Node(OP_TYPE, ctx.names(f"{node.name or end.name}/dynamic_int8_gemm"), attrs, [match.x], [end],
                     domain=DOMAIN)
    ctx.graph.nodes.append(plugin)
    if end.dtype is None:
        end.dtype = match.x.dtype
