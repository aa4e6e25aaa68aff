"""FP4 (NVFP4 / MXFP4) weight sources (issue 29): blocked FP4 E2M1 ``DequantizeLinear`` of a MatMul/Gemm weight, its
block scales a float or ModelOpt's two-level ``DequantizeLinear(fp8 scales, float global scale)``.

``convert --compute-capability 12.0`` keeps the FP4 codes bit for bit (TensorRT-RTX builds them for SM 12.0 and
refuses them for SM 8.9, which ``check`` names); without a target, or with one below 10.0, they become INT4 blocks of
the same size, reported in ``approximated`` with a warning naming ``--compute-capability 12.0``, built for SM 8.9.
onnxruntime runs no FP4 ``DequantizeLinear`` on CPU: the sources and FP4 outputs are measured with onnx's reference
evaluator.
"""

from __future__ import annotations

import argparse
import json
import logging

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import assert_tensorrt_ready, op_types, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions, FormatOptions
from trt_bridge.errors import TrtBridgeError

K, N, BLOCK = 64, 32, 16
FP4_VALUES = np.array([-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)


def fp4_weight_model(two_level: bool = True, gemm: bool = False, seed: int = 0,
                     transposed: bool = False) -> tuple[onnx.ModelProto, dict]:
    """x[4, K] ─ MatMul(W0 float) ─ Relu ─ {MatMul | Gemm(transB=1)}(DQ(W: FP4, block 16 along K)) ─ y[4, N].

    MatMul: codes [K, N], blocks along axis 0. Gemm (ModelOpt's torch layout): codes [N, K], blocks along axis 1.
    ``transposed`` (ModelOpt's export of a torch Linear fed to a MatMul): codes [N, K] in blocks along axis -1,
    ``DequantizeLinear`` ─ Transpose ─ MatMul.
    ``two_level``: the block scales are ``DequantizeLinear(fp8 e4m3 [blocks], float32 global scale)`` (NVFP4)."""
    rng = np.random.default_rng(seed)
    shape, axis = ((N, K), 1) if gemm or transposed else ((K, N), 0)
    codes = rng.choice(FP4_VALUES, size=shape).astype(ml_dtypes.float4_e2m1fn)
    scale_shape = (N, K // BLOCK) if gemm or transposed else (K // BLOCK, N)
    block_scales = rng.uniform(0.5, 8, size=scale_shape).astype(ml_dtypes.float8_e4m3fn)
    global_scale = np.array(0.0123, np.float32)
    inits = [numpy_helper.from_array(codes, "w_fp4"),
             numpy_helper.from_array(rng.normal(0, 0.2, (K, K)).astype(np.float32), "w0")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"], name="mm0"),
             helper.make_node("Relu", ["h"], ["r"], name="relu")]
    if two_level:
        inits += [numpy_helper.from_array(block_scales, "w_scale_fp8"),
                  numpy_helper.from_array(global_scale, "w_global_scale")]
        nodes.append(helper.make_node("DequantizeLinear", ["w_scale_fp8", "w_global_scale"], ["w_scale"],
                                      name="w_scale_dq"))
        scale = block_scales.astype(np.float32) * global_scale  # float32, as the source's DequantizeLinear computes
    else:
        scale = (block_scales.astype(np.float32) * global_scale).astype(np.float32)
        inits.append(numpy_helper.from_array(scale, "w_scale"))
    nodes.append(helper.make_node("DequantizeLinear", ["w_fp4", "w_scale"], ["w"], name="w_dq",
                                  axis=-1 if transposed else axis, block_size=BLOCK))
    if transposed:
        nodes.append(helper.make_node("Transpose", ["w"], ["w_t"], name="w_transpose", perm=[1, 0]))
        nodes.append(helper.make_node("MatMul", ["r", "w_t"], ["y"], name="fc"))
    elif gemm:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.1, N).astype(np.float32), "bias"))
        nodes.append(helper.make_node("Gemm", ["r", "w", "bias"], ["y"], name="fc", transB=1))
    else:
        nodes.append(helper.make_node("MatMul", ["r", "w"], ["y"], name="fc"))
    graph = helper.make_graph(nodes, "fp4_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    onnx.checker.check_model(model, full_check=True)
    return model, {"codes": codes, "scale": scale, "axis": axis}


def reference(model, feeds):
    """onnx's reference evaluator (onnxruntime has no FP4 DequantizeLinear kernel on CPU)."""
    evaluator = ReferenceEvaluator(model)
    return [evaluator.run(None, feed)[0] for feed in feeds]


def feeds(count=4, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(4, K)).astype(np.float32)} for _ in range(count)]


def numpy_dequantized(source: dict) -> np.ndarray:
    """The source's float weights, from its codes and block scales (float32, as DequantizeLinear computes)."""
    scale = np.repeat(source["scale"], BLOCK, axis=source["axis"])
    return (source["codes"].astype(np.float32) * scale).astype(np.float32)


def weight_dq(model: onnx.ModelProto, layer: str = "fc") -> tuple[onnx.NodeProto, dict[str, onnx.TensorProto]]:
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == layer)
    return producer[node.input[1]], inits


