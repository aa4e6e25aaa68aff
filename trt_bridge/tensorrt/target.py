"""Which TensorRT builds the engine, and for what: TensorRT-RTX ahead of time for compute capabilities, or
datacenter TensorRT for the GPU of this machine (named in the sidecar); and what each builder runs a quantized layer
as (:data:`SUPPORT`, :func:`builder_view`: datacenter TensorRT W8A8 INT8, TensorRT-RTX INT8 only as weight-only
GEMMs)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from trt_bridge.choices import compute_capability, compute_capability_digits
from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.formats import FP4, FP8, INT4, INT8
from trt_bridge.lower.layer_precisions import QUANTIZED
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


# What each builder runs a quantized layer as: the layers by precision the model's types ask for
# (lower/layer_precisions.py: INT8 where a convolution or GEMM reads an int8 Q/DQ) are what datacenter TensorRT
# runs; TensorRT-RTX's own support matrix (docs.nvidia.com/deeplearning/tensorrt-rtx, "Support Matrix" 1.0-1.5)
# lists INT8 and INT4 only as weight-only GEMMs ("INT8 WoQ GEMM", "INT4 WoQ GEMM": 8.6, 8.9, 12.0), FP8 GEMMs
# (8.9, 12.0) and FP4 GEMMs (12.0); no W8A8 INT8, no quantized convolutions. Not verified on a GPU here: TensorRT-RTX
# picks its kernels on the device, so its ahead-of-time build cannot tell.

#: the builders, by module, as the reports name them
BUILDERS = {"tensorrt": "datacenter TensorRT", "tensorrt_rtx": "TensorRT-RTX"}
#: how a report names a precision a builder runs a layer as
RUNS_LABELS = {"int8-w": "INT8 weight-only", "int4-w": "INT4 weight-only", "fp4-w": "FP4 weight-only"}


@dataclass(frozen=True)
class Runs:
    """What a builder runs one kind of quantized layer as: ``precision`` ('int8', 'int8-w', 'fp8', 'int4-w', 'fp4',
    'fp4-w'; None: in float, the type the layer computes in) on compute capability ``min_compute`` and newer (below
    it: in float), and why."""

    precision: str | None
    min_compute: float = 0.0
    why: str = ""


_RTX_MATRIX = "not in TensorRT-RTX's support matrix"
#: how a report names a kind of layer
KIND_LABELS = {"convolution": "convolution", "gemm": "GEMM", "plugin": "plugin GEMM", "other": "layer"}
_PLUGIN = Runs("int8", 0.0, "trt-bridge's DynamicInt8Gemm plugin: its own int8 x int8 kernel")
_UNVERIFIED = " (not verified on a GPU)"

#: (module, the precision the model's types ask for, kind of layer) → what that builder runs it as; a key not here
#: runs in float (:func:`runs_as`)
SUPPORT: dict[tuple[str, str, str], Runs] = {
    ("tensorrt", "int8", "convolution"): Runs("int8", INT8.min_compute, "W8A8 INT8"),
    ("tensorrt", "int8", "gemm"): Runs("int8", INT8.min_compute, "W8A8 INT8"),
    ("tensorrt", "int8", "plugin"): _PLUGIN,
    ("tensorrt", "fp8", "convolution"): Runs("fp8", FP8.min_compute, "FP8" + _UNVERIFIED),
    ("tensorrt", "fp8", "gemm"): Runs("fp8", FP8.min_compute, "FP8"),
    ("tensorrt", "int8-w", "gemm"): Runs("int8-w", INT4.min_compute, "INT8 weight-only GEMM" + _UNVERIFIED),
    ("tensorrt", "int4-w", "gemm"): Runs("int4-w", INT4.min_compute, "INT4 weight-only GEMM"),
    ("tensorrt", "int4", "gemm"): Runs("int4-w", INT4.min_compute, "INT4 is weight-only: activations in float"),
    ("tensorrt", "fp4", "gemm"): Runs("fp4", FP4.min_compute, "NVFP4"),
    ("tensorrt", "fp4-w", "gemm"): Runs("fp4-w", FP4.min_compute, "FP4 weight-only GEMM" + _UNVERIFIED),
    ("tensorrt_rtx", "int8", "gemm"): Runs("int8-w", 8.6, "its INT8 WoQ GEMM; the activation's Q/DQ in float"),
    ("tensorrt_rtx", "int8-w", "gemm"): Runs("int8-w", 8.6, "its INT8 WoQ GEMM"),
    ("tensorrt_rtx", "int8", "plugin"): _PLUGIN,
    ("tensorrt_rtx", "fp8", "gemm"): Runs("fp8", 8.9, "FP8 GEMM"),
    ("tensorrt_rtx", "int4-w", "gemm"): Runs("int4-w", 8.6, "INT4 WoQ GEMM"),
    ("tensorrt_rtx", "int4", "gemm"): Runs("int4-w", 8.6, "INT4 WoQ GEMM: activations in float"),
    ("tensorrt_rtx", "fp4", "gemm"): Runs("fp4", 12.0, "FP4 GEMM"),
    ("tensorrt_rtx", "fp4-w", "gemm"): Runs("fp4-w", 12.0, "FP4 GEMM" + _UNVERIFIED),
}


def runs_as(module: str, precision: str, kind: str, compute: float | None = None) -> tuple[str | None, float, str]:
    """What ``module`` runs a ``kind`` layer ('convolution', 'gemm', 'plugin', 'other') whose model types ask for
    ``precision`` as: (the precision, None for float; the compute capability it needs, 0 for any; why). With
    ``compute`` given, a precision that needs a newer GPU runs in float."""
    runs = SUPPORT.get((module, precision, kind))
    if runs is None:
        why = _RTX_MATRIX if module == "tensorrt_rtx" else f"TensorRT has no {precision.upper()} {kind} kernels"
        return None, 0.0, why
    if compute is not None and compute < runs.min_compute:
        return None, 0.0, f"{runs.precision.upper()} needs compute capability {runs.min_compute:g}+"
    return runs.precision, (0.0 if compute is not None else runs.min_compute), runs.why


def builder_view(precisions: dict, module: str, compute_capability: str | None = None, used: bool = False) -> dict:
    """The layers of :func:`trt_bridge.lower.layer_precisions.layer_precisions` as ``module`` runs them, for
    ``check`` and convert's report: ``counts`` by the precision that builder runs (float layers stay as they
    are), and each quantized group with what it runs as (``runs_as``; ``needs_compute``: the compute capability
    it needs when no target is given) and why."""
    compute = compute_capability_value(compute_capability)
    counts: dict[str, int] = {}
    groups = []
    for group in precisions.get("groups", ()):
        runs, needs, why = (group["precision"], 0.0, "") if group["precision"] not in QUANTIZED else \
            runs_as(module, group["precision"], group["op"], compute)
        kind = runs or group["float"]
        counts[kind] = counts.get(kind, 0) + group["count"]
        if group["precision"] in QUANTIZED:
            groups.append({**group, "runs_as": kind, "quantized": runs is not None, "needs_compute": needs or None,
                           "why": why})
    quantized = sum(g["count"] for g in groups)
    view = {"module": module, "builder": BUILDERS[module], "used": used, "compute_capability": compute_capability,
            "counts": dict(sorted(counts.items())), "groups": groups, "quantized_layers": quantized,
            "run_quantized": sum(g["count"] for g in groups if g["quantized"]),
            "run_as_asked": sum(g["count"] for g in groups if g["runs_as"] == g["precision"])}
    view["line"] = _view_line(view)
    view["alternatives"] = _alternatives(view)
    return view


def compute_capability_value(text: str | None) -> float | None:
    """'8.9' → 8.9; None → None."""
    return None if text is None else compute_capability(text)


def _view_line(view: dict) -> str:
    where = ", ".join([*(["the builder used here"] if view["used"] else []),
                       *([f"compute capability {view['compute_capability']}"] if view["compute_capability"] else [])])
    line = f"as {view['builder']} runs them{f' ({where})' if where else ''}: " + (
        ", ".join(f"{k.upper()} {v}" for k, v in view["counts"].items()) or "none")
    notes, asked = [], []
    for g in view["groups"]:
        what = f"{g['count']} {g['precision'].upper()} {KIND_LABELS.get(g['op'], g['op'])}(s)"
        needs = f" on compute capability {g['needs_compute']:g}+" if g["needs_compute"] else ""
        if not g["quantized"]:
            notes.append(f"{what} in {g['runs_as'].upper()} ({g['why']})")
        elif g["runs_as"] != g["precision"]:
            notes.append(f"{what} as {RUNS_LABELS.get(g['runs_as'], g['runs_as'].upper())}{needs} ({g['why']})")
        else:
            asked.append(f"{what}{needs}")
    if asked:
        notes.insert(0, "as the model asks: " + ", ".join(asked))
    return line + ("; " + "; ".join(notes) if notes else "")


def headline_note(view: dict) -> str | None:
    """The headline's words for a builder that runs some quantized layers otherwise than the model's types ask
    (TensorRT-RTX: W8A8 INT8 in float or weight-only); None when it runs them as asked."""
    other = [g for g in view["groups"] if g["runs_as"] != g["precision"]]
    if not other:
        return None
    kinds = {g["precision"] for g in view["groups"]}
    asked = kinds.pop().upper() if len(kinds) == 1 else "quantized"
    floats = sum(g["count"] for g in other if not g["quantized"])
    weights = sum(g["count"] for g in other if g["quantized"])
    said = " and ".join([*([f"{floats} in float"] if floats else []),
                         *([f"{weights} weight-only"] if weights else [])])
    return f"{view['builder']} runs {said} of the {view['quantized_layers']} {asked} layer(s)"


def _alternatives(view: dict) -> str | None:
    """For TensorRT-RTX running some quantized layers in float or weight-only (W8A8 INT8 GEMMs, quantized
    convolutions): the forms it runs quantized instead. None for a builder that runs them as the model asks."""
    other = [g for g in view["groups"] if g["runs_as"] != g["precision"] and g["op"] != "plugin"]
    if not other or view["module"] != "tensorrt_rtx":
        return None
    asked = "/".join(dict.fromkeys(g["precision"].upper() for g in other))
    floats = sum(g["count"] for g in other if not g["quantized"])
    weights = sum(g["count"] for g in other if g["quantized"])
    said = " and ".join([*([f"{floats} in float"] if floats else []),
                         *([f"{weights} weight-only"] if weights else [])])
    total = sum(g["count"] for g in view["groups"] if g["precision"] in {g["precision"] for g in other})
    text = [f"of the model's {total} {asked} layer(s), {view['builder']} runs {said} (its support matrix has no "
            "W8A8 INT8 and no quantized convolutions)"]
    if any(g["op"] == "gemm" for g in other):
        text.append("the GEMM forms it runs quantized are --int4 (INT4 weight-only, compute capability 8.6+), --fp8 "
                    "(FP8, 8.9+) and FP4 (12.0, from an NVFP4 source)")
    if any(g["op"] == "convolution" for g in other):
        text.append("it runs convolutions in float in every format (--high-precision fp16 writes those it can in FP16)")
    if any(g["precision"] == "int8" for g in other):
        text.append("datacenter TensorRT runs INT8 as INT8")
    text.append("convert --trt-module tensorrt_rtx writes only the forms TensorRT-RTX runs")
    return "; ".join(text)
