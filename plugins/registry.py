"""Registering plugins with TensorRT: trt-bridge's own (``DynamicInt8Gemm``) and the user's (``--plugins``).

Every command that parses a model or deserializes an engine registers the plugins first; ``build`` records
them in the engine's sidecar (:meth:`PluginRecord.to_dict`), and the commands that run an engine register
what the sidecar lists, so an engine never meets a TensorRT without its plugins.

``--plugins`` takes TensorRT plugin libraries (``.so``, loaded with the plugin registry's ``load_library``,
as trtexec's ``--staticPlugins`` and Polygraphy's ``--plugins`` do) and Python files that register their own
creators when run (``.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from trt_bridge.plugins.plugin import plugin_classes

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.dynamic_gemm import OP_TYPE, PLUGIN_NAMESPACE, PLUGIN_VERSION, file_has_plugin_nodes
from trt_bridge.tensorrt.sidecar import read_sidecar, sidecar_path
from trt_bridge.user_code import import_user_file

log = logging.getLogger("trt_bridge.plugins")

#: what a sidecar says of trt-bridge's own plugins
BUILTIN = "trt-bridge"
#: the creators registered so far, per TensorRT module (kept alive: the registry holds raw pointers)
_CREATORS: dict[str, object] = {}
_LOADED: dict[tuple[str, str], PluginRecord] = {}


class PluginFileError(TrtBridgeError):
    """A ``--plugins`` file is missing, cannot be loaded, or its code failed: the command cannot do what was asked
    (``check`` does not fall back to its static rules as it does when no TensorRT is there)."""


@dataclass(frozen=True)
class PluginRecord:
    """A plugin (or plugin file) registered with TensorRT, as the engine's sidecar records it."""

    source: str  # BUILTIN, or the resolved path of a --plugins file
    sha256: str | None = None  # of the file
    name: str | None = None  # the plugin's name, for the built-in one
    version: str | None = None
    namespace: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def register_builtin(trt: ModuleType) -> PluginRecord:
    """Register ``DynamicInt8Gemm``'s creator with ``trt``'s plugin registry (once per module)."""
    if trt.__name__ not in _CREATORS:
        rtx_parser_link(trt)
        creator = plugin_classes(trt)[1]()
        if not trt.get_plugin_registry().register_creator(creator, PLUGIN_NAMESPACE):
            raise TrtBridgeError(f"{trt.__name__} refused to register the {OP_TYPE} plugin creator (another "
                                 f"creator of that name and version in namespace '{PLUGIN_NAMESPACE}'?).")
        _CREATORS[trt.__name__] = creator
    return PluginRecord(BUILTIN, name=OP_TYPE, version=PLUGIN_VERSION, namespace=PLUGIN_NAMESPACE)


def register_for_model(trt: ModuleType, model, files=()) -> list[PluginRecord]:
    """Register what parsing ``model`` needs: the built-in plugin when it has DynamicInt8Gemm nodes, and the
    ``--plugins`` ``files``."""
    records = [register_builtin(trt)] if file_has_plugin_nodes(model) else []
    return records + load_plugin_files(trt, files)


def register_for_engine(trt: ModuleType, engine, files=()) -> list[PluginRecord]:
    """Register what deserializing ``engine`` needs: the plugins its sidecar lists (when it has one), and the
    ``--plugins`` ``files``."""
    recorded = read_sidecar(engine).get("plugins", []) if sidecar_path(engine).is_file() else []
    return sidecar_plugins(trt, recorded, files)


def plugin_problem(trt: ModuleType | None) -> str | None:
    """Why engines with DynamicInt8Gemm nodes cannot be built or run here (None: they can)."""
    if trt is None:
        return "TensorRT is not installed (pip install 'trt-bridge[rtx]', or datacenter TensorRT: 'trt-bridge[trt]')"
    if not hasattr(trt, "IPluginV3"):
        return f"{trt.__name__} {getattr(trt, '__version__', '?')} has no IPluginV3 plugins (TensorRT 10.0 or newer)"
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - missing module or library: either way the kernels cannot compile
        return f"NVRTC cannot compile the plugin's kernels ({exc}): pip install 'trt-bridge[plugins]'"
    return None


