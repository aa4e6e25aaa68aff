"""Lift every supported source family into the canonical float graph + annotations.

``LIFT_RULES`` is the explicit pipeline: each rule sees the nodes of its op types
in graph order. New families (QOperator, Q/DQ, QAT) plug in by adding a module
and an entry here.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from trt_bridge.lift.base import Decline, LiftContext, LiftRule
from trt_bridge.lift.dynamic_integer import DynamicIntegerOp
from trt_bridge.lift.fused_dynamic_matmul import FusedDynamicMatMul
from trt_bridge.lift.fused_matmul import FusedMatMul

LIFT_RULES: tuple[LiftRule, ...] = (DynamicIntegerOp(), FusedDynamicMatMul(), FusedMatMul())

#: Ops that TensorRT's ONNX parser rejects; none may survive lifting.
TENSORRT_REJECTS = frozenset({
    "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul",
})


def lift(graph: gs.Graph, rules: tuple[LiftRule, ...] = LIFT_RULES) -> LiftContext:
    """Apply ``rules`` to ``graph`` in place; dead source nodes are removed afterwards."""
    ctx = LiftContext(graph)
    for rule in rules:
        for node in [n for n in graph.nodes if n.op in rule.op_types]:
            reason = rule.apply(ctx, node)
            if reason is None:
                ctx.fired.setdefault(rule.name, []).append(node.name)
            else:
                ctx.declined.append(Decline(rule.name, node.name, node.op, reason))
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    return ctx


def leftover_blockers(graph: gs.Graph) -> list[gs.Node]:
    """Nodes TensorRT cannot import that are still in the graph after lifting."""
    return [n for n in graph.nodes if n.op in TENSORRT_REJECTS or (n.domain or "") not in ("", "ai.onnx")]


__all__ = ["LIFT_RULES", "Decline", "LiftContext", "lift", "leftover_blockers"]
