"""``trt-bridge verify``: is the converted model still accurate, and does the engine compute what
onnxruntime computes?

Runs on Polygraphy: ``OnnxrtRunner`` for the reference and the candidate (Q/DQ simulated in float
the way TensorRT computes it: :mod:`trt_bridge.runtime.session`), ``TrtRunner`` for an engine, the
``Comparator`` to run them on the same feeds, and ``RunResults`` (Polygraphy's JSON format) to
save and load outputs, so a CPU machine can produce the reference and a GPU runner compare its
engine against it. The metrics and gates are ours (:mod:`.metrics`, :mod:`.gates`): element-wise
tolerances do not fit INT8.

A decoder with a key/value cache (:func:`.decoder.decoder_signature`) is compared in a greedy generation loop
instead of on independent feeds (:mod:`.generation`).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from trt_bridge.calibrate import model_inputs, open_feeds
from trt_bridge.calibrate.feed_sources import RandomFeeds
from trt_bridge.calibrate.feeds import validate_feed
from trt_bridge.choices import check_bound
from trt_bridge.errors import CalibrationDataError, TrtBridgeError
from trt_bridge.ir.model import load_model, read_model
from trt_bridge.plugins.registry import register_for_engine
from trt_bridge.runtime.fp4_dynamic import has_fp4_dynamic
from trt_bridge.runtime.session import session
from trt_bridge.tensorrt import gpu_present, import_tensorrt, is_rtx
from trt_bridge.tensorrt.build import costs_or_none
from trt_bridge.tensorrt.costs import COST_TARGET, EngineCosts
from trt_bridge.verification.decoder import decoder_pair
from trt_bridge.verification.gates import Gate, apply_gates
from trt_bridge.verification.generation import GenerationOptions, GenerationReport, compare_generation
from trt_bridge.verification.layers import Localization, localize
from trt_bridge.verification.metrics import Accumulator, OutputMetrics, json_safe, snr_text

log = logging.getLogger("trt_bridge.verification")

REFERENCE, CANDIDATE, ENGINE = "reference", "candidate", "engine"
DEFAULT_RANDOM_FEEDS = 8


@dataclass(frozen=True)
class VerifyOptions:
    data: str | None = None  # feeds, as calibration takes them (npz, folder, loader script)
    random: int | None = None  # N seeded random feeds (the default, 8, when no data is given)
    seed: int = 0
    shapes: dict[str, tuple[int, ...]] | None = None  # shapes of dynamic inputs for --random feeds
    engine: str | None = None  # a serialized TensorRT engine of the candidate (needs a GPU)
    gates: tuple[Gate, ...] = ()
    top_k: int = 5
    per_layer: bool = False
    layer_batch: int = 64  # tensors exposed per session in --per-layer
    layer_feeds: int = 8  # feeds used by --per-layer (the first ones)
    save_outputs: str | None = None
    load_outputs: str | None = None
    save_inputs: str | None = None
    load_inputs: str | None = None
    progress: bool = True
    plugins: tuple[str, ...] = ()  # --engine: plugin files to register besides those the sidecar lists
    #: build both ONNX models ahead of time for this compute capability and report their engines' size and
    #: activation memory beside the accuracy (TensorRT-RTX; None: not measured)
    costs: str | None = COST_TARGET
    #: the generation loop of a decoder (None: its defaults; given for a model that is no decoder: an error)
    generation: GenerationOptions | None = None

    def __post_init__(self) -> None:  # the bounds the command line checks (trt_bridge.choices.BOUNDS)
        for name in ("random", "seed", "top_k", "layer_batch", "layer_feeds"):
            check_bound(name, getattr(self, name))


@dataclass
class VerifyReport:
    reference: str
    candidate: str
    engine: str | None
    feeds: int
    outputs: list[OutputMetrics] = field(default_factory=list)
    per_layer: Localization | None = None
    seconds: float = 0.0
    #: the engines' costs, "reference" / "candidate" → tensorrt.costs.EngineCosts (None: not measured)
    costs: dict[str, EngineCosts] | None = None
    #: a decoder's generation loop (then ``feeds`` counts its prompts and ``outputs`` holds its logits)
    generation: GenerationReport | None = None
    #: the models (paths) onnxruntime ran through an emulation of TensorRT-only ops (runtime/fp4_dynamic.py)
    emulated: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.outputs) and (self.generation is None or self.generation.passed)

    def __bool__(self) -> bool:
        return self.passed

    def to_dict(self) -> dict:
        data = asdict(self)
        data["passed"] = self.passed
        if self.per_layer is not None:
            data["per_layer"]["exclude_nodes"] = self.per_layer.exclude_nodes()
        if self.generation is not None:
            data["generation"] = self.generation.to_dict()
        return data

    def to_json(self) -> str:

        return json.dumps(json_safe(self.to_dict()), indent=2, default=str, allow_nan=False)

    def quiet(self) -> str:
        return "\n".join([m.line() for m in self.outputs] + (self.generation.lines() if self.generation else []))

    def summary(self) -> str:
        gen = self.generation
        lines = [f"verify {self.candidate} against {self.reference}"
                 + (f" and engine {self.engine}" if self.engine else "") + f" on {self.feeds} feed(s)" if gen is None
                 else f"verify {self.candidate} against {self.reference}: greedy generation loop of a decoder, "
                      f"{gen.prompts} prompt(s) x {gen.steps} step(s), prompts {gen.source}"]
        lines += ["  " + line for line in (gen.lines() if gen else [])]
        lines += ["  " + m.line() for m in self.outputs]
        if self.emulated:
            lines.append(f"  compared an emulation: ran {', '.join(self.emulated)}'s TRT_FP4DynamicQuantize "
                         "through onnxruntime as its exact emulation in standard ops, not TensorRT's kernels")
        if self.per_layer is not None:

            loc = self.per_layer
            lines.append(f"  per layer: {len(loc.tensors)} tensors aligned, {len(loc.layers)} quantized layers, "
                         f"{loc.batches} batch(es), {loc.feeds} feed(s); largest error made on its own (and "
                         "added along the graph):")
            for layer in loc.layers[:5]:
                made = "makes no error" if layer.isolated_db is None else \
                    f"makes error at {snr_text(layer.isolated_db)} dB SNR on its own"
                added = "adds no error" if layer.added_db is None else \
                    f"adds error at {snr_text(layer.added_db)} dB SNR"
                lines.append(f"    {layer.op} '{layer.node}': {made}; {added} "
                             f"(input {snr_text(layer.snr_in_db)} dB → output {snr_text(layer.snr_out_db)} dB)")
            suggestion = loc.exclude_nodes()
            lines.append(f"  keep in higher precision: convert --exclude-nodes {shlex.quote(suggestion)}" if suggestion
                         else "  no quantized layer adds error: nothing to keep in higher precision")
            if loc.reference_lifted:
                lines.append("  (per layer, the quantized reference is measured in its lifted float form, as convert "
                             "lifts it: what the source stands for, without its own quantization error)")
        if self.costs:
            mine, theirs = self.costs["candidate"], self.costs["reference"]
            lines.append(f"  costs ({mine.target}): {mine.against(theirs).replace('float', 'reference')}")
        lines.append(f"  {'PASS' if self.passed else 'FAIL'} ({self.seconds:.2f} s)")
        return "\n".join(lines)


def verify(reference: str | Path, candidate: str | Path, options: VerifyOptions = VerifyOptions()) -> VerifyReport:
    """Compare ``candidate`` (and an engine) against ``reference`` on the same feeds."""
    with QuietPolygraphy():
        return _verify(Path(reference), Path(candidate), options)


def _verify(reference: Path, candidate: Path, options: VerifyOptions) -> VerifyReport:
    start = time.perf_counter()
    decoders = _decoders(reference, candidate, options)
    if decoders:
        return _verify_decoder(reference, candidate, decoders, options, start)
    feeds = checked_feeds(reference, candidate, options)
    results = _run(reference, candidate, feeds, options)
    if options.save_outputs:
        try:
            results.save(options.save_outputs)
        except OSError as exc:
            raise TrtBridgeError(f"cannot write {options.save_outputs}: {exc.strerror or exc}.") from exc
    report = VerifyReport(str(reference), str(candidate), options.engine, len(feeds),
                          emulated=_emulated(reference, candidate))
    for runner in (CANDIDATE, ENGINE):
        if runner in results.keys():
            report.outputs += _compare(results[REFERENCE], results[runner], runner, options.top_k)
    apply_gates(list(options.gates), report.outputs)
    if options.per_layer:
        try:
            report.per_layer = localize(reference, candidate, feeds[:options.layer_feeds], options.layer_batch,
                                        progress=options.progress)
        except TrtBridgeError:
            raise
        except Exception as exc:  # onnxruntime on a model or feed it cannot run
            raise TrtBridgeError(f"--per-layer: onnxruntime failed while running {reference} and {candidate} with "
                                 f"their tensors exposed: {_first_line(exc)}") from exc
    report.costs = _costs(reference, candidate, options)
    report.seconds = time.perf_counter() - start
    return report


def _emulated(*paths: Path) -> list[str]:
    """Those of ``paths`` that onnxruntime runs through the emulation of TensorRT's dynamic FP4 quantization."""
    return [str(path) for path in paths if has_fp4_dynamic(read_model(path, external_data=False))]


