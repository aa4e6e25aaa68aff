"""Load-time repairs (``trt_bridge/repair.py``): what Intel Neural Compressor 1.0 writes that onnxruntime runs and
``onnx.checker`` rejects. Each test builds the pattern, checks that the checker rejects it and onnxruntime runs it,
converts it, and compares the converted model with onnxruntime on the source; TensorRT-RTX parses and builds it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import (  # noqa: E402
    assert_qdq_contract,
    assert_tensorrt_ready,
    op_types,
    quantize_dynamic,
    quantize_static,
    run_ort,
    save,
    snr_db,
)
from onnxruntime.quantization import QuantType  # noqa: E402

from trt_bridge.checks import CheckOptions, TrtProbe, check_model  # noqa: E402
from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions  # noqa: E402
from trt_bridge.errors import ModelLoadError  # noqa: E402
from trt_bridge.ir.repair import (  # noqa: E402
    dedupe_initializers,
    import_used_domains,
    per_axis_scale_lengths,
    single_value_field,
)

RNG = np.random.default_rng(3)


def _feeds(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 16, 8, 8)).astype(np.float32)} for _ in range(count)]


def _convert(source: Path, tmp_path: Path) -> Path:
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))  # static source: its own scales
    assert not report.remaining_blockers
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)
    return out


# --- one name, several initializers (INC's quantized copies of a bias that onnxruntime's optimizer shared) --------
#
#   x ─ Q(sx) ─ DQ ─ Conv1 ─ Q(sy) ─ DQ ─ Conv2 ─ y        W1_q ─ DQ ─ Conv1,  W2_q ─ DQ ─ Conv2
#                     │                  │
#   b_quantized, b_scale ─ DQ ─ b_dequantized ─┘          initializers: b_quantized, b_scale (copy for Conv1),
#                                                                       b_quantized, b_scale (copy for Conv2)
#
# onnxruntime runs the last copy of each name for both readers; so must the conversion.

def _shared_bias_model() -> onnx.ModelProto:
    def conv_weight(name):
        w = RNG.normal(size=(16, 16, 3, 3)) / 12
        scale = np.abs(w).reshape(16, -1).max(1) / 127
        return {f"{name}_q": np.rint(w / scale[:, None, None, None]).astype(np.int8),
                f"{name}_s": scale.astype(np.float32), f"{name}_z": np.zeros(16, np.int8)}

    inits = {**conv_weight("W1"), **conv_weight("W2"), "sx": np.float32(4 / 127), "sy": np.float32(2 / 127),
             "zx": np.int8(0), "b_zero_point": np.zeros(16, np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], "qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], "dqx"),
             helper.make_node("DequantizeLinear", ["W1_q", "W1_s", "W1_z"], ["W1"], "dqw1", axis=0),
             helper.make_node("DequantizeLinear", ["W2_q", "W2_s", "W2_z"], ["W2"], "dqw2", axis=0),
             helper.make_node("DequantizeLinear", ["b_quantized", "b_scale", "b_zero_point"], ["b_dequantized"],
                              "b_DequantizeLinear", axis=0),
             helper.make_node("Conv", ["xd", "W1", "b_dequantized"], ["h"], "conv1", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["h", "sy", "zx"], ["hq"], "qh"),
             helper.make_node("DequantizeLinear", ["hq", "sy", "zx"], ["hd"], "dqh"),
             helper.make_node("Conv", ["hd", "W2", "b_dequantized"], ["y"], "conv2", pads=[1, 1, 1, 1])]
    tensors = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    for copy in range(2):  # two different copies under the same two names, the second is what onnxruntime runs
        bias = RNG.normal(size=16) / 4
        scale = np.full(16, (0.05 + 0.05 * copy) / 2**10)
        tensors += [numpy_helper.from_array(np.rint(bias / scale).astype(np.int32), "b_quantized"),
                    numpy_helper.from_array(scale.astype(np.float32), "b_scale")]
    graph = helper.make_graph(nodes, "shared_bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_duplicate_initializer_names_keep_the_last_copy_as_onnxruntime_does(tmp_path, caplog):
    model = _shared_bias_model()
    with pytest.raises(onnx.checker.ValidationError, match="not unique"):
        onnx.checker.check_model(model)
    source = save(model, tmp_path / "source.onnx")
    checked = check_model(source)  # `check` says so, with TensorRT's parser's own message
    invalid = [f for f in checked.findings if f.rule == "invalid-onnx"]
    assert len(invalid) == 1 and invalid[0].fixable and "kept the last of each" in invalid[0].fix
    assert "duplicate tensor name" in (invalid[0].tensorrt or "")
    assert not [f for f in checked.findings if f.rule == "tensorrt-parser"]
    with caplog.at_level(logging.WARNING, logger="trt_bridge"):
        out = _convert(source, tmp_path)
    assert "kept the last of each" in caplog.text and "differing values" in caplog.text
    assert op_types(out) == {"QuantizeLinear", "DequantizeLinear", "Conv"}
    held_out = _feeds(4, 11)
    # onnxruntime runs the source (the last copies); the conversion computes the same, at int8 precision
    assert snr_db(run_ort(source, held_out), run_ort(out, held_out)) > 30
    # and not what the first copies would compute
    first = onnx.ModelProto()
    first.CopyFrom(model)
    kept = [t for t in first.graph.initializer if t.name not in ("b_quantized", "b_scale")] + \
        [t for t in first.graph.initializer if t.name in ("b_quantized", "b_scale")][:2]
    del first.graph.initializer[:]
    first.graph.initializer.extend(kept)
    assert snr_db(run_ort(first, held_out), run_ort(out, held_out)) < 20


def test_identical_copies_are_merged_and_nothing_else_changes():
    model = _shared_bias_model()
    last = [t for t in model.graph.initializer if t.name == "b_scale"][-1]
    for t in model.graph.initializer:
        if t.name == "b_scale":
            t.CopyFrom(last)
    valid = onnx.ModelProto()
    valid.CopyFrom(model)
    assert dedupe_initializers(model) == ["b_quantized", "b_scale"]
    assert [t.name for t in model.graph.initializer].count("b_scale") == 1
    assert dedupe_initializers(model) == []  # idempotent: a valid model is left as it is
    assert import_used_domains(model) == []


# --- com.microsoft ops without the domain's opset import (INC's SmoothQuant path) ---------------------------------
#
#   x ─ QuantizeLinear ─ QLinearConv ─ QLinearAdd(com.microsoft) ─ DequantizeLinear ─ y
#                    └──────────────────────┘ (skip)
#   opset_import: only ai.onnx (onnxruntime assumes com.microsoft version 1)

def test_com_microsoft_ops_without_an_opset_import(tmp_path, caplog):
    inits = {"W": (RNG.normal(size=(16, 16, 3, 3)) / 12).astype(np.float32),
             "B": (RNG.normal(size=16) / 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["h"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["h", "x"], ["y"], "skip")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    fpath = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "float.onnx")
    from onnxruntime.quantization import QuantFormat

    qop = quantize_static(fpath, tmp_path / "qop.onnx", _feeds(8, 1), quant_format=QuantFormat.QOperator,
                          per_channel=True)
    model = onnx.load(str(qop))
    assert "QLinearAdd" in op_types(model)
    kept = [i for i in model.opset_import if i.domain != "com.microsoft"]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    with pytest.raises(onnx.checker.ValidationError, match="No opset import for domain 'com.microsoft'"):
        onnx.checker.check_model(model)
    source = save(model, tmp_path / "no_import.onnx")
    invalid = [f for f in check_model(source, CheckOptions(trt=TrtProbe.OFF)).findings if f.rule == "invalid-onnx"]
    assert len(invalid) == 1 and "com.microsoft" in invalid[0].fix
    with caplog.at_level(logging.WARNING, logger="trt_bridge"):
        out = _convert(source, tmp_path)
    assert "com.microsoft" in caplog.text and "imported version 1" in caplog.text
    assert not op_types(out) & {"QLinearConv", "QLinearAdd"}
    held_out = _feeds(4, 12)
    assert snr_db(run_ort(source, held_out), run_ort(out, held_out)) > 30  # onnxruntime runs the source


# --- an output written again in value_info without a shape (onnxruntime's 2019 quantizer: ddddocr's shipped
#     common_old.onnx) ---------------------------------------------------------------------------------------
#
#   x ─ DynamicQuantizeLinear ─ MatInteger(W_u8) ─ Cast ─ Mul(x_scale·w_scale) ─ Reshape ─ y[1, 'seq']
#   value_info: y (float, no shape)
#
# onnx-graphsurgeon took the value_info's type for the output, so the converted output lost its shape and
# failed onnx's checks (an internal error). The input's own type wins; the value_info entry goes.

def _output_in_value_info_model() -> onnx.ModelProto:
    w = RNG.normal(size=(16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"], "mm"),
         helper.make_node("Reshape", ["m", "shape"], ["y"], "flatten")],
        "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq8"])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([1, -1], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_an_output_repeated_in_value_info_without_a_shape_keeps_its_shape(tmp_path):
    fpath = save(_output_in_value_info_model(), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", weight_type=QuantType.QUInt8)
    source = onnx.load(str(dpath))
    source.graph.value_info.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    source.graph.value_info.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, None))
    onnx.save(source, str(dpath))
    feeds = [{"x": RNG.normal(size=(1, 6, 16)).astype(np.float32)} for _ in range(8)]
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in feeds]))
    out = tmp_path / "converted.onnx"
    convert(dpath, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                       progress=False))
    converted = onnx.load(str(out))
    dims = converted.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value or d.dim_param for d in dims] == [1, "seq8"]
    assert [d.dim_value or d.dim_param for d in converted.graph.input[0].type.tensor_type.shape.dim] == [1, "seq", 16]
    assert "MatMulInteger" in op_types(dpath) and not op_types(out) & {"MatMulInteger", "DynamicQuantizeLinear"}
    assert snr_db(run_ort(fpath, feeds), run_ort(out, feeds)) > 30
    assert_tensorrt_ready(out)


# --- a tensor holding its values twice (AIMET's QDQ export): raw_data and float_data -------------------------------
#
#   x[1, 8] ─ Q(sx, uint8) ─ DQ ─ Gemm(W_dq, b) ─ Q(sy) ─ DQ ─ y[1, 6]    (onnxruntime's quantize_static QDQ form)
#   W_q (int8 [8, 6]) ─ DQ(per channel, axis 1: the output channels) ─ W_dq
#   b (float [6]): its values in raw_data, and again (other numbers) in float_data

def _gemm_qdq_model(axis: int = 1, scales: int = 6, bias: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (8, 6)).astype(np.int8), "W_q"),
             numpy_helper.from_array(rng.uniform(0.01, 0.02, scales).astype(np.float32), "W_scale"),
             numpy_helper.from_array(np.zeros(scales, np.int8), "W_zp"),
             *([numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")] if bias else []),
             numpy_helper.from_array(np.array(0.03, np.float32), "sx"),
             numpy_helper.from_array(np.array(128, np.uint8), "zx"),
             numpy_helper.from_array(np.array(0.1, np.float32), "sy"),
             numpy_helper.from_array(np.array(128, np.uint8), "zy")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], "x_q"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], "x_dq"),
             helper.make_node("DequantizeLinear", ["W_q", "W_scale", "W_zp"], ["W_dq"], "W_dq", axis=axis),
             helper.make_node("Gemm", ["xd", "W_dq", "b"] if bias else ["xd", "W_dq"], ["g"], "gemm"),
             helper.make_node("QuantizeLinear", ["g", "sy", "zy"], ["gq"], "y_q"),
             helper.make_node("DequantizeLinear", ["gq", "sy", "zy"], ["y"], "y_dq")]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _gemm_feeds(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 8)).astype(np.float32)} for _ in range(count)]


def test_a_tensor_with_two_value_fields_keeps_raw_data_as_onnxruntime_does(tmp_path, caplog):
    model = _gemm_qdq_model()
    bias = next(t for t in model.graph.initializer if t.name == "b")
    bias.float_data.extend([100.0] * 6)  # never read by onnxruntime: raw_data wins
    with pytest.raises(onnx.checker.ValidationError, match="one and only one value field"):
        onnx.checker.check_model(model)
    source = save(model, tmp_path / "aimet.onnx")
    with caplog.at_level(logging.WARNING, logger="trt_bridge.ir.repair"):
        out = _convert(source, tmp_path)
    assert any("hold their values in two fields (b)" in r.getMessage() for r in caplog.records)
    assert op_types(out) <= {"QuantizeLinear", "DequantizeLinear", "Gemm", "Identity"}  # Identity: the output name
    feeds = _gemm_feeds(4, 1)
    (tmp_path / "clean").mkdir()
    clean = _convert(save(_gemm_qdq_model(), tmp_path / "clean" / "clean.onnx"), tmp_path / "clean")
    for got, want in zip(run_ort(out, feeds), run_ort(clean, feeds)):  # the values onnxruntime read: raw_data
        np.testing.assert_array_equal(got, want)
    assert snr_db(run_ort(source, feeds), run_ort(out, feeds)) > 20  # the source's output Q/DQ is not kept
    findings = check_model(source, CheckOptions(trt=TrtProbe.OFF)).findings
    assert any(f.rule == "invalid-onnx" and "two fields" in f.fix for f in findings)


def test_single_value_field_keeps_the_typed_field_of_the_type_without_raw_data():
    tensor = helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.int64_data.extend([7, 8])
    model = helper.make_model(helper.make_graph([], "g", [], [], [tensor]))
    assert single_value_field(model) == ["t"]
    assert list(model.graph.initializer[0].float_data) == [1.0, 2.0] and not model.graph.initializer[0].int64_data
    assert single_value_field(model) == []  # idempotent


def test_per_axis_scales_of_the_wrong_axis_are_read_per_output_channel(tmp_path, caplog):
    """6 scales on axis 0 of an [8, 6] weight (length 8): onnxruntime runs the model only fused into its integer
    Gemm, which reads them per output channel (axis 1); the repair sets that axis."""
    import onnxruntime as ort

    model = _gemm_qdq_model(axis=0, bias=False)  # onnxruntime fuses Q/DQ into QGemm only without a float bias
    source = save(model, tmp_path / "ort.onnx")
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(Exception, match="size 8"):  # as written, onnxruntime cannot run it
        ort.InferenceSession(str(source), unfused, providers=["CPUExecutionProvider"]).run(None, _gemm_feeds(1, 0)[0])
    fused = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    with caplog.at_level(logging.WARNING, logger="trt_bridge.ir.repair"):
        out = _convert(source, tmp_path)
    assert any("set axis 1" in r.getMessage() for r in caplog.records)
    assert op_types(out) <= {"QuantizeLinear", "DequantizeLinear", "Gemm", "Identity"}  # Identity: the output name
    feeds = _gemm_feeds(4, 2)
    expected = [fused.run(None, f)[0] for f in feeds]
    assert snr_db(expected, run_ort(out, feeds)) > 20  # the source's output Q/DQ is not kept
    (tmp_path / "right").mkdir()
    right = _convert(save(_gemm_qdq_model(axis=1, bias=False), tmp_path / "right" / "right.onnx"),
                     tmp_path / "right")
    for got, want in zip(run_ort(out, feeds), run_ort(right, feeds)):
        np.testing.assert_array_equal(got, want)


def test_per_axis_scales_that_fit_no_output_channel_axis_are_refused_with_the_defect(tmp_path):
    model = _gemm_qdq_model(axis=1, scales=5)
    with pytest.raises(ModelLoadError, match=r"DequantizeLinear 'W_dq' declares axis 1 of 'W_q' \[8, 6\], but its "
                                             r"scale 'W_scale' has 5 values"):
        per_axis_scale_lengths(model, "m.onnx")
    result = convert_cli_error(save(model, tmp_path / "bad.onnx"), tmp_path)
    assert "fusing the DequantizeLinear away" in result and "Re-export" in result


def convert_cli_error(source: Path, tmp_path: Path) -> str:
    import io
    from contextlib import redirect_stderr

    from trt_bridge.cli import main

    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["convert", str(source), "-o", str(tmp_path / "out.onnx")])
    assert code == 2 and not (tmp_path / "out.onnx").exists()
    lines = [x for x in err.getvalue().splitlines() if x.startswith("trt-bridge convert: error:")]
    assert len(lines) == 1
    return lines[0]
