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


class BuildLogger:
    """A TensorRT logger that keeps errors and warnings (for error messages) and passes them to logging."""

    def __new__(cls, trt):
        class Impl(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)
                self.messages: list[tuple[int, str]] = []

            def log(self, severity, msg):
                if severity <= trt.ILogger.Severity.WARNING and not is_cuda_noise(msg):
                    self.messages.append((int(severity), msg))
                    log.info("TensorRT: %s", msg)
                elif severity == trt.ILogger.Severity.INFO:
                    log.debug("TensorRT: %s", msg)

            def errors(self, since: int = 0) -> list[str]:
                return [m for s, m in self.messages[since:] if s <= int(trt.ILogger.Severity.ERROR)]

        return Impl()
