"""Lift onnxruntime's float ``FusedMatMul`` (com.microsoft) to standard ONNX.

onnxruntime's optimizer folds transposes and a scalar multiply into the attention
MatMuls of a saved, optimized model; TensorRT has no importer for it::

    Before:  a, b ─ FusedMatMul(alpha, transA, transB) ─ y
    After:   a [─ Transpose(last two)] , b [─ Transpose(last two)] ─ MatMul [─ Mul(alpha)] ─ y
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.lift.base import LiftContext


@dataclass(frozen=True)
class FusedMatMulMatch:
    node: gs.Node
    #: the two operands, each with the permutation that transposes its last two axes (None: read as it is)
    operands: tuple[tuple[gs.Tensor, str, list[int] | None], ...]
    alpha: float
    dtype: object  # the type of the alpha multiply (None where alpha is 1)


class FusedMatMul:
    name = "fused-matmul"
    op_types = ("FusedMatMul",)
    outcome = "lifted by rule 'fused-matmul' to MatMul (+ Transpose / alpha Mul)"

    def match(self, ctx: LiftContext, node: gs.Node) -> FusedMatMulMatch | str:
        if (node.domain or "") != "com.microsoft":
            return f"FusedMatMul in domain '{node.domain}' is not onnxruntime's contrib op"
        if node.attrs.get("transBatchA", 0) or node.attrs.get("transBatchB", 0):
            return "transBatchA/transBatchB are not lifted"
        operands = []
        for tensor, flag in ((node.inputs[0], "transA"), (node.inputs[1], "transB")):
            if not node.attrs.get(flag, 0):
                operands.append((tensor, flag, None))
                continue
            if tensor.shape is None:
                return f"'{tensor.name}' has unknown rank, so {flag} cannot be made a Transpose"
            rank = len(tensor.shape)
            operands.append((tensor, flag, list(range(rank - 2)) + [rank - 1, rank - 2]))
        y = node.outputs[0]
        alpha = float(node.attrs.get("alpha", 1.0))
        dtype = y.dtype if y.dtype is not None else node.inputs[0].dtype
        if alpha != 1.0 and dtype is None:
            return f"the type of '{y.name}' is unknown, so the alpha multiply cannot be typed"
        return FusedMatMulMatch(node, tuple(operands), alpha, dtype)

    def rewrite(self, ctx: LiftContext, match: FusedMatMulMatch) -> None:
        node, alpha = match.node, match.alpha
        base = node.name or node.outputs[0].name
        operands = []
        for tensor, flag, perm in match.operands:
            if perm is None:
                operands.append(tensor)
                continue
            out = gs.Variable(ctx.names(f"{tensor.name}_transposed"), dtype=tensor.dtype)
            ctx.graph.nodes.append(gs.Node("Transpose", ctx.names(f"{base}/{flag}"), {"perm": perm}, [tensor], [out]))
            operands.append(out)
        y = node.outputs[0]
        result = y if alpha == 1.0 else gs.Variable(ctx.names(f"{base}/matmul_out"), dtype=y.dtype)
        y.inputs.clear()
        ctx.graph.nodes.append(gs.Node("MatMul", ctx.names(f"{base}/matmul"), {}, operands, [result]))
        if alpha != 1.0:
            ctx.graph.nodes.append(gs.Node("Mul", ctx.names(f"{base}/alpha"), {},
                                           [result, gs.Constant(ctx.names(f"{base}/alpha_value"),
                                                                np.array(alpha, np.dtype(match.dtype)))], [y]))
