"""Lift ``DequantizeLinear`` of constants: quantized weights, int32 biases, quantized constants.

    Before:  W_q:int8|uint8 ─ DQ(s, z, axis) ─ Conv|ConvTranspose|MatMul|Gemm (weight input)
    After:   W = (W_q − z)·s (float) ─ Conv|…     annotation: W → weight on the op's channel axis,
                                                  the source's integers kept where they fit int8

    Before:  B:int32 ─ DQ(s_x·s_w) ─ Conv (bias)        After: B·s_x·s_w (float) ─ Conv
    Before:  k_q ─ DQ(s, z) ─ Add|Mul|… (any other use)  After: (k_q − z)·s (float) ─ Add|Mul|…

A weight written as float → QuantizeLinear → DequantizeLinear is quantized here
with the Q's own rounding and saturation first, so it lifts the same way (AIMET's and other
QAT-style Q/DQ exports quantize their float weights at run time).

Block-wise weights (opset 21 ``block_size``: onnxruntime's and ModelOpt's INT4 weight-only export, AIMET's int4
block-wise and LPBQ weights, whose per-block scale is itself a DequantizeLinear of integers, lifted first) of a
2-D MatMul/Gemm weight, blocked along its reduction axis, keep their codes: TensorRT runs them as INT4 weight-only
(uint4 codes re-centred on their zero point; the blocks that int4 cannot hold as they are, a zero point other than
8 or onnxruntime's negative symmetric scales, shifted into int4 with the shift added back by a float side path,
:mod:`trt_bridge.lift.shifted_blocks`; a Gemm with ``transA``'s clipped or re-quantized block by block, reported)::

    Before:  W_q:int4 ─ DQ(s[K/32, N], block_size 32, axis 0) ─ MatMul
    After:   W = (W_q − z)·s, each block with its scale ─ MatMul   annotation: W → INT4, blocks of 32, the codes kept

Blocks along another axis, or of another op's weight, have no TensorRT form: the weight is dequantized exactly
and re-quantized per output channel (reported in ``approximated``). FP8 weights (float8 codes) are kept the same way
as integer ones: exact where symmetric, per tensor or per output channel. FP4 weights (NVFP4/MXFP4: float4e2m1 codes
in blocks along a 2-D MatMul/Gemm weight's reduction axis, the two-level scale lifted to one float per block first;
also ModelOpt's ``DQ ─ Transpose ─ MatMul``) keep their codes and block scales, annotated FP4; placement keeps them
for a target of 10.0 or newer, else makes them INT4 blocks (:mod:`trt_bridge.place.formats`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.formats import FP4, code_limits, numpy_code_format
from trt_bridge.formats import broadcast_param as expand_param
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.scale_algebra import constant_values, dequantized, infinite_scale, quantizer_zero_point
from trt_bridge.lift.shifted_blocks import lift_shifted_matmul, shifted_blocks
from trt_bridge.lift.shifted_channels import lift_shifted_channels, shifted_channels, takes_side_path
from trt_bridge.lift.weights import (
    WEIGHT_INPUT,
    block_axis,
    float_type,
    lift_block_weight,
    lift_fp4_block_weight,
    lift_integer_weight,
    weight_axis,
)


def broadcast_param(param: np.ndarray, values: np.ndarray, axis: int, block: int = 0) -> np.ndarray:
    """A scale or zero point shaped to broadcast against ``values``: 0-d (per tensor), per ``axis``, or
    per block of ``block`` elements along ``axis`` (``param`` then has the rank of ``values``)."""
    return expand_param(param.astype(np.float64), values.shape, axis, block)


def quantize_like(values: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int, block: int = 0) -> np.ndarray:
    """What ``QuantizeLinear(values, scale, zp, axis, block_size)`` computes (round half to even, saturate)."""
    s, z = broadcast_param(scale, values, axis, block), broadcast_param(zp, values, axis, block)
    codes, (lo, hi) = numpy_code_format(zp.dtype), code_limits(zp.dtype)
    if codes is not None and codes.nearest.is_float:  # float8: saturate, then round to the nearest code
        return np.clip(values.astype(np.float64) / s + z, lo, hi).astype(zp.dtype)
    return np.clip(np.rint(values.astype(np.float64) / s) + z, lo, hi).astype(zp.dtype)


def integer_constant(tensor: gs.Tensor) -> np.ndarray | None:
    """The codes of ``tensor`` if it is a constant of a code type (integers, int4, float8) or QuantizeLinear of a
    float constant."""
    values = constant_values(tensor)
    if values is not None:
        return values if np.issubdtype(values.dtype, np.integer) or numpy_code_format(values.dtype) else None
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is None or producer.op != "QuantizeLinear":
        return None
    floats, scale = constant_values(producer.inputs[0]), constant_values(producer.inputs[1])
    zp = quantizer_zero_point(producer)
    if floats is None or scale is None or zp is None:
        return None
    axis = int(producer.attrs.get("axis", 1)) % max(floats.ndim, 1)
    return quantize_like(floats, scale, zp, axis, int(producer.attrs.get("block_size", 0)))


@dataclass(frozen=True)
class DequantizedConstantMatch:
    dq: gs.Node
    values: np.ndarray  # the integers
    floats: np.ndarray  # what the DequantizeLinear computes of them
    scale: np.ndarray  # float64, 0-d or 1-d
    zp: np.ndarray  # int64, 0-d or 1-d
    axis: int
    block: int  # block_size (0: per tensor or per axis)


class DequantizeConstant:
    name = "dequantize-constant"
    op_types = ("DequantizeLinear",)
    outcome = ("lifted by rule 'dequantize-constant': weights become symmetric int8 per output channel (zero "
               "point 0), an int32 bias becomes float")

    def match(self, ctx: LiftContext, node: gs.Node) -> DequantizedConstantMatch | str:
        values = integer_constant(node.inputs[0])
        if values is None:
            return NOT_MINE  # an activation: the Q/DQ pair rule's
        block = int(node.attrs.get("block_size", 0))
        scale, zp = constant_values(node.inputs[1]), quantizer_zero_point(node)
        if scale is None or zp is None:
            return "the scale and zero point must be constants"
        out = node.outputs[0]
        if any(t is out for t in ctx.graph.outputs):
            return f"'{out.name}' is a graph output"
        axis = int(node.attrs.get("axis", 1)) % max(values.ndim, 1)
        if block and (scale.ndim != values.ndim or scale.shape[axis] * block < values.shape[axis]):
            return f"block-wise scale of shape {list(scale.shape)} does not cover the weight {list(values.shape)}"
        if np.issubdtype(values.dtype, np.integer):
            offset = values.astype(np.int64) - broadcast_param(zp.astype(np.int64), values, axis, block)
        else:  # float8 (and int4, whose ml_dtypes type numpy counts as no integer): exact in float64
            offset = values.astype(np.float64) - broadcast_param(zp, values, axis, block)
        # the DequantizeLinear's own output type: its scale's (a float16 layer of ModelOpt's stays float16)
        floats = dequantized(offset, broadcast_param(scale, values, axis, block)).astype(
            np.float16 if scale.dtype == np.float16 else np.float32)
        if block:  # blocked: the scale keeps the weight's rank
            scale = scale.astype(np.float64)
        else:
            scale = scale.astype(np.float64).reshape(-1) if scale.size > 1 else scale.astype(np.float64).reshape(())
        if block:  # float codes (FP8, FP4) keep a fractional zero point
            wide = np.float64 if (numpy_code_format(zp.dtype) or numpy_code_format(np.int8)).nearest.is_float \
                else np.int64
            zp = zp.astype(wide) if zp.size > 1 else zp.astype(wide).reshape(())
        else:
            zp = zp.reshape(-1) if zp.size > 1 else zp.reshape(())
            zp = zp.astype(np.int64) if np.issubdtype(zp.dtype, np.integer) else zp.astype(np.float64)
        return DequantizedConstantMatch(node, values, floats, scale, zp, axis, block)

    def rewrite(self, ctx: LiftContext, match: DequantizedConstantMatch) -> None:
        node, values, floats = match.dq, match.values, match.floats
        scale, zp, axis, block = match.scale, match.zp, match.axis, match.block
        source, out = node.inputs[0], node.outputs[0]
        lost = infinite_scale(scale, floats, f"'{source.name}'")
        if lost:  # a float constant (Inf is no weight scale)
            ctx.approximate(self.name, node.name, lost)
        for consumer in list(out.outputs):
            for index, tensor in enumerate(consumer.inputs):
                if tensor is not out:
                    continue
                weighted = WEIGHT_INPUT.get(consumer.op) == index and values.dtype.itemsize == 1 and not lost
                if not lost and _lift_transposed_fp4(ctx, consumer, source, match):
                    continue
                if not weighted:
                    consumer.inputs[index] = ctx.constant(f"{source.name}_float", floats,
                                                          ("dequantized", source.name, node.name))
                    continue
                site, c_axis = Site(consumer.name, index), weight_axis(consumer, values.ndim)
                fp4 = values.dtype == FP4.dtype
                blocked = block and values.ndim == 2 and axis == block_axis(c_axis, 2) and consumer.op in (
                    "MatMul", "Gemm")
                if fp4 and blocked:  # NVFP4/MXFP4: the codes and block scales kept (placement: FP4 or INT4)
                    consumer.inputs[index] = lift_fp4_block_weight(ctx, source, values, zp, scale, c_axis, block,
                                                                   site, node.name)
                elif blocked:
                    # a MatMul's blocks that int4 cannot hold as they are (negative scales, zero points other than
                    # 8) stay exact: int4 codes + each block's shift in a float side path (lift/shifted_blocks)
                    turned = consumer.op == "Gemm" and bool(int(consumer.attrs.get("transB", 0)))  # [N, K]
                    shifted = shifted_blocks(values.T, zp.T, scale.T, block) if turned else shifted_blocks(
                        values, zp, scale, block)
                    if shifted is not None and lift_shifted_matmul(ctx, consumer, source, shifted, block, node.name,
                                                                   float_type(out, "weight")):
                        continue
                    consumer.inputs[index] = lift_block_weight(ctx, source, values, zp, scale, c_axis, block, site,
                                                               node.name, ftype=float_type(out, "weight"))
                elif not fp4 and not block and (scale.ndim == 0 or axis == c_axis):
                    # 8-bit channels symmetric int8 cannot hold as they are (NNCF's zero points, its negative
                    # scales) stay exact: int8 codes + each channel's shift in a float side path (lift/shifted_channels)
                    shifted = shifted_channels(values, zp, scale, c_axis) if takes_side_path(
                        ctx, consumer, values.shape) else None
                    if shifted is not None:
                        lift_shifted_channels(ctx, consumer, source, shifted, c_axis, node.name,
                                              float_type(out, "weight"))
                        continue
                    consumer.inputs[index] = lift_integer_weight(ctx, source, values, zp, scale, c_axis, site,
                                                                 node.name, float_type(out, "weight"))
                else:  # per-channel on another axis, or blocks TensorRT has no form for: re-quantized per channel
                    if fp4:
                        ctx.approximate(self.name, node.name, f"FP4 weights of {consumer.op} '{consumer.name}' "
                                        "re-quantized per output channel: TensorRT takes FP4 weights only in blocks "
                                        "along a 2-D MatMul/Gemm weight's reduction axis")
                    elif block:
                        ctx.approximate(self.name, node.name, f"block-wise weights (block_size {block}, axis {axis}) "
                                        f"of {consumer.op} '{consumer.name}' re-quantized per output channel: "
                                        "TensorRT takes blocks only along a 2-D MatMul/Gemm weight's reduction axis")
                    const = ctx.constant(f"{source.name}_float", floats, ("dequantized", source.name, node.name))
                    ctx.annotations.add_weight(WeightSpec(const.name, [site], c_axis, node.name,
                                                          source=ScaleSource.REQUANTIZED))
                    consumer.inputs[index] = const


def _lift_transposed_fp4(ctx: LiftContext, transpose: gs.Node, source: gs.Tensor,
                         match: DequantizedConstantMatch) -> bool:
    """ModelOpt's NVFP4 export of a torch Linear: FP4 codes [N, K] in blocks along K (axis 1), transposed for a
    MatMul. The blocks are lifted transposed ([K, N], blocks along axis 0) onto each MatMul/Gemm the Transpose
    feeds (the Transpose is left dead); False where the pattern is not that one::

        Before:  W_q:fp4 [N, K] ─ DQ(s [N, K/16], axis 1, block_size 16) ─ Transpose ─ MatMul
        After:   W = W_qᵀ·sᵀ ─ MatMul     annotation: W → FP4 blocks of 16 along K, the codes kept (transposed)
    """
    values, block = match.values, match.block
    if values.dtype != FP4.dtype or transpose.op != "Transpose" or values.ndim != 2 or not block \
            or list(transpose.attrs.get("perm", [1, 0])) != [1, 0] or not transpose.outputs:
        return False
    moved = transpose.outputs[0]
    users = list(moved.outputs)
    if not users or any(t is moved for t in ctx.graph.outputs) or any(
            u.op not in ("MatMul", "Gemm") or len(u.inputs) < 2 or u.inputs[1] is not moved
            or u.inputs[0] is moved or weight_axis(u, 2) != match.axis for u in users):
        return False  # the transposed blocks must lie along each layer's reduction axis
    zp = match.zp.T if match.zp.ndim else match.zp
    for user in users:
        user.inputs[1] = lift_fp4_block_weight(ctx, source, values.T, zp, match.scale.T, weight_axis(user, 2), block,
                                               Site(user.name, 1), match.dq.name)
    return True
