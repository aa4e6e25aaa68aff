"""Build a TensorRT engine from an ONNX model (ahead of time with TensorRT-RTX).

:func:`build` is ``trt-bridge build``: one code path over ``tensorrt`` 10.x/11.x (builds for the GPU of
this machine) and ``tensorrt_rtx`` (builds ahead of time for the compute capabilities asked for, with or
without a GPU), strongly typed unless ``weakly_typed`` (TensorRT 8.6/10.x only), with optimization
profiles (:mod:`.profiles`), a timing cache file (:mod:`.timing_cache`), TensorRT's progress monitor
(:mod:`.progress`), and a sidecar JSON beside the engine (:mod:`.sidecar`: TensorRT module and version,
target, profiles, I/O, model hash, flags, build time) so that an engine is never used on the wrong card or
TensorRT. :func:`build_engine` builds in memory, for tests and scripts.

What differs between the TensorRT flavours is looked up by name (``hasattr``), never by version number:
TensorRT 11 removed the INT8/FP16 builder flags and renumbered NetworkDefinitionCreationFlag; TensorRT-RTX
has neither hardware-compatibility levels nor a working timing cache (its operations are no-ops; the file
is still loaded and saved, so one command line works on both).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from trt_bridge import __version__
from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.ir.commit import Outputs
from trt_bridge.ir.files import check_writable, external_data_files
from trt_bridge.plugins.plugin import take_build_problems
from trt_bridge.plugins.registry import register_for_model
from trt_bridge.tensorrt import import_tensorrt, is_rtx
from trt_bridge.tensorrt.config import check_typing, configure
from trt_bridge.tensorrt.costs import COST_TARGET, EngineCosts
from trt_bridge.tensorrt.decoder_profiles import decoder_profiles, window_pasts
from trt_bridge.tensorrt.logger import BuildLogger
from trt_bridge.tensorrt.network import create_network
from trt_bridge.tensorrt.options import BuildOptions
from trt_bridge.tensorrt.parse import ParserError, named_errors, parse
from trt_bridge.tensorrt.profiles import Profile, network_inputs, resolve_profiles
from trt_bridge.tensorrt.progress import progress_monitor
from trt_bridge.tensorrt.sidecar import file_digest, sidecar_path
from trt_bridge.tensorrt.target import engine_target, parse_compute_capability, select_module
from trt_bridge.tensorrt.timing_cache import load_timing_cache, save_timing_cache

log = logging.getLogger("trt_bridge.tensorrt")


def engine_costs(path: str | Path, compute_capability: str = COST_TARGET, module: str | None = None,
                 shapes: dict[str, tuple[int, ...]] | None = None, plugins: tuple[str, ...] = (),
                 profiles: tuple[Profile, ...] = ()) -> EngineCosts:
    """What an engine of ``path`` costs on the target: its size and the activation memory TensorRT's builder reports
    (an ahead-of-time build with TensorRT-RTX for ``compute_capability``; datacenter TensorRT builds for the GPU
    here). Dynamic inputs get ``profiles`` (``--shapes``, ``--min/--opt/--max-shapes``), else ``shapes[name]``,
    else a decoder's prefill and decode profiles (:mod:`.decoder_profiles`), else 1 for every dynamic dimension."""
    options = BuildOptions(profiles=profiles or ((Profile.fixed(shapes),) if shapes else ()),
                           compute_capabilities=(compute_capability,), module=module, progress=False,
                           plugins=plugins)
    trt = select_module(options)
    if not is_rtx(trt):
        options = replace(options, compute_capabilities=())
    compiled = _compile(trt, Path(path), options, fill_unnamed=True)
    target = f"SM {parse_compute_capability(trt, compute_capability)[1]}" if is_rtx(trt) else "this GPU"
    return EngineCosts(len(compiled.engine), compiled.memory.get("activation_bytes"),
                       compiled.memory.get("weights_bytes"), f"{target}, {trt.__name__} {trt.__version__}",
                       tuple(name for name in compiled.profile_names if name))


def costs_or_none(path: str | Path, compute_capability: str, plugins: tuple[str, ...] = (),
                  shapes: dict[str, tuple[int, ...]] | None = None,
                  profiles: tuple[Profile, ...] = ()) -> EngineCosts | None:
    """:func:`engine_costs`, or None (logged) where no TensorRT builder is installed or it fails on the model: for
    reports that show costs beside what they measure (verify, bench)."""
    try:
        return engine_costs(path, compute_capability, shapes=shapes, plugins=plugins, profiles=profiles)
    except MissingDependencyError:
        return None
    except EngineBuildError as exc:
        log.info("%s: no engine costs: %s", path, str(exc).splitlines()[0])
        return None


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
    return bytes(_compile(trt, Path(path), options, fill_unnamed=True).engine)


