"""The dynamically quantized INT8 GEMM's CUDA kernels (``dynamic_gemm.cu``): NVRTC compilation, the host-side
weight packing, the workspace layout and the launches.

The computation (bit-exact with :func:`trt_bridge.plugins.reference.dynamic_gemm`)::

    x [M, K] float32/float16 ─▶ quantize (per tensor: min/max, scale, zero point on the device; per token: per row)
        ─▶ int8 codes + row sums (+ row scales) in the workspace
        ─▶ int8 GEMM against the packed weight (tensor cores on sm_80+, dp4a before)
        ─▶ epilogue: zero-point corrections (mod 2^32), float32 scale, bias ─▶ y [M, N] in x's dtype

:class:`GemmKernels` works in the CUDA context current on the calling thread (TensorRT's, inside a plugin's
enqueue); standalone, it makes device 0's primary context current. :meth:`GemmKernels.run` only enqueues.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.tensorrt.cuda import CudaError

ARCHITECTURES = (75, 80, 86, 89, 90, 100, 120)
GRANULARITIES = ("tensor", "token")
GEMMS = ("auto", "mma", "dp4a")
TARGETS = ("cubin", "ptx")
INSTALL_HINT = "pip install 'trt-bridge[plugins]'"
SOURCE = Path(__file__).with_name("dynamic_gemm.cu")
MAX_K = (2**31 - 1) // (255 * 255)  # 33025: the largest K whose worst-case accumulator fits int32
K_ALIGN = 64  # the kernels' K tile: K is zero-padded to a multiple of this
ALIGN = 256  # every workspace piece and weight array starts on this boundary
MINMAX_BLOCKS = 1024  # at most this many per-block partial min/max pairs
MINMAX_THREADS = 256
QUANT_ROWS = 8  # rows per quantize block (one warp each)
MMA_STAGES, MMA_ROW_BYTES = 3, K_ALIGN + 16
MMA_TILES = {"dq_gemm_mma_128x128": (128, 128, 256), "dq_gemm_mma_64x64": (64, 64, 128)}  # BM, BN, threads
FUNCTIONS = ("dq_minmax_partial", "dq_tensor_params", "dq_quantize_tensor", "dq_quantize_token", "dq_gemm_dp4a",
             *MMA_TILES)
OPTIONS = ("-std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")


class KernelCompileError(TrtBridgeError):
    """NVRTC could not compile the plugin's CUDA source."""


def source() -> str:
    """The CUDA source of the kernels."""
    return SOURCE.read_text(encoding="utf-8")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def nvrtc_module():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise MissingDependencyError(f"compiling the plugin's CUDA kernels needs NVRTC and cuda-python: "
                                     f"{INSTALL_HINT}.") from exc
    return nvrtc


def driver_module():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise MissingDependencyError(f"running the plugin's CUDA kernels needs cuda-python: {INSTALL_HINT}.") from exc
    return driver


def supported_architectures() -> tuple[int, ...]:
    """The compute capabilities (as 89 for 8.9) this NVRTC compiles for."""
    nvrtc = nvrtc_module()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    return tuple(int(a) for a in archs) if int(err) == 0 else ARCHITECTURES