def load_plugin_files(trt: ModuleType, paths) -> list[PluginRecord]:
    """Load each ``--plugins`` file into ``trt``'s plugin registry (once per module and file)."""
    records = []
    if paths:
        rtx_parser_link(trt)  # any plugin node needs it, the user's too
    for given in paths:
        path = Path(given)
        if not path.is_file():
            raise PluginFileError(f"--plugins {given}: no such file. Give the path of a TensorRT plugin library "
                                 "(.so) or of a Python file that registers plugin creators (.py).")
        key = (trt.__name__, str(path.resolve()))
        if key not in _LOADED:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if path.suffix == ".py":
                _run_python_plugins(path)
            elif trt.get_plugin_registry().load_library(str(path)) is None:
                raise PluginFileError(f"--plugins {given}: {trt.__name__} could not load it as a plugin library "
                                     "(built for another TensorRT or CUDA? run with -v for TensorRT's log).")
            _LOADED[key] = PluginRecord(str(path.resolve()), digest)
        records.append(_LOADED[key])
    return records


def _run_python_plugins(path: Path) -> None:
    """Run a ``--plugins`` Python file (the user's code: ``sys.exit`` or any exception it raises is one error)."""
    import_user_file(path, f"trt_bridge_user_plugins_{len(_LOADED)}", f"--plugins {path}", PluginFileError,
                     "; a plugin file must only register its plugin creators")


def sidecar_plugins(trt: ModuleType, recorded: list[dict], extra=()) -> list[PluginRecord]:
    """Register what an engine's sidecar lists (the built-in plugin; files still present with the same bytes)
    and the ``extra`` --plugins files given now."""
    records = [register_builtin(trt)] if any(r.get("source") == BUILTIN for r in recorded) else []
    given = {str(Path(p).resolve()) for p in extra}
    for r in recorded:
        source = r.get("source")
        if source in (None, BUILTIN) or source in given:
            continue
        path = Path(source)
        if not path.is_file():
            raise TrtBridgeError(f"the engine was built with the plugin file {source}, which is gone: pass its "
                                 "new path with --plugins.")
        if r.get("sha256") and hashlib.sha256(path.read_bytes()).hexdigest() != r["sha256"]:
            raise TrtBridgeError(f"the plugin file {source} changed since the engine was built; rebuild the "
                                 "engine, or pass the file it was built with via --plugins.")
        given.add(source)
    return records + load_plugin_files(trt, sorted(given))


def rtx_parser_link(trt: ModuleType) -> Path | None:
    """Make TensorRT-RTX's ONNX parser able to import plugin nodes; return the link made (None: none needed).

    The parser loads ``libtensorrt_rtx.so`` by that unversioned name when it imports a plugin node, and
    throws out of a noexcept function (the process aborts: "terminate called without an active exception")
    when it cannot; the tensorrt-rtx wheels ship ``libtensorrt_rtx.so.1`` only. The parser searches its own
    folder ($ORIGIN) first, so a link there named ``libtensorrt_rtx.so`` is what the wheel lacks.
    """
    if not trt.__name__.startswith("tensorrt_rtx"):
        return None
    folder = _rtx_library_folder()
    if folder is None or (folder / "libtensorrt_rtx.so").exists():
        return None
    versioned = sorted(folder.glob("libtensorrt_rtx.so.*"))
    if not versioned:
        return None
    link = folder / "libtensorrt_rtx.so"
    temporary = folder / f".libtensorrt_rtx.so.{os.getpid()}"
    try:
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(versioned[0].name)
        os.replace(temporary, link)
    except OSError as exc:
        raise TrtBridgeError(
            f"TensorRT-RTX's ONNX parser needs {link} (a link to {versioned[0].name}, which its wheel lacks) to "
            f"import plugin nodes, and it cannot be made ({exc.strerror}): run `ln -s {versioned[0].name} {link}` "
            "as the owner of that folder.") from exc
    log.info("made %s -> %s (TensorRT-RTX's parser loads it to import plugin nodes)", link, versioned[0].name)
    return link


def _rtx_library_folder() -> Path | None:
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
