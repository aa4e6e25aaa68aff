"""What ``trt-bridge build`` is asked for: :class:`BuildOptions`, one field per CLI flag."""

from __future__ import annotations

from dataclasses import dataclass

from trt_bridge.tensorrt.profiles import Profile


@dataclass(frozen=True)
class BuildOptions:
    """Every option of ``trt-bridge build`` (one field per CLI flag)."""

    profiles: tuple[Profile, ...] = ()  # empty: dynamic dimensions become 1
    compute_capabilities: tuple[str, ...] = ()  # ("8.9", "12.0"): TensorRT-RTX ahead of time; (): this machine
    timing_cache: str | None = None  # loaded when the file exists, saved after the build
    workspace: int | None = None  # bytes
    optimization_level: int | None = None  # 0..5 (TensorRT's default: 3)
    version_compatible: bool = False
    hardware_compatibility: str | None = None  # "none", "ampere+", "same-compute-capability"
    weakly_typed: bool = False  # TensorRT 8.6/10.x: no STRONGLY_TYPED flag, INT8 and FP16 builder flags instead
    progress: bool = True  # a progress bar driven by TensorRT's progress monitor
    module: str | None = None  # force "tensorrt" or "tensorrt_rtx"
    plugins: tuple[str, ...] = ()  # plugin libraries (.so) or Python files registering creators (.py), as --plugins
