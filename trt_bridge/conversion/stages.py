"""The stages of a conversion over one shared :class:`Conversion` state; each returns the report fields it
contributes (:class:`trt_bridge.stage.StageResult`). Their order is ``trt_bridge.conversion.STAGES``."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
import onnx_graphsurgeon as gs

from trt_bridge.calibrate import CalibMethod, model_inputs, open_feeds
from trt_bridge.calibrate.apply import apply_ranges, float_where_infinite, nonfinite_values
from trt_bridge.calibrate.awq import apply_awq
from trt_bridge.calibrate.ranges import observed_ranges
from trt_bridge.calibrate.session import HeldOut
from trt_bridge.calibrate.two_pass import calibrate_graph
from trt_bridge.checks.rules import is_int8
from trt_bridge.conversion import (
    bodies,
    constant_inputs,
    costs,
    data_choices,
    give_back,
    range_choice,
    refine,
    runtime_choice,
    shape_branches,
)
from trt_bridge.conversion.builder_forms import formats_for
from trt_bridge.conversion.options import ConvertOptions, ScalePolicy
from trt_bridge.conversion.paths import check_paths
from trt_bridge.conversion.report import FloatLeftover, RuleHits
from trt_bridge.conversion.support import check_supported
from trt_bridge.errors import CalibrationDataError
from trt_bridge.ir.commit import Outputs
from trt_bridge.ir.deferred import import_graph
from trt_bridge.ir.dynamic_gemm import OP_TYPE as PLUGIN_OP
from trt_bridge.ir.dynamic_gemm import PLUGIN_VERSION
from trt_bridge.ir.export import export_model
from trt_bridge.ir.finalize import finalize
from trt_bridge.ir.model import default_opset, load_model
from trt_bridge.ir.size import RELEASE_BYTES, lifted_bytes, payload_bytes, release_memory, too_large
from trt_bridge.ir.store import WeightStore
from trt_bridge.ir.types import infer_shapes
from trt_bridge.ir.values import check_source_values, nonfinite_count
from trt_bridge.lift import LIFT_RULES
from trt_bridge.lift.dynamic_gemm_plugin import DynamicGemmPlugin
from trt_bridge.lift.float_gemm_plugin import FloatGemmPlugin
from trt_bridge.lift.fused_dynamic_gemm_plugin import FusedDynamicGemmPlugin
from trt_bridge.lift.pipeline import lift_model
from trt_bridge.lower.attention_fusion import ATTENTION_OPSET
from trt_bridge.lower.attention_pass import fuse_attention
from trt_bridge.lower.layer_precisions import precision_report
from trt_bridge.lower.precision import to_low_precision
from trt_bridge.lower.qdq import check_quantizable, lower, needs_opset
from trt_bridge.place.policies import place
from trt_bridge.place.shared import share_imported
from trt_bridge.prepare.types import feed_types
from trt_bridge.scales.apply import apply, check_against_data, load_sources
from trt_bridge.stage import StageResult

log = logging.getLogger("trt_bridge.conversion")


@dataclass
class Conversion:
    """What the stages share: the paths and options, and what each stage leaves for the next."""

    model_path: Path
    output_path: Path
    options: ConvertOptions
    model: onnx.ModelProto | None = None  # the source, until lifting consumes it
    declared: dict[str, int] = field(default_factory=dict)  # the exporter's value_info types
    source_nonfinite: int = 0
    feeds: Any = None  # calibrate.FeedSource
    imported: Any = None  # scales.ScaleTable from --scales FILE / --qat
    store: WeightStore | None = None  # a model over 2 GB: where its lifted weights live
    weight_bytes: int = 0  # the source's weights and other constants, in bytes
    lifted: onnx.ModelProto | None = None  # the lifted float model (a header, with a store)
    graph: gs.Graph | None = None  # the lifted graph, placed, calibrated, lowered in place
    ctx: Any = None  # lift.LiftContext: annotations, rules fired and declined
    placement: Any = None  # place.Placement
    calibration: Any = None  # calibrate.CalibrationResult
    recentered: list = field(default_factory=list)
    ranges: dict | None = None  # --high-precision fp16: observed ranges of the float layers
    out_model: onnx.ModelProto | None = None
    data_choices: str = ""  # without a scale source: the ways to give one, for the error that needs them
    float_copy: Any = None  # with check: a temporary folder holding the lifted float model (its engine costs)
    outputs: Outputs = field(default_factory=Outputs)  # the command's outputs, committed once it has succeeded
    staged: Path | None = None  # the output model as written, before it is committed
    held: list = field(default_factory=list)  # prepare.change.Change: the inputs --constant-inputs holds


def _has_scale_source(options: ConvertOptions) -> bool:
    """Calibration data (real or random), a scale file or a QAT export: where activation scales can come from
    besides the model itself."""
    return (options.calibration.data is not None or options.calibration.random is not None
            or bool(options.scales.files) or options.scales.qat is not None)


def load(state: Conversion) -> StageResult:
    """Load and check the source; open (and check) the calibration data and any scale files before any work, so
    a bad path fails fast."""
    check_paths(state.model_path, state.output_path, state.options)
    options = state.options
    model = state.model = load_model(state.model_path, state.declared, defer=True)  # big weights read when used
    state.held = constant_inputs.apply(model, options.source.values(), state.model_path)  # --constant-inputs
    check_supported(model, state.model_path)  # an opset onnxruntime cannot run, FP4 Q/DQ
    check_source_values(model, state.model_path)  # scales, FP8 codes, weights (check names the same)
    state.source_nonfinite = nonfinite_count(model)  # -inf attention masks are fine; new ones are overflows
    if options.calibration.data is None and options.calibration.random is None:  # for the error that may need them
        state.data_choices = data_choices.choices(model, options.activations.mode == "static")
    else:
        inputs = feed_types(model_inputs(model), options.precision.bf16)
        state.feeds = open_feeds(options.calibration.data, options.calibration.random, inputs, model=model,
                                 limit=options.calibration.max_feeds)
        state.feeds.check()
    state.imported = load_sources(options.scales.files, options.scales.qat, model,  # matched against the source
                                  options.formats.activations)  # and giving normal scales in the format written
    return StageResult(records={"input": str(state.model_path), "output": str(state.output_path),
                                        "source_opset": default_opset(model)})


def lift(state: Conversion) -> StageResult:
    """The source to the float graph and its annotations. A model whose lifted weights reach 2 GB is held once: they
    go to a private file the graph and onnxruntime map (:mod:`trt_bridge.ir.store`)."""
    state.weight_bytes = payload_bytes(state.model)
    state.store = WeightStore() if too_large(lifted_bytes(state.model)) else None
    activations = state.options.activations
    granularity = activations.granularity
    if activations.mode == "static":
        rules = LIFT_RULES
    elif is_int8(import_graph(state.model)):  # the plugin takes the dynamic MatMuls it can before the static rules
        rules = (DynamicGemmPlugin(granularity), FusedDynamicGemmPlugin(granularity), *LIFT_RULES)
    else:  # a float model: its MatMuls with constant weights, quantized per column
        rules = (*LIFT_RULES, FloatGemmPlugin(granularity))
    decided = shape_branches.specialise(state.model, state.feeds, str(state.model_path))  # nested shape tests
    state.lifted, ctx = lift_model(state.model, state.model_path, state.options.precision.bf16, state.declared,
                                   state.store, rules)
    ctx.prepared = state.held + decided + list(ctx.prepared)
    state.ctx, state.model = ctx, None
    if (activations.mode == "static" and not _has_scale_source(state.options) and not state.options.formats.weights
            and not ctx.annotations.activations and not ctx.annotations.weights and not ctx.in_bodies):  # a float model
        raise CalibrationDataError(data_choices.float_model_message(state.model_path, state.data_choices))
    if state.options.check and state.store is None:  # the float model's engine, the costs' reference
        state.float_copy = costs.keep_float(state.lifted)
    _release_memory(state)
    state.graph = gs.import_onnx(state.lifted)  # keeps referring to lifted's weights: no copy
    if state.store is not None:
        state.store.attach(state.graph)
    plugin_layers = [node for rule in (DynamicGemmPlugin, FusedDynamicGemmPlugin, FloatGemmPlugin)
                     for node in ctx.fired.get(rule.name, [])]
    if activations.mode == "dynamic" and not plugin_layers:
        log.warning("%s: --activations dynamic found no MatMul to put into the plugin (a dynamically quantized one "
                    "with onnxruntime's epilogue, DynamicQuantizeLinear → MatMulInteger → Cast → Mul, or a float "
                    "model's with a constant weight); the model is converted as with --activations static",
                    state.model_path)
    plugin = {"name": PLUGIN_OP, "version": PLUGIN_VERSION, "granularity": activations.granularity,
              "layers": plugin_layers} if activations.mode == "dynamic" else None
    return StageResult(changed=sum(len(nodes) for nodes in ctx.fired.values()), records={
        "plugin": plugin, "rules": [RuleHits(rule, nodes) for rule, nodes in ctx.fired.items()],
        "sanitized": [asdict(c) for c in ctx.prepared], "approximated": [asdict(a) for a in ctx.approximated]})


def place_quantizers(state: Conversion) -> StageResult:
    """Which tensors get Q/DQ, with which scale source; imported scales applied."""
    options, ctx, feeds = state.options, state.ctx, state.feeds
    scales = options.scales.policy or (ScalePolicy.DATA if options.calibration.data is not None
                                       else ScalePolicy.MODEL)
    if scales is ScalePolicy.DATA:
        if feeds is None:
            raise CalibrationDataError("--scales data re-derives activation scales from calibration data: "
                                       "pass --calib-data (or use --scales model).")
        for spec in ctx.annotations.activations.values():
            spec.scale, spec.source = None, None
    state.placement = place(state.graph, ctx.annotations, options.placement,
                            feeds is not None or state.imported is not None)  # imported scales stand in for data
    if state.imported is not None:
        apply(state.graph, ctx.annotations, state.imported, calibrating=feeds is not None)
        share_imported(ctx.annotations, state.placement.shared_scales)  # a group's members the file does not name
    formats = formats_for(state.graph, ctx.annotations, options, ctx.approximate, str(state.model_path))
    check_quantizable(state.graph, ctx.annotations)
    left = [FloatLeftover(x.node, "", f"'{x.tensor}': {x.reason}") for x in state.placement.left_in_float]
    return StageResult(changed=len(ctx.annotations.activations), records={
        "placement": options.placement.policy.value, "scales": scales.value,
        "left_in_float": left + [FloatLeftover(d.node, d.op, d.reason) for d in ctx.declined],
        "imported_scales": None if state.imported is None else state.imported.to_dict(),
        "formats": [asdict(c) for c in formats], "approximated": [asdict(a) for a in ctx.approximated]})


def _lowering(state: Conversion) -> range_choice.Lowering:
    """How auto's candidates are lowered: as the written model (its centres in the --high-precision type)."""
    high = state.options.precision.high_precision
    return range_choice.Lowering(state.placement.shared_scales, state.options.ranges.recenter,
                                 None if high == "fp32" else high)


