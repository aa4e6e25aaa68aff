"""FP8 end to end (issue 29): onnxruntime's FP8 Q/DQ sources converted keeping FP8, ``--int8`` on them, float models
converted with ``--fp8 --calib-data`` (FP8 everywhere, nothing INT8), hand-built sources TensorRT has no form for
(E5M2, per-axis, non-zero zero points) approximated and reported, and the other commands on FP8 models.

Every output keeps the Q/DQ contract, is measured against onnxruntime running its source (or float model) and is
built by TensorRT-RTX for SM 8.9.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import (
    assert_qdq_contract,
    assert_tensorrt_ready,
    quantize_static,
    run_exact,
    run_ort,
    save,
    snr_db,
)
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, FormatOptions, PrecisionOptions

FP8_ZP = "float8_e4m3fn"


def fp8_source(float_path, out, feeds, per_channel=False, **kwargs):
    """onnxruntime's FP8 E4M3 Q/DQ of ``float_path``: its FP8 scales come from each tensor's standard deviation, so
    only Distribution calibration works; Conv/MatMul/Gemm only (it gives a Softmax output a range without those
    statistics, an error, and a scalar constant a zero scale)."""
    return quantize_static(float_path, out, feeds, quant_format=QuantFormat.QDQ, per_channel=per_channel,
                           activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN,
                           calibrate_method=CalibrationMethod.Distribution,
                           op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                           extra_options={"ActivationSymmetric": True, "WeightSymmetric": True}, **kwargs)


def _image_feeds(count, seed):
    return [{"x": f} for f in samples.image_feeds(count, seed)]


def _sequence_feeds(count, seed):
    return [{"x": f} for f in samples.sequence_feeds(count, seed, 16, 64)]


MODELS = {"conv": (lambda: samples.conv_net(), _image_feeds),
          "transformer": (lambda: samples.transformer_block(layers=1), _sequence_feeds)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request, tmp_path_factory):
    """(name, float path, FP8 source path, calibration .npz, held-out feeds)."""
    return _model(request.param, tmp_path_factory.mktemp(f"fp8-{request.param}"))


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    """The conv net's :func:`model` alone (the commands' tests)."""
    return _model("conv", tmp_path_factory.mktemp("fp8-conv-commands"))


def _model(name, folder):
    build, feeds = MODELS[name]
    float_path = save(build(), folder / "float.onnx")
    calib = feeds(32, 1)
    np.savez(folder / "calib.npz", x=np.stack([f["x"] for f in calib]))
    source = fp8_source(float_path, folder / "fp8.onnx", calib)
    return name, float_path, source, folder / "calib.npz", feeds(12, 2)


def qdq_types(path) -> dict[str, list]:
    """Each Q/DQ's zero-point numpy type name → the nodes (activation Qs and weight DQs alike)."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found: dict[str, list] = {}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            found.setdefault(inits[node.input[2]].dtype.name, []).append(node.name)
    return found


