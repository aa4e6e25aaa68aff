"""Scale table files: read and write TensorRT calibration caches and trt-bridge JSON, read
onnxruntime calibration tables, and take the scales out of a converted Q/DQ model.

TensorRT calibration cache (text; read by TensorRT ≤ 10, onnxruntime's TensorRT EP and
ModelOpt's ``import_scales_from_calib_cache``)::

    TRT-100300-EntropyCalibration2        TRT-<version int>-<algorithm>: 8601 is 8.6.1, 100300 is 10.3.0
    input: 3c010a14                       <tensor>: 8 hex digits = big-endian IEEE-754 float32 bits
    conv1_out: 3d4ccccd                   of the scale (amax / 127)

  Activations only, one per line, ``"\\n"`` line ends, no blank lines (ModelOpt splits every
  line after the header at ``": "``). onnxruntime's TensorRT EP splits a line at its *first*
  ``':'``, so a tensor name holding ``':'`` loads in TensorRT and ModelOpt but not there
  (a warning is logged); this reader splits at the last ``':'``.

trt-bridge JSON (``write_json``/``read_json``; every value written is read back exactly)::

    {"format": "trt-bridge-scales", "version": 1,
     "tensors": {"x":            {"amax": 3.94, "axis": null, "kind": "activation", "source": "calibration"},
                 "conv1.weight": {"amax": [0.61, 0.53], "axis": 0, "kind": "weight", "source": "model"}}}

  ``amax`` is a number (per tensor) or a list (per channel along ``axis``, weights only);
  ``axis``, ``kind`` (default ``"activation"``) and ``source`` may be left out. ``source``
  says where the writer got the value; once read, an entry's provenance is the file
  (``"json:<file name>"``), the recorded one is informational.

onnxruntime calibration tables (``onnxruntime.quantization.quant_utils.write_calibration_table``
writes three files; all are read):

* ``calibration.json``: the ``TensorsData`` JSON (``{"CLS": "TensorsData", "data": {tensor:
  {"lowest": ..., "highest": ...}}}``, numbers or ``{"CLS": "numpy.array", "data": ...}``), also
  as written by ``calibrate.save_tensors_data``, or the older ``{tensor: [min, max]}``;
  amax = max(|min|, |max|).
* ``calibration.cache``: lines ``<tensor> <value>``, and ``calibration.flatbuffers`` (needs the
  ``flatbuffers`` package onnxruntime depends on): onnxruntime writes max(highest, lowest) there,
  which its TensorRT EP uses as the symmetric range; amax = |value|.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import struct
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.ir.model import constant_protos
from trt_bridge.scales.table import FLOAT32_TINY, QMAX, ScaleEntry, ScaleTable

log = logging.getLogger("trt_bridge.scales")

JSON_FORMAT = "trt-bridge-scales"
JSON_VERSION = 1
#: the header TensorRT writes: TRT-<NV_TENSORRT_VERSION>-<calibrator algorithm>
_TRT_HEADER = re.compile(r"TRT-(\d+)-([A-Za-z0-9_]+)")
_HEX = re.compile(r"[0-9a-fA-F]{1,8}")


# ---------------------------------------------------------------- dispatch


def read_scales(path: str | os.PathLike, model: onnx.ModelProto | None = None) -> ScaleTable:
    """Read a scale file, recognized by its content: a TensorRT calibration cache, trt-bridge JSON,
    an AIMET encodings file (:mod:`trt_bridge.scales.aimet`; ``model``, the ONNX model the file
    belongs to, gives its per-channel weights their axis) or an onnxruntime calibration table
    (JSON, text cache or flatbuffers)."""
    path = Path(path)
    text, data = _decoded(path)
    if text is None:
        return _ort_flatbuffers(data, path)
    head = text.lstrip("\ufeff \t\r\n")
    if head.startswith("TRT-"):
        return _trt_cache(text, path)
    if head.startswith("{") or head.startswith("["):
        obj = _json(text, path)
        if isinstance(obj, dict) and "format" in obj:
            return _trt_bridge_json(obj, path)
        from trt_bridge.scales.aimet import is_aimet, read_aimet

        if is_aimet(obj):
            return read_aimet(obj, path, model)
        return _ort_json(obj, path)
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first and _ort_text_line(first) is not None:
        return _ort_text(text, path)
    raise TrtBridgeError(
        f"{path}: not a scale file trt-bridge knows. Expected a TensorRT calibration cache "
        "(first line TRT-<version>-<algorithm>), trt-bridge JSON ({\"format\": \"trt-bridge-scales\", ...}), "
        "AIMET encodings (sim.export's <name>.encodings) or an onnxruntime calibration table (calibration.json, "
        "calibration.cache or calibration.flatbuffers).")


def _decoded(path: Path) -> tuple[str | None, bytes]:
    """The file's text (None when it is not UTF-8: a binary format) and its bytes."""
    data = _read_bytes(path)
    try:
        return data.decode("utf-8"), data
    except UnicodeDecodeError:
        return None, data


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise TrtBridgeError(f"{path}: no such file. Check the path to the scale file.")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrtBridgeError(f"{path}: cannot read the scale file ({exc}).") from exc
    if not data.strip():
        raise TrtBridgeError(f"{path}: the scale file is empty.")
    return data


