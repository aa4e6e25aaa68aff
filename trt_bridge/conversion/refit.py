"""``--calib-method auto``'s candidates re-fitted in place: one lowered graph serves every method whose ranges give
it the same structure.

Auto judges four range methods on the held-out feeds, each as the model the conversion would write (a copy of the
graph with its ranges applied, re-centred and lowered, then exported): on a 1-second classifier the four copies cost
more than the whole conversion did before ``auto``. The methods change values, and the structure only where they
re-centre a different set of tensors. So the first candidate is built as usual, recording where each value it
wrote came from: every activation's Q/DQ scale constant, and every constant re-centring wrote as a function of a
tensor's centre and range (:class:`~trt_bridge.calibrate.recenter.Recipe`). The next method's ranges, scales and
re-centring decisions are worked out on the annotations alone; if they re-centre the same tensors, the recorded
constants take the new values and the graph is exported again; otherwise the candidate is built from scratch.
The written bytes are those a fresh build gives (``tests/test_refit.py`` holds every method to that)::

    Before:  per method: copy the graph, apply the ranges, re-centre, lower, export
    After:   once: copy, apply, re-centre, lower, export; per further method: new values into it, export
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np

from trt_bridge.annotations import Annotations, ScaleSource, drop_layers
from trt_bridge.calibrate.apply import apply_ranges
from trt_bridge.calibrate.recenter import decisions
from trt_bridge.calibrate.session import CalibrationResult
from trt_bridge.ir.export import export_model
from trt_bridge.ir.finalize import finalize
from trt_bridge.ir.model import default_opset
from trt_bridge.lift.weights import representable_scale
from trt_bridge.lower.qdq import lower, needs_opset
from trt_bridge.place.shared import share_scales


class Refittable:
    """A candidate model of ``fitted``'s ranges, the layers ``drop`` left in float (``model``), which :meth:`refit`
    turns into another's.

    ``graph``, ``annotations`` and ``weights`` are not changed (the candidate lowers a copy); ``lowering`` is
    :class:`~trt_bridge.conversion.range_choice.Lowering`."""

    def __init__(self, graph, annotations: Annotations, weights: dict, needed: list[str],
                 fitted: CalibrationResult, lowering, drop=()):
        ann = Annotations(activations=copy.deepcopy(annotations.activations),
                          weights={k: replace(v, sites=list(v.sites)) for k, v in weights.items()})
        if drop:  # layers left in float
            drop_layers(ann, drop)
            needed = [t for t in needed if t in ann.activations]
        self.graph, self.needed, self.lowering = graph, list(needed), lowering
        self.pristine, self.weights = copy.deepcopy(ann.activations), dict(ann.weights)
        self.work = graph.copy()
        self.recipes: dict[str, list] = {}
        apply_ranges(self.work, ann, fitted, self.needed, lowering.shared, lowering.recentre, lowering.center_type,
                     sort=False, recipes=self.recipes)
        # the activations re-centring added, as they stood (their scales are re-fitted)
        self.added = {r.target: copy.deepcopy(ann.activations[r.target]) for recipe in self.recipes.values()
                      for r in recipe if isinstance(r.target, str)}
        self.scales: dict[str, tuple] = {}
        quantized = lower(self.work, ann, self.scales)  # cleans up and sorts
        self.min_opset = needs_opset(quantized)
        self.model = self._export()

    def _export(self):
        exported = export_model(self.work)
        # onnxruntime infers its shapes (a measurement that needs the types infers them: ir.types.value_types)
        return finalize(exported, default_opset(exported), check=False, min_opset=self.min_opset, infer=False)

    def refit(self, fitted: CalibrationResult):
        """The candidate of ``fitted``'s ranges, the same model a fresh build gives; None where they re-centre other
        tensors than this candidate's (or would give a scale lowering refuses): then build it afresh."""
        ann = Annotations(activations=copy.deepcopy(self.pristine), weights=dict(self.weights))
        for name in self.needed:  # as apply_ranges
            spec = ann.activations[name]
            spec.scale, spec.source = fitted.scale(name), ScaleSource.CALIBRATION
        lowering = self.lowering
        centred = decisions(self.graph, ann, fitted, {t for group in lowering.shared for t in group},
                            lowering.center_type) if lowering.recentre else []
        if [name for name, _, _ in centred] != list(self.recipes):
            return None
        values = []
        for name, center, amax in centred:  # what re-centring writes, from the new centre and range
            del ann.activations[name]
            for recipe in self.recipes[name]:
                value = recipe.value(center, amax)
                if isinstance(recipe.target, str):
                    ann.activations[recipe.target] = replace(copy.deepcopy(self.added[recipe.target]), scale=value)
                else:
                    values.append((recipe.target, value))
        share_scales(ann, lowering.shared)
        quantized = {name for name, spec in ann.activations.items() if not spec.runtime}
        if quantized != set(self.scales):
            return None
        scales = {name: ann.activations[name].scale for name in quantized}
        if not all(s is not None and np.isfinite(s) and s > 0 for s in scales.values()):
            return None  # a fresh build refuses it, with the reason
        for const, value in values:
            const.values = value
        for name, (const, ftype) in self.scales.items():
            const.values = representable_scale(ann.activations[name].format.scale_of(scales[name]), ftype)
        return self._export()
