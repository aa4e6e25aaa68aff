"""Remove training and export leftovers from a graph before conversion.

``SANITIZE_PASSES`` is the explicit pipeline; each pass rewires edges of the main
graph (subgraphs of If/Loop/Scan are left as they are) and returns one ``Change``
per node it rewrote. ``sanitize`` runs them, removing what each left dead.
Graph outputs keep their names and types through every pass.

Opset upgrades, dropping unused opset imports and constant folding are done
elsewhere (``ir.finalize.finalize``, ``ir.model``'s per-axis Q/DQ upgrade at load, and
onnx-graphsurgeon's ``fold_constants`` in ``lift.pipeline``).
"""

from __future__ import annotations

from typing import Protocol

import onnx_graphsurgeon as gs

# Change (pass_name, node, what: one human-readable line) lives in its own module so that the
# passes, which import it, do not import this package's pipeline in a cycle.
from trt_bridge.prepare.cast_chain import FoldCastChains
from trt_bridge.prepare.change import Change
from trt_bridge.prepare.dropout import RemoveDropout
from trt_bridge.prepare.global_pool import GlobalAveragePool
from trt_bridge.prepare.identity import RemoveIdentity
from trt_bridge.prepare.ort_fused import DefuseOrtOps
from trt_bridge.prepare.qdq_domain import StandardQDQDomain
from trt_bridge.prepare.qdq_float_types import AgreeQDQFloatTypes
from trt_bridge.prepare.squeeze_axes import SqueezeAxes


class SanitizePass(Protocol):
    """One kind of leftover removed from the main graph.

    ``apply`` only rewires edges (dead nodes go in ``sanitize``'s cleanup) and returns
    what it changed. Where it leaves a node it would remove (a Dropout whose mask has
    no static shape), it logs a warning on ``trt_bridge.prepare`` naming the node.
    """

    name: str

    def apply(self, graph: gs.Graph) -> list[Change]: ...


#: In order:
#: - StandardQDQDomain names vendor-domain QuantizeLinear/DequantizeLinear (com.microsoft, AMD Quark's
#:   Extended*) as the standard ops they compute, for every rule after it.
#: - DefuseOrtOps writes onnxruntime's fused com.microsoft transformer ops (SkipLayerNormalization,
#:   Gelu, FastGelu, ...) back as the standard ops they stand for.
#: - RemoveDropout first: a Dropout between two Casts or two Identities hides the chain
#:   from the later passes; where it must keep a graph output fed by a graph input it
#:   becomes an Identity, which RemoveIdentity then judges like any other.
#: - FoldCastChains looks through Identity nodes itself, so it needs no pass before it
#:   but RemoveDropout.
#: - AgreeQDQFloatTypes after it (its Casts folded first): a widening Cast after a DequantizeLinear moves into it,
#:   and a Q/DQ pair whose scales differ in type gets one type, so the lift reads each pair as one float tensor
#:   feeding the op that consumes it (a model with float16 and float32 regions, ModelOpt's FP8 export).
#: - GlobalAveragePool writes an AveragePool whose window covers its whole input as the global op
#:   (an exporter's idiom that TensorRT refuses for windows of 100,000 elements or more).
#: - SqueezeAxes writes the axes of a Squeeze without them (opset 9/11 exports) from the inferred shape: TensorRT
#:   fixes ranks when it builds and refuses such a Squeeze on dynamic shapes.
#: - RemoveIdentity last: it collapses the Identity chains left by the exporter and by
#:   the passes above, and decides alone how a graph output keeps its name.
#: The type passes (``types.py``: bfloat16 rewriting, then a Cast wherever inputs contradict
#: their op's schema) work on the ModelProto and run before these (``prepare.model.prepare``), so
#: FoldCastChains also sees the Casts they insert.
SANITIZE_PASSES: tuple[SanitizePass, ...] = (
    StandardQDQDomain(),
    DefuseOrtOps(),
    RemoveDropout(),
    FoldCastChains(),
    AgreeQDQFloatTypes(),
    GlobalAveragePool(),
    SqueezeAxes(),
    RemoveIdentity(),
)


def sanitize(graph: gs.Graph, passes: tuple[SanitizePass, ...] = SANITIZE_PASSES) -> list[Change]:
    """Apply ``passes`` to ``graph`` in place, in order; return every change they made.

    Each pass sees a graph without the nodes the ones before it left dead (an Identity
    chain a folded Cast no longer reads is not reported as removed by RemoveIdentity).
    """
    changes: list[Change] = []
    for sanitize_pass in passes:
        changes.extend(sanitize_pass.apply(graph))
        graph.cleanup(remove_unused_graph_inputs=False)
    graph.toposort()
    return changes


__all__ = ["SANITIZE_PASSES", "AgreeQDQFloatTypes", "Change", "DefuseOrtOps", "FoldCastChains", "GlobalAveragePool",
           "RemoveDropout", "RemoveIdentity", "SanitizePass", "SqueezeAxes", "StandardQDQDomain", "sanitize"]
