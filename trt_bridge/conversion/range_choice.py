"""``--calib-method auto``: choose the range method by the model's output error on held-out calibration feeds.

No single method wins on real weights (SNR in dB against the float model on evaluation inputs, float → INT8,
``scripts/accuracy_table.py``)::

    model                              max     auto
    YOLOv8n detector (nudenet 320n)    30.5    36.1 (mse)
    YOLOX-style detector (ddddocr)     26.6    29.2 (percentile 99.99)
    PP-OCRv4 text detector              5.9     7.8 (percentile 99.99)
    all-MiniLM-L6-v2 encoder           20.2    21.1 (percentile 99.999; 99.99 scored 10.9 on held-out feeds)

A detector's SiLU outputs have long tails that max wastes levels on; an encoder's outlier channels carry
meaning that clipping destroys. So the calibration keeps a histogram of every activation and holds its
last feeds out: 8 of them, or a quarter when there are fewer than 32 (``MIN_FEEDS`` at least are needed;
4 held-out feeds judged YOLOv8n's uint8 source 1.2 dB worse than 8 did). An activation must hold
``HELD_OUT_VALUES`` values there to be judged, since clipping shows only in that many; the ones that hold
fewer keep their max under every candidate. Where the
held-out feeds start, the observers are snapshot. Each candidate's scales, fitted on the feeds before the
split, go through the rest of the conversion (re-centring, shared scales, Q/DQ) on a copy of the graph;
the copy runs on the held-out feeds with Q/DQ simulated in float, and the candidate whose worst float
output is closest to the float model's wins. Max keeps the choice unless another beats it by
``MARGIN_DB`` (a few held-out feeds are a noisy judge). The final scales come from every feed, with the
chosen method.

Before:  every activation's amax = max |x| over the calibration feeds
After:   every activation's amax = the chosen method's, reported with each candidate's held-out SNR
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from trt_bridge.annotations import Annotations, WeightSpec
from trt_bridge.calibrate.observers import CalibMethod
from trt_bridge.calibrate.session import CalibrationResult, CalibrationSession, HeldOut, has_nan
from trt_bridge.conversion.refit import Refittable
from trt_bridge.errors import CalibrationDataError, TrtBridgeError
from trt_bridge.lift.weights import float_type, weight_values
from trt_bridge.verification.metrics import snr_db

log = logging.getLogger("trt_bridge.conversion")

#: the ranges ``auto`` tries, max first (it keeps ties): (method, percentile), the percentiles as offsets of the
#: ``--percentile`` option (99.99, and a tenth as much clipped: 99.999). Entropy is left out: it lost on every
#: real model measured and costs most.
CANDIDATES = ((CalibMethod.MAX, None), (CalibMethod.PERCENTILE, 1.0), (CalibMethod.PERCENTILE, 0.1),
              (CalibMethod.MSE, None))
#: quantized weights of this many bytes or more: auto judges one candidate at a time (each onnxruntime session holds
#: them dequantized to float32, four times over)
BIG_WEIGHTS = 256 << 20
#: a method must beat max by this much on the held-out feeds to replace it
MARGIN_DB = 0.25
#: fewer calibration feeds than this: no feeds to spare for judging, auto means max
MIN_FEEDS = 8
#: an activation is judged (given the candidate's range) only where the held-out feeds hold this many of its
#: values: clipping at a 99.99th percentile shows only in that many (4 feeds of 3×8×8 values judged percentile
#: better, and it lost 7 dB); smaller ones (a squeeze-excitation block's pooled vector) keep their max
HELD_OUT_VALUES = 1 << 15


@dataclass(frozen=True)
class Lowering:
    """How a candidate is lowered, as the written model will be: shared scale groups, re-centring, and the type of
    the re-centred tensors' centres (None: float32; ``--high-precision fp16`` rounds them to its type)."""

    shared: list[list[str]]
    recentre: bool
    center_type: str | None = None