def activation_scales(path) -> dict[str, float]:
    """tensor → the scale of the QuantizeLinear reading it."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.input[0]: float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear"
            and n.input[0] not in inits}


def opset(path) -> int:
    return next(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx"))


#: SNR (dB) bars, measured minus about 3 dB: (converted against the float model, converted against the source)
#: the conv net's first two convolutions go back to float (TensorRT has no FP8 kernel worth running for ≤16 channels
#: a side): nearer the float model than the source (measured 22.7 dB, the source 19.8), 23.0 dB from the source
SOURCE_BARS = {"conv": (18.5, 20.0), "transformer": (17.5, 23.0)}


def test_an_fp8_source_keeps_fp8_and_its_scales(model, tmp_path):
    name, float_path, source, _, held_out = model
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers and not report.approximated
    assert_qdq_contract(out)
    assert set(qdq_types(out)) == {FP8_ZP} and opset(out) >= 19
    assert "TensorRT-ready FP8 (" in report.check["headline"]
    # per-tensor activation scales are the source's own (lowering writes amax / 448 back)
    theirs, ours = activation_scales(source), activation_scales(out)
    assert ours and all(t in theirs for t in ours)
    for tensor, scale in ours.items():
        assert scale == pytest.approx(theirs[tensor], rel=1e-6), tensor
    weights = [q for q in report.quantized if q["kind"] == "weight"]
    assert weights and {q["format"] for q in weights} == {"fp8"} and {q["source"] for q in weights} == {
        "exact-weights"}
    reference, by_source, converted = run_ort(float_path, held_out), run_ort(source, held_out), run_ort(out, held_out)
    to_float, to_source = snr_db(reference, converted), snr_db(by_source, converted)
    print(f"{name}: source {snr_db(reference, by_source):.2f} dB, converted {to_float:.2f} dB against the float "
          f"model, {to_source:.2f} dB against the source")
    bars = SOURCE_BARS[name]
    assert to_float >= bars[0] and to_source >= bars[1], (to_float, to_source)
    assert to_float >= snr_db(reference, by_source) - 0.5
    assert_tensorrt_ready(out)


def test_per_channel_fp8_weights_are_kept_bit_for_bit(tmp_path):
    """onnxruntime's per-channel FP8 weights: the same codes and per-channel scales in the output."""
    float_path = save(samples.conv_net(), tmp_path / "float.onnx")
    source = fp8_source(float_path, tmp_path / "fp8.onnx", _image_feeds(16, 1), per_channel=True)
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(check=False, progress=False))
    assert not report.approximated and set(qdq_types(out)) == {FP8_ZP}
    theirs, ours = ({i.name: numpy_helper.to_array(i) for i in onnx.load(str(p)).graph.initializer}
                    for p in (source, out))
    weights = [q["tensor"] for q in report.quantized if q["kind"] == "weight"]
    assert len(weights) == 2  # conv1 (3 → 16 channels) and conv2 (16 → 32) stay float: no FP8 kernel worth running
    for name in weights:
        base = name.removesuffix("_float")
        assert np.array_equal(ours[f"{name}_fp8"].view(np.uint8), theirs[f"{base}_quantized"].view(np.uint8)), name
        assert np.array_equal(ours[f"{name}_scale"], theirs[f"{base}_scale"]) and ours[f"{name}_scale"].ndim == 1
    held_out = _image_feeds(8, 2)
    reference = run_ort(float_path, held_out)
    assert snr_db(reference, run_ort(out, held_out)) >= snr_db(reference, run_ort(source, held_out)) - 0.5
    assert_tensorrt_ready(out)


def test_int8_on_an_fp8_source_gives_int8(model, tmp_path):
    """``--int8``: every Q/DQ INT8; without data each activation's INT8 scale covers the FP8 source's range
    (448·s / 127), with data the ranges are calibrated again."""
    _, float_path, source, calib, held_out = model
    out = tmp_path / "int8.onnx"
    report = convert(source, out, ConvertOptions(formats=FormatOptions(activations="int8"), progress=False))
    assert_qdq_contract(out)
    assert set(qdq_types(out)) == {"int8"}
    assert {c["format"] for c in report.formats} == {"int8"} and {c["was"] for c in report.formats} == {"fp8"}
    theirs = activation_scales(source)
    for tensor, scale in activation_scales(out).items():
        assert scale == pytest.approx(theirs[tensor] * 448 / 127, rel=1e-6), tensor
    calibrated = tmp_path / "int8-data.onnx"
    report = convert(source, calibrated, ConvertOptions(formats=FormatOptions(activations="int8"), progress=False,
                                                        calibration=CalibrationOptions(data=str(calib))))
    assert set(qdq_types(calibrated)) == {"int8"}
    assert {q["source"] for q in report.quantized if q["kind"] == "activation"} == {"calibration"}
    reference = run_ort(float_path, held_out)
    assert snr_db(reference, run_ort(calibrated, held_out)) > 20
    assert_tensorrt_ready(calibrated)