@pytest.mark.parametrize("gemm", [False, True], ids=["matmul", "gemm"])
@pytest.mark.parametrize("two_level", [True, False], ids=["nvfp4", "float-scale"])
def test_lifted_float_weights_are_the_numpy_dequantization(gemm, two_level):
    from trt_bridge.lift.pipeline import lift_model

    model, source = fp4_weight_model(two_level, gemm)
    lifted, ctx = lift_model(model, "fp4.onnx")
    inits = {i.name: i for i in lifted.graph.initializer}
    fc = next(n for n in lifted.graph.node if n.name == "fc")
    weight = numpy_helper.to_array(inits[fc.input[1]])
    np.testing.assert_array_equal(weight, numpy_dequantized(source))
    spec = ctx.annotations.weights[fc.input[1]]
    assert spec.format.name == "fp4" and spec.block_size == BLOCK
    assert spec.codes.view(np.uint8).tobytes() == source["codes"].view(np.uint8).tobytes()
    np.testing.assert_array_equal(spec.scale, source["scale"].astype(np.float32))
    assert not ctx.approximated


@pytest.mark.parametrize("gemm", [False, True], ids=["matmul", "gemm"])
def test_fp4_kept_for_blackwell(gemm, tmp_path):
    from trt_bridge.checks import CheckOptions, TrtProbe, check_model
    from trt_bridge.tensorrt.build import build_engine

    model, source = fp4_weight_model(True, gemm)
    src = save(model, tmp_path / "fp4.onnx")
    out = tmp_path / "fp4.trt.onnx"
    report = convert(src, out, ConvertOptions(formats=FormatOptions(compute_capability="12.0")))
    assert not report.approximated and not report.remaining_blockers, report.summary()
    assert report.check["ready"] and "FP4 weight-only" in report.check["headline"]
    assert report.costs is None or (report.costs["target"].startswith("SM 12.0")
                                    and report.costs["float"]["target"].startswith("SM 12.0"))
    written = onnx.load(str(out))
    assert {n.op_type for n in written.graph.node} == {"MatMul", "Relu", "DequantizeLinear", *(
        ["Gemm"] if gemm else [])}
    assert "QuantizeLinear" not in {n.op_type for n in written.graph.node}
    dq, inits = weight_dq(written)
    codes = inits[dq.input[0]]
    # the source's NVFP4 two levels come back: DequantizeLinear(FP8 block scales, FP32 global scale)
    levels = next(n for n in written.graph.node if n.output[0] == dq.input[1])
    s8, g = inits[levels.input[0]], numpy_helper.to_array(inits[levels.input[1]])
    assert s8.data_type == TensorProto.FLOAT8E4M3FN and g.dtype == np.float32 and g.shape == ()
    scale = (numpy_helper.to_array(s8).astype(np.float32) * g).astype(np.float32)
    assert codes.data_type == TensorProto.FLOAT4E2M1
    attrs = {a.name: a.i for a in dq.attribute}
    assert attrs == {"axis": source["axis"], "block_size": BLOCK}
    kept = numpy_helper.to_array(codes)
    assert kept.view(np.uint8).tobytes() == source["codes"].view(np.uint8).tobytes()  # bit for bit
    np.testing.assert_array_equal(scale, source["scale"])
    data = feeds()
    for want, got in zip(reference(model, data), reference(written, data), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    assert len(build_engine(out, compute_capability="SM120")) > 0
    ada = check_model(out, CheckOptions(TrtProbe.OFF, compute_capability="8.9"))
    why = [f.why for f in ada.blockers if f.rule == "precision-target"]
    assert len(why) == 1 and "FP4" in why[0] and "compute capability 8.9" in why[0], why


def test_fp4_approximated_as_int4_without_a_target(tmp_path, caplog):
    model, source = fp4_weight_model(True)
    src = save(model, tmp_path / "fp4.onnx")
    out = tmp_path / "fp4.int4.onnx"
    with caplog.at_level(logging.WARNING):
        report = convert(src, out, ConvertOptions())
    assert "--compute-capability 12.0" in caplog.text
    approximated = [a for a in report.approximated if a["rule"] == "fp4-target"]
    assert len(approximated) == 1 and "--compute-capability 12.0" in approximated[0]["what"]
    assert "INT4 blocks of 16" in approximated[0]["what"]
    assert [(f["was"], f["format"]) for f in report.formats] == [("fp4", "int4")]
    assert report.check["ready"] and not report.remaining_blockers, report.summary()
    written = onnx.load(str(out))
    dq, inits = weight_dq(written)
    assert inits[dq.input[0]].data_type == TensorProto.INT4
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": BLOCK}
    data = feeds()
    assert snr_db(reference(model, data), run_ort(out, data)) > 15  # FP4 values re-quantized as INT4, per block
    assert_tensorrt_ready(out)  # SM 8.9


def test_fp4_below_blackwell_target_is_approximated(tmp_path):
    model, _ = fp4_weight_model(False, gemm=True)
    src = save(model, tmp_path / "fp4.onnx")
    report = convert(src, tmp_path / "out.onnx", ConvertOptions(formats=FormatOptions(compute_capability="8.9")))
    (approximated,) = [a for a in report.approximated if a["rule"] == "fp4-target"]
    assert "--compute-capability 8.9 runs no FP4" in approximated["what"]
    assert report.check["ready"]


def test_fp4_qdq_activations_are_converted(tmp_path):
    """An FP4 Q/DQ of an activation (test_fp8's model: per tensor, its weight FP4 per tensor) is lifted
    (lift/fp4_activation_qdq.py): TensorRT's dynamic FP4 for 12.0, reported in ``approximated``."""
    from test_fp8 import fp4_model

    src = save(fp4_model(), tmp_path / "fp4_act.onnx")
    report = convert(src, tmp_path / "out.onnx", ConvertOptions(formats=FormatOptions(compute_capability="12.0")))
    assert "TRT_FP4DynamicQuantize" in op_types(tmp_path / "out.onnx") and report.check["ready"]
    assert [a["node"] for a in report.approximated if a["rule"] == "fp4-activation-qdq"] == ["x_q"]


def test_compute_capability_option(tmp_path):
    from trt_bridge.cli.convert_args import FORMATS

    parser = argparse.ArgumentParser()
    FORMATS.add_to(parser)
    assert FORMATS.parse(parser.parse_args(["--compute-capability", "12.0"])).compute_capability == "12.0"
    assert FORMATS.parse(parser.parse_args([])).compute_capability is None
    with pytest.raises(TrtBridgeError, match="not a compute capability"):
        FormatOptions(compute_capability="blackwell")


def test_modelopt_transposed_fp4_weights_are_kept(tmp_path):
    """ModelOpt's NVFP4 torch Linear: FP4 [N, K] blocks along K ─ Transpose ─ MatMul: lifted transposed, FP4 kept."""
    model, source = fp4_weight_model(True, transposed=True)
    src = save(model, tmp_path / "fp4.onnx")
    out = tmp_path / "fp4.trt.onnx"
    report = convert(src, out, ConvertOptions(formats=FormatOptions(compute_capability="12.0")))
    assert not report.approximated and report.check["ready"], report.summary()
    written = onnx.load(str(out))
    assert "Transpose" not in {n.op_type for n in written.graph.node}
    dq, inits = weight_dq(written)
    kept = numpy_helper.to_array(inits[dq.input[0]])
    assert inits[dq.input[0]].data_type == TensorProto.FLOAT4E2M1 and kept.shape == (K, N)
    assert kept.view(np.uint8).tobytes() == np.ascontiguousarray(source["codes"].T).view(np.uint8).tobytes()
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": BLOCK}
    data = feeds()
    for want, got in zip(reference(model, data), reference(written, data), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onnxruntime_runs_fp4_weights_as_their_float_values(tmp_path):
    """onnxruntime has no FP4 DequantizeLinear on CPU: trt-bridge's sessions run FP4 weights (and NVFP4's two-level
    scales) as their float values, which onnx's reference evaluator agrees with; verify measures FP4 outputs."""
    from test_cli import cli

    from trt_bridge.runtime.fp4 import fp4_dequantized, has_float4_codes

    model, _ = fp4_weight_model(True, transposed=True)
    assert has_float4_codes(model)
    folded = fp4_dequantized(model)
    assert "DequantizeLinear" not in {n.op_type for n in folded.graph.node} and not has_float4_codes(folded)
    data = feeds()
    for want, got in zip(reference(model, data), run_ort(model, data), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    src = save(model, tmp_path / "fp4.onnx")
    out = tmp_path / "fp4.trt.onnx"
    convert(src, out, ConvertOptions(formats=FormatOptions(compute_capability="12.0"), check=False))
    result = cli("verify", src, out, "--random", "2", "--costs", "off", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    (measured,) = json.loads(result.stdout)["outputs"]
    assert measured["max_abs"] == 0.0  # the FP4 codes and scales kept: the output computes what the source does


def test_fp4_zero_point_is_dequantized_exactly():
    """An FP4 zero point (which TensorRT's FP4 has not) is subtracted as it is, and the weight re-quantized FP4."""
    from trt_bridge.lift.pipeline import lift_model

    model, source = fp4_weight_model(False)
    zero = np.full((K // BLOCK, N), 0.5, ml_dtypes.float4_e2m1fn)
    model.graph.initializer.append(numpy_helper.from_array(zero, "w_zero"))
    dq = next(n for n in model.graph.node if n.name == "w_dq")
    dq.input.append("w_zero")
    lifted, ctx = lift_model(model, "fp4.onnx")
    fc = next(n for n in lifted.graph.node if n.name == "fc")
    weight = numpy_helper.to_array({i.name: i for i in lifted.graph.initializer}[fc.input[1]])
    want = (source["codes"].astype(np.float32) - 0.5) * np.repeat(source["scale"], BLOCK, axis=0)
    np.testing.assert_array_equal(weight, want.astype(np.float32))
    spec = ctx.annotations.weights[fc.input[1]]
    assert spec.format.name == "fp4" and spec.codes is None
    assert [a.rule for a in ctx.approximated] == ["dequantize-constant"]
