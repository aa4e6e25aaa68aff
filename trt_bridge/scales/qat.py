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
        channel axis of that node's weight as the target stores it (``placement.weight_axis``).
        Weights are keyed by node because dynamic targets rename them (``W_quantized``) and
        lifting makes new float weights, while every lift records the source node as
        ``WeightSpec.origin`` (a float source's placement uses the node itself). The ``:weight``
        suffix keeps a node and a tensor of one name (``fc``) apart in the one table.
    Unnamed target nodes are named the way ``convert.prepare`` names them (``<op>_<index>``).

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

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trt_bridge.annotations import QMAX
from trt_bridge.lift.qdq_pair import covering_scale
from trt_bridge.lift.scale_algebra import constant_values, quantizer_zero_point
from trt_bridge.lift.weights import weight_axis
from trt_bridge.scales.table import ScaleEntry, ScaleTable

#: weighted op type → (family, the float op whose weight layout it shares)
WEIGHTED_OPS = {
    "Conv": ("conv", "Conv"), "ConvInteger": ("conv", "Conv"),
    "ConvTranspose": ("conv-transpose", "ConvTranspose"),
    "MatMul": ("matmul", "MatMul"), "Gemm": ("matmul", "Gemm"), "MatMulInteger": ("matmul", "MatMul"),
    "DynamicQuantizeMatMul": ("matmul", "MatMul"), "MatMulIntegerToFloat": ("matmul", "MatMul"),
}
WEIGHT_INPUT = 1  # the weight is input 1 of every op above
WEIGHT_SUFFIX = ":weight"
NAME_SUFFIXES = ("_DequantizeLinear_Output", "_QuantizeLinear_Output", "_DequantizeLinear", "_QuantizeLinear",
                 "_dequantized", "_quantized", "_fake_quant", "_int8", "_quant")
_COUNTER_NAME = re.compile(r"onnx::.*|\d+|[A-Za-z_]\w*\.\d+")
_INTEGER_PRODUCERS = {"QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearConv",
                      "QLinearMatMul"}


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


@dataclass
class _Op:
    """A weighted op: a node with a constant weight."""

    node: str  # the node's name (generated as convert names it when empty)
    op: str
    signature: tuple
    weight: str  # the weight constant's name (before any DQ / Q / Transpose)
    activation: str  # the float tensor that reaches input 0 (through DQ←Q or DynamicQuantizeLinear)
    axis: int  # output-channel axis of the weight as the node sees it
    weight_dq: gs.Node | None = None
    perm: list[int] | None = None  # a Transpose between the DQ and the node


def import_qat(qat: str | Path | onnx.ModelProto, target: onnx.ModelProto) -> tuple[ScaleTable, MatchReport]:
    """Scales of the QAT export ``qat`` for the tensors of ``target`` (the model being converted, as loaded)."""
    if isinstance(qat, onnx.ModelProto):
        where, qat_model = qat.graph.name or "qat-model", qat
    else:
        from trt_bridge.ir.model import load_model

        where, qat_model = str(qat), load_model(qat)
    qat_graph = _folded(gs.import_onnx(qat_model))
    report = MatchReport()
    act_amax, qat_ops = _activation_amax(qat_graph, report), _weighted_ops(qat_graph)
    if not act_amax and not any(op.weight_dq is not None for op in qat_ops):
        from trt_bridge.errors import TrtBridgeError

        raise TrtBridgeError(f"{where}: no QuantizeLinear/DequantizeLinear with constant scales found; this is "
                             "not a QAT Q/DQ export. Export the QAT model with its quantizers (e.g. ModelOpt's "
                             "or pytorch-quantization's ONNX export), or calibrate instead.")
    return _Matcher(where, qat_ops, _folded(gs.import_onnx(target)), act_amax, report).run()


def _folded(graph: gs.Graph) -> gs.Graph:
    """``graph`` with constant subgraphs (a Reshape/Transpose of a weight) folded, as convert folds them
    before lifting; Q/DQ stay. Node names are fixed first: generated names count the nodes as loaded."""
    from trt_bridge.convert import fold_constants, unique_node_names

    for node, name in zip(graph.nodes, unique_node_names([(n.name, n.op) for n in graph.nodes])):
        node.name = name
    fold_constants(graph)
    return graph


def _producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def normalized(name: str) -> str:
    """``name`` without the exporters' quantization suffixes (NAME_SUFFIXES)."""
    stripped = True
    while stripped:
        stripped = False
        for suffix in NAME_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)], True
    return name