#: float → --fp8: SNR bars against the float model (measured minus about 3 dB)
FLOAT_BARS = {"conv": 27.5, "transformer": 27.0}


@pytest.mark.parametrize("high", ["fp32", "fp16"])
def test_a_float_model_with_fp8_is_fp8_only(model, high, tmp_path):
    """``--fp8 --calib-data``: activations and weights FP8, nothing INT8 (no re-centring, no runtime range, smoothed
    and split weights FP8 too); with --high-precision fp16 the scales are float16 (opset 19)."""
    name, float_path, _, calib, held_out = model
    out = tmp_path / "out.onnx"
    report = convert(float_path, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(calib)), formats=FormatOptions(activations="fp8"),
        precision=PrecisionOptions(high_precision=high), progress=False))
    assert not report.remaining_blockers
    assert_qdq_contract(out)
    assert set(qdq_types(out)) == {FP8_ZP} and opset(out) >= 19
    assert {q["format"] for q in report.quantized} == {"fp8"}
    assert not report.recentered and not (report.runtime_ranges or {}).get("tensors")
    if name == "transformer":
        assert report.smoothed  # smoothing ran, and its weights are FP8 (above)
    counts = report.precision["counts"]
    assert counts.get("fp8") and "int8" not in counts
    if high == "fp16":  # FP8 Q/DQ with float16 scales (opset 19) where they read or write float16
        written = onnx.load(str(out))
        inits = {i.name: i.data_type for i in written.graph.initializer}
        assert TensorProto.FLOAT16 in {inits[n.input[1]] for n in written.graph.node if n.op_type in (
            "QuantizeLinear", "DequantizeLinear")}
    snr = snr_db(run_ort(float_path, held_out), run_ort(out, held_out))
    print(f"{name} float --fp8 ({high}): {snr:.2f} dB")
    assert snr >= FLOAT_BARS[name], snr
    assert_tensorrt_ready(out)


def test_a_split_massive_channel_leaves_fp8_only(tmp_path):
    """--fp8 on the outlier-split encoder FFN: the split's weights and side path add no INT8 Q/DQ."""
    from test_outliers import _massive_activation_model

    path, feeds = _massive_activation_model(tmp_path)
    np.savez(tmp_path / "calib.npz", x=feeds(16, 1))
    out = tmp_path / "out.onnx"
    report = convert(path, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                               formats=FormatOptions(activations="fp8"), progress=False))
    assert report.split_outliers and report.smoothed is not None
    assert_qdq_contract(out)
    assert set(qdq_types(out)) == {FP8_ZP} and {q["format"] for q in report.quantized} == {"fp8"}
    held_out = [{"x": f} for f in feeds(8, 2)]
    snr = snr_db(run_ort(path, held_out), run_ort(out, held_out))
    print(f"massive channel --fp8: {snr:.2f} dB")
    assert snr > 25, snr
    assert_tensorrt_ready(out)


def test_fp8_inside_control_flow_bodies(tmp_path):
    """The float VAD's If branches are quantized in FP8 under --fp8, like the main graph."""
    from control_flow_models import vad_feeds, vad_model

    src = save(vad_model(), tmp_path / "vad.onnx")
    feeds = vad_feeds(12, seed=1) + vad_feeds(12, seed=3, rate=8000)
    np.savez(tmp_path / "calib.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    out = tmp_path / "vad.fp8.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              formats=FormatOptions(activations="fp8"), progress=False))
    assert report.control_flow["bodies"] == 2
    model = assert_qdq_contract(out)
    zero_points = []
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        consts = {i.name: i.data_type for i in graph.initializer}
        consts.update({n.output[0]: a.t.data_type for n in graph.node if n.op_type == "Constant"
                       for a in n.attribute if a.name == "value"})
        for node in graph.node:
            graphs.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
            if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
                zero_points.append(consts.get(node.input[2], 0))
    assert zero_points and set(zero_points) <= {TensorProto.FLOAT8E4M3FN}, set(zero_points)
    for rate in (16000, 8000):
        held = vad_feeds(8, seed=5, rate=rate)
        snr = snr_db(run_ort(src, held), run_ort(out, held))
        print(f"vad --fp8 at {rate} Hz: {snr:.2f} dB")
        assert snr > 13, (rate, snr)
    assert_tensorrt_ready(out)


