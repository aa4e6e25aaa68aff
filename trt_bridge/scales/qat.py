"""Import the trained scales of a QAT Q/DQ export onto the model being converted.

A QAT export (NVIDIA ModelOpt, pytorch-quantization, torch.ao QAT, or any QDQ model)
is the same network as the model being converted (its float export, or onnxruntime's
``quantize_dynamic`` output of it), with its scales written as Q/DQ pairs::

    QAT export:   x ─ Q(s, z) ─ DQ(s, z) ─ Conv ─ …      target (float):    x ─ Conv ─ …
                  W_q:int8 ─ DQ(s_w, axis) ─┘                                W ─┘
                  (or W:float ─ Q ─ DQ, fake-quantized)  target (dynamic):  x ─ DynamicQuantizeLinear ─ ConvInteger ─ …
                                                                             W_quantized:int8 ────────────┘
    result:       x  → activation amax = covering_scale(s, z)·127
                  the target's Conv node → weight amax = s_w·127 per output channel

Keys of the returned :class:`ScaleTable` (what an integrator looks up in the lifted graph)
    ``kind="activation"``: ``tensor`` is a float tensor name of the target, the one that
        reaches the weighted op (for a dynamic target: the input of DynamicQuantizeLinear,
        for a QDQ target: the input of its QuantizeLinear). Lifting keeps that name, so it is
        the key of ``Annotations.activations``. Dict key: the tensor name.
    ``kind="weight"``: ``tensor`` is ``"<node>:weight"`` (:func:`weight_key`; :func:`weight_node`
        reads it back), where ``<node>`` is the NAME OF THE TARGET'S WEIGHTED NODE (Conv, MatMul,
        Gemm, ConvInteger, MatMulInteger, DynamicQuantizeMatMul, …), and ``axis`` is the output-
        channel axis of that node's weight as the target stores it (``lift.weights.weight_axis``).
        Weights are keyed by node because dynamic targets rename them (``W_quantized``) and
        lifting makes new float weights, while every lift records the source node as
        ``WeightSpec.origin`` (a float source's placement uses the node itself). The ``:weight``
        suffix keeps a node and a tensor of one name (``fc``) apart in the one table.
    Unnamed target nodes are named the way ``prepare.model.prepare`` names them (``<op>_<index>``).

amax values: activations per tensor (``float``); weights a ``tuple`` per output channel,
or a ``float`` when the QAT weight was quantized per tensor. An asymmetric or uint8 zero
point becomes the symmetric amax covering the same range (``lift.qdq_pair.covering_scale``).

Matching, for every weighted op (Conv, ConvTranspose, MatMul, Gemm with a constant weight;
and ConvInteger, MatMulInteger, DynamicQuantizeMatMul, MatMulIntegerToFloat) of both graphs:

1. by name: an activation whose float tensor name equals a target float tensor's; an op whose
   weight name, else node name, equals a target op's (with the same signature, below). Names
   compare after stripping the exporters' suffixes ``_quantized``, ``_DequantizeLinear_Output``,
   ``_QuantizeLinear_Output``, ``_DequantizeLinear``, ``_QuantizeLinear``, ``_dequantized``,
   ``_fake_quant``, ``_int8``, ``_quant`` (onnxruntime's dynamic node names); prefixes (name
   scopes such as ``exported/``) are kept. Counter names, which shift when an exporter adds
   nodes, never match by name: ``onnx::Conv_12``, ``123``, ``input.4``, and node names
   ``<OpType>_<n>``.
2. by structure, for the ops left: the signature of a weighted op is its family (conv,
   conv-transpose, matmul: Gemm and the integer ops included) and its weight shape as
   ``[in, out]`` for matmuls (a Gemm ``transB`` weight is transposed for the comparison). The
   i-th remaining QAT op of a signature, in graph (topological) order, matches the i-th
   remaining target op of that signature when both have equally many; otherwise all of them
   are ambiguous (nothing applied). A matched op maps its QAT input activation to the target
   op's input activation (how: ``"structure"``) and its QAT weight scales to the target node;
   an activation whose ambiguous ops all read one and the same target tensor still maps to it.

Both graphs are read after folding constant subgraphs (a Reshape or Transpose of a weight), as
convert folds them before lifting; neither model is changed.

Limits: activations quantized only on non-weighted ops (a residual Add input) match by name
only; an op whose weight is not a constant (after DQ / Q→DQ / one Transpose) is not a
weighted op; per-axis activation scales and blocked weight quantization are skipped (noted in
``MatchReport.notes``); a QAT weight quantized per channel on an axis other than the output
channels is imported as its covering per-tensor amax (noted); QOperator targets are not read.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.deferred import import_graph
from trt_bridge.ir.model import load_model
from trt_bridge.scales.qat_graph import (
    WeightedOp,
    activation_amax,
    float_tensors,
    folded,
    is_stable,
    normalized,
    weight_amax,
    weighted_ops,
)
from trt_bridge.scales.table import ScaleEntry, ScaleTable

WEIGHT_SUFFIX = ":weight"


def weight_key(node: str) -> str:
    """The ScaleTable key (and ``ScaleEntry.tensor``) of the weight of the target's weighted node ``node``."""
    return f"{node}{WEIGHT_SUFFIX}"


