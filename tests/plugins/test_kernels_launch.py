"""GemmKernels' host side without a GPU: a fake CUDA driver (device pointers are host addresses) decodes every
cuLaunchKernel's arguments against the kernel's C signature in dynamic_gemm.cu, checks its grid, block and
shared memory, and runs a numpy model of the kernel; the result must be reference.dynamic_gemm bit for bit. This
catches argument order, workspace layout, weight upload and tile selection mistakes before a GPU run does.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from trt_bridge.plugins import kernels, reference

from trt_bridge.tensorrt.cuda import CudaError

F32, F16 = np.float32, np.float16
C_KINDS = {"i64": "l", "int": "i", "float": "f"}


def c_signatures() -> dict[str, tuple[str, ...]]:
    """Each kernel's parameter kinds ('p' pointer, 'i' int, 'l' int64, 'f' float), read from the CUDA source."""
    source = kernels.source()
    found = {}
    for name, params in re.findall(r"^(dq_\w+)\(([^)]*)\)\s*{", source, re.M):
        found[name] = params
    macro = re.search(r"NAME\(([^)]*)\)", source).group(1).replace("\\", " ")
    for name in kernels.MMA_TILES:
        found[name] = macro
    return {name: tuple("p" if "*" in p else C_KINDS[p.split()[-2]] for p in params.split(","))
            for name, params in found.items()}


SIGNATURES = c_signatures()


def memory(ptr: int, count: int, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(ptr), dtype)