def _refine(state: Conversion, choice: range_choice.MethodChoice, held_out: HeldOut, needed: list[str],
            records: dict[str, Any], own_scales: bool = False) -> list[str]:
    """Give-back and bias correction on the judged ``choice`` (:func:`trt_bridge.conversion.refine.refine`)."""
    return refine.refine(state.graph, state.ctx.annotations, state.options, state.feeds, choice, held_out, needed,
                         _lowering(state), records, own_scales)


def _runtime_first(state: Conversion, needed: list[str], in_groups: dict[str, str]
                   ) -> tuple[list[str], runtime_choice.RuntimeChoice]:
    """With ``--runtime-ranges on``, or a dynamic source without calibration data: its activations ranged in
    each inference where they can be; returns the activations still needing a scale."""
    mode, annotations = state.options.activations.runtime_ranges, state.ctx.annotations
    runtime = runtime_choice.RuntimeChoice(mode, reason="off" if mode == "off" else "no activation needs a scale")
    if needed and mode != "off" and (mode == "on" or state.feeds is None):
        found, declined, considered = runtime_choice.eligible(state.graph, annotations, needed, mode == "on",
                                                              in_groups)
        runtime_choice.mark(annotations, found)
        needed = [t for t in needed if t not in found]
        runtime = runtime_choice.RuntimeChoice(mode, tuple(found), considered, declined, reason=(
            "--runtime-ranges on" if mode == "on" else "no calibration data: the dynamic source's own ranges"))
    return needed, runtime


