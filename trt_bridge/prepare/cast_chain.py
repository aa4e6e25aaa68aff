"""Cast chains: a Cast to the type its input has goes; Cast(Cast(x, A), B) reads x when exact.

Before:                                     After:
  x:f16 ─ Cast(f32) ─ Cast(f16) ─ Relu        x:f16 ─ Relu
  x:f16 ─ Cast(f32) ─ Cast(bf16) ─ ...        x:f16 ─ Cast(bf16) ─ ...
  x:f32 ─ Cast(f32) ─ ...                     x:f32 ─ ...
  x:f32 ─ Cast(f16) ─ Cast(f32) ─ ...         unchanged: f16 rounds x

The outer Cast reads x instead of the inner Cast's output only when A holds every
value of x's type S exactly (``HOLDS_EVERY_VALUE_OF``): then Cast(x, A) is x itself as
an A, and Cast(., B) of it equals Cast(x, B) — every ONNX Cast depends on the value
only (rounding to nearest even, truncation toward zero, nonzero → true). The inner
Cast stays while others read it. Identity nodes between the two are looked through.
A type that is unknown (no dtype, no Cast writing it) or outside the table folds nothing.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto as T

from trt_bridge.prepare.change import Change
from trt_bridge.prepare.identity import bypass, is_graph_output, output_note
from trt_bridge.prepare.types import type_name

_INTEGERS = (T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32, T.INT64, T.UINT64)
_FLOATS = (T.FLOAT16, T.BFLOAT16, T.FLOAT, T.DOUBLE)
_FLOAT8 = (T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ)

#: S → the types A that hold every value of S exactly (Cast S→A→S is the identity).
#: Integers fit a float with a p-bit significand while |n| ≤ 2^p: float16 p=11 (±2048),
#: bfloat16 p=8 (±256), float32 p=24, float64 p=53. Floats widen only to types with more
#: significand bits and a wider exponent range (no float16 ⇄ bfloat16). The 8-bit floats
#: (NaN, ±inf where they have them, subnormals) all lie in float16 and bfloat16.
#: Left out on purpose (no fold, never a wrong one): 4-bit types, strings, complex.
HOLDS_EVERY_VALUE_OF: dict[int, frozenset[int]] = {
    T.BOOL: frozenset(_INTEGERS + _FLOATS + _FLOAT8),
    T.INT8: frozenset((T.INT16, T.INT32, T.INT64) + _FLOATS),
    T.UINT8: frozenset((T.INT16, T.UINT16, T.INT32, T.UINT32, T.INT64, T.UINT64) + _FLOATS),
    T.INT16: frozenset((T.INT32, T.INT64, T.FLOAT, T.DOUBLE)),
    T.UINT16: frozenset((T.INT32, T.UINT32, T.INT64, T.UINT64, T.FLOAT, T.DOUBLE)),
    T.INT32: frozenset((T.INT64, T.DOUBLE)),
    T.UINT32: frozenset((T.INT64, T.UINT64, T.DOUBLE)),
    T.INT64: frozenset(),
    T.UINT64: frozenset(),
    T.FLOAT16: frozenset((T.FLOAT, T.DOUBLE)),
    T.BFLOAT16: frozenset((T.FLOAT, T.DOUBLE)),
    T.FLOAT: frozenset((T.DOUBLE,)),
    T.DOUBLE: frozenset(),
    **{f8: frozenset(_FLOATS) for f8 in _FLOAT8},
}


def onnx_type(tensor: gs.Tensor) -> int | None:
    """The ONNX element type of ``tensor``: from its dtype (numpy, ml_dtypes or an ONNX enum,
    as onnx-graphsurgeon keeps bfloat16), else from the Cast that writes it; None if unknown."""
    dtype = tensor.dtype  # never ``.values``: that would convert a bfloat16 constant for good
    if isinstance(dtype, (int, np.integer)):
        return int(dtype)
    if dtype is not None:
        try:
            return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        except (KeyError, TypeError, ValueError):
            return None
    producer = tensor.inputs[0] if tensor.inputs else None
    return _cast_to(producer) if producer is not None and _is_cast(producer) else None


def _is_cast(node: gs.Node) -> bool:
    return node.op == "Cast" and (node.domain or "") in ("", "ai.onnx") and len(node.inputs) == 1


def _cast_to(node: gs.Node) -> int | None:
    to = node.attrs.get("to")
    return int(to) if isinstance(to, (int, np.integer)) else None


def _through_identities(tensor: gs.Tensor) -> gs.Tensor:
    while len(tensor.inputs) == 1 and tensor.inputs[0].op == "Identity" and len(tensor.inputs[0].inputs) == 1:
        tensor = tensor.inputs[0].inputs[0]
    return tensor


def _inner_cast(tensor: gs.Tensor) -> gs.Node | None:
    tensor = _through_identities(tensor)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    return producer if producer is not None and _is_cast(producer) else None


class FoldCastChains:
    name = "fold-cast-chains"

    def apply(self, graph: gs.Graph) -> list[Change]:
        changes = []
        for node in [n for n in graph.nodes if _is_cast(n) and len(n.outputs) == 1]:
            to, inner, chain = _cast_to(node), _inner_cast(node.inputs[0]), None
            if to is not None and inner is not None:
                x = inner.inputs[0]
                source, middle = onnx_type(x), _cast_to(inner)
                if source is not None and middle in HOLDS_EVERY_VALUE_OF.get(source, ()):
                    node.inputs[0] = x
                    chain = (f"Cast {type_name(source)}→{type_name(middle)}→{type_name(to)}",
                             f"{type_name(middle)} holds every {type_name(source)} value", type_name(source))
            what = self._drop_if_same_type(graph, node, to)
            if what is not None and chain is not None:
                what = f"removed the round trip {chain[0]}: {chain[1]}{what}"
            elif what is not None:
                what = f"removed Cast to {type_name(to)}: its input is already {type_name(to)}{what}"
            elif chain is not None:
                what = f"folded {chain[0]} into Cast {chain[2]}→{type_name(to)}: {chain[1]}"
            if what is not None:
                changes.append(Change(self.name, node.name, what))
        return changes

    @staticmethod
    def _drop_if_same_type(graph: gs.Graph, node: gs.Node, to: int | None) -> str | None:
        """Bypass ``node`` when it casts to the type its input has; return the note on a moved
        graph output ('' if none), or None when it stays."""
        source, output = node.inputs[0], node.outputs[0]
        if to is None or onnx_type(source) != to:
            return None
        at_output = is_graph_output(graph, output)
        if bypass(graph, source, output) is not None:
            return None
        return output_note(at_output, source)
