"""On a GPU runner (TRT_BRIDGE_GPU=1): the dynamic INT8 GEMM plugin's kernels, launched through cuda-python on
fresh random inputs, equal plugins/reference.py bit for bit (every GEMM kernel and tile size, both granularities,
float32 and float16, with and without bias, misaligned inputs, K and N not multiples of anything); the quantized
workspace (codes, row sums, scales) equals the reference's quantization too.

Imports only numpy, pytest and the plugin's kernels/reference modules (no onnx, TensorRT or Polygraphy), so it
runs on a machine with just cuda-python and NVRTC:

    TRT_BRIDGE_GPU=1 python -m pytest -q -p no:cacheprovider --noconftest tests/gpu/test_plugin_kernels.py
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from trt_bridge.plugins import kernels, reference

pytestmark = pytest.mark.gpu

# (x shape, N, dtype, granularity, bias, input misaligned by one element, values)
SHAPES = [((1, 1), 1), ((1, 768), 1536), ((1, 64), 384), ((37, 3), 5), ((37, 383), 384), ((37, 64), 1),
          ((37, 1), 1536), ((37, 768), 1536), ((4096, 768), 1536), ((4096, 383), 5), ((4096, 1), 384),
          ((4096, 64), 1536), ((2, 3, 383), 384), ((4, 1024, 64), 1536), ((3, 5, 768), 5)]
CASES = [(shape, n, dtype, granularity, (i + j) % 2 == 0, i % 5 == 3, ("normal", "quarters", "offset")[(i + j) % 3])
         for i, (shape, n) in enumerate(SHAPES) for j, (dtype, granularity) in enumerate(
             (d, g) for d in ("float32", "float16") for g in ("tensor", "token"))]
SPECIAL = [((8, 3), 5, "float32", "tensor", True, False, "zeros"),
           ((8, 3), 5, "float32", "token", True, False, "zeros"),
           ((37, 383), 5, "float16", "tensor", False, False, "positive"),
           ((37, 383), 5, "float32", "tensor", True, True, "negative"),
           ((37, 200), 7, "float32", "token", False, False, "extreme")]


def case_id(case) -> str:
    shape, n, dtype, granularity, bias, misaligned, values = case
    return (f"{'x'.join(map(str, shape))}-n{n}-{dtype}-{granularity}{'-bias' if bias else ''}"
            f"{'-misaligned' if misaligned else ''}-{values}")


class Device:
    """cuda-python plumbing: a stream, allocations freed at the end, copies both ways."""

    def __init__(self):
        self.kernels = {gemm: kernels.GemmKernels(gemm) for gemm in ("mma", "dp4a")}
        self.driver = kernels.driver_module()
        self.stream = self.call(self.driver.cuStreamCreate(0), "creating a stream")
        self.allocations = []

    def call(self, result, what):
        return kernels.check(self.driver, result, what)

    def alloc(self, nbytes: int) -> int:
        ptr = int(self.call(self.driver.cuMemAlloc(max(nbytes, 1)), f"allocating {nbytes} bytes"))
        self.allocations.append(ptr)
        return ptr

    def upload(self, array: np.ndarray, offset: int = 0) -> int:
        ptr = self.alloc(array.nbytes + offset) + offset
        self.call(self.driver.cuMemcpyHtoD(ptr, np.ascontiguousarray(array), array.nbytes), "copying to the GPU")
        return ptr

    def download(self, ptr: int, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        self.call(self.driver.cuMemcpyDtoH(out, ptr, out.nbytes), "copying from the GPU")
        return out

    def sync(self) -> None:
        self.call(self.driver.cuStreamSynchronize(self.stream), "synchronizing the stream (a kernel failed)")
        self.call(self.driver.cuCtxSynchronize(), "synchronizing the context")

    def close(self) -> None:
        for ptr in self.allocations:
            self.call(self.driver.cuMemFree(ptr), "freeing")
        self.call(self.driver.cuStreamDestroy(self.stream), "destroying the stream")


@pytest.fixture(scope="module")
def device():
    dev = Device()
    yield dev
    dev.close()


def make_inputs(case, rng):
    shape, n, dtype, granularity, bias, misaligned, values = case
    k = shape[-1]
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(10.0 ** rng.uniform(-2, 1))
    if values == "quarters":  # exact ties in x / s
        x = (np.round(x * 4) / 4).astype(np.float32)
    elif values == "offset":
        x = x + np.float32(3 * np.abs(x).max())
    elif values == "zeros":
        x = np.zeros(shape, np.float32)
    elif values == "positive":
        x = np.abs(x)
    elif values == "negative":
        x = -np.abs(x)
    elif values == "extreme":
        x[:, ::3] = np.float32(1000.0)
        x[1] = -np.float32(7.0)
    x = x.astype(dtype)
    weight = rng.integers(-128, 128, (k, n), dtype=np.int8)
    zero_point = rng.integers(-128, 128, n).astype(np.int32)
    zero_point[zero_point == 0] = 1
    zero_point[: min(n, 2)] = (127, -128)[: min(n, 2)]
    if values == "extreme":
        weight[:] = -128
        zero_point[:] = 127
    scale = (rng.uniform(0.5, 2.0, n) / (150 * np.sqrt(k))).astype(np.float32)  # float16 outputs stay finite
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    return x, weight, zero_point, scale, b


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.dtype == np.float16 else np.uint32)


def check_workspace(device, rows, k, granularity, x2d, workspace):
    """The quantized activations, row sums and scales (a failure here points at the quantize kernels)."""
    layout = kernels.workspace_layout(rows, k, granularity)
    kp = kernels.round_up(k, kernels.K_ALIGN)
    q = device.download(workspace + layout["q"], (rows, kp), np.int8)
    rowsum = device.download(workspace + layout["rowsum"], rows, np.int32)
    if granularity == "tensor":
        codes, scale, zero_point = reference.quantize_per_tensor(x2d)
        params = device.download(workspace + layout["params"], 4, np.int32)
        assert params[:1].view(np.float32)[0] == scale and params[1] == int(zero_point)
        assert params[2] == 128 - int(zero_point)  # (a uint8 difference would wrap)
        expected = (codes.astype(np.int16) - 128).astype(np.int8)
    else:
        expected, scales = reference.quantize_per_token(x2d)
        got_scales = device.download(workspace + layout["rowscale"], rows, np.float32)
        assert np.array_equal(bits(got_scales), bits(scales))
    assert np.array_equal(q[:, :k], expected), "quantized codes differ"
    assert not q[:, k:].any(), "the K padding is not zero"
    assert np.array_equal(rowsum, expected.astype(np.int64).sum(axis=1)), "row sums differ"


@pytest.mark.parametrize("case", CASES + SPECIAL, ids=case_id)
def test_kernels_equal_reference_bit_for_bit(device, case):
    shape, n, dtype, granularity, bias, misaligned, _ = case
    rng = np.random.default_rng(zlib.crc32(case_id(case).encode()))
    x, weight, zero_point, scale, b = make_inputs(case, rng)
    k, rows = shape[-1], int(np.prod(shape[:-1]))
    expected = reference.dynamic_gemm(x, weight, zero_point, scale, b, granularity).reshape(rows, n)
    assert expected.dtype == x.dtype
    half = x.dtype == np.float16
    x_ptr = device.upload(x, offset=x.itemsize if misaligned else 0)
    y_ptr = device.alloc(expected.nbytes)
    workspace = device.alloc(kernels.workspace_size(rows, k, granularity))
    packed = kernels.pack_weights(weight, zero_point)
    mma, dp4a = device.kernels["mma"], device.kernels["dp4a"]
    variants = [("dp4a", dp4a, dp4a.sms), ("mma 64x64", mma, 10**9), ("mma 128x128", mma, 1)]
    with mma.upload(packed, scale, b) as weights:
        for label, gk, sms in variants:
            gk.sms = sms  # picks the tile size
            device.call(device.driver.cuMemsetD8Async(workspace, 0xAB, kernels.workspace_size(rows, k, granularity),
                                                      device.stream), "poisoning the workspace")
            nan = (0x7E00, device.driver.cuMemsetD16Async) if half else (0x7FC00000, device.driver.cuMemsetD32Async)
            device.call(nan[1](y_ptr, nan[0], rows * n, device.stream), "poisoning the output with NaN")
            gk.run(int(device.stream), x_ptr, half, rows, weights, granularity, y_ptr, workspace)
            device.sync()
            check_workspace(device, rows, k, granularity, x.astype(np.float32).reshape(rows, k), workspace)
            y = device.download(y_ptr, (rows, n), x.dtype)
            diff = np.flatnonzero(bits(y) != bits(expected))
            assert diff.size == 0, (f"{label}: {diff.size} of {y.size} outputs differ, first at {divmod(diff[0], n)}: "
                                    f"{y.flat[diff[0]]!r} != {expected.flat[diff[0]]!r}")


def test_zero_rows_enqueue_nothing_and_kernels_are_cached(device):
    gk = kernels.GemmKernels()
    assert gk.functions is kernels.GemmKernels().functions
    assert gk.path == ("mma" if gk.arch >= 80 else "dp4a")
    packed = kernels.pack_weights(np.ones((3, 2), np.int8), np.array([1, -1]))
    with gk.upload(packed, np.ones(2, np.float32)) as weights:
        gk.run(int(device.stream), 0, False, 0, weights, "tensor", 0, 0)
        device.sync()
    assert weights.base == 0
    with pytest.raises(kernels.TrtBridgeError, match="freed"):
        gk.run(int(device.stream), 0, False, 1, weights, "token", 0, 0)
