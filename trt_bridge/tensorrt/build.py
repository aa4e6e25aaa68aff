"""Parse an ONNX model with TensorRT's parser and build an engine (ahead of time with TensorRT-RTX).

:func:`build` is ``trt-bridge build``: one code path over ``tensorrt`` 10.x/11.x (builds for the GPU of
this machine) and ``tensorrt_rtx`` (builds ahead of time for the compute capabilities asked for, with or
without a GPU), strongly typed unless ``weakly_typed`` (TensorRT 8.6/10.x only), with optimization
profiles, a timing cache file, TensorRT's progress monitor, and a sidecar JSON beside the engine
(``<engine>.json``: TensorRT module and version, target, profiles, I/O, model hash, flags, build time)
so that an engine is never used on the wrong card or TensorRT.

What differs between the TensorRT flavours is looked up by name (``hasattr``), never by version number:
TensorRT 11 removed the INT8/FP16 builder flags and renumbered NetworkDefinitionCreationFlag; TensorRT-RTX
has neither hardware-compatibility levels nor a working timing cache (its operations are no-ops; the file
is still loaded and saved, so one command line works on both).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import re
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.ir.model import write_bytes_atomic
from trt_bridge.tensorrt import MODULES, gpu_present, import_tensorrt, is_rtx

log = logging.getLogger("trt_bridge.tensorrt")

Shape = tuple[int, ...]
INSTALL = {"tensorrt": "pip install 'trt-bridge[trt]' (datacenter TensorRT; builds on a GPU machine)",
           "tensorrt_rtx": "pip install 'trt-bridge[rtx]' (TensorRT-RTX; builds ahead of time on any machine)"}
#: what TensorRT-RTX builds for when no compute capability is given (its documentation)
RTX_DEFAULT_TARGET = ("TensorRT-RTX's default: portable to compute capability 8.0 and newer "
                      "(7.5 needs --compute-capability 7.5)")


@dataclass(frozen=True)
class ParserError:
    """One error of TensorRT's ONNX parser, with the node it names ('' when none)."""

    node: str
    op: str
    code: str  # 'UNSUPPORTED_NODE', 'INVALID_NODE', ...
    message: str  # the parser's description, cleaned of unrelated runtime noise
    index: int = -1  # the node's position in the graph (-1: none)


@dataclass
class ParseResult:
    ok: bool
    errors: list[str] = field(default_factory=list)
    layers: int = 0
    details: list[ParserError] = field(default_factory=list)
    module: str = ""
    version: str = ""

    def __bool__(self) -> bool:
        return self.ok


class _Logger:
    """A TensorRT logger that keeps what the parser and builder say."""

    def __new__(cls, trt):
        class Impl(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)
                self.messages: list[str] = []

            def log(self, severity, msg):
                if severity <= trt.ILogger.Severity.WARNING:
                    self.messages.append(msg)

        return Impl()


def _network(trt, builder, strongly_typed: bool = True):
    """A network definition: strongly typed where TensorRT has the flag (TensorRT-RTX and 11 always are)."""
    flags = 0
    names = trt.NetworkDefinitionCreationFlag.__members__
    if strongly_typed and "STRONGLY_TYPED" in names and not is_rtx(trt):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    if "EXPLICIT_BATCH" in names and _major(trt) < 10:  # TensorRT 8.x: ONNX networks need explicit batch
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    return builder.create_network(flags)


def _major(trt) -> int:
    match = re.match(r"\d+", getattr(trt, "__version__", ""))
    return int(match.group()) if match else 0


def parse(path: str | Path, module: str | None = None) -> ParseResult:
    """Run TensorRT's ONNX parser on ``path``; collect its errors instead of raising."""
    trt = import_tensorrt(module)
    logger = _Logger(trt)
    builder = trt.Builder(logger)
    network = _network(trt, builder)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(path))
    errors = [parser.get_error(i) for i in range(parser.num_errors)]
    return ParseResult(bool(ok), [str(e) for e in errors], network.num_layers, _details(errors), trt.__name__,
                       getattr(trt, "__version__", "?"))


