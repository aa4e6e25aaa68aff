"""Lift TensorRT's dynamic FP4 activation (ModelOpt's NVFP4 W4A4 exports, ``convert --fp4`` outputs) to its float
tensor, annotated FP4 with the range its global scale stands for.

``TRT_FP4DynamicQuantize`` (domain ``trt``) quantizes ``x`` per block of 16 along its last axis, each block's FP8
E4M3 scale under one FP32 global scale ``g``; the ``DequantizeLinear`` nodes after it undo that::

    Before:  x ─ TRT_FP4DynamicQuantize(g; axis −1, block 16) ─┬─ x4 ─ DequantizeLinear(s, −1, 16) ─ y ─ MatMul
                                                               └─ s8 ─ DequantizeLinear(g) ─ s ─┘
    After:   x ─ MatMul        annotation: x → FP4, range ±6 · 448 · g (what g was calibrated for)

Placement keeps the format where the target runs FP4 (``--compute-capability`` 10.0 or newer), and lowering writes
the same chain back (:mod:`trt_bridge.lower.nvfp4`); for an older target or none it becomes the nearest form TensorRT
builds there (reported in ``approximated``). Declined, with the reason: another axis, block size or scale type than
TensorRT's, a global scale that is not one finite positive constant, or codes or block scales read by anything but
the two ``DequantizeLinear`` nodes of the pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX, ScaleSource
from trt_bridge.formats import FP4, FP8
from trt_bridge.lift.base import NOT_MINE, LiftContext, read_float
from trt_bridge.lift.scale_algebra import constant_values
from trt_bridge.runtime.fp4_dynamic import BLOCK, DOMAIN, OP


@dataclass(frozen=True)
class Fp4DynamicMatch:
    node: gs.Node
    x: gs.Tensor
    dequantized: tuple[gs.Node, ...]  # the DequantizeLinear nodes of the codes
    scale: float  # the INT8-unit scale of x's range: 6 · 448 · g / 127


class Fp4DynamicActivation:
    name = "fp4-dynamic-activation"
    op_types = (OP,)
    outcome = "lifts it to its float tensor, annotated FP4 (TensorRT's dynamic FP4 quantization)"

    def match(self, ctx: LiftContext, node: gs.Node) -> Fp4DynamicMatch | str:
        if node.domain != DOMAIN or len(node.inputs) < 2 or len(node.outputs) != 2:
            return NOT_MINE
        axis, block = node.attrs.get("axis", -1), node.attrs.get("block_size", BLOCK)
        rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
        if axis not in (-1, None if rank is None else rank - 1) or block != BLOCK:
            return (f"axis {axis}, block size {block}: TensorRT quantizes FP4 activations in blocks of 16 along the "
                    "last axis")
        if node.attrs.get("scale_type", onnx.TensorProto.FLOAT8E4M3FN) != onnx.TensorProto.FLOAT8E4M3FN:
            return "its block scales are not FP8 E4M3 (NVFP4's)"
        g = constant_values(node.inputs[1])
        if g is None or g.size != 1 or not np.isfinite(g).all() or not float(g.reshape(-1)[0]) > 0:
            return "its global scale is not one finite positive constant"
        codes, block_scales = node.outputs
        scale_dq = list(block_scales.outputs)
        if not scale_dq or any(n.op != "DequantizeLinear" or n.inputs[0] is not block_scales for n in scale_dq):
            return "its block scales are read by another node than their DequantizeLinear"
        scales = {id(n.outputs[0]) for n in scale_dq}
        readers = list(codes.outputs)
        if not readers or any(n.op != "DequantizeLinear" or n.inputs[0] is not codes or len(n.inputs) < 2
                              or id(n.inputs[1]) not in scales for n in readers):
            return "its FP4 codes are read by another node than a DequantizeLinear with its block scales"
        return Fp4DynamicMatch(node, node.inputs[0], tuple(readers),
                               float(g.reshape(-1)[0]) * FP4.qmax * FP8.qmax / QMAX)

    def rewrite(self, ctx: LiftContext, match: Fp4DynamicMatch) -> None:
        read_as_float(ctx, match.x, match.dequantized, match.node.name, match.scale)
        for dq in match.dequantized:
            dq.outputs.clear()
        match.node.outputs.clear()


def read_as_float(ctx: LiftContext, x: gs.Tensor, dequantized, origin: str, scale: float):
    """Every reader of the ``dequantized`` nodes' outputs reads ``x`` instead, annotated an FP4 activation of
    ``scale`` (INT8 units) quantized by ``origin``; a graph output among them is kept by an Identity of ``x``.
    Returns ``x``'s activation spec (None when nothing reads it)."""
    for site in read_float(ctx, list(dequantized), x):
        ctx.annotations.add_activation(x.name, site, origin, scale, ScaleSource.MODEL)
    spec = ctx.annotations.activations.get(x.name)
    if spec is not None:
        spec.format = FP4
    return spec
