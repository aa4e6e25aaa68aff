"""The exception hierarchy.

``TrtBridgeError`` and its subclasses are problems with the user's input: the CLI
prints their message (which says what, where and how to fix) and exits 2.
``InternalError`` is a bug in trt-bridge and keeps its traceback.
"""


class TrtBridgeError(Exception):
    """A user-facing problem; the message names the file/node/tensor and the fix."""


class ModelLoadError(TrtBridgeError):
    """The model file (or its external data) cannot be read or is not valid ONNX."""


class CalibrationDataError(TrtBridgeError):
    """Calibration feeds are missing, malformed or do not match the model's inputs."""


class UnsupportedPatternError(TrtBridgeError):
    """The model contains a construct that trt-bridge cannot rewrite for TensorRT."""


class MissingDependencyError(TrtBridgeError):
    """An optional dependency needed by this command is not installed."""


class OptionError(TrtBridgeError):
    """A bad command-line flag or Python API keyword, or a bad value for one: the message is the one the CLI prints
    after ``trt-bridge COMMAND: error:``."""


class UnknownOptionError(OptionError, TypeError):
    """A keyword that names no option of the Python API function it was given to (the message lists the valid
    ones)."""


class InternalError(Exception):
    """A bug in trt-bridge (an invariant did not hold). Please report it."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like KeyboardInterrupt, so temporary folders and files are removed and no
    output is committed. ``signum``: the signal (the CLI exits 128 + it: 143, 129)."""

    def __init__(self, signum: int = 15, name: str = "SIGTERM"):
        super().__init__(name)
        self.signum, self.name = signum, name
