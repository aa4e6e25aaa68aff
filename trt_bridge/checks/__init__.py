"""``trt-bridge check``: why TensorRT would not build a model as INT8, node by node, and what
``convert`` does about each reason.

Findings come from three sources, merged by node:

1. the static rules of :mod:`trt_bridge.checks.rules` (no TensorRT needed), plus impossible
   broadcasts (:mod:`trt_bridge.ir.shapes`) and bfloat16 tensors;
2. a dry run of convert's own preparation and lifting on the loaded model: type conflicts
   are found by the pass that fixes them, and each finding's "convert:" line says what that
   pass or lift rule did, or why it declined, so ``check`` and ``convert`` cannot disagree;
3. TensorRT's ONNX parser (``tensorrt`` or ``tensorrt_rtx``) when installed and ``--trt auto``:
   its message is attached to the finding for the same node, and a node only the parser
   rejects becomes a ``tensorrt-parser`` finding. The parser stops at the first node whose
   importer fails, so it names a subset of what the static rules find. It runs in a child
   process (:func:`trt_bridge.tensorrt.parse.parse_isolated`, about 0.2-0.4 s more): a parser
   that kills its process becomes a ``tensorrt-crash`` finding on the node it died on.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_bridge.calibrate import model_inputs, open_feeds
from trt_bridge.checks.findings import NEEDS_DATA, CheckReport, Finding, Severity, TensorInfo
from trt_bridge.checks.nvfp4 import fp4_activations
from trt_bridge.checks.rules import CHECK_RULES, is_int8, tensor_info
from trt_bridge.checks.targets import builder_views, model_formats, target_findings
from trt_bridge.checks.tensorrt_run import measure_costs, probe
from trt_bridge.errors import CalibrationDataError, UnsupportedPatternError
from trt_bridge.formats import INT8
from trt_bridge.ir.model import default_opset, load_model
from trt_bridge.ir.names import name_nodes
from trt_bridge.ir.shapes import BroadcastChecker
from trt_bridge.ir.size import RELEASE_BYTES, is_large, payload_bytes, release_memory
from trt_bridge.ir.values import check_source_values
from trt_bridge.lift import LIFT_RULES
from trt_bridge.lift.pipeline import lift_graph
from trt_bridge.lower.layer_precisions import layer_precisions
from trt_bridge.prepare.model import prepare
from trt_bridge.prepare.types import Bf16Policy, feed_types
from trt_bridge.tensorrt.costs import COST_TARGET
from trt_bridge.tensorrt.profiles import Profile

log = logging.getLogger("trt_bridge.checks")

#: What each lift rule makes of the nodes it rewrites (the "convert:" line of a finding): the rules' own words.
LIFT_OUTCOMES = {rule.name: rule.outcome for rule in LIFT_RULES if rule.outcome is not None}
ABSORBED = "removed by lifting (the rule that rewrote its consumers took it in)"


class TrtProbe(str, enum.Enum):
    AUTO = "auto"  # run TensorRT's parser when tensorrt or tensorrt_rtx is installed
    OFF = "off"  # static rules only


@dataclass(frozen=True)
class CheckOptions:
    trt: TrtProbe = TrtProbe.AUTO
    data: str | None = None  # feeds (as --calib-data takes them) to check against the model's inputs and broadcasts
    plugins: tuple[str, ...] = ()  # plugin files TensorRT's parser needs registered (--plugins)
    #: measure the engine's size and activation memory for this compute capability (an ahead-of-time build with
    #: TensorRT-RTX, where the parser takes the model); None: not measured
    costs: str | None = COST_TARGET
    #: the GPU the model must run on (--compute-capability): a precision it cannot run (FP8 below 8.9, FP4 below
    #: 10.0) is a blocker naming it; None: the ``costs`` target (checks/targets.py)
    compute_capability: str | None = None
    #: the shapes of the ``costs`` build (--shapes, --min/--opt/--max-shapes); (): a decoder's prefill and decode
    #: profiles, else 1 for each dynamic dimension (tensorrt/decoder_profiles.py)
    profiles: tuple[Profile, ...] = ()

    @classmethod
    def for_target(cls, target: str | None) -> CheckOptions:
        """The defaults, held to ``target`` (``convert --compute-capability``) and building costs for it."""
        return cls(costs=target, compute_capability=target) if target else cls()


def check_model(path: str | Path, options: CheckOptions = CheckOptions()) -> CheckReport:
    """Check the model at ``path``; raise TrtBridgeError only when it cannot be read at all."""
    import onnx_graphsurgeon as gs


    start = time.perf_counter()
    path = Path(path)
    declared: dict[str, int] = {}
    repairs: list[str] = []
    model = load_model(path, declared, repairs)
    name_nodes(model)
    node_names = [n.name for n in model.graph.node]  # the parser names nodes by index when they have no name
    opset = default_opset(model)
    graph = gs.import_onnx(model)
    findings = [Finding("invalid-onnx", Severity.BLOCKER, "", "", [], "not valid ONNX, though onnxruntime runs it; "
                        "TensorRT's parser rejects it", what, True) for what in repairs]
    for node in graph.nodes:
        for rule in CHECK_RULES:
            found = rule.find(node, graph, opset)
            if found is not None:
                findings.append(found)
    int8 = is_int8(graph)

    precisions = None if is_large(model) else layer_precisions(model)

    broadcasts = BroadcastChecker(model)  # one skeleton and cache for the model's own shapes and the feeds'
    findings += _broadcasts(broadcasts)
    if options.data is not None:
        findings += _feeds(model, options.data, broadcasts)
    bf16 = _bf16_tensors(graph)
    ops = {n.name: n for n in graph.nodes}
    del graph
    findings += _source_scales(model, path, ops)
    findings = _dry_run(model, path, findings, ops, declared)
    findings += _bf16(bf16, int8 and not any(f.severity is Severity.BLOCKER for f in findings))
    if not int8:
        findings.append(Finding("not-int8", Severity.BLOCKER, "", "", [], "nothing is quantized: TensorRT builds the "
                                "model in floating point", "quantizes it with --int8 --calib-data DATA (TensorRT "
                                "placement, calibrated activation scales, per-channel weights)", True))
    target = options.compute_capability or options.costs
    beyond = target_findings(model_formats(model, precisions), target, precisions is not None)
    findings += beyond
    report = CheckReport(str(path), opset, int8, findings, precisions=precisions,
                         fp4_activations=fp4_activations(model))
    if options.trt is TrtProbe.AUTO:
        # TensorRT's parser reads the model from disk and its builder holds the weights again: the loaded model and
        # its graph go first (a 0.9 GB output was held three times over while its engine's costs were measured)
        nodes = {name: (node.op, [tensor_info(t) for t in node.inputs if t.name]) for name, node in ops.items()}
        large = payload_bytes(model) >= RELEASE_BYTES
        del model, ops, broadcasts
        if large:
            release_memory()
        report.parser = probe(path, report, node_names, nodes, options.plugins)
        if options.costs and report.parser is not None and report.parser.ok and not beyond:
            report.costs = measure_costs(path, options.costs, report, options.plugins, options.profiles)
    report.builders = builder_views(precisions, report.parser.module if report.parser else None, target,
                                    options.compute_capability)
    report.seconds = time.perf_counter() - start
    return report


def _bf16_tensors(graph) -> list:
    from onnx import TensorProto

    return [tensor_info(t) for t in graph.tensors().values() if t.dtype == TensorProto.BFLOAT16]


def _bf16(tensors: list, ready: bool) -> list[Finding]:
    if not tensors:
        return []
    if ready:  # bfloat16 chosen for the layers INT8 leaves alone (convert --high-precision bf16)
        return [Finding("bf16", Severity.WARNING, "", "", tensors[:5],
                        f"{len(tensors)} bfloat16 tensor(s): TensorRT runs bfloat16 layers on compute capability 8.0 "
                        "and newer only; onnxruntime's CPU provider has none (verify runs them emulated in float32)",
                        "keeps them (they are its --high-precision bf16); for GPUs older than compute capability "
                        "8.0, convert the source with --high-precision fp16 or fp32 instead", True)]
    return [Finding("bf16", Severity.WARNING, "", "", tensors[:5],
                    f"{len(tensors)} bfloat16 tensor(s): TensorRT runs bfloat16 on compute capability 8.0 and newer "
                    "only, and onnxruntime's CPU provider (calibration) has no bfloat16 kernels",
                    "--bf16 fp32 (the default) rewrites them to float32, exactly; --bf16 fp16 or keep", True)]


def _feeds(model, data: str, broadcasts) -> list[Finding]:
    """Every feed of ``data`` against the model's inputs and what they imply for each broadcasting node."""

    try:  # the feeds convert would take: bfloat16 inputs become float32 (--bf16's default)
        for _ in open_feeds(data, None, feed_types(model_inputs(model), Bf16Policy.FP32), model=broadcasts,
                            flag="check reads at most that many"):
            pass
    except CalibrationDataError as exc:
        return [Finding("feed", Severity.BLOCKER, "", "", [], str(exc),
                        "the data, not the model, is wrong: give each input the shape and type the model declares",
                        False)]
    return []


