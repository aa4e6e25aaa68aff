"""Imported scales in a conversion: read them, lay them over the model's own, and check them against data.

Precedence (highest first): ``--scales FILE`` (explicit tables: TensorRT calibration caches, trt-bridge
JSON, onnxruntime calibration tables; a later file wins over an earlier one) > ``--qat`` (a QAT Q/DQ ONNX
export, or a ModelOpt state dict of ``_amax`` buffers) > the source model's own scales > calibration.
An imported activation scale replaces the annotation's, so that tensor needs no calibration; an imported
weight amax re-quantizes the weight with it (per channel on the weighted op's axis, or per tensor).
The report records the source of every tensor's scale, what was imported but found no use, and, when
calibration data is given too, imported ranges that disagree with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trt_bridge.annotations import QMAX, Annotations, ScaleSource
from trt_bridge.calibrate.session import CalibrationSession
from trt_bridge.errors import TrtBridgeError
from trt_bridge.formats import FORMATS, INT8
from trt_bridge.ir.values import FLOAT32_TINY
from trt_bridge.scales.formats import read_scales
from trt_bridge.scales.modelopt import read_modelopt_amax
from trt_bridge.scales.qat import import_qat
from trt_bridge.scales.table import ScaleEntry, ScaleTable

log = logging.getLogger("trt_bridge.scales")

#: an imported amax that clips more than this fraction of the calibration values is flagged
CLIP_WARNING = 1e-3
#: an imported amax larger than this many times the largest calibration value is flagged
WIDE_WARNING = 4.0


@dataclass
class ImportedScales:
    table: ScaleTable
    files: list[str] = field(default_factory=list)
    qat: str | None = None
    match: dict | None = None  # the QAT / ModelOpt matching report
    applied: list[str] = field(default_factory=list)  # tensors whose scale came from the table
    unused: list[str] = field(default_factory=list)  # entries nothing in the converted model quantizes
    warnings: list[dict] = field(default_factory=list)  # imported ranges that disagree with calibration data
    narrowed: list[dict] = field(default_factory=list)  # asymmetric imported ranges narrowed to the data

    def to_dict(self) -> dict:
        return {"files": self.files, "qat": self.qat, "match": self.match, "applied": len(self.applied),
                "unused": self.unused, "warnings": self.warnings, "notes": self.table.notes,
                "narrowed": self.narrowed}


def load_sources(files: tuple[str, ...], qat: str | None, model, precision: str | None = None) -> ImportedScales | None:
    """Read ``files`` and ``qat`` (matched against ``model``, the source as loaded); None when neither is given.
    Each range must give a normal float32 scale in ``precision``, the format the conversion writes (``"fp8"``:
    amax / 448; None: INT8)."""
    if not files and not qat:
        return None
    fmt = FORMATS.get(precision or "", INT8)
    explicit = ScaleTable()
    for path in files:
        table = read_scales(path, model)
        check_scales_in(table, fmt, path)
        explicit = table.merged_over(explicit)  # a later file wins
    qat_table, match = ScaleTable(), None
    if qat:
        path = Path(qat)
        if not path.is_file():
            raise TrtBridgeError(f"--qat {qat}: no such file. Give the QAT model's ONNX export, or a ModelOpt "
                                 "state dict saved as .npz or .safetensors.")
        if path.suffix == ".onnx":
            qat_table, report = import_qat(path, model)
            match = {"matched": len(report.matched), "unmatched": report.unmatched,
                     "ambiguous": [list(a) for a in report.ambiguous], "summary": report.summary()}
        else:
            qat_table, match = read_modelopt_amax(path, model)
        check_scales_in(qat_table, fmt, path)
    return ImportedScales(explicit.merged_over(qat_table), list(files), qat, match)


def check_scales_in(table: ScaleTable, fmt, path) -> None:
    """Refuse a range of ``table`` (read from ``path``) whose scale in ``fmt`` (amax / qmax: 448 for FP8) is below
    float32's smallest normal: TensorRT rejects a subnormal scale. (Every reader already refuses amax / 127 below
    it; FP8's larger qmax narrows that.)"""
    for name in table:
        entry = table[name]
        values = entry.amax if isinstance(entry.amax, tuple) else (entry.amax,)
        low = min(values)
        if low / fmt.qmax < FLOAT32_TINY:
            raise TrtBridgeError(f"{path}: tensor '{name}': amax {low!r} gives the {fmt.label} scale (amax / "
                                 f"{fmt.qmax:g}) of {low / fmt.qmax:.4g}, below float32's smallest normal "
                                 f"({FLOAT32_TINY:.4g}), which TensorRT rejects. Fix or remove the entry (or "
                                 f"convert to another format than {fmt.label}).")


def _source(entry: ScaleEntry) -> ScaleSource:
    return ScaleSource.QAT if entry.source.split(":", 1)[0] in ("qat", "modelopt") else ScaleSource.FILE


def _derived(entry: ScaleEntry) -> bool:
    """An entry a reader inferred rather than read (``<format>-derived:<file>``: AIMET's data-movement outputs)."""
    return entry.source.split(":", 1)[0].endswith("-derived")


