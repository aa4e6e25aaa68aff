"""Rule ``dynamic-pass-through`` (``lift/dynamic_passthrough.py``) called directly: codes of a
``DynamicQuantizeLinear`` moved by data-movement ops and dequantized again become the moved float tensor,
exactly what the source computes on values its run-time grid holds; a DequantizeLinear with another scale
than the quantizer's is declined."""

from __future__ import annotations

import numpy as np
from apply_rule import assert_same_outputs, build_model, declined, dynamic_grid_feed, lifted, ops_left, tensor_info
from onnx import helper

from trt_bridge.lift.dynamic_passthrough import DynamicPassThrough

RNG = np.random.default_rng(31)


#   x [2, 3, 4] ─ DynamicQuantizeLinear ─ x_q ─ Transpose(0, 2, 1) ─ t_q ─ Reshape [2, 12] ─ r_q ─ DQ ─ y [2, 12]
#                                       ├ x_s ──────────────────────────────────────────────────────┘
#                                       └ x_zp ─────────────────────────────────────────────────────┘
#   (another_scale: DQ(r_q, 0.5, x_zp))
def _moved_codes(another_scale: bool = False):
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_s", "x_zp"], "dql"),
             helper.make_node("Transpose", ["x_q"], ["t_q"], "transpose", perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t_q", "shape"], ["r_q"], "reshape"),
             helper.make_node("DequantizeLinear", ["r_q", "half" if another_scale else "x_s", "x_zp"], ["y"], "dq")]
    return build_model(nodes, [tensor_info("x", [2, 3, 4])], [tensor_info("y", [2, 12])],
                 {"shape": np.array([2, 12], np.int64), "half": np.float32(0.5)})


def test_the_moved_float_tensor():
    source = _moved_codes()
    out, _ = lifted(source, (DynamicPassThrough(), "dq"))
    assert ops_left(out) == ["Reshape", "Transpose"]
    assert_same_outputs(source, out, [{"x": dynamic_grid_feed(RNG, (2, 3, 4))} for _ in range(3)])


def test_another_scale_is_declined_untouched():
    reason = declined(_moved_codes(another_scale=True), DynamicPassThrough(), "dq")
    assert reason.startswith("it dequantizes the codes of DynamicQuantizeLinear 'dql' with another scale")
