"""Rule ``qoperator`` (``lift/qoperator.py``) called directly: a QOperator op written as DequantizeLinear → the
float op → QuantizeLinear computes what onnxruntime's QLinear kernel computes (up to one code where the two
round a tie differently), its int32 bias lifted to float; a scale that is not a constant is declined."""

from __future__ import annotations

import numpy as np
import pytest
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info
from onnx import helper

from trt_bridge.lift.qoperator import QOperatorOps

RNG = np.random.default_rng(23)
X_S, Y_S = np.float32(0.05), np.float32(0.2)


#   x ─ Q(x_s, 128) ─ x_q ─ QLinearConv(W_q int8 [8, 3, 3, 3] per channel, B int32) ─ y_q ─ DQ(y_s, 128) ─ y
#   x ─ Q(x_s, 128) ─ x_q ─ QLinearMatMul(W_q int8 [16, 8]) ───────────────────────── y_q ─ DQ(y_s, 128) ─ y
def _qlinear(op: str, y_scale_constant: bool = True):
    if op == "QLinearConv":
        w_q = RNG.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
        w_s = (RNG.random(8) * 0.01 + 0.005).astype(np.float32)
        extra = {"B": RNG.integers(-2000, 2000, 8).astype(np.int32)}
        inputs, attrs, x_shape, y_shape = ["B"], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [1, 3, 6, 6], \
            [1, 8, 6, 6]
        w_zp = np.zeros(8, np.int8)
    else:
        w_q = RNG.integers(-127, 128, (16, 8)).astype(np.int8)
        w_s, w_zp, extra, inputs, attrs, x_shape, y_shape = np.float32(0.01), np.int8(0), {}, [], {}, [4, 16], [4, 8]
    inits = {"x_s": X_S, "x_zp": np.uint8(128), "W_q": w_q, "w_s": w_s, "w_zp": w_zp, "y_zp": np.uint8(128), **extra}
    if y_scale_constant:
        inits["y_s"] = Y_S
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["x_q"], "q"),
             helper.make_node(op, ["x_q", "x_s", "x_zp", "W_q", "w_s", "w_zp", "y_s", "y_zp", *inputs], ["y_q"], "op",
                              **attrs),
             helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_zp"], ["y"], "dq")]
    graph_inputs = [tensor_info("x", x_shape)] + ([] if y_scale_constant else [tensor_info("y_s", [])])
    return build_model(nodes, graph_inputs, [tensor_info("y", y_shape)], inits), x_shape


@pytest.mark.parametrize("op, float_op", [("QLinearConv", "Conv"), ("QLinearMatMul", "MatMul")])
def test_written_as_the_float_op_between_dq_and_q(op, float_op):
    source, x_shape = _qlinear(op)
    out, ctx = lifted(source, (QOperatorOps(), "op"))
    # x's Q, then DQ of x and of W ─ the float op ─ Q ─ the source's DQ of y
    assert ops_left(out) == sorted(["QuantizeLinear", "DequantizeLinear", "DequantizeLinear", float_op,
                                    "QuantizeLinear", "DequantizeLinear"])
    assert not ctx.annotations.activations and not ctx.annotations.weights  # the Q/DQ rules annotate, after
    feeds = [{"x": RNG.normal(size=x_shape).astype(np.float32) * 2} for _ in range(3)]
    assert_same_outputs(source, out, feeds, rtol=0, atol=float(Y_S) * 1.001)  # one output code at most


def test_a_scale_that_is_not_a_constant_is_declined_untouched():
    source, _ = _qlinear("QLinearMatMul", y_scale_constant=False)
    reason = declined(source, QOperatorOps(), "op")
    assert reason == "scale/zero point input 6 ('y_s') is not a constant"
