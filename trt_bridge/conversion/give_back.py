"""Give the few layers whose INT8 costs the model most back to float, by default, where the held-out feeds show it
pays (``--calib-method auto``; ``--no-give-back`` keeps every layer INT8).

A few layers of some real models are far more fragile than the rest. SVTRv2 (a text recognizer: grouped
convolutions mixing LayerNormalization outputs, then attention blocks) converted from its dynamic uint8 source
reached 23.4 dB against its float model, where the source gives 33.1; with 4 of its layers in float, 30.1. Which
layers is measured, not named: the candidate ``auto`` chose runs on ``RANK_FEEDS`` calibration feeds before the
held-out ones with each quantized layer copied once more, reading its activations before their Q/DQ
(:func:`trt_bridge.verification.layers.isolated`), so each layer's own error is known. The layers whose error
stands ``GAP_DB`` below the median weighted layer's are given back, at most ``MAX_SHARE`` of the weighted layers
(worst first), if that wins on the held-out feeds (judged like ``auto``'s ranges). Eight held-out feeds are a
noisy judge of how many (on SVTRv2 they preferred 2 layers, 4 won 2.7 dB more on other inputs), so it only
confirms the measured choice::

    Before:  every weighted layer INT8
    After:   the chosen few read float activations and float weights (reported with their isolated SNR)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trt_bridge.annotations import Annotations
from trt_bridge.calibrate.session import CalibrationResult, HeldOut
from trt_bridge.conversion.range_choice import Lowering, candidate_model, quantized_weights, score
from trt_bridge.errors import TrtBridgeError

log = logging.getLogger("trt_bridge.conversion")

#: a layer is a suspect when its isolated SNR is this far below the median weighted layer's
GAP_DB = 6.0
#: at most this share of the weighted layers is given back (at least one)
MAX_SHARE = 0.05
#: the layers are ranked on this many calibration feeds before the held-out ones (no more than are held out), this
#: many layers' copies to an onnxruntime session
RANK_FEEDS, RANK_LAYERS = 4, 256


@dataclass(frozen=True)
class GiveBack:
    layers: tuple[str, ...] = ()  # the weighted layers left in float, worst first
    isolated_db: dict[str, float] = field(default_factory=dict)  # their own error's SNR on the held-out feeds
    scores: dict[int, float] = field(default_factory=dict)  # layers given back (0, all suspects) → held-out SNR
    median_db: float | None = None  # the median weighted layer's isolated SNR
    reason: str = ""  # why none was given back
    model: Any = field(default=None, repr=False, compare=False)  # the candidate with them in float, if given back
    #: what giving them back costs: their weights' elements, stored in the high precision instead of int8
    weight_elements: int = 0
    #: the layers judged were quantized with the source's own scales (nothing calibrated; conversion/refine.py)
    own_scales: bool = False

    def to_dict(self) -> dict:
        return {"layers": self.layers, "isolated_db": dict(self.isolated_db), "scores": dict(self.scores),
                "median_db": self.median_db, "reason": self.reason, "weight_elements": self.weight_elements,
                "own_scales": self.own_scales}


def weight_elements(graph, annotations: Annotations, layers) -> int:
    """The elements of the weights ``layers`` read (what they store in float once given back)."""
    tensors, chosen = graph.tensors(), set(layers)
    return sum(int(np.prod(tensors[name].shape)) for name, spec in annotations.weights.items()
               if name in tensors and tensors[name].shape is not None and any(s.node in chosen for s in spec.sites))


def choose_layers(graph, annotations: Annotations, needed: list[str], held_out: HeldOut, fitted: CalibrationResult,
                  base_score: float, lowering: Lowering, isolated: dict[str, float | None],
                  weights=None) -> GiveBack:
    """The layers to give back (see the module doc); ``fitted``: auto's chosen ranges on the feeds before the held-out
    split, ``base_score``: its held-out SNR, ``isolated``: its layers' isolated SNRs
    (:func:`trt_bridge.verification.layers.isolated` on ``RANK_FEEDS`` feeds before the split), ``weights``: the
    quantized
    weights (:func:`~trt_bridge.conversion.range_choice.quantized_weights`) if at hand, else made here. The graph and
    annotations are not changed."""
    weighted = {s.node for spec in annotations.weights.values() for s in spec.sites}
    weights = weights or quantized_weights(graph, annotations)
    # -inf: a layer whose output turns NaN under INT8 (verify.layers), the worst of all
    ranked = sorted((n for n, v in isolated.items() if v is not None and not np.isnan(v)),
                    key=lambda n: (isolated[n], n))
    finite = [isolated[n] for n in ranked if n in weighted and np.isfinite(isolated[n])]
    if len(finite) < 2:
        return GiveBack(reason="fewer than 2 weighted layers to compare")
    median = float(np.median(finite))
    most = max(1, int(MAX_SHARE * len(weighted)))
    suspects = [n for n in ranked if isolated[n] <= median - GAP_DB][:most]
    if not suspects:
        return GiveBack(median_db=median, reason=f"no weighted layer's isolated SNR is {GAP_DB:g} dB below the "
                                                 f"median layer's {median:.1f} dB")
    try:
        model = candidate_model(graph, annotations, weights, needed, fitted, lowering, drop=suspects)
        got = score(model, held_out.feeds, held_out.outputs)
    except TrtBridgeError as exc:
        return GiveBack(median_db=median, reason=f"the candidate did not run ({str(exc).splitlines()[0]})")
    got = -np.inf if got is None else got
    log.info("giving back %d layer(s): held-out SNR %.2f dB (%.2f with all INT8)", len(suspects), got, base_score)
    scores = {0: base_score, len(suspects): got}
    if not got > base_score:
        return GiveBack(scores=scores, median_db=median,
                        reason=f"giving back the {len(suspects)} layer(s) that stand out did not win on the "
                               "held-out feeds")
    chosen = tuple(suspects)
    return GiveBack(chosen, {n: float(isolated[n]) for n in chosen}, scores, median, model=model)