@dataclass(frozen=True)
class MethodChoice:
    method: CalibMethod
    percentile: float | None = None  # for method percentile
    scores: dict[str, float] = field(default_factory=dict)  # candidate → worst output's SNR (dB) on held-out feeds
    held_out: int = 0  # feeds judged on
    reason: str = ""  # why auto fell back to max without judging, if it did
    keep_max: frozenset[str] = frozenset()  # activations too small to judge clipping on: max whatever the method
    #: the chosen candidate's Q/DQ model (ranges fitted before the held-out split), for give_back to rank layers on,
    #: and the weights every candidate was lowered with (quantized once)
    model: Any = field(default=None, repr=False, compare=False)
    weights: dict[str, WeightSpec] = field(default_factory=dict, repr=False, compare=False)
    #: the ``also`` models of :func:`choose_method`: name → (held-out SNR, None where it has no float output; the
    #: model; why it could not be made or run, else ""); they do not compete
    also: dict[str, tuple[float | None, Any, str]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def label(self) -> str:
        return label(self.method, self.percentile)

    def describe(self) -> str:
        if not self.scores:
            return f"auto: max ({self.reason})"
        judged = ", ".join(f"{m} {s:.1f}" for m, s in self.scores.items())
        small = f"; {len(self.keep_max)} small activation(s) keep max" if self.keep_max else ""
        return f"auto: {self.label} (held-out SNR on {self.held_out} feed(s): {judged} dB{small})"


def label(method: CalibMethod, percentile: float | None) -> str:
    return f"percentile {percentile:.12g}" if method is CalibMethod.PERCENTILE else method.value


def fallback(reason: str) -> MethodChoice:
    return MethodChoice(CalibMethod.MAX, reason=reason)


def too_few(total: int) -> MethodChoice:
    return fallback(f"{total} calibration feed(s), fewer than {MIN_FEEDS} to judge by")


def choose_method(graph, annotations: Annotations, needed: list[str], held_out: HeldOut,
                  lowering: Lowering, observers: dict, percentile: float = 99.99,
                  also: dict[str, Callable[[dict[str, WeightSpec]], Any]] | None = None) -> MethodChoice:
    """Score every candidate on ``held_out`` (see the module doc); the graph and annotations are not changed.
    ``observers``: the calibration's, over every feed (their counts size the held-out split); ``percentile``:
    the ``--percentile`` option, which the percentile candidates start from. ``also``: other models to score
    beside the candidates, in the same pipeline (name → a function of the quantized weights that makes the model,
    whatever the method; a TrtBridgeError it raises, or its model's, gives it no score): their scores and models
    come back in ``MethodChoice.also``, and do not compete. If no candidate is judged (too few feeds, one did not
    run), neither are they."""
    if held_out.total is None or held_out.total < MIN_FEEDS or not held_out.size:
        return too_few(held_out.total or 0)
    if not held_out.outputs:
        return fallback("every held-out feed was left out (NaN or Inf)")
    kept = len(held_out.outputs)
    seen = {t: observers[t].count / max(held_out.total, 1) for t in needed}
    unclipped = not any(v * kept >= HELD_OUT_VALUES for v in seen.values())
    if unclipped and not also:
        largest = max(seen, key=seen.get, default=None)
        return fallback(f"the largest activation ('{largest}', {int(seen.get(largest, 0))} value(s) per feed) "
                        f"holds fewer than {HELD_OUT_VALUES} values in the {kept} held-out feed(s) kept, "
                        "too few to judge clipping by")
    # too few values to judge clipping by, but the ``also`` models (runtime ranges) are judged beside max: a
    # decoder's one-token decode feeds hold a few hundred values per activation
    small = frozenset(t for t, v in seen.items() if unclipped or v * kept < HELD_OUT_VALUES)
    missing = [t for t in needed if t not in held_out.snapshot]
    if missing:
        return fallback(f"'{missing[0]}' was not observed before the held-out feeds")
    feeds, outputs = held_out.feeds, held_out.outputs
    weights = quantized_weights(graph, annotations)
    candidates = []
    for method, clipped in CANDIDATES:
        pct = None if clipped is None else 100.0 - (100.0 - percentile) * clipped
        if method is CalibMethod.PERCENTILE and pct >= 100.0:  # every percentile ≥ 100 is the max
            continue
        if unclipped and method is not CalibMethod.MAX:
            continue
        candidates.append((method, pct, label(method, pct)))
    scores: dict[str, float] = {}
    # onnxruntime judges two candidates (without the GIL) while the next is built; the weights are quantized once,
    # and a model whose weights fill much memory is judged one candidate at a time
    workers = 2 if sum(spec.codes.nbytes for spec in weights.values()) < BIG_WEIGHTS else 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        jobs, built = [], None
        for method, pct, name in candidates:
            fitted = fitted_on(held_out, method, pct, small)
            try:  # the last candidate built, re-fitted where the ranges keep its structure (convert.refit)
                model = built.refit(fitted) if built is not None else None
                if model is None:
                    built = Refittable(graph, annotations, weights, needed, fitted, lowering)
                    model = built.model
            except TrtBridgeError as exc:
                return fallback(f"the {name} candidate could not be made ({str(exc).splitlines()[0]})")
            jobs.append((name, model, pool.submit(score, model, feeds, outputs)))
        others: dict[str, tuple[Any, Any]] = {}
        for name, make in (also or {}).items():
            try:
                model = make(weights)
            except TrtBridgeError as exc:
                others[name] = (None, f"could not be made ({str(exc).splitlines()[0]})")
                continue
            others[name] = (model, pool.submit(score, model, feeds, outputs))
        models = {}
        for name, model, job in jobs:
            models[name] = model
            try:
                got = job.result()
            except TrtBridgeError as exc:  # a candidate onnxruntime cannot run: judge nothing, keep max
                return fallback(f"the {name} candidate did not run ({str(exc).splitlines()[0]})")
            if got is None:
                return fallback("the model has no float output to judge by")
            scores[name] = got
            log.info("calibration range %s: held-out SNR %.2f dB", name, got)
    if all(np.isneginf(v) for v in scores.values()):
        return fallback("the held-out outputs hold NaN or Inf where the float model's do not (or the reverse)")
    best = max(scores, key=scores.get)
    if scores[best] < scores[CalibMethod.MAX.value] + MARGIN_DB:
        best = CalibMethod.MAX.value
    method, pct = next((m, p) for m, p, n in candidates if n == best)
    return MethodChoice(method, pct, scores=scores, held_out=kept, keep_max=small, model=models[best],
                        weights=weights, also=_results(others))


def _results(jobs: dict[str, tuple[Any, Any]]) -> dict[str, tuple[float | None, Any, str]]:
    """``MethodChoice.also`` from name → (model, the future of its score, or the reason it has none)."""
    done = {}
    for name, (model, job) in jobs.items():
        if isinstance(job, str):
            done[name] = (None, None, job)
            continue
        try:
            done[name] = (job.result(), model, "")
        except TrtBridgeError as exc:
            done[name] = (None, model, f"did not run ({str(exc).splitlines()[0]})")
    return done


def fitted_on(held_out: HeldOut, method: CalibMethod, percentile: float | None, keep_max: frozenset[str]
              ) -> CalibrationResult:
    """The ranges ``method`` fits on the feeds before the held-out split (the observers' snapshot)."""
    return CalibrationResult(held_out.snapshot, held_out.total - held_out.size, 0.0, method, percentile=percentile,
                             keep_max=keep_max)


def fit_feeds(feeds, held_out: HeldOut, count: int) -> list[dict]:
    """The first ``count`` feeds of ``feeds`` (read again from the start) without a NaN input (an input's ±Inf is
    a mask's, as calibration takes it), among those before the held-out ones."""
    found = []
    if count <= 0:
        return found
    with contextlib.closing(iter(feeds)) as iterator:
        for feed in itertools.islice(iterator, max(0, (held_out.total or 0) - held_out.size)):
            if not any(has_nan(v) for v in feed.values()):
                found.append(feed)
                if len(found) == count:
                    break
    return found


def quantized_weights(graph, annotations: Annotations) -> dict[str, WeightSpec]:
    """Copies of the weight annotations with their int8 values filled in once (the same for every candidate:
    quantizing them for each would cost more than the rest of the candidate)."""
    tensors = graph.tensors()
    done = {}
    for name, spec in annotations.weights.items():
        spec = replace(spec, sites=list(spec.sites))
        if spec.codes is None or spec.scale is None:
            spec.codes, spec.scale = weight_values(replace(spec), tensors[name], float_type(tensors[name], "weight"))
        done[name] = spec
    return done


def candidate_model(graph, annotations: Annotations, weights: dict[str, WeightSpec], needed: list[str],
                    fitted: CalibrationResult, lowering: Lowering, drop=()):
    """The Q/DQ model the conversion would write with ``fitted``'s scales, the layers ``drop`` left in float (on
    copies; float32 throughout but for the centres' type)."""
    return Refittable(graph, annotations, weights, needed, fitted, lowering, drop).model


def score(model, feeds: list, outputs: list) -> float | None:
    """The worst float output's SNR (dB) against the float model's ``outputs`` on ``feeds``, over the values
    finite in both; -inf for an output whose NaN/Inf positions differ from the float model's (the SNR of the
    rest would hide that). None: no float output."""
    names = sorted({name for out in outputs for name, v in out.items()
                    if np.issubdtype(np.asarray(v).dtype, np.floating)})
    if not names:
        return None
    with CalibrationSession(model, [], simulate_qdq=True, what="a candidate of --calib-method auto") as session:
        try:
            got = [dict(zip(names, values)) for _, values in session.outputs(names, feeds)]
        except Exception as exc:  # onnxruntime's own errors: the caller falls back to max, naming it
            raise CalibrationDataError(f"onnxruntime failed on it: {exc}") from exc
    worst = np.inf
    for name in names:
        ref = np.concatenate([np.asarray(o[name], np.float64).ravel() for o in outputs])
        out = np.concatenate([np.asarray(g[name], np.float64).ravel() for g in got])
        finite = np.isfinite(ref)
        if not np.array_equal(finite, np.isfinite(out)) or not np.array_equal(ref[~finite], out[~finite],
                                                                               equal_nan=True):
            return -np.inf
        worst = min(worst, snr_db(ref[finite], out[finite]) if finite.any() else np.inf)
    return float(worst)
