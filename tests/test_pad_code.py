"""``sanitize/pad_code.py``: a quantized Pad value written in the other 8-bit type (Intel Neural Compressor 1.0's
QOperator Pad) is read in its data's type, bit for bit, before the type pass would promote both to int16."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_ort, save, snr_db  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import ConvertOptions  # noqa: E402


def _feeds(count, seed):
    """Inside the input's quantized range [(0 − 160)·6/255, (255 − 160)·6/255], so nothing saturates."""
    rng = np.random.default_rng(seed)
    return [{"x": np.clip(rng.normal(-0.5, 1, size=(1, 16, 8, 8)), -3.7, 2.2).astype(np.float32)}
            for _ in range(count)]


# INC's QOperator Pad, built by hand:
#
#   x ─ QuantizeLinear(sx, zx = 160:uint8) ─ Pad(pads, value) ─ QLinearConv(W:int8 per channel, B:int32) ─ y_q
#                                                                  ─ DequantizeLinear(sy, zy) ─ y
#
#   INC: value = 160 as int8 (−96, wrapped); onnx and onnxruntime reject the Pad (T bound to uint8 and int8).
#   The reference is the same model with the uint8 value it means (160 = zx: the float 0).

def _qoperator_model(value: np.ndarray) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    w = rng.normal(size=(16, 16, 3, 3)) / 12
    ws = np.abs(w).reshape(16, -1).max(1) / 127
    sx, sy = np.float32(6 / 255), np.float32(8 / 255)
    inits = {"sx": sx, "zx": np.uint8(160), "sy": sy, "zy": np.uint8(128),
             "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "value": value,
             "W_q": np.rint(w / ws[:, None, None, None]).astype(np.int8), "W_s": ws.astype(np.float32),
             "W_z": np.zeros(16, np.int8),
             "B_q": np.rint(rng.normal(size=16) / 4 / (sx * ws)).astype(np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], "qx"),
             helper.make_node("Pad", ["xq", "pads", "value"], ["pq"], "pad_quant", mode="constant"),
             helper.make_node("QLinearConv", ["pq", "sx", "zx", "W_q", "W_s", "W_z", "sy", "zy", "B_q"], ["yq"],
                              "conv_quant"),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], "dqy")]
    graph = helper.make_graph(nodes, "pad_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pad_value_in_the_other_8bit_type_is_read_bit_for_bit(tmp_path, caplog):
    reference = save(_qoperator_model(np.uint8(160)), tmp_path / "reference.onnx")
    source = save(_qoperator_model(np.uint8(160).view(np.int8)), tmp_path / "inc_pad.onnx")
    import onnxruntime as ort

    with pytest.raises(Exception, match="bound to different types"):
        ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    from trt_bridge.checks import CheckOptions, TrtProbe, check_model

    checked = check_model(source, CheckOptions(trt=TrtProbe.OFF))  # `check` names the node and convert's fix
    pad = [f for f in checked.findings if f.node == "pad_quant"]
    assert [f.rule for f in pad] == ["type-mismatch"] and pad[0].fixable and "the same bits" in pad[0].fix
    out = tmp_path / "converted.onnx"
    with caplog.at_level(logging.WARNING, logger="trt_bridge"):
        report = convert(source, out, ConvertOptions(progress=False))
    assert "the same bits" in caplog.text
    assert [c["node"] for c in report.sanitized if c["pass_name"] == "pad-code"] == ["pad_quant"]
    assert not report.remaining_blockers
    assert op_types(out) >= {"QuantizeLinear", "DequantizeLinear", "Pad", "Conv"}
    assert not op_types(out) & {"QLinearConv", "Cast"}  # no int16 detour
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    held_out = _feeds(4, 9)
    # the converted model computes the intended source: measured 37.4 dB (int8 activations against the source's
    # uint8 with a zero point; with the pad value promoted to int16 instead, the border is off by 256 codes)
    assert snr_db(run_ort(reference, held_out), run_ort(out, held_out)) > 34.4