def _read_text(path: Path, what: str) -> str:
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrtBridgeError(f"{path}: not a text file, so not a {what} ({exc}).") from exc


def write_text_file(path: str | os.PathLike, text: str, what: str) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    from trt_bridge.ir.model import check_writable, write_text_atomic

    check_writable(path, what)
    return write_text_atomic(path, text, what)


# ---------------------------------------------------------------- TensorRT calibration cache


def read_trt_cache(path: str | os.PathLike) -> ScaleTable:
    """Read a TensorRT calibration cache: every entry an activation with amax = scale · 127."""
    path = Path(path)
    return _trt_cache(_read_text(path, "TensorRT calibration cache"), path)


def _trt_cache(text: str, path: Path) -> ScaleTable:
    lines = text.lstrip("\ufeff").splitlines()
    header = lines[0].strip() if lines else ""
    if not _TRT_HEADER.fullmatch(header):
        raise TrtBridgeError(f"{path}:1: '{header[:60]}' is not a TensorRT calibration cache header; "
                             "expected TRT-<version>-<algorithm>, e.g. TRT-8601-EntropyCalibration2.")
    source = f"trt-cache:{path.name}"
    table = ScaleTable()
    for lineno, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line:
            continue
        name, sep, value = line.rpartition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not _HEX.fullmatch(value):
            raise TrtBridgeError(f"{path}:{lineno}: '{line[:80]}' is not '<tensor name>: <8 hex digits>' "
                                 "(the float32 bits of the scale). Fix or remove the line.")
        scale = struct.unpack(">f", int(value, 16).to_bytes(4, "big"))[0]
        if not math.isfinite(scale) or not scale >= FLOAT32_TINY:
            raise TrtBridgeError(f"{path}:{lineno}: tensor '{name}' has scale {scale} (bits {value}); "
                                 "a scale must be finite and positive (float32's smallest normal or more). Fix or "
                                 "remove the line.")
        if name in table:
            raise TrtBridgeError(f"{path}:{lineno}: tensor '{name}' is listed twice; keep one line.")
        table.add(ScaleEntry(name, scale * QMAX, None, "activation", source))  # exact in float64
    return table


def float32_hex(value: float) -> str:
    """The 8 hex digits of ``value`` rounded to float32, big-endian (TensorRT's cache encoding)."""
    return struct.pack(">f", np.float32(value)).hex()


