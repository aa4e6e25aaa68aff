"""The attention fusion pass: every decomposed float16/bfloat16 attention as one ONNX ``Attention``-23 node, in the
main graph and in every control-flow body (both branches of Optimum's ``use_cache_branch`` ``If``), by the rules
``attention-fusion`` (what trt-bridge's own lift rules leave, :mod:`trt_bridge.lower.attention_fusion`) and
``torch-attention-fusion`` (torch's export of ``scaled_dot_product_attention``,
:mod:`trt_bridge.lower.torch_attention_fusion`), tried in that order on each Softmax.

The opset is the model's: it is raised to 23 once, where any graph holds an attention to fuse (before the rules
rewrite, so that the version converter, from an opset below 21, sees the decomposed form it has adapters for)::

    If(use_cache_branch)                         If(use_cache_branch)
      then: … MatMul ─ Add ─ Softmax ─ MatMul …     then: … Attention …
      else: … MatMul ─ Add ─ Softmax ─ MatMul …  →  else: … Attention …      (opset 23; ``bodies=True`` only)

TensorRT-RTX 1.7.1 builds no ``Attention`` inside an ``If`` branch (its Myelin backend fails: "Called with unknown
input tensor or sequence name '(Unnamed Layer* N) [ElementWise]_output'", with or without a mask or
``TRT_decomposable``, whatever computes the inputs; the same node in the main graph builds), while the decomposed
form builds there. So by default an attention inside a body stays decomposed, reported with :data:`IN_BODY`;
``bodies=True`` fuses it (onnxruntime runs it, computing the source's values).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from trt_bridge.ir.model import default_opset
from trt_bridge.ir.node_index import NodeIndex, drop_unused
from trt_bridge.ir.types import skeleton
from trt_bridge.lower.attention_fusion import (
    ATTENTION_OPSET,
    NOT_ATTENTION,
    AttentionFusion,
    FusionResult,
    raise_opset,
)
from trt_bridge.lower.torch_attention_fusion import OTHER_FORM, TorchAttentionFusion

#: the rules, in the order each Softmax is offered to them
RULES = (AttentionFusion(), TorchAttentionFusion())
IN_BODY = ("inside a control-flow body: TensorRT-RTX 1.7.1's builder fails on an Attention inside an If branch "
           "(Myelin: \"Called with unknown input tensor\"); the decomposed form stays, which it builds")


def fuse_attention(model: onnx.ModelProto, bodies: bool = False) -> tuple[onnx.ModelProto, FusionResult]:
    """``model`` with every decomposed float16/bfloat16 attention as one ``Attention``-23 node, in its main graph
    (and, with ``bodies``, in its control-flow bodies), the opset raised to 23 where one is, and what was fused or
    declined (by Softmax node; a body's as ``<If node>/<branch>: <Softmax>``)."""
    result = FusionResult()
    plans = _plans(model, result)
    if not bodies:
        for _, prefix, blocks in plans[1:]:
            result.declined.update({prefix + block.softmax: IN_BODY for _, block in blocks})
        plans = plans[:1]
    if not any(blocks for _, _, blocks in plans):
        return model, result
    source = default_opset(model)
    if source < ATTENTION_OPSET:
        try:
            raised = raise_opset(model, source)
        except Exception as exc:  # noqa: BLE001 - onnx's converter on an op it has no adapter for: stay decomposed
            why = f"the model's opset {source} cannot be raised to {ATTENTION_OPSET} for Attention: {exc}"
            result.declined.update({prefix + b.softmax: why.splitlines()[0] for _, prefix, blocks in plans
                                    for _, b in blocks})
            return model, result
        model, result.opset = raised, (source, ATTENTION_OPSET)
        plans = _plans(model, FusionResult())[:None if bodies else 1]
    for graph, prefix, blocks in plans:
        for rule, block in sorted(blocks, key=lambda rb: rb[1].nodes[-1], reverse=True):  # later first: indices hold
            rule.rewrite(graph, block)
            result.fused.append(prefix + block.softmax)
            result.by_rule.setdefault(rule.name, []).append(prefix + block.softmax)
        if blocks and graph is not model.graph:
            drop_unused(graph)
    result.fused.sort()
    for names in result.by_rule.values():
        names.sort()
    drop_unused(model)
    return model, result


def _plans(model: onnx.ModelProto, result: FusionResult) -> list[tuple[onnx.GraphProto, str, list]]:
    """(graph, its report prefix, its [(rule, block)]) for the main graph and every body, each body's blocks found
    with its outer scope's constants and types."""
    top = NodeIndex(model)
    inferred = _body_types(model)
    plans = [(model.graph, "", _matches(top, result, ""))]
    for body, prefix, ix in _bodies(model.graph, top, "", (), inferred):
        plans.append((body, prefix, _matches(ix, result, prefix)))
    return plans


def _subgraphs(graph: onnx.GraphProto, path: tuple = ()) -> Iterator[tuple[tuple, onnx.NodeProto, str,
                                                                           onnx.GraphProto]]:
    """Each body directly inside ``graph``: (its path: (node index, attribute, graph index) steps, the node, the
    attribute's name, the body)."""
    for i, node in enumerate(graph.node):
        for attr in node.attribute:
            for j, body in enumerate([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                yield (*path, (i, attr.name, j)), node, attr.name, body


def _bodies(graph: onnx.GraphProto, outer: NodeIndex, prefix: str, path: tuple, inferred: dict) -> Iterator:
    for key, node, attr, body in _subgraphs(graph, path):
        ix = NodeIndex.of_body(body, outer, inferred.get(key, ()))
        name = f"{prefix}{node.name or node.op_type}/{attr}: "
        yield body, name, ix
        yield from _bodies(body, ix, name, key, inferred)


def _body_types(model: onnx.ModelProto) -> dict[tuple, list[onnx.ValueInfoProto]]:
    """Each control-flow body's inferred value_info (by its path, :func:`_subgraphs`), where its own holds none:
    onnx's shape inference on a weight-free copy, best effort."""
    if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in model.graph.node
               for a in n.attribute):
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton(model), check_type=False, strict_mode=False)
    except Exception:  # noqa: BLE001 - best effort: the bodies' declared types only
        return {}
    found: dict[tuple, list[onnx.ValueInfoProto]] = {}

    def walk(graph: onnx.GraphProto, path: tuple) -> None:
        for key, _, _, body in _subgraphs(graph, path):
            found[key] = list(body.value_info)
            walk(body, key)

    walk(inferred.graph, ())
    return found


def _matches(ix: NodeIndex, result: FusionResult, prefix: str) -> list:
    blocks, taken = [], set()
    for i, node in enumerate(ix.nodes):
        if node.op_type != "Softmax" or (node.domain or "") not in ("", "ai.onnx"):
            continue
        reasons = []
        for rule in RULES:
            found = rule.match(ix, i)
            if not isinstance(found, str):
                break
            reasons.append(found)
        else:
            why = next((r for r in reversed(reasons) if r not in (NOT_ATTENTION, OTHER_FORM)), None)
            if why is not None:
                result.declined[prefix + node.name] = why
            continue
        if taken & set(found.nodes):
            result.declined[prefix + node.name] = "it shares nodes with another attention"
        else:
            taken.update(found.nodes)
            blocks.append((rule, found))
    return blocks
