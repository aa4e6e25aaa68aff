"""TensorRT's ONNX parser, run for what it says: :func:`parse` collects its errors (:class:`ParserError`, the
node each names) in a :class:`ParseResult` instead of raising; :func:`named_errors` names the nodes the parser
gives by position only. ``trt-bridge check`` turns these into its findings; ``trt-bridge build`` into the
message of the model it cannot build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from trt_bridge.ir.tensorrt_ops import NO_IMPORTER
from trt_bridge.plugins.registry import register_for_model
from trt_bridge.tensorrt import import_tensorrt, is_rtx
from trt_bridge.tensorrt.logger import Logger, is_cuda_noise


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
        """``code: message``, as ``trt-bridge check`` quotes the parser."""
        return f"{self.code}: {self.message}"

    @property
    def rule(self) -> str:
        """The ``trt-bridge check`` rule it falls under: 'no-importer' for the ops convert lifts, else
        'tensorrt-parser'."""
        return "no-importer" if self.op in NO_IMPORTER else "tensorrt-parser"

    def line(self) -> str:
        """``[rule] Op 'node': code: message``: the first line of ``check``'s finding for it."""
        where = f"{self.op} '{self.node}'" if self.node else "model"
        return f"[{self.rule}] {where}: {self.text}"


@dataclass
class ParseResult:
    """What the parser made of a model: whether it parsed, its errors (as text and as :class:`ParserError`),
    the network's layers, and which TensorRT parsed it."""

    ok: bool
    errors: list[str] = field(default_factory=list)
    layers: int = 0
    details: list[ParserError] = field(default_factory=list)
    module: str = ""
    version: str = ""

    def __bool__(self) -> bool:
        return self.ok


def create_network(trt, builder, strongly_typed: bool = True):
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


def parse(path: str | Path, module: str | None = None, plugins: tuple[str, ...] = ()) -> ParseResult:
    """Run TensorRT's ONNX parser on ``path`` (trt-bridge's plugins registered where its nodes need them, and the
    ``plugins`` files); collect its errors instead of raising."""
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
    """The parser's error objects as :class:`ParserError`."""
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


def named_errors(path: Path, errors) -> list[ParserError]:
    """:func:`parser_errors` with the name and op of each node the parser gives by position only."""
    names = _node_names(path)
    named = []
    for error in parser_errors(errors):
        if not error.node and 0 <= error.index < len(names):
            error = replace(error, node=names[error.index][0], op=error.op or names[error.index][1])
        named.append(error)
    return named
