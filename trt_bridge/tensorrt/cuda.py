"""Checked calls into the CUDA runtime of cuda-python, and the GPU probe that building and running engines need.

cuda-python's runtime functions return ``(error, *values)``; :func:`call` raises
:class:`CudaError` with the function, CUDA's error name and what it was doing, and
returns the values.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from trt_bridge.errors import MissingDependencyError, TrtBridgeError

INSTALL_HINT = "pip install 'trt-bridge[cuda]' (cuda-python; pick the release matching the driver's CUDA version)"


class CudaError(TrtBridgeError):
    """A CUDA runtime call failed."""


def runtime() -> ModuleType:
    """cuda-python's CUDA runtime module (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6
        except ImportError as exc:
            raise MissingDependencyError(f"running TensorRT engines needs cuda-python: {INSTALL_HINT}.") from exc
    return cudart


def error_text(cudart: ModuleType, err) -> str:
    try:
        name = cudart.cudaGetErrorName(err)[1].decode()
        text = cudart.cudaGetErrorString(err)[1].decode()
        return f"{name}: {text}"
    except Exception:  # an error code this cuda-python cannot describe
        return str(err)


def call(cudart: ModuleType, fn_name: str, *args, what: str):
    """``cudart.<fn_name>(*args)``; raise CudaError naming ``what`` on failure; return the value(s)."""
    result = getattr(cudart, fn_name)(*args)
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if int(err) != 0:
        raise CudaError(f"{what}: {fn_name} failed ({error_text(cudart, err)}).")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def gpu_problem() -> str | None:
    """Why engines cannot run here (None: a GPU is usable). Raises MissingDependencyError when a GPU
    driver is present but cuda-python is not installed."""
    driver = Path("/dev/nvidiactl").exists()
    try:
        cudart = runtime()
    except MissingDependencyError:
        if driver:
            raise
        return "no NVIDIA GPU is present on this machine (and cuda-python is not installed)"
    err, count = cudart.cudaGetDeviceCount()
    if int(err) == 0 and count > 0:
        return None
    if not driver:
        return "no NVIDIA GPU is present on this machine"
    if int(err) == 0:
        return "the CUDA runtime sees no GPU (check CUDA_VISIBLE_DEVICES)"
    return (f"the CUDA runtime cannot use the GPU ({error_text(cudart, err)}); when the driver is older than "
            f"cuda-python's CUDA, {INSTALL_HINT}")


def gpu_name() -> str | None:
    """The name of GPU 0, when cuda-python is installed and a GPU is usable."""
    try:
        cudart = runtime()
        err, count = cudart.cudaGetDeviceCount()
        if int(err) != 0 or count < 1:
            return None
        props = call(cudart, "cudaGetDeviceProperties", 0, what="reading the GPU's name")
    except TrtBridgeError:
        return None
    return device_name(props)


def device_name(props) -> str:
    """The name in a ``cudaDeviceProp`` (bytes, NUL-padded, in some cuda-python releases)."""
    name = props.name
    return (name.decode(errors="replace") if isinstance(name, bytes) else str(name)).rstrip("\x00").strip()
