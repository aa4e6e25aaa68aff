"""Rule ``qdq-pair`` (``lift/qdq_pair.py``) called directly: an activation's Q → DQ pair becomes an annotation
on the float tensor; the lifted graph with that annotation's symmetric int8 Q/DQ put back computes exactly what
the source computes, and a zero point that clamps at 0 is kept as a Clip; codes read by anything but a
DequantizeLinear are declined."""

from __future__ import annotations

import numpy as np
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info, with_activation_qdq
from onnx import TensorProto, helper

from trt_bridge.annotations import ScaleSource, Site
from trt_bridge.lift.qdq_pair import QDQPair

RNG = np.random.default_rng(41)
W = (RNG.normal(size=(16, 8)) / 4).astype(np.float32)


#   x ─ Q(s, zp) ─ x_q ─ DQ(s, zp) ─ MatMul(W) ─ y
#                     [└ Cast ─ c]  (cast_codes: the codes also read as numbers)
def _pair(zp: np.ndarray, cast_codes: bool = False):
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["x_q"], "q"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "zp"], ["x_dq"], "dq"),
             helper.make_node("MatMul", ["x_dq", "W"], ["y"], "matmul")]
    nodes += [helper.make_node("Cast", ["x_q"], ["c"], "cast", to=TensorProto.FLOAT)] if cast_codes else []
    outputs = [tensor_info("y", [4, 8])] + ([tensor_info("c", [4, 16])] if cast_codes else [])
    return build_model(nodes, [tensor_info("x", [4, 16])], outputs, {"s": np.float32(0.04), "zp": zp, "W": W})


def test_an_int8_pair_becomes_the_annotation_it_stands_for():
    source = _pair(np.int8(0))
    out, ctx = lifted(source, (QDQPair(), "q"))
    assert ops_left(out) == ["MatMul"]
    spec = ctx.annotations.activations["x"]
    assert (spec.sites, spec.scale, spec.source) == ([Site("matmul", 0)], np.float32(0.04), ScaleSource.MODEL)
    feeds = [{"x": RNG.normal(size=(4, 16)).astype(np.float32) * 3} for _ in range(3)]  # some beyond ±127·s
    assert_same_outputs(source, with_activation_qdq(out, ctx.annotations), feeds, rtol=0, atol=1e-6)


def test_a_zero_point_that_clamps_at_zero_keeps_its_clip():
    source = _pair(np.uint8(0))
    out, ctx = lifted(source, (QDQPair(), "q"))
    assert ops_left(out) == ["Clip", "MatMul"]
    clipped = next(n.output[0] for n in out.graph.node if n.op_type == "Clip")
    assert ctx.annotations.activations[clipped].scale == np.float32(0.04) * 255 / 127
    # on values the uint8 grid holds (0 … 255·s), the float graph is the source
    feeds = [{"x": (RNG.integers(-50, 256, (4, 16)) * np.float32(0.04)).astype(np.float32)} for _ in range(3)]
    assert_same_outputs(source, out, feeds, rtol=1e-5, atol=1e-5)


def test_codes_read_by_another_op_are_declined_untouched():
    reason = declined(_pair(np.int8(0), cast_codes=True), QDQPair(), "q")
    assert reason == "'x_q' is read by Cast 'cast', not only by DequantizeLinear"
