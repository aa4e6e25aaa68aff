"""`convert --high-precision fp16`: the non-quantized layers in float16, the sensitive and the out-of-range ones
kept in float32; float16 Q/DQ stay fusable; the result stays within 0.5 dB of the float32 one, runs in
onnxruntime and builds in TensorRT-RTX. Also the per-layer precision census in the report and `check`."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, save, snr_db

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, CalibrationOptions, ConvertOptions, PrecisionOptions
from trt_bridge.place.policies import PlacementOptions
from trt_bridge.runtime.session import session

#: the static conversion these tests check (a dynamic source would otherwise get runtime ranges)
STATIC = ActivationOptions(runtime_ranges="off")

LOUD = 30000.0  # this block's residual stream then reaches ~1e5: float16 overflows without the range check


def _block(root, loud: float):
    src = save(samples.transformer_block(layers=2), root / "tb.onnx")
    np.savez(root / "calib.npz", x=samples.sequence_feeds(16, 1, 16, 64) * loud)
    feeds = [{"x": f * loud} for f in samples.sequence_feeds(8, 2, 16, 64)]
    return root, src, feeds


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    return _block(tmp_path_factory.mktemp("fp16"), 1.0)


@pytest.fixture(scope="module")
def loud(tmp_path_factory):
    return _block(tmp_path_factory.mktemp("fp16-loud"), LOUD)


def _convert_each(root, src, kinds):
    """``src`` converted once per --high-precision kind (each TensorRT-ready INT8); the paths, and the last report."""
    outs = {}
    for hp in kinds:
        outs[hp] = root / f"{src.stem}.{hp}.onnx"
        report = convert(src, outs[hp], ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")),
                                                       activations=STATIC,
                                                       precision=PrecisionOptions(high_precision=hp), progress=False))
        assert_qdq_contract(outs[hp])
        assert report.check["ready"]
    return outs, report


def _snr(src, out, feeds):
    reference = [session(src).run(None, f)[0] for f in feeds]
    return snr_db(reference, [session(out).run(None, f)[0].astype(np.float32) for f in feeds])


def test_fp16_keeps_sensitive_and_out_of_range_layers_in_fp32(block):
    root, src, feeds = block
    outs, report = _convert_each(root, src, ("fp32", "fp16"))
    kept = {k["node"]: k["reason"] for k in report.precision["kept_in_float32"]}
    sensitive = {n for n, r in kept.items() if "numerically sensitive" in r}  # LayerNorm, Softmax
    # the FFN down projections read the re-centred GELU: they and their compensation Adds keep c·ΣW exact
    compensating = {n for n, r in kept.items() if "compensating the re-centred" in r}
    assert sensitive and compensating == {"layer0.ffn.down/MatMul", "layer0.ffn.down/MatMul_recenter_bias",
                                          "layer1.ffn.down/MatMul", "layer1.ffn.down/MatMul_recenter_bias"}
    assert set(kept) == sensitive | compensating
    counts = report.precision["counts"]
    assert counts["int8"] == 12 and counts["fp16"] > counts["fp32"] > 0
    model = onnx.load(str(outs["fp16"]))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # interface kept
    scales = {i.name: i.data_type for i in model.graph.initializer}
    assert any(n.op_type == "DequantizeLinear" and scales.get(n.input[1]) == onnx.TensorProto.FLOAT16
               for n in model.graph.node)  # float16 Q/DQ, read and written directly
    snr32, snr16 = _snr(src, outs["fp32"], feeds), _snr(src, outs["fp16"], feeds)
    assert np.isfinite(snr16) and snr16 > snr32 - 0.5, (snr32, snr16)
    assert_tensorrt_ready(outs["fp16"])


def test_loud_activations_stay_fp32(loud):
    """Pre-LayerNorm activations of ~1e5 (beyond float16's 65504): the range check keeps the layers that read or
    write them in float32, and the model stays finite and accurate."""
    root, src, feeds = loud
    out = root / "tb.fp16.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")),
                                              precision=PrecisionOptions(high_precision="fp16"), progress=False))
    reasons = [k["reason"] for k in report.precision["kept_in_float32"]]
    assert any("beyond float16's safe range" in r for r in reasons)
    good = [session(out).run(None, f)[0] for f in feeds]
    reference = [session(src).run(None, f)[0] for f in feeds]
    assert all(np.isfinite(o).all() for o in good) and snr_db(reference, good) > 30
    assert onnx.load(str(out)).graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert_tensorrt_ready(out)


def test_check_reports_layer_precisions(block):
    from trt_bridge.checks import CheckOptions, TrtProbe, check_model

    root, src, feeds = block
    outs, _ = _convert_each(root, src, ("fp16",))  # self-contained: no file left by another test
    out = outs["fp16"]
    report = check_model(out, CheckOptions(TrtProbe.OFF))
    assert report.precisions["counts"]["int8"] == 12 and "FP16" in report.summary()
    assert _snr(src, out, feeds) > 34  # measured 37.5 dB
    assert_tensorrt_ready(out)


def _casts_into_q(model: onnx.ModelProto) -> list[str]:
    """QuantizeLinear nodes that read a Cast to float32 of a lower-precision tensor (a Q left unfused)."""
    from trt_bridge.ir.types import value_types

    types = {n: t.tensor_type.elem_type for n, t in value_types(model).items()}
    producer = {o: n for n in model.graph.node for o in n.output}
    low = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    return [n.name for n in model.graph.node if n.op_type == "QuantizeLinear"
            and (p := producer.get(n.input[0])) is not None and p.op_type == "Cast" and types.get(p.input[0]) in low]


def test_bf16_writes_the_float_part_in_bfloat16(block):
    """--high-precision bf16: the same layers as fp16 in bfloat16 (Q/DQ with bfloat16 scales, nothing left in
    float16), the sensitive ones in float32, the interface float32; the onnxruntime emulation computes the same
    function within bfloat16's precision, and TensorRT-RTX builds it."""
    root, src, feeds = block
    out32, out = root / "tb.bf16-ref.onnx", root / "tb.bf16.onnx"
    convert(src, out32, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False))
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")),
                                              precision=PrecisionOptions(high_precision="bf16"), progress=False))
    assert_qdq_contract(out)
    assert report.check["ready"]
    assert [f["rule"] for f in report.check["findings"]] == ["bf16"]  # a warning: compute capability 8.0+
    counts = report.precision["counts"]
    assert counts["int8"] == 12 and counts["bf16"] > counts["fp32"] > 0 and "fp16" not in counts
    kept = {k["op"] for k in report.precision["kept_in_float32"]}
    assert kept == {"LayerNormalization", "Softmax", "MatMul", "Add"}  # MatMul/Add: the re-centred compensation
    model = onnx.load(str(out))
    types = {i.data_type for i in model.graph.initializer}
    assert onnx.TensorProto.BFLOAT16 in types and onnx.TensorProto.FLOAT16 not in types
    assert not any(a.i == onnx.TensorProto.FLOAT16 for n in model.graph.node for a in n.attribute if a.name == "to")
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert not _casts_into_q(model)
    bf16_scales = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.BFLOAT16}
    assert sum(n.op_type == "DequantizeLinear" and n.input[1] in bf16_scales for n in model.graph.node) >= 12
    snr32, snr_bf16 = _snr(src, out32, feeds), _snr(src, out, feeds)  # session() emulates bfloat16
    # bfloat16 keeps 8 bits of mantissa to float16's 11: measured 36.5 dB against 37.4 dB in float32
    assert np.isfinite(snr_bf16) and snr_bf16 > snr32 - 1.5, (snr32, snr_bf16)
    assert_tensorrt_ready(out)