def _missing_scales(state: Conversion, needed: list[str], runtime: runtime_choice.RuntimeChoice) -> None:
    """Activations need a scale and there is no calibration data: the error that says the ways to give one."""
    options, annotations = state.options, state.ctx.annotations
    raise CalibrationDataError(data_choices.missing_scales_message(
        state.model_path, needed, state.data_choices, options.activations.mode == "dynamic",
        options.activations.runtime_ranges == "off", any(annotations.activations[t].dynamic for t in needed),
        runtime.declined, state.imported is not None))


def _split(state: Conversion) -> tuple[range_choice.MethodChoice | None, HeldOut | None]:
    """``auto``'s held-out split (None: too few feeds, or a model over 2 GB, with the fallback saying so)."""
    if state.options.calibration.method is not CalibMethod.AUTO:
        return None, None
    held_out = HeldOut.split(state.feeds.total, range_choice.MIN_FEEDS)
    if held_out is None:
        return range_choice.too_few(state.feeds.total), None
    if state.store is not None:
        return range_choice.fallback("a model over 2 GB is not converted twice"), None
    return None, held_out


def _judge_own_scales(state: Conversion, records: dict[str, Any]) -> None:
    """Nothing was calibrated (the source's own scales, or runtime ranges): its quantized layers judged for
    give-back on held-out calibration feeds (:mod:`trt_bridge.conversion.refine`), or the report says why not."""
    options, annotations = state.options, state.ctx.annotations
    if not (options.calibration.give_back and options.calibration.method is CalibMethod.AUTO
            and (annotations.activations or annotations.weights)):
        return
    if state.feeds is None:
        reason = ("no calibration data: give-back judges the source's quantized layers on held-out calibration "
                  "feeds (pass --calib-data)")
    elif state.store is not None:
        reason = "a model over 2 GB is not converted twice"
    elif state.imported is not None:  # the user's own choice of scales: they win over everything else
        reason = "--scales FILE / --qat set the scales, which give-back leaves as given (--exclude-nodes does not)"
    else:
        held_out = refine.hold_out(state.lifted, state.feeds, options.progress)
        judged = held_out if isinstance(held_out, str) else \
            refine.judged_source(state.graph, annotations, held_out, _lowering(state))
        if not isinstance(judged, str):
            _refine(state, judged, held_out, [], records, own_scales=True)
            return
        reason = judged
    records["given_back"] = give_back.GiveBack(reason=reason, own_scales=True).to_dict()