def _stable(name: str, op: str | None = None) -> bool:
    """Whether ``name`` says what the tensor/node is (not an exporter's counter)."""
    if not name or _COUNTER_NAME.fullmatch(name):
        return False
    return op is None or not re.fullmatch(rf"{re.escape(op)}_\d+", name)


def _float_source(tensor: gs.Tensor) -> tuple[gs.Tensor, gs.Node | None]:
    """The float tensor that ``tensor`` (an op's activation input) quantizes, and the QuantizeLinear if any."""
    node = _producer(tensor)
    if node is not None and node.op == "DequantizeLinear" and constant_values(node.inputs[0]) is None:
        q = _producer(node.inputs[0])
        if q is not None and q.op == "QuantizeLinear":
            return q.inputs[0], q
    if node is not None and node.op == "DynamicQuantizeLinear" and tensor is node.outputs[0]:
        return node.inputs[0], None
    return tensor, None


def _constant_shape(tensor: gs.Tensor) -> tuple[int, ...] | None:
    if isinstance(tensor, gs.Constant):
        return tuple(int(d) for d in tensor.shape)
    values = constant_values(tensor)
    return None if values is None else tuple(values.shape)


def _weight(tensor: gs.Tensor) -> tuple[gs.Tensor, tuple[int, ...], gs.Node | None, list[int] | None] | None:
    """(weight constant, shape as the op sees it, its DequantizeLinear, a Transpose's perm) or None."""
    perm, transposed = None, False
    node = _producer(tensor)
    if node is not None and node.op == "Transpose":
        tensor, perm, transposed = node.inputs[0], node.attrs.get("perm"), True
        node = _producer(tensor)
    dq = None
    if node is not None and node.op == "DequantizeLinear":
        dq, tensor = node, node.inputs[0]
        q = _producer(tensor)
        if q is not None and q.op == "QuantizeLinear":
            tensor = q.inputs[0]
    shape = _constant_shape(tensor)
    if shape is None:
        return None
    if transposed:
        perm = list(range(len(shape)))[::-1] if perm is None else perm
        perm = [int(p) % len(shape) for p in perm]
        shape = tuple(shape[p] for p in perm)
    return tensor, shape, dq, perm


def _weighted_ops(graph: gs.Graph) -> list[_Op]:
    """The weighted ops of a :func:`_folded` graph (whose nodes all have unique names)."""
    ops = []
    for node in graph.nodes:
        if node.op not in WEIGHTED_OPS or len(node.inputs) <= WEIGHT_INPUT:
            continue
        found = _weight(node.inputs[WEIGHT_INPUT])
        if found is None:
            continue  # activation × activation
        weight, shape, dq, perm = found
        family, float_op = WEIGHTED_OPS[node.op]
        norm = shape
        if node.op == "Gemm" and node.attrs.get("transB", 0) and len(shape) == 2:
            norm = (shape[1], shape[0])  # compare as [in, out], like MatMul
        axis = weight_axis(gs.Node(float_op, attrs=dict(node.attrs)), len(shape))
        ops.append(_Op(node.name, node.op, (family, norm), weight.name,
                       _float_source(node.inputs[0])[0].name, axis, dq, perm))
    return ops


def _activation_amax(graph: gs.Graph, report: MatchReport) -> dict[str, float]:
    """Float tensor entering each activation QuantizeLinear → the symmetric amax covering its codes."""
    amax: dict[str, float] = {}
    for node in graph.nodes:
        if node.op != "QuantizeLinear" or constant_values(node.inputs[0]) is not None:
            continue
        if not any(c.op == "DequantizeLinear" for c in node.outputs[0].outputs):
            continue
        scale, zp = constant_values(node.inputs[1]), quantizer_zero_point(node)
        x = node.inputs[0].name
        if scale is None or zp is None:
            report.notes.append(f"QuantizeLinear '{node.name}' of '{x}': scale/zero point not constant, skipped")
            continue
        if scale.size != 1 or zp.size != 1:
            report.notes.append(f"QuantizeLinear '{node.name}' of '{x}': per-axis activation scale, skipped")
            continue
        value = covering_scale(float(scale.reshape(())), zp.reshape(())) * QMAX
        if not (np.dtype(zp.dtype) == np.int8 and int(zp.reshape(())) == 0):
            report.notes.append(f"'{x}': {zp.dtype} zero point {int(zp.reshape(()))} → covering amax {value:.6g}")
        if x in amax and amax[x] != value:
            report.notes.append(f"'{x}' is quantized by several QuantizeLinear nodes; the largest amax is kept")
        amax[x] = max(amax.get(x, 0.0), value)
    return amax


