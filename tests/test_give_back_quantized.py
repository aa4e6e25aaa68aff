"""Give-back and --accuracy-target on sources that carry their own scales (conversion/refine.py): onnxruntime's
QOperator and uint8 QDQ quantizations of the hostile net (conv2 reads a channel 200 above the rest), kept with
``--scales model``. The layers the source quantized are the candidates; the one given back reads float activations
and the source's weights dequantized; judged against the source's lifted float form, as a float source's are.

    #  x ─ [Q/DQ] conv1 ─ Relu ─ r1 ─ [Q/DQ] conv2 ─ Relu ─ [Q/DQ] conv3 ─ ... ─ logits
    #                                  ^ given back: Conv(r1, (W_q − zp)·s, b_q·s_x·s_w), no Q/DQ
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, quantize_dynamic, quantize_static, run_ort, save, snr_db
from onnx import helper, numpy_helper
from test_accuracy_target import HELD_OUT, _hostile

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, ScalePolicy
from trt_bridge.ir.model import load_model
from trt_bridge.lift.pipeline import lift_model

CALIB = [{"x": x} for x in samples.image_feeds(16, 1)]


def _source(tmp_path, family: str):
    """The hostile net quantized by onnxruntime: QOperator (int8 per-channel weights) or QDQ with uint8 activations
    and weights (zero points)."""
    from onnxruntime.quantization import QuantFormat, QuantType

    float_path = save(_hostile(), tmp_path / "float.onnx")
    if family == "qoperator":
        return quantize_static(float_path, tmp_path / "src.onnx", CALIB, quant_format=QuantFormat.QOperator,
                               per_channel=True)
    return quantize_static(float_path, tmp_path / "src.onnx", CALIB, quant_format=QuantFormat.QDQ,
                           activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8)


def _options(tmp_path, data=True, **calibration):
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in CALIB]))
    options = ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz") if data else None,
                                                            **calibration), progress=False)
    return dataclasses.replace(options, scales=dataclasses.replace(options.scales, policy=ScalePolicy.MODEL))


def _reads_dq(path) -> dict[str, tuple[bool, bool]]:
    """Conv name → (its activation, its weight) read through a DequantizeLinear."""
    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}

    def dq(name: str) -> bool:
        return name in producer and producer[name].op_type == "DequantizeLinear"

    return {n.name: (dq(n.input[0]), dq(n.input[1])) for n in model.graph.node if n.op_type == "Conv"}


def _dequantized_conv2(source) -> tuple[np.ndarray, np.ndarray]:
    """conv2's weight and bias as the source stores them, dequantized in float64: (W_q − zp)·s_w, b_q·s_x·s_w."""
    model = onnx.load(str(source))
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name.startswith("conv2") and n.op_type in ("QLinearConv", "Conv"))
    if node.op_type == "QLinearConv":
        x_scale, (w, w_scale, w_zero), bias = inits[node.input[1]], node.input[3:6], node.input[8]
        bias_scale = None
    else:
        x_scale = inits[producer[node.input[0]].input[1]]
        w, w_scale, w_zero = producer[node.input[1]].input[:3]
        bias_dq = producer[node.input[2]]
        bias, bias_scale = bias_dq.input[0], inits[bias_dq.input[1]]
    scale = inits[w_scale].reshape(-1, 1, 1, 1) if inits[w_scale].ndim else inits[w_scale]
    zero = inits[w_zero].reshape(-1, 1, 1, 1) if inits[w_zero].ndim else inits[w_zero]
    weight = (inits[w] - zero) * scale
    return weight, inits[bias] * (bias_scale if bias_scale is not None else x_scale * inits[w_scale])