def write_trt_cache(table: ScaleTable, path: str | os.PathLike, version: int = 100300,
                    algorithm: str = "EntropyCalibration2") -> Path:
    """Write the activations of ``table`` as a TensorRT calibration cache (weights are skipped:
    the cache format has no per-channel values). Each scale is ``amax / 127`` rounded to float32
    once, so a cache read with :func:`read_trt_cache` writes back bit for bit."""
    if isinstance(version, bool) or not isinstance(version, int) or version <= 0:
        raise TrtBridgeError(f"TensorRT cache version {version!r} is not a positive integer "
                             "(NV_TENSORRT_VERSION: 8601 for 8.6.1, 100300 for 10.3.0).")
    if not re.fullmatch(r"[A-Za-z0-9_]+", algorithm or ""):
        raise TrtBridgeError(f"TensorRT cache algorithm {algorithm!r} must be one word, e.g. EntropyCalibration2.")
    lines = [f"TRT-{version}-{algorithm}"]
    for name, entry in table.activations().entries.items():
        if "\n" in name or "\r" in name or ": " in name:
            raise TrtBridgeError(f"tensor '{name}' cannot be written to a TensorRT calibration cache: its name "
                                 "holds a line break or ': ', which readers split lines at. Rename the tensor.")
        if ":" in name:
            log.warning("tensor '%s' holds ':'; onnxruntime's TensorRT EP splits cache lines at the first ':' "
                        "and will not find it", name)
        with np.errstate(over="ignore"):
            scale = np.float32(entry.scale)
        if not np.isfinite(scale):
            raise TrtBridgeError(f"tensor '{name}': scale {float(entry.scale)} (amax {entry.amax}) overflows float32.")
        lines.append(f"{name}: {float32_hex(scale)}")
    return write_text_file(path, "\n".join(lines) + "\n", "TensorRT calibration cache")


# ---------------------------------------------------------------- trt-bridge JSON


def read_json(path: str | os.PathLike) -> ScaleTable:
    """Read trt-bridge's documented JSON scale format (see the module docstring)."""
    path = Path(path)
    return _trt_bridge_json(_json(_read_text(path, "JSON file"), path), path)


def _json(text: str, path: Path):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrtBridgeError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno}).") from exc
    except RecursionError:
        raise TrtBridgeError(f"{path}: JSON nested too deeply to be a scale table (a scale table is two objects "
                             "deep).") from None


_ENTRY_KEYS = frozenset({"amax", "axis", "kind", "source"})


def _trt_bridge_json(obj, path: Path) -> ScaleTable:
    if not isinstance(obj, dict) or obj.get("format") != JSON_FORMAT:
        raise TrtBridgeError(f"{path}: not a trt-bridge scale file: it needs \"format\": \"{JSON_FORMAT}\" "
                             "at the top level.")
    version = obj.get("version")
    if version != JSON_VERSION:
        raise TrtBridgeError(f"{path}: scale file version {version!r} is not supported (this trt-bridge reads "
                             f"version {JSON_VERSION}); upgrade trt-bridge or re-export the file.")
    tensors = obj.get("tensors")
    if not isinstance(tensors, dict):
        raise TrtBridgeError(f"{path}: \"tensors\" must be an object {{tensor name: {{\"amax\": ...}}}}.")
    source = f"json:{path.name}"
    table = ScaleTable()
    for name, spec in tensors.items():
        where = f"{path}: tensor '{name}'"
        if not isinstance(spec, dict) or "amax" not in spec:
            raise TrtBridgeError(f"{where}: expected an object with \"amax\" (and optionally \"axis\", "
                                 "\"kind\", \"source\").")
        unknown = sorted(set(spec) - _ENTRY_KEYS)
        if unknown:
            raise TrtBridgeError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: "
                                 f"{', '.join(sorted(_ENTRY_KEYS))}.")
        try:
            table.add(ScaleEntry(name, spec["amax"], spec.get("axis"), spec.get("kind", "activation"), source))
        except TrtBridgeError as exc:
            raise TrtBridgeError(f"{path}: {exc}") from None
    return table


def write_json(table: ScaleTable, path: str | os.PathLike) -> Path:
    """Write ``table`` (activations and weights) in trt-bridge's JSON scale format."""
    doc = {"format": JSON_FORMAT, "version": JSON_VERSION,
           "tensors": {name: entry.to_dict() for name, entry in table.entries.items()}}
    return write_text_file(path, json.dumps(doc, indent=1) + "\n", "JSON scale file")


# ---------------------------------------------------------------- onnxruntime calibration tables


