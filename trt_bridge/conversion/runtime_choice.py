"""``--runtime-ranges``: which activations are quantized on their range in each inference
(:mod:`trt_bridge.lower.runtime_ranges`) instead of a calibrated one.

A dynamically quantized source computed its activations' ranges per inference; runtime ranges do the same inside
TensorRT's own INT8 layers, at the price of two reductions and two pointwise passes per activation. Where the
ranges hardly move from input to input, calibrated scales are as accurate and cost nothing; where they move, a
static model loses (SNR in dB against the float model on evaluation inputs, ``scripts/accuracy_table.py``'s)::

    dynamic source                        source   static   with auto   held-out static / runtime
    ddddocr CRNN (shipped)                 30.5     26.9      30.9       29.4 / 29.8
    MiniLM-L3, int8 per channel            21.8     23.8      27.9
    YOLOv8n, uint8 weights                 33.2     32.6      32.6       36.3 / 33.6 (kept static)

So ``auto`` (the default) measures: with ``--calib-method auto``, the model with runtime ranges on every activation
the source quantized dynamically (and that can have one) runs on the held-out calibration feeds beside auto's
chosen static model, and replaces it unless it scores ``MARGIN_DB`` lower. The held-out feeds come from the data
the static scales were fitted to, so they flatter those: a tie goes to runtime ranges (the static CRNN lost 2.5 dB
more on other inputs than on its held-out feeds; the runtime one gained 1.1). Give-back and bias correction then
measure the model with runtime ranges (bias correction leaves their layers alone). A dynamic source converted
without calibration data gets runtime ranges where it can (the source's own ranges, nothing to judge against).
``on``: every activation that can, dynamic source or not, without judging (and without calibration data for them).
``off``: calibrated scales only.

Before:  every activation a dynamic source quantized at run time gets one calibrated scale
After:   those activations keep a range per input, where that measured better (reported with both scores)
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trt_bridge.annotations import Annotations
from trt_bridge.calibrate.observers import CalibMethod
from trt_bridge.calibrate.session import CalibrationResult, HeldOut
from trt_bridge.conversion import range_choice
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.save import save_model
from trt_bridge.lower import runtime_ranges
from trt_bridge.tensorrt.build import costs_or_none
from trt_bridge.tensorrt.costs import COST_TARGET

#: runtime ranges replace the static model unless they score this much below it on the held-out feeds
MARGIN_DB = 0.0
#: --prefer balanced (the default): runtime ranges that make the engine this much larger than the static model's
#: (an ahead-of-time build of each) are kept only for a held-out gain of GAIN_DB or more
GROWTH_CAP = 0.25
GAIN_DB = 1.0
#: the name of the runtime-range model among those auto judges beside its candidates (``MethodChoice.also``)
RUNTIME = "runtime ranges"


@dataclass(frozen=True)
class RuntimeChoice:
    """What ``--runtime-ranges`` decided (the report's ``runtime_ranges``)."""

    mode: str
    tensors: tuple[str, ...] = ()  # the activations given runtime ranges
    considered: int = 0  # the activations it could have applied to (dynamic ones under auto)
    declined: dict[str, str] = field(default_factory=dict)  # activation → why it keeps a calibrated scale
    scores: dict[str, float | None] = field(default_factory=dict)  # "static" / "runtime" → held-out SNR (dB)
    reason: str = ""  # why these (or none) were chosen
    #: the engines weighed (--prefer balanced): "static" / "runtime" → bytes of an ahead-of-time build
    engines: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "tensors": list(self.tensors), "considered": self.considered,
                "declined": dict(sorted(self.declined.items())),
                "scores": {k: None if v is None else round(v, 2) for k, v in self.scores.items()},
                "engines": dict(self.engines), "reason": self.reason}


def eligible(graph, annotations: Annotations, needed: list[str], every: bool, excluded: dict[str, str]
             ) -> tuple[list[str], dict[str, str], int]:
    """(the ``needed`` activations that can have runtime ranges, the others with their reason, how many were
    considered): every needed one with ``every``, else those the source quantized dynamically."""
    considered = [t for t in needed if every or annotations.activations[t].dynamic]
    found, declined = [], {}
    nodes, tensors = {n.name: n for n in graph.nodes}, graph.tensors()
    for tensor in considered:
        got = runtime_ranges.match(nodes, tensors, annotations, annotations.activations[tensor], excluded)
        if isinstance(got, str):
            declined[tensor] = got
        else:
            found.append(tensor)
    return found, declined, len(considered)


def mark(annotations: Annotations, tensors) -> None:
    """Give ``tensors`` runtime ranges (in place): lowering writes them, calibration skips them."""
    for tensor in tensors:
        spec = annotations.activations[tensor]
        spec.runtime, spec.scale, spec.source = True, None, None


def marked(annotations: Annotations, tensors) -> Annotations:
    """A copy of ``annotations`` with ``tensors`` marked (for a candidate model)."""
    work = Annotations(activations=copy.deepcopy(annotations.activations), weights=annotations.weights)
    mark(work, tensors)
    return work


