"""Lift every supported source family into the canonical float graph + annotations.

``LIFT_RULES`` is the explicit pipeline: each rule sees the nodes of its op types
in graph order. New families (QOperator, Q/DQ, QAT) plug in by adding a module
and an entry here.
"""

from __future__ import annotations

import logging

import onnx_graphsurgeon as gs

from trt_bridge.ir.dynamic_gemm import is_plugin_node
from trt_bridge.ir.tensorrt_ops import TENSORRT_REJECTS
from trt_bridge.lift.base import NOT_MINE, Approximation, Decline, LiftContext, LiftRule
from trt_bridge.lift.block_quantize_dequantize import BlockQuantizeDequantize
from trt_bridge.lift.conv_bias import FoldConvBias
from trt_bridge.lift.dequantize_constant import DequantizeConstant
from trt_bridge.lift.dequantize_gathered import DequantizeGathered
from trt_bridge.lift.dynamic_integer import DynamicIntegerOp
from trt_bridge.lift.dynamic_lstm import DynamicQuantizeLSTM
from trt_bridge.lift.dynamic_passthrough import DynamicPassThrough
from trt_bridge.lift.embed_layer_norm import OrtEmbedLayerNorm
from trt_bridge.lift.fp4_activation_qdq import Fp4ActivationQdq
from trt_bridge.lift.fp4_dynamic import Fp4DynamicActivation
from trt_bridge.lift.fused_dynamic_matmul import FusedDynamicMatMul
from trt_bridge.lift.fused_matmul import FusedMatMul
from trt_bridge.lift.group_query_attention import GroupQueryAttention
from trt_bridge.lift.integer_passthrough import IntegerPassThrough
from trt_bridge.lift.matmul_bnb4 import MatMulBnb4
from trt_bridge.lift.matmul_nbits import MatMulNBits
from trt_bridge.lift.ort_attention import OrtAttention
from trt_bridge.lift.ort_multihead_attention import OrtMultiHeadAttention
from trt_bridge.lift.ort_multihead_attention_past import OrtMultiHeadAttentionPast
from trt_bridge.lift.ort_rotary_embedding import OrtRotaryEmbedding
from trt_bridge.lift.qattention import QAttention
from trt_bridge.lift.qdq_pair import QDQPair
from trt_bridge.lift.qembed_layer_norm import QEmbedLayerNorm
from trt_bridge.lift.qoperator import QOperatorOps
from trt_bridge.lift.scale_through_movement import ScaleThroughMovement

#: In order: dynamic patterns (they consume their own QuantizeLinear), onnxruntime's 4-bit MatMulNBits and
#: MatMulBnb4 (NF4/FP4, re-quantized INT4), then QOperator ops are written as float ops between DQ and Q,
#: onnxruntime's fused attention and embedding ops (and the decoder attention of onnxruntime-genai)
#: (the attention first: it reads the embedding's mask index), integer pass-through ops likewise, then the
#: dynamically quantized codes that are only moved and dequantized again, quantized tables read
#: through Gather (embeddings), every DQ of a constant, FP4 Q→DQ pairs of activations (annotated FP4 like
#: TensorRT's dynamic FP4 before them) and every other activation Q→DQ pair is lifted,
#: AMD Quark's block formats (BFP16, MX) become float tensors to calibrate or re-quantize, a scale
#: quantized in front of data-movement ops is carried through them to the op they feed, and last a bias
#: Add left after a lifted Conv is folded into it.
LIFT_RULES: tuple[LiftRule, ...] = (
    DynamicIntegerOp(), DynamicQuantizeLSTM(), FusedDynamicMatMul(), FusedMatMul(), MatMulNBits(), MatMulBnb4(),
    QOperatorOps(), QAttention(), OrtAttention(), OrtMultiHeadAttention(), OrtMultiHeadAttentionPast(),
    GroupQueryAttention(), OrtRotaryEmbedding(),
    QEmbedLayerNorm(), OrtEmbedLayerNorm(),
    IntegerPassThrough(), DynamicPassThrough(), Fp4DynamicActivation(), DequantizeGathered(), DequantizeConstant(),
    Fp4ActivationQdq(), QDQPair(),
    BlockQuantizeDequantize(), ScaleThroughMovement(), FoldConvBias(),
)

