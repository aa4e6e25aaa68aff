"""An ``If`` nested in a body whose condition tests only shapes takes the branch the calibration feeds take::

    Before (Silero VAD, torch's traced shape checks inside the sample-rate If):
      sr ─ Equal(16000) ─▶ If ─ then: … x ─ Shape ─ Gather(2) ─ Equal(1) ─ c ─▶ If(c) ─ then: Squeeze(x, 2)
                                                                                    └ else: Identity(x)
    After (every calibration feed that reached the inner If had c = true):
      sr ─ Equal(16000) ─▶ If ─ then: … x ─ Squeeze(x, 2) …          (the Constant condition inlined by
                                                                          prepare.constant_if when lifting)

TensorRT-RTX builds no conditional nested in another (even ``If(c1){If(c2){Relu}else{Neg}}`` fails: a Myelin check
or "Assertion tScope.getType() != ScopeType::kUNDEFINED failed ... graphScope.cpp"), while the same inner Ifs in the
main graph build: TensorRT resolves a shape test when it builds, since ranks are fixed then. A nested If whose
condition depends on nothing but ``Shape``/``Size`` outputs and constants (rank tests, "is this dimension 1") is
decided by the shapes of the inputs, not their values. Its condition is computed on every calibration feed (one
onnxruntime pass over the source, the conditions passed out by :func:`trt_bridge.conversion.bodies.expose`); where
every feed that reached it gives one value, the condition becomes that constant, and lifting inlines the branch. The
output then serves inputs of the shapes calibrated (which the profiles the engine is built for hold): the report
lists each one (``sanitized``: shape-if). An If no feed reached, or that feeds decide both ways, stays, and TensorRT's
build says what it says. Without calibration data nothing changes.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trt_bridge.calibrate.feeds import FeedSource
from trt_bridge.conversion.bodies import expose
from trt_bridge.ir.graphs import graphs
from trt_bridge.ir.names import name_nodes
from trt_bridge.prepare.change import Change
from trt_bridge.runtime.session import session

NAME = "shape-if"
log = logging.getLogger("trt_bridge.conversion")

#: where a condition's dependence on values stops: these ops read only their input's shape
SHAPE_OPS = frozenset({"Shape", "Size"})
#: ops a shape test computes with (their values follow from their inputs')
ARITHMETIC = frozenset({"Constant", "Identity", "Gather", "Equal", "Not", "Cast", "Squeeze", "Unsqueeze", "Add", "Sub",
                        "Mul", "Div", "Mod", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor",
                        "Concat", "Slice", "ReduceProd", "ReduceSum", "Min", "Max", "Abs", "Neg", "Reshape"})


def shape_tests(model: onnx.ModelProto) -> dict[str, str]:
    """Each If nested in a body whose condition depends only on shapes and constants: If's name → its condition."""
    found: dict[str, str] = {}

    def visit(graph: onnx.GraphProto, producers: dict, constants: set, depth: int) -> None:
        producers = {**producers, **{o: n for n in graph.node for o in n.output}}
        constants = constants | {t.name for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "If" and depth > 0 and node.input and _shape_only(node.input[0], producers, constants):
                found[node.name] = node.input[0]
            for attr in node.attribute:
                for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    visit(body, producers, constants, depth + 1)

    visit(model.graph, {}, set(), 0)
    return found


def _shape_only(name: str, producers: dict, constants: set) -> bool:
    stack, seen = [name], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen or tensor in constants or not tensor:
            continue
        seen.add(tensor)
        node = producers.get(tensor)
        if node is None or node.domain not in ("", "ai.onnx"):
            return False  # a graph input's value, or a custom op
        if node.op_type in SHAPE_OPS:
            continue
        if node.op_type not in ARITHMETIC:
            return False
        stack.extend(node.input)
    return True


def decided(model: onnx.ModelProto, feeds: FeedSource) -> dict[str, tuple[bool, int]]:
    """Each shape test :func:`shape_tests` finds that the feeds decide one way: If's name → (value, feeds reaching
    it)."""
    tests = shape_tests(model)
    if not tests:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    exposed = expose(probe, set(tests.values()), dict.fromkeys(tests.values(), onnx.TensorProto.BOOL))
    outputs = sorted({exposed[c] for c in tests.values() if c in exposed})
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_tensor_value_info(o, onnx.TensorProto.BOOL, None) for o in outputs)
    sess = session(probe)
    seen: dict[str, set[bool]] = {o: set() for o in outputs}
    count = dict.fromkeys(outputs, 0)
    for feed in feeds:
        for name, value in zip(outputs, sess.run(outputs, feed)):
            if np.asarray(value).size == 1:  # an If's branch not taken passes an empty tensor
                seen[name].add(bool(np.asarray(value).reshape(-1)[0]))
                count[name] += 1
    return {node: (next(iter(seen[exposed[c]])), count[exposed[c]]) for node, c in tests.items()
            if c in exposed and len(seen[exposed[c]]) == 1}


def specialise(model: onnx.ModelProto, feeds: FeedSource | None, where: str) -> list[Change]:
    """Make the condition of each nested shape test the feeds decide a constant (``model`` in place); the changes."""
    if feeds is None or not any(n.op_type == "If" for g in list(graphs(model.graph))[1:] for n in g.node):
        return []
    name_nodes(model)  # the Ifs are known by name
    values = decided(model, feeds)
    if not values:
        return []
    taken = {o for g in graphs(model.graph) for n in g.node for o in n.output}
    changes = []
    for graph in graphs(model.graph):
        for node in list(graph.node):
            if node.op_type != "If" or node.name not in values:
                continue
            value, reached = values[node.name]
            test = node.input[0]
            name = f"{test}/decided"
            while name in taken:
                name += "_"
            taken.add(name)
            constant = helper.make_node("Constant", [], [name], f"{node.name}/decided",
                                        value=numpy_helper.from_array(np.array(value), name))
            graph.node.insert(list(graph.node).index(node), constant)
            node.input[0] = name
            branch = "then" if value else "else"
            changes.append(Change(NAME, node.name, f"If on a shape test ('{test}') nested in a "
                                  f"body: all {reached} calibration feed(s) reaching it take its {branch} branch, so "
                                  "it is inlined (TensorRT builds no nested conditional); the output serves inputs of "
                                  "the calibrated shapes"))
            log.warning("%s: %s", where, changes[-1].what)
    return changes