def test_bf16_needs_no_float32_for_loud_activations(loud):
    """bfloat16 has float32's range: the ~1e5 activations that keep float16 layers in float32 stay bfloat16."""
    root, src, feeds = loud
    out = root / "tb.bf16.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")),
                                              activations=STATIC,
                                              precision=PrecisionOptions(high_precision="bf16"), progress=False))
    assert not any("range" in k["reason"] for k in report.precision["kept_in_float32"])
    reference = [session(src).run(None, f)[0] for f in feeds]
    got = [session(out).run(None, f)[0] for f in feeds]
    assert all(np.isfinite(o).all() for o in got) and snr_db(reference, got) > 45  # measured 55.5 dB
    assert_tensorrt_ready(out)


def test_fp16_and_bf16_keep_tensor_names_for_per_layer(block):
    """The float16 converter renames the outputs of the layers it keeps in float32; the rewrite gives them their
    names back, so `verify --per-layer` aligns the LayerNorm outputs and measures each layer's input."""
    from trt_bridge.verification.layers import localize

    root, src, feeds = block
    for hp in ("fp16", "bf16"):
        out = root / f"tb.names.{hp}.onnx"
        convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")),
                                         precision=PrecisionOptions(high_precision=hp), progress=False))
        outputs = {o for n in onnx.load(str(out)).graph.node for o in n.output}
        assert {"layer0.ln1.out", "layer1.ln2.out"} <= outputs and not any("_output_cast_" in o for o in outputs)
        found = localize(src, out, feeds, progress=False)
        downstream = [x for x in found.layers if x.node.startswith("layer1.")]
        assert downstream and all(x.inputs and x.snr_in_db is not None for x in downstream), hp  # aligned, measured
        assert _snr(src, out, feeds) > {"fp16": 34, "bf16": 33}[hp]  # measured 37.5 dB (fp16), 36.5 dB (bf16)
        assert_tensorrt_ready(out)


