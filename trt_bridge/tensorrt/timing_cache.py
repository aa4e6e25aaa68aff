"""TensorRT's timing cache file: loaded into the builder configuration before a build, saved after it."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from trt_bridge.ir.files import check_regular_input, write_bytes_atomic
from trt_bridge.tensorrt import is_rtx

log = logging.getLogger("trt_bridge.tensorrt")


def load_timing_cache(trt, config, path: str | None, logger) -> dict | None:
    """Attach the timing cache in ``path`` (an empty one when the file does not exist or TensorRT cannot use it).

    TensorRT-RTX picks kernels when the engine first runs, and its timing-cache operations are no-ops (it says
    so since 1.2; deserializing needs a GPU): the file is read and kept as it is, or created with TensorRT-RTX's
    own empty cache, so the same command line and CI cache step work with either TensorRT."""
    if path is None:
        return None
    check_regular_input(path, "timing cache")  # a named pipe would block the read, and the write after the build
    data = Path(path).read_bytes() if Path(path).is_file() else b""
    info = {"path": str(Path(path).resolve()), "loaded_bytes": len(data)}
    if is_rtx(trt):
        log.info("TensorRT-RTX: timing cache operations are no-ops; %s is %s", path,
                 "kept as it is" if data else "created with its empty cache")
        return {**info, "effective": False}
    mark = len(logger.messages)
    cache = config.create_timing_cache(data)
    said = [m for _, m in logger.messages[mark:] if "timing cache" in m.lower()]
    if cache is None or not config.set_timing_cache(cache, False):
        said.append("it does not match this TensorRT or GPU")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
    if data and said:
        log.warning("%s: TensorRT cannot use this timing cache (%s); building without it, then replacing it",
                    path, "; ".join(said))
        info["loaded_bytes"] = 0
    return {**info, "effective": True}


def save_timing_cache(trt, config, path: str, cache: dict) -> dict:
    """Write the builder's timing cache (with what this build timed) to ``path``, atomically."""
    if is_rtx(trt):
        if cache["loaded_bytes"]:
            return {**cache, "saved_bytes": 0}
        with warnings.catch_warnings():  # "Deprecated in TensorRT-RTX 1.2. Timing cache operations are no-ops"
            warnings.simplefilter("ignore", DeprecationWarning)
            data = bytes(config.create_timing_cache(b"").serialize())
    else:
        data = bytes(config.get_timing_cache().serialize())
    write_bytes_atomic(Path(path), data, "timing cache")
    return {**cache, "saved_bytes": len(data)}