# --- hand-built FP8 sources onnxruntime's quantizer does not write -------------------------------------------------

def _f8(values, dtype=ml_dtypes.float8_e4m3fn, onnx_type=TensorProto.FLOAT8E4M3FN, name="t"):
    values = np.asarray(values, np.float32).astype(dtype)
    return helper.make_tensor(name, onnx_type, values.shape, values.view(np.uint8).tobytes(), raw=True)


def hand_built(act_type=TensorProto.FLOAT8E4M3FN, act_dtype=ml_dtypes.float8_e4m3fn, per_axis=False,
               zero_point=0.0, seed=0):
    """x[8,64] ─ Q/DQ(act codes) ─ MatMul(DQ(W: e4m3 codes, per column)) ─ Add(b) ─ y[8,64]: what ModelOpt, Quark
    and NNCF write besides onnxruntime's form, with the activation's codes, granularity and zero point chosen."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    w_scale = (np.abs(w).max(axis=0) / 448).astype(np.float32)
    top = float(ml_dtypes.finfo(act_dtype).max)
    if per_axis:
        x_scale = np.linspace(4.0, 8.0, 64).astype(np.float32) / top
        act_zp = _f8(np.zeros(64), act_dtype, act_type, "x_zp")
    else:
        x_scale = np.array(6.0 / top, np.float32)
        act_zp = _f8(np.array(zero_point), act_dtype, act_type, "x_zp")
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], "x_q", axis=1),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], "x_dq", axis=1),
             helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wd"], "w_dq", axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["mm"], "mm"),
             helper.make_node("Add", ["mm", "b"], ["y"], "bias")]
    inits = [numpy_helper.from_array(x_scale, "x_scale"), act_zp,
             _f8(w / w_scale, name="wq"), numpy_helper.from_array(w_scale, "w_scale"),
             _f8(np.zeros(64), name="w_zp"),
             numpy_helper.from_array(rng.normal(0, 0.1, 64).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "fp8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def reference(model, x):
    """What ``hand_built`` computes, in numpy: ONNX has FP8 zero points 0 only (its reference evaluator refuses
    others), so ``DQ(Q(x))`` is written out as ``(fp8(x / s + z) − z) · s``."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    s, z = inits["x_scale"].astype(np.float64), inits["x_zp"].astype(np.float64)
    codes = inits["x_zp"].dtype
    top = float(ml_dtypes.finfo(codes).max)
    q = np.clip(x / s + z, -top, top).astype(codes).astype(np.float64)
    w = inits["wq"].astype(np.float64) * inits["w_scale"].astype(np.float64)
    return (((q - z) * s) @ w + inits["b"]).astype(np.float32)


def _x_feeds(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(-5.0, 5.0, (8, 64)).astype(np.float32)} for _ in range(count)]


@pytest.mark.parametrize("kind, words", [
    ("e5m2", "float8e5m2 activation codes"),
    ("per-axis", "per-axis activation quantization"),
    ("zero-point", "non-zero zero point"),
])
def test_fp8_forms_tensorrt_has_not_become_e4m3_and_are_reported(kind, words, tmp_path):
    model = {"e5m2": lambda: hand_built(TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2),
             "per-axis": lambda: hand_built(per_axis=True),
             "zero-point": lambda: hand_built(zero_point=-1.0)}[kind]()
    src = save(model, tmp_path / "src.onnx")
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(progress=False))
    assert any(words in a["what"] for a in report.approximated), report.approximated
    assert_qdq_contract(out)
    assert set(qdq_types(out)) == {FP8_ZP}
    feeds = _x_feeds(8, 3)
    want = [reference(model, f["x"]) for f in feeds]
    snr = snr_db(want, run_ort(out, feeds))
    print(f"{kind}: {snr:.2f} dB against the source")
    assert snr > 20, snr
    assert_tensorrt_ready(out)