def _broadcasts(broadcasts) -> list[Finding]:
    findings = []
    for conflict in broadcasts.conflicts():
        findings.append(Finding(
            "broadcast", Severity.BLOCKER, conflict.node, conflict.op,
            [TensorInfo(name, "?", None if shape is None else list(shape))
             for name, shape in zip(conflict.inputs, conflict.shapes)],
            f"input shapes cannot broadcast: {conflict.message()}",
            "the graph itself is inconsistent; fix the shapes in the exporter (or the model's declared input "
            "shapes) and re-export", False))
    return findings


def _dry_run(model, path: Path, findings: list[Finding], ops: dict, declared: dict[str, int]) -> list[Finding]:
    """Run convert's preparation and lifting on ``model`` (consumed); fill in each finding's fix."""

    try:
        prepared = prepare(model, path, declared=declared)
    except UnsupportedPatternError as exc:
        message = str(exc).split(": ", 1)[-1]
        for finding in findings:
            if not finding.fix:
                finding.fix = f"convert stops before this: {message}"
        node = ops.get(getattr(exc, "node", None) or "") or _node_named_in(message, ops)
        findings.append(Finding("type-mismatch", Severity.BLOCKER, node.name if node else "", node.op if node else "",
                                [tensor_info(t) for t in node.inputs] if node else [], "the input types contradict "
                                "the op's schema and no cast resolves it", message, False))
        return findings
    for change in prepared:
        if change.pass_name in ("types", "pad-code") and change.node in ops:
            node = ops[change.node]
            findings.append(Finding("type-mismatch", Severity.BLOCKER, node.name, node.op,
                                    [tensor_info(t) for t in node.inputs if t.name],
                                    "the input types contradict the op's schema: onnxruntime finds no kernel and "
                                    "TensorRT's strongly typed network rejects the node", change.what, True))
    if all(f.fix or not f.node for f in findings):
        return findings  # nothing left to explain: lifting (the slow part of the dry run) is not needed
    lifting = lift_graph(model, path, prepared=prepared)
    by_node: dict[str, list] = {}
    for change in lifting.changes:
        by_node.setdefault(change.node, []).append(change)
    fired = {node: rule for rule, nodes in lifting.ctx.fired.items() for node in nodes}
    declined = {d.node: d.reason for d in lifting.ctx.declined}
    approximated = {a.node: a.what for a in lifting.ctx.approximated if a.node in fired}
    left = {n.name: where for n, where in lifting.blockers}
    remaining = {n.name for n in lifting.graph.nodes}
    # weights lifting keeps in blocks or a format other than int8 (a rule's outcome line speaks of int8 per channel)
    narrow = {spec.origin: spec for spec in lifting.ctx.annotations.weights.values()
              if spec.block_size or spec.format is not INT8}
    for finding in findings:
        if finding.fix or not finding.node:
            continue
        sanitized = "; ".join(c.what for c in by_node.get(finding.node, []))
        if sanitized and finding.rule != "type-mismatch" and finding.node in fired:  # renamed, then lifted
            finding.fix = f"{sanitized}; then {LIFT_OUTCOMES.get(fired[finding.node], 'lifted')}"
            finding.fixable = True
        elif sanitized and finding.rule != "type-mismatch" and finding.node not in left:
            finding.fix, finding.fixable = sanitized, True
        elif finding.node in left and finding.rule == "contrib-op":
            finding.fix = (f"{declined.get(finding.node, f'no rule lifts {finding.op}')}: convert refuses a model "
                           "that holds it (TensorRT-RTX builds the model as it is: `trt-bridge build`)")
        elif finding.node in left:
            finding.fix = declined.get(finding.node, f"no rule lifts {finding.op}"
                                       + (f" in a control-flow body ({left[finding.node]})" if left[finding.node]
                                          else "") + "; please report the pattern")
        elif finding.node in approximated:
            finding.fix, finding.fixable = (f"lifted by rule '{fired[finding.node]}' to the nearest thing TensorRT "
                                            f"builds: {approximated[finding.node]}"), True
        elif finding.node in fired and finding.rule == "quantized-constant" \
                and fired[finding.node] == "dequantize-constant":
            finding.fix, finding.fixable = ("lifted by rule 'dequantize-constant': the scalar is dequantized to a "
                                            "float constant, which TensorRT builds"), True
        elif finding.node in fired and finding.node in narrow:
            finding.fix, finding.fixable = (f"lifted by rule '{fired[finding.node]}': "
                                            f"{_weight_outcome(narrow[finding.node], remaining)}"), True
        elif finding.node in fired:
            finding.fix, finding.fixable = LIFT_OUTCOMES.get(fired[finding.node], f"lifted by {fired[finding.node]}"), \
                True
        elif finding.rule == "control-flow":
            stuck = [name for name, where in left.items() if f"{finding.op} '{finding.node}' " in where]
            finding.fix = (f"no rule lifts '{stuck[0]}' inside it: " + declined.get(stuck[0], "please report the "
                                                                                     "pattern")) if stuck else (
                "lifted inside the bodies like in the main graph, which get symmetric int8 Q/DQ there")
            finding.fixable = not stuck
        elif finding.node not in remaining:
            finding.fix, finding.fixable = ABSORBED, True
        else:
            finding.fix = declined.get(finding.node, "no rule rewrites it")
    # an activation the source quantizes with no scale TensorRT can use (AMD Quark's MX/BFP): calibration gives it
    unscaled = [spec for spec in lifting.ctx.annotations.activations.values() if spec.scale is None
                and not spec.dynamic]
    origins, tensors = {spec.origin for spec in unscaled}, {spec.tensor for spec in unscaled}
    for finding in findings:  # (a tensor two nodes quantize keeps the first one's origin: the input tells)
        node = ops.get(finding.node)
        uncalibrated = finding.node in origins or (node is not None and node.inputs[:1]
                                                   and node.inputs[0].name in tensors)
        if finding.fixable and uncalibrated and NEEDS_DATA not in finding.fix:
            finding.fix += f"; {NEEDS_DATA} (the source holds no activation scale TensorRT can use)"
    return findings


