"""TensorRT's ONNX parser, run for what it says: :func:`parse` collects its errors (:class:`ParserError`, the
node each names) in a :class:`ParseResult` instead of raising; :func:`named_errors` names the nodes the parser
gives by position only. ``trt-bridge check`` turns these into its findings; ``trt-bridge build`` into the
message of the model it cannot build.

``parse(..., isolated=True)`` (what ``check``, ``build`` and convert's own check run) parses in a child process
(:mod:`.parse_child`): a parser that kills its process (a signal: TensorRT-RTX 1.7.1's SIGFPE on a com.microsoft
``RotaryEmbedding`` with ``num_heads=0``) becomes a :class:`ParserCrash` in the result, naming the node from the
parser's own verbose "Parsing node: NAME [OP]" lines, which the child writes to a file as the parser reaches each
node (the last one is the node it died on: one run, no bisection). The child costs about 0.4 s beyond the parse
(a Python start-up and TensorRT's import; 2-3 s more where plugins must be registered first, which imports onnx).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from trt_bridge.errors import MissingDependencyError
from trt_bridge.ir.dynamic_gemm import file_has_plugin_nodes
from trt_bridge.ir.files import external_data_files
from trt_bridge.ir.tensorrt_ops import NO_IMPORTER
from trt_bridge.plugins.registry import PluginFileError, register_for_model
from trt_bridge.tensorrt import import_tensorrt
from trt_bridge.tensorrt.logger import Logger, is_cuda_noise
from trt_bridge.tensorrt.network import create_network

#: the code of the :class:`ParserError` that stands for a crash of the parser (no code of TensorRT's own)
CRASH = "CRASH"


@dataclass(frozen=True)
class ParserError:
    """One error of TensorRT's ONNX parser, with the node it names ('' when none)."""

    node: str
    op: str
    code: str  # 'UNSUPPORTED_NODE', 'INVALID_NODE', ...
    message: str  # the parser's description, cleaned of unrelated runtime noise
    index: int = -1  # the node's position in the graph (-1: none)

    @property
    def text(self) -> str:
        """``code: message``, as ``trt-bridge check`` quotes the parser (a crash: its message alone)."""
        return self.message if self.code == CRASH else f"{self.code}: {self.message}"

    @property
    def rule(self) -> str:
        """The ``trt-bridge check`` rule it falls under: 'tensorrt-crash' for a parser that died, 'no-importer' for
        the ops convert lifts, else 'tensorrt-parser'."""
        if self.code == CRASH:
            return "tensorrt-crash"
        return "no-importer" if self.op in NO_IMPORTER else "tensorrt-parser"

    def line(self) -> str:
        """``[rule] Op 'node': code: message``: the first line of ``check``'s finding for it."""
        where = f"{self.op} '{self.node}'" if self.node else "model"
        return f"[{self.rule}] {where}: {self.text}"


@dataclass(frozen=True)
class ParserCrash:
    """The parser's process died: by ``signal`` (its number; 0 for an exit without a result, ``status``), on the
    node it was at (its name and op, '' when it died before reaching one)."""

    signal: int
    node: str
    op: str
    status: int = 0  # the child's exit status when no signal killed it

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    def message(self, module: str = "") -> str:
        """"TensorRT's parser crashed on node 'X' (signal 8, SIGFPE)", as check's finding and build's error say."""
        who = f"TensorRT's parser ({module})" if module else "TensorRT's parser"
        where = (f" on {self.op + ' ' if self.op else ''}node '{self.node}'" if self.node
                 else " before it reached a node")
        how = f"signal {self.signal}, {self.signal_name}" if self.signal else f"exit status {self.status}"
        return f"{who} crashed{where} ({how}): its process died"


@dataclass
class ParseResult:
    """What the parser made of a model: whether it parsed, its errors (as text and as :class:`ParserError`),
    the network's layers, which TensorRT parsed it, and :class:`ParserCrash` when its process died (``isolated``
    parses only; ``details`` then holds one error of code ``CRASH`` for the node)."""

    ok: bool
    errors: list[str] = field(default_factory=list)
    layers: int = 0
    details: list[ParserError] = field(default_factory=list)
    module: str = ""
    version: str = ""
    crash: ParserCrash | None = None

    def __bool__(self) -> bool:
        return self.ok


def parse(path: str | Path, module: str | None = None, plugins: tuple[str, ...] = (),
          isolated: bool = False) -> ParseResult:
    """Run TensorRT's ONNX parser on ``path`` (trt-bridge's plugins registered where its nodes need them, and the
    ``plugins`` files); collect its errors instead of raising. ``isolated``: in a child process, where a crash
    becomes the result's ``crash`` (:func:`parse_isolated`)."""
    if isolated:
        return parse_isolated(path, module, plugins)
    external_data_files(path)  # the parser reads the external data itself: links, pipes and devices refused first
    trt = import_tensorrt(module)
    register_for_model(trt, path, plugins)
    logger = Logger(trt)
    builder = trt.Builder(logger)
    network = create_network(trt, builder)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(path))
    errors = [parser.get_error(i) for i in range(parser.num_errors)]
    return ParseResult(bool(ok), [str(e) for e in errors], network.num_layers, parser_errors(errors), trt.__name__,
                       getattr(trt, "__version__", "?"))