def read_ort_table(path: str | os.PathLike) -> ScaleTable:
    """Read an onnxruntime calibration table (``calibration.json``, ``calibration.cache`` or
    ``calibration.flatbuffers`` from ``write_calibration_table``, or ``save_tensors_data`` JSON)."""
    path = Path(path)
    text, data = _decoded(path)
    if text is None:
        return _ort_flatbuffers(data, path)
    if text.lstrip("\ufeff \t\r\n").startswith(("{", "[")):
        return _ort_json(_json(text, path), path)
    return _ort_text(text, path)


def _ort_json(obj, path: Path) -> ScaleTable:
    if isinstance(obj, dict) and obj.get("CLS") == "TensorsData":
        obj = obj.get("data")
    if not isinstance(obj, dict):
        raise TrtBridgeError(f"{path}: not an onnxruntime calibration table: expected an object of tensor ranges "
                             "({tensor: [min, max]} or TensorsData JSON).")
    source = f"ort-table:{path.name}"
    table = ScaleTable()
    for name, value in obj.items():
        if isinstance(value, dict):
            if "lowest" not in value or "highest" not in value:
                raise TrtBridgeError(f"{path}: tensor '{name}' has no \"lowest\"/\"highest\" range; "
                                     "calibrate with a method that records ranges (MinMax, Entropy, Percentile).")
            lo, hi = _ort_number(value["lowest"], path, name), _ort_number(value["highest"], path, name)
        elif isinstance(value, list) and len(value) >= 2:
            lo, hi = _ort_number(value[0], path, name), _ort_number(value[1], path, name)
        else:
            raise TrtBridgeError(f"{path}: tensor '{name}': expected [min, max] or {{\"lowest\", \"highest\"}}, "
                                 f"got {str(value)[:60]}.")
        try:
            table.add(ScaleEntry(name, max(abs(lo), abs(hi)), None, "activation", source))
        except TrtBridgeError as exc:
            raise TrtBridgeError(f"{path}: {exc}") from None
    return table


def _ort_number(value, path: Path, name: str) -> float:
    """One float of an onnxruntime range: a number, ``{"CLS": "numpy.array", "data": ...}`` or a list."""
    if isinstance(value, dict) and "data" in value:
        value = value["data"]
    arr = np.asarray(value, dtype=np.float64) if not isinstance(value, (str, bytes)) else None
    if arr is None or arr.size != 1:
        what = "per-channel ranges (onnxruntime's table has no axis for them)" if arr is not None and arr.size > 1 \
            else f"{str(value)[:40]!r}"
        raise TrtBridgeError(f"{path}: tensor '{name}': cannot read a range from {what}; "
                             "give one [min, max] per tensor.")
    return float(arr.reshape(()))


def _ort_text_line(line: str) -> tuple[str, float] | None:
    name, sep, value = line.strip().rpartition(" ")
    if not sep or not name.strip():
        return None
    try:
        return name.strip(), float(value)
    except ValueError:
        return None


def _ort_text(text: str, path: Path) -> ScaleTable:
    source = f"ort-table:{path.name}"
    table = ScaleTable()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parsed = _ort_text_line(line)
        if parsed is None:
            raise TrtBridgeError(f"{path}:{lineno}: '{line.strip()[:80]}' is not '<tensor name> <range>' "
                                 "(onnxruntime's calibration.cache). Fix or remove the line.")
        name, value = parsed
        if name in table:
            raise TrtBridgeError(f"{path}:{lineno}: tensor '{name}' is listed twice; keep one line.")
        try:
            table.add(ScaleEntry(name, abs(value), None, "activation", source))
        except TrtBridgeError as exc:
            raise TrtBridgeError(f"{path}:{lineno}: {exc}") from None
    return table