def test_an_fp8_scale_moved_through_a_reshape_stays_fp8(tmp_path):
    """x ─ Q/DQ(FP8) ─ Reshape ─ MatMul (NNCF's upward-propagated form): the scale carried to the MatMul's input
    keeps the source's FP8 and its value."""
    model = hand_built()
    nodes = list(model.graph.node)
    reshape = helper.make_node("Reshape", ["xd", "shape"], ["xr"], "reshape")
    nodes[3].input[0] = "xr"  # MatMul(Reshape(DQ(Q(x))), DQ(W))
    del model.graph.node[:]
    model.graph.node.extend([*nodes[:2], reshape, *nodes[2:]])
    model.graph.initializer.append(numpy_helper.from_array(np.array([8, 64], np.int64), "shape"))
    src = save(model, tmp_path / "src.onnx")
    out = tmp_path / "out.onnx"
    convert(src, out, ConvertOptions(check=False, progress=False))
    assert set(qdq_types(out)) == {FP8_ZP}
    scales = activation_scales(out)
    assert scales == {"xr": pytest.approx(6.0 / 448)}, scales
    feeds = _x_feeds(4, 3)
    assert snr_db(run_ort(src, feeds), run_ort(out, feeds)) > 40
    assert_tensorrt_ready(out)


def test_fp8_weight_codes_in_e5m2_are_requantized_and_reported(tmp_path):
    model = hand_built()
    w = next(i for i in model.graph.initializer if i.name == "wq")
    values = numpy_helper.to_array(w).astype(np.float32)
    w.CopyFrom(_f8(values, ml_dtypes.float8_e5m2, TensorProto.FLOAT8E5M2, "wq"))
    zp = next(i for i in model.graph.initializer if i.name == "w_zp")
    zp.CopyFrom(_f8(np.zeros(64), ml_dtypes.float8_e5m2, TensorProto.FLOAT8E5M2, "w_zp"))
    src = save(model, tmp_path / "src.onnx")
    out = tmp_path / "out.onnx"
    report = convert(src, out, ConvertOptions(progress=False))
    assert any("float8e5m2 weight codes" in a["what"] for a in report.approximated), report.approximated
    assert set(qdq_types(out)) == {FP8_ZP}
    feeds = _x_feeds(4, 3)
    assert snr_db(run_ort(src, feeds), run_ort(out, feeds)) > 20


# --- check: a precision the target cannot run ------------------------------------------------------------------------