class FakeDriver:
    class CUdevice_attribute:  # noqa: N801 (cuda-python's name)
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = "sms"

    class CUfunction_attribute:  # noqa: N801
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = "max dynamic shared"

    shared: dict[str, int] = {}  # per function, like the module cache it belongs to: kept across fake GPUs

    def __init__(self, arch: int, sms: int):
        self.attributes = {"major": arch // 10, "minor": arch % 10, "sms": sms}
        self.context, self.blocks, self.launches = 0, {}, []
        self.handle = 0xC0DE0000 + arch  # a context of its own per fake GPU, for the module cache

    def cuInit(self, flags):
        return (0,)

    def cuCtxGetCurrent(self):
        return 0, self.context

    def cuDeviceGet(self, ordinal):
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device):
        return 0, self.handle

    def cuCtxSetCurrent(self, context):
        self.context = context
        return (0,)

    def cuCtxGetDevice(self):
        return 0, 0

    def cuDeviceGetAttribute(self, attribute, device):
        return 0, self.attributes[attribute]

    def cuModuleLoadData(self, image):
        assert image[:4] == b"\x7fELF"
        return 0, "module"

    def cuModuleGetFunction(self, module, name):
        return 0, name.decode()

    def cuFuncSetAttribute(self, function, attribute, value):
        self.shared[function] = value
        return (0,)

    def cuGetErrorName(self, err):
        return 0, b"CUDA_ERROR_FAKE"

    def cuMemAlloc(self, nbytes):
        block = np.full(nbytes + 256, 0xAB, np.uint8)  # garbage, like fresh device memory
        ptr = kernels.round_up(block.ctypes.data, 256)
        self.blocks[ptr] = block
        return 0, ptr

    def cuMemFree(self, ptr):
        return (0,) if self.blocks.pop(int(ptr), None) is not None else (1,)

    def cuMemcpyHtoD(self, ptr, host, nbytes):
        ctypes.memmove(ptr, host.ctypes.data, nbytes)
        return (0,)

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        kinds = SIGNATURES[function]
        slots = (ctypes.c_void_p * len(kinds)).from_address(params)
        ctype = {"p": ctypes.c_void_p, "i": ctypes.c_int, "l": ctypes.c_longlong, "f": ctypes.c_float}
        args = [ctype[kind].from_address(slots[i]).value or 0 for i, kind in enumerate(kinds)]
        assert (gz, by, bz, stream, extra) == (1, 1, 1, 77, 0)
        self.launches.append(function)
        assert shared <= self.shared.get(function, 48 * 1024)
        getattr(self, function)((gx, gy), bx, shared, *args)
        return (0,)

    # numpy models of the kernels, each checking that its launch covers the problem
    def dq_minmax_partial(self, grid, block, shared, x, half, count, partial):
        assert block == kernels.MINMAX_THREADS and grid[0] <= kernels.MINMAX_BLOCKS
        values = memory(x, count, F16 if half else F32).astype(F32)
        memory(partial, 2 * grid[0], F32)[:] = np.tile([min(F32(0), values.min()), max(F32(0), values.max())],
                                                       grid[0])

    def dq_tensor_params(self, grid, block, shared, partial, blocks, params):
        assert grid == (1, 1)
        pairs = memory(partial, 2 * blocks, F32)
        lo, hi = min(F32(0), pairs[0::2].min()), max(F32(0), pairs[1::2].max())
        scale = F32(F32(hi - lo) / F32(255)) or F32(1)
        zp = int(np.clip(np.rint(F32(0) - F32(lo / scale)), 0, 255))
        memory(params, 1, F32)[0] = scale
        memory(params + 4, 3, np.int32)[:] = (zp, 128 - zp, 0)

    def quantized(self, grid, block, x, half, rows, k, kp, q, rowsum):
        assert block == 32 * kernels.QUANT_ROWS and grid[0] * kernels.QUANT_ROWS >= rows and kp % 64 == 0
        return memory(x, rows * k, F16 if half else F32).astype(F32).reshape(rows, k), \
            memory(q, rows * kp, np.int8).reshape(rows, kp), memory(rowsum, rows, np.int32)

    def dq_quantize_tensor(self, grid, block, shared, x, half, rows, k, kp, params, q, rowsum):
        values, q, rowsum = self.quantized(grid, block, x, half, rows, k, kp, q, rowsum)
        scale, zp = memory(params, 1, F32)[0], memory(params + 4, 1, np.int32)[0]
        q[:] = 0
        q[:, :k] = np.clip(np.rint(values / scale) + zp, 0, 255).astype(np.int16) - 128
        rowsum[:] = q.astype(np.int64).sum(axis=1)

    def dq_quantize_token(self, grid, block, shared, x, half, rows, k, kp, q, rowsum, rowscale):
        values, q, rowsum = self.quantized(grid, block, x, half, rows, k, kp, q, rowsum)
        q[:] = 0
        q[:, :k], memory(rowscale, rows, F32)[:] = reference.quantize_per_token(values)
        rowsum[:] = q.astype(np.int64).sum(axis=1)

    def gemm(self, grid, block, tile, q, w, rows, n, kp, rowsum, rowscale, params, wzp, colcorr, wscale, bias, y,
             half):
        assert block == tile[2] and grid[0] * tile[1] >= n and grid[1] * tile[0] >= rows
        assert (grid[0] - 1) * tile[1] < n and (grid[1] - 1) * tile[0] < rows
        dot = reference.int_matmul(memory(q, rows * kp, np.int8).reshape(rows, kp),
                                   memory(w, n * kp, np.int8).reshape(n, kp).T)
        if rowscale:
            a, row_scale = 0, memory(rowscale, rows, F32)
        else:
            a, row_scale = memory(params + 8, 1, np.int32)[0], np.full(rows, memory(params, 1, F32)[0])
        exact = (reference.wrap32(dot) - reference.wrap32(memory(wzp, n, np.int32))[None, :]
                 * reference.wrap32(memory(rowsum, rows, np.int32))[:, None]
                 + np.uint32(reference.wrap32(a)) * reference.wrap32(memory(colcorr, n, np.int32))[None, :])
        out = exact.view(np.int32).astype(F32) * (row_scale[:, None] * memory(wscale, n, F32)[None, :])
        if bias:
            out = out + memory(bias, n, F32)[None, :]
        memory(y, rows * n, F16 if half else F32)[:] = out.reshape(-1).astype(F16 if half else F32)

    def dq_gemm_dp4a(self, grid, block, shared, *args):
        assert shared == 0
        self.gemm(grid, block, (64, 64, 256), *args)

    def dq_gemm_mma_128x128(self, grid, block, shared, *args):
        self.gemm(grid, block, kernels.MMA_TILES["dq_gemm_mma_128x128"], *args)

    def dq_gemm_mma_64x64(self, grid, block, shared, *args):
        self.gemm(grid, block, kernels.MMA_TILES["dq_gemm_mma_64x64"], *args)


