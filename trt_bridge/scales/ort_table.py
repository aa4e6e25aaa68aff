"""onnxruntime calibration tables: read (``onnxruntime.quantization.quant_utils.write_calibration_table``
writes three files; all are read).

* ``calibration.json``: the ``TensorsData`` JSON (``{"CLS": "TensorsData", "data": {tensor:
  {"lowest": ..., "highest": ...}}}``, numbers or ``{"CLS": "numpy.array", "data": ...}``), also
  as written by ``calibrate.save_tensors_data``, or the older ``{tensor: [min, max]}``;
  amax = max(|min|, |max|).
* ``calibration.cache``: lines ``<tensor> <value>``, and ``calibration.flatbuffers`` (needs the
  ``flatbuffers`` package onnxruntime depends on): onnxruntime writes max(highest, lowest) there,
  which its TensorRT EP uses as the symmetric range; amax = |value|.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.scales.files import decoded, parse_json
from trt_bridge.scales.table import ScaleEntry, ScaleTable


def read_ort_table(path: str | os.PathLike) -> ScaleTable:
    """Read an onnxruntime calibration table (``calibration.json``, ``calibration.cache`` or
    ``calibration.flatbuffers`` from ``write_calibration_table``, or ``save_tensors_data`` JSON)."""
    path = Path(path)
    text, data = decoded(path)
    if text is None:
        return ort_flatbuffers_table(data, path)
    if text.lstrip("\ufeff \t\r\n").startswith(("{", "[")):
        return ort_json_table(parse_json(text, path), path)
    return ort_text_table(text, path)


def ort_json_table(obj, path: Path) -> ScaleTable:
    """The ranges in ``obj``, the parsed ``calibration.json`` (TensorsData or ``{tensor: [min, max]}``) ``path``."""
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


def ort_text_line(line: str) -> tuple[str, float] | None:
    """``(tensor, value)`` of a ``calibration.cache`` line ``<tensor> <value>``; None when it is not one."""
    name, sep, value = line.strip().rpartition(" ")
    if not sep or not name.strip():
        return None
    try:
        return name.strip(), float(value)
    except ValueError:
        return None


def ort_text_table(text: str, path: Path) -> ScaleTable:
    """The ranges in ``text``, the content of the ``calibration.cache`` ``path``."""
    source = f"ort-table:{path.name}"
    table = ScaleTable()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parsed = ort_text_line(line)
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


def ort_flatbuffers_table(data: bytes, path: Path) -> ScaleTable:
    """The ranges in ``data``, the bytes of the ``calibration.flatbuffers`` ``path``."""
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
