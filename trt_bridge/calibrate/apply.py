"""Calibrated ranges onto the annotations: each needed activation's scale, then re-centring and shared scales.

The conversion does this once with the final ranges; ``--calib-method auto`` does it on a copy of the graph for
each candidate (:mod:`trt_bridge.conversion.range_choice`), so what it judges is what would be written."""

from __future__ import annotations

import logging

import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations, ScaleSource
from trt_bridge.calibrate.recenter import Recentered, recenter
from trt_bridge.calibrate.session import CalibrationResult
from trt_bridge.place.shared import share_scales

log = logging.getLogger("trt_bridge.calibrate")


def float_where_infinite(annotations: Annotations, calibration: CalibrationResult, needed: list[str]) -> list[str]:
    """Leave in float (in place) every ``needed`` activation that held ±Inf on the calibration feeds kept (feeds
    whose outputs were finite): an attention mask's -Inf before a Softmax, which int8 would turn into -127·scale, a
    value the Softmax no longer ignores. A tensor with NaN alone (a padded row that never reaches an output) is
    quantized on its finite values. Returns the tensors left in float (the report's
    ``calibration.infinite_left_in_float``)."""
    infinite = {t: o.infinite for t, o in calibration.observers.items() if getattr(o, "infinite", 0) and t in needed}
    for tensor, count in sorted(infinite.items()):
        del annotations.activations[tensor]
        log.info("'%s' holds ±Inf on the calibration feeds (%d value(s), e.g. an attention mask's -Inf), which int8 "
                 "cannot keep: left in float", tensor, count)
    return sorted(infinite)


def nonfinite_values(calibration: CalibrationResult) -> dict[str, int]:
    """Per observed tensor, the NaN and ±Inf values left out of its range (masked or padded rows); those with any."""
    return {t: o.nonfinite for t, o in sorted(calibration.observers.items()) if getattr(o, "nonfinite", 0)}


def apply_ranges(graph: gs.Graph, annotations: Annotations, calibration: CalibrationResult | None,
                 needed: list[str], shared: list[list[str]], recentre: bool, center_type: str | None = None,
                 sort: bool = True, recipes: dict | None = None) -> list[Recentered]:
    """Give every ``needed`` activation its calibrated scale, re-centre what can be (with ``recentre``; a tensor
    in a shared group keeps a plain scale) and share each group's scale (in place); returns what was re-centred.
    ``sort``: leave the graph cleaned up and in topological order (a caller that lowers next need not: lowering
    does it). ``recipes``: re-centring's, per re-centred tensor (:func:`~trt_bridge.calibrate.recenter.recenter`)."""
    for name in needed:
        spec = annotations.activations[name]
        spec.scale, spec.source = calibration.scale(name), ScaleSource.CALIBRATION
    recentered = []
    if recentre:
        recentered = recenter(graph, annotations, calibration, skip={t for group in shared for t in group},
                              center_type=center_type, sort=sort, recipes=recipes)
    share_scales(annotations, shared)
    return recentered
