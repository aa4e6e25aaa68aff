"""One float type per Q/DQ pair, and no Cast between a DequantizeLinear and the op it feeds.

A tool that keeps some layers in float32 and the rest in float16 (ModelOpt's FP8 export with
``--high_precision_dtype fp16`` and ``--op_types_to_exclude_fp16``, or a layer its fp16 conversion keeps in
float32) writes the change of type between the DequantizeLinear and the layer, and may give the Q and the DQ of
one pair scales of different types. Both are valid ONNX that onnxruntime runs, but the lift rules read a DQ's
consumer as the quantized op (a Cast is not one: its layer lost its quantization) and a pair as one float tensor
(the Q's input wired into a consumer that expects the DQ's type: onnxruntime's "Type parameter (T) of Optype
(MatMul) bound to different types (tensor(float16) and tensor(float))").

Before (widening Cast after a DQ)::

    w:fp8 ── DQ(s:fp16) ── w16 ── Cast(float) ── MatMul:float

After (the DQ computes in the Cast's type; its scale cast, exactly: float32 holds every float16)::

    w:fp8 ── DQ(s:float) ── MatMul:float

Before (a pair whose Q and DQ scales differ in type, as the rule above leaves ``x16 ─ Q(s16) ─ DQ(s16) ─ Cast``)::

    x:fp16 ── Q(s:fp16) ── DQ(s:float) ── MatMul:float

After (the type changes before the pair; a constant ``x`` is cast in place)::

    x:fp16 ── Cast(float) ── Q(s:float) ── DQ(s:float) ── MatMul:float

A pair that narrows (a float32 Q, a float16 DQ) is cast to float16 before its Q as well (the pair stays
quantized; rounding the input to float16 first moves a code by at most one step, and only where the float32
value lay within float16's rounding of a midpoint between two codes). The DQ the Cast
read stays for its other consumers (a float16 Concat beside a float32 Conv). Only widening Casts (float16 or
bfloat16 to float32) move into a DQ: a DQ computes ``(q - z) · s`` once, and in the wider type that is the
value the Cast would have given, without float16's rounding of the product (what TensorRT computes anyway).
Scales must be constants; other pairs are left as they are.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto as T
from onnx.helper import tensor_dtype_to_np_dtype as numpy_dtype

from trt_bridge.prepare.cast_chain import HOLDS_EVERY_VALUE_OF, onnx_type
from trt_bridge.prepare.change import Change
from trt_bridge.prepare.types import type_name

log = logging.getLogger("trt_bridge.prepare")

#: the float types a Q/DQ pair computes in (its scale's type)
_PAIR_FLOATS = (T.FLOAT16, T.BFLOAT16, T.FLOAT)


def _standard(node: gs.Node, op: str) -> bool:
    return node.op == op and (node.domain or "") in ("", "ai.onnx")


def constant_array(tensor: gs.Tensor) -> np.ndarray | None:
    """The values of an initializer or of a Constant node's output; None for anything computed."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is not None and _standard(producer, "Constant") and isinstance(producer.attrs.get("value"),
                                                                                gs.Constant):
        return np.asarray(producer.attrs["value"].values)
    return None


def _scale_type(node: gs.Node) -> int | None:
    """The float type a Q or DQ computes in (its constant scale's), None when the scale is not a constant."""
    if len(node.inputs) < 2 or constant_array(node.inputs[1]) is None:
        return None
    found = onnx_type(node.inputs[1]) if isinstance(node.inputs[1], gs.Constant) else \
        onnx_type(node.inputs[1].inputs[0].attrs["value"])
    return found if found in _PAIR_FLOATS else None


def _retyped(graph: gs.Graph, tensor: gs.Tensor, to: int, cache: dict) -> gs.Tensor:
    """``tensor`` as type ``to``: a new constant for a constant, else a Cast's output (one per tensor and
    type)."""
    key = (tensor.name, to)
    if key in cache:
        return cache[key]
    values = constant_array(tensor)
    if values is not None:
        made: gs.Tensor = gs.Constant(graph_unique(graph, f"{tensor.name}_{type_name(to)}"),
                                      values.astype(numpy_dtype(to)))
    else:
        made = gs.Variable(graph_unique(graph, f"{tensor.name}_{type_name(to)}"), dtype=numpy_dtype(to),
                           shape=tensor.shape)
        graph.nodes.append(gs.Node("Cast", graph_unique(graph, f"{tensor.name}_to_{type_name(to)}"),
                                   {"to": to}, [tensor], [made]))
    cache[key] = made
    return made


