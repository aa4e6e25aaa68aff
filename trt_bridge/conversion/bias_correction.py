"""Empirical bias correction: a convolution's INT8 activations shift its output channels' means; subtract the
shift from its bias where it is measured (``--calib-method auto``; ``--no-bias-correction`` keeps the biases).

Clipping a long-tailed activation at a percentile or MSE range, and rounding a one-sided one, move the mean of what
the next convolution computes, channel by channel; the shift adds up through a deep network. YOLOv8n converted
from its dynamic uint8 source (per-tensor weights) reached 32.0 dB against its float model where the source gives
33.2; with its convolutions' biases corrected, 32.8. The shift is measured, not modelled: ``auto``'s chosen
candidate runs on the calibration feeds give-back ranks layers on (before the held-out ones) with each quantized
layer copied once more, reading its activations before their Q/DQ
(:func:`trt_bridge.verification.layers.isolated`), so the
error each layer adds on its own is known per output channel and feed. A channel is corrected where its mean
error stands ``SIGMA`` standard errors from zero over the feeds (the rest is noise; correcting it cost a text
recognizer 7 dB), and the whole correction is kept only if it wins ``MARGIN_DB`` on the held-out feeds (it lost
on the PP-OCR recognizer and classifier and on SVTRv2, where the held-out feeds also said no)::

    Before:  Conv(DQ(Q(x)), DQ(W_int8), b)
    After:   Conv(DQ(Q(x)), DQ(W_int8), b − E[Conv(DQ(Q(x))) − Conv(x)])   (per output channel, where significant)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations
from trt_bridge.calibrate.session import CalibrationResult, HeldOut
from trt_bridge.conversion.range_choice import Lowering, candidate_model, score
from trt_bridge.errors import TrtBridgeError

log = logging.getLogger("trt_bridge.conversion")

#: a channel's mean error is corrected where it stands this many standard errors (over the feeds) from zero, measured
#: on at least this many feeds (the standard error of fewer is itself noise)
SIGMA, MIN_FEEDS = 3.0, 4
#: the correction must win this much on the held-out feeds
MARGIN_DB = 0.5
#: the layers whose shift is measured (output channels on axis 1, a bias input at position 2)
OPS = ("Conv",)


@dataclass(frozen=True)
class BiasCorrection:
    layers: int = 0  # convolutions whose bias was corrected
    channels: int = 0  # output channels corrected, over them
    scores: dict[str, float] = field(default_factory=dict)  # "before"/"after" → held-out SNR (dB)
    reason: str = ""  # why no bias was corrected
    shifts: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)  # node → per channel

    def to_dict(self) -> dict:
        return {"layers": self.layers, "channels": self.channels, "scores": dict(self.scores), "reason": self.reason}


def significant_shifts(rows: dict[str, np.ndarray], sigma: float = SIGMA) -> dict[str, np.ndarray]:
    """Per layer, the mean error per channel where it stands ``sigma`` standard errors from zero, else 0 (layers
    measured on fewer than ``MIN_FEEDS`` feeds, or with nothing significant, are left out)."""
    found = {}
    for name, per_feed in sorted(rows.items()):
        if len(per_feed) < MIN_FEEDS:
            continue
        mean = per_feed.mean(axis=0)
        stderr = per_feed.std(axis=0, ddof=1) / np.sqrt(len(per_feed))
        shift = np.where(np.abs(mean) > sigma * stderr, mean, 0.0)
        if shift.any():
            found[name] = shift
    return found


def apply_shifts(graph: gs.Graph, shifts: dict[str, np.ndarray]) -> int:
    """Subtract each node's shift from its bias in ``graph`` (in place; a bias shared with another node, or none,
    becomes the node's own constant). Returns the nodes changed."""
    changed = 0
    for node in graph.nodes:
        shift = shifts.get(node.name)
        if shift is None or node.op not in OPS or len(node.inputs) < 2:
            continue
        weight = node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if isinstance(bias, gs.Constant):
            values = np.asarray(bias.values)
        elif bias is None or (isinstance(bias, gs.Variable) and not bias.name):
            values = np.zeros(len(shift), np.asarray(weight.values).dtype if isinstance(weight, gs.Constant)
                              else np.float32)
        else:  # a bias computed at run time: leave the node alone
            continue
        if values.shape != shift.shape:
            continue
        corrected = (values.astype(np.float64) - shift).astype(values.dtype)
        new = gs.Constant(f"{node.name}_bias_corrected", corrected)
        if len(node.inputs) > 2:
            node.inputs[2] = new
        else:
            node.inputs.append(new)
        changed += 1
    return changed


def choose(graph, annotations: Annotations, needed: list[str], held_out: HeldOut, fitted: CalibrationResult,
           base_score: float, lowering: Lowering, rows: dict[str, np.ndarray], weights, drop=()
           ) -> BiasCorrection:
    """Keep the significant shifts of ``rows`` (per layer, its error's mean per channel and feed, measured on auto's
    chosen candidate: :func:`trt_bridge.verification.layers.isolated`) if the candidate with them (``drop``: the layers
    give-back left in float) beats ``base_score`` by ``MARGIN_DB`` on the held-out feeds. The graph and annotations
    are not changed."""
    if not any(len(r) >= MIN_FEEDS for r in rows.values()):
        return BiasCorrection(reason=f"fewer than {MIN_FEEDS} calibration feeds before the held-out ones to measure "
                                     "shifts on")
    shifts = significant_shifts({name: r for name, r in rows.items() if name not in set(drop)})  # float again
    if not shifts:
        return BiasCorrection(reason=f"no convolution's output shifts by {SIGMA:g} standard errors over the feeds")
    work = graph.copy()
    layers = apply_shifts(work, shifts)
    if not layers:
        return BiasCorrection(reason="no shifted convolution has a constant bias to correct")
    try:
        got = score(candidate_model(work, annotations, weights, needed, fitted, lowering, drop=drop),
                    held_out.feeds, held_out.outputs)
    except TrtBridgeError as exc:
        return BiasCorrection(reason=f"the corrected candidate did not run ({str(exc).splitlines()[0]})")
    got = -np.inf if got is None else got
    scores = {"before": base_score, "after": got}
    channels = int(sum(np.count_nonzero(s) for s in shifts.values()))
    log.info("bias correction of %d channel(s) in %d layer(s): held-out SNR %.2f dB (%.2f without)", channels,
             layers, got, base_score)
    if not got >= base_score + MARGIN_DB:
        return BiasCorrection(scores=scores, reason=f"the corrected biases did not win {MARGIN_DB:g} dB on the "
                                                    "held-out feeds")
    return BiasCorrection(layers, channels, scores, shifts=shifts)
