"""Rule ``dynamic-lstm`` (``lift/dynamic_lstm.py``) called directly: com.microsoft ``DynamicQuantizeLSTM`` becomes
a float ``LSTM`` on the source's dequantized weights. It computes exactly a float LSTM with those weights, and
what onnxruntime's kernel computes up to that kernel's run-time rounding of its inputs and hidden states; a
scale of the wrong shape is declined."""

from __future__ import annotations

import numpy as np
from apply_rule import build_model, declined, lifted, ops_left, run_outputs, tensor_info
from helpers import snr_db
from onnx import helper

from trt_bridge.lift.dynamic_lstm import DynamicQuantizeLSTM

RNG = np.random.default_rng(47)
T, D, IN, H = 6, 2, 12, 8
X, OUTPUTS = tensor_info("x", [T, 1, IN]), [tensor_info("y", [T, D, 1, H]), tensor_info("y_h", [D, 1, H])]


#   x [6, 1, 12], W_q int8 [2, 12, 32], R_q int8 [2, 8, 32] (transposed), B,
#   W_scale [2, 32] (per gate row), W_zp, R_scale [2] (per direction), R_zp ─ DynamicQuantizeLSTM ─ y, y_h
def _dynamic_lstm(w_scale_shape=(D, 4 * H)):
    inits = {"W_q": RNG.integers(-127, 128, (D, IN, 4 * H)).astype(np.int8),
             "R_q": RNG.integers(-127, 128, (D, H, 4 * H)).astype(np.int8),
             "B": (RNG.normal(size=(D, 8 * H)) / 4).astype(np.float32),
             "W_s": (RNG.random(w_scale_shape) * 0.004 + 0.002).astype(np.float32),
             "W_zp": np.zeros(w_scale_shape, np.int8),
             "R_s": (RNG.random(D) * 0.004 + 0.002).astype(np.float32), "R_zp": np.zeros(D, np.int8)}
    nodes = [helper.make_node("DynamicQuantizeLSTM", ["x", "W_q", "R_q", "B", "", "", "", "", "W_s", "W_zp", "R_s",
                                                     "R_zp"], ["y", "y_h"], "lstm", domain="com.microsoft",
                              hidden_size=H, direction="bidirectional")]
    return build_model(nodes, [X], OUTPUTS, inits,
                 microsoft=True), inits


def _float_lstm(inits):
    """The float LSTM on the source's dequantized weights, computed here independently."""
    w = (inits["W_q"].astype(np.float64) * inits["W_s"].reshape(D, 1, -1)).transpose(0, 2, 1)
    r = (inits["R_q"].astype(np.float64) * inits["R_s"].reshape(D, 1, 1)).transpose(0, 2, 1)
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h"], "lstm", hidden_size=H,
                              direction="bidirectional")]
    return build_model(nodes, [X], OUTPUTS,
                 {"W": w.astype(np.float32), "R": r.astype(np.float32), "B": inits["B"]})


def test_a_float_lstm_on_the_dequantized_weights():
    source, inits = _dynamic_lstm()
    out, ctx = lifted(source, (DynamicQuantizeLSTM(), "lstm"))
    assert ops_left(out) == ["LSTM"]
    feeds = [{"x": RNG.normal(size=(T, 1, IN)).astype(np.float32)} for _ in range(3)]
    got = run_outputs(out, feeds)
    for want, have in zip(run_outputs(_float_lstm(inits), feeds), got):
        for w, h in zip(want, have):
            np.testing.assert_allclose(h, w, rtol=1e-5, atol=1e-6)
    # onnxruntime's kernel rounds x and every hidden state to a run-time uint8 grid on the way (measured: y 42.6,
    # y_h 41.7 dB)
    for i in range(2):
        assert snr_db([o[i] for o in run_outputs(source, feeds)], [g[i] for g in got]) > 38.0


def test_a_scale_of_another_shape_is_declined_untouched():
    source, _ = _dynamic_lstm(w_scale_shape=(3,))
    reason = declined(source, DynamicQuantizeLSTM(), "lstm")
    assert reason == "W's scale or zero point has shape [3] / [3]; expected [2] or [2, 32]"
