"""The sidecar JSON beside an engine (``<engine>.json``): TensorRT module and version, target, profiles, I/O,
model hash, flags, build time; what :func:`~trt_bridge.tensorrt.build.build` writes and every engine user reads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trt_bridge.errors import TrtBridgeError


class SidecarMismatchError(TrtBridgeError):
    """An engine's sidecar records another engine's SHA-256."""


def sidecar_path(engine: str | Path) -> Path:
    """``<engine>.json``."""
    return Path(f"{engine}.json")


def read_sidecar(engine: str | Path) -> dict:
    """The sidecar :func:`~trt_bridge.tensorrt.build.build` wrote beside ``engine``."""
    path = sidecar_path(engine)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TrtBridgeError(f"{engine}: no sidecar {path}. The engine was not built by `trt-bridge build`, or its "
                             ".json was not copied with it; rebuild it with `trt-bridge build`.") from None
    except (OSError, ValueError) as exc:
        raise TrtBridgeError(f"{path}: not a readable trt-bridge sidecar ({exc}); rebuild the engine.") from exc
    if not isinstance(data, dict) or "tensorrt" not in data:
        raise TrtBridgeError(f"{path}: not a trt-bridge sidecar (no 'tensorrt' key); rebuild the engine.")
    check_pair(engine, data)
    return data


def check_pair(engine: str | Path, data: dict) -> None:
    """The sidecar ``data`` describes the file ``engine``: the SHA-256 it records is the engine's (another build, or
    a copy of one file without the other, gave an engine a sidecar that is not its own)."""
    recorded = data.get("engine", {}).get("sha256") if isinstance(data.get("engine"), dict) else None
    if recorded is None or not Path(engine).is_file():
        return  # a sidecar of an older trt-bridge (no digest), or an engine that is not a file here
    if file_digest(Path(engine))["sha256"] != recorded:
        raise SidecarMismatchError(f"{engine}: its sidecar {sidecar_path(engine)} describes another engine (the "
                                   "SHA-256 it records differs: another build wrote one of the two, or one was "
                                   "copied without the other); rebuild the engine with `trt-bridge build`.")


def file_digest(path: Path) -> dict:
    """SHA-256 and size of ``path``, as the sidecar records the model and its external data."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"sha256": digest.hexdigest(), "size": path.stat().st_size}
