"""After the ranges are chosen: give-back (:mod:`.give_back`) and bias correction (:mod:`.bias_correction`), judged
on the held-out calibration feeds, for every source that has them: a float one, and one that carries its own scales.

Both need a *judged* model: the Q/DQ model the conversion would write, run on the held-out feeds, with its score
(the worst float output's SNR against the lifted float model's outputs there). ``auto`` leaves one when it compared
its range methods. It leaves none in two cases, which get one here:

- ``auto`` fell back to max without judging, because no activation held enough held-out values to judge clipping
  by (a small or tiny-channel model: MLPerf Tiny's keyword spotter, MNIST): the held-out feeds were kept, so the
  max candidate is made and scored (:func:`judged_max`). Clipping needs that many values; a layer's give-back
  does not.
- nothing was calibrated: every activation has the source's own scale (a QOperator or QDQ source under
  ``--scales model``) or a runtime range (not where ``--scales FILE`` or ``--qat`` set them: the user's choice).
  One pass of the lifted float model over the calibration feeds keeps the last ones and its outputs on them
  (:func:`hold_out`), and the model with the source's scales is scored there (:func:`judged_source`). The
  layers the source quantized are the candidates; one given back reads float activations and the source's
  weights dequantized (the lifted graph's, exactly the source's numbers in float).

The reference is the lifted float model in every case, the source with its quantization removed: for a float
source the source itself, for a quantized one what it means in float, as ``isolated`` measures each layer against
its own float copy. It is not the quantized source's own outputs: a layer given back moves the output towards
that float meaning and away from the source's rounding (``--accuracy-target`` measures against the same lifted
form, :mod:`.accuracy`; ``verify`` against the source as given)::

    Before:  a source with its own scales: every layer it quantized INT8, nothing judged
    After:   the few whose own INT8 error stands far below the rest read float (judged as a float source's are)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trt_bridge.annotations import drop_layers
from trt_bridge.calibrate.observers import CalibMethod
from trt_bridge.calibrate.session import CalibrationSession, HeldOut
from trt_bridge.conversion import bias_correction, give_back, range_choice
from trt_bridge.errors import TrtBridgeError
from trt_bridge.verification.layers import isolated


def hold_out(lifted, feeds, progress: bool) -> HeldOut | str:
    """The held-out split of ``feeds`` with the float model ``lifted``'s outputs on them (one pass, nothing
    observed), or why there is none."""
    held_out = HeldOut.split(feeds.total, range_choice.MIN_FEEDS)
    if held_out is None:
        return f"{feeds.total} calibration feed(s), fewer than {range_choice.MIN_FEEDS} to judge by"
    with CalibrationSession(lifted, [], what="the lifted float model") as session:
        session.run({}, feeds, progress, desc="holding out feeds", held_out=held_out)
    return held_out if held_out.outputs else "every held-out feed was left out (NaN or Inf)"


def _judged(graph, annotations, needed, held_out: HeldOut, lowering, choice: range_choice.MethodChoice, what: str
            ) -> range_choice.MethodChoice | str:
    """``choice`` with its candidate model (of its method's ranges fitted before the held-out split) and held-out
    score, or why it has none."""
    fitted = range_choice.fitted_on(held_out, choice.method, choice.percentile, choice.keep_max)
    weights = range_choice.quantized_weights(graph, annotations)
    try:
        model = range_choice.candidate_model(graph, annotations, weights, needed, fitted, lowering)
        got = range_choice.score(model, held_out.feeds, held_out.outputs)
    except TrtBridgeError as exc:
        return f"{what} did not run ({str(exc).splitlines()[0]})"
    if got is None:
        return "the model has no float output to judge by"
    return replace(choice, scores={choice.label: got}, held_out=len(held_out.outputs), model=model, weights=weights)


def judged_max(graph, annotations, needed, held_out: HeldOut | None, lowering, choice: range_choice.MethodChoice
               ) -> range_choice.MethodChoice | None:
    """``auto``'s fallback to max, judged where its held-out feeds were kept (see the module doc); None where not."""
    if choice.scores or held_out is None or not held_out.outputs or choice.method is not CalibMethod.MAX:
        return None
    if any(t not in held_out.snapshot for t in needed):
        return None
    judged = _judged(graph, annotations, needed, held_out, lowering, choice, "the max candidate")
    return judged if isinstance(judged, range_choice.MethodChoice) else None


def judged_source(graph, annotations, held_out: HeldOut, lowering) -> range_choice.MethodChoice | str:
    """The model with the source's own scales (nothing calibrated), judged on ``held_out``, or why not."""
    choice = range_choice.fallback("every activation has the source's own scale or a runtime range")
    return _judged(graph, annotations, [], held_out, lowering, choice, "the model with the source's scales")


def refine(graph, annotations, options, feeds, choice: range_choice.MethodChoice, held_out: HeldOut,
           needed: list[str], lowering, records: dict[str, Any], own_scales: bool = False) -> list[str]:
    """Give-back and bias correction on the judged ``choice`` (one run of its model with its layers copied
    measures for both); ``options``: ConvertOptions; ``own_scales``: nothing was calibrated (bias correction is
    left to calibrated ranges, whose clipping and rounding it measures; give-back only). Records
    ``given_back``/``bias_corrected``, changes the graph and annotations in place; returns the activations still
    to quantize."""
    calibration = options.calibration
    correct = calibration.bias_correction and not own_scales
    if not (calibration.give_back or correct):
        return needed
    given = give_back.GiveBack()
    fitted = range_choice.fitted_on(held_out, choice.method, choice.percentile, choice.keep_max)
    base = choice.scores[choice.label]
    try:
        ranked_on = range_choice.fit_feeds(feeds, held_out, min(give_back.RANK_FEEDS, held_out.size))
        measured = isolated(choice.model, ranked_on, 2 * give_back.RANK_LAYERS,
                            bias_correction.OPS if correct else ())
        problem = "" if measured.snr else "no calibration feed before the held-out ones to measure on"
    except (TrtBridgeError, RuntimeError, ValueError) as exc:  # onnxruntime's errors too
        measured, problem = None, f"the layers could not be measured ({str(exc).splitlines()[0]})"
    if calibration.give_back and options.activations.prefer == "size":
        records["given_back"] = give_back.GiveBack(reason="--prefer size keeps every layer INT8",
                                                   own_scales=own_scales).to_dict()
    elif calibration.give_back:
        given = give_back.GiveBack(reason=problem) if problem else give_back.choose_layers(
            graph, annotations, needed, held_out, fitted, base, lowering, measured.snr, choice.weights)
        given = replace(given, own_scales=own_scales,
                        weight_elements=give_back.weight_elements(graph, annotations, given.layers))
        records["given_back"] = given.to_dict()
        if given.layers:
            drop_layers(annotations, given.layers)
            needed = [t for t in needed if t in annotations.activations]
            base = given.scores[len(given.layers)]
    if correct:
        on_grid = {site.node for spec in annotations.activations.values() if spec.runtime for site in spec.sites}
        corrected = bias_correction.BiasCorrection(reason=problem) if problem else bias_correction.choose(
            graph, annotations, needed, held_out, fitted, base, lowering,
            {k: v for k, v in measured.shifts.items() if k not in on_grid}, choice.weights, drop=given.layers)
        records["bias_corrected"] = corrected.to_dict()
        if corrected.layers:
            bias_correction.apply_shifts(graph, corrected.shifts)
    return needed