@functools.cache
def compile_with_log(arch: int, target: str = "cubin", verbose: bool = False) -> tuple[bytes, str]:
    """(the compiled image, NVRTC's log); ``verbose`` asks ptxas for register and memory use in the log."""
    if target not in TARGETS:
        raise TrtBridgeError(f"unknown compile target {target!r}; use one of {', '.join(TARGETS)}.")
    nvrtc = nvrtc_module()
    err, prog = nvrtc.nvrtcCreateProgram(source().encode(), SOURCE.name.encode(), 0, [], [])
    if int(err) != 0:
        raise KernelCompileError(f"NVRTC could not create the program for {SOURCE.name}: {err!r}.")
    try:
        kind = "sm" if target == "cubin" else "compute"
        options = [f"--gpu-architecture={kind}_{arch}", *OPTIONS, *(["-Xptxas=-v"] if verbose else [])]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.rstrip(b"\x00 ").decode(errors="replace").strip()
        if int(err) != 0:
            supported = " ".join(str(a) for a in supported_architectures())
            detail = " | ".join(line.strip() for line in log_text.splitlines() if line.strip())[:2000]
            raise KernelCompileError(f"NVRTC could not compile {SOURCE.name} for {kind}_{arch} ({detail or err!r}); "
                                     f"this NVRTC builds for {supported}: install a matching nvidia-cuda-nvrtc.")
        get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if target == "cubin"
                         else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
        _, size = get_size(prog)
        image = b" " * size
        (err,) = get(prog, image)
        if int(err) != 0:
            raise KernelCompileError(f"NVRTC compiled {SOURCE.name} for {kind}_{arch} but returned no {target}.")
        return image, log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_kernels(arch: int, target: str = "cubin") -> bytes:
    """The kernels compiled by NVRTC for compute capability ``arch`` (89 for 8.9): a cubin or PTX text."""
    return compile_with_log(int(arch), target)[0]


@dataclass(frozen=True)
class PackedWeights:
    """The weight as the kernels read it: ``weight_nk`` int8 [N, Kp] (transposed, K zero-padded to a multiple of
    64), ``zero_point`` int32 [N], ``col_sums`` int32 [N] (sum over k of weight[k, n]) and ``col_correction``
    int32 [N] = col_sums - K * zero_point."""

    weight_nk: np.ndarray
    zero_point: np.ndarray
    col_sums: np.ndarray
    col_correction: np.ndarray
    k: int
    n: int

    @property
    def k_padded(self) -> int:
        return self.weight_nk.shape[1]


def pack_weights(weight_kn: np.ndarray, zero_point: np.ndarray) -> PackedWeights:
    """Pack an ONNX-layout int8 weight [K, N] and its int32 zero points [N] for the kernels."""
    weight_kn = np.asarray(weight_kn)
    if weight_kn.dtype != np.int8 or weight_kn.ndim != 2 or 0 in weight_kn.shape:
        raise TrtBridgeError(f"the GEMM weight must be a non-empty int8 [K, N] array, not {weight_kn.dtype} "
                             f"{list(weight_kn.shape)}.")
    k, n = weight_kn.shape
    zp = np.asarray(zero_point)
    if zp.shape != (n,) or not np.issubdtype(zp.dtype, np.integer) or zp.min() < -128 or zp.max() > 127:
        raise TrtBridgeError(f"the weight zero point must be {n} integers in [-128, 127] (one per output column), "
                             f"not {zp.dtype} {list(zp.shape)}.")
    packed = np.zeros((n, round_up(k, K_ALIGN)), np.int8)
    packed[:, :k] = weight_kn.T
    col_sums = weight_kn.astype(np.int64).sum(axis=0)
    correction = col_sums - k * zp.astype(np.int64)
    if k > MAX_K:
        raise TrtBridgeError(f"K = {k} is too large for the INT8 GEMM plugin's 32-bit accumulators (at most "
                             f"{MAX_K}: 255 * 255 * K must fit int32); split the MatMul along K.")
    return PackedWeights(packed, zp.astype(np.int32), col_sums.astype(np.int32), correction.astype(np.int32), k, n)


def workspace_layout(rows: int, k: int, granularity: str) -> dict[str, int]:
    """Byte offsets of the workspace's pieces (and ``"size"``, the total), each 256-byte aligned."""
    if granularity not in GRANULARITIES:
        raise TrtBridgeError(f"unknown quantization granularity {granularity!r}; use 'tensor' or 'token'.")
    sizes = {"q": rows * round_up(k, K_ALIGN), "rowsum": 4 * rows}
    if granularity == "token":
        sizes["rowscale"] = 4 * rows
    else:
        sizes["partials"] = 8 * MINMAX_BLOCKS
        sizes["params"] = 16
    layout, offset = {}, 0
    for name, size in sizes.items():
        layout[name] = offset
        offset += round_up(max(size, 1), ALIGN)
    layout["size"] = offset
    return layout


