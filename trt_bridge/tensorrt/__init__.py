"""A lazy shim over ``tensorrt`` (TensorRT 10/11, GPU machines) and ``tensorrt_rtx``
(TensorRT-RTX, whose parser and builder also run ahead of time on a CPU-only machine).
Both expose the same Python API; nothing is imported until it is needed.

The package: :mod:`.parse` (TensorRT's ONNX parser and what it says), :mod:`.build` (``trt-bridge build``), with
:mod:`.options`, :mod:`.profiles` (the shapes syntax), :mod:`.target` (which TensorRT builds for what),
:mod:`.config` (builder flags), :mod:`.timing_cache`, :mod:`.progress` and :mod:`.sidecar` (``<engine>.json``);
:mod:`.logger` (TensorRT loggers) and :mod:`.cuda` (cuda-python calls and the GPU probe) for building and
running engines."""

from __future__ import annotations

import importlib
from types import ModuleType

from trt_bridge.errors import MissingDependencyError
from trt_bridge.tensorrt.cuda import gpu_problem

MODULES = ("tensorrt", "tensorrt_rtx")  # in the order import_tensorrt tries them
_cache: dict[str, ModuleType] = {}


def import_tensorrt(prefer: str | None = None) -> ModuleType:
    """The TensorRT module: ``prefer`` if given, else ``tensorrt``, else ``tensorrt_rtx``."""
    order = (prefer,) if prefer else MODULES
    for name in order:
        if name in _cache:
            return _cache[name]
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _cache[name] = module
        return module
    raise MissingDependencyError(
        "TensorRT is not installed. On any machine: pip install 'trt-bridge[rtx]' (TensorRT-RTX: parse "
        "and build ahead of time); on a GPU machine with datacenter TensorRT: pip install 'trt-bridge[trt]'."
    )


def is_rtx(trt: ModuleType) -> bool:
    return trt.__name__.startswith("tensorrt_rtx")


def gpu_present() -> bool:
    """Whether an NVIDIA GPU can run engines here: cuda-python's runtime sees one (without cuda-python,
    whether the driver's device node exists)."""
    try:
        return gpu_problem() is None
    except MissingDependencyError:  # a driver, but no cuda-python
        return True