def _details(errors) -> list[ParserError]:
    out = []
    for e in errors:
        node = _call(e, "node_name")
        out.append(ParserError(node, _call(e, "node_operator"), str(e.code()).rsplit(".", 1)[-1],
                               _clean(e.desc(), node), int(e.node())))
    return out


def _call(error, method: str) -> str:
    """``error.method()`` or '' (TensorRT 8.6's ParserError has no node_name/node_operator)."""
    return (getattr(error, method, None) or (lambda: ""))() or ""


def _clean(desc: str, node: str) -> str:
    """The parser's message without its 'Invalid Node' header and the CUDA-runtime noise a GPU-less
    machine appends (TensorRT-RTX probes the driver while importing some layers)."""
    lines = []
    for line in desc.splitlines():
        line = line.strip()
        if not line or line == f"Invalid Node - {node}" or _noise(line):
            continue
        lines.append(line)
    text = " ".join(lines)
    if text in ("", "false"):
        return "no importer for this op"
    return text


def _noise(message: str) -> bool:
    """CUDA-runtime complaints of TensorRT-RTX on a machine without a GPU driver, unrelated to the model."""
    return "catchCudaError" in message or "cudaError" in message or "Thread context has not been set" in message


def build_engine(path: str | Path, compute_capability: str | None = "SM89", workspace: int = 1 << 30,
                 module: str | None = None, shapes: dict[str, tuple[int, ...]] | None = None) -> bytes:
    """Build a serialized engine for ``path`` (in memory; :func:`build` writes it with a sidecar).

    With TensorRT-RTX the engine is built ahead of time for ``compute_capability``
    (no GPU needed); ``None`` builds for the GPU in this machine. Datacenter TensorRT
    always builds for the local GPU and ignores it. Dynamic inputs get one fixed shape:
    ``shapes[name]``, or 1 for every dynamic dimension.
    """
    trt = import_tensorrt(module)
    ccs = (compute_capability,) if compute_capability and is_rtx(trt) else ()
    options = BuildOptions(profiles=(Profile.fixed(shapes),) if shapes else (), compute_capabilities=ccs,
                           workspace=workspace, progress=False)
    return _compile(trt, Path(path), options, fill_unnamed=True).engine