def beside(graph, annotations: Annotations, needed: list[str], candidates, lowering: range_choice.Lowering) -> dict:
    """The runtime-range model for :func:`~trt_bridge.conversion.range_choice.choose_method` to judge beside its
    candidates (its ``also``), where it does not depend on their method: every activation to calibrate can have a
    runtime range (``candidates``: :func:`eligible`'s answer, or None). Otherwise :func:`judge` makes it after the
    choice."""
    found = candidates[0] if candidates is not None else []
    if not found or set(found) != set(needed):
        return {}
    work = marked(annotations, found)
    nothing = CalibrationResult({}, 0, 0.0, CalibMethod.MAX)  # no activation is left to range

    def make(weights):
        return range_choice.candidate_model(graph, work, weights, [], nothing, lowering)

    return {RUNTIME: make}


def engine_sizes(static_model, runtime_model) -> dict[str, int]:
    """Bytes of an ahead-of-time TensorRT-RTX build (for ``COST_TARGET``) of each model; {} where none can be built
    here."""
    with tempfile.TemporaryDirectory(prefix="trt-bridge-weigh-") as tmp:
        sizes = {}
        for name, model in (("static", static_model), ("runtime", runtime_model)):
            path = save_model(model, Path(tmp) / f"{name}.onnx")
            costs = costs_or_none(path, COST_TARGET)
            if costs is None:
                return {}
            sizes[name] = costs.engine_bytes
        return sizes


def weigh(gain: float, static_model, runtime_model, prefer: str) -> tuple[bool, str, dict[str, int]]:
    """Whether runtime ranges that gain ``gain`` dB on the held-out feeds are worth their cost under ``prefer``, why,
    and the engine sizes weighed. ``accuracy``: any gain (a tie too); ``size``: never; ``balanced``: any gain while
    the engine grows at most ``GROWTH_CAP`` over the static model's, else ``GAIN_DB`` or more."""
    if prefer == "size":
        return False, "--prefer size keeps calibrated scales (no per-inference ranges)", {}
    if gain < -MARGIN_DB:
        return False, f"{-gain:.1f} dB below the static model", {}
    if prefer == "accuracy" or gain >= GAIN_DB:
        return True, f"{gain:+.1f} dB against the static model", {}
    sizes = engine_sizes(static_model, runtime_model)
    if not sizes:
        return True, f"{gain:+.1f} dB against the static model (no TensorRT builder here to weigh the engines)", {}
    growth = sizes["runtime"] / sizes["static"] - 1
    engines = (f"engine {growth:+.0%} ({sizes['static'] / 1e6:.1f} → {sizes['runtime'] / 1e6:.1f} MB, "
               f"SM {COST_TARGET})")
    if growth <= GROWTH_CAP:
        return True, f"{gain:+.1f} dB against the static model for an {engines}", sizes
    return False, (f"{gain:+.1f} dB against the static model is not worth an {engines}: --prefer balanced keeps "
                   f"runtime ranges growing the engine over {GROWTH_CAP:.0%} only for {GAIN_DB:g} dB; --prefer "
                   "accuracy keeps them"), sizes


def judge(graph, annotations: Annotations, choice, held_out: HeldOut | None, needed: list[str], candidates,
          lowering: range_choice.Lowering, prefer: str = "balanced") -> tuple[RuntimeChoice, Any]:
    """``--runtime-ranges auto`` with calibration data: the dynamic source's activations that can have runtime ranges
    (``candidates``: :func:`eligible`'s answer) get them if the held-out feeds score them no more than ``MARGIN_DB``
    below auto's static ``choice`` (marked in ``annotations``). Returns the choice and, when made, the model with
    them (fitted before the held-out split)."""
    found, declined, considered = candidates
    judged = RuntimeChoice("auto", (), considered, declined)
    if not found:
        return replace(judged, reason="no activation the source quantized dynamically can have a runtime range"
                       if considered else "the source quantized no activation dynamically"), None
    if choice is None or not choice.scores:
        why = choice.reason if choice is not None else "judged with --calib-method auto only"
        return replace(judged, declined={**declined, **{t: f"not judged ({why})" for t in found}},
                       reason=f"not judged: {why}; --runtime-ranges on applies them"), None
    static = choice.scores[choice.label]
    if RUNTIME in choice.also:  # judged beside auto's candidates
        got, model, problem = choice.also[RUNTIME]
    else:
        fitted = range_choice.fitted_on(held_out, choice.method, choice.percentile, choice.keep_max)
        try:
            model = range_choice.candidate_model(graph, marked(annotations, found), choice.weights,
                                                 [t for t in needed if t not in found], fitted, lowering)
            got, problem = range_choice.score(model, held_out.feeds, held_out.outputs), ""
        except TrtBridgeError as exc:
            got, problem = None, f"could not be judged ({str(exc).splitlines()[0]})"
    if problem:
        return replace(judged, reason=f"the runtime-range model {problem}"), None
    if got is None:
        return replace(judged, scores={"static": static, "runtime": None},
                       reason="the runtime-range model has no float output"), None
    scores = {"static": static, "runtime": got}
    keep, why, engines = weigh(got - static, choice.model, model, prefer)
    feeds = "" if prefer == "size" else f" (on {len(held_out.outputs)} held-out feed(s))"
    judged = replace(judged, scores=scores, engines=engines, reason=why + feeds)
    if not keep:
        return judged, None
    mark(annotations, found)
    return replace(judged, tensors=tuple(found)), model
