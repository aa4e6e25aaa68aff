"""Broadcast-shape validation: find the nodes whose input shapes cannot broadcast.

ONNX shape inference (non-strict, with data propagation so that Shape/Reshape arithmetic
carries through) runs once per distinct set of input shapes on a skeleton of the model
(:func:`trt_bridge.ir.model.skeleton`: large weights become graph inputs of the same shape, so
nothing big is copied). Then every broadcasting node whose input shapes are known is checked:

    a[2, 1] ──┐
              Mul ──  dims 2 and 3 at output axis 0: neither is 1 → a BroadcastConflict
    b[3, 160] ┘

Only dimensions that are integers on both sides are compared; a symbolic or unknown
dimension never conflicts. A node on which onnx's own inference fails keeps no output shape
(non-strict mode), but its inputs' shapes are known, so the node itself is still reported.

Checked (default domain): multidirectional broadcasting of Add, Sub, Mul, Div, Pow, Mod,
Where, Max, Min, Mean, Sum, Equal, Less, LessOrEqual, Greater, GreaterOrEqual, And, Or, Xor,
BitShift, BitwiseAnd/Or/Xor, the batch dimensions of MatMul, Expand (its input against the
value of its ``shape`` input, when that is an initializer or a Constant), and PRelu
(unidirectional: slope to X). Nodes inside subgraphs (If/Loop/Scan bodies) and model-local
functions are not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.deferred import tensor_array
from trt_bridge.ir.types import skeleton

log = logging.getLogger("trt_bridge.ir.shapes")

Dim = int | str | None  # int: known; str: symbolic; None: unknown
Shape = tuple[Dim, ...]

#: Multidirectional-broadcasting ops → the opset from which they broadcast numpy-style
#: (before it, Add & co. broadcast by an ``axis`` attribute, the variadic ones not at all).
MULTIDIRECTIONAL: dict[str, int] = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "And", "Or", "Xor",
                     "MatMul"), 7),
    **dict.fromkeys(("Max", "Min", "Mean", "Sum", "Expand"), 8),
    "Where": 9, "Mod": 10, "BitShift": 11, "LessOrEqual": 12, "GreaterOrEqual": 12,
    **dict.fromkeys(("BitwiseAnd", "BitwiseOr", "BitwiseXor"), 18),
}
UNIDIRECTIONAL: dict[str, int] = {"PRelu": 7}  # slope (input 1) broadcasts to X (input 0)


@dataclass(frozen=True)
class BroadcastConflict:
    """Two inputs of one node whose shapes cannot broadcast.

    ``axis`` indexes the broadcast result of the node's inputs (of known rank), counted from the
    left as in its output shape; ``dims`` are the two disagreeing dimensions at that axis, in the
    order of ``inputs``. For Expand the second "shape" is the value of its ``shape`` input; for
    MatMul only the batch dimensions (all but the last two) are compared. ``reaches_from`` are
    the model's inputs whose values flow into the node, sorted.
    """

    node: str
    op: str
    output: str  # the node's first output: names the node when it has no name
    inputs: tuple[str, str]
    shapes: tuple[Shape, Shape]
    axis: int
    dims: tuple[int, int]
    reaches_from: tuple[str, ...]

    @property
    def where(self) -> str:
        """``Mul '/time_proj/Mul'``, or ``Mul (output 'y')`` for a node without a name."""
        return f"{self.op} '{self.node}'" if self.node else f"{self.op} (output '{self.output}')"

    def message(self) -> str:
        """One line: the node, both shapes with their tensors, and the disagreeing dimensions."""
        second = f"value of '{self.inputs[1]}'" if self.op == "Expand" else f"'{self.inputs[1]}'"
        return (f"{self.where}: shapes {shape_text(self.shapes[0])} ('{self.inputs[0]}') and "
                f"{shape_text(self.shapes[1])} ({second}) cannot broadcast (dimension {self.dims[0]} vs "
                f"{self.dims[1]} at output axis {self.axis})")

    def key(self) -> tuple[str, tuple[str, str]]:
        """Identifies the node and pair across runs with different input shapes."""
        return self.output, self.inputs


def shape_text(shape: Shape) -> str:
    """``[N, 160]``; an unknown dimension shows as ``?``."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