# --- trt-bridge build ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """One optimization profile: input name → (min, opt, max) shapes. Dynamic inputs it does not name are an
    error (so a typo never builds a profile for shapes nobody asked for)."""

    shapes: dict[str, tuple[Shape, Shape, Shape]]

    @classmethod
    def fixed(cls, shapes: dict[str, Shape]) -> Profile:
        """min = opt = max (``--shapes``)."""
        return cls({name: (tuple(s), tuple(s), tuple(s)) for name, s in shapes.items()})

    def to_dict(self) -> dict:
        return {name: {"min": list(mn), "opt": list(opt), "max": list(mx)} for name, (mn, opt, mx) in
                self.shapes.items()}


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


@dataclass
class BuildResult:
    engine: str
    sidecar: str
    info: dict  # what the sidecar holds
    seconds: float

    def to_json(self) -> str:
        return json.dumps({"engine": self.engine, "sidecar": self.sidecar, "seconds": round(self.seconds, 3),
                           "info": self.info}, indent=2)

    def summary(self) -> str:
        trt = self.info["tensorrt"]
        size = self.info["engine"]["size"] / 2**20
        return (f"{self.engine}: {size:.1f} MiB engine for {self.info['target']['description']} "
                f"({trt['module']} {trt['version']}) in {self.seconds:.1f} s; sidecar {self.sidecar}")


class EngineBuildError(TrtBridgeError):
    """TensorRT rejects the model: its parser (:class:`ModelRejectedError`) or its builder."""


class ModelRejectedError(EngineBuildError):
    """TensorRT's ONNX parser rejects the model; ``findings`` in ``trt-bridge check``'s format."""

    def __init__(self, message: str, findings: list):
        super().__init__(message)
        self.findings = findings


def build(model: str | Path, output: str | Path, options: BuildOptions = BuildOptions()) -> BuildResult:
    """Build an engine for ``model`` into ``output`` (atomically) and its sidecar ``<output>.json``.

    Raises :class:`ModelRejectedError` when TensorRT's parser rejects the model, :class:`EngineBuildError`
    when its builder fails, MissingDependencyError without TensorRT and TrtBridgeError for every other
    problem (a flag the installed TensorRT lacks, no GPU for datacenter TensorRT, shapes that contradict
    the model, a path that would overwrite the model). The sidecar's ``created`` (UTC time of the build) is
    the one field that differs between two builds of the same model with the same options.
    """
    from trt_bridge import __version__
    from trt_bridge.ir.model import check_writable, external_data_files

    start = time.perf_counter()
    model, output = Path(model), Path(output)
    sidecar = sidecar_path(output)
    if not model.is_file():
        raise TrtBridgeError(f"{model}: no such file. Check the path to the ONNX model.")
    try:
        protected = [model, *external_data_files(model)]
    except Exception:  # noqa: BLE001 - not readable as ONNX: TensorRT's parser says why below
        protected = [model]
    for path, what in ((output, "engine"), (sidecar, "sidecar"), (options.timing_cache, "timing cache")):
        if path is not None and any(Path(path).resolve() == p.resolve() for p in protected):
            raise TrtBridgeError(f"the {what} {path} would overwrite the model {model}; choose another path.")
        if path is not None:
            check_writable(path, what)
    if options.timing_cache and Path(options.timing_cache).resolve() in (output.resolve(), sidecar.resolve()):
        raise TrtBridgeError(f"the timing cache {options.timing_cache} is also the engine or its sidecar; "
                             "choose another file.")
    trt = _select_module(options)
    target = _target(trt, options)
    model_info = {"path": str(model.resolve()), **_file_digest(model),
                  "external_data": [{"path": str(p.resolve()), **_file_digest(p)} for p in protected[1:]]}
    compiled = _compile(trt, model, options)
    seconds = time.perf_counter() - start
    info = {
        "trt_bridge_version": __version__,
        "tensorrt": {"module": trt.__name__, "version": getattr(trt, "__version__", "?")},
        "target": target,
        "model": model_info,
        "engine": {"path": str(output.resolve()), "sha256": hashlib.sha256(compiled.engine).hexdigest(),
                   "size": len(compiled.engine)},
        "inputs": compiled.inputs,
        "outputs": compiled.outputs,
        "profiles": [Profile(p).to_dict() for p in compiled.profiles],
        "flags": compiled.flags,
        "timing_cache": compiled.timing_cache,
        "build_seconds": round(seconds, 3),
        # UTC time of the build: the one field that differs between two builds of the same inputs
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    write_bytes_atomic(output, compiled.engine, "engine")
    write_bytes_atomic(sidecar, (json.dumps(info, indent=2) + "\n").encode(), "sidecar")
    log.info("%s: engine written (%d bytes) in %.1f s", output, len(compiled.engine), seconds)
    return BuildResult(str(output), str(sidecar), info, seconds)


def sidecar_path(engine: str | Path) -> Path:
    return Path(f"{engine}.json")


def read_sidecar(engine: str | Path) -> dict:
    """The sidecar :func:`build` wrote beside ``engine``."""
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
    return data


def parse_shapes(text: list[str]) -> dict[str, Shape]:
    """``["x:1x3x224x224", "mask:[1,128],ids:1x128"]`` → ``{"x": (1, 3, 224, 224), ...}``.

    trtexec's and Polygraphy's syntax: NAME:DIMS with dimensions joined by ``x`` or written as a list;
    several inputs as separate items or comma-separated; a name may hold colons (the last one splits).
    """
    shapes: dict[str, Shape] = {}
    for item in text or []:
        for part in _split_top_level(item):
            name, sep, dims = part.rpartition(":")
            dims = dims.strip()
            shape = None
            try:
                if dims.startswith("[") and dims.endswith("]"):
                    shape = tuple(int(d) for d in dims[1:-1].split(",") if d.strip()) if dims[1:-1].strip() else ()
                elif dims:
                    shape = tuple(int(d) for d in dims.lower().split("x"))
            except ValueError:
                shape = None
            name = name.strip()
            if not sep or not name or shape is None or any(d < 0 for d in shape):
                raise TrtBridgeError(f"shape '{part}' is not NAME:DIMS (e.g. x:1x3x224x224 or x:[1,3,224,224]; "
                                     "several inputs as x:1x3x224x224,mask:1x128).")
            if name in shapes and shapes[name] != shape:
                raise TrtBridgeError(f"input '{name}' is given two shapes ({_text(shapes[name])} and {_text(shape)}); "
                                     "give it once per profile.")
            shapes[name] = shape
    return shapes


def _split_top_level(item: str) -> list[str]:
    """Split at commas outside brackets: 'x:[1,3],y:2x4' → ['x:[1,3]', 'y:2x4']."""
    parts, depth, current = [], 0, ""
    for ch in item:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _text(shape) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"


def _select_module(options: BuildOptions):
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
            pass  # _target says why datacenter TensorRT cannot take them, or import_tensorrt that none is here
    trt = import_tensorrt()
    if not is_rtx(trt) and not gpu_present():
        try:
            rtx = import_tensorrt("tensorrt_rtx")
        except MissingDependencyError:
            return trt  # _target explains
        log.info("no GPU here: building with TensorRT-RTX %s instead of TensorRT %s", rtx.__version__,
                 trt.__version__)
        return rtx
    return trt


def _target(trt, options: BuildOptions) -> dict:
    """What the engine is for: compute capabilities (TensorRT-RTX) or this machine's GPU."""
    name = f"{trt.__name__} {getattr(trt, '__version__', '?')}"
    if is_rtx(trt):
        if options.compute_capabilities:
            ccs = list(dict.fromkeys(_compute_capability(trt, c)[1] for c in options.compute_capabilities))
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


