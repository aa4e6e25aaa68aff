"""The conversion pipeline: load → prepare → lift → place → calibrate → lower → finalize → save."""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from trt_bridge.annotations import ScaleSource
from trt_bridge.calibrate import CalibMethod, model_inputs, open_feeds
from trt_bridge.convert.report import ConversionReport, FloatLeftover, RuleHits
from trt_bridge.errors import CalibrationDataError, InternalError, TrtBridgeError, UnsupportedPatternError
from trt_bridge.ir.model import (
    MIN_QDQ_OPSET,
    check_name_lengths,
    check_writable,
    default_opset,
    external_data_files,
    infer_shapes,
    is_large,
    load_model,
    release_memory,
    save_model,
)
from trt_bridge.ir.store import WeightStore, storable
from trt_bridge.place.policies import PlacementOptions, PlacementPolicy, place
from trt_bridge.prepare.types import Bf16Policy

if TYPE_CHECKING:
    import onnx_graphsurgeon as gs

log = logging.getLogger("trt_bridge.convert")

#: Q/DQ nodes hold exact integer data; constant folding must leave them alone.
_NO_FOLD = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


class ScalePolicy(str, enum.Enum):
    """Where activation scales that the source model carries come from."""

    MODEL = "model"  # the symmetric int8 scale covering each source (scale, zero point) range
    DATA = "data"  # re-derived from calibration data (recovers the bit lost on one-sided ranges)


@dataclass(frozen=True)
class ConvertOptions:
    """Every option of ``trt-bridge convert`` (one field per CLI flag)."""

    calib_data: str | None = None
    calib_random: int | None = None
    calib_method: CalibMethod = CalibMethod.MAX
    percentile: float = 99.99
    placement: PlacementPolicy = PlacementPolicy.TENSORRT
    include_ops: str | None = None  # regex: op types whose float inputs are quantized too
    exclude_ops: str | None = None  # regex: op types never quantized
    exclude_nodes: str | None = None  # regex (searched in node names): nodes never quantized
    scales: ScalePolicy | None = None  # None: data when calibration data is given, else model
    recenter: bool = True
    smooth: float | None = 0.65  # SmoothQuant alpha for MatMul inputs; None: off
    bf16: Bf16Policy = Bf16Policy.FP32  # what bfloat16 tensors become (onnxruntime's CPU runs no bfloat16)
    scale_files: tuple[str, ...] = ()  # explicit scale tables (--scales FILE): they win over everything else
    high_precision: str = "fp32"  # the non-quantized part of the graph: fp32, fp16 or bf16 (sensitive ops stay fp32)
    io_types: str = "keep"  # with --high-precision fp16/bf16: keep the inputs/outputs' types, or that type too
    qat: str | None = None  # a QAT ONNX export or ModelOpt state dict (--qat): wins over the model and calibration
    check: bool = True  # run `trt-bridge check` on the output (with TensorRT's parser when installed)
    progress: bool = True