def workspace_size(rows: int, k: int, granularity: str) -> int:
    """Bytes of device workspace :meth:`GemmKernels.run` needs for up to ``rows`` rows of ``k`` values."""
    return workspace_layout(rows, k, granularity)["size"]


def check(driver, result, what: str):
    """A driver call's values, or CudaError naming ``what`` and CUDA's error."""
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if int(err) != 0:
        name = driver.cuGetErrorName(err)
        text = name[1].decode() if int(name[0]) == 0 else str(err)
        raise CudaError(f"{what} failed ({text}).")
    return values[0] if len(values) == 1 else values


def as_int(handle) -> int:
    return int(handle) if handle is not None else 0


class DeviceWeights:
    """The packed weight, zero points, column corrections, scale and bias in one device allocation."""

    def __init__(self, driver, packed: PackedWeights, scale: np.ndarray, bias: np.ndarray | None):
        self.k, self.n, self.k_padded = packed.k, packed.n, packed.k_padded
        self.has_bias = bias is not None
        arrays = {"weight": packed.weight_nk, "zero_point": packed.zero_point,
                  "col_correction": packed.col_correction, "scale": scale}
        if bias is not None:
            arrays["bias"] = bias
        offsets, total = {}, 0
        for name, array in arrays.items():
            offsets[name] = total
            total += round_up(array.nbytes, ALIGN)
        self.driver = driver
        self.base = as_int(check(driver, driver.cuMemAlloc(total), f"allocating {total} bytes for the GEMM weights"))
        self.nbytes = total
        try:
            for name, array in arrays.items():
                data = np.ascontiguousarray(array)
                check(driver, driver.cuMemcpyHtoD(self.base + offsets[name], data, data.nbytes),
                      f"copying the GEMM {name} to the device")
        except CudaError:
            self.close()
            raise
        self.ptr = {name: self.base + offset for name, offset in offsets.items()}
        self.ptr.setdefault("bias", 0)

    def close(self) -> None:
        if self.base:
            base, self.base = self.base, 0
            check(self.driver, self.driver.cuMemFree(base), "freeing the GEMM weights")

    def __enter__(self) -> DeviceWeights:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_modules: dict[tuple[int, int], tuple[object, dict[str, object]]] = {}
_lock = threading.Lock()


def device_image(arch: int) -> bytes:
    """A cubin for ``arch`` if this NVRTC builds for it, else PTX for the newest architecture below it."""
    supported = supported_architectures()
    if arch in supported:
        return compile_kernels(arch, "cubin")
    older = [a for a in supported if a <= arch]
    if not older:
        raise KernelCompileError(f"this NVRTC cannot compile for compute capability {arch // 10}.{arch % 10}; "
                                 f"install a newer nvidia-cuda-nvrtc ({INSTALL_HINT}).")
    return compile_kernels(max(older), "ptx") + b"\x00"


