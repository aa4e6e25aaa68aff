"""TensorRT loggers: :class:`Logger` keeps what the parser, builder or runtime says (for error messages);
:class:`BuildLogger` also passes it on to ``logging``. Both are made for the TensorRT module given (``tensorrt``
or ``tensorrt_rtx``), whose ``ILogger`` they subclass when constructed."""

from __future__ import annotations

import logging

log = logging.getLogger("trt_bridge.tensorrt")


def is_cuda_noise(message: str) -> bool:
    """CUDA-runtime complaints of TensorRT-RTX on a machine without a GPU driver, unrelated to the model."""
    return "catchCudaError" in message or "cudaError" in message or "Thread context has not been set" in message


class Logger:
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


#: the builder's memory summary lines ("Total Activation Memory: 8219136 bytes") → the key :class:`BuildLogger` keeps
MEMORY_LINES = {"Total Activation Memory": "activation_bytes", "Total Weights Memory": "weights_bytes",
                "Total Device Persistent Memory": "persistent_bytes"}


def memory_line(msg: str) -> tuple[str, int] | None:
    """(key, bytes) of one of the builder's memory summary lines, else None."""
    head, _, rest = msg.partition(":")
    key = MEMORY_LINES.get(head.strip())
    words = rest.split()
    if key is None or len(words) != 2 or words[1] != "bytes" or not words[0].isdigit():
        return None
    return key, int(words[0])


class BuildLogger:
    """A TensorRT logger that keeps errors and warnings (for error messages) and the builder's memory summary (its
    ``memory``: activation, weights and persistent device bytes), and passes them to logging."""

    def __new__(cls, trt):
        class Impl(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)
                self.messages: list[tuple[int, str]] = []
                self.memory: dict[str, int] = {}

            def log(self, severity, msg):
                if severity <= trt.ILogger.Severity.WARNING and not is_cuda_noise(msg):
                    self.messages.append((int(severity), msg))
                    log.info("TensorRT: %s", msg)
                elif severity == trt.ILogger.Severity.INFO:
                    found = memory_line(msg)
                    if found is not None:
                        self.memory[found[0]] = found[1]
                    log.debug("TensorRT: %s", msg)

            def errors(self, since: int = 0) -> list[str]:
                return [m for s, m in self.messages[since:] if s <= int(trt.ILogger.Severity.ERROR)]

        return Impl()