def _calibration_record(state: Conversion, result, auto: str | None, infinite: list[str]) -> dict[str, Any]:
    percentile = state.options.calibration.percentile
    return {"feeds": result.feeds, "skipped_feeds": result.skipped, "method": result.method.value, "auto": auto,
            "seconds": result.seconds,
            "percentile": (result.percentile or percentile) if result.method is CalibMethod.PERCENTILE else None,
            "ranges": {k: {"min": o.lo, "max": o.hi, "amax": result.amax(k)}
                       for k, o in sorted(result.observers.items())},
            "nonfinite_values": nonfinite_values(result), "infinite_left_in_float": infinite}


def _calibrate_needed(state: Conversion, needed: list[str], in_groups: dict[str, str],
                      runtime: runtime_choice.RuntimeChoice, records: dict[str, Any]
                      ) -> tuple[list[str], runtime_choice.RuntimeChoice]:
    """Calibration of ``needed``, ``auto``'s choice of ranges (and of runtime ranges), give-back and bias
    correction; returns the activations still to quantize and the runtime-range choice."""
    options, ctx, feeds, mode = state.options, state.ctx, state.feeds, state.options.activations.runtime_ranges
    choice, held_out = _split(state)
    result, smoothed, splits = calibrate_graph(
        state.graph, ctx.annotations, state.lifted, needed, feeds, options.calibration.method,
        options.calibration.percentile, options.ranges.smooth, options.progress, held_out,
        options.ranges.split_outliers)
    infinite = float_where_infinite(ctx.annotations, result, needed)  # a mask's -Inf: no int8 keeps it
    needed = [t for t in needed if t not in infinite]
    candidates = None
    if mode == "auto":
        split = {s.tensor: "its massive channels were split off into a float path" for s in splits}
        candidates = runtime_choice.eligible(state.graph, ctx.annotations, needed, False, {**in_groups, **split})
    auto = None
    if options.calibration.method is CalibMethod.AUTO:
        if choice is None:
            choice = range_choice.choose_method(
                state.graph, ctx.annotations, needed, held_out, _lowering(state), result.observers,
                options.calibration.percentile, also=runtime_choice.beside(state.graph, ctx.annotations, needed,
                                                                           candidates, _lowering(state)))
        result = replace(result, method=choice.method, percentile=choice.percentile, keep_max=choice.keep_max)
        auto = choice.describe()
    if candidates is not None:
        runtime, model = runtime_choice.judge(state.graph, ctx.annotations, choice, held_out, needed, candidates,
                                              _lowering(state), options.activations.prefer)
        if runtime.tensors:  # give-back and bias correction measure the model with runtime ranges
            needed = [t for t in needed if t not in runtime.tensors]
            choice = replace(choice, model=model, scores={**choice.scores, choice.label: runtime.scores["runtime"]})
    if choice is not None and not choice.scores:  # auto kept max unjudged: judged here where it can be
        choice = refine.judged_max(state.graph, ctx.annotations, needed, held_out, _lowering(state), choice)
    if choice is not None and choice.scores:
        needed = _refine(state, choice, held_out, needed, records)
    state.calibration = result
    records["calibration"] = _calibration_record(state, result, auto, infinite)
    records["smoothed"] = [asdict(x) for x in smoothed]
    records["split_outliers"] = [asdict(x) for x in splits]
    return needed, runtime


