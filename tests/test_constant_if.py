"""An If on a constant condition is inlined (prepare/constant_if.py) in the forms onnx-graphsurgeon's own flattening
left without a producer: a branch output that is a constant (folded: no producer), one also read inside the branch,
one given twice, and the If nested in another If's branch that reads an outer value.

```
 x [1, 4] ─┐                 flag (bool input)
 k = Constant(true)           │
 outer If(flag) ─ then: If(k) ─ then: t = Relu(x); u = Neg(t) ─▶ (ones, t, u, u)  (a constant, read inside, twice)
               │                └ else: Sigmoid(x) ×4
               └ else: Abs(x) ×4                                        ─▶ a, b, c, d ─ Sum ─ y
```
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.ir.graphs import graphs
from trt_bridge.lift.pipeline import fold_constants
from trt_bridge.prepare.constant_if import match
from trt_bridge.runtime.session import session

OUTS = ("a", "b", "c", "d")


def _graph(name: str, nodes: list, outputs: list[str]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, 4])
                                               for o in outputs])


def _model() -> onnx.ModelProto:
    ones = numpy_helper.from_array(np.ones((1, 4), np.float32), "ones")
    inner_then = _graph("inner_then", [helper.make_node("Constant", [], ["ones"], "ones", value=ones),
                                       helper.make_node("Relu", ["x"], ["t"], "relu"),
                                       helper.make_node("Neg", ["t"], ["u"], "neg")], ["ones", "t", "u", "u"])
    inner_else = _graph("inner_else", [helper.make_node("Sigmoid", ["x"], [f"s{i}"], f"sig{i}") for i in range(4)],
                        [f"s{i}" for i in range(4)])
    outer_then = _graph("outer_then", [
        helper.make_node("Constant", [], ["k"], "k", value=numpy_helper.from_array(np.array(True), "k")),
        helper.make_node("If", ["k"], [f"i{o}" for o in OUTS], "inner", then_branch=inner_then,
                         else_branch=inner_else)], [f"i{o}" for o in OUTS])
    outer_else = _graph("outer_else", [helper.make_node("Abs", ["x"], [f"e{o}"], f"abs_{o}") for o in OUTS],
                        [f"e{o}" for o in OUTS])
    nodes = [helper.make_node("If", ["flag"], list(OUTS), "outer", then_branch=outer_then, else_branch=outer_else),
             helper.make_node("Sum", list(OUTS), ["y"], "sum")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_nested_constant_if_is_inlined_with_every_output_produced():
    graph = gs.import_onnx(_model())
    changes = fold_constants(graph)
    assert [c.node for c in changes] == ["inner"]
    model = gs.export_onnx(graph)
    onnx.checker.check_model(model, full_check=True)  # every name produced before it is read
    ops = [n.op_type for g in graphs(model.graph) for n in g.node]
    assert ops.count("If") == 1 and "Sigmoid" not in ops and ops.count("Identity") == 3  # ones, u twice
    x = np.array([[-1.0, 0.5, 2.0, -3.0]], np.float32)
    # what ONNX says the source computes: 1 + relu(x) − 2·relu(x), else 4·|x|. (onnxruntime runs the source's If
    # output given twice as zeros in one of the two places, which one depending on its optimization level.)
    for flag, want in ((True, 1 - np.maximum(x, 0)), (False, 4 * np.abs(x))):
        np.testing.assert_array_equal(session(model).run(None, {"x": x, "flag": np.array(flag)})[0], want)


def test_match_says_why_it_declines():
    outer = gs.import_onnx(_model()).nodes[0]
    assert match(outer) == "its condition is computed at run time"
    assert match(gs.import_onnx(_model()).nodes[1]) == "not an If"
