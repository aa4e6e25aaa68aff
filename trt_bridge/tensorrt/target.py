"""Which TensorRT builds the engine, and for what: TensorRT-RTX ahead of time for compute capabilities, or
datacenter TensorRT for the GPU of this machine (named in the sidecar)."""

from __future__ import annotations

import logging
import re

from trt_bridge.choices import compute_capability_digits
from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.tensorrt import MODULES, gpu_present, import_tensorrt, is_rtx
from trt_bridge.tensorrt.cuda import call, device_name, runtime
from trt_bridge.tensorrt.options import BuildOptions

log = logging.getLogger("trt_bridge.tensorrt")

INSTALL = {"tensorrt": "pip install 'trt-bridge[trt]' (datacenter TensorRT; builds on a GPU machine)",
           "tensorrt_rtx": "pip install 'trt-bridge[rtx]' (TensorRT-RTX; builds ahead of time on any machine)"}
#: what TensorRT-RTX builds for when no compute capability is given (its documentation)
RTX_DEFAULT_TARGET = ("TensorRT-RTX's default: portable to compute capability 8.0 and newer "
                      "(7.5 needs --compute-capability 7.5)")


def select_module(options: BuildOptions):
    """The TensorRT module to build with: ``options.module``; else TensorRT-RTX for ahead-of-time builds or on a
    machine without a GPU, when installed; else the shim's order (tensorrt, then tensorrt_rtx)."""
    if options.module:
        if options.module not in MODULES:
            raise TrtBridgeError(f"TensorRT module '{options.module}': choose tensorrt or tensorrt_rtx.")
        try:
            return import_tensorrt(options.module)
        except MissingDependencyError:
            raise MissingDependencyError(f"{options.module} is not installed (it was asked for by name). Install "
                                         f"it: {INSTALL[options.module]}.") from None
    if options.compute_capabilities:
        try:
            return import_tensorrt("tensorrt_rtx")
        except MissingDependencyError:
            pass  # engine_target says why datacenter TensorRT cannot take them, or import_tensorrt that none is here
    trt = import_tensorrt()
    if not is_rtx(trt) and not gpu_present():
        try:
            rtx = import_tensorrt("tensorrt_rtx")
        except MissingDependencyError:
            return trt  # engine_target explains
        log.info("no GPU here: building with TensorRT-RTX %s instead of TensorRT %s", rtx.__version__,
                 trt.__version__)
        return rtx
    return trt


def engine_target(trt, options: BuildOptions) -> dict:
    """What the engine is for: compute capabilities (TensorRT-RTX) or this machine's GPU."""
    name = f"{trt.__name__} {getattr(trt, '__version__', '?')}"
    if is_rtx(trt):
        if options.compute_capabilities:
            ccs = list(dict.fromkeys(parse_compute_capability(trt, c)[1] for c in options.compute_capabilities))
            return {"compute_capabilities": ccs, "device": None,
                    "description": f"compute capabilit{'y' if len(ccs) == 1 else 'ies'} {', '.join(ccs)}"}
        device = _local_device() if gpu_present() else None
        return {"compute_capabilities": [], "device": device, "description": RTX_DEFAULT_TARGET}
    if options.compute_capabilities:
        raise TrtBridgeError(f"--compute-capability {', '.join(options.compute_capabilities)} builds ahead of time, "
                             f"which needs TensorRT-RTX ({INSTALL['tensorrt_rtx']}); {name} builds for the GPU of "
                             "this machine only. Drop --compute-capability, or install TensorRT-RTX.")
    if not gpu_present():
        raise TrtBridgeError(f"{name} builds engines for the GPU of the machine it runs on, and this machine has no "
                             f"NVIDIA GPU. Build on the target GPU machine, or install TensorRT-RTX "
                             f"({INSTALL['tensorrt_rtx']}) and give --compute-capability.")
    device = _local_device()
    level = (options.hardware_compatibility or "none").lower()
    where = device["name"] if device else "this machine's GPU"
    return {"compute_capabilities": [device["compute_capability"]] if device else [], "device": device,
            "description": where if level == "none" else f"{where}, hardware compatibility {level}"}


class UnbuildableTargetError(TrtBridgeError):
    """The installed TensorRT cannot build for the compute capability asked for (TensorRT-RTX has no SM 9.0 or
    10.0): the model may run there all the same; only this machine's build is impossible. ``target``: '9.0';
    ``builds``: what it builds for."""

    def __init__(self, message: str, target: str, builder: str, builds: tuple[str, ...]):
        super().__init__(message)
        self.target, self.builder, self.builds = target, builder, builds


def parse_compute_capability(trt, text: str):
    """'8.9' / 'SM89' / 'sm_89' / '89' → (trt.ComputeCapability.SM89, '8.9'); an error lists what this
    TensorRT-RTX builds for."""
    supported = {name: f"{name[2:-1]}.{name[-1]}" for name in trt.ComputeCapability.__members__
                 if re.fullmatch(r"SM\d+", name)}
    digits = compute_capability_digits(text)
    name = f"SM{digits}"
    if name not in supported:
        hopper = " (Hopper, 9.0, is a datacenter GPU: build on it with datacenter TensorRT)" if digits == "90" else ""
        raise UnbuildableTargetError(
            f"--compute-capability {text}: {trt.__name__} {trt.__version__} cannot build for compute capability "
            f"{digits[:-1]}.{digits[-1]}{hopper}; it builds for {', '.join(supported.values())}.",
            f"{digits[:-1]}.{digits[-1]}", f"{trt.__name__} {trt.__version__}", tuple(supported.values()))
    return getattr(trt.ComputeCapability, name), supported[name]


def _local_device() -> dict | None:
    """Name and compute capability of the current CUDA device (cuda-python, else nvidia-smi)."""
    try:
        cudart = runtime()
        index = call(cudart, "cudaGetDevice", what="finding the current GPU")
        props = call(cudart, "cudaGetDeviceProperties", index, what="reading the GPU's properties")
        return {"name": device_name(props), "compute_capability": f"{props.major}.{props.minor}", "index": int(index)}
    except Exception:  # noqa: BLE001 - no cuda-python, or it cannot see the GPU: ask nvidia-smi
        pass
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
        name, cc = (s.strip() for s in out[0].rsplit(",", 1))
        return {"name": name, "compute_capability": cc, "index": 0}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        log.warning("cannot tell which GPU this is (no cuda-python, no nvidia-smi): the sidecar names no device")
        return None
