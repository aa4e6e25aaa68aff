"""Quantization formats as values: what a Q/DQ's codes are, and what TensorRT builds of them.

One frozen :class:`QuantFormat` per format TensorRT runs (INT8, FP8 E4M3, INT4 and FP4 E2M1), with what every stage
needs to know of it: its ONNX and numpy types, the largest code (``qmax``: a tensor whose largest magnitude is amax
has scale amax / qmax), whether its codes are integers or floats, which granularities TensorRT takes for it, the
opset its Q/DQ need and the compute capability that runs it. Lift, placement, lowering and check read formats from
here instead of assuming int8; :func:`code_format` is the one reader of a source Q/DQ's code type.

Ranges travel through the annotations in INT8's unit (an activation's ``scale`` is amax / 127, whatever its format:
every scale source, from calibration to TensorRT caches, writes that unit); lowering writes amax / ``qmax`` of the
tensor's format (:meth:`QuantFormat.scale_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from onnx import TensorProto


@dataclass(frozen=True)
class QuantFormat:
    """One quantization format TensorRT builds (compare onnxruntime's ``QuantType``, Polygraphy's ``DataType``)."""

    name: str  # the option's spelling: int8, fp8, int4, fp4
    label: str  # the report's: INT8, FP8, INT4, FP4
    onnx_type: int  # the codes' TensorProto type
    dtype: np.dtype  # the codes' numpy (ml_dtypes) type
    qmax: float  # the largest code: 127, 448, 7, 6
    is_float: bool  # float codes (FP8, FP4): cast, not rounded to integers
    activations: bool  # TensorRT quantizes activations in it (per tensor); else weights only
    block_size: int  # weights: 0 per channel, else the default block along the reduction axis
    min_opset: int  # QuantizeLinear/DequantizeLinear take the type from this opset
    min_compute: float  # the lowest compute capability whose kernels run it

    @property
    def qmin(self) -> float:
        """The smallest code a symmetric quantizer writes: −qmax (int4's −8 is left unused, as TensorRT does)."""
        return -self.qmax

    def scale_of(self, int8_scale) -> np.ndarray:
        """The scale of this format covering the range an INT8-unit scale (amax / 127) covers."""
        return np.asarray(int8_scale, np.float64) * (INT8_QMAX / self.qmax)

    def codes(self, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """``QuantizeLinear(values, scale, 0)`` with saturation: integer codes rounded half to even, float codes
        cast (round to nearest even) after clamping to ±qmax (so nothing becomes NaN)."""
        q = np.clip(np.asarray(values, np.float64) / np.asarray(scale, np.float64), -self.qmax, self.qmax)
        if not self.is_float:
            q = np.rint(q)
        return q.astype(self.dtype)

    def zero(self, shape=()) -> np.ndarray:
        """The zero point TensorRT takes: zeros of the codes' type."""
        return np.zeros(shape, self.dtype)

    def runs_on(self, compute: float) -> bool:
        return compute >= self.min_compute

    def __copy__(self) -> QuantFormat:
        return self  # one instance per format: the stages compare formats with ``is``, copies of annotations too

    def __deepcopy__(self, memo) -> QuantFormat:
        return self


INT8_QMAX = 127

INT8 = QuantFormat("int8", "INT8", TensorProto.INT8, np.dtype(np.int8), INT8_QMAX, False, True, 0, 13, 0.0)
FP8 = QuantFormat("fp8", "FP8", TensorProto.FLOAT8E4M3FN, np.dtype(ml_dtypes.float8_e4m3fn), 448.0, True, True,
                  0, 19, 8.9)
INT4 = QuantFormat("int4", "INT4", TensorProto.INT4, np.dtype(ml_dtypes.int4), 7, False, False, 128, 21, 8.0)
FP4 = QuantFormat("fp4", "FP4", TensorProto.FLOAT4E2M1, np.dtype(ml_dtypes.float4_e2m1fn), 6.0, True, True, 16,
                  23, 10.0)

FORMATS = {f.name: f for f in (INT8, FP8, INT4, FP4)}


@dataclass(frozen=True)
class SourceCodes:
    """What a source Q/DQ's code type is, and the format TensorRT runs that keeps it best."""

    onnx_type: int
    name: str  # uint8, int16, float8e5m2, ...
    nearest: QuantFormat
    exact: bool  # the codes are the nearest format's own (int8, float8e4m3fn, int4, float4e2m1)


_SOURCES = {
    TensorProto.INT8: ("int8", INT8, True), TensorProto.UINT8: ("uint8", INT8, False),
    TensorProto.INT16: ("int16", INT8, False), TensorProto.UINT16: ("uint16", INT8, False),
    TensorProto.INT4: ("int4", INT4, True), TensorProto.UINT4: ("uint4", INT4, False),
    TensorProto.FLOAT8E4M3FN: ("float8e4m3fn", FP8, True), TensorProto.FLOAT8E4M3FNUZ: ("float8e4m3fnuz", FP8, False),
    TensorProto.FLOAT8E5M2: ("float8e5m2", FP8, False), TensorProto.FLOAT8E5M2FNUZ: ("float8e5m2fnuz", FP8, False),
    TensorProto.FLOAT4E2M1: ("float4e2m1", FP4, True),
}


#: every ONNX type a Q/DQ's codes can have
CODE_TYPES = tuple(_SOURCES)


def code_types(fmt: QuantFormat) -> frozenset[int]:
    """The ONNX code types whose nearest TensorRT format is ``fmt`` (FP8: the four float8 types)."""
    return frozenset(t for t, (_, nearest, _) in _SOURCES.items() if nearest is fmt)


def code_format(onnx_type: int) -> SourceCodes | None:
    """The source codes of ONNX type ``onnx_type`` (None: not a quantized type: int32, float, ...)."""
    found = _SOURCES.get(onnx_type)
    return None if found is None else SourceCodes(onnx_type, *found)


def numpy_code_format(dtype) -> SourceCodes | None:
    """:func:`code_format` of a numpy (or ml_dtypes) dtype; None for a type that is not one of the code types."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    for onnx_type in _SOURCES:
        if _NUMPY.get(onnx_type) == dtype:
            return code_format(onnx_type)
    return None


_NUMPY = {
    TensorProto.INT8: np.dtype(np.int8), TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.INT16: np.dtype(np.int16), TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.INT4: np.dtype(ml_dtypes.int4), TensorProto.UINT4: np.dtype(ml_dtypes.uint4),
    TensorProto.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    TensorProto.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    TensorProto.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    TensorProto.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    TensorProto.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
}


def broadcast_param(param, shape, axis: int, block: int = 0) -> np.ndarray:
    """A Q/DQ's scale or zero point shaped to broadcast against a tensor of ``shape``: 0-d (one value), per ``axis``,
    or per block of ``block`` elements along ``axis`` (``param`` then has the tensor's rank; the last block may be
    short). The values keep their type."""
    param = np.asarray(param)
    if param.size == 1:
        return param.reshape(())
    if block:
        return np.repeat(param, block, axis=axis).take(range(shape[axis]), axis=axis)
    shaped = [1] * len(shape)
    shaped[axis] = -1
    return param.reshape(shaped)


def code_limits(dtype) -> tuple[float, float]:
    """The smallest and largest code of a (source) code type: integers from ``iinfo``, floats from ``finfo``
    (float8/float4 included, through ml_dtypes)."""
    dtype = np.dtype(dtype)
    try:
        info = np.iinfo(dtype)
    except ValueError:
        try:
            info = ml_dtypes.iinfo(dtype)
        except (ValueError, TypeError):
            info = ml_dtypes.finfo(dtype)
            return float(-info.max), float(info.max)
    return float(info.min), float(info.max)


def nvfp4_scales(scale: np.ndarray) -> np.ndarray:
    """FP4 block scales made NVFP4's two levels (TensorRT's FP4 GEMMs take FP8 E4M3 block scales under one FP32
    global scale): g = max / 448, each block's scale rounded to g · FP8(scale / g); returned as their float32
    products, which :func:`nvfp4_split` writes back exactly. A block scale under FP8's range becomes its smallest
    subnormal's, never 0 (a zero scale would make its codes infinite)."""
    scale = np.asarray(scale, np.float32)
    return nvfp4_round(scale, nvfp4_global(scale))


def nvfp4_global(scale: np.ndarray) -> np.float32:
    """The FP32 global scale NVFP4 puts over block ``scale``: its largest over 448 (1 for none positive)."""
    scale = np.asarray(scale, np.float32)
    return np.float32(scale.max() / FP8.qmax) if scale.size and scale.max() > 0 else np.float32(1.0)


def nvfp4_round(scale, g: np.float32) -> np.ndarray:
    """Block scales rounded to NVFP4's ``g`` · FP8(scale / g), as float32 products; one under FP8's range becomes its
    smallest subnormal's, never 0 (a zero scale would make its codes infinite). ``scale / g`` is taken in
    ``scale``'s own precision (float32, or float64 for a weight's candidate scales) before FP8's rounding."""
    tiny = np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).smallest_subnormal)
    ratio = np.clip(np.asarray(scale) / g, tiny, FP8.qmax).astype(np.float32)  # FP8 E4M3 has no infinity
    s8 = ratio.astype(ml_dtypes.float8_e4m3fn)
    return (s8.astype(np.float32) * g).astype(np.float32)