def test_the_python_launches_match_the_cuda_signatures():
    assert set(SIGNATURES) == set(kernels.FUNCTIONS)
    assert SIGNATURES["dq_quantize_tensor"] == ("p", "i", "l", "i", "i", "p", "p", "p")
    assert SIGNATURES["dq_gemm_mma_64x64"] == SIGNATURES["dq_gemm_dp4a"] == ("p", "p", "l", "i", "i", *"p" * 8, "i")


@pytest.mark.parametrize("arch,gemm,sms", [(90, "auto", 132), (90, "auto", 1), (89, "dp4a", 128), (75, "auto", 40)])
@pytest.mark.parametrize("granularity", kernels.GRANULARITIES)
def test_run_through_a_fake_driver_equals_the_reference(monkeypatch, arch, gemm, sms, granularity):
    fake = FakeDriver(arch, sms)
    monkeypatch.setattr(kernels, "driver_module", lambda: fake)
    gk = kernels.GemmKernels(gemm)
    assert fake.context == fake.handle and gk.arch == arch and gk.path == ("dp4a" if arch < 80 else "mma"
                                                                          if gemm == "auto" else gemm)
    if arch >= 80:
        assert fake.shared["dq_gemm_mma_128x128"] == 3 * 256 * 80
    rng = np.random.default_rng(arch + sms)
    for shape, n, dtype, bias, misaligned in (((37, 383), 129, F32, True, True), ((2, 3, 5), 1, F16, False, True),
                                              ((300, 64), 200, F16, True, False), ((1, 1), 7, F32, False, False)):
        k, rows = shape[-1], int(np.prod(shape[:-1]))
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        weight = rng.integers(-128, 128, (k, n), dtype=np.int8)
        zero_point = rng.integers(-128, 128, n)
        scale = rng.uniform(1e-3, 1e-2, n).astype(F32)
        b = rng.standard_normal(n).astype(F32) if bias else None
        x_ptr = fake.cuMemAlloc(x.nbytes + 16)[1] + (x.itemsize if misaligned else 0)
        fake.cuMemcpyHtoD(x_ptr, x, x.nbytes)
        y_ptr = fake.cuMemAlloc(rows * n * x.itemsize)[1]
        workspace = fake.cuMemAlloc(kernels.workspace_size(rows, k, granularity))[1]
        with gk.upload(kernels.pack_weights(weight, zero_point), scale, b) as weights:
            fake.launches.clear()
            gk.run(77, x_ptr, dtype == F16, rows, weights, granularity, y_ptr, workspace)
        assert weights.base == 0 and len(fake.blocks) == 3  # the weights' allocation was freed
        expected = reference.dynamic_gemm(x, weight, zero_point, scale, b, granularity).reshape(rows, n)
        got = memory(y_ptr, rows * n, dtype).reshape(rows, n)
        assert np.array_equal(got.view(f"u{x.itemsize}"), expected.view(f"u{x.itemsize}")), (shape, n)
        assert fake.launches[:-1] == (["dq_quantize_token"] if granularity == "token" else
                                      ["dq_minmax_partial", "dq_tensor_params", "dq_quantize_tensor"])
        assert fake.launches[-1] == gk.gemm_kernel(rows, n)[0]
        for ptr in (x_ptr, y_ptr, workspace):
            fake.blocks.pop(kernels.round_up(ptr - 255, 256) if ptr % 256 else ptr)
    assert fake.blocks == {}


def test_failed_calls_raise_cuda_errors(monkeypatch):
    fake = FakeDriver(90, 132)
    monkeypatch.setattr(kernels, "driver_module", lambda: fake)
    gk = kernels.GemmKernels()
    monkeypatch.setattr(fake, "cuLaunchKernel", lambda *args: (700,))
    with gk.upload(kernels.pack_weights(np.ones((4, 2), np.int8), np.zeros(2, int)), np.ones(2)) as weights:
        with pytest.raises(CudaError, match=r"launching dq_quantize_token \(grid 1x1\) failed \(CUDA_ERROR_FAKE\)"):
            gk.run(77, 1, False, 3, weights, "token", 2, 3)
        with pytest.raises(kernels.TrtBridgeError, match="scale must have 2 values"):
            gk.upload(kernels.pack_weights(np.ones((4, 2), np.int8), np.zeros(2, int)), np.ones(3))
    with pytest.raises(kernels.TrtBridgeError, match="compute capability 8.0"):
        monkeypatch.setattr(kernels, "driver_module", lambda: FakeDriver(75, 40))
        kernels.GemmKernels("mma")
