"""Calibrated ranges onto the annotations: each needed activation's scale, then re-centring and shared scales.

The conversion does this once with the final ranges; ``--calib-method auto`` does it on a copy of the graph for
each candidate (:mod:`trt_bridge.convert.range_choice`), so what it judges is what would be written."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from trt_bridge.annotations import Annotations, ScaleSource
from trt_bridge.calibrate.recenter import Recentered, recenter
from trt_bridge.calibrate.session import CalibrationResult
from trt_bridge.place.shared import share_scales


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
