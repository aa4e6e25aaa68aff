"""A scale table: tensor → amax (per tensor or per channel), axis, kind and provenance.

Every source of scales (an explicit ``--scales`` file, a QAT model, the source model's own
Q/DQ, calibration) is read into a :class:`ScaleTable`; convert layers them with
:meth:`ScaleTable.merged_over` (or :func:`merge_by_precedence`), highest precedence first::

    explicit.merged_over(qat).merged_over(model).merged_over(calibration)

Entries hold ``amax`` (the float range ±amax that maps to ±127), not the scale: it is what
calibration produces and what ModelOpt stores; :attr:`ScaleEntry.scale` is ``amax / 127``.
Readers of scale-based formats store ``scale * 127`` computed in float64, which is exact for
a float32 (or float16) scale, so writing the table back gives the same float32 scale bits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from trt_bridge.errors import TrtBridgeError
from trt_bridge.formats import FORMATS, INT8_QMAX
from trt_bridge.ir.values import FLOAT32_TINY

#: the unit scale tables write ranges in: amax maps to ±QMAX, INT8's largest code, whatever the output's format
QMAX = INT8_QMAX
KINDS = ("activation", "weight")
FLOAT32_MAX = 3.4028234663852886e38


def _as_amax(tensor: str, amax) -> float | tuple[float, ...]:
    """``amax`` as a float or a tuple of floats, each finite and positive (a normal float32 scale)."""
    if hasattr(amax, "tolist"):  # numpy scalars and arrays
        amax = amax.tolist()
    values = tuple(amax) if isinstance(amax, (list, tuple)) else (amax,)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TrtBridgeError(f"tensor '{tensor}': amax {v!r} is not a number. Give a positive float "
                                 "(or a list of floats for per-channel weights).")
        try:
            v = float(v)
        except OverflowError:  # an integer beyond any float (10**400)
            raise TrtBridgeError(f"tensor '{tensor}': amax {str(v)[:12]}... ({len(str(v))} digits) is beyond float32's "
                                 "range; Q/DQ scales are float32. Fix or remove the entry.") from None
        if not math.isfinite(v) or not v / QMAX >= FLOAT32_TINY:
            raise TrtBridgeError(f"tensor '{tensor}': amax {v!r} is not a finite positive number; a scale must be "
                                 f"finite and positive (amax / 127 ≥ {FLOAT32_TINY:.4g}, float32's smallest normal), "
                                 "or TensorRT rejects it and quantization zeroes the tensor. Fix or remove the entry.")
        if v / QMAX > FLOAT32_MAX:
            raise TrtBridgeError(f"tensor '{tensor}': amax {v!r} gives a scale beyond float32's range; "
                                 "Q/DQ scales are float32.")
        out.append(v)
    if isinstance(amax, (list, tuple)):
        if not out:
            raise TrtBridgeError(f"tensor '{tensor}': the per-channel amax list is empty.")
        return tuple(out)
    return out[0]


@dataclass(frozen=True)
class ScaleEntry:
    """One tensor's quantization range.

    ``amax``: a float (per tensor) or a tuple (per channel along ``axis``; weights only:
    TensorRT quantizes activations per tensor). ``amax`` must give a finite, positive, normal
    float32 scale: 0 (a tensor all zeros), subnormal, negative and non-finite values are refused.
    ``source``: provenance, ``"<format>:<file name>"`` for files (``"trt-cache:calib.cache"``,
    ``"json:scales.json"``, ``"ort-table:calibration.json"``, ``"modelopt:ckpt.npz"``,
    ``"qat:qat.onnx"``), ``"model"`` for a converted model's own scales.
    """

    tensor: str
    amax: float | tuple[float, ...]
    axis: int | None = None
    kind: str = "activation"
    source: str = ""
    #: the source quantizer's own step when ``amax`` covers an asymmetric range (an AIMET uint8 encoding):
    #: calibration data may then narrow ``amax`` to what the data reaches, never below 127 such steps.
    #: Not written to files (informational, like ``source``).
    step: float | None = None
    #: the format the file quantizes the tensor in, where it names one other than INT8 (AIMET's float8e4m3fn: "fp8",
    #: a :data:`trt_bridge.formats.FORMATS` key); the conversion keeps it unless --int8/--fp8 ask otherwise.
    #: ``amax`` is the range all the same (in INT8 units, as every entry). Not written to files.
    format: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tensor, str) or not self.tensor:
            raise TrtBridgeError(f"a scale entry needs a tensor name, got {self.tensor!r}.")
        if self.kind not in KINDS:
            raise TrtBridgeError(f"tensor '{self.tensor}': kind {self.kind!r} is not one of {', '.join(KINDS)}.")
        amax = _as_amax(self.tensor, self.amax)
        object.__setattr__(self, "amax", amax)
        if self.axis is not None and (isinstance(self.axis, bool) or not isinstance(self.axis, int)):
            raise TrtBridgeError(f"tensor '{self.tensor}': axis {self.axis!r} is not an integer (or null).")
        if isinstance(amax, tuple):
            if self.kind != "weight":
                raise TrtBridgeError(f"activation '{self.tensor}' has {len(amax)} per-channel amax values; "
                                     "TensorRT quantizes activations per tensor. Give one amax.")
            if self.axis is None:
                raise TrtBridgeError(f"weight '{self.tensor}' has per-channel amax values but no axis; "
                                     "give the output-channel axis (Conv: 0, MatMul: last).")
        elif self.axis is not None:
            object.__setattr__(self, "axis", None)  # a per-tensor value has no axis
        if self.format is not None and self.format not in FORMATS:
            raise TrtBridgeError(f"tensor '{self.tensor}': format {self.format!r} is not one of {', '.join(FORMATS)}.")
        if self.step is not None and (isinstance(amax, tuple) or not math.isfinite(self.step) or self.step <= 0):
            raise TrtBridgeError(f"tensor '{self.tensor}': step {self.step!r} must be a finite positive number "
                                 "of a per-tensor entry.")

    @property
    def per_channel(self) -> bool:
        return isinstance(self.amax, tuple)

    @property
    def scale(self) -> float | tuple[float, ...]:
        """``amax / 127`` (float64; the Q/DQ and the TensorRT cache store it as float32)."""
        if isinstance(self.amax, tuple):
            return tuple(a / QMAX for a in self.amax)
        return self.amax / QMAX

    def to_dict(self) -> dict:
        amax = list(self.amax) if isinstance(self.amax, tuple) else self.amax
        return {"amax": amax, "axis": self.axis, "kind": self.kind, "source": self.source}


@dataclass
class ScaleTable:
    """Scale entries by tensor name (insertion order kept: files are written in it)."""

    entries: dict[str, ScaleEntry] = field(default_factory=dict)
    #: what a reader brought to the nearest thing TensorRT takes (16-bit ranges as int8, block-wise
    #: weights left out, ...), one line per kind: the conversion report lists them
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, entry in self.entries.items():
            if name != entry.tensor:
                raise TrtBridgeError(f"scale table key '{name}' holds the entry of tensor '{entry.tensor}'.")

    @classmethod
    def of(cls, entries: Iterable[ScaleEntry]) -> ScaleTable:
        """A table of ``entries``; a tensor listed twice is an error."""
        table = cls()
        for entry in entries:
            table.add(entry)
        return table

    def add(self, entry: ScaleEntry) -> None:
        if entry.tensor in self.entries:
            raise TrtBridgeError(f"tensor '{entry.tensor}' has two scale entries "
                                 f"({self.entries[entry.tensor].source or 'unknown source'} and "
                                 f"{entry.source or 'unknown source'}); keep one.")
        self.entries[entry.tensor] = entry

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, tensor: object) -> bool:
        return tensor in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __getitem__(self, tensor: str) -> ScaleEntry:
        return self.entries[tensor]

    def get(self, tensor: str, default: ScaleEntry | None = None) -> ScaleEntry | None:
        return self.entries.get(tensor, default)

    def merged_over(self, lower: ScaleTable) -> ScaleTable:
        """A new table with every entry of ``self`` and those of ``lower`` that ``self`` lacks
        (``self`` wins where both have a tensor). Neither table changes."""
        merged = dict(lower.entries)
        merged.update(self.entries)
        return ScaleTable(merged, [*lower.notes, *(n for n in self.notes if n not in lower.notes)])

    def activations(self) -> ScaleTable:
        return ScaleTable({k: e for k, e in self.entries.items() if e.kind == "activation"})

    def weights(self) -> ScaleTable:
        return ScaleTable({k: e for k, e in self.entries.items() if e.kind == "weight"})

    def sources(self) -> dict[str, str]:
        """tensor → provenance (what the conversion report records per tensor)."""
        return {k: e.source for k, e in self.entries.items()}


def merge_by_precedence(*tables: ScaleTable | None) -> ScaleTable:
    """Merge tables given highest precedence first (``None`` entries are skipped): the issue's
    order is explicit ``--scales`` file > QAT > the model's own > calibration."""
    merged = ScaleTable()
    for table in reversed([t for t in tables if t is not None]):
        merged = table.merged_over(merged)
    return merged
