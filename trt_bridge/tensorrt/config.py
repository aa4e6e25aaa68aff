"""The builder configuration of ``trt-bridge build``: strong or weak typing, the flags of :class:`BuildOptions`
(workspace, optimization level, version and hardware compatibility), as the sidecar records them. What differs
between TensorRT flavours is looked up by name, never by version number."""

from __future__ import annotations

from trt_bridge.choices import check_bound
from trt_bridge.errors import TrtBridgeError
from trt_bridge.tensorrt import is_rtx
from trt_bridge.tensorrt.options import BuildOptions


def check_typing(trt, options: BuildOptions) -> bool:
    """Whether the network is strongly typed; errors for what this TensorRT cannot do."""
    name = f"{trt.__name__} {getattr(trt, '__version__', '?')}"
    if options.weakly_typed:
        if is_rtx(trt) or "INT8" not in trt.BuilderFlag.__members__:
            raise TrtBridgeError(f"--weakly-typed: {name} builds strongly typed networks only (TensorRT 11 and "
                                 "TensorRT-RTX have no INT8/FP16 builder flags). Drop --weakly-typed: a Q/DQ model "
                                 "builds as INT8 strongly typed, in the types the ONNX model gives each layer.")
        return False
    if not is_rtx(trt) and "STRONGLY_TYPED" not in trt.NetworkDefinitionCreationFlag.__members__ \
            and "INT8" in trt.BuilderFlag.__members__:
        raise TrtBridgeError(f"{name} has no strongly typed networks (TensorRT 10 introduced them); build with "
                             "--weakly-typed (INT8 and FP16 builder flags), or upgrade TensorRT.")
    return True


def configure(trt, config, options: BuildOptions, strongly_typed: bool) -> dict:
    """Apply the builder flags of ``options``; return them as the sidecar records them."""
    name = f"{trt.__name__} {getattr(trt, '__version__', '?')}"
    precisions = []
    if not strongly_typed:
        for flag in ("INT8", "FP16"):
            if flag in trt.BuilderFlag.__members__:
                config.set_flag(getattr(trt.BuilderFlag, flag))
                precisions.append(flag.lower())
    if options.workspace is not None:
        check_bound("workspace", options.workspace)
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace))
    if options.optimization_level is not None:
        check_bound("optimization_level", options.optimization_level)
        config.builder_optimization_level = options.optimization_level
    if options.version_compatible:
        if "VERSION_COMPATIBLE" not in trt.BuilderFlag.__members__:
            raise TrtBridgeError(f"--version-compatible: {name} has no version-compatible engines (TensorRT 8.6+).")
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    level = _hardware_compatibility(trt, options.hardware_compatibility)
    if level is not None:
        config.hardware_compatibility_level = level
    return {
        "strongly_typed": strongly_typed,
        "precision_flags": precisions,  # weakly typed only: the builder flags that let layers run in int8/fp16
        "version_compatible": options.version_compatible,
        "hardware_compatibility": (options.hardware_compatibility or "none").lower(),
        "builder_optimization_level": getattr(config, "builder_optimization_level", None),
        "workspace": options.workspace,
    }


def _hardware_compatibility(trt, text: str | None):
    if text is None:
        return None
    key = text.strip().lower().replace("+", "_plus").replace("-", "_").upper()
    enum_ = getattr(trt, "HardwareCompatibilityLevel", None)
    if key == "NONE" and (enum_ is None or is_rtx(trt)):
        return None
    if is_rtx(trt):
        raise TrtBridgeError(f"--hardware-compatibility {text}: TensorRT-RTX has no hardware-compatibility levels "
                             "(its engines are portable to compute capability 8.0 and newer by default); choose "
                             "targets with --compute-capability instead.")
    names = [n for n in (enum_.__members__ if enum_ is not None else ())]
    if key not in names:
        choices = ", ".join(n.lower().replace("_plus", "+").replace("_", "-") for n in names) or "none"
        raise TrtBridgeError(f"--hardware-compatibility {text}: {trt.__name__} {trt.__version__} takes {choices}.")
    return getattr(enum_, key)
