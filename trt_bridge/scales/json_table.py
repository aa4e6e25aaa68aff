"""trt-bridge's JSON scale format: read and write (every value written is read back exactly)::

    {"format": "trt-bridge-scales", "version": 1,
     "tensors": {"x":            {"amax": 3.94, "axis": null, "kind": "activation", "source": "calibration"},
                 "conv1.weight": {"amax": [0.61, 0.53], "axis": 0, "kind": "weight", "source": "model"}}}

``amax`` is a number (per tensor) or a list (per channel along ``axis``, weights only);
``axis``, ``kind`` (default ``"activation"``) and ``source`` may be left out. ``source``
says where the writer got the value; once read, an entry's provenance is the file
(``"json:<file name>"``), the recorded one is informational.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trt_bridge.errors import TrtBridgeError
from trt_bridge.scales.files import parse_json, read_text, write_text_file
from trt_bridge.scales.table import ScaleEntry, ScaleTable

JSON_FORMAT = "trt-bridge-scales"
JSON_VERSION = 1


def read_json(path: str | os.PathLike) -> ScaleTable:
    """Read trt-bridge's documented JSON scale format (see the module docstring)."""
    path = Path(path)
    return table_of_json(parse_json(read_text(path, "JSON file"), path), path)


_ENTRY_KEYS = frozenset({"amax", "axis", "kind", "source"})


def table_of_json(obj, path: Path) -> ScaleTable:
    """The scale table in ``obj``, the parsed JSON of the trt-bridge scale file ``path``."""
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