def _conv2_on_source_numbers(out, source) -> tuple[np.ndarray, np.ndarray]:
    """(conv2's output in the converted model, onnxruntime's Conv on conv2's input there with the source's
    dequantized weight and bias), over HELD_OUT."""
    model = onnx.load(str(out))
    conv2 = next(n for n in model.graph.node if n.name.startswith("conv2") and n.op_type == "Conv")
    model.graph.output.extend([helper.make_tensor_value_info(conv2.input[0], onnx.TensorProto.FLOAT, None),
                               helper.make_tensor_value_info(conv2.output[0], onnx.TensorProto.FLOAT, None)])
    weight, bias = _dequantized_conv2(source)
    single = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **{a.name: helper.get_attribute_value(a)
                                                             for a in conv2.attribute})],
        "conv2", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight.astype(np.float32), "w"), numpy_helper.from_array(bias.astype(np.float32),
                                                                                           "b")]),
        opset_imports=[helper.make_opsetid("", 17)])
    from trt_bridge.runtime.session import session

    converted, reference = session(model), session(single)
    got, want = [], []
    for feed in HELD_OUT:
        inputs, outputs = converted.run([conv2.input[0], conv2.output[0]], feed)
        got.append(outputs)
        want.append(reference.run(None, {"x": inputs})[0])
    return np.concatenate(got), np.concatenate(want)


@pytest.mark.parametrize("family", ["qoperator", "qdq-uint8"])
def test_the_sources_fragile_layer_goes_back_with_its_own_weights(tmp_path, family):
    """--scales model keeps the source's scales; conv2, whose own INT8 error stands far below the other layers',
    goes back to float reading the source's dequantized weights; the rest keep their Q/DQ and the source's scales."""
    source = _source(tmp_path, family)
    out, kept = tmp_path / "out.onnx", tmp_path / "int8.onnx"
    report = convert(source, out, _options(tmp_path))
    convert(source, kept, _options(tmp_path, give_back=False))
    given = report.given_back
    assert len(given["layers"]) == 1 and given["layers"][0].startswith("conv2") and given["own_scales"]
    assert given["isolated_db"][given["layers"][0]] <= given["median_db"] - 6.0
    assert given["scores"][1] > given["scores"][0] + 20  # held-out: measured 13.6 → 46.2 dB (QOperator)
    assert report.calibration is None and report.scales == "model"  # nothing calibrated
    assert "the source quantized with its own scales back to float" in report.summary()
    readers = _reads_dq(out)
    assert {name: both for name, both in readers.items() if name.startswith("conv2")} == {given["layers"][0]:
                                                                                         (False, False)}
    assert all(both == (True, True) for name, both in readers.items() if not name.startswith("conv2"))
    assert all(both == (True, True) for both in _reads_dq(kept).values())
    assert all(q["source"] in ("model", "exact-weights", "requantized-weights") for q in report.quantized)
    got, want = _conv2_on_source_numbers(out, source)  # exactly the source's numbers, in float
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    lifted, _ = lift_model(load_model(source), source)  # the judge's reference: the source's float meaning
    reference = run_ort(lifted, HELD_OUT)
    with_float, all_int8 = snr_db(reference, run_ort(out, HELD_OUT)), snr_db(reference, run_ort(kept, HELD_OUT))
    assert with_float > all_int8 + 20, (all_int8, with_float)  # measured 13.5 → 46.2 dB (QOperator)
    for path in (out, kept):
        assert_qdq_contract(path)
        assert_tensorrt_ready(path)


def _dynamic_source(tmp_path):
    from onnxruntime.quantization import QuantType

    return quantize_dynamic(save(_hostile(), tmp_path / "float.onnx"), tmp_path / "src.onnx",
                            weight_type=QuantType.QUInt8)


