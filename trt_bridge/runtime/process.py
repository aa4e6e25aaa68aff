"""Whether the command line owns this process (a light module: ``trt-bridge --help`` imports it).

In its own process the command line may quiet onnxruntime's default logger; a library call leaves the caller's
logger alone (:func:`trt_bridge.runtime.session.quiet_default_logger`).
"""

from __future__ import annotations

_OWN_PROCESS = {"quiet": False}


def own_process() -> None:
    """The command line owns its process: onnxruntime's default logger may be set to errors there."""
    _OWN_PROCESS["quiet"] = True


def owns_process() -> bool:
    """Whether :func:`own_process` was called."""
    return _OWN_PROCESS["quiet"]