log = logging.getLogger("trt_bridge.lift")


def lift(graph: gs.Graph, rules: tuple[LiftRule, ...] = LIFT_RULES) -> LiftContext:
    """Apply ``rules`` to ``graph`` in place, each to the nodes of its op types in graph order (match, then
    rewrite), then inside every control-flow body (``If`` branches, ``Loop``/``Scan`` bodies, outer bodies first);
    dead source nodes are removed afterwards.

    A body's nodes are lifted like the main graph's (a pattern may start in the outer graph: onnxruntime's
    ``EnableSubgraph`` quantizes an outer-scope activation once, outside the ``If``); what they annotate goes to
    ``ctx.body_annotations`` (sites name nodes, unique model-wide), which the stages place, calibrate and lower
    apart from the main graph's (:mod:`trt_bridge.conversion.bodies`), and the names of the lifted nodes go to
    ``ctx.in_bodies``. Each body has its own constants: a weight lifted in one branch is not read from another."""
    ctx = LiftContext(graph)
    _apply_rules(ctx, rules)
    bodies = list(_bodies(graph))
    while bodies:
        body = bodies.pop(0)
        inner = LiftContext(body, annotations=ctx.body_annotations, fired={}, declined=ctx.declined, names=ctx.names,
                            approximated=ctx.approximated)
        _apply_rules(inner, rules)
        for rule, nodes in inner.fired.items():
            ctx.fired.setdefault(rule, []).extend(nodes)
            ctx.in_bodies.extend(nodes)
        bodies.extend(_bodies(body))
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    by_rule: dict[str, list[Approximation]] = {}
    for approx in ctx.approximated:
        by_rule.setdefault(approx.rule, []).append(approx)
    for rule, found in by_rule.items():
        log.warning("%s: %d node(s) have no TensorRT equivalent and were converted to the nearest form it "
                    "builds, e.g. '%s': %s (see the report's 'approximated')", rule, len(found), found[0].node,
                    found[0].what)
    return ctx


def _apply_rules(ctx: LiftContext, rules: tuple[LiftRule, ...]) -> None:
    for rule in rules:
        for node in [n for n in ctx.graph.nodes if n.op in rule.op_types]:
            found = rule.match(ctx, node)
            if isinstance(found, str):
                if found != NOT_MINE:
                    ctx.declined.append(Decline(rule.name, node.name, node.op, found))
                continue
            rule.rewrite(ctx, found)
            ctx.fired.setdefault(rule.name, []).append(node.name)


def _bodies(graph: gs.Graph) -> list[gs.Graph]:
    """The control-flow bodies of ``graph``'s own nodes (not those nested deeper), in node order."""
    return [sub for node in graph.nodes for value in node.attrs.values()
            for sub in (value if isinstance(value, list) else [value]) if isinstance(sub, gs.Graph)]


def leftover_blockers(graph: gs.Graph) -> list[tuple[gs.Node, str]]:
    """Nodes TensorRT cannot import that are still in the graph after lifting, each with
    where it sits: '' in the main graph, else the control-flow node(s) whose subgraph
    holds it (what no rule lifted there)."""
    found: list[tuple[gs.Node, str]] = []

    def visit(g: gs.Graph, where: str) -> None:
        for n in g.nodes:
            if n.op in TENSORRT_REJECTS or ((n.domain or "") not in ("", "ai.onnx") and not is_plugin_node(n)):
                found.append((n, where))
            for attr, value in n.attrs.items():
                for sub in value if isinstance(value, list) else [value]:
                    if isinstance(sub, gs.Graph):
                        visit(sub, f"{where}{n.op} '{n.name}' {attr} / ")

    visit(graph, "")
    return found


__all__ = ["LIFT_RULES", "Approximation", "Decline", "LiftContext", "lift", "leftover_blockers"]