def _weight_amax(op: _Op, report: MatchReport) -> tuple[float | tuple[float, ...], bool] | None:
    """The QAT op's weight amax (per output channel when possible) and whether it is per channel."""
    dq = op.weight_dq
    if dq.attrs.get("block_size", 0):
        report.notes.append(f"weight '{op.weight}': blocked quantization, skipped")
        return None
    scale = constant_values(dq.inputs[1])
    zp = quantizer_zero_point(dq)
    source = _producer(dq.inputs[0])
    if source is not None and source.op == "QuantizeLinear" and not (len(dq.inputs) > 2 and dq.inputs[2].name):
        zp = quantizer_zero_point(source)  # the DQ's own input type is unknown without shape inference
    if scale is None or zp is None:
        report.notes.append(f"weight '{op.weight}': scale/zero point not constant, skipped")
        return None
    scale = scale.astype(np.float64).reshape(-1)
    zps = np.broadcast_to(zp.reshape(-1), scale.shape)
    amax = [covering_scale(float(s), np.asarray(z, zp.dtype)) * QMAX for s, z in zip(scale, zps)]
    if scale.size == 1:
        return amax[0], False
    rank = len(op.signature[1])
    axis = int(dq.attrs.get("axis", 1)) % max(rank, 1)
    if op.perm is not None:
        axis = op.perm.index(axis)
    if axis != op.axis:
        report.notes.append(f"weight '{op.weight}': per-channel scales on axis {axis}, not the output channels "
                            f"(axis {op.axis}); imported per tensor (their maximum)")
        return max(amax), False
    return tuple(amax), True


class _Matcher:
    def __init__(self, where: str, qat_ops: list[_Op], target: gs.Graph, act_amax: dict[str, float],
                 report: MatchReport):
        self.where, self.report, self.act_amax = where, report, act_amax
        self.qat_ops, self.target_ops = qat_ops, _weighted_ops(target)
        self.target_floats = _float_tensors(target)
        self.entries: dict[str, ScaleEntry] = {}

    def run(self) -> tuple[ScaleTable, MatchReport]:
        pairs, ambiguous = self._match_ops()
        self._weights(pairs, ambiguous)
        self._activations(pairs, ambiguous)
        return ScaleTable(self.entries), self.report

    # --- ops -------------------------------------------------------------------------------------
    def _match_ops(self) -> tuple[dict[int, tuple[_Op, str]], dict[int, list[_Op]]]:
        """QAT op index → (target op, how), and QAT op index → equally good target ops."""
        by_weight, by_node = defaultdict(list), defaultdict(list)
        for t in self.target_ops:
            if _stable(t.weight):
                by_weight[(normalized(t.weight), t.signature)].append(t)
            if _stable(t.node, t.op):
                by_node[(normalized(t.node), t.signature)].append(t)
        pairs: dict[int, tuple[_Op, str]] = {}
        taken: set[str] = set()
        for i, q in enumerate(self.qat_ops):
            for index, key in ((by_weight, q.weight if _stable(q.weight) else None),
                               (by_node, q.node if _stable(q.node, q.op) else None)):
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
        ambiguous: dict[int, list[_Op]] = {}
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
            amax = _weight_amax(q, self.report)
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
            if _stable(x):
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


def _float_tensors(graph: gs.Graph) -> set[str]:
    """Names of the target's non-constant tensors that hold float values (unknown types count as float)."""
    names = {t.name for t in graph.inputs}
    for node in graph.nodes:
        if node.op in _INTEGER_PRODUCERS:
            continue
        for t in node.outputs:
            try:
                floating = t.dtype is None or np.issubdtype(np.dtype(t.dtype), np.floating)
            except TypeError:  # a type numpy does not know (bfloat16, float8): not an integer either
                floating = True
            if floating:
                names.add(t.name)
    return names