def weight_node(key: str) -> str | None:
    """The weighted node a :func:`weight_key` names; None for any other key."""
    return key[: -len(WEIGHT_SUFFIX)] if key.endswith(WEIGHT_SUFFIX) and len(key) > len(WEIGHT_SUFFIX) else None


@dataclass
class MatchReport:
    """What :func:`import_qat` matched. Every QAT-quantized tensor whose scale can be read is in one
    list (an activation that matched ops map to several target tensors is in ``matched`` once per
    target tensor); those whose scale cannot be used are in ``notes``. Truthy when nothing is
    unmatched or ambiguous."""

    matched: list[tuple[str, str, str]] = field(default_factory=list)  # (qat tensor, target key, "name"|"structure")
    unmatched: list[str] = field(default_factory=list)  # QAT quantized tensors with no counterpart in the target
    ambiguous: list[tuple[str, list[str]]] = field(default_factory=list)  # QAT tensor → candidates (none applied)
    notes: list[str] = field(default_factory=list)  # conversions and skips worth knowing

    def __bool__(self) -> bool:
        return not self.unmatched and not self.ambiguous

    def summary(self) -> str:
        by = defaultdict(int)
        for _, _, how in self.matched:
            by[how] += 1
        lines = [f"QAT scales: {len(self.matched)} matched ({by['name']} by name, {by['structure']} by structure), "
                 f"{len(self.unmatched)} unmatched, {len(self.ambiguous)} ambiguous (not applied)"]
        if self.unmatched:
            lines.append("  unmatched: " + ", ".join(self.unmatched[:20])
                         + (f" ... and {len(self.unmatched) - 20} more" if len(self.unmatched) > 20 else ""))
        for qat, candidates in self.ambiguous[:20]:
            lines.append(f"  ambiguous: {qat} → one of {', '.join(candidates)}")
        lines += [f"  note: {n}" for n in self.notes[:20]]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"matched": [{"qat": q, "target": t, "how": h} for q, t, h in self.matched],
                "unmatched": list(self.unmatched),
                "ambiguous": [{"qat": q, "candidates": list(c)} for q, c in self.ambiguous],
                "notes": list(self.notes)}



def import_qat(qat: str | Path | onnx.ModelProto, target: onnx.ModelProto) -> tuple[ScaleTable, MatchReport]:
    """Scales of the QAT export ``qat`` for the tensors of ``target`` (the model being converted, as loaded)."""
    if isinstance(qat, onnx.ModelProto):
        where, qat_model = qat.graph.name or "qat-model", qat
    else:
        where, qat_model = str(qat), load_model(qat)
    qat_graph = folded(gs.import_onnx(qat_model))
    report = MatchReport()
    act_amax, qat_ops = activation_amax(qat_graph, report.notes), weighted_ops(qat_graph)
    if not act_amax and not any(op.weight_dq is not None for op in qat_ops):
        raise TrtBridgeError(f"{where}: no QuantizeLinear/DequantizeLinear with constant scales found; this is "
                             "not a QAT Q/DQ export. Export the QAT model with its quantizers (e.g. ModelOpt's "
                             "or pytorch-quantization's ONNX export), or calibrate instead.")
    return _Matcher(where, qat_ops, folded(import_graph(target)), act_amax, report).run()