@pytest.mark.parametrize("case", ["no-data-qoperator", "no-data-dynamic", "prefer-size", "no-give-back"])
def test_the_report_says_why_nothing_was_given_back(tmp_path, case):
    """Without calibration data there are no held-out feeds to judge on (a QOperator source keeps its scales, a
    dynamic one gets runtime ranges): the report and its headline say so. --prefer size and --no-give-back keep
    their meaning."""
    source = _dynamic_source(tmp_path) if case == "no-data-dynamic" else _source(tmp_path, "qoperator")
    options = _options(tmp_path, data=not case.startswith("no-data"), give_back=case != "no-give-back")
    if case == "prefer-size":
        options = dataclasses.replace(options, activations=dataclasses.replace(options.activations, prefer="size"))
    out = tmp_path / "out.onnx"
    report = convert(source, out, options)
    if case == "no-give-back":
        assert report.given_back is None
    elif case == "prefer-size":
        assert report.given_back["layers"] == () and "--prefer size" in report.given_back["reason"]
    else:
        assert report.given_back["layers"] == () and report.given_back["own_scales"]
        assert "no calibration data" in report.given_back["reason"] and "--calib-data" in report.given_back["reason"]
        assert "gave no layer back to float: no calibration data" in report.summary()
    readers = _reads_dq(out)
    assert len(readers) == 3 and all(weight for _, weight in readers.values())  # every conv kept INT8 weights
    assert_tensorrt_ready(out)


def test_an_unjudged_max_is_judged_for_give_back(tmp_path):
    """A model too small for auto to judge clipping on (every activation under 32768 held-out values: the float
    hostile net on 8×8 images) keeps max unjudged; give-back judges the max candidate on the held-out feeds
    anyway, and conv2 goes back."""
    model = _hostile()
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.dim_value = 8
    source = save(model, tmp_path / "small.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(16, 1, (1, 3, 8, 8)))
    calibration = CalibrationOptions(data=str(tmp_path / "calib.npz"))
    out, kept = tmp_path / "out.onnx", tmp_path / "int8.onnx"
    report = convert(source, out, ConvertOptions(calibration=calibration, progress=False))
    convert(source, kept, ConvertOptions(calibration=dataclasses.replace(calibration, give_back=False),
                                         progress=False))
    assert "too few to judge clipping by" in report.calibration["auto"]
    assert report.given_back["layers"] == ("conv2",) and not report.given_back["own_scales"]
    assert report.given_back["scores"][1] > report.given_back["scores"][0]
    assert _reads_dq(out) == {"conv1": (True, True), "conv2": (False, False), "conv3": (True, True)}
    held_out = [{"x": f} for f in samples.image_feeds(8, 3, (1, 3, 8, 8))]
    reference = run_ort(source, held_out)
    with_float, all_int8 = snr_db(reference, run_ort(out, held_out)), snr_db(reference, run_ort(kept, held_out))
    assert with_float > all_int8 + 20, (all_int8, with_float)  # measured 8.4 → 40.9 dB
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("give", [False, True], ids=["search", "give-back"])
def test_the_accuracy_target_on_a_quantized_source(tmp_path, give):
    """--accuracy-target on a QOperator source with its own scales: measured against its lifted float form (against
    the source itself no layer given back could help), the search finds conv2 and only it; with give-back on, the
    plain conversion already gives it back and meets the target."""
    from trt_bridge.conversion.accuracy import convert_to_target

    source = _source(tmp_path, "qoperator")
    np.savez(tmp_path / "eval.npz", x=samples.image_feeds(16, 2))
    out = tmp_path / "out.onnx"
    report, result = convert_to_target(source, out, _options(tmp_path, give_back=give), 35.0,
                                       str(tmp_path / "eval.npz"))
    assert result.reference == "lifted source" and "against the source's lifted float form" in result.summary()
    assert result.met and result.chosen.snr_db > 40  # measured 47.0
    if give:
        assert len(result.probes) == 1 and result.chosen.excluded == () and result.given_back[0].startswith("conv2")
        assert "1 layer(s) given back" in result.summary()
        in_float = list(result.given_back)
    else:
        assert result.probes[0].snr_db < 20  # every layer INT8: measured 13.8 dB
        assert len(result.chosen.excluded) == 1 and result.chosen.excluded[0].startswith("conv2")
        in_float = list(result.chosen.excluded)
    assert [name for name, both in _reads_dq(out).items() if both == (False, False)] == in_float
    lifted, _ = lift_model(load_model(source), source)
    assert snr_db(run_ort(lifted, HELD_OUT), run_ort(out, HELD_OUT)) > 40
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