class BroadcastChecker:
    """Checks one model's broadcasts for any number of input-shape sets.

    Holds only the model's skeleton (no large weights) and caches the conflicts per distinct
    input-shape signature, so each signature costs one shape-inference call.
    """

    def __init__(self, model: onnx.ModelProto):

        self._skeleton = skeleton(model)
        inits = {i.name for i in model.graph.initializer}
        real = [vi for vi in model.graph.input if vi.name not in inits]
        self._real_inputs = frozenset(vi.name for vi in real)
        #: The declared shape of each model input (None: no shape declared, unknown rank).
        self.inputs: dict[str, Shape | None] = {vi.name: _shape_of(vi.type) for vi in real}
        self._opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)
        self._cache: dict[tuple, list[BroadcastConflict]] = {}

    def conflicts(self, input_shapes: Mapping[str, Iterable[int]] | None = None) -> list[BroadcastConflict]:
        """The conflicts, in graph order, with the graph inputs' declared dims replaced by ``input_shapes``."""
        overrides = self._overrides(input_shapes or {})
        signature = tuple(sorted(overrides.items()))
        if signature not in self._cache:
            self._cache[signature] = self._find(overrides)
        return list(self._cache[signature])

    def new_conflicts(self, input_shapes: Mapping[str, Iterable[int]]) -> list[BroadcastConflict]:
        """The conflicts ``input_shapes`` cause that the model's declared shapes do not already have."""
        declared = {c.key() for c in self.conflicts()}
        return [c for c in self.conflicts(input_shapes) if c.key() not in declared]

    def _overrides(self, input_shapes: Mapping[str, Iterable[int]]) -> dict[str, tuple[int, ...]]:
        overrides = {}
        for name, shape in input_shapes.items():
            if name not in self._real_inputs:
                raise TrtBridgeError(f"'{name}' is not an input of the model; its inputs are: "
                                     f"{', '.join(sorted(self._real_inputs))}. Give shapes for those only.")
            shape = tuple(int(d) for d in shape)
            if shape != self.inputs.get(name):  # the same static shape as declared changes nothing
                overrides[name] = shape
        return overrides

    def _find(self, overrides: dict[str, tuple[int, ...]]) -> list[BroadcastConflict]:
        model = onnx.ModelProto()
        model.CopyFrom(self._skeleton)  # cheap: the skeleton has no large weights
        graph = model.graph
        if overrides:
            for vi in graph.input:
                if vi.name in overrides:
                    shape = vi.type.tensor_type.shape
                    shape.Clear()
                    for d in overrides[vi.name]:
                        shape.dim.add().dim_value = d
            # Shapes recorded downstream of a changed input (by an earlier inference or the
            # exporter) would contradict the new ones: let inference recompute them.
            stale = _downstream(graph, set(overrides))
            kept = [vi for vi in graph.value_info if vi.name not in stale]
            del graph.value_info[:]
            graph.value_info.extend(kept)
            for vi in graph.output:
                if vi.name in stale and vi.type.HasField("tensor_type"):
                    vi.type.tensor_type.ClearField("shape")
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        except Exception as exc:  # non-strict mode rarely raises; check with what the graph declares
            log.debug("shape inference failed (%s); checking broadcasts with the declared shapes only", exc)
            inferred = model
        return self._check(inferred.graph)

    def _check(self, graph: onnx.GraphProto) -> list[BroadcastConflict]:
        shapes: dict[str, Shape] = {}
        for vi in (*graph.input, *graph.value_info, *graph.output):
            shape = _shape_of(vi.type)
            if shape is not None:
                shapes[vi.name] = shape
        for init in graph.initializer:
            shapes[init.name] = tuple(int(d) for d in init.dims)
        values = _constant_values(graph)
        found = []
        for node in graph.node:
            conflict = self._check_node(node, shapes, values)
            if conflict is not None:
                found.append(conflict)
        if found:
            producers = {out: node for node in graph.node for out in node.output if out}
            found = [replace(c, reaches_from=_reaching_inputs(producers[c.output], producers, self._real_inputs))
                     if c.output in producers else c for c in found]
        return found

    def _check_node(self, node: onnx.NodeProto, shapes: dict[str, Shape],
                    values: dict[str, np.ndarray]) -> BroadcastConflict | None:
        if node.domain not in ("", "ai.onnx"):
            return None
        op = node.op_type
        if op in UNIDIRECTIONAL and self._opset >= UNIDIRECTIONAL[op] and len(node.input) >= 2:
            x, slope = node.input[0], node.input[1]
            if x in shapes and slope in shapes:
                return _unidirectional(node, (slope, shapes[slope]), (x, shapes[x]))
            return None
        if op not in MULTIDIRECTIONAL or self._opset < MULTIDIRECTIONAL[op]:
            return None
        if op == "Expand":
            if len(node.input) < 2 or node.input[0] not in shapes or node.input[1] not in values:
                return None
            target = tuple(int(v) for v in values[node.input[1]].reshape(-1))
            return _multidirectional(node, [(node.input[0], shapes[node.input[0]]), (node.input[1], target)])
        operands = [(name, shapes[name]) for name in node.input if name and name in shapes]
        if op == "MatMul":
            batch = [(name, shape[:-2]) for name, shape in operands if len(shape) > 2]
            conflict = _multidirectional(node, batch)
            if conflict is not None:  # show the full shapes, not just the batch dimensions
                full = dict(operands)
                conflict = replace(conflict, shapes=(full[conflict.inputs[0]], full[conflict.inputs[1]]))
            return conflict
        return _multidirectional(node, operands)


