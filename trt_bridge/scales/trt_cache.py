"""TensorRT calibration caches: read and write.

Format (text; read by TensorRT ≤ 10, onnxruntime's TensorRT EP and ModelOpt's
``import_scales_from_calib_cache``)::

    TRT-100300-EntropyCalibration2        TRT-<version int>-<algorithm>: 8601 is 8.6.1, 100300 is 10.3.0
    input: 3c010a14                       <tensor>: 8 hex digits = big-endian IEEE-754 float32 bits
    conv1_out: 3d4ccccd                   of the scale (amax / 127)

Activations only, one per line, ``"\\n"`` line ends, no blank lines (ModelOpt splits every
line after the header at ``": "``). onnxruntime's TensorRT EP splits a line at its *first*
``':'``, so a tensor name holding ``':'`` loads in TensorRT and ModelOpt but not there
(a warning is logged); this reader splits at the last ``':'``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import struct
from pathlib import Path

import numpy as np

from trt_bridge.errors import TrtBridgeError
from trt_bridge.scales.files import read_text, write_text_file
from trt_bridge.scales.table import FLOAT32_TINY, QMAX, ScaleEntry, ScaleTable

log = logging.getLogger("trt_bridge.scales")

#: the header TensorRT writes: TRT-<NV_TENSORRT_VERSION>-<calibrator algorithm>
_TRT_HEADER = re.compile(r"TRT-(\d+)-([A-Za-z0-9_]+)")
_HEX = re.compile(r"[0-9a-fA-F]{1,8}")


def read_trt_cache(path: str | os.PathLike) -> ScaleTable:
    """Read a TensorRT calibration cache: every entry an activation with amax = scale · 127."""
    path = Path(path)
    return parse_trt_cache(read_text(path, "TensorRT calibration cache"), path)


def parse_trt_cache(text: str, path: Path) -> ScaleTable:
    """The scale table in ``text``, the content of the TensorRT calibration cache ``path``."""
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
