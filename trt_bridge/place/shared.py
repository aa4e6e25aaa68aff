"""One scale for each group of tensors that must share it (a Concat's inputs and output), chosen once every
tensor of the group has a scale."""

from __future__ import annotations

from trt_bridge.annotations import Annotations, ScaleSource


def share_scales(annotations: Annotations, groups: list[list[str]]) -> None:
    """Give each group one scale, the largest, so none clips. An imported scale (--scales FILE, --qat) outranks
    calibrated and model scales: the largest imported one is shared, with its source."""
    for group in groups:
        specs = [annotations.activations[t] for t in group if t in annotations.activations]
        if specs and all(s.scale is not None for s in specs):
            imported = [s for s in specs if s.source in (ScaleSource.FILE, ScaleSource.QAT)]
            chosen = max(imported or specs, key=lambda s: s.scale)
            for spec in specs:
                spec.scale, spec.source = chosen.scale, chosen.source