def _decoders(reference: Path, candidate: Path, options: VerifyOptions):
    """(headers, signatures) of the two models when both are decoders with a key/value cache, else None."""
    for path in (reference, candidate):
        if not path.is_file():
            raise TrtBridgeError(f"{path}: no such file. Check the path to the ONNX model.")
    headers = (_header(reference), _header(candidate))
    signatures = decoder_pair((reference, candidate), headers, options.generation is not None)
    return (headers, signatures) if signatures else None


def _verify_decoder(reference: Path, candidate: Path, decoders, options: VerifyOptions, start: float):
    refused = [flag for flag, value in (("--engine", options.engine), ("--per-layer", options.per_layer),
                                        ("--random", options.random is not None), ("--shapes", options.shapes),
                                        ("--save-outputs", options.save_outputs),
                                        ("--load-outputs", options.load_outputs),
                                        ("--save-inputs", options.save_inputs), ("--load-inputs", options.load_inputs))
               if value]
    if refused:
        raise TrtBridgeError(f"{candidate} is a decoder with a key/value cache, compared in a generation loop, where "
                             f"{refused[0]} does not apply: drop it (the loop takes --data with input_ids prompts, "
                             "--prompts, --steps, --prompt-length).")
    generation = replace(options.generation or GenerationOptions(), data=options.data, seed=options.seed)
    gen, logits = compare_generation(reference, candidate, *decoders, generation, options.top_k)
    report = VerifyReport(str(reference), str(candidate), None, gen.prompts, [logits], generation=gen,
                          emulated=_emulated(reference, candidate))
    apply_gates(list(options.gates), report.outputs)
    report.costs = _costs(reference, candidate, options)
    report.seconds = time.perf_counter() - start
    return report