@dataclass
class BuildResult:
    engine: str
    sidecar: str
    info: dict  # what the sidecar holds
    seconds: float

    def to_dict(self) -> dict:
        """What ``trt-bridge build --json`` writes."""
        return {"engine": self.engine, "sidecar": self.sidecar, "seconds": round(self.seconds, 3), "info": self.info}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        trt = self.info["tensorrt"]
        size = self.info["engine"]["size"] / 2**20
        return (f"{self.engine}: {size:.1f} MiB engine for {self.info['target']['description']} "
                f"({trt['module']} {trt['version']}) in {self.seconds:.1f} s; sidecar {self.sidecar}")


class EngineBuildError(TrtBridgeError):
    """TensorRT rejects the model: its parser (:class:`ModelRejectedError`) or its builder."""


class ProfileBuildError(EngineBuildError):
    """TensorRT's builder fails for some optimization profiles and builds the others: ``failed`` (each one's name,
    shapes and the builder's error) and ``built`` (the names of those that build)."""

    def __init__(self, message: str, failed: list[dict], built: list[str]):
        super().__init__(message)
        self.failed, self.built = failed, built


class ProfilesApartError(EngineBuildError):
    """TensorRT's builder builds each of several profiles alone, not together in one engine (TensorRT-RTX 1.7.1 and
    an Optimum merged decoder's ``If`` at prefill and decode): ``built`` names them."""

    def __init__(self, message: str, built: list[str]):
        super().__init__(message)
        self.built = built


class ModelRejectedError(EngineBuildError):
    """TensorRT's ONNX parser rejects the model; ``errors``: what it says, node by node
    (:func:`trt_bridge.checks.findings.parser_findings` makes ``trt-bridge check``'s findings of them)."""

    def __init__(self, message: str, errors: list[ParserError]):
        super().__init__(message)
        self.errors = errors


def build(model: str | Path, output: str | Path, options: BuildOptions = BuildOptions()) -> BuildResult:
    """Build an engine for ``model`` into ``output`` and its sidecar ``<output>.json``, as one unit: both are renamed
    into place together (:class:`~trt_bridge.ir.commit.Outputs`), so two builds to one ``output`` at once leave
    one build's pair, never an engine beside another's sidecar.

    Raises :class:`ModelRejectedError` when TensorRT's parser rejects the model, :class:`EngineBuildError`
    when its builder fails, MissingDependencyError without TensorRT and TrtBridgeError for every other
    problem (a flag the installed TensorRT lacks, no GPU for datacenter TensorRT, shapes that contradict
    the model, a path that would overwrite the model). The sidecar's ``created`` (UTC time of the build) is
    the one field that differs between two builds of the same model with the same options.
    """
    start = time.perf_counter()
    model, output = Path(model), Path(output)
    sidecar = sidecar_path(output)
    if not model.is_file():
        raise TrtBridgeError(f"{model}: no such file. Check the path to the ONNX model.")
    protected = [model, *external_data_files(model)]  # links, pipes, devices refused before anything opens them
    for path, what in ((output, "engine"), (sidecar, "sidecar"), (options.timing_cache, "timing cache")):
        if path is not None and any(Path(path).resolve() == p.resolve() for p in protected):
            raise TrtBridgeError(f"the {what} {path} would overwrite the model {model}; choose another path.")
        if path is not None and any(Path(path).resolve() == Path(p).resolve() for p in options.plugins):
            raise TrtBridgeError(f"the {what} {path} would overwrite the --plugins file of that name; choose "
                                 "another path.")
        if path is not None:
            check_writable(path, what)
    if options.timing_cache and Path(options.timing_cache).resolve() in (output.resolve(), sidecar.resolve()):
        raise TrtBridgeError(f"the timing cache {options.timing_cache} is also the engine or its sidecar; "
                             "choose another file.")
    trt = select_module(options)
    target = engine_target(trt, options)
    model_info = {"path": str(model.resolve()), **file_digest(model),
                  "external_data": [{"path": str(p.resolve()), **file_digest(p)} for p in protected[1:]]}
    _parse_apart(trt, model, options)
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
        "profile_names": compiled.profile_names,  # '' each, but for the default profiles of a decoder
        "flags": compiled.flags,
        "plugins": compiled.plugins,  # what an engine user registers before deserializing it
        "timing_cache": compiled.timing_cache,
        "build_seconds": round(seconds, 3),
        # UTC time of the build: the one field that differs between two builds of the same inputs
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    with Outputs() as outputs:  # one unit: renamed into place together, under the folder's lock, signals held
        outputs.stage_bytes(output, compiled.engine, "engine")
        outputs.stage_bytes(sidecar, (json.dumps(info, indent=2) + "\n").encode(), "sidecar")
        outputs.commit()
    log.info("%s: engine written (%d bytes) in %.1f s", output, len(compiled.engine), seconds)
    return BuildResult(str(output), str(sidecar), info, seconds)