def _ort_flatbuffers(data: bytes, path: Path) -> ScaleTable:
    try:
        from onnxruntime.quantization.CalTableFlatBuffers.TrtTable import TrtTable
    except ImportError as exc:  # flatbuffers (an onnxruntime dependency) or onnxruntime itself is missing
        raise MissingDependencyError(f"{path}: reading an onnxruntime calibration.flatbuffers table needs "
                                     f"onnxruntime and flatbuffers ({exc}); pip install onnxruntime flatbuffers.") \
            from exc
    source = f"ort-table:{path.name}"
    table = ScaleTable()
    try:
        root = TrtTable.GetRootAsTrtTable(bytearray(data), 0)
        items = [root.Dict(i) for i in range(root.DictLength())]
        pairs = [(kv.Key().decode("utf-8"), kv.Value().decode("utf-8")) for kv in items]
    except Exception as exc:  # corrupt buffers raise struct/index/unicode errors from deep inside flatbuffers
        raise TrtBridgeError(f"{path}: neither text nor an onnxruntime calibration.flatbuffers table "
                             f"({type(exc).__name__}: {exc}).") from exc
    for name, value in pairs:
        try:
            table.add(ScaleEntry(name, abs(float(value)), None, "activation", source))
        except (ValueError, TrtBridgeError) as exc:
            raise TrtBridgeError(f"{path}: tensor '{name}': bad range {value!r} ({exc}).") from None
    return table


# ---------------------------------------------------------------- a converted model's own scales


def scales_of_model(model: onnx.ModelProto, source: str = "model") -> ScaleTable:
    """The scales of a converted (trt-bridge output, or any symmetric int8 Q/DQ) model.

    Activations: every ``QuantizeLinear`` of a non-constant tensor, keyed by that tensor (the
    Q's input: the float tensor quantized). Weights: every ``DequantizeLinear`` of a constant
    int8 tensor, keyed by the original weight name: lowering names the int8 initializer
    ``<weight>_int8`` (``<weight>_int8_<n>`` on a clash), and the suffix is stripped; a
    ``QuantizeLinear`` of a constant float tensor (QAT style) is keyed by that tensor.
    Per-channel weight scales keep the DQ's axis (made non-negative). Non-zero zero points or
    missing int8 zero points (asymmetric or uint8 quantization) are errors: convert the model first.
    Only scales and zero points are loaded; weight values are never read.
    """
    constants = Constants(model)
    table = ScaleTable()

    def put(entry: ScaleEntry, node: onnx.NodeProto) -> None:
        old = table.get(entry.tensor)
        if old is None:
            table.add(entry)
        elif old != entry:
            raise TrtBridgeError(f"tensor '{entry.tensor}' is quantized with two different scales (the second by "
                                 f"{node.op_type} '{node.name}'); give it one scale.")

    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or not node.input:
            continue
        x = node.input[0]
        if node.op_type == "QuantizeLinear":
            scale = qdq_scale(node, constants)
            if x in constants:
                put(_weight_entry(x, node, scale, constants.rank(x), source), node)
            else:
                if scale.ndim:
                    raise TrtBridgeError(f"QuantizeLinear '{node.name}' quantizes activation '{x}' per channel; "
                                         "TensorRT quantizes activations per tensor.")
                put(ScaleEntry(x, float(scale) * QMAX, None, "activation", source), node)
        elif x in constants:  # a DequantizeLinear of constant (int8) weights
            if constants.dtype(x) != np.int8:
                raise TrtBridgeError(f"DequantizeLinear '{node.name}' dequantizes '{x}' of type {constants.dtype(x)}; "
                                     "trt-bridge reads symmetric int8 weights only. Convert the model first.")
            scale = qdq_scale(node, constants)
            put(_weight_entry(weight_name(x), node, scale, constants.rank(x), source), node)
    return table


