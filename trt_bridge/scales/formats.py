"""A scale file of any format trt-bridge reads, recognized by its content (``convert --scales FILE``).

One module per format: :mod:`.trt_cache` (TensorRT calibration caches), :mod:`.json_table` (trt-bridge
JSON), :mod:`.aimet` (AIMET encodings), :mod:`.ort_table` (onnxruntime calibration tables); reading
the file itself goes through :mod:`.files`.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from trt_bridge.errors import TrtBridgeError
from trt_bridge.scales.aimet import is_aimet, read_aimet
from trt_bridge.scales.files import decoded, parse_json
from trt_bridge.scales.json_table import table_of_json
from trt_bridge.scales.ort_table import ort_flatbuffers_table, ort_json_table, ort_text_line, ort_text_table
from trt_bridge.scales.table import ScaleTable
from trt_bridge.scales.trt_cache import parse_trt_cache


def read_scales(path: str | os.PathLike, model: onnx.ModelProto | None = None) -> ScaleTable:
    """Read a scale file, recognized by its content: a TensorRT calibration cache, trt-bridge JSON,
    an AIMET encodings file (:mod:`trt_bridge.scales.aimet`; ``model``, the ONNX model the file
    belongs to, gives its per-channel weights their axis) or an onnxruntime calibration table
    (JSON, text cache or flatbuffers)."""
    path = Path(path)
    text, data = decoded(path)
    if text is None:
        return ort_flatbuffers_table(data, path)
    head = text.lstrip("\ufeff \t\r\n")
    if head.startswith("TRT-"):
        return parse_trt_cache(text, path)
    if head.startswith("{") or head.startswith("["):
        obj = parse_json(text, path)
        if isinstance(obj, dict) and "format" in obj:
            return table_of_json(obj, path)
        if is_aimet(obj):
            return read_aimet(obj, path, model)
        return ort_json_table(obj, path)
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first and ort_text_line(first) is not None:
        return ort_text_table(text, path)
    raise TrtBridgeError(
        f"{path}: not a scale file trt-bridge knows. Expected a TensorRT calibration cache "
        "(first line TRT-<version>-<algorithm>), trt-bridge JSON ({\"format\": \"trt-bridge-scales\", ...}), "
        "AIMET encodings (sim.export's <name>.encodings) or an onnxruntime calibration table (calibration.json, "
        "calibration.cache or calibration.flatbuffers).")
