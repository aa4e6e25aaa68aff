"""lift/weights.py: a source's 8-bit weights become float weights and int8 specs with the very values of the float64
formulas (``(W_q − zero_point) · scale``, rounded to float32 once; a negative scale's sign moved into the codes, as
NNCF's symmetric int8 writes them; channels whose centred integers do not fit [−127, 127] re-quantized on
``max |c·s| / 127``), computed in float32 and int16 and on the channels that need it only. Random int8 and uint8
sources, per tensor and per channel, scales from 1e-6 to 10, some negative."""

from __future__ import annotations

import numpy as np
import pytest

from trt_bridge.annotations import ScaleSource
from trt_bridge.lift.weights import _dequantized, _weight_spec

QMAX = 127


def _reference_spec(values, zero_point, scale, axis):
    """The float64 formulas, on every channel."""
    shape = [1] * values.ndim
    shape[axis] = -1
    zp = zero_point.reshape(shape) if zero_point.ndim else zero_point
    centred = values.astype(np.int64) - zp
    centred = np.where((scale.reshape(shape) if scale.ndim else scale) < 0, -centred, centred)
    scale = np.abs(scale)
    if np.abs(centred).max(initial=0) <= QMAX:
        return centred.astype(np.int8), np.asarray(scale, np.float32), ScaleSource.EXACT_WEIGHTS
    axes = tuple(i for i in range(centred.ndim) if i != axis)
    fits = np.abs(centred).max(axis=axes) <= QMAX
    scale_vec = np.broadcast_to(scale, fits.shape).astype(np.float64)
    floats = centred * scale_vec.reshape(shape)
    per_channel = np.where(fits, scale_vec, np.abs(floats).max(axis=axes) / QMAX)
    q = np.where(fits.reshape(shape), centred, np.rint(floats / per_channel.reshape(shape)))
    return np.clip(q, -QMAX, QMAX).astype(np.int8), per_channel.astype(np.float32), ScaleSource.REQUANTIZED


