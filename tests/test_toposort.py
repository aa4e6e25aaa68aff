"""ir/toposort.py: onnx-graphsurgeon's topological order, node for node, at a fraction of its cost; a cycle is refused
with the node named; a graph with a subgraph is left to onnx-graphsurgeon."""

from __future__ import annotations

import random

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from helpers import SHARED_MODELS
from onnx import TensorProto, helper

from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.ir.toposort import toposort
from trt_bridge.samples import conv_net


def _orders(graph: gs.Graph, seed: int) -> tuple[list[str], list[str]]:
    """(onnx-graphsurgeon's order, ours) of ``graph`` with its nodes shuffled by ``seed``."""
    random.Random(seed).shuffle(graph.nodes)
    theirs = graph.copy()
    theirs.toposort()
    ours = toposort(graph.copy())
    return [n.name for n in theirs.nodes], [n.name for n in ours.nodes]


@pytest.mark.parametrize("seed", range(4))
def test_the_same_order_as_onnx_graphsurgeon(seed):
    theirs, ours = _orders(gs.import_onnx(conv_net(channels=(8, 16))), seed)
    assert ours == theirs


def test_the_same_order_on_real_models():
    paths = sorted(SHARED_MODELS.glob("**/*.onnx"))[:6] if SHARED_MODELS.is_dir() else []
    if not paths:
        pytest.skip(f"no real models in {SHARED_MODELS}")
    for path in paths:
        graph = gs.import_onnx(onnx.load(str(path)))
        if any(isinstance(v, gs.Graph) for n in graph.nodes for v in n.attrs.values()):
            continue
        theirs, ours = _orders(graph, 7)
        assert ours == theirs, path.name


def test_a_cycle_is_refused_with_the_node_named():
    x = gs.Variable("x", np.float32, [1])
    a, b = gs.Variable("a", np.float32, [1]), gs.Variable("b", np.float32, [1])
    graph = gs.Graph(nodes=[gs.Node("Add", "first", inputs=[x, b], outputs=[a]),
                            gs.Node("Relu", "second", inputs=[a], outputs=[b])], inputs=[x], outputs=[b])
    with pytest.raises(UnsupportedPatternError, match="cycle through node '(first|second)'"):
        toposort(graph)


def test_a_graph_with_a_subgraph_is_left_to_onnx_graphsurgeon():
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
         helper.make_node("Relu", ["x0"], ["x"])], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    graph = gs.import_onnx(model)
    theirs = graph.copy()
    theirs.toposort()
    assert [n.name for n in toposort(graph).nodes] == [n.name for n in theirs.nodes]
    assert sorted(n.op for n in graph.nodes) == ["If", "Relu"]
