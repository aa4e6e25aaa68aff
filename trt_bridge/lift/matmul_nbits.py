"""Lift onnxruntime's ``MatMulNBits`` (com.microsoft: weights of 2, 4 or 8 bits in blocks along K, packed in bytes;
onnxruntime's ``MatMulNBitsQuantizer``, Olive, onnxruntime-genai, Intel Neural Compressor's weight-only export, the
``*_q4.onnx`` files published for many transformers) to a float MatMul whose weight is annotated INT4 weight-only,
TensorRT's form of it::

    Before:  A ─ MatMulNBits(B uint8 [N, K/b, b·bits/8], scales [N, K/b], zero_points?, g_idx?, bias?;
                             K, N, bits, block_size b) ─ Y
    After:   A ─ MatMul(W = (q − z)·s, float [K, N]) [─ Add(bias)] ─ Y
             annotation: W → INT4 weight-only in blocks of b along K (axis 0, scales [K/b, N]), the codes kept
             (blocks int4 cannot hold as they are: W = k·|s| + the block's shift, added by a float side path)

``Y = A · Wᵀ`` with ``W[n, k] = (q[n, k] − z[n, k / b])·s[n, k / b]``: codes packed low bits first along K, one blob of
bytes per block; scales ``[N · K/b]`` or ``[N, K/b]``; zero points packed the same way (``[N, ⌈(K/b)·bits/8⌉]``
bytes) or floats ``[N, K/b]`` of the scales' type, 2^(bits − 1) when absent. Packed zero points in the op's first
layout, one run over all ``N·K/b`` without padding at the end of a row (``⌈N·(K/b)·bits/8⌉`` bytes: Intel Neural
Compressor 1.0 writes it; onnxruntime now refuses it where ``K/b`` is odd), are read in that layout, and so are
uint8 zero points one code a byte, ``[N, K/b]`` (NNCF 3.4 writes them; onnxruntime refuses them). The codes are
kept exactly: where ``q − z``, its sign turned with a negative scale's, fits int4 as it is (onnxruntime's symmetric
blocks with a positive scale; 2-bit codes always), else shifted into int4 by one integer per block, the shift added
back by a float side path (:mod:`trt_bridge.lift.shifted_blocks`: onnxruntime's symmetric quantizer writes negative
scales, its default writes zero points, HQQ float ones). 8-bit blocks are re-quantized int8 per channel
(TensorRT's INT8 takes no blocks; reported in ``approximated``). float16 (``*_q4f16``) weights are lifted in float16.

A K that is no multiple of the block (onnxruntime pads the last block) gets whole blocks, which TensorRT's INT4
requires (its parser rejects a partial block, or reads the weight in blocks of another size)::

    Before:  A [..., K] ─ MatMulNBits(K, block_size b, K mod b ≠ 0) ─ Y
    After:   A ─ Pad(last axis to ⌈K/b⌉·b, zeros) ─ MatMul(W: ⌈K/b⌉·b rows, the packed tail's codes) ─ Y   (exact)

An act-order ``g_idx`` (row k of W in group ``g_idx[k]``) whose groups hold ``b`` rows each is made blocks again by
reading A's columns in group order (exact)::

    Before:  A ─ MatMulNBits(…, g_idx) ─ Y
    After:   A ─ Gather(order, axis −1) ─ MatMul(W rows in group order) ─ Y

any other ``g_idx`` is dequantized exactly row by row and the weight re-quantized in INT4 blocks (reported). The
zero points of a row are its group's, as the op's specification and onnxruntime's reference kernel read them
(onnxruntime 1.32's CPU provider reads packed uint8 zero points as 8 when a ``g_idx`` is given).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import ScaleSource, Site, WeightSpec
from trt_bridge.formats import INT4
from trt_bridge.lift.base import NOT_MINE, LiftContext, detach
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.lift.shifted_blocks import lift_shifted_matmul, shifted_blocks
from trt_bridge.lift.weights import lift_block_weight

#: the bit widths onnxruntime packs (2, 4 and 8 bits: whole codes per byte)
BITS = (2, 4, 8)


@dataclass(frozen=True)
class MatMulNBitsMatch:
    node: gs.Node
    codes: np.ndarray  # [K, N] (uint4 for 2 and 4 bits, uint8 for 8), rows in group order when ``order`` is set
    scale: np.ndarray  # [K/b, N], the scales' float type
    zero_point: np.ndarray  # [K/b, N], uint8 or the scales' float type
    block: int
    order: np.ndarray | None  # act-order: A's columns read in this order (the rows of ``codes`` are)
    rows: np.ndarray | None  # a g_idx whose groups are not blocks: each row's group (dequantized row by row)
    bias: gs.Tensor | None
    padding: int = 0  # K not a multiple of the block: the rows of zeros A gains (and the weight: whole blocks)


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The ``bits``-wide codes packed in the bytes of ``packed``'s last axis, low bits first: ``count`` of them."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    fields = (packed.astype(np.uint8)[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return fields.reshape(*packed.shape[:-1], packed.shape[-1] * per)[..., :count]


def _optional(node: gs.Node, index: int) -> gs.Tensor | None:
    if len(node.inputs) <= index or not node.inputs[index].name:
        return None
    return node.inputs[index]


class MatMulNBits:
    name = "matmul-nbits"
    op_types = ("MatMulNBits",)
    outcome = ("lifted by rule 'matmul-nbits' to MatMul (+ Add bias): the 4-bit weights INT4 weight-only in their "
               "blocks, the source's codes kept exactly")

    def match(self, ctx: LiftContext, node: gs.Node) -> MatMulNBitsMatch | str:
        if (node.domain or "") != "com.microsoft":
            return NOT_MINE
        k, n = int(node.attrs.get("K", 0)), int(node.attrs.get("N", 0))
        bits, block = int(node.attrs.get("bits", 4)), int(node.attrs.get("block_size", 0))
        if bits not in BITS:
            return f"bits={bits}: only 2, 4 and 8-bit codes (whole codes per byte) are unpacked"
        if k <= 0 or n <= 0 or block < 2:
            return f"K={k}, N={n}, block_size={block} do not describe a weight"
        if block < 16 or block & (block - 1):
            return (f"block_size={block}: MatMulNBits' blocks are a power of two of at least 16 (onnxruntime "
                    "refuses others); re-export the weights with such a block size")
        bias = _optional(node, 5)
        if bias is not None and bias.shape is not None and list(bias.shape) != [n]:
            return f"its bias '{bias.name}' has shape {list(bias.shape)}, not [N={n}]; a bias has one value per output"
        if int(node.attrs.get("weight_prepacked", 0)):
            return "B is prepacked in a runtime's own layout (weight_prepacked=1)"
        packed, scales = constant_values(node.inputs[1]), constant_values(node.inputs[2])
        if packed is None or scales is None:
            return "B and the scales must be constants"
        blocks, blob = -(-k // block), block * bits // 8
        if packed.dtype != np.uint8 or packed.size != n * blocks * blob:
            return f"B {packed.dtype} {list(packed.shape)} is not [N={n}, {blocks} blocks, {blob} bytes] of uint8"
        if scales.dtype not in (np.float32, np.float16) or scales.size != n * blocks:
            return f"scales {scales.dtype} {list(scales.shape)} are not [N={n}, {blocks} blocks] of float"
        padding = blocks * block - k
        if padding and (node.inputs[0].shape is None or not len(node.inputs[0].shape)):
            return f"K={k} is no multiple of block_size={block}, and A's rank is unknown (A cannot be padded)"
        full = unpack(packed.reshape(n, blocks, blob), bits, block).reshape(n, blocks * block).T
        q = full[:k]
        scale = np.ascontiguousarray(scales.reshape(n, blocks).T)
        zp_tensor = _optional(node, 3)
        if zp_tensor is None:
            zero_point = np.full((blocks, n), 1 << (bits - 1), np.uint8)
        else:
            zps = constant_values(zp_tensor)
            if zps is None:
                return "the zero points must be constants"
            if zps.dtype == np.uint8 and zps.size == n * (-(-blocks * bits // 8)):
                zero_point = np.ascontiguousarray(unpack(zps.reshape(n, -1), bits, blocks).T)
            elif zps.dtype == np.uint8 and zps.size == -(-n * blocks * bits // 8):  # the op's first layout (see above)
                zero_point = np.ascontiguousarray(unpack(zps.reshape(-1), bits, n * blocks).reshape(n, blocks).T)
            elif zps.dtype == np.uint8 and zps.size == n * blocks and zps.max(initial=0) < 1 << bits:
                zero_point = np.ascontiguousarray(zps.reshape(n, blocks).T)  # NNCF 3.4: one code a byte, unpacked
            elif zps.dtype == scales.dtype and zps.size == n * blocks:
                zero_point = np.ascontiguousarray(zps.reshape(n, blocks).T)
            else:
                return f"zero points {zps.dtype} {list(zps.shape)} are neither packed uint8 nor floats [N, blocks]"
        order = rows = None
        g_tensor = _optional(node, 4)
        if g_tensor is not None:
            g = constant_values(g_tensor)
            if g is None or g.size != k or not np.issubdtype(g.dtype, np.integer) or g.min() < 0 \
                    or g.max() >= blocks:
                return "g_idx must be a constant of K group indices below the number of blocks"
            g = g.reshape(-1).astype(np.int64)
            plain = np.arange(k) // block
            if not np.array_equal(g, plain):
                sorted_rows = np.argsort(g, kind="stable")
                if np.array_equal(g[sorted_rows], plain):
                    order, q = sorted_rows, q[sorted_rows]
                else:
                    rows = g
        if padding and rows is None:  # whole blocks for TensorRT: the packed tail, read against A's zero columns
            q = np.concatenate([q, full[k:]])
        codes = q.astype(ml_dtypes.uint4) if bits < 8 else q.astype(np.uint8)
        return MatMulNBitsMatch(node, codes, scale, zero_point, block, order, rows, _optional(node, 5), padding)

    def rewrite(self, ctx: LiftContext, match: MatMulNBitsMatch) -> None:
        node = match.node
        base = node.name or node.outputs[0].name
        a, y = node.inputs[0], node.outputs[0]
        ftype = match.scale.dtype.type  # T1: A, the scales and Y share it
        if match.order is not None:
            order = gs.Constant(ctx.names(f"{base}/act_order"), match.order.astype(np.int64))
            ordered = gs.Variable(ctx.names(f"{a.name}_act_order"), dtype=a.dtype, shape=a.shape)
            axis = len(a.shape) - 1 if a.shape is not None else -1  # A's last axis (K)
            ctx.graph.nodes.append(gs.Node("Gather", ctx.names(f"{base}/gather"), {"axis": axis}, [a, order],
                                           [ordered]))
            a = ordered
        if match.padding:  # K made whole blocks: A's last axis padded with zeros (exact)
            a = self._pad_k(ctx, a, match.padding, base)
        matmul = ctx.names(f"{base}/matmul")
        site = Site(matmul, 1)
        shifted = None if match.rows is not None else shifted_blocks(match.codes, match.zero_point, match.scale,
                                                                     match.block)
        if match.rows is not None:
            weight = self._rows_weight(ctx, match, site, ftype)
        elif shifted is None:
            weight = lift_block_weight(ctx, node.inputs[1], match.codes, match.zero_point, match.scale, 1, match.block,
                                       site, node.name, rule=self.name, ftype=ftype)
        else:
            weight = node.inputs[1]  # replaced by lift_shifted_matmul
        y.inputs.clear()
        out = y if match.bias is None else gs.Variable(ctx.names(f"{base}/matmul_out"), dtype=y.dtype)
        node_mm = gs.Node("MatMul", matmul, {}, [a, weight], [out])
        ctx.graph.nodes.append(node_mm)
        if shifted is not None:  # exact: the codes + each block's shift in a float side path
            lift_shifted_matmul(ctx, node_mm, node.inputs[1], shifted, match.block, node.name, ftype)
        if match.bias is not None:
            ctx.graph.nodes.append(gs.Node("Add", ctx.names(f"{base}/bias"), {}, [out, match.bias], [y]))
        detach(node)  # the packed codes and scales its match loaded go now, not at Python's next cyclic collection

    @staticmethod
    def _pad_k(ctx: LiftContext, a: gs.Tensor, padding: int, base: str) -> gs.Tensor:
        """``a`` with ``padding`` zero columns after its last axis (K): the weight's rows fill whole blocks, which
        TensorRT's INT4 blocks require, and the padded rows meet zeros."""
        rank = len(a.shape)
        pads = np.zeros(2 * rank, np.int64)
        pads[-1] = padding
        shape = None if a.shape is None else [*a.shape[:-1], a.shape[-1] + padding
                                              if isinstance(a.shape[-1], int) else None]
        padded = gs.Variable(ctx.names(f"{a.name}_padded_k"), dtype=a.dtype, shape=shape)
        ctx.graph.nodes.append(gs.Node("Pad", ctx.names(f"{base}/pad_k"), {"mode": "constant"},
                                       [a, ctx.constant(f"{base}/pad_k_pads", pads, ("pad-k", rank, padding))],
                                       [padded]))
        return padded

    def _rows_weight(self, ctx: LiftContext, match: MatMulNBitsMatch, site: Site, ftype) -> gs.Constant:
        """A g_idx whose groups are no blocks: each row dequantized with its group's scale and zero point, the weight
        re-quantized in INT4 blocks when lowered (reported)."""
        node, rows = match.node, match.rows
        values = ((match.codes.astype(np.float64) - match.zero_point[rows].astype(np.float64))
                  * match.scale[rows].astype(np.float64)).astype(ftype)
        values = np.concatenate([values, np.zeros((match.padding, values.shape[1]), ftype)])  # whole blocks
        const = ctx.constant(f"{node.inputs[1].name}_float", values, ("matmul-nbits-rows", node.name))
        ctx.annotations.add_weight(WeightSpec(const.name, [site], 1, node.name, source=ScaleSource.REQUANTIZED,
                                              format=INT4, block_size=match.block))
        ctx.approximate(self.name, node.name, f"g_idx of '{node.name}' puts rows of one group apart in groups of "
                        f"other than {match.block} rows: the weight dequantized row by row and re-quantized INT4 in "
                        f"blocks of {match.block}")
        return const