@pytest.mark.parametrize("seed", range(6))
def test_the_values_of_the_float64_formulas(seed):
    rng = np.random.default_rng(seed)
    requantized = 0
    for case in range(60):
        shape = tuple(int(d) for d in rng.integers(1, 9, size=rng.integers(2, 5)))
        axis = int(rng.integers(0, len(shape)))
        dtype = (np.uint8, np.int8)[case % 2]
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
        if case % 4 == 1:  # most channels fit, a few do not
            values = (values // 3).astype(dtype)
        channels = shape[axis]
        if case % 3:
            zero_point = rng.integers(info.min, info.max + 1, size=channels).astype(dtype)
            scale = (rng.random(channels) * 10.0 ** rng.integers(-6, 2, size=channels)).astype(np.float32)
        else:
            zero_point = np.array(rng.integers(0, 120), dtype)
            scale = np.array(rng.random() * 0.1, np.float32)
        if case % 5 == 2:  # NNCF's symmetric int8: negative scales (amax / −128), here on some channels
            scale = scale * np.where(rng.random(scale.shape) < 0.5, -1, 1).astype(np.float32)
        got = _weight_spec("w", values, zero_point, scale, axis, "origin")
        want = _reference_spec(values, zero_point, scale, axis)
        np.testing.assert_array_equal(got.codes, want[0])
        np.testing.assert_array_equal(got.scale, want[1])
        assert got.source == want[2]
        requantized += got.source is ScaleSource.REQUANTIZED
        shape1 = [1] * values.ndim
        shape1[axis] = -1
        zp = zero_point.reshape(shape1) if zero_point.ndim else zero_point
        sc = np.abs(scale.reshape(shape1) if scale.ndim else scale)
        for sc_type in (np.float32, np.float16):
            s = sc.astype(sc_type)
            np.testing.assert_array_equal(_dequantized(values, zp, s),
                                          ((values.astype(np.float64) - zp) * s).astype(np.float32))
    assert requantized > 10  # the re-quantizing path was exercised


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "Conv", "Conv1x1"])
@pytest.mark.parametrize("kind", ["asymmetric", "negative-scales"])
def test_nncf_weights_stay_exact_through_a_channel_shift(tmp_path, op, kind):
    """NNCF's weight compression: uint8 with a zero point per channel (INT8_ASYM, its default; a channel's centred
    codes reach past ±127) and int8 with scale = amax / −128 (INT8_SYM; refused as a broken model before). The codes
    stay exact as int8 plus each channel's shift in a float side path (lift/shifted_channels): op types left, exact
    against onnxruntime running the source, built by TensorRT-RTX. Re-quantizing those channels cost 1.9 dB on a real
    MiniLM (INT8_ASYM)."""
    import sys
    from pathlib import Path

    from onnx import TensorProto, helper, numpy_helper

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_ort, save, snr_db

    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions

    rng = np.random.default_rng(5)
    k, n = 64, 32
    conv = op.startswith("Conv")
    taps = 1 if op == "Conv1x1" else 9
    shape = (n, k // 8, taps) if conv else (k, n)  # channels on axis 0 for a Conv, 1 for a MatMul
    axis = 0 if conv else 1
    other = tuple(i for i in range(len(shape)) if i != axis)
    spread = [1] * len(shape)
    spread[axis] = -1
    w = (rng.normal(size=shape) + rng.uniform(-1, 1, n).reshape(spread)).astype(np.float32)  # channels off-centre
    if kind == "asymmetric":
        lo, hi = np.minimum(w.min(axis=other), 0), np.maximum(w.max(axis=other), 0)
        scale = ((hi - lo) / 255).astype(np.float32)
        zp = np.clip(np.rint(-lo / scale), 0, 255).astype(np.uint8)
        codes = np.clip(np.rint(w / scale.reshape(spread)) + zp.reshape(spread), 0, 255).astype(np.uint8)
    else:
        scale = (np.abs(w).max(axis=other) / -128).astype(np.float32)
        zp = np.zeros(n, np.int8)
        codes = np.clip(np.rint(w / scale.reshape(spread)), -128, 127).astype(np.int8)
    gemm = op == "Gemm"  # torch's Linear: W [N, K], transB, a bias, and an alpha to carry into the side path
    if conv:  # [N, C, kh, kw]: a 3×3 convolution with stride 2 and padding, or a 1×1 one
        codes = codes.reshape(n, k // 8, *((3, 3) if taps == 9 else (1, 1)))
    elif gemm:
        codes, axis = codes.T.copy(), 0
    inits = [numpy_helper.from_array(codes, "w_q"), numpy_helper.from_array(scale, "w_s"),
             numpy_helper.from_array(zp, "w_z"), numpy_helper.from_array(rng.normal(size=n).astype(np.float32), "b")]
    layer = {"Gemm": helper.make_node("Gemm", ["x", "w", "b"], ["y"], "fc", transB=1, alpha=0.5),
             "MatMul": helper.make_node("MatMul", ["x", "w"], ["y"], "fc"),
             "Conv": helper.make_node("Conv", ["x", "w", "b"], ["y"], "fc", pads=[1, 1, 1, 1], strides=[2, 2]),
             "Conv1x1": helper.make_node("Conv", ["x", "w", "b"], ["y"], "fc")}[op]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], "dq", axis=axis), layer]
    x_shape, y_shape = ([2, k // 8, 10, 10], [2, n, 5 if taps == 9 else 10, 5 if taps == 9 else 10]) if conv else \
        ([4, k], [4, n])
    graph = helper.make_graph(nodes, "nncf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    source = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "nncf.onnx")
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert {q["source"] for q in report.quantized} == {"exact-weights"} and not report.approximated
    model = assert_qdq_contract(out)
    pooled = {"AveragePool"} if op == "Conv" else set()  # a 3×3 window's sum; a 1×1 one is the channel sum itself
    assert op_types(model) == {"DequantizeLinear", op.removesuffix("1x1"), "ReduceSum", "Mul", "Add"} | pooled
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    (dq,) = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert np.all(inits[dq.input[1]] > 0) and inits[dq.input[0]].dtype == np.int8
    feeds = [{"x": rng.normal(size=x_shape).astype(np.float32)} for _ in range(4)]
    # measured 133–143 dB: float32 sums in another order
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 110
    assert_tensorrt_ready(out)


def test_a_layer_whose_input_the_source_quantizes_keeps_no_side_path(tmp_path):
    """onnxruntime's QDQ with uint8 weights (activations quantized too): the channels that do not fit ±127 are
    re-quantized as before, no side path (the layer runs in int8; a float sum of its input beside it would
    cost more than those channels' rounding)."""
    import sys
    from pathlib import Path

    from onnx import TensorProto, helper, numpy_helper

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import assert_qdq_contract, op_types, run_ort, save, snr_db

    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions

    rng = np.random.default_rng(6)
    w = (rng.normal(size=(64, 32)) + 1.5).astype(np.float32)
    scale = ((w.max(axis=0) - np.minimum(w.min(axis=0), 0)) / 255).astype(np.float32)
    zp = np.clip(np.rint(-np.minimum(w.min(axis=0), 0) / scale), 0, 255).astype(np.uint8)
    codes = np.clip(np.rint(w / scale) + zp, 0, 255).astype(np.uint8)
    inits = [numpy_helper.from_array(codes, "w_q"), numpy_helper.from_array(scale, "w_s"),
             numpy_helper.from_array(zp, "w_z"), numpy_helper.from_array(np.float32(0.02), "x_s"),
             numpy_helper.from_array(np.uint8(128), "x_z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"], "q_x"),
             helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"], "dq_x"),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], "dq", axis=1),
             helper.make_node("MatMul", ["x_dq", "w"], ["y"], "fc")]
    graph = helper.make_graph(nodes, "ort", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], inits)
    source = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "ort.onnx")
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert {q["source"] for q in report.quantized if q["kind"] == "weight"} == {"requantized-weights"}
    assert op_types(assert_qdq_contract(out)) == {"QuantizeLinear", "DequantizeLinear", "MatMul"}
    feeds = [{"x": rng.normal(size=(4, 64)).astype(np.float32)} for _ in range(4)]
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 30