def calibrate(state: Conversion) -> StageResult:
    """Scales for what has none (calibration, with smoothing, and auto's give-back), or give-back judged on the
    source's own scales; re-centring, shared scales, imported scales checked against the data, and the float
    layers' ranges for fp16."""
    options, ctx, feeds = state.options, state.ctx, state.feeds
    records: dict[str, Any] = {"calibration": None, "smoothed": [], "split_outliers": [], "given_back": None,
                               "bias_corrected": None, "runtime_ranges": None, "awq": [] if feeds is None else [
                                   asdict(x) for x in apply_awq(state.graph, ctx.annotations, state.lifted, feeds,
                                                                options.progress)]}  # INT4 weights: AWQ, else RTN
    in_groups = {t: "it shares one scale with other tensors (a Concat's inputs), which a per-input range cannot"
                 for group in state.placement.shared_scales for t in group}  # no runtime range for these
    needed, runtime = _runtime_first(state, ctx.annotations.needing_calibration(), in_groups)
    if needed and feeds is None:
        _missing_scales(state, needed, runtime)
    if needed:
        needed, runtime = _calibrate_needed(state, needed, in_groups, runtime, records)
    else:
        _judge_own_scales(state, records)
    lowering = _lowering(state)
    shared = lowering.shared
    state.recentered = apply_ranges(state.graph, ctx.annotations, state.calibration, needed, shared,
                                    lowering.recentre, lowering.center_type)
    if state.imported is not None and feeds is not None:  # after sharing: the scales the output will have
        keep = frozenset({t for group in shared for t in group} | {r.tensor for r in state.recentered})
        check_against_data(state.lifted, ctx.annotations, state.imported, feeds, options.progress, keep)
    if options.precision.high_precision == "fp16" and feeds is not None:
        # on the graph as it is now: the tensors that splitting, smoothing and re-centring added (a side path's
        # product, an unsmoothed producer output) need their range too, or float16 could overflow there (a model
        # over 2 GB keeps the lifted model's ranges)
        current = state.lifted if state.store is not None else infer_shapes(export_model(state.graph))
        state.ranges = observed_ranges(current, feeds, options.progress)
    records["recentered"] = [asdict(r) for r in state.recentered]
    records["runtime_ranges"] = runtime.to_dict()
    return StageResult(changed=len(needed) + len(runtime.tensors), records=records)


