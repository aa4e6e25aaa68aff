"""The conversion: stages over one shared state, in the order ``STAGES`` gives, and the report built from what
each returned (:mod:`trt_bridge.conversion.pipeline`).

    load ─ lift ─ place ─ calibrate ─ lower ─ save ─ check

``convert`` and ``STAGES`` are imported on first use (a module ``__getattr__``): the command line's parser reads
:mod:`trt_bridge.conversion.options` without importing the conversion (onnx, numpy, onnxruntime), so
``trt-bridge convert --help`` stays light.
"""

import importlib

#: exported name → the module that defines it (imported on first access)
_EXPORTS = {"convert": "trt_bridge.conversion.pipeline", "STAGES": "trt_bridge.conversion.pipeline"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:  # a submodule (``from trt_bridge.conversion import give_back``) is imported by Python itself
        raise AttributeError(f"module 'trt_bridge.conversion' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
