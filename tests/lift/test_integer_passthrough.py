"""Rule ``integer-pass-through`` (``lift/integer_passthrough.py``) called directly: an op that a QOperator model
runs on uint8 codes (MaxPool, a constant Pad) written as the float op between the same DQ and Q computes exactly
what the source computes; a MaxPool whose indices are read is declined."""

from __future__ import annotations

import numpy as np
import pytest
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info
from onnx import TensorProto, helper

from trt_bridge.lift.integer_passthrough import IntegerPassThrough

RNG = np.random.default_rng(29)
INITS = {"s": np.float32(0.05), "zp": np.uint8(100), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}


#   x ─ Q(s, 100) ─ x_q ─ MaxPool(2×2) | Pad(1, code 0) ─ y_q ─ DQ(s, 100) ─ y
#                                      [└ i ─ Cast ─ i_f]  (indices: the MaxPool's indices read)
def _on_codes(op: str, indices: bool = False):
    if op == "MaxPool":
        node = helper.make_node("MaxPool", ["x_q"], ["y_q", "i"] if indices else ["y_q"], "op", kernel_shape=[2, 2],
                                strides=[2, 2])
        y_shape = [1, 4, 3, 3]
    else:
        node = helper.make_node("Pad", ["x_q", "pads"], ["y_q"], "op", mode="constant")
        y_shape = [1, 4, 8, 8]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], "q"), node,
             helper.make_node("DequantizeLinear", ["y_q", "s", "zp"], ["y"], "dq")]
    nodes += [helper.make_node("Cast", ["i"], ["i_f"], "read_indices", to=TensorProto.FLOAT)] if indices else []
    outputs = [tensor_info("y", y_shape)] + ([tensor_info("i_f", y_shape)] if indices else [])
    return build_model(nodes, [tensor_info("x", [1, 4, 6, 6])], outputs, INITS)


@pytest.mark.parametrize("op", ["MaxPool", "Pad"])
def test_the_float_op_between_dq_and_q(op):
    source = _on_codes(op)
    out, ctx = lifted(source, (IntegerPassThrough(), "op"))
    assert ops_left(out) == sorted(["QuantizeLinear", "DequantizeLinear", op, "QuantizeLinear", "DequantizeLinear"])
    feeds = [{"x": RNG.normal(size=(1, 4, 6, 6)).astype(np.float32) * 3} for _ in range(3)]
    assert_same_outputs(source, out, feeds, rtol=0, atol=1e-6)


def test_a_maxpool_whose_indices_are_read_is_declined_untouched():
    reason = declined(_on_codes("MaxPool", indices=True), IntegerPassThrough(), "op")
    assert reason == "MaxPool's Indices output is used"