def _costs(reference: Path, candidate: Path, options: VerifyOptions) -> dict[str, EngineCosts] | None:
    if not options.costs:
        return None
    measured = {"reference": costs_or_none(reference, options.costs),
                "candidate": costs_or_none(candidate, options.costs, options.plugins)}
    return measured if all(measured.values()) else None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def checked_feeds(reference: Path, candidate: Path, options: VerifyOptions) -> list[dict[str, np.ndarray]]:
    """The feeds, validated against both models' inputs (names, types, shapes, broadcasts)."""

    for path in (reference, candidate):
        if not path.is_file():
            raise TrtBridgeError(f"{path}: no such file. Check the path to the ONNX model.")
    cand = load_model(candidate)
    inputs = model_inputs(cand)
    ref_inputs = model_inputs(_header(reference))
    if {i.name for i in ref_inputs} != {i.name for i in inputs}:
        raise TrtBridgeError(f"{reference} and {candidate} have different inputs ("
                             f"{', '.join(sorted(i.name for i in ref_inputs))} vs {', '.join(i.name for i in inputs)}"
                             "): verify compares two forms of one model.")
    given = [flag for flag, value in (("--load-inputs", options.load_inputs), ("--data", options.data),
                                      ("--random", options.random)) if value is not None]
    if len(given) > 1:
        raise TrtBridgeError(f"give one source of feeds: {' and '.join(given)} were both given.")
    if options.load_inputs:
        from polygraphy.json import load_json

        try:
            loaded = load_json(options.load_inputs, description="input data")
        except Exception as exc:  # missing file, not JSON, not Polygraphy's format
            raise TrtBridgeError(f"{options.load_inputs}: cannot read saved inputs ({_first_line(exc)}); give a file "
                                 "written by verify --save-inputs.") from exc
        if not isinstance(loaded, list):
            raise TrtBridgeError(f"{options.load_inputs}: not a list of feeds; give a file written by --save-inputs.")
        feeds = [validate_feed(feed, inputs, f"{options.load_inputs} (feed {i})") for i, feed in enumerate(loaded)]
    elif options.data is not None:
        feeds = list(open_feeds(options.data, None, inputs, model=cand, flag="verify reads at most that many"))
    else:
        count = options.random if options.random is not None else DEFAULT_RANDOM_FEEDS
        if count < 1:
            raise TrtBridgeError("--random needs a positive number of feeds.")
        if options.random is None:
            log.warning("no --data: comparing on %d random feeds (seed %d); real inputs give meaningful numbers",
                        count, options.seed)
        shaped = inputs
        if options.shapes:
            from dataclasses import replace

            unknown = sorted(set(options.shapes) - {i.name for i in inputs})
            if unknown:
                raise TrtBridgeError(f"--shapes names '{unknown[0]}', which is not an input of {candidate}.")
            shaped = [replace(i, shape=tuple(options.shapes[i.name])) if i.name in options.shapes else i
                      for i in inputs]
        feeds = list(RandomFeeds(count, shaped, options.seed).check_broadcasts(cand))
    del cand
    if not feeds:
        raise CalibrationDataError(f"{options.data or options.load_inputs}: no feeds found.")
    for i, feed in enumerate(feeds):  # the reference must take them too (its declared shapes may be stricter)
        validate_feed(feed, ref_inputs, f"feed {i} for the reference {reference}")
    if options.save_inputs:
        from polygraphy.json import save_json

        try:
            save_json(feeds, options.save_inputs, description="input data")
        except OSError as exc:
            raise TrtBridgeError(f"cannot write {options.save_inputs}: {exc.strerror or exc}.") from exc
    return feeds