def fp4_model() -> onnx.ModelProto:
    """x[8,64] ─ Q/DQ(FP4 E2M1) ─ MatMul(DQ(W: FP4 codes)) ─ y: FP4, which TensorRT runs on compute capability 10.0+."""
    rng = np.random.default_rng(0)
    codes = rng.choice([-6.0, -3.0, -1.0, -0.5, 0.0, 0.5, 2.0, 4.0, 6.0], (64, 32)).astype(ml_dtypes.float4_e2m1fn)

    def fp4(values, name):
        values = np.asarray(values, ml_dtypes.float4_e2m1fn)
        return helper.make_tensor(name, TensorProto.FLOAT4E2M1, values.shape,
                                  values.astype(np.float32).ravel().tolist())

    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], "x_q"),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], "x_dq"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], "w_dq"),
             helper.make_node("MatMul", ["xd", "w"], ["y"], "mm")]
    graph = helper.make_graph(nodes, "fp4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
                              [numpy_helper.from_array(np.array(0.5, np.float32), "xs"), fp4(np.zeros(()), "xz"),
                               fp4(codes, "wq"), numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
                               fp4(np.zeros(()), "wz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    return model


def test_check_blocks_a_precision_the_target_cannot_run(conv, tmp_path):
    """FP8 below compute capability 8.9 and FP4 below 10.0 are blockers naming the target; at or above it, none."""
    from trt_bridge.checks import CheckOptions, TrtProbe, check_model

    _, _, source, _, _ = conv
    old = check_model(source, CheckOptions(TrtProbe.OFF, compute_capability="8.6"))
    blockers = [f for f in old.blockers if f.rule == "precision-target"]
    assert not old.ready and len(blockers) == 1
    assert "FP8" in blockers[0].why and "compute capability 8.9" in blockers[0].why
    assert "the target is compute capability 8.6" in blockers[0].why and "--int8" in blockers[0].fix
    ada = check_model(source, CheckOptions(TrtProbe.OFF, compute_capability="SM89"))
    assert ada.ready and not [f for f in ada.findings if f.rule == "precision-target"]

    fp4 = save(fp4_model(), tmp_path / "fp4.onnx")
    on_ada = check_model(fp4, CheckOptions(TrtProbe.OFF))  # the default target: --costs's, 8.9
    why = [f.why for f in on_ada.blockers if f.rule == "precision-target"]
    assert len(why) == 1 and "FP4" in why[0] and "10" in why[0] and "compute capability 8.9" in why[0], why
    on_blackwell = check_model(fp4, CheckOptions(TrtProbe.OFF, costs=None, compute_capability="12.0"))
    assert not [f for f in on_blackwell.findings if f.rule == "precision-target"]

    # a model over 2 GB, whose layers are not read: its Q/DQ's code types say the same
    from trt_bridge.checks.targets import model_formats, target_findings
    from trt_bridge.formats import FP4

    formats = model_formats(fp4_model(), None)
    assert formats == {FP4: 3}
    assert "3 Q/DQ node(s) run in FP4" in target_findings(formats, "SM89", layers=False)[0].why


def test_check_cli_takes_the_target(conv, tmp_path):
    from test_cli import cli

    _, _, source, _, _ = conv
    result = cli("check", source, "--trt", "off", "--compute-capability", "8.6")
    assert result.returncode == 1 and "[precision-target]" in result.stdout, result.stdout + result.stderr
    assert "the target is compute capability 8.6" in result.stdout
    result = cli("check", source, "--trt", "off", "--compute-capability", "8.9", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["ready"]
    result = cli("check", source, "--compute-capability", "eight")
    assert result.returncode == 2 and "not a compute capability" in result.stderr


# --- the other commands on FP8 models -------------------------------------------------------------------------------

def test_scales_export_reads_fp8_ranges(conv, tmp_path):
    """An FP8 scale s covers amax = 448·s: the table, its JSON and TensorRT cache say so, a float model converted
    with --fp8 and that table gets the same scales back, and fixed-point (INT8's requantization) is refused."""
    from test_cli import cli

    from trt_bridge.conversion.options import ScaleOptions
    from trt_bridge.scales.model_scales import scales_of_model

    _, float_path, source, _, held_out = conv
    out = tmp_path / "out.onnx"
    convert(source, out, ConvertOptions(check=False, progress=False))
    table = scales_of_model(onnx.load(str(out)))
    scales = activation_scales(out)
    assert scales and set(table.activations()) == set(scales)
    for tensor, scale in scales.items():
        assert table[tensor].amax == pytest.approx(448 * scale, rel=1e-6), tensor
    model = onnx.load(str(out))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weight_dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert weight_dqs and len(table.weights()) == len(weight_dqs)
    for dq in weight_dqs:
        entry = table[dq.input[0].removesuffix("_fp8")]
        assert np.allclose(entry.amax, 448 * inits[dq.input[1]].astype(np.float64), rtol=1e-6), dq.name

    exported = tmp_path / "scales.json"
    result = cli("scales", "export", out, "--format", "json", "-o", exported)
    assert result.returncode == 0, result.stderr
    tensors = json.loads(exported.read_text())["tensors"]
    first = sorted(scales)[0]  # the first conv (3 input channels) stays float: TensorRT has no FP8 kernel for it
    assert tensors[first]["amax"] == pytest.approx(448 * scales[first], rel=1e-6)
    cache = tmp_path / "scales.cache"
    assert cli("scales", "export", out, "--format", "trt-cache", "-o", cache).returncode == 0
    line = next(v for v in cache.read_text().splitlines() if v.startswith(f"{first}: "))
    assert np.frombuffer(bytes.fromhex(line.split(": ")[1]), ">f4")[0] == pytest.approx(448 * scales[first] / 127,
                                                                                         rel=1e-6)
    refused = cli("scales", "export", out, "--format", "fixed-point", "-o", tmp_path / "fp.csv")
    assert refused.returncode == 2 and "FP8" in refused.stderr and "Traceback" not in refused.stderr

    again = tmp_path / "again.onnx"
    convert(float_path, again, ConvertOptions(scales=ScaleOptions(files=(str(exported),)),
                                              formats=FormatOptions(activations="fp8"), check=False,
                                              progress=False))
    for tensor, scale in activation_scales(again).items():
        assert scale == pytest.approx(scales[tensor], rel=1e-5), tensor


def test_verify_bench_build_and_pipeline_on_fp8(conv, tmp_path):
    """verify measures what onnxruntime computes of the FP8 model (sessions at the basic optimization level);
    bench times it on onnxruntime's CPU; build makes its SM 8.9 engine; a pipeline runs them all on the source."""
    from test_cli import cli

    from trt_bridge.bench import BenchOptions, bench

    _, float_path, source, calib, held_out = conv
    out = tmp_path / "out.onnx"
    convert(source, out, ConvertOptions(check=False, progress=False))
    np.savez(tmp_path / "eval.npz", x=np.stack([f["x"] for f in held_out]))
    result = cli("verify", float_path, out, "--data", tmp_path / "eval.npz", "--json", "--costs", "off")
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)["outputs"][0]["snr_db"]
    assert measured == pytest.approx(snr_db(run_ort(float_path, held_out), run_ort(out, held_out)), abs=1e-3)
    # the measuring sessions compute what onnx's reference evaluator does (onnxruntime's extended optimizations,
    # which the sessions leave off for FP8, gave -0.4 dB against it)
    for model in (out, source):
        assert snr_db(run_exact(model, held_out[:3]), run_ort(model, held_out[:3])) > 100

    rows = bench([out, source], BenchOptions(iterations=3, warmup=1, costs=None)).rows
    assert [r.backend for r in rows] == ["onnxruntime CPU"] * 2 and all(r.simulated for r in rows)

    engine = tmp_path / "out.engine"
    result = cli("build", out, "-o", engine, "--compute-capability", "8.9", "-q")
    assert result.returncode == 0 and engine.stat().st_size > 0, result.stderr

    manifest = tmp_path / "fp8.yaml"
    np.savez(tmp_path / "calib.npz", **dict(np.load(calib)))
    save(onnx.load(str(source)), tmp_path / "fp8.onnx")
    save(onnx.load(str(float_path)), tmp_path / "float.onnx")
    manifest.write_text("output: out\ndefaults:\n  eval_data: eval.npz\n  bench: {iterations: 3, warmup: 1}\n"
                        "models:\n  - name: conv\n    source: fp8.onnx\n    reference: float.onnx\n"
                        "    gates: {min_snr: 18}\ntargets:\n  - name: ada\n    compute_capabilities: [\"8.9\"]\n")
    result = cli("pipeline", manifest)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = {(s["step"], s["target"]): s["status"] for s in
             json.loads((tmp_path / "out" / "pipeline.json").read_text())["steps"]}
    for key in [("convert", None), ("check", None), ("verify", None), ("bench", None), ("build", "ada")]:
        assert steps[key] == "passed", (key, steps)
    converted = next((tmp_path / "out" / "conv").glob("conv.*.onnx"))
    assert set(qdq_types(converted)) == {FP8_ZP}
