"""``trt-bridge check``: the exact findings it prints for each failure class, its JSON and its exit status,
and ``convert`` fixing what it reports (onnxruntime runs the result, TensorRT-RTX parses and builds it)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import (
    assert_qdq_contract,
    assert_tensorrt_ready,
    quantize_dynamic,
    quantize_static,
    run_ort,
    save,
    snr_db,
)
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, QuantType
from test_cli import cli
from test_types import _mixed_add

from trt_bridge import samples
from trt_bridge.checks import CheckOptions, Severity, TrtProbe, check_model
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.runtime.session import session

STATIC = CheckOptions(TrtProbe.OFF)


def _lines(report) -> list[str]:
    return report.summary().splitlines()


def test_mixed_types_finding_and_fix(tmp_path):
    src = save(_mixed_add(working=False), tmp_path / "mixed.onnx")
    report = check_model(src, STATIC)
    assert _lines(report) == [
        f"{src}: not TensorRT-ready (2 blocker(s), 0 warning(s); static rules only)",
        "  [type-mismatch] Add '/self_attn/q_proj/Add': the input types contradict the op's schema: onnxruntime "
        "finds no kernel and TensorRT's strongly typed network rejects the node",
        "      tensors: 'acc' float32 [1, 64], 'bias' float16 [64]",
        "      convert: Add inputs disagree ('acc' float32, 'bias' float16): computed in float32; result cast to the "
        "declared float16",
        "  [not-int8] model: nothing is quantized: TensorRT builds the model in floating point",
        "      convert: quantizes it with --int8 --calib-data DATA (TensorRT placement, calibrated activation scales, "
        "per-channel weights)",
        "  every blocker is fixed by `trt-bridge convert`",
        "  layers by precision (as the model's types ask): FP16 3, FP32 1",
    ]
    with_parser = check_model(src)
    finding = with_parser.findings[0]
    assert finding.tensorrt.startswith("INVALID_NODE: ") and "must have same input types" in finding.tensorrt
    assert with_parser.parser.module == "tensorrt_rtx" and not with_parser.parser.ok
    assert [f.rule for f in with_parser.findings] == ["type-mismatch", "not-int8"]  # nothing only the parser saw


#  x[1,16,8,8] ─ Conv ─ Relu ─ Dropout(ratio 0.1, training_mode=True) ─ Conv ─ y
def _training_dropout() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], "conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
         helper.make_node("Dropout", ["r1", "ratio", "training"], ["d1"], "/drop/Dropout"),
         helper.make_node("Conv", ["d1", "w2"], ["y"], "conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])],
        [numpy_helper.from_array((rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32), "w1"),
         numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "w2"),
         numpy_helper.from_array(np.array(0.1, np.float32), "ratio"),
         numpy_helper.from_array(np.array(True), "training")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_training_dropout_finding_and_fix(tmp_path):
    src = save(_training_dropout(), tmp_path / "dropout.onnx")
    report = check_model(src, STATIC)
    assert _lines(report)[1:4] == [
        "  [training-dropout] Dropout '/drop/Dropout': training_mode is true: TensorRT does not support Dropout in "
        "training mode",
        "      tensors: 'r1' float32 [1, 32, 8, 8], 'd1' float32 [1, 32, 8, 8]",
        "      convert: removed Dropout (ratio=0.1, training_mode=1): inference ignores it",
    ]
    parsed = check_model(src)
    assert parsed.findings[0].tensorrt == ("UNSUPPORTED_NODE: Assertion failed: !trainingMode[0]: TensorRT does not "
                                           "support the Dropout operator in training mode.")
    feeds = samples.image_feeds(8, 1, shape=(1, 16, 8, 8))
    np.savez(tmp_path / "calib.npz", x=feeds)
    out = tmp_path / "dropout.int8.onnx"
    result = convert(src, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                              progress=False))
    assert "Dropout" not in {n.op_type for n in assert_qdq_contract(out).graph.node}
    assert result.check["ready"]
    inference = _training_dropout()
    inference.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array(False), "training"))
    reference = [session(inference).run(None, {"x": f})[0] for f in feeds]
    assert snr_db(reference, [session(out).run(None, {"x": f})[0] for f in feeds]) > 30
    assert_tensorrt_ready(out)


#  x[2,1] ─ Mul(f[3,160]) ─ y     (2 vs 3 on axis 0: no input shape makes it work)
def test_impossible_broadcast_is_reported_with_node_and_shapes(tmp_path):
    graph = helper.make_graph([helper.make_node("Mul", ["t", "freqs"], ["y"], "/time_proj/Mul")], "g",
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((3, 160), np.float32), "freqs")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "bcast.onnx")
    report = check_model(src, STATIC)
    finding = report.findings[0]
    assert finding.lines() == [
        "[broadcast] Mul '/time_proj/Mul': input shapes cannot broadcast: Mul '/time_proj/Mul': shapes [2, 1] ('t') "
        "and [3, 160] ('freqs') cannot broadcast (dimension 2 vs 3 at output axis 0)",
        "    tensors: 't' ? [2, 1], 'freqs' ? [3, 160]",
        "    convert cannot fix this: the graph itself is inconsistent; fix the shapes in the exporter (or the model's "
        "declared input shapes) and re-export",
    ]
    assert not finding.fixable and finding.severity is Severity.BLOCKER
    assert "broadcast dimensions must be conformable" in check_model(src).findings[0].tensorrt


def test_asymmetric_qdq_model(tmp_path):
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    calib = [{"x": f} for f in samples.image_feeds(8, 1)]
    qdq = quantize_static(fpath, tmp_path / "qdq.onnx", calib, quant_format=QuantFormat.QDQ, per_channel=True,
                          activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    report = check_model(qdq)
    rules = {f.rule for f in report.findings}
    assert rules == {"qdq-zero-point", "qdq-int32"}, rules
    first = next(f for f in report.findings if f.node == "x_QuantizeLinear")
    assert first.lines()[0] == ('[qdq-zero-point] QuantizeLinear \'x_QuantizeLinear\': uint8 codes: TensorRT quantizes '
                                'to int8 only ("unsupported input type of UINT8")')
    assert first.fix == ("lifted by rule 'qdq-pair' to a symmetric Q/DQ (zero point 0) covering the source's range, "
                         "in its format where TensorRT runs it (INT8, FP8 E4M3)")
    bias = next(f for f in report.findings if f.rule == "qdq-int32")
    assert bias.fixable and "dequantize-constant" in bias.fix
    parser_named = [f for f in report.findings if f.tensorrt]
    assert parser_named, "TensorRT-RTX's parser names at least the first node it rejects"
    assert all(f.fixable for f in report.findings)
    out = tmp_path / "qdq.int8.onnx"
    assert convert(qdq, out, ConvertOptions(progress=False)).check["ready"]
    assert check_model(out).ready
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    reference = [session(fpath).run(None, f)[0] for f in held_out]
    assert snr_db(reference, [session(out).run(None, f)[0] for f in held_out]) > 25
    assert_tensorrt_ready(out)


def test_dynamic_model_findings(tmp_path):
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    dyn = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    report = check_model(dyn)
    counts: dict[str, int] = {}
    for f in report.findings:
        counts[f"{f.rule}:{f.op}"] = counts.get(f"{f.rule}:{f.op}", 0) + 1
    ops = [n.op_type for n in onnx.load(str(dyn)).graph.node]
    assert counts == {f"no-importer:{op}": ops.count(op) for op in ("DynamicQuantizeLinear", "ConvInteger",
                                                                     "MatMulInteger") if op in ops}
    conv = next(f for f in report.findings if f.op == "ConvInteger")
    assert conv.why == "TensorRT's ONNX parser has no importer for ConvInteger"
    assert conv.tensorrt == "UNSUPPORTED_NODE: no importer for this op"
    assert conv.fix.startswith("lifted by rule 'dynamic-integer-op' to a float op on the source's int8 weights")
    dql = next(f for f in report.findings if f.op == "DynamicQuantizeLinear")
    assert dql.fix == "removed by lifting (the rule that rewrote its consumers took it in)"


def test_declined_pattern_says_convert_cannot(tmp_path):
    """A blocked activation QuantizeLinear: TensorRT blocks weights only, and no rule rewrites it."""
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], "q_act", axis=1, block_size=2),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], "dq_act", axis=1, block_size=2)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.full((1, 2), 0.1, np.float32), "s"),
         numpy_helper.from_array(np.zeros((1, 2), np.int8), "z")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "blocked.onnx")
    report = check_model(src, STATIC)
    q = next(f for f in report.findings if f.node == "q_act")
    assert q.rule == "qdq-scale" and not q.fixable
    assert q.why == "block quantization of an activation: TensorRT blocks weights only"
    assert q.fix == "blocked quantization of an activation (TensorRT blocks weights only)"
    assert "convert cannot fix this" in report.summary()


def test_per_axis_activation_is_fixed_with_one_covering_scale(tmp_path):
    """A per-axis activation QuantizeLinear (NNCF writes them): convert lifts it to the nearest per-tensor scale."""
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], "q_act", axis=1),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], "dq_act", axis=1),
         helper.make_node("MatMul", ["d", "w"], ["y"], "mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(np.linspace(0.01, 0.1, 16, dtype=np.float32), "s"),
         numpy_helper.from_array(np.zeros(16, np.int8), "z"),
         numpy_helper.from_array(np.eye(16, dtype=np.float32), "w")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "axis.onnx")
    report = check_model(src, STATIC)
    q = next(f for f in report.findings if f.node == "q_act")
    assert q.rule == "qdq-scale" and q.fixable
    assert q.why == "per-axis scales (16) on an activation: TensorRT quantizes activations per tensor only"
    assert q.fix.startswith("lifted by rule 'qdq-pair' to the nearest thing TensorRT builds: per-axis activation")


def test_cli_exit_status_and_json(tmp_path):
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    dyn = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    out = tmp_path / "dynamic.int8.onnx"
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(4, 0))
    assert cli("convert", dyn, "-o", out, "--calib-data", tmp_path / "calib.npz", "-q").returncode == 0

    ready = cli("check", out)
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.splitlines()[0].startswith(f"{out}: TensorRT-ready INT8 (0 blocker(s), 0 warning(s); ")
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 33  # measured 36.6 dB
    assert_tensorrt_ready(out)

    blocked = cli("check", dyn, "--json")
    assert blocked.returncode == 1
    data = json.loads(blocked.stdout)
    assert data["ready"] is False and data["int8"] is True and data["parser"]["module"] == "tensorrt_rtx"
    assert {f["rule"] for f in data["findings"]} == {"no-importer"}
    assert all(f["severity"] == "blocker" and f["fixable"] for f in data["findings"])

    report_file = tmp_path / "report.json"
    quiet = cli("check", dyn, "--trt", "off", "--json", report_file, "-q")
    assert quiet.returncode == 1 and len(quiet.stdout.splitlines()) == 1
    assert "static rules only" in quiet.stdout
    assert json.loads(report_file.read_text())["parser"] is None

    missing = cli("check", tmp_path / "nope.onnx")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip() == f"trt-bridge check: error: {tmp_path / 'nope.onnx'}: no such file. Check the " \
                                     "path to the ONNX model."


def test_convert_json_to_a_file_and_check_in_the_report(tmp_path):
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    dyn = quantize_dynamic(fpath, tmp_path / "dynamic.onnx")
    np.savez(tmp_path / "calib.npz", x=samples.image_feeds(4, 0))
    report_file = tmp_path / "convert.json"
    result = cli("convert", dyn, "--calib-data", tmp_path / "calib.npz", "--json", report_file)
    assert result.returncode == 0, result.stderr
    assert "check: " in result.stdout and "TensorRT-ready INT8" in result.stdout
    data = json.loads(report_file.read_text())
    assert data["check"]["ready"] is True and data["check"]["findings"] == []
    out = tmp_path / "dynamic.int8.onnx"  # the default output, beside the input
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    assert snr_db(run_ort(fpath, held_out), run_ort(out, held_out)) > 33  # measured 36.6 dB
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("fmt", [QuantFormat.QOperator, QuantFormat.QDQ], ids=["qoperator", "qdq"])
def test_check_of_converted_models_has_no_findings(tmp_path, fmt):
    fpath = save(samples.transformer_block(), tmp_path / "float.onnx")
    feeds = [{"x": f} for f in samples.sequence_feeds(8, 1, 16, 64)]
    src = quantize_static(fpath, tmp_path / "static.onnx", feeds, quant_format=fmt)
    out = tmp_path / "converted.onnx"
    convert(src, out, ConvertOptions(progress=False, check=False))
    report = check_model(out)
    assert report.ready and report.findings == [] and report.parser.ok
    held_out = [{"x": f} for f in samples.sequence_feeds(8, 2, 16, 64)]
    reference = [session(fpath).run(None, f)[0] for f in held_out]
    source = snr_db(reference, [session(src, simulate_qdq=False).run(None, f)[0] for f in held_out])
    assert snr_db(reference, [session(out).run(None, f)[0] for f in held_out]) > source - 1.0
    assert_tensorrt_ready(out)


def test_parser_only_blocker_that_convert_fixes_is_fixable(tmp_path):
    """An opset-9 Dropout whose mask (a float tensor then) feeds a Mul: TensorRT rejects the Mul, no static rule
    names it, and convert's lifted model parses: the finding says convert fixes it.

    #  x ─ MatMul(W) ─ Dropout(ratio 0.1) ─┬ out ─ Mul ─ y
    #                                     └ mask ┘
    """
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"], "mm"),
         helper.make_node("Dropout", ["m"], ["dd", "mask"], "drop", ratio=0.1),
         helper.make_node("Mul", ["dd", "mask"], ["y"], "mul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)]), tmp_path / "op9.onnx")
    report = check_model(src)
    parser_only = [f for f in report.findings if f.rule == "tensorrt-parser"]
    assert parser_only and all(f.fixable for f in parser_only)
    assert parser_only[0].fix.startswith("no static rule names it, but convert's lifted model parses past it")


def test_type_conflict_no_cast_resolves_is_named_on_its_node(tmp_path):
    """A Constant named like the tensor it writes ('idx'), read as float indices by Gather 'y': the finding names
    the Gather, not the Constant."""
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["idx"], "idx", value=numpy_helper.from_array(np.array([1, 0], np.float32))),
         helper.make_node("Gather", ["x", "idx"], ["y"], "y", axis=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "named.onnx")
    report = check_model(src, STATIC)
    finding = next(f for f in report.findings if f.rule == "type-mismatch")
    assert (finding.node, finding.op, finding.fixable) == ("y", "Gather", False)


def test_int16_zero_point_is_a_finding_not_a_traceback(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], "q"),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], "dq")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(np.array(0.01, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int16), "z")])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), tmp_path / "q16.onnx")
    report = check_model(src, STATIC)
    assert {(f.rule, f.node) for f in report.blockers} >= {("qdq-zero-point", "q"), ("qdq-zero-point", "dq")}
    assert "int16 codes: TensorRT quantizes to int8 only" in report.findings[0].why


def test_reports_never_overwrite_a_model(tmp_path):
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    before = fpath.read_bytes()
    for args in (("check", fpath, "--json", fpath),
                 ("convert", fpath, "-o", tmp_path / "o.onnx", "--calib-random", "1", "--report", fpath),
                 ("convert", fpath, "-o", tmp_path / "o.onnx", "--calib-random", "1", "--json", tmp_path / "o.onnx"),
                 ("verify", fpath, fpath, "--random", "1", "--html", fpath)):
        result = cli(*args)
        assert result.returncode == 2 and "which this command reads or writes; it would be overwritten" in result.stderr
    assert fpath.read_bytes() == before and not (tmp_path / "o.onnx").exists()


def test_check_json_of_a_bf16_model_is_clean_json(tmp_path):
    """onnx-graphsurgeon warns about bfloat16 on stdout; the CLI keeps its own output machine-readable, and the
    float32 feeds convert takes for a bfloat16 input are accepted by `check --data` too."""
    from test_types import _bf16_conv_net

    src = save(_bf16_conv_net()[0], tmp_path / "bf16.onnx")
    np.savez(tmp_path / "feeds.npz", x=np.zeros((2, 4, 64), np.float32))
    result = cli("check", src, "--json", "--data", tmp_path / "feeds.npz")
    data = json.loads(result.stdout)
    assert result.returncode == 1 and [f["rule"] for f in data["findings"]] == ["bf16", "not-int8"]


# ---------------------------------------------------------------- the precision a quantized model runs in

def test_check_names_fp8_and_int4_weight_only_models(tmp_path):
    """onnxruntime's FP8 Q/DQ is TensorRT-ready FP8 (not INT8), blocked int4 DequantizeLinear → MatMul INT4
    weight-only; TensorRT-RTX builds both for SM 8.9 (check's costs)."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    from trt_bridge.samples import conv_net, image_feeds

    onnx.save(conv_net(channels=(8, 16)), str(tmp_path / "float.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter({"x": f} for f in image_feeds(8, seed=0))

        def get_next(self):
            return next(self.feeds, None)

    ort_quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "fp8.onnx"), Reader(),
                        quant_format=QuantFormat.QDQ, activation_type=QuantType.QFLOAT8E4M3FN,
                        weight_type=QuantType.QFLOAT8E4M3FN, calibrate_method=CalibrationMethod.Distribution)
    fp8 = check_model(tmp_path / "fp8.onnx", CheckOptions())
    assert fp8.ready and "TensorRT-ready FP8 (" in fp8.headline() and "INT8" not in fp8.headline()
    assert fp8.precisions["counts"].get("fp8", 0) >= 3 and "int8" not in fp8.precisions["counts"]
    assert fp8.costs is not None  # built for SM 8.9

    rng = np.random.default_rng(0)
    codes = rng.integers(-8, 8, (64, 32)).astype(np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], "w_dq", axis=0, block_size=32),
             helper.make_node("MatMul", ["x", "w"], ["y"], "mm")]
    graph = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
                              [helper.make_tensor("wq", TensorProto.INT4, [64, 32], codes.flatten().tolist()),
                               numpy_helper.from_array(rng.uniform(0.01, 0.02, (2, 32)).astype(np.float32), "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "int4.onnx"))
    int4 = check_model(tmp_path / "int4.onnx", CheckOptions())
    assert "TensorRT-ready INT4 weight-only (" in int4.headline()
    assert int4.precisions["counts"] == {"int4-w": 1} and "INT4-W 1" in int4.summary()
    assert int4.costs is not None


# ---------------------------------------------------------------- quantizer exports TensorRT rejects as they are

def _save21(nodes, inits, path, x_shape=(4, 16), y_shape=(4, 16), opset=21, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))], inits)
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra_opsets]), path)


