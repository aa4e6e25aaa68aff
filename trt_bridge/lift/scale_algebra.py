"""Symbolic scale tracking for integer epilogues.

A tensor that holds a scale is described as a :class:`Monomial`: a numeric part
(a constant array, broadcastable) times a product of *dynamic* scale symbols, each
with an integer exponent. The dynamic symbols are the scale outputs of
``DynamicQuantizeLinear``; everything else is folded into the numeric part. This
lets the lift rules recognise, whatever the exporter's node layout, when an int32
accumulator has been multiplied back into the float domain, and what float value
an accumulator-scaled addend (e.g. a bias quantized at run time) stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

Symbols = tuple[tuple[str, int], ...]


def _merge(a: Symbols, b: Symbols, sign: int) -> Symbols:
    out = dict(a)
    for name, exp in b:
        out[name] = out.get(name, 0) + sign * exp
    return tuple(sorted((k, v) for k, v in out.items() if v != 0))


@dataclass(frozen=True)
class Monomial:
    numeric: np.ndarray
    symbols: Symbols = ()

    @staticmethod
    def one() -> Monomial:
        return Monomial(np.ones((), np.float64))

    def __mul__(self, other: Monomial) -> Monomial:
        return Monomial(self.numeric * other.numeric, _merge(self.symbols, other.symbols, 1))

    def __truediv__(self, other: Monomial) -> Monomial:
        return Monomial(self.numeric / other.numeric, _merge(self.symbols, other.symbols, -1))

    def matches(self, other: Monomial, rtol: float = 1e-5) -> bool:
        if self.symbols != other.symbols:
            return False
        try:
            a, b = np.broadcast_arrays(self.numeric, other.numeric)
        except ValueError:
            return False
        return bool(np.allclose(a, b, rtol=rtol, atol=0))


def constant_values(tensor: gs.Tensor) -> np.ndarray | None:
    """The values of a constant tensor (initializer or Constant node output), else None."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    if len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant":
        value = tensor.inputs[0].attrs.get("value")
        if isinstance(value, gs.Constant):
            return np.asarray(value.values)
    return None


def is_constant(tensor: gs.Tensor) -> bool:
    """Whether :func:`constant_values` has values for ``tensor``, without reading them (a weight's bytes, or FP8
    codes onnx-graphsurgeon would cast with a warning)."""
    if isinstance(tensor, gs.Constant):
        return True
    return len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant" and isinstance(
        tensor.inputs[0].attrs.get("value"), gs.Constant)


def dequantized(offset: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(q − z)·s`` from ``offset`` = q − z and ``scale`` (broadcast against it), in float64. An Inf scale is what
    a quantizer writes for a constant that held ±Inf (onnxruntime's range is its min and max): every finite value
    rounded to the zero point there, so a code at the zero point reads 0, not the NaN of 0·Inf that the source
    computes (its values are lost either way; the lift rules report it); other codes keep their ±Inf."""
    offset, scale = np.asarray(offset, np.float64), np.asarray(scale, np.float64)
    if not np.isinf(scale).any():  # (a NaN scale is refused where the model is loaded)
        return offset * scale
    with np.errstate(invalid="ignore"):
        return np.where(offset == 0, 0.0, offset * scale)


def infinite_scale(scale: np.ndarray, floats: np.ndarray, what: str) -> str | None:
    """The report's words for a constant dequantized with an Inf scale into ``floats`` (:func:`dequantized`),
    else None."""
    scale = np.asarray(scale)
    if not np.isinf(scale).any():
        return None
    return (f"{what} is dequantized with scale {float(scale[np.isinf(scale)].flat[0]):g} (the quantizer saw "
            f"±Inf in it): its {int(np.count_nonzero(np.asarray(floats) == 0))} code(s) at the zero point read "
            "0, not the NaN (0·Inf) the source computes; the values the quantizer lost are not recovered. "
            "Re-quantize with the node excluded, or convert the float model, to keep them")


def quantizer_zero_point(node: gs.Node) -> np.ndarray | None:
    """The zero point of a QuantizeLinear/DequantizeLinear, typed like its integer codes.

    Absent, it is 0 of the type ``output_dtype`` names (opset 21) for a QuantizeLinear,
    of the input's type for a DequantizeLinear, and uint8 otherwise. None: not a constant.
    """
    if len(node.inputs) > 2 and node.inputs[2].name:
        return constant_values(node.inputs[2])
    dtype = np.dtype(np.uint8)
    if node.op == "QuantizeLinear" and node.attrs.get("output_dtype"):
        import onnx

        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["output_dtype"])))
    elif node.op == "DequantizeLinear" and node.inputs[0].dtype is not None:
        dtype = node.inputs[0].dtype
        if isinstance(dtype, int):  # an ONNX type onnx-graphsurgeon keeps as its enum (float8, int4)
            import onnx

            dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
        dtype = np.dtype(dtype)
    return np.zeros((), dtype)


def _reshape(values: np.ndarray, shape: np.ndarray) -> np.ndarray:
    if values.size == 1:
        return values.reshape(())
    shape = [values.shape[i] if d == 0 and i < values.ndim else int(d) for i, d in enumerate(shape)]
    return values.reshape(shape)


_PASS_THROUGH = {"Identity", "Cast", "Expand"}


def monomial_of(tensor: gs.Tensor, depth: int = 0) -> Monomial | None:
    """Describe ``tensor`` as a Monomial, or None when it is not a product of scales."""
    if depth > 16:
        return None
    values = constant_values(tensor)
    if values is not None:
        if not np.issubdtype(values.dtype, np.floating):
            return None
        return Monomial(values.astype(np.float64))
    if len(tensor.inputs) != 1:
        return None  # a graph input: unknown
    node = tensor.inputs[0]
    if node.op == "DynamicQuantizeLinear" and len(node.outputs) > 1 and node.outputs[1] is tensor:
        return Monomial(np.ones((), np.float64), ((tensor.name, 1),))
    if node.op in ("Mul", "Div") and len(node.inputs) == 2:
        a, b = (monomial_of(t, depth + 1) for t in node.inputs)
        if a is None or b is None:
            return None
        return a * b if node.op == "Mul" else a / b
    if node.op in _PASS_THROUGH and node.inputs:
        return monomial_of(node.inputs[0], depth + 1)
    if node.op in ("Reshape", "Unsqueeze", "Squeeze") and node.inputs:
        inner = monomial_of(node.inputs[0], depth + 1)
        if inner is None:
            return None
        if inner.numeric.size == 1:
            return Monomial(inner.numeric.reshape(()), inner.symbols)
        return _reshape_like(node, inner)
    return None


def _reshape_like(node: gs.Node, inner: Monomial) -> Monomial | None:
    vals = inner.numeric
    if node.op == "Reshape":
        shape = constant_values(node.inputs[1]) if len(node.inputs) > 1 else None
        if shape is None:
            return None
        return Monomial(_reshape(vals, shape), inner.symbols)
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:
        axes = constant_values(node.inputs[1])
    if node.op == "Squeeze":
        return Monomial(np.squeeze(vals, axis=None if axes is None else tuple(int(a) for a in axes)),
                        inner.symbols)
    if axes is None:
        return None
    out_rank = vals.ndim + len(axes)
    return Monomial(np.expand_dims(vals, tuple(int(a) % out_rank for a in axes)), inner.symbols)
