"""Lift an FP4 ``QuantizeLinear → DequantizeLinear`` pair of a computed tensor (ONNX opset 23, ``output_dtype``
FLOAT4E2M1) to its float tensor, annotated FP4 with the range its static scale stands for.

The scale is one value ``s`` (per tensor) or one per block of 16 along the last axis (``block_size`` 16, its blocks
given ahead of time); either way FP4 E2M1's largest code is 6, so the codes cover ±6 · max(s)::

    Before:  x ─ QuantizeLinear(s; FLOAT4E2M1) ─ x4 ─ DequantizeLinear(s) ─ MatMul(W)
    After:   x ─ MatMul(W)        annotation: x → FP4, range ±6 · max(s), source "model"

This is the annotation :mod:`trt_bridge.lift.fp4_dynamic` writes for TensorRT's own dynamic FP4, and it takes the
same path on: placement keeps FP4 where the target runs it (``--compute-capability`` 10.0 or newer) and the reader is
an FP4 GEMM, and lowering writes ``TRT_FP4DynamicQuantize`` with the global scale of that range — blocks of 16 whose
FP8 scales TensorRT computes in every inference, more accurate than the source's static scale(s), so each is reported
in ``approximated``. Other readers (a convolution), and older targets or none, get FP8 (8.9 and newer) or INT8 over
the same range, reported likewise (:func:`trt_bridge.place.formats.assign_formats`).

A scale that is not constant, finite and positive, a zero point that is not 0, or a per-axis scale or block layout
TensorRT has no FP4 form for is refused before any work, naming the node (:func:`fp4_qdq_problem`, called by
:func:`trt_bridge.conversion.support.check_supported`); ``match`` declines them with the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX
from trt_bridge.formats import FP4
from trt_bridge.lift.base import NOT_MINE, LiftContext
from trt_bridge.lift.fp4_dynamic import read_as_float
from trt_bridge.lift.scale_algebra import constant_values, quantizer_zero_point

RULE = "fp4-activation-qdq"


def fp4_qdq_problem(scale: np.ndarray | None, zero: np.ndarray | None, axis: int, block_size: int) -> str | None:
    """Why TensorRT has no FP4 form of an activation's FP4 Q/DQ with these parameters (None: it has): ``scale`` and
    ``zero`` are the constant values (None: not a constant), ``axis`` and ``block_size`` the nodes' attributes."""
    if scale is None:
        return "its scale is not a constant (TensorRT's FP4 activations take a static global scale)"
    scale = np.asarray(scale, np.float64)
    if scale.size == 0 or not np.isfinite(scale).all() or not (scale > 0).all():
        return "its scale is not finite and positive"
    if zero is None or np.any(np.asarray(zero, np.float32) != 0):
        return "its zero point is not 0 (TensorRT's FP4 is symmetric)"
    if block_size:
        last = scale.ndim - 1
        if scale.ndim < 2 or (axis if axis >= 0 else axis + scale.ndim) != last or block_size != FP4.block_size:
            return (f"block size {block_size} on axis {axis}: TensorRT quantizes FP4 activations in blocks of "
                    f"{FP4.block_size} along the last axis")
    elif scale.size != 1:
        return "its scale is per axis: TensorRT quantizes FP4 activations per tensor or in blocks of 16"
    return None


@dataclass(frozen=True)
class Fp4QdqMatch:
    node: gs.Node
    x: gs.Tensor
    dequantized: tuple[gs.Node, ...]  # the DequantizeLinear nodes of the codes
    scale: float  # the INT8-unit scale of x's range: 6 · max(s) / 127


def _params(node: gs.Node) -> tuple[np.ndarray | None, np.ndarray | None, int, int]:
    return (constant_values(node.inputs[1]) if len(node.inputs) > 1 else None, quantizer_zero_point(node),
            int(node.attrs.get("axis", 1)), int(node.attrs.get("block_size", 0)))


def _same(a: tuple, b: tuple) -> bool:
    """Whether two nodes' (scale, zero point, axis, block size) quantize alike (a per-tensor scale's axis aside)."""
    return all(x is not None and y is not None and np.shape(x) == np.shape(y)
               and np.array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32)) for x, y in zip(a[:2], b[:2])) \
        and (a[3] == b[3] and (not a[3] or a[2] == b[2]))


class Fp4ActivationQdq:
    name = RULE
    op_types = ("QuantizeLinear",)
    outcome = "lifts it to its float tensor, annotated FP4 over the range its scale stands for"

    def match(self, ctx: LiftContext, node: gs.Node) -> Fp4QdqMatch | str:
        if node.domain not in ("", "ai.onnx", None) or len(node.inputs) < 2 or len(node.outputs) != 1:
            return NOT_MINE
        params = _params(node)
        zero = params[1]
        if zero is None or np.dtype(zero.dtype).name != "float4_e2m1fn":
            if node.attrs.get("output_dtype") != onnx.TensorProto.FLOAT4E2M1:
                return NOT_MINE
        x = node.inputs[0]
        if constant_values(x) is not None:
            return NOT_MINE  # a weight's Q/DQ
        problem = fp4_qdq_problem(*params)
        if problem:
            return problem
        readers = list(node.outputs[0].outputs)
        if not readers or any(n.op != "DequantizeLinear" or n.inputs[0] is not node.outputs[0]
                              or not _same(_params(n), params) for n in readers):
            return "its FP4 codes are read by another node than a DequantizeLinear with its scale"
        return Fp4QdqMatch(node, x, tuple(readers), float(np.max(params[0])) * FP4.qmax / QMAX)

    def rewrite(self, ctx: LiftContext, match: Fp4QdqMatch) -> None:
        spec = read_as_float(ctx, match.x, match.dequantized, match.node.name, match.scale)
        if spec is not None:
            spec.lifted_by = RULE
        for node in (match.node, *match.dequantized):  # out of the graph: the Q/DQ rules after this one see neither
            node.inputs.clear()
            node.outputs.clear()
            ctx.graph.nodes.remove(node)