def _fp8(values, name, shape=()):
    return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(shape),
                              np.asarray(values, np.float32).reshape(-1).tolist())


#  x ─ Q/DQ(fp8) ─ MatMul(DQ(fp8 W)) ─ Mul ─ y   (AMD Quark's FP8 export: the attention's 1/sqrt(d) quantized,
#                    cq: fp8 scalar ─ DQ 'dqc' ┘    a rank-0 constant)
def test_scalar_quantized_constant_is_a_blocker_convert_fixes(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"], "qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"], "dqx"),
             helper.make_node("DequantizeLinear", ["cq", "sc", "z"], ["cd"], "dqc"),
             helper.make_node("DequantizeLinear", ["wq", "sc", "z"], ["wd"], "dqw"),
             helper.make_node("MatMul", ["xd", "wd"], ["m"], "mm"),
             helper.make_node("Mul", ["m", "cd"], ["y"], "mul")]
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "sx"), _fp8(0, "z"),
             numpy_helper.from_array(np.array(0.125, np.float32), "sc"),
             _fp8(np.round(rng.standard_normal((16, 16)) * 8), "wq", (16, 16)), _fp8(8.0, "cq")]
    src = _save21(nodes, inits, tmp_path / "quark-fp8.onnx")
    static = check_model(src, STATIC)
    assert [(f.rule, f.node) for f in static.blockers] == [("quantized-constant", "dqc")]
    finding = static.blockers[0]
    assert finding.why == ("scalar quantized constant 'cq' (float8_e4m3fn code, rank 0): TensorRT's builder rejects it "
                           "(\"Quantized constant (...) is only allowed before DQ\")")
    assert finding.fixable and finding.fix == ("lifted by rule 'dequantize-constant': the scalar is dequantized to a "
                                               "float constant, which TensorRT builds")
    assert "every blocker is fixed by `trt-bridge convert`" in static.summary()
    built = check_model(src)  # the parser takes it; the builder's error lands on the static finding
    assert built.parser.ok and [f.rule for f in built.findings] == ["quantized-constant"]
    assert "Quantized constant (cq) is only allowed before DQ" in built.findings[0].tensorrt
    out = tmp_path / "quark-fp8.trt.onnx"
    assert convert(src, out, ConvertOptions(progress=False)).check["ready"]
    assert_tensorrt_ready(out)
    assert check_model(out).ready

    # a rank-1 constant of codes, or a QuantizeLinear of a float scalar, builds: no finding
    inits[-1] = _fp8([8.0], "cq", (1,))
    assert check_model(_save21(nodes, inits, tmp_path / "rank1.onnx"), STATIC).findings == []
    nodes[2:3] = [helper.make_node("QuantizeLinear", ["c", "sc", "z"], ["cq"], "qc"),
                  helper.make_node("DequantizeLinear", ["cq", "sc", "z"], ["cd"], "dqc")]
    inits[-1] = numpy_helper.from_array(np.array(1.0, np.float32), "c")
    assert check_model(_save21(nodes, inits, tmp_path / "q-of-constant.onnx"), STATIC).findings == []


