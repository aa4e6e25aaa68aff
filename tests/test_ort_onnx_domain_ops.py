"""onnxruntime's contrib ops that its transformer optimizer writes in the *ONNX* domain, which onnx.checker
rejects: ``SimplifiedLayerNormalization`` (T5's RMS norm, at any opset) and ``LayerNormalization`` below
opset 17. ``load_model`` reads them as com.microsoft ops (``model.claim_ort_contrib_ops``) and
``sanitize.ort_fused`` writes them back as standard ONNX, exactly; TensorRT-RTX builds the conversion."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import convert_calibrated, op_types, run_ort, save, snr_db  # noqa: E402

from trt_bridge.ir.model import load_model  # noqa: E402
from trt_bridge.lift.pipeline import lift_model

RNG = np.random.default_rng(11)
D = 32


def _model(op, opset):
    """x [1, 8, 32] ─ MatMul(W) ─ <op>(γ[, β]) (onnxruntime's, ONNX domain) ─ MatMul(W2) ─ y"""
    inits = {"W": (RNG.normal(size=(D, D)) / 5).astype(np.float32),
             "W2": (RNG.normal(size=(D, D)) / 5).astype(np.float32),
             "gamma": (1 + RNG.normal(size=D) / 5).astype(np.float32),
             "beta": (RNG.normal(size=D) / 5).astype(np.float32)}
    norm_inputs = ["h", "gamma"] + (["beta"] if op == "LayerNormalization" else [])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], "proj"),
             helper.make_node(op, norm_inputs, ["n"], "norm", axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["n", "W2"], ["y"], "out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()
                               if op == "LayerNormalization" or k != "beta"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(("op", "opset"), [("SimplifiedLayerNormalization", 17), ("SimplifiedLayerNormalization", 14),
                                           ("LayerNormalization", 14)])
def test_ort_contrib_ops_in_the_onnx_domain_are_written_back(tmp_path, op, opset):
    src = save(_model(op, opset), tmp_path / "source.onnx")
    lifted, ctx = lift_model(load_model(src), src)
    assert [c.node for c in ctx.prepared if c.pass_name == "defuse-ort-ops"] == ["norm"]
    assert op not in op_types(lifted) and all(n.domain in ("", "ai.onnx") for n in lifted.graph.node)
    feeds = [{"x": RNG.normal(size=(1, 8, D)).astype(np.float32)} for _ in range(16)]
    for want, got in zip(run_ort(src, feeds[:3]), run_ort(lifted, feeds[:3])):  # onnxruntime runs its own op
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    out = tmp_path / "converted.onnx"
    convert_calibrated(src, out, feeds)
    held = [{"x": RNG.normal(size=(1, 8, D)).astype(np.float32)} for _ in range(4)]
    assert snr_db(run_ort(src, held), run_ort(out, held)) > 33  # measured 36.3, 37.4, 37.0 dB
