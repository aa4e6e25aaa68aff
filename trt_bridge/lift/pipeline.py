"""A ModelProto to the lifted float model: prepare its types, sanitize, fold constants, apply the lift rules, and
say what is left that TensorRT cannot import."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.ir.deferred import import_graph
from trt_bridge.ir.export import export_model
from trt_bridge.ir.finalize import finalize
from trt_bridge.ir.model import default_opset
from trt_bridge.ir.store import WeightStore
from trt_bridge.ir.types import infer_shapes
from trt_bridge.lift import LIFT_RULES, leftover_blockers, lift
from trt_bridge.lift.base import LiftRule
from trt_bridge.lift.block_quantize_dequantize import QUARK_DOMAINS
from trt_bridge.prepare import global_pool, sanitize
from trt_bridge.prepare.constant_if import inline_constant_ifs, refresh_shapes
from trt_bridge.prepare.model import prepare
from trt_bridge.prepare.types import Bf16Policy
from trt_bridge.runtime.session import quiet_default_logger

#: Q/DQ nodes hold exact integer data; constant folding must leave them alone.
NO_FOLD = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


@dataclass
class Lifting:
    """What lifting a model found (see :func:`lift_graph`)."""

    graph: object  # gs.Graph, lifted in place
    ctx: object  # lift.LiftContext
    changes: list  # prepare.change.Change: types, bfloat16, Dropout, Identity, Cast chains
    blockers: list  # (gs.Node, where): nodes TensorRT cannot import that no rule lifted


def lift_graph(model: onnx.ModelProto, where: str | Path = "model", bf16: Bf16Policy = Bf16Policy.FP32,
               prepared: list | None = None, declared: dict[str, int] | None = None,
               rules: tuple[LiftRule, ...] = LIFT_RULES) -> Lifting:
    """Prepare (unless ``prepared`` holds the changes :func:`prepare` already made), sanitize, fold
    constants and lift ``model`` (consumed) with ``rules``; report what is left."""
    changes = prepare(model, where, bf16, declared) if prepared is None else list(prepared)
    if changes:  # the casts' outputs need types and shapes for the passes below
        model = infer_shapes(model)
    graph = import_graph(model)  # (a deferred source's weights read when a rule reads them)
    changes += sanitize(graph)
    changes += fold_constants(graph)
    changes += global_pool.after_folding(graph)
    ctx = lift(graph, rules)
    changes += global_pool.after_folding(graph)  # where a quantizer's custom op (Quark's BFP) hid the shapes
    return Lifting(graph, ctx, changes, leftover_blockers(graph))


def lift_model(model: onnx.ModelProto, where: str | Path = "model", bf16: Bf16Policy = Bf16Policy.FP32,
               declared: dict[str, int] | None = None, store: WeightStore | None = None,
               rules: tuple[LiftRule, ...] = LIFT_RULES):
    """Lift ``model`` (consumed) to the canonical form: ``(float ModelProto, LiftContext)``.

    The float model computes exactly what the source meant, with the source's own
    (dequantized) weights; raises UnsupportedPatternError if anything TensorRT
    cannot import is left. ``ctx.prepared`` lists the sanitizing changes. With a ``store``, the float model
    is a header whose large weights live in the store's file (:mod:`trt_bridge.ir.store`).
    """

    source_opset = default_opset(model)
    lifting = lift_graph(model, where, bf16, declared=declared, rules=rules)
    if lifting.blockers:
        raise UnsupportedPatternError(blocker_message(where, lifting.blockers, lifting.ctx.declined))
    lifting.ctx.prepared = lifting.changes
    lifted = export_model(lifting.graph, store)
    # The lifting graph refers to the source model's tensors (and the lifted weights to their own arrays): let
    # them go with the source, so the float model is held once from here on (a model over 2 GB kept 1× more).
    lifting.ctx.graph, lifting.ctx.constants, lifting.graph = None, {}, None
    return finalize(lifted, source_opset), lifting.ctx


def fold_constants(graph: gs.Graph) -> list:
    """Fold constant subgraphs (a Reshape/Transpose of a weight) in place; Q/DQ stay (exact integer data), and
    so do AMD Quark's custom ops (onnxruntime cannot run them: one in the subgraph would stop all folding). An If
    whose condition folds to a constant is inlined by ``prepare.constant_if`` (onnx-graphsurgeon's own flattening
    leaves dangling names in nested bodies), and the graph folded again. Returns the Ifs inlined (``Change``)."""
    quiet_default_logger()  # onnx-graphsurgeon folds in an onnxruntime session of default options
    changes: list = []
    for _ in range(4):  # an inlined branch can make a nested If's condition constant in turn
        graph.fold_constants(should_exclude_node=lambda n: n.op in NO_FOLD or (n.domain or "") in QUARK_DOMAINS,
                             flatten_subgraphs=False).cleanup()
        inlined = inline_constant_ifs(graph)
        if not inlined:
            break
        changes += inlined
        refresh_shapes(graph)
    return changes


def blocker_message(path: Path, blockers, declined) -> str:
    reasons = {d.node: d.reason for d in declined}
    lines = [f"{path}: {len(blockers)} node(s) that TensorRT cannot import could not be rewritten:"]
    for node, where in blockers[:20]:
        why = reasons.get(node.name, f"no rule handles {node.domain + '.' if node.domain else ''}{node.op} yet")
        lines.append(f"  - {where}{node.op} '{node.name}': {why}")
    if len(blockers) > 20:
        lines.append(f"  ... and {len(blockers) - 20} more")
    lines.append("Please report the pattern (with `trt-bridge convert --report`) so a rule can be added.")
    return "\n".join(lines)