#  x ─ Q/DQ(int8) ─ MatMul ─ y
#  c: int8 [16, 16] ─ Transpose 't' ─ DQ ┘      (the codes reach the DequantizeLinear through a Transpose)
def test_quantized_constant_feeding_another_op_is_a_blocker_convert_fixes(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"], "qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"], "dqx"),
             helper.make_node("Transpose", ["c"], ["ct"], "t", perm=[1, 0]),
             helper.make_node("DequantizeLinear", ["ct", "sw", "z"], ["w"], "dqw"),
             helper.make_node("MatMul", ["xd", "w"], ["y"], "mm")]
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "sx"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
             numpy_helper.from_array(rng.integers(-127, 128, (16, 16)).astype(np.int8), "c")]
    src = _save21(nodes, inits, tmp_path / "transposed-codes.onnx")
    static = check_model(src, STATIC)
    assert [(f.rule, f.node) for f in static.blockers] == [("quantized-constant", "t")]
    finding = static.blockers[0]
    assert finding.why == ("constant 'c' holds int8 codes and feeds Transpose: TensorRT's builder takes a quantized "
                           "constant only as a DequantizeLinear's input")
    assert finding.fixable
    built = check_model(src)
    assert built.parser.ok and [f.rule for f in built.findings] == ["quantized-constant"]
    assert "Quantized constant (c) is only allowed before DQ" in built.findings[0].tensorrt
    out = tmp_path / "transposed-codes.trt.onnx"
    assert convert(src, out, ConvertOptions(progress=False)).check["ready"]
    assert_tensorrt_ready(out)