def _compute_capability(trt, text: str):
    """'8.9' / 'SM89' / 'sm_89' / '89' → (trt.ComputeCapability.SM89, '8.9'); an error lists what this
    TensorRT-RTX builds for."""
    supported = {name: f"{name[2:-1]}.{name[-1]}" for name in trt.ComputeCapability.__members__
                 if re.fullmatch(r"SM\d+", name)}
    match = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d))?", str(text).strip().lower())
    if match and match.group(2) is not None:
        digits = match.group(1) + match.group(2)
    elif match and len(match.group(1)) >= 2:
        digits = match.group(1)
    else:
        raise TrtBridgeError(f"--compute-capability '{text}' is not a compute capability such as 8.9 or 12.0.")
    name = f"SM{digits}"
    if name not in supported:
        hopper = " (Hopper, 9.0, is a datacenter GPU: build on it with datacenter TensorRT)" if digits == "90" else ""
        raise TrtBridgeError(f"--compute-capability {text}: {trt.__name__} {trt.__version__} cannot build for "
                             f"compute capability {digits[:-1]}.{digits[-1]}{hopper}; it builds for "
                             f"{', '.join(supported.values())}.")
    return getattr(trt.ComputeCapability, name), supported[name]


def _local_device() -> dict | None:
    """Name and compute capability of the current CUDA device (cuda-python, else nvidia-smi)."""
    from trt_bridge.bench.cuda import call, device_name, runtime

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


@dataclass
class _Compiled:
    engine: bytes
    inputs: list[dict]
    outputs: list[dict]
    profiles: list[dict]
    flags: dict
    timing_cache: dict | None


class _BuildLogger:
    """A TensorRT logger that keeps errors and warnings (for error messages) and passes them to logging."""

    def __new__(cls, trt):
        class Impl(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)
                self.messages: list[tuple[int, str]] = []

            def log(self, severity, msg):
                if severity <= trt.ILogger.Severity.WARNING and not _noise(msg):
                    self.messages.append((int(severity), msg))
                    log.info("TensorRT: %s", msg)
                elif severity == trt.ILogger.Severity.INFO:
                    log.debug("TensorRT: %s", msg)

            def errors(self, since: int = 0) -> list[str]:
                return [m for s, m in self.messages[since:] if s <= int(trt.ILogger.Severity.ERROR)]

        return Impl()


