"""One lift rule called directly on a small graph, for the rule tests (``tests/lift/test_<rule>.py``).

:func:`lifted` runs ``match`` then ``rewrite`` on one node (after the rules the pattern needs lifted first,
as ``lift()`` runs them), removes the dead nodes as ``lift()`` does and exports the graph;
:func:`declined` checks that ``match`` declined a node and changed nothing: not the graph, not the
context, not one name taken. :func:`outputs` runs a model in onnxruntime on feeds, and
:func:`with_activation_qdq` puts the annotated activations' symmetric int8 Q/DQ into a lifted model, to
compare it with a source that quantized them.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.annotations import Annotations
from trt_bridge.ir.names import NameAllocator
from trt_bridge.lift.base import LiftContext, LiftRule
from trt_bridge.runtime.session import session

#: (rule, node name): a rule to match and rewrite on the node of that name
Step = tuple[LiftRule, str]


class _CountedNames(NameAllocator):
    """A name allocator that remembers what it handed out."""

    def __init__(self, graph: gs.Graph):
        super().__init__(graph)
        self.handed_out: list[str] = []

    def __call__(self, base: str) -> str:
        name = super().__call__(base)
        self.handed_out.append(name)
        return name


def _node(graph: gs.Graph, name: str) -> gs.Node:
    return next(n for n in graph.nodes if n.name == name)


def _apply(ctx: LiftContext, steps: list[Step]) -> None:
    for rule, name in steps:
        found = rule.match(ctx, _node(ctx.graph, name))
        assert not isinstance(found, str), f"rule {rule.name} declined '{name}': {found!r}"
        rule.rewrite(ctx, found)


def lifted(model: onnx.ModelProto, *steps: Step) -> tuple[onnx.ModelProto, LiftContext]:
    """``model`` with each rule of ``steps`` matched and rewritten on its node, in order; dead nodes removed."""
    graph = gs.import_onnx(model)
    ctx = LiftContext(graph)
    _apply(ctx, list(steps))
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    return gs.export_onnx(graph), ctx


def declined(model: onnx.ModelProto, rule: LiftRule, name: str, after: tuple[Step, ...] = ()) -> str:
    """Why ``rule`` declines the node ``name`` of ``model`` (once the ``after`` steps are lifted), having
    checked that its ``match`` left the graph and the context as they were."""
    graph = gs.import_onnx(model)
    names = _CountedNames(graph)
    ctx = LiftContext(graph, names=names)
    _apply(ctx, list(after))
    before = gs.export_onnx(graph).SerializeToString()
    taken, annotations, constants = len(names.handed_out), _comparable(ctx.annotations), len(ctx.constants)
    reason = rule.match(ctx, _node(graph, name))
    assert isinstance(reason, str), f"rule {rule.name} matched '{name}'"
    assert gs.export_onnx(graph).SerializeToString() == before, "match changed the graph"
    assert len(names.handed_out) == taken, f"match took names: {names.handed_out[taken:]}"
    assert _comparable(ctx.annotations) == annotations, "match changed the annotations"
    assert len(ctx.constants) == constants, "match made a constant"
    assert not ctx.approximated and not ctx.fired and not ctx.declined
    return reason


def _comparable(annotations: Annotations) -> tuple:
    weights = {k: (w.sites, w.axis, w.origin, w.source, None if w.codes is None else w.codes.tobytes())
               for k, w in annotations.weights.items()}
    return copy.deepcopy(annotations.activations), copy.deepcopy(weights)


def ops_left(model: onnx.ModelProto) -> list[str]:
    """The op types of ``model``'s nodes, sorted (repeats kept)."""
    return sorted(n.op_type for n in model.graph.node)


def run_outputs(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every output of ``model`` on each feed, in onnxruntime (Q/DQ as float arithmetic)."""
    sess = session(model)
    return [sess.run(None, feed) for feed in feeds]


def assert_same_outputs(source: onnx.ModelProto, lifted_model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]],
                        rtol: float = 1e-5, atol: float = 1e-5) -> None:
    for want, got in zip(run_outputs(source, feeds), run_outputs(lifted_model, feeds)):
        assert len(want) == len(got)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def with_activation_qdq(model: onnx.ModelProto, annotations: Annotations) -> onnx.ModelProto:
    """``model`` with a symmetric int8 QuantizeLinear → DequantizeLinear (the annotated scale, zero point 0) on
    every site of every annotated activation that has a scale: what lowering writes, before placement drops
    any site."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    nodes = list(graph.node)
    for spec in annotations.activations.values():
        if spec.scale is None:
            continue
        t = spec.tensor
        graph.initializer.extend([numpy_helper.from_array(np.array(spec.scale, np.float32), f"{t}/qdq_scale"),
                                  numpy_helper.from_array(np.array(0, np.int8), f"{t}/qdq_zero")])
        pair = [helper.make_node("QuantizeLinear", [t, f"{t}/qdq_scale", f"{t}/qdq_zero"], [f"{t}/q"], f"{t}/q"),
                helper.make_node("DequantizeLinear", [f"{t}/q", f"{t}/qdq_scale", f"{t}/qdq_zero"], [f"{t}/dq"],
                                 f"{t}/dq")]
        producer = next((i for i, n in enumerate(nodes) if t in n.output), -1)
        nodes[producer + 1:producer + 1] = pair
        for site in spec.sites:
            node = next(n for n in nodes if n.name == site.node)
            assert node.input[site.index] == t
            node.input[site.index] = f"{t}/dq"
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def dynamic_grid_feed(rng: np.random.Generator, shape: tuple[int, ...], step: float = 0.02) -> np.ndarray:
    """Values that ``DynamicQuantizeLinear`` quantizes without rounding: (q − 128)·step for uint8 codes q that
    reach 0 and 255, so its scale is ``step`` and its zero point 128."""
    q = rng.integers(0, 256, size=shape)
    q.reshape(-1)[:2] = (0, 255)
    return ((q - 128) * step).astype(np.float32)


def build_model(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray], opset: int = 17,
          microsoft: bool = False, value_info: list | None = None, domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    """A model of ``nodes`` (with the com.microsoft domain where ``microsoft``, and ``domains``), checked by
    onnx where every op is a standard one."""
    graph = helper.make_graph(nodes, "rule", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
                              value_info=value_info or [])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if microsoft else [])
    imports += [helper.make_opsetid(d, 1) for d in domains]
    built = helper.make_model(graph, opset_imports=imports)
    if not microsoft and not domains:
        onnx.checker.check_model(built, full_check=True)
    return built


def tensor_info(name: str, shape: list, elem: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)
