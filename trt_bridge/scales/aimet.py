"""Read Qualcomm AIMET encodings files (``sim.export(path, name)`` writes ``<name>.onnx`` + ``<name>.encodings``).

Three layouts, told apart by ``"version"`` (a file without one is the legacy layout):

* legacy (``"0.6.1"``): sections keyed by tensor name, one dict per channel::

    {"activation_encodings": {"x": [{"bitwidth": 8, "dtype": "int", "is_symmetric": "False",
                                     "min": -0.12, "max": 0.14, "offset": -118.0, "scale": 0.00104}]},
     "param_encodings": {"conv.weight": [{...channel 0...}, {...channel 1...}]}}

* ``"1.0.0"`` (aimet-onnx's default): sections are lists; ``offset`` is unsigned-style (the codes
  ``q ∈ [0, 2^bw − 1]`` mean ``(q + offset) · scale``)::

    {"version": "1.0.0",
     "activation_encodings": [{"name": "x", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 8,
                               "is_sym": false, "scale": [0.00104], "offset": [-118.0]}],
     "param_encodings": [{"name": "conv.weight", "enc_type": "PER_CHANNEL", "scale": [...], ...}]}

* ``"2.0.0"``/``"2.1.0"``: one ``"encodings"`` list of ONNX-style entries
  ``{"name", "output_dtype": "uint8", "y_scale", "y_zero_point", "axis", "block_size"}``.

Each entry becomes a symmetric int8 amax: a symmetric encoding keeps its grid (amax =
``scale · (2^(bw−1) − 1)``, 127·scale at 8 bits: the scale itself is kept, only the −128 code goes,
as TensorRT has none); an asymmetric one gives the amax covering its range
``max(|min|, |max|)``, and with calibration data that amax is narrowed to what the data reaches, never
below 127 of AIMET's own steps (``ScaleEntry.step``; :func:`trt_bridge.scales.apply.check_against_data`):
AIMET ties ranges (an RNN's hidden states, the inputs of a Concat), so a range can be several
times wider than what a tensor holds, and the symmetric cover of a one-sided range doubles the step.
Per-channel weight scales need their axis, which the legacy and 1.0.0 layouts
do not store: it is the one dimension of the weight as long as the list, or else the output-channel
axis of the op that reads it (Conv 0, ConvTranspose 1, Gemm by ``transB``, MatMul last), as AIMET
itself resolves it; this needs the model (``convert`` passes the source). AIMET quantizes the
outputs of data-movement ops (Reshape, Transpose, Slice, MaxPool, ...) with their input's encoding and
writes none for them: the output of such an op without an entry takes its input's (source
``aimet-derived:<file>``), unless calibration data is given, which then measures it.

What TensorRT has no equivalent for is brought to the nearest thing it builds, each noted in
:attr:`ScaleTable.notes` (the conversion report's ``imported_scales.notes``) and logged once per kind:
16-bit (or other non-8-bit) encodings become int8 over the same range; block-wise weight encodings
(``PER_BLOCK``, ``LPBQ``) are left out, so those weights are quantized per channel from their
values; float16 (``dtype: float``) encodings quantize nothing and int32 bias encodings (TensorRT
adds biases in float) are left out. FP8 encodings (2.x ``output_dtype: float8e4m3fn``) give the range ``y_scale``·448
and stay FP8 in the conversion (``ScaleEntry.format``) unless ``--int8`` asks otherwise; E5M2 ones become E4M3
over the same range (noted). A scale that is
not finite and positive, or an entry that cannot be read, is an error naming the file and tensor.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.errors import TrtBridgeError
from trt_bridge.lift.dequantize_gathered import DATA_MOVEMENT as MOVES
from trt_bridge.scales.files import parse_json, read_text
from trt_bridge.scales.table import ScaleEntry, ScaleTable

log = logging.getLogger("trt_bridge.scales")

#: AIMET's FP8 output dtypes (2.x) → the format's largest value: the range is ``y_scale`` times it
FLOAT8 = {"float8e4m3fn": 448.0, "float8e4m3fnuz": 240.0, "float8e5m2": 57344.0, "float8e5m2fnuz": 57344.0}
#: the widest bit width an encoding may give (AIMET quantizes to 4, 8, 16 or 32 bits)
MAX_BITS = 32
SECTIONS = ("activation_encodings", "param_encodings")
#: the ops whose weight AIMET quantizes per channel, and where that channel is (AIMET's own table)
_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: the provenance of those derived entries: calibration data, when given, measures such a tensor instead
#: (AIMET ties RNN hidden-state ranges, so an input's range can be much wider than what the op passes on)
DERIVED = "aimet-derived"
#: ops that move or select values: their output lies on their input's grid, so it takes the input's
#: encoding where the file has none (AIMET leaves them unquantized, and derives the same at export in 2.x)
DATA_MOVEMENT = MOVES | {"Split", "DepthToSpace", "SpaceToDepth", "MaxPool", "Pad"}


def is_aimet(obj) -> bool:
    """Whether a parsed JSON document is an AIMET encodings file."""
    return isinstance(obj, dict) and (any(s in obj for s in SECTIONS) or (
        "encodings" in obj and isinstance(obj.get("encodings"), list) and "version" in obj))


class _Reader:
    def __init__(self, path: Path, model: onnx.ModelProto | None):
        self.path, self.model = path, model
        self.table = ScaleTable()
        self.source = f"aimet:{path.name}"
        self.notes: dict[str, list[str]] = {}
        self._shapes = {t.name: tuple(t.dims) for t in model.graph.initializer} if model is not None else {}
        self._consumers: dict[str, list[onnx.NodeProto]] = {}
        if model is not None:
            for node in model.graph.node:
                for name in node.input:
                    self._consumers.setdefault(name, []).append(node)

    def error(self, name: str, why: str) -> TrtBridgeError:
        return TrtBridgeError(f"{self.path}: AIMET encoding of tensor '{name}': {why}")

    def note(self, kind: str, name: str) -> None:
        self.notes.setdefault(kind, []).append(name)

    # ------------------------------------------------------------ one entry, any layout

    def add(self, name: str, kind: str, scale, lo, hi, symmetric: bool, bits: int, axis: int | None,
            fmt: str | None = None) -> None:
        if bits >= 32:  # AIMET's int32 bias encodings (2.x, export_int32_bias): TensorRT adds biases in float
            self.note("int32 (bias) encodings left out: TensorRT takes biases in float, as trt-bridge writes them",
                      name)
            return
        scale = np.asarray(scale, np.float64).reshape(-1)
        if scale.size == 0:
            raise self.error(name, "no scale; re-export the encodings with aimet")
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            bad = scale[~(np.isfinite(scale) & (scale > 0))][0]
            raise self.error(name, f"scale {bad} is not a finite positive number; recompute the encodings "
                             "(compute_encodings on representative data) or drop the entry")
        if symmetric:
            amax = scale * (2 ** (bits - 1) - 1)
        else:
            lo, hi = np.asarray(lo, np.float64).reshape(-1), np.asarray(hi, np.float64).reshape(-1)
            if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
                raise self.error(name, "its range (offset/min/max) is not finite; recompute the encodings")
            amax = np.maximum(np.abs(lo), np.abs(hi))
        if bits != 8:
            self.note(f"{bits}-bit encodings imported as int8 over the same range (TensorRT quantizes to int8)",
                      name)
        if amax.size == 1:
            step = float(scale[0]) if not symmetric and kind == "activation" else None
            self.table.add(ScaleEntry(name, float(amax[0]), None, kind, self.source, step, fmt))
            return
        if kind == "activation":
            self.note("per-channel activation encodings imported per tensor (their largest range; TensorRT "
                      "quantizes activations per tensor)", name)
            self.table.add(ScaleEntry(name, float(amax.max()), None, kind, self.source, format=fmt))
            return
        if axis is None:
            axis = self.channel_axis(name, amax.size)
        if axis is None:
            self.note("per-channel weight encodings whose channel axis is unknown left out (the weight is "
                      "quantized per channel from its values)", name)
            return
        self.table.add(ScaleEntry(name, tuple(amax.tolist()), axis, "weight", self.source, format=fmt))

    def channel_axis(self, name: str, channels: int) -> int | None:
        """The weight's channel axis: the one dimension as long as the scale list, else its reader's."""
        shape = self._shapes.get(name)
        if shape is None:
            return None
        matches = [i for i, d in enumerate(shape) if d == channels]
        if len(matches) == 1:
            return matches[0]
        readers = self._consumers.get(name, [])
        axes = {self._op_axis(node, name, len(shape)) for node in readers}
        axes.discard(None)
        if len(axes) == 1:
            axis = axes.pop()
            return axis if shape[axis] == channels else None
        return None

    @staticmethod
    def _op_axis(node: onnx.NodeProto, name: str, rank: int) -> int | None:
        if node.op_type not in _WEIGHTED or len(node.input) < 2 or node.input[1] != name:
            return None
        if node.op_type == "Conv":
            return 0
        if node.op_type == "ConvTranspose":
            return 1
        if node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            return 0 if trans_b else 1
        return rank - 1

    def skip(self, name: str, entry: dict, kind_key: str) -> bool:
        """Entries that quantize nothing TensorRT can take as int8: noted and left out."""
        dtype = str(entry.get("dtype", entry.get("output_dtype", "int"))).lower()
        if dtype in FLOAT8:
            pass
        elif "float" in dtype or dtype in ("bf16", "fp16", "fp8"):
            self.note("float (fp16/bf16) encodings left out: they quantize nothing", name)
            return True
        enc_type = str(entry.get(kind_key, "")).upper()
        if enc_type in ("PER_BLOCK", "LPBQ", "VECTOR") or entry.get("block_size") or "per_block_int_scale" in entry:
            self.note("block-wise weight encodings left out: TensorRT takes per-channel int8 weights, quantized "
                      "from the weight's values", name)
            return True
        return False

    def bits(self, name: str, value, key: str) -> int:
        """A bit width, bounded before it is used (``2**bw`` of a huge one takes minutes and gigabytes)."""
        try:
            bits = None if isinstance(value, bool) else int(value) if isinstance(value, (int, str)) else \
                int(value) if isinstance(value, float) and value.is_integer() else None
        except (ValueError, OverflowError):
            bits = None
        if bits is None or not 1 <= bits <= MAX_BITS:
            raise self.error(name, f"\"{key}\" gives a bit width of {str(value)[:20]!r}; AIMET encodings have "
                             f"1 to {MAX_BITS} bits (8 for int8)")
        return bits

    # ------------------------------------------------------------ layouts

    def legacy(self, section: dict, kind: str) -> None:
        if not isinstance(section, dict):
            raise TrtBridgeError(f"{self.path}: AIMET legacy encodings keep each section as an object "
                                 "{tensor: [encoding, ...]}; this one is not.")
        for name, channels in section.items():
            channels = channels if isinstance(channels, list) else [channels]
            if not channels or not all(isinstance(c, dict) for c in channels):
                raise self.error(name, "expected a list of {bitwidth, dtype, is_symmetric, min, max, offset, "
                                 "scale} objects")
            if self.skip(name, channels[0], ""):
                continue
            try:
                bits = self.bits(name, channels[0]["bitwidth"], "bitwidth")
                symmetric = str(channels[0].get("is_symmetric", "False")).lower() == "true"
                scale = [float(c["scale"]) for c in channels]
                offset = np.array([float(c["offset"]) for c in channels])
                lo = [float(c["min"]) for c in channels] if all("min" in c for c in channels) else offset * scale
                hi = [float(c["max"]) for c in channels] if all("max" in c for c in channels) else \
                    (offset + 2 ** bits - 1) * scale
            except (KeyError, TypeError, ValueError) as exc:
                raise self.error(name, f"cannot read {exc} from it (legacy layout: bitwidth, is_symmetric, "
                                 "scale, offset, min, max)") from None
            self.add(name, kind, scale, lo, hi, symmetric and self._signed_grid(offset, bits), bits, None)

    def v1(self, section: list, kind: str) -> None:
        if not isinstance(section, list):
            raise TrtBridgeError(f"{self.path}: AIMET 1.0.0 encodings keep each section as a list of "
                                 "{\"name\": ..., ...} objects; this one is not.")
        for entry in section:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise TrtBridgeError(f"{self.path}: an AIMET 1.0.0 encoding without a \"name\": {str(entry)[:80]}")
            name = entry["name"]
            if self.skip(name, entry, "enc_type"):
                continue
            try:
                bits = self.bits(name, entry["bw"], "bw")
                scale = np.asarray(entry["scale"], np.float64).reshape(-1)
                offset = np.asarray(entry["offset"], np.float64).reshape(-1)
                offset = np.broadcast_to(offset, scale.shape)
            except (KeyError, TypeError, ValueError) as exc:
                raise self.error(name, f"cannot read {exc} from it (1.0.0 layout: bw, scale, offset)") from None
            symmetric = bool(entry.get("is_sym", False)) and self._signed_grid(offset, bits)
            self.add(name, kind, scale, offset * scale, (offset + 2 ** bits - 1) * scale, symmetric, bits, None)

    def v2(self, section: list) -> None:
        if not isinstance(section, list):
            raise TrtBridgeError(f"{self.path}: AIMET 2.x encodings keep \"encodings\" as a list; this one is not.")
        params = set(self._shapes)
        for entry in section:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise TrtBridgeError(f"{self.path}: an AIMET 2.x encoding without a \"name\": {str(entry)[:80]}")
            name = entry["name"]
            if self.skip(name, entry, "enc_type"):
                continue
            dtype = str(entry.get("output_dtype", ""))
            if dtype.lower() in FLOAT8:
                self.float8(name, entry, dtype.lower(), params)
                continue
            try:
                signed = not dtype.startswith("u")
                bits = self.bits(name, dtype.lstrip("u").removeprefix("int"), "output_dtype")
                scale = np.asarray(entry["y_scale"], np.float64).reshape(-1)
                zp = np.broadcast_to(np.asarray(entry.get("y_zero_point", 0), np.float64).reshape(-1), scale.shape)
            except (KeyError, TypeError, ValueError) as exc:
                raise self.error(name, f"cannot read {exc} from it (2.x layout: output_dtype intN/uintN, y_scale, "
                                 "y_zero_point)") from None
            qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
            kind, axis = self._kind_axis(name, entry, scale, params)
            self.add(name, kind, scale, (qmin - zp) * scale, (qmax - zp) * scale,
                     signed and bool(np.all(zp == 0)), bits, axis)

    def float8(self, name: str, entry: dict, dtype: str, params: set[str]) -> None:
        """A 2.x FP8 entry (``output_dtype: float8e4m3fn``, ``y_scale``, zero point 0): the range ``y_scale``
        times the format's largest value, kept FP8 (E4M3; E5M2 becomes E4M3 over the same range, noted)."""
        try:
            scale = np.asarray(entry["y_scale"], np.float64).reshape(-1)
            zp = np.asarray(entry.get("y_zero_point", 0), np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise self.error(name, f"cannot read {exc} from it (2.x FP8 layout: output_dtype, y_scale)") from None
        if np.any(zp != 0):
            raise self.error(name, f"{dtype} with a non-zero zero point; FP8 encodings are symmetric (zero point 0)")
        if dtype != "float8e4m3fn":
            self.note(f"{dtype} encodings imported as FP8 E4M3 over the same range (TensorRT quantizes FP8 as E4M3)",
                      name)
        kind, axis = self._kind_axis(name, entry, scale, params)
        # in INT8 units (amax = 127 of them), as every entry: y_scale · largest FP8 value is the range
        self.add(name, kind, scale * (FLOAT8[dtype] / 127), None, None, True, 8, axis, "fp8")

    def _kind_axis(self, name: str, entry: dict, scale: np.ndarray, params: set[str]) -> tuple[str, int | None]:
        """A 2.x entry's kind (a weight where the model holds it as a constant, or, without the model, where it
        has several scales) and its axis (negative ones counted from the weight's rank; None when not given)."""
        kind = "weight" if name in params or (self.model is None and scale.size > 1) else "activation"
        axis = entry.get("axis")
        if isinstance(axis, int) and name in self._shapes and axis < 0:
            axis += len(self._shapes[name])
        return kind, axis if isinstance(axis, int) else None

    @staticmethod
    def _signed_grid(offset: np.ndarray, bits: int) -> bool:
        """A symmetric encoding's unsigned-style offset is −2^(bw−1) (the codes centred on zero)."""
        return bool(np.all(np.asarray(offset) == -(2 ** (bits - 1))))

    def derive_data_movement(self) -> None:
        """Outputs of data-movement ops without an encoding take their input's (in graph order)."""
        if self.model is None:
            return
        for node in self.model.graph.node:
            if node.op_type not in DATA_MOVEMENT or (node.domain or "") not in ("", "ai.onnx") or not node.input:
                continue
            entry = self.table.get(node.input[0])
            if entry is None or entry.kind != "activation":
                continue
            for out in node.output:
                if out and out not in self.table:
                    self.table.add(ScaleEntry(out, entry.amax, None, "activation", f"{DERIVED}:{self.path.name}",
                                              format=entry.format))

    def finish(self) -> ScaleTable:
        self.derive_data_movement()
        for kind, names in self.notes.items():
            shown = ", ".join(f"'{n}'" for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            message = f"{self.path.name}: {kind}: {shown}"
            self.table.notes.append(message)
            log.warning("AIMET encodings %s", message)
        return self.table


def read_aimet(obj: dict, path: Path, model: onnx.ModelProto | None = None) -> ScaleTable:
    """An AIMET encodings document (parsed JSON) as a scale table; ``model`` (the ONNX model the
    encodings belong to) resolves per-channel axes and, in the 2.x layout, which entries are weights."""
    reader = _Reader(path, model)
    version = str(obj.get("version", "0.6.1"))
    major = version.split(".", 1)[0]
    if major == "0" or (major == "1" and isinstance(obj.get("activation_encodings"), dict)):
        for section, kind in zip(SECTIONS, ("activation", "weight")):
            reader.legacy(obj.get(section, {}), kind)
    elif major == "1":
        for section, kind in zip(SECTIONS, ("activation", "weight")):
            reader.v1(obj.get(section, []), kind)
    elif major == "2":
        reader.v2(obj.get("encodings", []))
    else:
        raise TrtBridgeError(f"{path}: AIMET encodings version {version!r} is not one trt-bridge reads (0.6.1, "
                             "1.0.0, 2.x); export with sim.export(..., encoding_version=\"1.0.0\").")
    return reader.finish()


def read_aimet_encodings(path, model: onnx.ModelProto | None = None) -> ScaleTable:
    """Read an AIMET ``.encodings`` file (see the module docstring)."""
    path = Path(path)
    obj = parse_json(read_text(path, "AIMET encodings file"), path)
    if not is_aimet(obj):
        raise TrtBridgeError(f"{path}: not an AIMET encodings file: it needs \"activation_encodings\"/"
                             "\"param_encodings\" (0.6.1, 1.0.0) or \"version\" and \"encodings\" (2.x).")
    return read_aimet(obj, path, model)


__all__ = ["is_aimet", "read_aimet", "read_aimet_encodings"]