def _compile(trt, path: Path, options: BuildOptions, fill_unnamed: bool = False) -> _Compiled:
    """Parse ``path`` and build it with ``options``; ``fill_unnamed``: dynamic inputs no profile names get 1s."""
    logger = _BuildLogger(trt)
    builder = trt.Builder(logger)
    strongly_typed = _check_typing(trt, options)
    network = _network(trt, builder, strongly_typed)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(path)):
        _raise_rejected(trt, path, [parser.get_error(i) for i in range(parser.num_errors)])
    config = builder.create_builder_config()
    flags = _configure(trt, config, options, strongly_typed)
    if is_rtx(trt) and options.compute_capabilities:
        ccs = list(dict.fromkeys(_compute_capability(trt, c)[0] for c in options.compute_capabilities))
        config.num_compute_capabilities = len(ccs)
        for i, cc in enumerate(ccs):
            config.set_compute_capability(cc, i)
    profiles = _resolve_profiles(network, options.profiles, path, fill_unnamed)
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (mn, opt, mx) in shapes.items():
            profile.set_shape(name, mn, opt, mx)
        if config.add_optimization_profile(profile) < 0:
            raise TrtBridgeError(f"{path}: TensorRT rejects the optimization profile {Profile(shapes).to_dict()}: "
                                 f"{'; '.join(logger.errors()[-3:]) or 'no reason given'}")
    cache = _load_timing_cache(trt, config, options.timing_cache, logger)
    monitor = None
    if options.progress and hasattr(trt, "IProgressMonitor"):
        monitor = _progress_monitor(trt)
        config.progress_monitor = monitor
    mark = len(logger.messages)
    try:
        engine = builder.build_serialized_network(network, config)
    finally:
        if monitor is not None:
            monitor.close()
    if monitor is not None and monitor.interrupted:
        raise KeyboardInterrupt
    if engine is None:
        raise EngineBuildError(_build_failure(trt, path, options, logger.errors(mark)))
    timing = _save_timing_cache(trt, config, options.timing_cache, cache) if options.timing_cache else None
    del parser
    return _Compiled(bytes(engine), _tensors(trt, network, True), _tensors(trt, network, False), profiles, flags,
                     timing)


def _check_typing(trt, options: BuildOptions) -> bool:
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


def _configure(trt, config, options: BuildOptions, strongly_typed: bool) -> dict:
    """Apply the builder flags of ``options``; return them as the sidecar records them."""
    name = f"{trt.__name__} {getattr(trt, '__version__', '?')}"
    precisions = []
    if not strongly_typed:
        for flag in ("INT8", "FP16"):
            if flag in trt.BuilderFlag.__members__:
                config.set_flag(getattr(trt.BuilderFlag, flag))
                precisions.append(flag.lower())
    if options.workspace is not None:
        if options.workspace <= 0:
            raise TrtBridgeError(f"--workspace {options.workspace}: give a positive size such as 1G or 512M.")
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace))
    if options.optimization_level is not None:
        if not 0 <= options.optimization_level <= 5:
            raise TrtBridgeError(f"--builder-optimization-level {options.optimization_level}: TensorRT takes 0 to 5 "
                                 "(default 3; higher builds longer and may find faster kernels).")
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


