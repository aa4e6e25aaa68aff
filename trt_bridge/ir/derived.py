"""Constant values a rule derives from compact ones, computed only when something reads them.

A lifted 4-bit weight is a float MatMul weight ``W = codes·scale`` beside its annotation, which keeps the codes and
scales themselves; lowering writes those, never ``W``. Held as float32, ``W`` is 8× the source's packed bytes (a
0.85 B-parameter int4 decoder: 3.4 GB of floats for 0.75 GB of codes), yet a weight-only conversion reads none of
it. :class:`DerivedValues` is onnx-graphsurgeon's ``LazyValues`` whose values are a function of arrays the rule
keeps anyway::

    gs.Constant("w_float", DerivedValues(lambda: dequantize(codes, scale), shape, float32))
        .shape / .dtype          known without computing
        .values                  computed (and cached on the Constant, as onnx-graphsurgeon does for LazyValues)
        export_model(.., store)  a reserved range of the store's file, written when a session needs it

Everything that reads a constant's values (onnxruntime sessions for calibration and checks, ``fold_constants``,
numeric checks) gets the same numbers the eager constant held.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.errors import InternalError


class DerivedValues(LazyValues):
    """Values of a known shape and type, computed by ``compute`` each time they are loaded."""

    def __init__(self, compute: Callable[[], np.ndarray], shape: tuple[int, ...], dtype) -> None:
        # (LazyValues.__init__ reads a TensorProto: there is none until the values are computed)
        self._compute = compute
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def load(self) -> np.ndarray:
        if self._compute is None:
            raise InternalError("derived values were read after their weight was lowered (released)")
        values = np.asarray(self._compute())
        if tuple(values.shape) != self.shape or values.dtype != self.dtype:
            raise InternalError(f"derived values are {values.dtype} {list(values.shape)}, not the declared "
                             f"{self.dtype} {list(self.shape)}")
        return values

    def release(self) -> None:
        """Let go of the function and what it computes from: nothing will read these values again."""
        self._compute = None

    @property
    def tensor(self) -> onnx.TensorProto:
        """The values as a TensorProto (onnx-graphsurgeon's exporter reads a LazyValues' ``tensor``)."""
        return onnx.numpy_helper.from_array(self.load())