@dataclass
class _Compiled:
    engine: memoryview  # the builder's serialized engine (bytes-like)
    inputs: list[dict]
    outputs: list[dict]
    profiles: list[dict]
    flags: dict
    timing_cache: dict | None
    plugins: list[dict]
    memory: dict[str, int]  # the builder's memory summary (BuildLogger.memory): activation, weights, persistent
    profile_names: list[str]  # each profile's name ('' for one the user gave; prefill/decode: decoder_profiles)


def _compile(trt, path: Path, options: BuildOptions, fill_unnamed: bool = False) -> _Compiled:
    """Parse ``path`` and build it with ``options``; ``fill_unnamed``: dynamic inputs no profile names get 1s.
    Without profiles, a decoder gets the prefill and decode ones (:mod:`.decoder_profiles`); when a build with
    several profiles fails, each is built alone to name the one(s) that fail (:class:`ProfileBuildError`)."""
    external_data_files(path)  # TensorRT's parser reads it (and would follow a link, or block on a pipe)
    plugins = [record.to_dict() for record in register_for_model(trt, path, options.plugins)]
    logger = BuildLogger(trt)
    builder = trt.Builder(logger)
    strongly_typed = check_typing(trt, options)
    network = create_network(trt, builder, strongly_typed)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(path)):
        _raise_rejected(trt, path, [parser.get_error(i) for i in range(parser.num_errors)])
    inputs = network_inputs(network)
    chosen = options.profiles or decoder_profiles(inputs, window_pasts(path, inputs))
    if chosen and not options.profiles:
        log.info("%s: a decoder: building the default profiles %s", path, ", ".join(p.name for p in chosen))
    profiles = resolve_profiles(network, chosen, path, fill_unnamed or not options.profiles)
    named = [Profile(shapes, p.name) for shapes, p in zip(profiles, chosen)] if len(profiles) == len(chosen) \
        else [Profile(shapes) for shapes in profiles]
    engine, flags, timing = _engine(trt, builder, network, logger, path, options, strongly_typed, named)
    ins, outs = _tensors(trt, network, True), _tensors(trt, network, False)
    del parser, network, builder  # the parsed weights go before the engine is handed on
    # the engine's own memory, not a copy (bytes() of a 0.94 GB decoder engine held it twice)
    return _Compiled(memoryview(engine).cast("B"), ins, outs, profiles, flags, timing, plugins,
                     dict(logger.memory), [p.name for p in named])


def _engine(trt, builder, network, logger, path: Path, options: BuildOptions, strongly_typed: bool,
            profiles: list[Profile], alone: bool = False):
    """(serialized engine, flags, timing cache record) of ``network`` with ``profiles``; raises EngineBuildError.
    ``alone``: one of several profiles, built to see whether it fails (no progress bar, no timing cache)."""
    config = builder.create_builder_config()
    flags = configure(trt, config, options, strongly_typed)
    if is_rtx(trt) and options.compute_capabilities:
        ccs = list(dict.fromkeys(parse_compute_capability(trt, c)[0] for c in options.compute_capabilities))
        config.num_compute_capabilities = len(ccs)
        for i, cc in enumerate(ccs):
            config.set_compute_capability(cc, i)
    for number, named in enumerate(profiles, 1):
        profile = builder.create_optimization_profile()
        for name, (mn, opt, mx) in named.shapes.items():
            profile.set_shape(name, mn, opt, mx)
        if config.add_optimization_profile(profile) < 0:
            label = f"'{named.name}'" if named.name else str(number)
            raise TrtBridgeError(f"{path}: TensorRT rejects the optimization profile {label} ({named.text()}): "
                                 f"{'; '.join(logger.errors()[-3:]) or 'no reason given'}")
    timing_file = None if alone else options.timing_cache
    cache = load_timing_cache(trt, config, timing_file, logger)
    monitor = None
    if options.progress and not alone and hasattr(trt, "IProgressMonitor"):
        monitor = progress_monitor(trt)
        config.progress_monitor = monitor
    mark = len(logger.messages)
    try:
        engine = builder.build_serialized_network(network, config)
    finally:
        if monitor is not None:
            monitor.close()
    if monitor is not None and monitor.interrupted:
        raise KeyboardInterrupt
    problems = take_build_problems()
    if engine is None or problems:
        said = problems or logger.errors(mark)
        if len(profiles) > 1 and not alone:
            _name_failing_profiles(trt, builder, network, logger, path, options, strongly_typed, profiles, said)
        raise EngineBuildError(_build_failure(trt, path, options, said))
    timing = save_timing_cache(trt, config, timing_file, cache) if timing_file else None
    return engine, flags, timing