def test_bf16_io_types_and_option_errors(block, tmp_path):
    from trt_bridge.errors import TrtBridgeError

    root, src, feeds = block
    out = tmp_path / "tb.bf16io.onnx"
    convert(src, out, ConvertOptions(
        calibration=CalibrationOptions(data=str(root / "calib.npz")),
        precision=PrecisionOptions(high_precision="bf16", io_types="bf16"), progress=False))
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    reference = [session(src).run(None, f)[0] for f in feeds]
    assert snr_db(reference, [session(out).run(None, f)[0] for f in feeds]) > 30  # float32 feeds, rounded in
    assert_tensorrt_ready(out)
    with pytest.raises(TrtBridgeError, match="--high-precision bf16"):
        convert(src, tmp_path / "x.onnx", ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")),
                                                         precision=PrecisionOptions(high_precision="fp16",
                                                                                    io_types="bf16"), progress=False))
    assert not (tmp_path / "x.onnx").exists()


def test_bfloat16_emulation_rounds_like_tensorrt():
    """The emulation onnxruntime runs: each bfloat16 result is the float32 result rounded to bfloat16 (to nearest
    even), checked exactly against ml_dtypes; bfloat16 constants are exact in float32."""
    import ml_dtypes
    from onnx import TensorProto, helper

    from trt_bridge.runtime.bf16 import emulate_bfloat16

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    bias = rng.standard_normal(8).astype(ml_dtypes.bfloat16)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
         helper.make_node("Cast", ["w"], ["wb"], to=TensorProto.BFLOAT16),
         helper.make_node("MatMul", ["xb", "wb"], ["m"]),
         helper.make_node("Add", ["m", "bias"], ["a"]),
         helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    emulated = emulate_bfloat16(model)
    assert emulate_bfloat16(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "f", [
        graph.input[0]], [graph.output[0]]))) is None
    x = rng.standard_normal((4, 8)).astype(np.float32)
    got = session(emulated).run(None, {"x": x})[0]

    def bf(a):
        return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)

    want = bf(bf(bf(x) @ bf(w)) + bias.astype(np.float32))
    np.testing.assert_array_equal(got, want)
    assert {n.name for n in emulated.graph.node} >= {"m__round", "a__round"}
    assert [o.name for o in emulated.graph.output] == ["y"]