def _weight_outcome(spec, remaining: set[str]) -> str:
    """What convert makes of a weight it keeps in ``spec``'s format (INT4 blocks, FP8, ...): the annotation lifting
    left, and the float side path of :mod:`trt_bridge.lift.shifted_blocks` where it added one (its
    ``<MatMul>/block_shift`` node)."""
    how = f"in blocks of {spec.block_size}" if spec.block_size else (
        "per output channel" if spec.scale is None or np.ndim(spec.scale) else "per tensor")
    text = f"the weight stays {spec.format.label} {how} (symmetric codes, zero point 0, positive scales)"
    if any(f"{site.node}/block_shift" in remaining for site in spec.sites):
        text += ("; the sign of a negative scale, and any zero point, become each block's shift, which a float side "
                 "path of the MatMul adds (exact)")
    return text


def _source_scales(model, path: Path, ops: dict) -> list[Finding]:
    """A quantization scale that is 0, negative, subnormal or not finite, float8 codes holding NaN, or a weight
    holding NaN or Inf: convert refuses the model (the same check, :func:`check_source_values`)."""

    try:
        check_source_values(model, path)
    except UnsupportedPatternError as exc:
        message = str(exc).split(": ", 1)[-1]
        node = _node_named_in(message, ops)
        return [Finding("qdq-scale", Severity.BLOCKER, node.name if node else "", node.op if node else "",
                        [tensor_info(t) for t in node.inputs if t.name] if node else [], message,
                        "convert refuses the model as the message says (scales finite and positive, weights and "
                        "their codes finite, MatMulNBits attributes onnxruntime runs)", False)]
    return []


def _node_named_in(message: str, ops: dict):
    for name, node in ops.items():
        if f"'{name}'" in message:
            return node
    return None


__all__ = ["CheckOptions", "measure_costs", "CheckReport", "Finding", "Severity", "TrtProbe", "check_model"]
