"""FP8 sources with float16 and float32 regions (issue 38): the structures ModelOpt's FP8 export writes with
``--high_precision_dtype fp16`` where a layer stays float32 (``--op_types_to_exclude_fp16 MatMul``/``Conv``), a
Q/DQ pair whose scales differ in type, and a float16 BatchNormalization whose variance overflowed to +Inf (its
PP-OCRv4 text detector). Each converts keeping its FP8 layers quantized, computes what onnxruntime computes on the
source, and builds with TensorRT-RTX for SM 8.9.
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, run_ort, save, snr_db
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.errors import UnsupportedPatternError

RNG = np.random.default_rng(38)


def _fp8(name, values):
    tensor = numpy_helper.from_array(values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), name)
    tensor.data_type = T.FLOAT8E4M3FN
    return tensor


def _zero(name, count=None):
    return helper.make_tensor(name, T.FLOAT8E4M3FN, [] if count is None else [count], [0] * (count or 1))


def _weight(name, shape, axis, dtype):
    """(FP8 codes, per-channel scale of ``dtype``, zero point) of a random weight along ``axis``."""
    w = RNG.standard_normal(shape).astype(np.float32) * 0.2
    amax = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis))
    scale = (amax / 448).astype(dtype)
    codes = w / scale.astype(np.float32).reshape([-1 if i == axis else 1 for i in range(w.ndim)])
    return [_fp8(f"{name}_q", codes), numpy_helper.from_array(scale, f"{name}_s"), _zero(f"{name}_z", shape[axis])]


def _scalar(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _model(nodes, inits, inputs, outputs):
    graph = helper.make_graph(nodes, "modelopt_fp8", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def encoder_excluded_matmul():
    """ModelOpt's FP8 encoder with ``--op_types_to_exclude_fp16 MatMul``: the layer norm and the second MatMul in
    float16, the first MatMul in float32 behind the Casts its fp16 conversion wrote after each DQ::

        x:f32 ─ Cast(f16) ─ LayerNorm ─ Q(s16) ─ DQ(s16) ─ Cast(f32) ─ MatMul:f32 ─ Cast(f16) ─ Q ─ DQ ─ MatMul:f16
                            w1:fp8 ─ DQ(s16, axis 1) ─ Cast(f32) ──┘        w2:f16 ─ Q(s16) ─ DQ(s16) ─┘
        ─ Cast(f32) ─ y
    """
    inits = _weight("w1", (64, 64), 1, np.float16) + [
        _scalar("s_a", 6 / 448, np.float16), _zero("z"), _scalar("s_b", 4 / 448, np.float16),
        numpy_helper.from_array(np.ones(64, np.float16), "g"), numpy_helper.from_array(np.zeros(64, np.float16), "b"),
        numpy_helper.from_array((RNG.standard_normal((64, 32)) * 0.2).astype(np.float16), "w2"),
        numpy_helper.from_array((np.abs(RNG.standard_normal(32)) * 0.2 / 448 + 1e-3).astype(np.float16), "w2_s"),
        _zero("w2_z", 32)]
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=T.FLOAT16),
        helper.make_node("LayerNormalization", ["x16", "g", "b"], ["ln"], axis=-1),
        helper.make_node("QuantizeLinear", ["ln", "s_a", "z"], ["ln_q"]),
        helper.make_node("DequantizeLinear", ["ln_q", "s_a", "z"], ["ln_dq"]),
        helper.make_node("Cast", ["ln_dq"], ["ln_dq32"], to=T.FLOAT),
        helper.make_node("DequantizeLinear", ["w1_q", "w1_s", "w1_z"], ["w1_dq"], axis=1),
        helper.make_node("Cast", ["w1_dq"], ["w1_dq32"], to=T.FLOAT),
        helper.make_node("MatMul", ["ln_dq32", "w1_dq32"], ["h32"]),
        helper.make_node("Cast", ["h32"], ["h"], to=T.FLOAT16),
        helper.make_node("QuantizeLinear", ["h", "s_b", "z"], ["h_q"]),
        helper.make_node("DequantizeLinear", ["h_q", "s_b", "z"], ["h_dq"]),
        helper.make_node("QuantizeLinear", ["w2", "w2_s", "w2_z"], ["w2_q"], axis=1),
        helper.make_node("DequantizeLinear", ["w2_q", "w2_s", "w2_z"], ["w2_dq"], axis=1),
        helper.make_node("MatMul", ["h_dq", "w2_dq"], ["y16"]),
        helper.make_node("Cast", ["y16"], ["y"], to=T.FLOAT)]
    return _model(nodes, inits, [helper.make_tensor_value_info("x", T.FLOAT, [2, 16, 64])],
                  [helper.make_tensor_value_info("y", T.FLOAT, [2, 16, 32])])


def detector_excluded_conv():
    """ModelOpt's FP8 detector with ``--op_types_to_exclude_fp16 Conv``: each Conv float32, the rest float16; one
    activation DQ feeds a float16 Concat and, through a Cast, a float32 Conv (32 channels: placement gives
    convolutions of 16 channels or fewer back to float)::

        x:f32 ─ Cast(f16) ─ Q ─ DQ ─┬──────────── Concat:f16 ─ Cast(f32) ─ y
                                    └ Cast(f32) ─ Conv:f32 ─ Cast(f16) ─ Sigmoid ─┘
                         w:fp8 ─ DQ(s16, axis 0) ─ Cast(f32) ─┘
    """
    inits = _weight("w", (32, 32, 3, 3), 0, np.float16) + [
        _scalar("s", 3 / 448, np.float16), _zero("z"),
        numpy_helper.from_array((RNG.standard_normal(32) * 0.1).astype(np.float32), "bias")]
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=T.FLOAT16),
        helper.make_node("QuantizeLinear", ["x16", "s", "z"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]),
        helper.make_node("Cast", ["x_dq"], ["x_dq32"], to=T.FLOAT),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], axis=0),
        helper.make_node("Cast", ["w_dq"], ["w_dq32"], to=T.FLOAT),
        helper.make_node("Conv", ["x_dq32", "w_dq32", "bias"], ["c32"], pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["c32"], ["c"], to=T.FLOAT16),
        helper.make_node("Sigmoid", ["c"], ["a"]),
        helper.make_node("Concat", ["x_dq", "a"], ["cat"], axis=1),
        helper.make_node("Cast", ["cat"], ["y"], to=T.FLOAT)]
    return _model(nodes, inits, [helper.make_tensor_value_info("x", T.FLOAT, [1, 32, 16, 16])],
                  [helper.make_tensor_value_info("y", T.FLOAT, [1, 64, 16, 16])])


def pair_of_two_types(q_type, dq_type):
    """A Q and its DQ with scales of different float types (the same value), the MatMul in the DQ's type::

        x:f32 ─ Cast(q_type) ─ Q(s:q_type) ─ DQ(s:dq_type) ─ MatMul:dq_type ─ Cast(f32) ─ y
                                    w:fp8 ─ DQ(s:dq_type, axis 1) ─┘
    """
    np_q, np_dq = (onnx.helper.tensor_dtype_to_np_dtype(t) for t in (q_type, dq_type))
    scale = np.float16(5 / 448)
    inits = _weight("w", (32, 8), 1, np_dq) + [_scalar("s_q", scale, np_q), _scalar("s_dq", scale, np_dq), _zero("z")]
    nodes = [
        helper.make_node("Cast", ["x"], ["xc"], to=q_type),
        helper.make_node("QuantizeLinear", ["xc", "s_q", "z"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "s_dq", "z"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], axis=1),
        helper.make_node("MatMul", ["x_dq", "w_dq"], ["yc"]),
        helper.make_node("Cast", ["yc"], ["y"], to=T.FLOAT)]
    return _model(nodes, inits, [helper.make_tensor_value_info("x", T.FLOAT, [4, 32])],
                  [helper.make_tensor_value_info("y", T.FLOAT, [4, 8])])


def batchnorm_variance(variance_value):
    """ModelOpt's float16 PP-OCR head: Conv ─ BatchNormalization ─ Relu, the Conv FP8; the variance of some
    channels beyond float16's range became ``variance_value`` (+Inf in the real export)::

        x:f16 ─ Q ─ DQ ─ Conv ─ BatchNormalization(var[0:3] = variance_value) ─ Relu ─ y
              w:f16 ─ Q ─ DQ ─┘
    """
    var = np.abs(RNG.standard_normal(8)).astype(np.float16) + np.float16(0.5)
    var[:3] = variance_value
    inits = [numpy_helper.from_array((RNG.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float16), "w"),
             numpy_helper.from_array(np.full(8, 1.2 / 448, np.float16), "w_s"), _zero("w_z", 8),
             _scalar("s", 3 / 448, np.float16), _zero("z"),
             numpy_helper.from_array(np.ones(8, np.float16), "gamma"),
             numpy_helper.from_array((RNG.standard_normal(8) * 0.3).astype(np.float16), "beta"),
             numpy_helper.from_array((RNG.standard_normal(8) * 0.1).astype(np.float16), "mean"),
             numpy_helper.from_array(var, "var")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]),
        helper.make_node("QuantizeLinear", ["w", "w_s", "w_z"], ["w_q"], axis=0),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], axis=0),
        helper.make_node("Conv", ["x_dq", "w_dq"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"])]
    return _model(nodes, inits, [helper.make_tensor_value_info("x", T.FLOAT16, [1, 4, 16, 16])],
                  [helper.make_tensor_value_info("y", T.FLOAT16, [1, 8, 16, 16])])


def _feeds(model, count=4):
    x = model.graph.input[0].type.tensor_type
    shape = [d.dim_value for d in x.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(x.elem_type)
    return [{"x": RNG.standard_normal(shape).astype(dtype)} for _ in range(count)]


def _convert(model, tmp_path):
    source, out = save(model, tmp_path / "source.onnx"), tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(check=False, progress=False))
    return source, out, report


def _dq_consumers(path) -> set[str]:
    """The op types that read a DequantizeLinear's output."""
    model = onnx.load(str(path))
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {n.op_type for n in model.graph.node if any(i in dq for i in n.input)}