def _header(path: Path):
    """The model's graph without its weights (inputs, outputs, nodes), its external data checked
    (:func:`~trt_bridge.ir.model.read_model`); a clear error when it is not ONNX."""
    return read_model(path, external_data=False)


def _run(reference: Path, candidate: Path, feeds, options: VerifyOptions):
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.comparator import Comparator, RunResults

    loaded = RunResults()
    if options.load_outputs:
        try:
            loaded = RunResults.load(options.load_outputs)
        except Exception as exc:  # missing file, not JSON, not Polygraphy's RunResults
            raise TrtBridgeError(f"{options.load_outputs}: cannot read saved outputs ({_first_line(exc)}); give a "
                                 "file written by verify --save-outputs.") from exc
        if REFERENCE not in loaded.keys():
            raise TrtBridgeError(f"{options.load_outputs} holds no '{REFERENCE}' results (it has "
                                 f"{', '.join(loaded.keys()) or 'none'}); save it with verify --save-outputs.")
        count = len(loaded[REFERENCE])
        if count != len(feeds):
            raise TrtBridgeError(f"{options.load_outputs} holds outputs of {count} feed(s) but {len(feeds)} feed(s) "
                                 "are given: load the inputs they were made from (--load-inputs).")
    # Only the reference comes from the file: the candidate (and the engine) always run, so a rebuilt
    # candidate is measured anew.
    runners = []
    if REFERENCE not in loaded.keys():
        runners.append(OnnxrtRunner(lambda: session(reference, simulate_qdq=True), name=REFERENCE))
    runners.append(OnnxrtRunner(lambda: session(candidate, simulate_qdq=True), name=CANDIDATE))
    if options.engine:
        runners.append(_engine_runner(options.engine, options.plugins))
    try:
        results = Comparator.run(runners, data_loader=feeds)
    except Exception as exc:  # onnxruntime or TensorRT rejecting a model or a feed
        hint = "" if options.data or options.load_inputs else (" on random feeds (1 for each dynamic dimension: give "
                                                               "verify --data, convert --eval-data, or --shapes)")
        raise TrtBridgeError(f"running the models failed{hint}: {_first_line(exc)}") from exc
    if REFERENCE in loaded.keys():
        results.append((REFERENCE, loaded[REFERENCE]))
    return results


