"""The network definition TensorRT's ONNX parser fills: one place for its creation flags, shared by the parser run
in-process (:mod:`.parse`), in a child process (:mod:`.parse_child`) and the builder (:mod:`.build`)."""

from __future__ import annotations

import re

from trt_bridge.tensorrt import is_rtx


def create_network(trt, builder, strongly_typed: bool = True):
    """A network definition: strongly typed where TensorRT has the flag (TensorRT-RTX and 11 always are)."""
    flags = 0
    names = trt.NetworkDefinitionCreationFlag.__members__
    if strongly_typed and "STRONGLY_TYPED" in names and not is_rtx(trt):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    if "EXPLICIT_BATCH" in names and major_version(trt) < 10:  # TensorRT 8.x: ONNX networks need explicit batch
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    return builder.create_network(flags)


def major_version(trt) -> int:
    """TensorRT's major version (0 when its ``__version__`` says none)."""
    match = re.match(r"\d+", getattr(trt, "__version__", ""))
    return int(match.group()) if match else 0