@pytest.mark.parametrize("ftype", [np.float32, np.float16])
def test_two_zero_points_on_one_constant_get_their_own_codes(tmp_path, ftype):
    """Two DequantizeLinear of one uint8 constant with zero points that give the same channel shifts (channel 0 fits
    ±127 under both; the others shift alike): each MatMul keeps its own codes (a shared constant key gave the second
    the first's: 34 dB), also in a float16 model (the side path's constants were float32 there: an invalid model)."""
    import sys
    from pathlib import Path

    from onnx import TensorProto, helper, numpy_helper

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import assert_qdq_contract, assert_tensorrt_ready, save, snr_db

    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions

    rng = np.random.default_rng(7)
    k, n = 16, 8
    codes = rng.integers(0, 256, size=(k, n)).astype(np.uint8)
    codes[:, 0] = rng.integers(0, 100, k)
    elem = TensorProto.FLOAT16 if ftype == np.float16 else TensorProto.FLOAT
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "z1"], ["w1"], "dq1", axis=1),
             helper.make_node("DequantizeLinear", ["wq", "ws", "z2"], ["w2"], "dq2", axis=1),
             helper.make_node("MatMul", ["x", "w1"], ["y1"], "mm1"),
             helper.make_node("MatMul", ["x", "w2"], ["y2"], "mm2")]
    inits = [numpy_helper.from_array(codes, "wq"), numpy_helper.from_array(np.full(n, 0.01, ftype), "ws"),
             numpy_helper.from_array(np.zeros(n, np.uint8), "z1"),
             numpy_helper.from_array(np.array([9] + [0] * (n - 1), np.uint8), "z2")]
    graph = helper.make_graph(nodes, "two_dq", [helper.make_tensor_value_info("x", elem, [4, k])],
                              [helper.make_tensor_value_info(y, elem, [4, n]) for y in ("y1", "y2")], inits)
    source = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), tmp_path / "two_dq.onnx")
    out = tmp_path / "out.onnx"
    convert(source, out, ConvertOptions(progress=False))
    assert_qdq_contract(out)
    feeds = [{"x": rng.normal(size=(4, k)).astype(ftype)} for _ in range(4)]
    from trt_bridge.runtime.session import session

    theirs, ours = session(source), session(out)
    for output in (0, 1):  # measured 139 dB (float32), 67 dB (float16 arithmetic)
        want = [theirs.run(None, f)[output].astype(np.float32) for f in feeds]
        got = [ours.run(None, f)[output].astype(np.float32) for f in feeds]
        assert snr_db(want, got) > 45, output
    assert_tensorrt_ready(out)


def test_a_conv_padded_as_wide_as_its_window_takes_no_side_path(tmp_path):
    """A 1×1 Conv with pads 1 (ONNX allows it; an AveragePool does not): the channel shift would need such a pool,
    so its weight is re-quantized as before (the side path wrote a model onnxruntime refused)."""
    import sys
    from pathlib import Path

    from onnx import TensorProto, helper, numpy_helper

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_ort, save, snr_db

    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import ConvertOptions

    rng = np.random.default_rng(8)
    codes = rng.integers(0, 256, size=(16, 8, 1, 1)).astype(np.uint8)
    inits = [numpy_helper.from_array(codes, "wq"), numpy_helper.from_array(np.full(16, 0.01, np.float32), "ws"),
             numpy_helper.from_array(np.full(16, 20, np.uint8), "wz")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], "dq", axis=0),
             helper.make_node("Conv", ["x", "w"], ["y"], "conv", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], inits)
    source = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "pad.onnx")
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert {q["source"] for q in report.quantized} == {"requantized-weights"}
    assert op_types(assert_qdq_contract(out)) == {"DequantizeLinear", "Conv"}
    feeds = [{"x": rng.normal(size=(1, 8, 6, 6)).astype(np.float32)} for _ in range(2)]
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 44  # measured 49.4 dB: re-quantized channels
    assert_tensorrt_ready(out)
