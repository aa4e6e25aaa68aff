"""The dynamically quantized INT8 GEMM in numpy: the contract the CUDA kernels (``dynamic_gemm.cu``) meet bit
for bit, and the kernels' integer algebra, to show it equals the plain definition.

Granularity ``"tensor"`` is onnxruntime's DynamicQuantizeLinear + MatMulInteger + Cast + Mul (+ Add)::

    lo, hi = min(0, min x), max(0, max x);  s = (hi - lo) / 255 (1 when 0);  zp = clamp(rint(0 - lo / s), 0, 255)
    codes = clamp(rint(x / s) + zp, 0, 255);  acc = sum_k (codes - zp) (weight - wzp)
    y = float(acc) * (s * wscale) [+ bias]

Granularity ``"token"`` quantizes each row symmetrically: s_r = max|x_r| / 127 (1 when 0),
codes = clamp(rint(x / s_r), -127, 127), acc = sum_k codes (weight - wzp), y = float(acc) * (s_r * wscale) [+ bias].
All float arithmetic is float32 with round-to-nearest-even; float16 inputs are widened exactly and the result is
narrowed to float16 at the very end.
"""

from __future__ import annotations

import numpy as np
from trt_bridge.plugins.kernels import GRANULARITIES, pack_weights

F32 = np.float32


def quantize_per_tensor(x32: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """onnxruntime's DynamicQuantizeLinear: (uint8 codes, float32 scale, uint8 zero point)."""
    x32 = np.asarray(x32, F32)
    lo = min(F32(0), x32.min()) if x32.size else F32(0)
    hi = max(F32(0), x32.max()) if x32.size else F32(0)
    scale = F32(F32(hi - lo) / F32(255))
    if scale == 0:
        scale = F32(1)
    zero_point = np.clip(np.rint(F32(0) - F32(lo / scale)), 0, 255).astype(np.uint8)
    codes = np.clip(np.rint(x32 / scale) + F32(zero_point), 0, 255).astype(np.uint8)
    return codes, scale, zero_point


def quantize_per_token(x2d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row: (int8 codes [M, K], float32 scales [M])."""
    x2d = np.asarray(x2d, F32)
    scales = (np.abs(x2d).max(axis=1) / F32(127)).astype(F32)
    scales[scales == 0] = F32(1)
    codes = np.clip(np.rint(x2d / scales[:, None]), -127, 127).astype(np.int8)
    return codes, scales


def rows_of(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float16):
        raise ValueError(f"x must be float32 or float16, not {x.dtype}")
    return x.astype(F32).reshape(-1, x.shape[-1])


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer a @ b through float64 (every partial sum of |a| <= 255, |b| <= 255 over K < 2^37 is exact)."""
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)


def quantize(x2d: np.ndarray, granularity: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes minus their zero point, int64 [M, K]; float32 scale per row [M]; uint8 zero point (0 for token))."""
    if granularity == "tensor":
        codes, scale, zero_point = quantize_per_tensor(x2d)
        centered = codes.astype(np.int64) - int(zero_point)
        return centered, np.full(x2d.shape[0], scale, F32), zero_point
    if granularity == "token":
        codes, scales = quantize_per_token(x2d)
        return codes.astype(np.int64), scales, np.uint8(0)
    raise ValueError(f"granularity must be one of {GRANULARITIES}, not {granularity!r}")


def accumulator(x: np.ndarray, weight: np.ndarray, zero_point: np.ndarray, granularity: str) -> np.ndarray:
    """The plain definition: sum_k (codes - zp)(weight - wzp), int64 [M, N]."""
    centered, _, _ = quantize(rows_of(x), granularity)
    return int_matmul(centered, weight.astype(np.int64) - np.asarray(zero_point, np.int64)[None, :])


def dynamic_gemm(x: np.ndarray, weight: np.ndarray, zero_point: np.ndarray, scale: np.ndarray,
                 bias: np.ndarray | None = None, granularity: str = "tensor") -> np.ndarray:
    """y [..., N] in x's dtype for x [..., K], int8 weight [K, N], int32 zero point [N], float32 scale [N]."""
    x = np.asarray(x)
    x2d = rows_of(x)
    centered, row_scale, _ = quantize(x2d, granularity)
    acc = int_matmul(centered, weight.astype(np.int64) - np.asarray(zero_point, np.int64)[None, :])
    scale = np.asarray(scale, F32)
    prod = row_scale[:, None] * scale[None, :]  # float32 x float32, rounded once
    y = acc.astype(F32) * prod
    if bias is not None:
        y = y + np.asarray(bias, F32)[None, :]
    return y.reshape(*x.shape[:-1], weight.shape[1]).astype(x.dtype)


def wrap32(values: np.ndarray) -> np.ndarray:
    """int64 values reduced mod 2^32, as uint32 (the kernels' unsigned 32-bit registers)."""
    return (np.asarray(values, np.int64) & 0xFFFFFFFF).astype(np.uint32)


def kernel_algorithm(x: np.ndarray, weight: np.ndarray, zero_point: np.ndarray, granularity: str) -> np.ndarray:
    """The accumulator [M, N] as the kernels compute it, int32: int8 activations (tensor: codes - 128) against
    the packed, K-padded weight, then the zero-point corrections in wrapping 32-bit arithmetic::

        tensor: q.w - wzp * rowsum(q) + (128 - zp) * (colsum(w) - K * wzp)
        token:  q.w - wzp * rowsum(q)
    """
    x2d = rows_of(x)
    packed = pack_weights(weight, zero_point)
    k, kp = packed.k, packed.k_padded
    q = np.zeros((x2d.shape[0], kp), np.int8)  # the workspace: padding columns are 0
    if granularity == "tensor":
        codes, _, zp = quantize_per_tensor(x2d)
        q[:, :k] = (codes.astype(np.int16) - 128).astype(np.int8)
        a = 128 - int(zp)
    elif granularity == "token":
        q[:, :k], _ = quantize_per_token(x2d)
        a = 0
    else:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, not {granularity!r}")
    rowsum = q.astype(np.int64).sum(axis=1)
    dot = int_matmul(q, packed.weight_nk.T)  # what the int8 GEMM accumulates (fits int32: |.| <= K * 2^14)
    if np.abs(dot).max(initial=0) >= 2**31:
        raise OverflowError("the int8 dot product overflows int32")
    exact = (wrap32(dot) - wrap32(packed.zero_point)[None, :] * wrap32(rowsum)[:, None]
             + np.uint32(wrap32(a)) * wrap32(packed.col_correction)[None, :])
    return exact.astype(np.uint32).view(np.int32)