def broadcast_conflicts(model: onnx.ModelProto,
                        input_shapes: Mapping[str, Iterable[int]] | None = None) -> list[BroadcastConflict]:
    """The broadcasting nodes of ``model`` whose input shapes cannot broadcast, in graph order.

    ``input_shapes`` replaces the declared shapes of the named graph inputs (e.g. a calibration
    feed's array shapes); without it the model's declared shapes are checked. Several shape sets
    for one model: use a :class:`BroadcastChecker` (it keeps the skeleton and caches results).
    """
    return BroadcastChecker(model).conflicts(input_shapes)


def feed_shape_conflicts(model: onnx.ModelProto,
                         feed_shapes: Mapping[str, Iterable[int]]) -> list[BroadcastConflict]:
    """The conflicts that ``feed_shapes`` cause and the model's declared shapes do not already have."""
    return BroadcastChecker(model).new_conflicts(feed_shapes)


# ---------------------------------------------------------------- helpers


def _shape_of(type_proto: onnx.TypeProto) -> Shape | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in type_proto.tensor_type.shape.dim)


def _multidirectional(node: onnx.NodeProto, operands: list[tuple[str, Shape]]) -> BroadcastConflict | None:
    """The first disagreeing pair, scanning the output axes left to right."""
    if len(operands) < 2:
        return None
    rank = max(len(shape) for _, shape in operands)
    for axis in range(rank):
        k = rank - axis  # position from the right, 1-based
        for i, (name_a, a) in enumerate(operands):
            for name_b, b in operands[i + 1:]:
                if len(a) < k or len(b) < k:
                    continue
                da, db = a[-k], b[-k]
                if isinstance(da, int) and isinstance(db, int) and da != db and 1 not in (da, db):
                    return _conflict(node, (name_a, name_b), (a, b), axis, (da, db))
    return None


def _unidirectional(node: onnx.NodeProto, source: tuple[str, Shape], target: tuple[str, Shape]
                    ) -> BroadcastConflict | None:
    """``source`` must broadcast to ``target``'s shape: each of its dims is 1 or equal to the target's."""
    (name_s, s), (name_t, t) = source, target
    for k in range(min(len(s), len(t)), 0, -1):
        ds, dt = s[-k], t[-k]
        if isinstance(ds, int) and isinstance(dt, int) and ds != 1 and ds != dt:
            return _conflict(node, (name_t, name_s), (t, s), len(t) - k, (dt, ds))
    return None


def _conflict(node: onnx.NodeProto, inputs: tuple[str, str], shapes: tuple[Shape, Shape], axis: int,
              dims: tuple[int, int]) -> BroadcastConflict:
    return BroadcastConflict(node.name, node.op_type, node.output[0] if node.output else "", inputs, shapes,
                             axis, dims, ())


def _constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Small integer tensors whose values are in the graph: initializers and Constant nodes."""
    from onnx import numpy_helper

    values = {}
    for init in graph.initializer:
        if init.data_type == onnx.TensorProto.INT64 and len(init.dims) <= 1:
            values[init.name] = tensor_array(init)
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.output:
            continue
        for attr in node.attribute:
            if attr.name == "value" and attr.t.data_type == onnx.TensorProto.INT64 and len(attr.t.dims) <= 1:
                values[node.output[0]] = numpy_helper.to_array(attr.t)
            elif attr.name == "value_ints":
                values[node.output[0]] = np.array(list(attr.ints), dtype=np.int64)
    return values


def _node_inputs(node: onnx.NodeProto) -> list[str]:
    """The node's inputs, with the outer-scope names its subgraphs use."""
    names = [name for name in node.input if name]
    for attr in node.attribute:
        for sub in (*([attr.g] if attr.type == onnx.AttributeProto.GRAPH else []), *attr.graphs):
            for inner in sub.node:
                names.extend(_node_inputs(inner))
    return names


def _downstream(graph: onnx.GraphProto, sources: set[str]) -> set[str]:
    """Every tensor computed (directly or not) from ``sources``."""
    reached = set(sources)
    for node in graph.node:  # graph order is topological
        if any(name in reached for name in _node_inputs(node)):
            reached.update(out for out in node.output if out)
    return reached


def _reaching_inputs(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto],
                     inputs: frozenset[str]) -> tuple[str, ...]:
    """The graph inputs (of ``inputs``) whose values flow into ``node``, sorted."""
    found, seen = set(), set()
    stack = _node_inputs(node)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(name)
        producer = producers.get(name)
        if producer is not None:
            stack.extend(_node_inputs(producer))
    return tuple(sorted(found))