def uncentered(table: ScaleTable, model: onnx.ModelProto) -> tuple[ScaleTable, list[str]]:
    """``table`` with each activation convert re-centred (``x ─ Sub(c) [─ Pad] ─ Q``) given back under the
    network's own tensor ``x``, with the range that covers it, ``amax = |c| + amax_centred``
    (= max(|lo|, |hi|) for a range [lo, hi] centred on c): the scale TensorRT ≤ 10, onnxruntime's TensorRT
    provider and ``convert --scales`` expect for ``x``. Returns the table and the names given back.
    A tensor with a scale of its own keeps the larger of the two."""
    producers = {o: n for n in model.graph.node for o in n.output}
    constants = Constants(model)
    originals: dict[str, float] = {}
    replaced = []
    for name, entry in table.entries.items():
        if entry.kind != "activation" or entry.per_channel:
            continue
        tensor = name
        while tensor in producers and producers[tensor].op_type == "Pad":
            tensor = producers[tensor].input[0]
        node = producers.get(tensor)
        if node is None or node.op_type != "Sub" or len(node.input) != 2 or node.input[1] not in constants:
            continue
        center = constants.array(node.input[1])
        if center.size != 1:
            continue
        amax = abs(float(center.ravel()[0])) + float(entry.amax)
        original = node.input[0]
        originals[original] = max(originals.get(original, 0.0), amax)
        replaced.append(name)
    if not replaced:
        return table, []
    out = ScaleTable()
    for name, entry in table.entries.items():
        if name in replaced:
            continue
        if name in originals:
            entry = ScaleEntry(name, max(float(entry.amax), originals.pop(name)), None, "activation", entry.source)
        out.add(entry)
    source = next(iter(table.entries.values())).source
    for name, amax in originals.items():
        out.add(ScaleEntry(name, amax, None, "activation", source))
    return out, replaced


def weight_name(int8_name: str) -> str:
    stripped = re.sub(r"_int8(_\d+)?$", "", int8_name)
    return stripped or int8_name


def _weight_entry(name: str, node: onnx.NodeProto, scale: np.ndarray, rank: int, source: str) -> ScaleEntry:
    amax = scale.astype(np.float64) * QMAX  # exact for float32/float16 scales
    if scale.ndim == 0:
        return ScaleEntry(name, float(amax), None, "weight", source)
    axis = qdq_axis(node, rank)
    return ScaleEntry(name, tuple(amax.tolist()), axis, "weight", source)


def qdq_axis(node: onnx.NodeProto, rank: int) -> int:
    """The (non-negative) axis attribute of a per-channel Q/DQ (ONNX's default is 1)."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return axis + rank if axis < 0 else axis


def qdq_scale(node: onnx.NodeProto, constants: Constants) -> np.ndarray:
    """The node's scale (0-d or 1-d, its own float type), after checking its zero point is an int8 0."""
    if len(node.input) < 2 or node.input[1] not in constants:
        raise TrtBridgeError(f"{node.op_type} '{node.name}' has no constant scale; TensorRT needs build-time "
                             "constant scales (initializers).")
    scale = constants.array(node.input[1])
    if scale.ndim > 1:
        raise TrtBridgeError(f"{node.op_type} '{node.name}' has a {scale.ndim}-d scale (blocked quantization); "
                             "trt-bridge reads per-tensor and per-channel int8 scales only.")
    zp = constants.array(node.input[2]) if len(node.input) > 2 and node.input[2] in constants else None
    x = node.input[0]
    int8 = zp.dtype == np.int8 if zp is not None else (
        node.op_type == "DequantizeLinear" and x in constants and constants.dtype(x) == np.int8)
    if not int8 or (zp is not None and np.any(zp != 0)):
        raise TrtBridgeError(f"{node.op_type} '{node.name}' is not symmetric int8 (zero point "
                             f"{'missing' if zp is None else zp.tolist()}); read the scales of a converted model "
                             "(trt-bridge convert makes every zero point an int8 0).")
    return scale


class Constants:
    """A model's initializers and Constant node values by name, converted to numpy on demand
    (weights are only asked for their type and rank, so their values are never copied)."""

    def __init__(self, model: onnx.ModelProto):
        self._protos: dict[str, onnx.TensorProto] = constant_protos(model)

    def __contains__(self, name: object) -> bool:
        return name in self._protos

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self._protos[name])

    def rank(self, name: str) -> int:
        return len(self._protos[name].dims)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._protos[name].dims)

    def dtype(self, name: str) -> np.dtype:
        return onnx.helper.tensor_dtype_to_np_dtype(self._protos[name].data_type)
