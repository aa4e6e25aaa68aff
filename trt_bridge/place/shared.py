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


def share_imported(annotations: Annotations, groups: list[list[str]]) -> list[str]:
    """Give every member of a group the group's imported scale (--scales FILE, --qat; the largest where several
    members have one) now, so that no member waits for calibration data: the group has one scale, and the file
    states it. A TensorRT cache that ``scales export`` wrote lists only the members the converted model put a Q/DQ
    on (one Concat input may share its Q/DQ with the rest), so a conversion from it without data needs this.
    Returns the members given the scale."""
    given = []
    for group in groups:
        specs = {t: annotations.activations[t] for t in group if t in annotations.activations}
        imported = [s for s in specs.values() if s.scale is not None and s.source in (ScaleSource.FILE,
                                                                                       ScaleSource.QAT)]
        if not imported:
            continue
        chosen = max(imported, key=lambda s: s.scale)
        for tensor, spec in sorted(specs.items()):
            if spec.scale is None:
                spec.scale, spec.source = chosen.scale, chosen.source
                given.append(tensor)
    return given