def _resolve_profiles(network, profiles: tuple[Profile, ...], path: Path, fill_unnamed: bool) -> list[dict]:
    """The shapes each profile sets, checked against the network's inputs (only dynamic inputs are set)."""
    inputs = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        inputs[tensor.name] = tuple(tensor.shape)
        if tensor.is_shape_tensor and any(d < 0 for d in tensor.shape):
            raise TrtBridgeError(f"{path}: input '{tensor.name}' is a shape tensor; trt-bridge build sets no shape "
                                 "values for such inputs yet. Fix its value in the model, or build with trtexec.")
    dynamic = {n: s for n, s in inputs.items() if any(d < 0 for d in s)}
    listing = ", ".join(f"{n} {_text(s)}" for n, s in inputs.items())
    if not profiles:
        default = {n: tuple(1 if d < 0 else d for d in s) for n, s in dynamic.items()}
        return [{n: (s, s, s) for n, s in default.items()}] if default else []
    resolved = []
    for number, profile in enumerate(profiles, 1):
        label = f"profile {number}"
        out = {}
        for name in profile.shapes:
            if name not in inputs:
                raise TrtBridgeError(f"{path}: {label} names '{name}', which is not an input of the model; its inputs "
                                     f"are: {listing}.")
        for name, shape in inputs.items():
            given = profile.shapes.get(name)
            if given is None:
                if name in dynamic and fill_unnamed:
                    fixed = tuple(1 if d < 0 else d for d in shape)
                    out[name] = (fixed, fixed, fixed)
                elif name in dynamic:
                    example = "x".join("1" if d < 0 else str(d) for d in shape)
                    raise TrtBridgeError(f"{path}: {label} gives no shape for the dynamic input '{name}' "
                                         f"{_text(shape)}; add {name}:{example} (or a range) to it.")
                continue
            trio = tuple(tuple(int(d) for d in s) for s in given)
            for which, s in zip(("min", "opt", "max"), trio):
                if len(s) != len(shape) or any(d < 0 for d in s):
                    raise TrtBridgeError(f"{path}: {label} gives input '{name}' the {which} shape {_text(s)}, but the "
                                         f"model's input is {_text(shape)} (rank {len(shape)}).")
                for axis, (want, got) in enumerate(zip(shape, s)):
                    if want >= 0 and want != got:
                        raise TrtBridgeError(f"{path}: {label} gives input '{name}' the {which} shape {_text(s)}, but "
                                             f"the model fixes dimension {axis} at {want} ({_text(shape)}).")
            if not all(a <= b <= c for a, b, c in zip(*trio)):
                mn, opt, mx = (_text(s) for s in trio)
                raise TrtBridgeError(f"{path}: {label} gives input '{name}' min {mn}, opt {opt}, max {mx}: every "
                                     "dimension needs min <= opt <= max.")
            if name in dynamic:
                out[name] = trio
        if out:
            resolved.append(out)
    return resolved


def _tensors(trt, network, inputs: bool) -> list[dict]:
    count = network.num_inputs if inputs else network.num_outputs
    get = network.get_input if inputs else network.get_output
    return [{"name": t.name, "dtype": _dtype(trt, t.dtype), "shape": list(t.shape)} for t in map(get, range(count))]


def _dtype(trt, dtype) -> str:
    try:
        import numpy as np

        return np.dtype(trt.nptype(dtype)).name
    except (TypeError, ValueError):
        return str(dtype).rsplit(".", 1)[-1].lower()


def _raise_rejected(trt, path: Path, errors) -> None:
    """Turn the parser's errors into ``check``'s findings (one per node) and raise ModelRejectedError."""
    from trt_bridge.checks.findings import Finding, Severity
    from trt_bridge.checks.rules import NO_IMPORTER

    names = _node_names(path)
    findings = []
    for error in _details(errors):
        node, op = error.node, error.op
        if not node and 0 <= error.index < len(names):
            node, op = names[error.index][0], op or names[error.index][1]
        message = f"{error.code}: {error.message}"
        if op in NO_IMPORTER:  # what check calls these; convert lifts them to Q/DQ
            findings.append(Finding("no-importer", Severity.BLOCKER, node, op, [], message, "lifted by `trt-bridge "
                                    "convert` (`trt-bridge check` says how)", True, message))
        else:
            findings.append(Finding("tensorrt-parser", Severity.BLOCKER, node, op, [], message, "`trt-bridge check` "
                                    "says whether convert fixes it", False, message))
    lines = "\n".join("  " + f.lines()[0] for f in findings)
    raise ModelRejectedError(
        f"{path}: TensorRT's ONNX parser ({trt.__name__} {trt.__version__}) rejects the model "
        f"({len(findings)} finding(s)):\n{lines}\n  `trt-bridge check {path}` says what convert does about each; "
        "`trt-bridge convert` writes the TensorRT-ready model to build instead.", findings)