CASES = {"encoder": (encoder_excluded_matmul, {"MatMul"}, 2),
         "detector": (detector_excluded_conv, {"Conv"}, 1),
         "pair f16→f32": (lambda: pair_of_two_types(T.FLOAT16, T.FLOAT), {"MatMul"}, 1),
         "pair f32→f16": (lambda: pair_of_two_types(T.FLOAT, T.FLOAT16), {"MatMul"}, 1)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mixed_float_regions_keep_their_fp8_layers(name, tmp_path):
    build, quantized_ops, layers = CASES[name]
    model = build()
    import onnx_graphsurgeon as gs

    from trt_bridge.prepare import AgreeQDQFloatTypes

    changes = AgreeQDQFloatTypes().apply(gs.import_onnx(model))
    assert changes and {c.pass_name for c in changes} == {"qdq-float-types"}
    source, out, _ = _convert(model, tmp_path)
    assert_qdq_contract(out)
    # every FP8 layer stays quantized: each DQ feeds the layer itself, never a Cast in front of it
    assert _dq_consumers(out) <= quantized_ops | {"Concat"} and quantized_ops <= _dq_consumers(out)
    converted = onnx.load(str(out))
    weighted = [n for n in converted.graph.node if n.op_type in quantized_ops]
    assert len(weighted) == layers
    feeds = _feeds(model)
    by_source, by_output = run_ort(source, feeds), run_ort(out, feeds)
    # the same FP8 codes and scales; only float16's rounding of the dequantized products differs
    assert snr_db(by_source, by_output) > 45.0, snr_db(by_source, by_output)
    assert_tensorrt_ready(out)


def test_an_inf_batchnorm_variance_converts_as_the_source_computes_it(tmp_path, caplog):
    model = batchnorm_variance(np.inf)
    with caplog.at_level(logging.WARNING, logger="trt_bridge.ir.values"):
        source, out, _ = _convert(model, tmp_path)
    assert "variance 'var' = +inf in 3 of 8 channel(s)" in caplog.text
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "BatchNormalization"} <= {
        n.op_type for n in onnx.load(str(out)).graph.node}
    feeds = _feeds(model)
    by_source, by_output = run_ort(source, feeds), run_ort(out, feeds)
    assert all(np.isfinite(y).all() for y in by_output)
    # the +Inf channels output their bias (through the Relu) alone, in both
    beta = np.maximum(numpy_helper.to_array(model.graph.initializer[6])[:3], 0)
    np.testing.assert_allclose(by_output[0][0, :3, 5, 5], beta, atol=1e-3)
    assert snr_db(by_source, by_output) > 40.0
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_a_nan_or_negative_inf_variance_is_refused_naming_it(value, tmp_path):
    with pytest.raises(UnsupportedPatternError, match="BatchNormalization .* reads weight 'var' holds 3 non-finite"):
        _convert(batchnorm_variance(value), tmp_path)


def test_check_names_the_fp8_of_layers_behind_a_cast(tmp_path):
    """``check`` on the source: a DequantizeLinear read through a Cast still quantizes its layer (it said INT8, the
    headline's default, when it found no quantized layer)."""
    from trt_bridge.checks import check_model

    report = check_model(save(encoder_excluded_matmul(), tmp_path / "source.onnx"))
    assert report.precisions["counts"].get("fp8") == 2  # the float32 MatMul behind its Casts and the float16 one
    assert "TensorRT-ready FP8 (" in report.headline()