def _conv_with_weight_scale(shape: tuple[int, ...]) -> onnx.ModelProto:
    """x ─ Q/DQ ─ Conv ─ y, the weight an int8 DequantizeLinear 'w_dq' (axis 0) whose scale has ``shape``."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], "qx"),
         helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], "dqx"),
         helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], "w_dq", axis=0),
         helper.make_node("Conv", ["xd", "w"], ["y"], "conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        [numpy_helper.from_array(rng.integers(-100, 100, (8, 4, 3, 3)).astype(np.int8), "wq"),
         numpy_helper.from_array(np.full(shape, 0.01, np.float32), "ws"),
         numpy_helper.from_array(np.zeros(shape, np.int8), "wz"),
         numpy_helper.from_array(np.array(0.05, np.float32), "sx"),
         numpy_helper.from_array(np.array(0, np.int8), "zx")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_per_axis_scale_of_rank_3_is_predicted_and_fixable(tmp_path):
    """NNCF's FP8 weight compression writes a Conv weight's per-axis scale as [C, 1, 1]: TensorRT's parser rejects
    it ("Invalid rank for the scale tensor"); a static rule says so, and convert fixes it."""
    src = save(_conv_with_weight_scale((8, 1, 1)), tmp_path / "rank3.onnx")
    static = check_model(src, STATIC)
    assert [(f.rule, f.node) for f in static.blockers] == [("qdq-scale", "w_dq")]
    finding = static.blockers[0]
    assert finding.why == ("scale 'ws' has shape [8, 1, 1] (rank 3) without block_size: TensorRT takes a scalar or "
                           "1-D (per-axis) one only (\"Invalid rank for the scale tensor\")")
    assert finding.fixable and finding.fix.startswith("lifted by rule 'dequantize-constant'")
    parsed = check_model(src)
    assert [f.rule for f in parsed.findings] == ["qdq-scale"] and not parsed.parser.ok
    assert "Invalid rank for the scale tensor" in parsed.findings[0].tensorrt
    assert "no static rule" not in parsed.summary()
    out = tmp_path / "rank3.trt.onnx"
    assert convert(src, out, ConvertOptions(progress=False)).check["ready"]
    assert_tensorrt_ready(out)
    assert check_model(save(_conv_with_weight_scale((8,)), tmp_path / "rank1.onnx"), STATIC).findings == []


def test_blocked_weight_quantize_dequantize_pair_is_a_weight(tmp_path):
    """AIMET's block-wise weights: float W ─ QuantizeLinear ─ DequantizeLinear (int4, block_size 32) ─ MatMul. The
    DequantizeLinear of a QuantizeLinear of a constant quantizes a weight, not an activation."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], "w_q", axis=0, block_size=32),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], "w_dq", axis=0, block_size=32),
             helper.make_node("MatMul", ["x", "wd"], ["y"], "mm")]
    inits = [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w"),
             numpy_helper.from_array(np.full((2, 32), 0.3, np.float32), "ws"),
             helper.make_tensor("wz", TensorProto.INT4, [2, 32], [0] * 64)]
    src = _save21(nodes, inits, tmp_path / "aimet-bq.onnx", x_shape=(4, 64), y_shape=(4, 32))
    assert check_model(src, STATIC).findings == []  # was: "block quantization of an activation" on 'w_dq'
    built = check_model(src)  # TensorRT-RTX parses and builds it for SM 8.9 as it is
    assert built.ready and built.parser.ok and built.costs is not None


#  x ─ com.amd.quark.MXQuantizeDequantize ─ MatMul(W) ─ y     (an activation in block floating point: no scale)
def test_block_floating_point_activation_needs_calibration_data(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MXQuantizeDequantize", ["x"], ["xq"], "x_mx", domain="com.amd.quark",
                              element_dtype="fp8_e4m3", axis=1, block_size=32, rounding_mode=2),
             helper.make_node("MatMul", ["xq", "w"], ["y"], "mm")]
    inits = [numpy_helper.from_array(rng.standard_normal((64, 16)).astype(np.float32), "w")]
    src = _save21(nodes, inits, tmp_path / "mx.onnx", x_shape=(4, 64), opset=17,
                  extra_opsets=[helper.make_opsetid("com.amd.quark", 1)])
    report = check_model(src, STATIC)
    mx = next(f for f in report.findings if f.node == "x_mx")
    assert mx.fixable and mx.fix.endswith("; needs --calib-data (the source holds no activation scale TensorRT "
                                          "can use)")
    assert _lines(report)[-2] == "  every blocker is fixed by `trt-bridge convert` with --calib-data"
    assert "not-int8" not in {f.rule for f in report.findings}  # a block format is a quantized model ("nothing is
    # quantized" it said)