def _node_names(path: Path) -> list[tuple[str, str]]:
    """(name, op) of each node by index: the parser names a node by its position when it has no name."""
    try:
        import onnx

        return [(n.name, n.op_type) for n in onnx.load(str(path), load_external_data=False).graph.node]
    except Exception:  # noqa: BLE001 - not even onnx can read it: the parser's own words must do
        return []


def _build_failure(trt, path: Path, options: BuildOptions, errors: list[str]) -> str:
    said = "; ".join(errors[-3:]) or "TensorRT gave no reason (run with -v for its log)"
    hint = ""
    if options.version_compatible and is_rtx(trt) and "lean" in said:
        hint = " TensorRT-RTX ships no lean runtime, which version-compatible engines embed: drop --version-compatible."
    elif options.workspace is not None:
        hint = " A larger --workspace may help."
    return f"{path}: TensorRT's builder ({trt.__name__} {trt.__version__}) failed: {said}.{hint}"


def _load_timing_cache(trt, config, path: str | None, logger) -> dict | None:
    """Attach the timing cache in ``path`` (an empty one when the file does not exist or TensorRT cannot use it).

    TensorRT-RTX picks kernels when the engine first runs, and its timing-cache operations are no-ops (it says
    so since 1.2; deserializing needs a GPU): the file is read and kept as it is, or created with TensorRT-RTX's
    own empty cache, so the same command line and CI cache step work with either TensorRT."""
    if path is None:
        return None
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


def _save_timing_cache(trt, config, path: str, cache: dict) -> dict:
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




def _file_digest(path: Path) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"sha256": digest.hexdigest(), "size": path.stat().st_size}


def _progress_monitor(trt):
    """A TensorRT progress monitor drawing a tqdm bar over the top-level phase ('Building engine'), the current
    inner phase as its postfix. Ctrl-C stops the build at the next step (TensorRT calls back from C++, where a
    KeyboardInterrupt cannot propagate)."""
    from tqdm import tqdm

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self.bar = None
            self.top = None
            self.interrupted = False

        def phase_start(self, phase_name, parent_phase, num_steps):
            try:
                if parent_phase is None and self.bar is None:
                    self.top = phase_name
                    self.bar = tqdm(total=num_steps, desc=phase_name, leave=False, dynamic_ncols=True, delay=0.5,
                                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
                elif self.bar is not None:
                    self.bar.set_postfix_str(phase_name)
                log.debug("TensorRT phase: %s (%d steps)", phase_name, num_steps)
            except KeyboardInterrupt:
                self.interrupted = True

        def step_complete(self, phase_name, step):
            try:
                if phase_name == self.top and self.bar is not None:
                    self.bar.update(step + 1 - self.bar.n)
            except KeyboardInterrupt:
                self.interrupted = True
            return not self.interrupted

        def phase_finish(self, phase_name):
            try:
                if phase_name == self.top:
                    self.close()
            except KeyboardInterrupt:
                self.interrupted = True

        def close(self):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    return Monitor()


def _json_default(obj):  # asdict turned nested dataclasses into dicts already: enums remain
    return obj.value if isinstance(obj, enum.Enum) else str(obj)


def findings_json(findings: list) -> list[dict]:
    """``check``'s JSON form of :attr:`ModelRejectedError.findings`."""
    return json.loads(json.dumps([dataclasses.asdict(f) for f in findings], default=_json_default))


__all__ = ["BuildOptions", "BuildResult", "EngineBuildError", "ModelRejectedError", "ParseResult", "ParserError",
           "Profile", "build", "build_engine", "findings_json", "parse", "parse_shapes", "read_sidecar",
           "sidecar_path"]