def _release_memory(state: Conversion) -> None:
    if state.weight_bytes >= RELEASE_BYTES:
        release_memory()


def lower_model(state: Conversion) -> StageResult:
    """Q/DQ written, the graph exported and finished, the float layers in ``--high-precision``."""
    options, store = state.options, state.store
    inside = bodies.quantize_bodies(state.graph, state.ctx.body_annotations, options, state.feeds, state.calibration)
    quantized = inside.quantized + lower(state.graph, state.ctx.annotations, release=True)
    if store is not None:
        release_memory()  # the float weights just quantized: their maps go before the export copies the rest
    exported, lifted_opset = export_model(state.graph, consume=True), default_opset(state.lifted)
    state.graph = state.lifted = None  # the float model goes before the output is checked
    _release_memory(state)
    if store is not None:
        store.close()
    out_model = finalize(exported, lifted_opset, check=True, min_opset=needs_opset(quantized))
    del exported
    kept_fp32 = None
    high = options.precision.high_precision
    if high != "fp32":
        exact = {layer: r.tensor for r in state.recentered for layer in r.compensated}
        exact.update({node: q.tensor for q in quantized if q.kind == "runtime" for node in q.nodes})
        out_model, kept_fp32 = to_low_precision(out_model, high, state.ranges,
                                                keep_io_types=options.precision.io_types == "keep", exact=exact)
        out_model = finalize(out_model, default_opset(out_model), check=True, min_opset=19)
    # the float16/bfloat16 attention as one Attention-23 node (TensorRT's dedicated kernels), once types are final
    out_model, fusion = fuse_attention(out_model)
    if fusion.fused:
        out_model = finalize(out_model, default_opset(out_model), check=True, min_opset=ATTENTION_OPSET)
        present = {n.name for n in out_model.graph.node}  # a fused Softmax kept in float32 is Attention's now
        kept_fp32 = None if kept_fp32 is None else [k for k in kept_fp32 if k.node in present]
    state.out_model = out_model
    rules = [RuleHits(rule, nodes) for rule, nodes in state.ctx.fired.items()]
    return StageResult(changed=len(quantized) + len(fusion.fused), records={
        "rules": rules + [RuleHits(rule, nodes) for rule, nodes in fusion.by_rule.items()],
        "attention": fusion.to_dict() if fusion.fused or fusion.declined else None,
        "control_flow": inside.to_dict(),
        "quantized": [{k: v for k, v in asdict(q).items() if k != "nodes"} for q in quantized],
        "output_opset": default_opset(out_model),
        "precision": precision_report(out_model, high, kept_fp32)})