def nvfp4_split(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """FP4 block scales as NVFP4's two levels: (FP8 E4M3 block scales, a 0-d float32 global scale) whose float32
    product is ``scale`` exactly, or None where no such pair gives it back. The global scale tried first maps the
    largest block scale to 448 (:func:`nvfp4_scales`' and ModelOpt's choice); then the one mapping it to each
    smaller FP8 value (a source's levels, multiplied out by the lift: ``s8 · g`` in float32), with its float32
    neighbours."""
    scale = np.asarray(scale, np.float32)
    if not scale.size or not np.all(np.isfinite(scale)) or scale.max() <= 0:
        return None
    top = np.float32(scale.max())
    flat = scale.reshape(-1)
    sample = flat[:: max(1, flat.size // 256)]

    def exact(g: np.float32, values: np.ndarray) -> np.ndarray | None:
        s8 = (values / g).astype(ml_dtypes.float8_e4m3fn)
        return s8 if np.array_equal(s8.astype(np.float32) * g, values) else None

    for v in FP8_VALUES:
        g0 = np.float32(top / v)
        for g in (g0, np.nextafter(g0, np.float32(np.inf)), np.nextafter(g0, np.float32(0))):
            if g > 0 and np.isfinite(g) and exact(g, sample) is not None and (s8 := exact(g, scale)) is not None:
                return s8, np.asarray(g, np.float32)
    return None



#: the divisors of a block's amax tried for its FP4 scale (amax / 6 first: E2M1's largest value holds amax)
FP4_DIVISORS = (6.0, 6.5, 7.0, 7.5, 8.0, 5.5)


def nvfp4_fitted(grouped: np.ndarray, plain: np.ndarray, g: np.float32 | None = None) -> np.ndarray:
    """Each FP4 block's NVFP4 scale (FP8 under the global scale ``g``, by default that of ``plain``, amax / 6's)
    whose codes dequantize nearest to the block (the least squared error of ``FP4_DIVISORS``' candidates, ties to
    amax / 6). ``grouped``: the weight as (blocks, block length, columns), float64; ``plain``: each block's
    amax / 6."""
    amax = plain.astype(np.float64) * 6.0
    base = nvfp4_scales(plain) if g is None else nvfp4_round(plain, g)
    g = nvfp4_global(base) if g is None else g
    best, best_err = base, None
    for divisor in FP4_DIVISORS:
        cand = np.where(plain > 0, nvfp4_round(amax / divisor, g), base)
        full = cand.astype(np.float64)[:, None]
        q = (grouped / full).astype(np.float32)
        codes = np.clip(q, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
        err = ((codes * full - grouped) ** 2).sum(axis=1)
        if best_err is None:
            best, best_err = cand, err
            continue
        better = err < best_err
        best, best_err = np.where(better, cand, best), np.where(better, err, best_err)
    return best.astype(np.float32)

#: FP8 E4M3's positive finite values, largest first (the block scale a global scale may map the largest to)
FP8_VALUES = np.unique(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
FP8_VALUES = FP8_VALUES[np.isfinite(FP8_VALUES) & (FP8_VALUES > 0)][::-1]
