"""trt-bridge: get quantized ONNX models onto TensorRT as real INT8 engines.

The stable API (semantic versioning, see CHANGELOG.md) is what ``__all__`` names: the functions that mirror the
command line (:mod:`trt_bridge.api`) and the exceptions they raise (:mod:`trt_bridge.errors`)::

    import trt_bridge

    report = trt_bridge.convert("model.onnx", "model.trt.onnx", calib_data="calib.npz")

They are imported on first use (a module ``__getattr__``), so ``import trt_bridge`` and ``trt-bridge --help`` stay
fast: heavy dependencies (onnxruntime, tensorrt, polygraphy) load only when a command runs.
"""

import importlib

__version__ = "0.1.0"

#: exported name → the module that defines it (imported on first access)
_EXPORTS = {
    "convert": "trt_bridge.api",
    "check": "trt_bridge.api",
    "verify": "trt_bridge.api",
    "build": "trt_bridge.api",
    "TrtBridgeError": "trt_bridge.errors",
    "OptionError": "trt_bridge.errors",
    "UnknownOptionError": "trt_bridge.errors",
    "ModelLoadError": "trt_bridge.errors",
    "CalibrationDataError": "trt_bridge.errors",
    "UnsupportedPatternError": "trt_bridge.errors",
    "MissingDependencyError": "trt_bridge.errors",
    "InternalError": "trt_bridge.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trt_bridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
