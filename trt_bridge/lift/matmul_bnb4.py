"""Lift onnxruntime's ``MatMulBnb4`` (com.microsoft: bitsandbytes' 4-bit weights, QLoRA's NF4 or FP4 lookup tables
scaled by one absmax per block) to a float MatMul whose weight is annotated INT4 weight-only. TensorRT has no form
for a lookup table (NF4's 16 values are quantiles of a normal distribution, FP4's bitsandbytes' own 4-bit float, neither
evenly spaced), so the weight is dequantized exactly and re-quantized as INT4 blocks when lowered (reported in
``approximated``)::

    Before:  A ─ MatMulBnb4(B uint8 [⌈N·K/2⌉], absmax [⌈N·K/b⌉]; K, N, block_size b, quant_type, transB) ─ Y
    After:   A ─ MatMul(W = table[q]·absmax, float [K, N]) ─ Y
             annotation: W → INT4 weight-only in blocks along K (axis 0): re-quantized from W, no codes kept

``B`` is the weight ``[N, K]`` (PyTorch's ``[out_features, in_features]``) flattened row by row, two codes a byte,
the first in the high four bits; element ``i`` of the flattened weight is ``table[q_i]·absmax[i / b]``, ``table``
FP4's (``quant_type`` 0) or NF4's (1), as onnxruntime's ``DequantizeBlockBnb4`` reads them. ``transB`` 1 (the
default, the forward pass) computes ``Y = A · Wᵀ`` (A's last axis K), ``transB`` 0 ``Y = A · W`` (A's last axis N, the
backward pass's form: the specification is followed, though onnxruntime 1.32's CPU kernel computes ``A · Wᵀ``
whatever ``transB`` says, which for ``transB`` 0 is defined only for a square W and is not what the spec says).
``training_mode`` changes nothing at inference. The INT4 blocks are the source's when they lie along the reduction
axis and divide it (``transB`` 1, ``b`` a power of two of 16 or more dividing K), else 64 values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.formats import INT4
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.scale_algebra import constant_values

#: the value of each 4-bit code, times its block's absmax (onnxruntime's ``fp4_qaunt_map`` / ``nf4_qaunt_map``,
#: bitsandbytes' tables), float32 as the kernels hold them
FP4_TABLE = np.array([0.0, 5.208333333e-03, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25,
                      -0.0, -5.208333333e-03, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667, -0.25], np.float32)
NF4_TABLE = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                      -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                      0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                      0.7229568362236023, 1.0], np.float32)
#: quant_type → (name, table)
TABLES = {0: ("FP4", FP4_TABLE), 1: ("NF4", NF4_TABLE)}
#: the INT4 block length when the source's blocks do not lie along the reduction axis or do not divide it
FALLBACK_BLOCK = 64


@dataclass(frozen=True)
class MatMulBnb4Match:
    node: gs.Node
    weight: np.ndarray  # W as the MatMul reads it: [K, N] (transB 1) or [N, K] (transB 0), the absmax's float type
    block: int  # the INT4 block length along W's reduction axis (axis 0)
    kind: str  # "NF4" or "FP4"


def dequantize_bnb4(packed: np.ndarray, absmax: np.ndarray, n: int, k: int, block: int,
                    table: np.ndarray) -> np.ndarray:
    """The weight ``[N, K]`` (float32) that ``packed`` codes (high nibble first) and ``absmax`` (one per ``block``
    elements of the flattened weight) hold, as onnxruntime's ``DequantizeBlockwiseBnb4`` computes it."""
    flat = packed.reshape(-1).astype(np.uint8)
    codes = np.stack([flat >> 4, flat & np.uint8(15)], axis=-1).reshape(-1)[:n * k]
    scale = np.repeat(absmax.reshape(-1).astype(np.float32), block)[:n * k]
    return (table[codes] * scale).reshape(n, k)


def int4_block(block: int, k: int, trans_b: bool) -> int:
    """The INT4 block length along the reduction axis: the source's where its blocks lie along it (``transB`` 1), are
    a power of two of 16 or more and divide K (each block inside one row of W), else :data:`FALLBACK_BLOCK`."""
    if trans_b and block >= 16 and block & (block - 1) == 0 and k % block == 0:
        return block
    return FALLBACK_BLOCK


class MatMulBnb4:
    name = "matmul-bnb4"
    op_types = ("MatMulBnb4",)
    outcome = ("lifted by rule 'matmul-bnb4' to MatMul: the NF4/FP4 weights (no TensorRT form) dequantized and "
               "re-quantized INT4 weight-only in blocks (approximated)")

    def match(self, ctx: LiftContext, node: gs.Node) -> MatMulBnb4Match | str:
        if (node.domain or "") != "com.microsoft":
            return NOT_MINE
        k, n = int(node.attrs.get("K", 0)), int(node.attrs.get("N", 0))
        block, quant_type = int(node.attrs.get("block_size", 0)), int(node.attrs.get("quant_type", -1))
        trans_b = bool(int(node.attrs.get("transB", 1)))
        if quant_type not in TABLES:
            return f"quant_type={quant_type}: only 0 (FP4) and 1 (NF4) are defined"
        if k <= 0 or n <= 0 or block <= 0 or block % 2:
            return f"K={k}, N={n}, block_size={block} do not describe a weight"
        if len(node.inputs) < 3:
            return "B and absmax are required"
        packed, absmax = constant_values(node.inputs[1]), constant_values(node.inputs[2])
        if packed is None or absmax is None:
            return "B and absmax must be constants"
        if packed.dtype != np.uint8 or packed.size != (n * k + 1) // 2:
            return f"B {packed.dtype} {list(packed.shape)} is not [(N·K + 1)/2 = {(n * k + 1) // 2}] of uint8"
        blocks = -(-n * k // block)
        if absmax.dtype not in (np.float32, np.float16) or absmax.size != blocks:
            return f"absmax {absmax.dtype} {list(absmax.shape)} is not [{blocks} blocks] of float32 or float16"
        kind, table = TABLES[quant_type]
        weight = dequantize_bnb4(packed, absmax, n, k, block, table)
        weight = np.ascontiguousarray(weight.T if trans_b else weight).astype(absmax.dtype)
        return MatMulBnb4Match(node, weight, int4_block(block, k, trans_b), kind)

    def rewrite(self, ctx: LiftContext, match: MatMulBnb4Match) -> None:
        node = match.node
        base = node.name or node.outputs[0].name
        a, y = node.inputs[0], node.outputs[0]
        matmul = ctx.names(f"{base}/matmul")
        b = node.inputs[1]
        key = ("matmul-bnb4", b.name, node.inputs[2].name, match.kind, match.weight.shape, match.weight.dtype.name)
        const = ctx.constant(f"{b.name}_float", match.weight, key)
        ctx.annotations.add_weight(WeightSpec(const.name, [Site(matmul, 1)], 1, node.name,
                                              source=ScaleSource.REQUANTIZED, format=INT4, block_size=match.block))
        y.inputs.clear()
        ctx.graph.nodes.append(gs.Node("MatMul", matmul, {}, [a, const], [y]))
        ctx.approximate(self.name, node.name, f"{match.kind} lookup codes of '{node.name}' have no TensorRT form: "
                        f"the weight dequantized exactly and re-quantized as INT4 blocks of {match.block} of "
                        f"'{b.name}'")
