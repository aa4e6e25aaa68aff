"""Rule fp4-activation-qdq (an opset-23 FP4 QuantizeLinear → DequantizeLinear pair of a computed tensor): the pair
lifted to the float tensor annotated FP4 over ±6 · max(scale), per tensor and in static blocks; declined, with the
reason and nothing changed, for codes another DequantizeLinear reads with another scale, a scale that is not finite
and positive, and a block layout TensorRT has no FP4 form of. Conversions, numbers and builds:
tests/test_fp4_activation_qdq.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from apply_rule import declined, lifted, ops_left  # noqa: E402
from test_fp4_activation_qdq import K, M, fp4_model  # noqa: E402

from trt_bridge.annotations import QMAX, ScaleSource, Site  # noqa: E402
from trt_bridge.formats import FP4  # noqa: E402
from trt_bridge.lift.fp4_activation_qdq import RULE, Fp4ActivationQdq  # noqa: E402


@pytest.mark.parametrize("layout", ["tensor", "blocks"])
def test_pair_becomes_the_float_tensor_annotated_fp4(layout):
    model = fp4_model(layout)
    scale = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "s"))
    out, ctx = lifted(model, (Fp4ActivationQdq(), "x_q"))
    assert ops_left(out) == ["MatMul"]
    spec = ctx.annotations.activations["x"]
    assert (spec.format, spec.lifted_by, spec.source, spec.sites) == (FP4, RULE, ScaleSource.MODEL, [Site("matmul", 0)])
    assert spec.scale == pytest.approx(6 * float(scale.max()) / QMAX)


def test_declined_for_codes_read_with_another_scale():
    model = fp4_model()
    model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "s2"))
    model.graph.node.append(helper.make_node("DequantizeLinear", ["xq", "s2"], ["xd2"], "other_dq"))
    assert "read by another node than a DequantizeLinear with its scale" in declined(model, Fp4ActivationQdq(), "x_q")


@pytest.mark.parametrize("change,reason", [
    (dict(scale=np.array(np.nan, np.float32)), "not finite and positive"),
    (dict(scale=np.full((M, K // 32), 1.0, np.float32), attrs={"axis": -1, "block_size": 32}), "blocks of 16"),
])
def test_declined_for_what_tensorrt_has_no_fp4_form_of(change, reason):
    assert reason in declined(fp4_model(**change), Fp4ActivationQdq(), "x_q")
