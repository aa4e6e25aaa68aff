"""The conversion pipeline: load → prepare → lift → place → calibrate → lower → finalize → save."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

import onnx

from trt_bridge.annotations import ScaleSource
from trt_bridge.calibrate import CalibMethod, model_inputs, open_feeds
from trt_bridge.convert.options import ConvertOptions, ScalePolicy
from trt_bridge.convert.report import ConversionReport, FloatLeftover, RuleHits
from trt_bridge.errors import CalibrationDataError, TrtBridgeError
from trt_bridge.ir.export import export_model
from trt_bridge.ir.files import check_name_lengths, check_writable, external_data_files
from trt_bridge.ir.finalize import finalize
from trt_bridge.ir.model import default_opset, load_model
from trt_bridge.ir.save import save_model
from trt_bridge.ir.size import is_large, release_memory
from trt_bridge.ir.store import WeightStore
from trt_bridge.lift.pipeline import lift_model
from trt_bridge.place.policies import place
from trt_bridge.prepare.types import feed_types

log = logging.getLogger("trt_bridge.convert")


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
    inputs = feed_types(model_inputs(model), options.precision.bf16)
    # Open (and check) the calibration source before any work, so a bad path fails fast.
    feeds = None
    if options.calibration.data is not None or options.calibration.random is not None:
        feeds = open_feeds(options.calibration.data, options.calibration.random, inputs, model=model)
        feeds.check()
    from trt_bridge.scales.apply import load_sources

    imported = load_sources(options.scales.files, options.scales.qat, model)  # matched against the source as loaded
    seconds["load"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # A model over 2 GB is held once: its lifted weights go to a private file the graph and onnxruntime map.
    store = WeightStore() if is_large(model) else None
    lifted, ctx = lift_model(model, model_path, options.precision.bf16, declared, store)
    del model
    release_memory()
    graph = gs.import_onnx(lifted)  # keeps referring to lifted's weights: no copy
    if store is not None:
        store.attach(graph)
    scales = options.scales.policy or (ScalePolicy.DATA if options.calibration.data is not None
                                       else ScalePolicy.MODEL)
    if scales is ScalePolicy.DATA:
        if feeds is None:
            raise CalibrationDataError("--scales data re-derives activation scales from calibration data: "
                                       "pass --calib-data (or use --scales model).")
        for spec in ctx.annotations.activations.values():
            spec.scale, spec.source = None, None
    placement = place(graph, ctx.annotations, options.placement,
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
                       "percentile": options.calibration.percentile if result.method is CalibMethod.PERCENTILE
                       else None,
                       "ranges": {k: {"min": o.lo, "max": o.hi, "amax": result.amax(k)}
                                  for k, o in sorted(result.observers.items())}}
        seconds["calibrate"] = time.perf_counter() - t0
    if options.ranges.recenter:
        shared = {t for group in placement.shared_scales for t in group}
        recentered = recenter(graph, ctx.annotations, result if needed else None, skip=shared,
                              center_type=None if options.precision.high_precision == "fp32"
                              else options.precision.high_precision)
    _share_scales(ctx.annotations, placement.shared_scales)
    if imported is not None and feeds is not None:  # after sharing: the scales the output will have
        from trt_bridge.scales.apply import check_against_data

        t0 = time.perf_counter()
        keep = frozenset({t for group in placement.shared_scales for t in group} | {r.tensor for r in recentered})
        check_against_data(lifted, ctx.annotations, imported, feeds, options.progress, keep)
        seconds["calibrate"] = seconds.get("calibrate", 0.0) + time.perf_counter() - t0

    ranges = None
    if options.precision.high_precision == "fp16" and feeds is not None:
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
    out_model = finalize(exported, lifted_opset, check=True, min_opset=needs_opset(quantized))
    del exported
    kept_fp32 = None
    if options.precision.high_precision != "fp32":
        from trt_bridge.lower.precision import to_low_precision

        exact = {layer: r.tensor for r in recentered for layer in r.compensated}
        out_model, kept_fp32 = to_low_precision(out_model, options.precision.high_precision, ranges,
                                                keep_io_types=options.precision.io_types == "keep", exact=exact)
        out_model = finalize(out_model, default_opset(out_model), check=True, min_opset=19)
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
        smoothed=[asdict(x) for x in smoothed], placement=options.placement.policy.value, scales=scales.value,
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
    calibration = options.calibration
    observers = {t: RangeObserver(calibration.method, calibration.percentile) for t in needed}
    todo = [] if options.ranges.smooth is None else [t for t in candidates(graph, ctx.annotations) if t in observers]
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
            smoothed, factors = smooth(graph, ctx.annotations, enough, options.ranges.smooth)
            # the candidates left unsmoothed are observed as they are
            session.run({t: Rescaled(observers[t], 1.0 / factors[t]) if t in factors else observers[t]
                         for t in todo}, feeds, options.progress, desc="calibrating (2/2)")
        skipped = len(session.skipped)
    return finish(observers, count, time.perf_counter() - start, calibration.method, skipped), smoothed


def input_files(model_path: str | Path, options: ConvertOptions) -> list[Path]:
    """Every file a conversion reads besides the model itself: feeds, a loader script, scale files, a QAT file."""
    from trt_bridge.calibrate.feed_sources import source_path

    return [source_path(spec) for spec in (options.calibration.data, *options.scales.files, options.scales.qat)
            if spec is not None]


def _check_not_an_input(output_path: Path, model_path: Path, options: ConvertOptions) -> None:
    """The output model (and its ``.data`` file) must not replace a file the conversion reads."""
    from trt_bridge.ir.files import same_file

    for target in (output_path, output_path.with_name(output_path.name + ".data")):
        for source in input_files(model_path, options):
            if same_file(target, source):
                raise TrtBridgeError(f"the output model {output_path} would overwrite {source}, which this "
                                     "conversion reads; choose another output path with -o.")


def _precision_report(model: onnx.ModelProto, options: ConvertOptions, kept) -> dict | None:
    from trt_bridge.lower.layer_precisions import layer_precisions

    if is_large(model):
        return None
    report = {"high_precision": options.precision.high_precision, **layer_precisions(model)}
    if kept is not None:
        report["kept_in_float32"] = [asdict(k) for k in kept]
    return report


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


