"""Rule ``block-quantize-dequantize`` (``lift/block_quantize_dequantize.py``) called directly: AMD Quark's
block-format round trips become the float tensors, annotated for int8 (the activation to calibrate, the weight
per output channel) and listed as approximations. onnxruntime cannot run Quark's op, so the reference is the
source with each round trip as the identity it approximates; another domain's op of that name is declined."""

from __future__ import annotations

import numpy as np
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info
from onnx import helper

from trt_bridge.annotations import ScaleSource, Site
from trt_bridge.lift.block_quantize_dequantize import BlockQuantizeDequantize

RNG = np.random.default_rng(43)
QUARK = "com.amd.quark"


W = (RNG.normal(size=(16, 8)) / 4).astype(np.float32)


#   x ─ BFPQuantizeDequantize ─ xb ─ MatMul ─ y
#   W ─ BFPQuantizeDequantize ─ Wb ─┘
#   (identity: each round trip an Identity, what the source computes up to its block rounding)
def _bfp(domain: str = QUARK, identity: bool = False):
    def round_trip(name, x, y):
        if identity:
            return helper.make_node("Identity", [x], [y], name)
        return helper.make_node("BFPQuantizeDequantize", [x], [y], name, domain=domain, bfp_method="to_bfp", axis=1,
                                bit_width=16, block_size=8, rounding_mode=2)

    nodes = [round_trip("x_bfp", "x", "xb"), round_trip("W_bfp", "W", "Wb"),
             helper.make_node("MatMul", ["xb", "Wb"], ["y"], "mm")]
    return build_model(nodes, [tensor_info("x", [4, 16])], [tensor_info("y", [4, 8])], {"W": W},
                       domains=() if identity else (domain,))


def test_float_tensors_annotated_for_int8():
    source = _bfp()
    out, ctx = lifted(source, (BlockQuantizeDequantize(), "x_bfp"), (BlockQuantizeDequantize(), "W_bfp"))
    assert ops_left(out) == ["MatMul"]
    assert ctx.annotations.activations["x"].sites == [Site("mm", 0)] and ctx.annotations.activations["x"].scale is None
    weight = ctx.annotations.weights["W"]
    assert (weight.sites, weight.axis, weight.source) == ([Site("mm", 1)], 1, ScaleSource.REQUANTIZED)
    assert [a.node for a in ctx.approximated] == ["x_bfp", "W_bfp"]
    feeds = [{"x": RNG.normal(size=(4, 16)).astype(np.float32)} for _ in range(3)]
    assert_same_outputs(_bfp(identity=True), out, feeds, rtol=0, atol=0)


def test_another_domain_is_declined_untouched():
    reason = declined(_bfp(domain="org.example"), BlockQuantizeDequantize(), "x_bfp")
    assert reason.startswith("BFPQuantizeDequantize of domain 'org.example' is not AMD Quark's")