class GemmKernels:
    """The kernels loaded for the current device. ``gemm``: 'auto' (tensor cores on sm_80+), 'mma' or 'dp4a';
    ``path`` is the GEMM it runs, ``arch`` the compute capability (89 for 8.9), ``sms`` the multiprocessor count."""

    def __init__(self, gemm: str = "auto"):
        if gemm not in GEMMS:
            raise TrtBridgeError(f"unknown GEMM kernel {gemm!r}; use one of {', '.join(GEMMS)}.")
        driver = self.driver = driver_module()
        try:
            result = driver.cuInit(0)
        except Exception as exc:  # cuda-python finds no libcuda: no NVIDIA driver here
            raise CudaError(f"the GEMM kernels need an NVIDIA GPU and its driver: {exc}") from exc
        check(driver, result, "initialising CUDA")
        context = check(driver, driver.cuCtxGetCurrent(), "reading the current CUDA context")
        if not as_int(context):  # standalone: device 0's primary context, retained for good as the runtime does
            device = check(driver, driver.cuDeviceGet(0), "opening GPU 0")
            context = check(driver, driver.cuDevicePrimaryCtxRetain(device), "retaining GPU 0's primary context")
            check(driver, driver.cuCtxSetCurrent(context), "making GPU 0's primary context current")
        device = check(driver, driver.cuCtxGetDevice(), "reading the current device")
        attribute = driver.CUdevice_attribute
        major = check(driver, driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                                          device), "reading the compute capability")
        minor = check(driver, driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                                          device), "reading the compute capability")
        self.sms = check(driver, driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                                             device), "reading the multiprocessor count")
        self.arch = 10 * major + minor
        if gemm == "mma" and self.arch < 80:
            raise TrtBridgeError(f"the tensor-core GEMM needs compute capability 8.0 or newer (this GPU is "
                                 f"{major}.{minor}); use gemm='dp4a' or 'auto'.")
        self.path = gemm if gemm != "auto" else ("mma" if self.arch >= 80 else "dp4a")
        self.functions = self.load(as_int(context))

    def load(self, context: int) -> dict[str, object]:
        driver = self.driver
        with _lock:
            if (context, self.arch) not in _modules:
                image = device_image(self.arch)
                module = check(driver, driver.cuModuleLoadData(image), f"loading the GEMM kernels for sm_{self.arch}")
                functions = {name: check(driver, driver.cuModuleGetFunction(module, name.encode()),
                                         f"finding kernel {name}") for name in FUNCTIONS}
                if self.arch >= 80:
                    shared = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    for name, (bm, bn, _) in MMA_TILES.items():
                        check(driver, driver.cuFuncSetAttribute(functions[name], shared,
                                                                MMA_STAGES * (bm + bn) * MMA_ROW_BYTES),
                              f"allowing {name} its shared memory")
                _modules[(context, self.arch)] = (module, functions)
            return _modules[(context, self.arch)][1]

    def upload(self, packed: PackedWeights, scale: np.ndarray, bias: np.ndarray | None = None) -> DeviceWeights:
        """Device copies of the packed weight, the float32 weight scale [N] and the optional float32 bias [N]."""
        scale = np.ascontiguousarray(scale, np.float32).reshape(-1)
        if scale.shape != (packed.n,):
            raise TrtBridgeError(f"the weight scale must have {packed.n} values (one per output column), "
                                 f"not {scale.size}.")
        if bias is not None:
            bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
            if bias.shape != (packed.n,):
                raise TrtBridgeError(f"the bias must have {packed.n} values (one per output column), not {bias.size}.")
        return DeviceWeights(self.driver, packed, scale, bias)

    def launch(self, name: str, grid: tuple[int, int], threads: int, shared: int, stream: int, args) -> None:
        values = [ctypes.c_void_p(a) if kind == "p" else
                  ctypes.c_longlong(a) if kind == "l" else
                  ctypes.c_float(a) if kind == "f" else ctypes.c_int(a) for kind, a in args]
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        result = self.driver.cuLaunchKernel(self.functions[name], grid[0], grid[1], 1, threads, 1, 1, shared, stream,
                                            ctypes.addressof(pointers), 0)
        check(self.driver, result, f"launching {name} (grid {grid[0]}x{grid[1]})")

    def run(self, stream: int, x_ptr: int, half: bool, rows: int, weights: DeviceWeights, granularity: str,
            y_ptr: int, workspace_ptr: int) -> None:
        """Enqueue y[rows, N] = dynamic_gemm(x[rows, K]) on ``stream`` (the quantization, then the GEMM); the
        workspace holds :func:`workspace_size` (rows, K, granularity) bytes. Never synchronizes."""
        if not weights.base:
            raise TrtBridgeError("the GEMM weights were freed (DeviceWeights.close) before the kernels ran.")
        self.quantize(stream, x_ptr, half, rows, weights.k, granularity, workspace_ptr)
        self.gemm(stream, rows, weights, granularity, y_ptr, half, workspace_ptr)

    def quantize(self, stream: int, x_ptr: int, half: bool, rows: int, k: int, granularity: str,
                 workspace_ptr: int) -> None:
        """Enqueue the quantization of x[rows, k] into the workspace (codes, row sums, scales)."""
        at = workspace_layout(rows, k, granularity)
        if rows <= 0:
            return
        at, kp, half = {name: workspace_ptr + offset for name, offset in at.items()}, round_up(k, K_ALIGN), int(half)
        grid = (-(-rows // QUANT_ROWS), 1)
        if granularity == "token":
            self.launch("dq_quantize_token", grid, QUANT_ROWS * 32, 0, stream,
                        (("p", x_ptr), ("i", half), ("l", rows), ("i", k), ("i", kp), ("p", at["q"]),
                         ("p", at["rowsum"]), ("p", at["rowscale"])))
            return
        count = rows * k
        blocks = max(1, min(MINMAX_BLOCKS, -(-count // (MINMAX_THREADS * 8))))
        self.launch("dq_minmax_partial", (blocks, 1), MINMAX_THREADS, 0, stream,
                    (("p", x_ptr), ("i", half), ("l", count), ("p", at["partials"])))
        self.launch("dq_tensor_params", (1, 1), MINMAX_THREADS, 0, stream,
                    (("p", at["partials"]), ("i", blocks), ("p", at["params"])))
        self.launch("dq_quantize_tensor", grid, QUANT_ROWS * 32, 0, stream,
                    (("p", x_ptr), ("i", half), ("l", rows), ("i", k), ("i", kp), ("p", at["params"]),
                     ("p", at["q"]), ("p", at["rowsum"])))

    def gemm(self, stream: int, rows: int, weights: DeviceWeights, granularity: str, y_ptr: int, half: bool,
             workspace_ptr: int) -> None:
        """Enqueue the int8 GEMM and its epilogue on a quantized workspace; y in float16 when ``half``."""
        if not weights.base:
            raise TrtBridgeError("the GEMM weights were freed (DeviceWeights.close) before the kernels ran.")
        at = workspace_layout(rows, weights.k, granularity)
        if rows <= 0:
            return
        at = {name: workspace_ptr + offset for name, offset in at.items()}
        rowscale, params = (at["rowscale"], 0) if granularity == "token" else (0, at["params"])
        name, (bm, bn, threads), shared = self.gemm_kernel(rows, weights.n)
        if -(-rows // bm) > 65535:
            raise TrtBridgeError(f"{rows} rows are more than the INT8 GEMM plugin handles in one call "
                                 f"({65535 * bm}); split the batch.")
        w = weights.ptr
        self.launch(name, (-(-weights.n // bn), -(-rows // bm)), threads, shared, stream,
                    (("p", at["q"]), ("p", w["weight"]), ("l", rows), ("i", weights.n), ("i", weights.k_padded),
                     ("p", at["rowsum"]), ("p", rowscale), ("p", params), ("p", w["zero_point"]),
                     ("p", w["col_correction"]), ("p", w["scale"]), ("p", w["bias"]), ("p", y_ptr), ("i", int(half))))

    def gemm_kernel(self, rows: int, n: int) -> tuple[str, tuple[int, int, int], int]:
        """(kernel, (tile rows, tile columns, threads), dynamic shared bytes) for a rows x n output."""
        if self.path == "dp4a":
            return "dq_gemm_dp4a", (64, 64, 256), 0
        big = -(-rows // 128) * -(-n // 128) >= self.sms
        name = "dq_gemm_mma_128x128" if big else "dq_gemm_mma_64x64"
        bm, bn, threads = MMA_TILES[name]
        return name, (bm, bn, threads), MMA_STAGES * (bm + bn) * MMA_ROW_BYTES