class QuietPolygraphy:
    """Polygraphy logs each runner's progress on stdout, which would mix with `--json` output: keep it to
    errors unless trt-bridge runs with -vv, and without its colour probe."""

    def __enter__(self):
        from polygraphy.logger import G_LOGGER

        self.saved = (G_LOGGER.module_severity, G_LOGGER.colors)
        if not log.isEnabledFor(logging.DEBUG):
            G_LOGGER.module_severity = G_LOGGER.ERROR
        G_LOGGER.colors = False
        return self

    def __exit__(self, *exc):
        from polygraphy.logger import G_LOGGER

        G_LOGGER.module_severity, G_LOGGER.colors = self.saved


def _engine_runner(engine: str, plugins: tuple[str, ...] = ()):
    """Polygraphy's TrtRunner over the serialized engine; running needs an NVIDIA GPU."""
    path = Path(engine)
    if not path.is_file():
        raise TrtBridgeError(f"{engine}: no such engine file. Build one with `trt-bridge build`, or drop --engine.")
    trt = import_tensorrt()
    if is_rtx(trt):
        os.environ.setdefault("POLYGRAPHY_USE_TENSORRT_RTX", "1")  # Polygraphy's switch to tensorrt_rtx
    if not gpu_present():
        raise TrtBridgeError(f"running the engine {engine} needs an NVIDIA GPU, and this machine has none. Compare "
                             "here without --engine and --save-outputs/--save-inputs, then run verify --engine "
                             "--load-outputs/--load-inputs on a GPU machine.")
    register_for_engine(trt, path, plugins)
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(path))), name=ENGINE)


def _compare(reference_iterations, candidate_iterations, runner: str, k: int) -> list[OutputMetrics]:
    names = list(reference_iterations[0].keys())
    accumulators = {name: Accumulator(k) for name in names}
    for ref, cand in zip(reference_iterations, candidate_iterations):
        for name in names:
            if name not in cand:
                raise TrtBridgeError(f"the {runner} has no output '{name}' (it has {', '.join(cand.keys())}).")
            try:
                accumulators[name].add(ref[name], cand[name])
            except ValueError as exc:
                raise TrtBridgeError(f"output '{name}' of the {runner}: {exc}.") from exc
    return [acc.result(name, runner) for name, acc in accumulators.items()]


__all__ = ["VerifyOptions", "VerifyReport", "verify"]