def test_bf16_conv_net_moves_to_opset_22(tmp_path):
    """Conv, pooling and most activations have bfloat16 only from ONNX opset 22: a CNN is upgraded to it (instead
    of keeping its convolutions in float32), and an op still without bfloat16 would be kept in float32."""
    from trt_bridge.lower.precision import _lacks_bfloat16

    src = save(samples.conv_net(), tmp_path / "cn.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(8, seed=1))
    outs, report = _convert_each(tmp_path, src, ("fp32", "bf16"))
    assert report.output_opset == 22
    assert "fp32" not in report.precision["counts"] and report.precision["counts"]["bf16"] > 0
    feeds = [{"x": f} for f in samples.image_feeds(8, seed=2)]
    snr32, snr_bf16 = _snr(src, outs["fp32"], feeds), _snr(src, outs["bf16"], feeds)
    # measured 37.54 dB against 37.94; 33.6 dB before the re-centred convolutions kept their bias exact and
    # the ReLU zeros stayed on the rounded grid
    assert snr_bf16 > snr32 - 1.0, (snr32, snr_bf16)
    assert_tensorrt_ready(outs["bf16"])
    conv = onnx.helper.make_node("Conv", ["x", "w"], ["y"])
    assert _lacks_bfloat16(conv, 19) and not _lacks_bfloat16(conv, 22)
    assert _lacks_bfloat16(onnx.helper.make_node("Custom", ["x"], ["y"], domain="com.example"), 22)


@pytest.mark.parametrize("hp", ["fp16", "bf16"])
def test_recentred_relu_zero_stays_on_the_rounded_grid(tmp_path, hp):
    """A re-centred ReLU output under --high-precision fp16/bf16: the scale is representable in that type and the
    centre is 128 steps, so 0 (most of a ReLU's values) and the Pad value −c are int8 code −128 exactly, and
    the convolution that compensates the shift keeps float32 weights scales and bias."""
    src = save(samples.conv_net(), tmp_path / "cn.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(8, seed=1))
    out = tmp_path / f"cn.{hp}.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              activations=STATIC,
                                              precision=PrecisionOptions(high_precision=hp), progress=False))
    assert report.recentered
    model = onnx.load(str(out))
    inits = {i.name: onnx.numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    pads = [n for n in model.graph.node if n.op_type == "Pad"]
    assert pads
    readers = {i: n for n in model.graph.node for i in n.input}
    for pad in pads:
        value = float(inits[pad.input[2]])
        q = readers[pad.output[0]]
        scale = float(inits[q.input[1]])
        assert value / scale == -128.0, (pad.name, value, scale)
    kept = {k["node"] for k in report.precision["kept_in_float32"] if "compensating" in k["reason"]}
    convs = {n.name for n in model.graph.node if n.op_type == "Conv"
             and any(i.endswith("_bias_recentered") for i in n.input)}
    assert convs and convs <= kept
    for node in model.graph.node:
        if node.name in convs:
            assert all(model_type(model, i) == onnx.TensorProto.FLOAT for i in node.input[1:]), node.name
    feeds = [{"x": f} for f in samples.image_feeds(8, seed=2)]
    assert _snr(src, out, feeds) > 34  # measured 37.9 dB (fp16), 37.5 dB (bf16)
    assert_tensorrt_ready(out)


def model_type(model: onnx.ModelProto, tensor: str) -> int:
    from trt_bridge.ir.types import value_types

    inits = {i.name: i.data_type for i in model.graph.initializer}
    return inits[tensor] if tensor in inits else value_types(model)[tensor].tensor_type.elem_type


def test_bf16_keeps_conv_transpose_in_float32(tmp_path):
    """TensorRT(-RTX 1.7) builds no bfloat16 deconvolution (a detector's upsampling head failed to build): the
    quantized ConvTranspose stays float32 with its reason, the rest is bfloat16, and the model builds."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], name="down", pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("ConvTranspose", ["r", "w2", "b2"], ["u"], name="up", strides=[2, 2]),
         helper.make_node("Sigmoid", ["u"], ["y"], name="head")], "deconv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        [onnx.numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w1"),
         onnx.numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b1"),
         onnx.numpy_helper.from_array(rng.standard_normal((16, 4, 2, 2)).astype(np.float32) * 0.2, "w2"),
         onnx.numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "b2")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "deconv.onnx")
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((8, 1, 8, 16, 16)).astype(np.float32))
    out = tmp_path / "deconv.bf16.onnx"
    report = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              placement=PlacementOptions(include_ops="ConvTranspose"),
                                              precision=PrecisionOptions(high_precision="bf16"), progress=False))
    assert_qdq_contract(out)
    kept = {k["node"]: k["reason"] for k in report.precision["kept_in_float32"]}
    assert "up" in kept and "deconvolution" in kept["up"]
    assert report.precision["layers"]["up"] == "int8" and report.precision["counts"]["int8"] == 2
    assert report.precision["layers"]["head"] == "bf16"
    feeds = [{"x": f} for f in rng.standard_normal((4, 1, 8, 16, 16)).astype(np.float32)]
    reference = [session(src).run(None, f)[0] for f in feeds]
    assert snr_db(reference, [session(out).run(None, f)[0] for f in feeds]) > 25
    assert_tensorrt_ready(out)
