"""Rule ``fused-matmul`` (``lift/fused_matmul.py``) called directly: onnxruntime's float ``FusedMatMul`` written
as standard ONNX computes what onnxruntime computes for the fused node; transposed batches are declined."""

from __future__ import annotations

import numpy as np
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info
from onnx import helper

from trt_bridge.lift.fused_matmul import FusedMatMul

RNG = np.random.default_rng(21)


#   a [2, 4, 6] ──────────────── FusedMatMul(transB=1, alpha=0.5) ─ y [2, 4, 5]
#   b [2, 5, 6] (transposed) ──┘
def _fused(**attrs):
    nodes = [helper.make_node("FusedMatMul", ["a", "b"], ["y"], "fused", domain="com.microsoft", **attrs)]
    return build_model(nodes, [tensor_info("a", [2, 4, 6]), tensor_info("b", [2, 5, 6])], [tensor_info("y", [2, 4, 5])],
                       {},
                 microsoft=True)


def test_written_as_transpose_matmul_and_alpha():
    source = _fused(transB=1, alpha=0.5)
    out, ctx = lifted(source, (FusedMatMul(), "fused"))
    assert ops_left(out) == ["MatMul", "Mul", "Transpose"]
    feeds = [{"a": RNG.normal(size=(2, 4, 6)).astype(np.float32), "b": RNG.normal(size=(2, 5, 6)).astype(np.float32)}
             for _ in range(3)]
    assert_same_outputs(source, out, feeds)


def test_transposed_batches_are_declined_untouched():
    reason = declined(_fused(transBatchA=1), FusedMatMul(), "fused")
    assert reason == "transBatchA/transBatchB are not lifted"
