"""Parse an ONNX model with TensorRT's parser and build an engine (ahead of time with TensorRT-RTX)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from trt_bridge.errors import TrtBridgeError
from trt_bridge.tensorrt import import_tensorrt, is_rtx

log = logging.getLogger("trt_bridge.tensorrt")


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


def _network(trt, builder):
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED") and not is_rtx(trt):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return builder.create_network(flags)


def parse(path: str | Path, module: str | None = None) -> ParseResult:
    """Run TensorRT's ONNX parser on ``path``; collect its errors instead of raising."""
    trt = import_tensorrt(module)
    logger = _Logger(trt)
    builder = trt.Builder(logger)
    network = _network(trt, builder)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(path))
    errors = [parser.get_error(i) for i in range(parser.num_errors)]
    details = [ParserError(e.node_name() or "", e.node_operator() or "", str(e.code()).rsplit(".", 1)[-1],
                           _clean(e.desc(), e.node_name() or ""), int(e.node())) for e in errors]
    return ParseResult(bool(ok), [str(e) for e in errors], network.num_layers, details, trt.__name__,
                       getattr(trt, "__version__", "?"))


def _clean(desc: str, node: str) -> str:
    """The parser's message without its 'Invalid Node' header and the CUDA-runtime noise a GPU-less
    machine appends (TensorRT-RTX probes the driver while importing some layers)."""
    lines = []
    for line in desc.splitlines():
        line = line.strip()
        if not line or line == f"Invalid Node - {node}" or "catchCudaError" in line or "cudaError" in line:
            continue
        lines.append(line)
    text = " ".join(lines)
    if text in ("", "false"):
        return "no importer for this op"
    return text


def build_engine(path: str | Path, compute_capability: str | None = "SM89", workspace: int = 1 << 30,
                 module: str | None = None, shapes: dict[str, tuple[int, ...]] | None = None) -> bytes:
    """Build a serialized engine for ``path``.

    With TensorRT-RTX the engine is built ahead of time for ``compute_capability``
    (no GPU needed); ``None`` builds for the GPU in this machine. Datacenter TensorRT
    always builds for the local GPU and ignores it. Dynamic inputs get one fixed shape:
    ``shapes[name]``, or 1 for every dynamic dimension.
    """
    trt = import_tensorrt(module)
    logger = _Logger(trt)
    builder = trt.Builder(logger)
    network = _network(trt, builder)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise TrtBridgeError(f"{path}: TensorRT's ONNX parser rejected the model: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    if is_rtx(trt) and compute_capability is not None:
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, compute_capability), 0)
    profile = None
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = tuple(tensor.shape)
        if any(d < 0 for d in shape):
            profile = profile or builder.create_optimization_profile()
            fixed = tuple((shapes or {}).get(tensor.name) or (1 if d < 0 else d for d in shape))
            profile.set_shape(tensor.name, fixed, fixed, fixed)
    if profile is not None:
        config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise TrtBridgeError(f"{path}: TensorRT failed to build an engine: {'; '.join(logger.messages[-5:])}")
    return bytes(engine)