def parser_errors(errors) -> list[ParserError]:
    """The parser's error objects (or the child's records of them, dicts; or ParserErrors, kept) as
    :class:`ParserError`."""
    out = []
    for e in errors:
        if isinstance(e, ParserError):  # already read (an isolated parse's)
            out.append(e)
            continue
        if isinstance(e, dict):
            out.append(ParserError(e["node_name"], e["node_operator"], e["code"], _clean(e["desc"], e["node_name"]),
                                   e["node"]))
            continue
        node = _call(e, "node_name")
        out.append(ParserError(node, _call(e, "node_operator"), str(e.code()).rsplit(".", 1)[-1],
                               _clean(e.desc(), node), int(e.node())))
    return out


def parse_isolated(path: str | Path, module: str | None = None, plugins: tuple[str, ...] = ()) -> ParseResult:
    """:func:`parse` in a child process (:mod:`.parse_child`): the same result, or, when the child dies, one whose
    ``crash`` names the node the parser was at. Raises MissingDependencyError and PluginFileError as :func:`parse`
    does; another error of the child comes back as a TrtBridgeError-free RuntimeError (check logs it and goes on
    with its static rules, as for an in-process failure)."""
    path = Path(path).resolve()
    external_data_files(path)  # the child's parser reads the external data: links, pipes and devices refused first
    plugins = tuple(str(Path(p).resolve()) for p in plugins)
    entry = "trt_bridge.tensorrt.parse_child"
    if plugins or file_has_plugin_nodes(path):
        entry += "_plugins"
    with tempfile.TemporaryDirectory(prefix="trt-bridge-parse-") as tmp:
        progress, result = Path(tmp) / "progress.tsv", Path(tmp) / "result.json"
        progress.touch()
        request = {"path": str(path), "module": module, "plugins": list(plugins), "progress": str(progress),
                   "result": str(result)}
        child = subprocess.run([sys.executable, "-m", entry, json.dumps(request)], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, errors="replace")
        lines = progress.read_text(encoding="utf-8", errors="replace").splitlines()
        answer = json.loads(result.read_text(encoding="utf-8")) if result.is_file() else None
    head = lines[0].split("\t") if lines else []
    trt_module, version = (head + ["", ""])[:2]
    if answer is None:
        return _crashed(path, child, lines[1:], trt_module, version)
    if "exception" in answer:
        kind = {"MissingDependencyError": MissingDependencyError, "PluginFileError": PluginFileError}.get(
            answer["exception"], RuntimeError)
        raise kind(answer["message"] if kind is not RuntimeError else f"{answer['exception']}: {answer['message']}")
    return ParseResult(answer["ok"], [e["text"] for e in answer["errors"]], answer["layers"],
                       parser_errors(answer["errors"]), answer["module"], answer["version"])


def _crashed(path: Path, child: subprocess.CompletedProcess, progress: list[str], module: str,
             version: str) -> ParseResult:
    """The result of a child that died without writing its result: the node of the last progress line."""
    _, node, op = (progress[-1].split("\t") + ["", "", ""])[:3] if progress else ("", "", "")
    index, named = _node_index(path, node)
    crash = ParserCrash(-child.returncode if child.returncode < 0 else 0, node, op,
                        child.returncode if child.returncode >= 0 else 0)
    message = crash.message(f"{module} {version}".strip())
    if not crash.signal:
        said = [line for line in child.stderr.strip().splitlines() if line.strip()]
        message += f" ({said[-1].strip()[:300]})" if said else ""
    # an unnamed node (the parser calls it node_of_<its first output>) is left for the caller to name by its index
    error = ParserError(node if named else "", op, CRASH, message, index)
    return ParseResult(False, [message], 0, [error], module, version, crash)


def _call(error, method: str) -> str:
    """``error.method()`` or '' (TensorRT 8.6's ParserError has no node_name/node_operator)."""
    return (getattr(error, method, None) or (lambda: ""))() or ""


def _clean(desc: str, node: str) -> str:
    """The parser's message without its 'Invalid Node' header and the CUDA-runtime noise a GPU-less
    machine appends (TensorRT-RTX probes the driver while importing some layers)."""
    lines = []
    for line in desc.splitlines():
        line = line.strip()
        if not line or line == f"Invalid Node - {node}" or is_cuda_noise(line):
            continue
        lines.append(line)
    text = " ".join(lines)
    if text in ("", "false"):
        return "no importer for this op"
    return text


def _node_names(path: Path) -> list[tuple[str, str]]:
    """(name, op) of each node by index: the parser names a node by its position when it has no name."""
    try:
        import onnx

        return [(n.name, n.op_type) for n in onnx.load(str(path), load_external_data=False).graph.node]
    except Exception:  # noqa: BLE001 - not even onnx can read it: the parser's own words must do
        return []


def _node_index(path: Path, node: str) -> tuple[int, bool]:
    """The index of the node the parser calls ``node`` (-1: none), and whether the model names it so (the parser
    calls an unnamed node ``node_of_<its first output>``)."""
    if not node:
        return -1, False
    try:
        import onnx

        nodes = onnx.load(str(path), load_external_data=False).graph.node
    except Exception:  # noqa: BLE001 - not even onnx can read it: the parser's name must do
        return -1, True
    for i, n in enumerate(nodes):
        if n.name == node:
            return i, True
    for i, n in enumerate(nodes):
        if not n.name and n.output and f"node_of_{n.output[0]}" == node:
            return i, False
    return -1, True


def named_errors(path: Path, errors) -> list[ParserError]:
    """:func:`parser_errors` with the name and op of each node the parser gives by position only."""
    names = _node_names(path)
    named = []
    for error in parser_errors(errors):
        if not error.node and 0 <= error.index < len(names):
            error = replace(error, node=names[error.index][0], op=error.op or names[error.index][1])
        named.append(error)
    return named