def apply(graph, annotations: Annotations, imported: ImportedScales, calibrating: bool = False) -> None:
    """Lay the imported scales over the annotations (in place); record what was applied and what not.
    With calibration data (``calibrating``), entries a reader derived rather than read are left to it."""
    import onnx_graphsurgeon as gs

    used: set[str] = set()
    for name, spec in annotations.activations.items():
        # the Q/DQ-pair lift annotates '<x>_clipped' where a source's zero point made its Q also a ReLU
        key = next((k for k in (name, name.removesuffix("_clipped")) if k in imported.table), None)
        entry = imported.table.get(key) if key else None
        if entry is not None and calibrating and _derived(entry):
            entry = None
        if entry is not None and entry.kind == "activation":
            spec.scale = max(entry.amax / QMAX, float(np.finfo(np.float32).tiny))  # amax 0: the smallest scale
            spec.source, spec.model_range = _source(entry), None
            if entry.format is not None:  # the file's format (AIMET's FP8): place/formats keeps it
                spec.format = FORMATS[entry.format]
            used.add(key)
            imported.applied.append(name)
    tensors = graph.tensors()
    for name, spec in annotations.weights.items():
        entry = _weight_entry(imported.table, spec)
        if entry is None:
            continue
        const = tensors.get(name)
        if not isinstance(const, gs.Constant):
            continue
        values = np.asarray(const.values, np.float64)
        amax = np.asarray(entry.amax, np.float64)
        if amax.ndim == 1 and (entry.axis is None or entry.axis % values.ndim != spec.axis % values.ndim
                               or amax.size != values.shape[spec.axis]):
            log.warning("imported weight scales of '%s' (%d values on axis %s) do not fit the weight %s on axis %d; "
                        "kept its own", entry.tensor, amax.size, entry.axis, list(values.shape), spec.axis)
            continue
        fmt = FORMATS[entry.format or INT8.name]  # per channel or per tensor: INT8 unless the file says FP8
        scale = np.maximum(amax / fmt.qmax, np.finfo(np.float32).tiny)  # an all-zero channel: the smallest scale
        shaped = scale
        if scale.ndim == 1:
            shape = [1] * values.ndim
            shape[spec.axis] = -1
            shaped = scale.reshape(shape)
        spec.codes, spec.format, spec.block_size = fmt.codes(values, shaped), fmt, 0
        spec.scale = scale.astype(np.float32)
        spec.source = _source(entry)
        used.add(entry.tensor)
        imported.applied.append(name)
    imported.unused = sorted(k for k in set(imported.table) - used if not _derived(imported.table[k]))


def _weight_entry(table: ScaleTable, spec) -> ScaleEntry | None:
    """The imported entry of a weight. Keys tried: the lifted weight's name and its source names (lifting
    writes '<w>_float' for a source's '<w>' or '<w>_quantized'; onnxruntime names int8 weights
    '<w>_quantized'), and the source node that reads it (QAT matching keys weights '<node>:weight';
    ``spec.origin`` is that node). Several matches: an explicit file wins over QAT."""
    stem = spec.tensor.removesuffix("_float")
    names = [spec.tensor, stem, stem.removesuffix("_quantized"), f"{stem}_quantized", f"{spec.origin}:weight",
             spec.origin]
    for site in spec.sites:
        names += [f"{site.node}:weight", site.node]
    found = [table.get(k) for k in dict.fromkeys(names)]
    found = [e for e in found if e is not None and e.kind == "weight"]
    if not found:
        return None
    return min(found, key=lambda e: 0 if _source(e) is ScaleSource.FILE else 1)


class _ClipObserver:
    """How many values fall outside ±amax, and the largest magnitude seen."""

    def __init__(self, amax: float):
        self.amax, self.count, self.clipped, self.max = amax, 0, 0, 0.0

    def update(self, values) -> None:
        v = np.abs(np.asarray(values, np.float32)).ravel()
        if v.size and not np.isfinite(v.max()):  # masked or padded rows (NaN, a mask's -Inf): not the range's
            v = v[np.isfinite(v)]
        if v.size:
            self.count += v.size
            self.clipped += int(np.sum(v > self.amax))
            self.max = max(self.max, float(v.max()))


def check_against_data(lifted, annotations: Annotations, imported: ImportedScales, feeds, progress: bool,
                       keep: frozenset[str] = frozenset()) -> None:
    """Run the calibration feeds once and flag imported activation ranges that clip much or waste resolution.

    An asymmetric imported range (an entry with the source's ``step``) is narrowed to what the data reaches:
    amax = max(observed, 127 · step), at most the covering amax, so it never clips what the source's own
    codes held on these feeds and never gets finer than the source's grid. Tensors in ``keep`` (shared or
    re-centred scales) are left as they are."""
    names = [n for n in imported.applied if n in annotations.activations]
    if not names:
        return
    observers = {n: _ClipObserver(annotations.activations[n].scale * QMAX) for n in names}
    with CalibrationSession(lifted, names) as session:
        session.run(observers, feeds, progress, desc="checking imported scales")
    for name, obs in observers.items():
        entry = imported.table.get(name) or imported.table.get(name.removesuffix("_clipped"))
        if entry is not None and entry.step is not None and name not in keep and obs.max > 0:
            amax = min(obs.amax, max(obs.max, QMAX * entry.step))
            if amax < obs.amax:
                annotations.activations[name].scale = amax / QMAX
                imported.narrowed.append({"tensor": name, "amax": obs.amax, "narrowed": amax,
                                          "observed_max": obs.max})
                continue
        fraction = obs.clipped / max(obs.count, 1)
        if fraction > CLIP_WARNING:
            message = (f"the imported amax {obs.amax:.4g} clips {100 * fraction:.2f}% of the calibration values "
                       f"(largest {obs.max:.4g})")
        elif obs.max > 0 and obs.amax > WIDE_WARNING * obs.max:
            message = (f"the imported amax {obs.amax:.4g} is {obs.amax / obs.max:.1f}× the largest calibration value "
                       f"({obs.max:.4g}): most of the int8 codes go unused")
        else:
            continue
        imported.warnings.append({"tensor": name, "amax": obs.amax, "observed_max": obs.max,
                                  "clipped_fraction": fraction, "message": message})
        log.warning("'%s': %s", name, message)