def convert(model_path: str | Path, output_path: str | Path, options: ConvertOptions = ConvertOptions()
            ) -> ConversionReport:
    """Convert the model at ``model_path`` and write the TensorRT-ready model to ``output_path``."""
    import onnx_graphsurgeon as gs

    from trt_bridge.calibrate.recenter import recenter
    from trt_bridge.lower.qdq import check_quantizable, lower, needs_opset

    model_path, output_path = Path(model_path), Path(output_path)
    check_name_lengths(output_path, "output model")
    if output_path.resolve() == model_path.resolve():
        raise TrtBridgeError(f"the output path {output_path} is the input model; choose another with -o.")
    _check_not_an_input(output_path, model_path, options)
    _check_precision_options(options)
    check_writable(output_path, "output model")
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    declared: dict[str, int] = {}
    model = load_model(model_path, declared)
    from trt_bridge.ir.values import check_output_finite, check_source_scales, check_source_weights, nonfinite_count

    check_source_scales(model, model_path)
    check_source_weights(model, model_path)
    source_nonfinite = nonfinite_count(model)  # -inf attention masks are fine; new ones are overflows
    source_opset = default_opset(model)
    inputs = feed_types(model_inputs(model), options.bf16)
    # Open (and check) the calibration source before any work, so a bad path fails fast.
    feeds = None
    if options.calib_data is not None or options.calib_random is not None:
        feeds = open_feeds(options.calib_data, options.calib_random, inputs, model=model)
        feeds.check()
    from trt_bridge.scales.apply import load_sources

    imported = load_sources(options.scale_files, options.qat, model)  # matched against the source as loaded
    seconds["load"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # A model over 2 GB is held once: its lifted weights go to a private file the graph and onnxruntime map.
    store = WeightStore() if is_large(model) else None
    lifted, ctx = lift_model(model, model_path, options.bf16, declared, store)
    del model
    release_memory()
    graph = gs.import_onnx(lifted)  # keeps referring to lifted's weights: no copy
    if store is not None:
        store.attach(graph)
    scales = options.scales or (ScalePolicy.DATA if options.calib_data is not None else ScalePolicy.MODEL)
    if scales is ScalePolicy.DATA:
        if feeds is None:
            raise CalibrationDataError("--scales data re-derives activation scales from calibration data: "
                                       "pass --calib-data (or use --scales model).")
        for spec in ctx.annotations.activations.values():
            spec.scale, spec.source = None, None
    placement = place(graph, ctx.annotations, PlacementOptions(
        options.placement, options.include_ops, options.exclude_ops, options.exclude_nodes),
        feeds is not None or imported is not None)  # imported scales stand in for calibration
    left = placement.left_in_float
    if imported is not None:
        from trt_bridge.scales.apply import apply

        apply(graph, ctx.annotations, imported, calibrating=feeds is not None)
    check_quantizable(graph, ctx.annotations)
    seconds["lift"] = time.perf_counter() - t0

    calibration, smoothed, recentered, result = None, [], [], None
    needed = ctx.annotations.needing_calibration()
    if needed:
        if feeds is None:
            raise CalibrationDataError(
                f"{model_path}: {len(needed)} activation(s) (e.g. '{needed[0]}') have no static scale in "
                "the model (dynamic quantization computes them at run time; block floating point has none "
                "TensorRT can use). Pass --calib-data with "
                "representative inputs, or --calib-random N for a quick smoke test."
            )
        t0 = time.perf_counter()
        result, smoothed = _calibrate(graph, ctx, lifted, needed, feeds, options)
        for name in needed:
            spec = ctx.annotations.activations[name]
            spec.scale, spec.source = result.scale(name), ScaleSource.CALIBRATION
        calibration = {"feeds": result.feeds, "skipped_feeds": result.skipped, "method": result.method.value,
                       "seconds": result.seconds,
                       "percentile": options.percentile if result.method is CalibMethod.PERCENTILE else None,
                       "ranges": {k: {"min": o.lo, "max": o.hi, "amax": result.amax(k)}
                                  for k, o in sorted(result.observers.items())}}
        seconds["calibrate"] = time.perf_counter() - t0
    if options.recenter:
        shared = {t for group in placement.shared_scales for t in group}
        recentered = recenter(graph, ctx.annotations, result if needed else None, skip=shared,
                              center_type=None if options.high_precision == "fp32" else options.high_precision)
    _share_scales(ctx.annotations, placement.shared_scales)
    if imported is not None and feeds is not None:  # after sharing: the scales the output will have
        from trt_bridge.scales.apply import check_against_data

        t0 = time.perf_counter()
        keep = frozenset({t for group in placement.shared_scales for t in group} | {r.tensor for r in recentered})
        check_against_data(lifted, ctx.annotations, imported, feeds, options.progress, keep)
        seconds["calibrate"] = seconds.get("calibrate", 0.0) + time.perf_counter() - t0

    ranges = None
    if options.high_precision == "fp16" and feeds is not None:
        from trt_bridge.calibrate.ranges import observed_ranges

        t0 = time.perf_counter()
        ranges = observed_ranges(lifted, feeds, options.progress)
        seconds["calibrate"] = seconds.get("calibrate", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    quantized = lower(graph, ctx.annotations)
    if store is not None:
        release_memory()  # the float weights just quantized: their maps go before the export copies the rest
    exported, lifted_opset = export_model(graph), default_opset(lifted)
    del graph, lifted  # the float model goes before the output is checked (a model over 2 GB held it twice)
    release_memory()
    if store is not None:
        store.close()
    out_model = _finalize(exported, lifted_opset, check=True, min_opset=needs_opset(quantized))
    del exported
    kept_fp32 = None
    if options.high_precision != "fp32":
        from trt_bridge.lower.precision import to_low_precision

        exact = {layer: r.tensor for r in recentered for layer in r.compensated}
        out_model, kept_fp32 = to_low_precision(out_model, options.high_precision, ranges,
                                                keep_io_types=options.io_types == "keep", exact=exact)
        out_model = _finalize(out_model, default_opset(out_model), check=True, min_opset=19)
    seconds["lower"] = time.perf_counter() - t0

    check_output_finite(out_model, source_nonfinite, model_path)
    t0 = time.perf_counter()
    written = save_model(out_model, output_path, protect=(model_path, *external_data_files(model_path)))
    if is_large(out_model):
        onnx.checker.check_model(str(written), full_check=True)
    seconds["save"] = time.perf_counter() - t0

    report = ConversionReport(
        input=str(model_path), output=str(output_path), source_opset=source_opset,
        output_opset=default_opset(out_model),
        rules=[RuleHits(rule, nodes) for rule, nodes in ctx.fired.items()],
        quantized=[asdict(q) for q in quantized],
        left_in_float=[FloatLeftover(x.node, "", f"'{x.tensor}': {x.reason}") for x in left]
        + [FloatLeftover(d.node, d.op, d.reason) for d in ctx.declined],
        calibration=calibration, seconds=seconds, recentered=[asdict(r) for r in recentered],
        smoothed=[asdict(x) for x in smoothed], placement=options.placement.value, scales=scales.value,
        sanitized=[asdict(c) for c in ctx.prepared], approximated=[asdict(a) for a in ctx.approximated],
        imported_scales=None if imported is None else imported.to_dict(),
        precision=_precision_report(out_model, options, kept_fp32),
    )
    if options.check:
        from trt_bridge.checks import CheckOptions, check_model

        t0 = time.perf_counter()
        checked = check_model(output_path, CheckOptions())
        report.check = {**checked.to_dict(), "headline": checked.headline()}
        report.remaining_blockers = [f"{f.op} '{f.node}': {f.why}" for f in checked.blockers]
        seconds["check"] = time.perf_counter() - t0
    return report


def prepare(model: onnx.ModelProto, where: str | Path = "model", bf16: Bf16Policy = Bf16Policy.FP32,
            declared: dict[str, int] | None = None) -> list:
    """Make ``model``'s types agree with its ops (in place): bfloat16 per ``bf16``, then a Cast wherever
    a node's inputs contradict its schema. ``declared``: the exporter's value_info types, as
    :func:`load_model` captured them (None: the model's value_info is the exporter's). Returns the
    changes (``sanitize.Change``)."""
    from trt_bridge.ir.model import elem_types
    from trt_bridge.prepare.pad_code import retype_pad_codes
    from trt_bridge.prepare.types import agree_types, convert_bf16

    _name_nodes(model)
    changes = retype_pad_codes(model, elem_types(model), str(where)) + convert_bf16(model, bf16)
    if declared is not None and bf16 is not Bf16Policy.KEEP:
        target = onnx.TensorProto.FLOAT if bf16 is Bf16Policy.FP32 else onnx.TensorProto.FLOAT16
        declared = {k: target if v == onnx.TensorProto.BFLOAT16 else v for k, v in declared.items()}
    return changes + agree_types(model, str(where), declared)


@dataclass
class Lifting:
    """What lifting a model found (see :func:`lift_graph`)."""

    graph: object  # gs.Graph, lifted in place
    ctx: object  # lift.LiftContext
    changes: list  # sanitize.Change: types, bfloat16, Dropout, Identity, Cast chains
    blockers: list  # (gs.Node, where): nodes TensorRT cannot import that no rule lifted


def lift_graph(model: onnx.ModelProto, where: str | Path = "model", bf16: Bf16Policy = Bf16Policy.FP32,
               prepared: list | None = None, declared: dict[str, int] | None = None) -> Lifting:
    """Prepare (unless ``prepared`` holds the changes :func:`prepare` already made), sanitize, fold
    constants and lift ``model`` (consumed); report what is left."""
    import onnx_graphsurgeon as gs

    from trt_bridge.lift import leftover_blockers, lift
    from trt_bridge.prepare import global_pool, sanitize

    changes = prepare(model, where, bf16, declared) if prepared is None else list(prepared)
    if changes:  # the casts' outputs need types and shapes for the passes below
        model = infer_shapes(model)
    graph = gs.import_onnx(model)
    changes += sanitize(graph)
    fold_constants(graph)
    changes += global_pool.after_folding(graph)
    ctx = lift(graph)
    changes += global_pool.after_folding(graph)  # where a quantizer's custom op (Quark's BFP) hid the shapes
    return Lifting(graph, ctx, changes, leftover_blockers(graph))


def lift_model(model: onnx.ModelProto, where: str | Path = "model", bf16: Bf16Policy = Bf16Policy.FP32,
               declared: dict[str, int] | None = None, store: WeightStore | None = None):
    """Lift ``model`` (consumed) to the canonical form: ``(float ModelProto, LiftContext)``.

    The float model computes exactly what the source meant, with the source's own
    (dequantized) weights; raises UnsupportedPatternError if anything TensorRT
    cannot import is left. ``ctx.prepared`` lists the sanitizing changes. With a ``store``, the float model
    is a header whose large weights live in the store's file (:mod:`trt_bridge.ir.store`).
    """

    source_opset = default_opset(model)
    lifting = lift_graph(model, where, bf16, declared=declared)
    if lifting.blockers:
        raise UnsupportedPatternError(_blocker_message(where, lifting.blockers, lifting.ctx.declined))
    lifting.ctx.prepared = lifting.changes
    lifted = export_model(lifting.graph, store)
    # The lifting graph refers to the source model's tensors (and the lifted weights to their own arrays): let
    # them go with the source, so the float model is held once from here on (a model over 2 GB kept 1× more).
    lifting.ctx.graph, lifting.ctx.constants, lifting.graph = None, {}, None
    return _finalize(lifted, source_opset), lifting.ctx


#: constants at least this large are copied once into an exported model (see :func:`export_model`)
_BIG_CONSTANT = 1 << 20


def export_model(graph: gs.Graph, store: WeightStore | None = None) -> onnx.ModelProto:
    """``gs.export_onnx(graph)``, copying each large weight that still lives in its source TensorProto once.

    onnx-graphsurgeon puts the source protos into a GraphProto and ``onnx.helper.make_model`` copies that
    into the ModelProto: while both exist, with the source, a model over 2 GB is held three times. Here the
    large protos are exported as weightless stand-ins and copied into the finished model one by one. With a
    ``store``, every large weight (a source proto's or an array) goes into the store's file instead, and the
    model refers to it there (:mod:`trt_bridge.ir.store`)."""
    import onnx_graphsurgeon as gs
    from onnx_graphsurgeon.ir.tensor import LazyValues

    swapped = {}
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        if not isinstance(tensor, gs.Constant):
            continue
        if isinstance(values, LazyValues) and isinstance(values.tensor, onnx.TensorProto):
            if values.nbytes < (_BIG_CONSTANT if store is None else store.MIN_BYTES) \
                    or (store is not None and not storable(values.tensor.data_type)):
                continue
            data_type = values.tensor.data_type
        elif store is not None and isinstance(values, np.ndarray) and values.nbytes >= store.MIN_BYTES \
                and storable(values.dtype):
            data_type = onnx.helper.np_dtype_to_tensor_dtype(values.dtype)
        else:
            continue
        stand_in = onnx.TensorProto(name=tensor.name, data_type=data_type, dims=values.shape)
        swapped[tensor.name] = (tensor, values)
        tensor._values = LazyValues(stand_in)
    try:
        model = gs.export_onnx(graph)
    finally:
        for tensor, values in swapped.values():
            tensor._values = values
    for init in model.graph.initializer:
        if init.name not in swapped:
            continue
        tensor, values = swapped[init.name]
        if store is not None:
            source = values.tensor if isinstance(values, LazyValues) else None
            store.put(init, source.raw_data if source is not None and source.HasField("raw_data")
                      else np.asarray(values.load() if source is not None else values))
        else:
            init.CopyFrom(values.tensor)
            init.name = tensor.name
    return model


def _calibrate(graph, ctx, lifted: onnx.ModelProto, needed: list[str], feeds, options: ConvertOptions):
    """Calibrate ``needed`` in one onnxruntime session; with smoothing, in two passes over the feeds.

    Pass 1 records per-channel maxima of the smoothing candidates (LayerNormalization
    outputs) and the ranges of everything else. Smoothing then divides each candidate
    by its factors ``s`` (folded into the LayerNormalization, so the tensor keeps its
    name), and pass 2 records the candidates' ranges as ``x / s`` on the same session.
    """
    from trt_bridge.calibrate.observers import RangeObserver
    from trt_bridge.calibrate.session import CalibrationSession, finish
    from trt_bridge.calibrate.smooth import MIN_ROWS, ChannelMaxObserver, Rescaled, candidates, smooth

    start = time.perf_counter()
    observers = {t: RangeObserver(options.calib_method, options.percentile) for t in needed}
    todo = [] if options.smooth is None else [t for t in candidates(graph, ctx.annotations) if t in observers]
    smoothed = []
    with CalibrationSession(lifted, needed) as session:
        if not todo:
            count = session.run(observers, feeds, options.progress)
        else:
            maxima = {t: ChannelMaxObserver() for t in todo}
            count = session.run({**{t: o for t, o in observers.items() if t not in maxima}, **maxima}, feeds,
                                options.progress, desc="calibrating (1/2)")
            enough = {t: m.max for t, m in maxima.items() if m.rows >= MIN_ROWS}
            for t in sorted(set(maxima) - set(enough)):
                log.info("not smoothing %r: calibration saw %d row(s) per channel, fewer than %d", t,
                         maxima[t].rows, MIN_ROWS)
            smoothed, factors = smooth(graph, ctx.annotations, enough, options.smooth)
            # the candidates left unsmoothed are observed as they are
            session.run({t: Rescaled(observers[t], 1.0 / factors[t]) if t in factors else observers[t]
                         for t in todo}, feeds, options.progress, desc="calibrating (2/2)")
        skipped = len(session.skipped)
    return finish(observers, count, time.perf_counter() - start, options.calib_method, skipped), smoothed


def input_files(model_path: str | Path, options: ConvertOptions) -> list[Path]:
    """Every file a conversion reads besides the model itself: feeds, a loader script, scale files, a QAT file."""
    from trt_bridge.calibrate.feed_sources import source_path

    return [source_path(spec) for spec in (options.calib_data, *options.scale_files, options.qat) if spec is not None]


def _check_not_an_input(output_path: Path, model_path: Path, options: ConvertOptions) -> None:
    """The output model (and its ``.data`` file) must not replace a file the conversion reads."""
    from trt_bridge.ir.model import same_file

    for target in (output_path, output_path.with_name(output_path.name + ".data")):
        for source in input_files(model_path, options):
            if same_file(target, source):
                raise TrtBridgeError(f"the output model {output_path} would overwrite {source}, which this "
                                     "conversion reads; choose another output path with -o.")


def _check_precision_options(options: ConvertOptions) -> None:
    from trt_bridge.lower.precision import HighPrecision

    choices = [h.value for h in HighPrecision]
    if options.high_precision not in choices:
        raise TrtBridgeError(f"--high-precision {options.high_precision}: choose one of {', '.join(choices)}.")
    if options.io_types not in ("keep", "fp16", "bf16"):
        raise TrtBridgeError(f"--io-types {options.io_types}: choose keep, fp16 or bf16.")
    if options.io_types != "keep" and options.io_types != options.high_precision:
        raise TrtBridgeError(f"--io-types {options.io_types} gives the model's inputs and outputs the type of "
                             f"--high-precision, which is {options.high_precision}: pass --high-precision "
                             f"{options.io_types}, or --io-types keep.")


def _precision_report(model: onnx.ModelProto, options: ConvertOptions, kept) -> dict | None:
    from trt_bridge.lower.layer_precisions import layer_precisions

    if is_large(model):
        return None
    report = {"high_precision": options.high_precision, **layer_precisions(model)}
    if kept is not None:
        report["kept_in_float32"] = [asdict(k) for k in kept]
    return report


def feed_types(inputs, bf16: Bf16Policy):
    """The input types feeds must have once bfloat16 inputs are rewritten (``--bf16 fp32|fp16``)."""
    from dataclasses import replace

    if bf16 is Bf16Policy.KEEP:
        return inputs
    target = np.dtype(np.float32 if bf16 is Bf16Policy.FP32 else np.float16)
    return [replace(i, dtype=target) if i.dtype.name == "bfloat16" else i for i in inputs]


def _share_scales(annotations, groups: list[list[str]]) -> None:
    """Give each group (a Concat's inputs and output) one scale, the largest, so none clips. An imported
    scale (--scales FILE, --qat) outranks calibrated and model scales: the largest imported one is shared,
    with its source."""
    for group in groups:
        specs = [annotations.activations[t] for t in group if t in annotations.activations]
        if specs and all(s.scale is not None for s in specs):
            imported = [s for s in specs if s.source in (ScaleSource.FILE, ScaleSource.QAT)]
            chosen = max(imported or specs, key=lambda s: s.scale)
            for spec in specs:
                spec.scale, spec.source = chosen.scale, chosen.source


def fold_constants(graph: gs.Graph) -> None:
    """Fold constant subgraphs (a Reshape/Transpose of a weight) in place; Q/DQ stay (exact integer data), and
    so do AMD Quark's custom ops (onnxruntime cannot run them: one in the subgraph would stop all folding)."""
    from trt_bridge.lift.block_quantize_dequantize import QUARK_DOMAINS

    graph.fold_constants(should_exclude_node=lambda n: n.op in _NO_FOLD or (n.domain or "") in QUARK_DOMAINS
                         ).cleanup()


def unique_node_names(nodes: list[tuple[str, str]]) -> list[str]:
    """For (name, op type) of each node in graph order: a unique name for each, the nodes' own where they
    have one (``<op>_<index>`` otherwise, a duplicate suffixed with its index)."""
    seen: set[str] = set()
    names = []
    for i, (name, op) in enumerate(nodes):
        name = name or f"{op}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        names.append(name)
        seen.add(name)
    return names


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique name: rules, sites and reports refer to nodes by name."""
    for node, name in zip(model.graph.node, unique_node_names([(n.name, n.op_type) for n in model.graph.node])):
        node.name = name


def _finalize(model: onnx.ModelProto, opset: int, check: bool = False, min_opset: int = MIN_QDQ_OPSET
              ) -> onnx.ModelProto:
    """Drop unused opset imports, upgrade to opset ≥ ``min_opset``, infer shapes; check when asked."""
    used = {n.domain for n in model.graph.node}
    keep = [imp for imp in model.opset_import if imp.domain in ("", "ai.onnx") or imp.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    if opset < min_opset:
        from onnx import version_converter

        why = "float16 QuantizeLinear/DequantizeLinear" if min_opset > MIN_QDQ_OPSET else \
            "per-channel DequantizeLinear"
        try:
            model = version_converter.convert_version(model, min_opset)
        except Exception as exc:
            raise UnsupportedPatternError(
                f"cannot upgrade the model from opset {opset} to {min_opset} (needed for {why}): {exc}. "
                f"Re-export the model at opset {min_opset} or newer."
            ) from exc
    if model.ir_version < 7:
        model.ir_version = 7
    _unname_unknown_dims(model)
    del model.graph.value_info[:]
    if is_large(model):
        return model  # protobuf cannot hold it for in-memory checks; checked from disk after saving
    try:
        model = infer_shapes(model, strict=check)
        if check:
            onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # the output contract failed: a trt-bridge bug, not the user's
        raise InternalError(f"the converted model fails ONNX's strict checks: {str(exc).strip()}. "
                            "Please report this with the input model.") from exc
    return model


def _unname_unknown_dims(model: onnx.ModelProto) -> None:
    """Exporters write '?' for unknown dimensions; TensorRT takes equal names for equal sizes,
    so two '?' dimensions (height and width) would be forced equal. Leave them unnamed."""
    for value in (*model.graph.input, *model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param == "?":
                dim.ClearField("dim_param")


def _blocker_message(path: Path, blockers, declined) -> str:
    reasons = {d.node: d.reason for d in declined}
    lines = [f"{path}: {len(blockers)} node(s) that TensorRT cannot import could not be rewritten:"]
    for node, where in blockers[:20]:
        if where:
            why = "it sits in a control-flow subgraph, which trt-bridge does not rewrite yet"
        else:
            why = reasons.get(node.name, f"no rule handles {node.domain + '.' if node.domain else ''}{node.op} yet")
        lines.append(f"  - {where}{node.op} '{node.name}': {why}")
    if len(blockers) > 20:
        lines.append(f"  ... and {len(blockers) - 20} more")
    lines.append("Please report the pattern (with `trt-bridge convert --report`) so a rule can be added.")
    return "\n".join(lines)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` in dB (higher is better)."""
    ref = np.asarray(reference, np.float64).ravel()
    err = ref - np.asarray(test, np.float64).ravel()
    noise = float(np.sum(err * err))
    if noise == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(float(np.sum(ref * ref)) / noise))