def graph_unique(graph: gs.Graph, base: str) -> str:
    """``base``, or ``base_N``: a name no tensor or node of ``graph`` has."""
    taken = set(graph.tensors()) | {n.name for n in graph.nodes}
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def _dequantize(graph: gs.Graph, dq: gs.Node, to: int, output: gs.Tensor, cache: dict) -> gs.Node:
    """A copy of ``dq`` computing in type ``to`` (its scale retyped), writing ``output``."""
    inputs = [dq.inputs[0], _retyped(graph, dq.inputs[1], to, cache), *dq.inputs[2:]]
    node = gs.Node("DequantizeLinear", graph_unique(graph, f"{dq.name}_{type_name(to)}"), dict(dq.attrs),
                   inputs, [output])
    graph.nodes.append(node)
    return node


def _match_cast(cast: gs.Node) -> tuple[gs.Node, int] | str:
    """(the DQ the Cast reads, the type it widens to), or why this Cast stays."""
    if not _standard(cast, "Cast") or len(cast.inputs) != 1 or len(cast.outputs) != 1:
        return "not a Cast"
    producer = cast.inputs[0].inputs[0] if len(cast.inputs[0].inputs) == 1 else None
    if producer is None or not _standard(producer, "DequantizeLinear"):
        return "its input is not a DequantizeLinear's output"
    source, to = _scale_type(producer), cast.attrs.get("to")
    if source is None:
        return "the DequantizeLinear's scale is not a float constant"
    if to not in _PAIR_FLOATS or to == source or to not in HOLDS_EVERY_VALUE_OF.get(source, ()):
        return f"Cast {type_name(source)}→{type_name(to) if isinstance(to, int) else to} does not widen a float"
    return producer, int(to)


def _match_pair(dq: gs.Node) -> tuple[gs.Node, int, int] | str:
    """(the Q feeding ``dq``, the Q's type, the DQ's type) when they differ, or why the pair stays."""
    if not _standard(dq, "DequantizeLinear"):
        return "not a DequantizeLinear"
    q = dq.inputs[0].inputs[0] if len(dq.inputs[0].inputs) == 1 else None
    if q is None or not _standard(q, "QuantizeLinear"):
        return "no QuantizeLinear feeds it"
    mine, theirs = _scale_type(dq), _scale_type(q)
    if mine is None or theirs is None:
        return "a scale is not a float constant"
    if mine == theirs:
        return "one type already"
    if mine not in HOLDS_EVERY_VALUE_OF.get(theirs, ()) and theirs not in HOLDS_EVERY_VALUE_OF.get(mine, ()):
        return f"{type_name(theirs)} and {type_name(mine)}: neither holds the other"
    return q, theirs, mine


class AgreeQDQFloatTypes:
    name = "qdq-float-types"

    def apply(self, graph: gs.Graph) -> list[Change]:
        changes, cache = [], {}
        for cast in list(graph.nodes):
            found = _match_cast(cast)
            if isinstance(found, str):
                continue
            dq, to = found
            output = cast.outputs[0]
            cast.outputs.clear()
            made = _dequantize(graph, dq, to, output, cache)
            changes.append(Change(self.name, cast.name, f"DequantizeLinear '{dq.name}' computes in "
                                  f"{type_name(to)} ('{made.name}'): the Cast after it widened its output"))
        for dq in list(graph.nodes):
            found = _match_pair(dq)
            if isinstance(found, str):
                continue
            q, theirs, mine = found
            x = constant_array(q.inputs[0])
            if x is not None and not np.isfinite(x.astype(numpy_dtype(mine))).all():
                log.info("Q/DQ '%s'/'%s' left in %s/%s: constant '%s' overflows %s", q.name, dq.name,
                         type_name(theirs), type_name(mine), q.inputs[0].name, type_name(mine))
                continue
            inputs = [_retyped(graph, q.inputs[0], mine, cache), _retyped(graph, q.inputs[1], mine, cache),
                      *q.inputs[2:]]
            codes = gs.Variable(graph_unique(graph, f"{q.outputs[0].name}_{type_name(mine)}"),
                                dtype=q.outputs[0].dtype, shape=q.outputs[0].shape)
            graph.nodes.append(gs.Node("QuantizeLinear", graph_unique(graph, f"{q.name}_{type_name(mine)}"),
                                       dict(q.attrs), inputs, [codes]))
            dq.inputs[0] = codes
            what = f"its input cast to {type_name(mine)} before the pair"
            changes.append(Change(self.name, dq.name, f"QuantizeLinear '{q.name}' ({type_name(theirs)}) and "
                                  f"DequantizeLinear '{dq.name}' ({type_name(mine)}) made one type: {what}"))
        return changes