def _name_failing_profiles(trt, builder, network, logger, path, options, strongly_typed, profiles, said) -> None:
    """Build each of ``profiles`` alone; raise :class:`ProfileBuildError` when some build and others do not (return
    when every one fails: the model, not a shape range, is what TensorRT refuses)."""
    failing, building = [], []
    for number, profile in enumerate(profiles, 1):
        named = profile if profile.name else Profile(profile.shapes, f"profile {number}")
        try:
            _engine(trt, builder, network, logger, path, options, strongly_typed, [named], alone=True)
            building.append(named)
        except EngineBuildError as exc:
            failing.append((named, str(exc).split(" failed: ", 1)[-1]))
    if not failing and len(building) > 1:
        raise ProfilesApartError(
            f"{path}: TensorRT's builder ({trt.__name__} {trt.__version__}) builds each of the profiles "
            f"{', '.join(repr(p.name) for p in building)} alone but not together in one engine "
            f"({(said[0] if said else 'TensorRT gave no reason').splitlines()[0][:200]}); build one engine "
            "per profile (trt-bridge build with --min-shapes/--opt-shapes/--max-shapes for each).",
            [p.name for p in building])
    if not failing or not building:
        return
    names = ", ".join(f"'{p.name}' ({p.text()})" for p, _ in failing)
    raise ProfileBuildError(
        f"{path}: TensorRT's builder ({trt.__name__} {trt.__version__}) fails for the profile {names} and builds "
        f"{', '.join(repr(p.name) for p in building)}: {failing[0][1].rstrip('.')}. Give the shapes the engine must "
        "take (--shapes, or --min-shapes/--opt-shapes/--max-shapes), or change the model for that range.",
        [{"name": p.name, "shapes": p.to_dict(), "error": why} for p, why in failing], [p.name for p in building])


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


def _parse_apart(trt, path: Path, options: BuildOptions) -> None:
    """Parse ``path`` in a child process first (:func:`~trt_bridge.tensorrt.parse.parse_isolated`, about 0.2-0.4 s):
    a parser that would kill this process (TensorRT-RTX's SIGFPE on a com.microsoft RotaryEmbedding with
    num_heads 0) fails the build in one line naming the node; a model the parser rejects fails as it would in
    :func:`_compile`. The in-process parse that follows cannot crash on what the child parsed."""
    result = parse(path, trt.__name__, options.plugins, isolated=True)
    if result.crash is not None:
        raise ModelRejectedError(f"{path}: {result.errors[0]}; nothing was built (the parser ran in a child "
                                 f"process). `trt-bridge check {path}` says what to change.", result.details)
    if not result.ok:
        _raise_rejected(trt, path, result.details)


def _raise_rejected(trt, path: Path, errors) -> None:
    """Raise ModelRejectedError listing the parser's errors (one per node) as ``check`` lists its findings."""
    named = named_errors(path, errors)
    lines = "\n".join("  " + error.line() for error in named)
    raise ModelRejectedError(
        f"{path}: TensorRT's ONNX parser ({trt.__name__} {trt.__version__}) rejects the model "
        f"({len(named)} finding(s)):\n{lines}\n  `trt-bridge check {path}` says what convert does about each; "
        "`trt-bridge convert` writes the TensorRT-ready model to build instead.", named)


def _build_failure(trt, path: Path, options: BuildOptions, errors: list[str]) -> str:
    said = "; ".join(errors[-3:]) or "TensorRT gave no reason (run with -v for its log)"
    hint = ""
    if options.version_compatible and is_rtx(trt) and "lean" in said:
        hint = " TensorRT-RTX ships no lean runtime, which version-compatible engines embed: drop --version-compatible."
    elif options.workspace is not None:
        hint = " A larger --workspace may help."
    return f"{path}: TensorRT's builder ({trt.__name__} {trt.__version__}) failed: {said}.{hint}"


__all__ = ["BuildResult", "EngineBuildError", "ModelRejectedError", "ProfileBuildError", "build", "build_engine",
           "costs_or_none", "engine_costs"]