class _Matcher:
    def __init__(self, where: str, qat_ops: list[WeightedOp], target: gs.Graph, act_amax: dict[str, float],
                 report: MatchReport):
        self.where, self.report, self.act_amax = where, report, act_amax
        self.qat_ops, self.target_ops = qat_ops, weighted_ops(target)
        self.target_floats = float_tensors(target)
        self.entries: dict[str, ScaleEntry] = {}

    def run(self) -> tuple[ScaleTable, MatchReport]:
        pairs, ambiguous = self._match_ops()
        self._weights(pairs, ambiguous)
        self._activations(pairs, ambiguous)
        return ScaleTable(self.entries), self.report

    # --- ops -------------------------------------------------------------------------------------
    def _match_ops(self) -> tuple[dict[int, tuple[WeightedOp, str]], dict[int, list[WeightedOp]]]:
        """QAT op index → (target op, how), and QAT op index → equally good target ops."""
        by_weight, by_node = defaultdict(list), defaultdict(list)
        for t in self.target_ops:
            if is_stable(t.weight):
                by_weight[(normalized(t.weight), t.signature)].append(t)
            if is_stable(t.node, t.op):
                by_node[(normalized(t.node), t.signature)].append(t)
        pairs: dict[int, tuple[WeightedOp, str]] = {}
        taken: set[str] = set()
        for i, q in enumerate(self.qat_ops):
            for index, key in ((by_weight, q.weight if is_stable(q.weight) else None),
                               (by_node, q.node if is_stable(q.node, q.op) else None)):
                found = [t for t in index.get((normalized(key), q.signature), []) if t.node not in taken] \
                    if key else []
                if len(found) == 1:
                    pairs[i] = (found[0], "name")
                    taken.add(found[0].node)
                    break
        left_q, left_t = defaultdict(list), defaultdict(list)
        for i, q in enumerate(self.qat_ops):
            if i not in pairs:
                left_q[q.signature].append(i)
        for t in self.target_ops:
            if t.node not in taken:
                left_t[t.signature].append(t)
        ambiguous: dict[int, list[WeightedOp]] = {}
        for signature, indices in left_q.items():
            candidates = left_t.get(signature, [])
            if len(candidates) == len(indices):
                pairs.update((i, (t, "structure")) for i, t in zip(indices, candidates))
            elif candidates:
                ambiguous.update((i, candidates) for i in indices)
        return pairs, ambiguous

    # --- weights ---------------------------------------------------------------------------------
    def _weights(self, pairs, ambiguous) -> None:
        for i, q in enumerate(self.qat_ops):
            if q.weight_dq is None:
                continue  # the QAT left this weight in float
            if i in ambiguous:
                self.report.ambiguous.append((q.weight, [weight_key(t.node) for t in ambiguous[i]]))
                continue
            if i not in pairs:
                self.report.unmatched.append(q.weight)
                continue
            amax = weight_amax(q, self.report.notes)
            if amax is None:
                continue
            t, how = pairs[i]
            values, per_channel = amax
            key = weight_key(t.node)
            self.entries[key] = ScaleEntry(key, values, t.axis if per_channel else None, "weight",
                                           f"qat:{self.where}#{q.weight}")
            self.report.matched.append((q.weight, key, how))

    # --- activations -----------------------------------------------------------------------------
    def _activations(self, pairs, ambiguous) -> None:
        by_normalized = defaultdict(set)
        for name in self.target_floats:
            by_normalized[normalized(name)].add(name)
        through_ops, candidates = defaultdict(set), defaultdict(set)
        for i, q in enumerate(self.qat_ops):
            if i in pairs:
                through_ops[q.activation].add(pairs[i][0].activation)
            elif i in ambiguous:
                candidates[q.activation].update(t.activation for t in ambiguous[i])
        applied: dict[str, str] = {}  # target tensor → the QAT tensor whose amax it holds
        for x, amax in self.act_amax.items():
            named = None
            if is_stable(x):
                named = {x} if x in self.target_floats else by_normalized.get(normalized(x), set())
            if named and len(named) == 1:
                self._apply(x, next(iter(named)), amax, "name", applied)
                structural = through_ops.get(x, set()) - named
                if structural:
                    self.report.notes.append(f"'{x}' matched '{next(iter(named))}' by name; structure pointed at "
                                             f"{', '.join(sorted(structural))} (not applied)")
            elif through_ops.get(x):
                for target in sorted(through_ops[x]):
                    self._apply(x, target, amax, "structure", applied)
            elif named or len(candidates.get(x, ())) > 1:
                self.report.ambiguous.append((x, sorted(named or candidates[x])))
            elif candidates.get(x):  # every candidate op reads the same tensor: no doubt about it
                self._apply(x, next(iter(candidates[x])), amax, "structure", applied)
            else:
                self.report.unmatched.append(x)

    def _apply(self, qat_tensor: str, target: str, amax: float, how: str, applied: dict[str, str]) -> None:
        self.report.matched.append((qat_tensor, target, how))
        if target in applied:  # two QAT tensors land on one target tensor: the larger amax clips neither
            self.report.notes.append(f"'{target}' gets the amax of both '{applied[target]}' and '{qat_tensor}'; "
                                     "the largest is kept")
            if amax <= float(self.entries[target].amax):
                return
        self.entries[target] = ScaleEntry(target, float(amax), None, "activation", f"qat:{self.where}#{qat_tensor}")
        applied[target] = qat_tensor
