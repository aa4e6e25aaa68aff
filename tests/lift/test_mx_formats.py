"""AMD Quark's MX formats (``com.amd.quark`` ``MXQuantizeDequantize``, rule ``block-quantize-dequantize``) by element
type: MXFP8 (``fp8_e4m3``) becomes FP8 (activations calibrated, weights per output channel), MXFP4 (``fp4_e2m1``)
weights of MatMul/Gemm blocked along the reduction axis become FP4 blocks holding Quark's own rounding (FP4 for
``--compute-capability 12.0``, INT4 blocks otherwise), any other MXFP4 tensor int8 as before.

onnxruntime cannot run Quark's op without Quark's library, so the references are the float model (the MX round
trips as identities) and the float model with its weights rounded by :func:`mx_round`, the numpy emulation of
Quark's kernel (checked bit for bit against Quark 0.13's library; the unit test here pins hand-computed values).
onnxruntime runs no FP4 ``DequantizeLinear`` on CPU: FP4 outputs are measured with onnx's reference evaluator.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, FormatOptions
from trt_bridge.lift.block_quantize_dequantize import mx_quantize, mx_round

QUARK = "com.amd.quark"
K, H, N = 96, 80, 32  # x[4, K] ─ MatMul [K, H] ─ Relu ─ {MatMul [H, N] | Gemm(transB) [N, H]} ─ y[4, N]


def _mx(name: str, x: str, y: str, element: str, axis: int, block: int = 32) -> onnx.NodeProto:
    return helper.make_node("MXQuantizeDequantize", [x], [y], name, domain=QUARK, element_dtype=element.encode(),
                            axis=axis, block_size=block, rounding_mode=2)


def mx_model(element: str, activations: bool = True, gemm: bool = False, mx: bool = True,
             rounded: tuple[str, ...] = (), w0_axis: int = 0, seed: int = 0) -> onnx.ModelProto:
    """A Quark MX export of a two-layer MLP: each weight (and with ``activations`` each layer's input) through an
    ``MXQuantizeDequantize`` of ``element`` (blocks of 32; ``w0_axis``: the first weight's block axis, 0 its
    reduction axis). ``mx`` False: the float model (round trips left out); ``rounded``: the weights (w0, w1) of that
    float model rounded by :func:`mx_round`, what the source computes with them."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(0, 0.15, (K, H)).astype(np.float32)
    w1 = rng.normal(0, 0.15, (N, H) if gemm else (H, N)).astype(np.float32)
    w1_axis = 1 if gemm else 0  # the reduction axis (H)
    if "w0" in rounded:
        w0 = mx_round(w0, element, w0_axis, 32)
    if "w1" in rounded:
        w1 = mx_round(w1, element, w1_axis, 32)
    inits = [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, N).astype(np.float32), "bias")]
    nodes = []

    def through(name, tensor, axis, weight=False):
        if not mx or not (weight or activations):
            return tensor
        nodes.append(_mx(f"{tensor}_mx", tensor, f"{tensor}_q", element, axis))
        return f"{tensor}_q"

    nodes.append(helper.make_node("MatMul", [through("x", "x", 1), through("w0", "w0", w0_axis, True)], ["h"], "mm0"))
    nodes.append(helper.make_node("Relu", ["h"], ["r"], "relu"))
    r, w = through("r", "r", 1), through("w1", "w1", w1_axis, True)
    if gemm:
        nodes.append(helper.make_node("Gemm", [r, w, "bias"], ["y"], "fc", transB=1))
    else:
        nodes.append(helper.make_node("MatMul", [r, w], ["m"], "fc"))
        nodes.append(helper.make_node("Add", ["m", "bias"], ["y"], "bias_add"))
    graph = helper.make_graph(nodes, "mx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])], inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(QUARK, 1)] if mx else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def feeds(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(4, K)).astype(np.float32)} for _ in range(count)]


def calibration(tmp_path) -> CalibrationOptions:
    path = tmp_path / "calib.npz"
    np.savez(path, x=np.stack([f["x"] for f in feeds(16, 1)]))
    return CalibrationOptions(data=str(path))


def qdq_code_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each DequantizeLinear's input tensor → its codes' ONNX type (a constant's, or its QuantizeLinear's zero
    point's)."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    found = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        codes = node.input[0]
        if codes in inits:
            found[codes] = inits[codes].data_type
        else:
            found[codes] = inits[producer[codes].input[2]].data_type
    return found


def weight_dq(model: onnx.ModelProto, layer: str) -> tuple[onnx.NodeProto, dict[str, onnx.TensorProto]]:
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == layer)
    return producer[node.input[1]], inits


def reference(model, data):
    evaluator = ReferenceEvaluator(model)
    return [evaluator.run(None, feed)[0] for feed in data]


def test_mx_emulation_hand_computed_values():
    # MXFP4: amax 7 → largest exponent 2, scale 2^(2 − emax 2) = 1; E2M1 holds 0, 0.5, 1, 1.5, 2, 3, 4, 6
    block = np.zeros(32, np.float32)
    block[:9] = [7.0, 0.75, 0.25, 5.0, 1.25, 2.5, 3.5, -0.3, -6.5]
    # ties to even: 0.75 → 1, 0.25 → 0, 5 → 4, 1.25 → 1, 2.5 → 2, 3.5 → 4; 7 and -6.5 saturate at ±6
    want = np.zeros(32, np.float32)
    want[:9] = [6.0, 1.0, 0.0, 4.0, 1.0, 2.0, 4.0, -0.5, -6.0]
    # a second block, amax 0.3 → exponent −2, scale 2^-4: 0.3/scale 4.8 → 4 (0.25), 0.1/scale 1.6 → 1.5 (0.09375)
    small = np.zeros(32, np.float32)
    small[:2] = [0.3, 0.1]
    x = np.stack([block, small])
    got = mx_round(x, "fp4_e2m1", 1, 32)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1, :2], [0.25, 0.09375])
    codes, scale = mx_quantize(x, "fp4_e2m1", 1, 32)
    assert codes.dtype == ml_dtypes.float4_e2m1fn and scale.shape == (2, 1) and scale.dtype == np.float32
    np.testing.assert_array_equal(scale.ravel(), [1.0, 2.0 ** -4])
    # MXFP8 (E4M3, emax 8): amax 1000 → exponent 9, scale 2; 1000/2 saturates at 448 (896); 3 stays 3;
    # 0.01/2 = 0.005 → the subnormal 3·2^-9 (0.005859375) → 0.01171875
    fp8 = np.zeros((1, 32), np.float32)
    fp8[0, :3] = [1000.0, 3.0, 0.01]
    np.testing.assert_array_equal(mx_round(fp8, "fp8_e4m3", -1, 32)[0, :3], [896.0, 3.0, 0.01171875])
    # a short last block (40 = 32 + 8) takes its own scale; a single value is returned as it is (Quark's kernel)
    tail = np.full((40, 1), 0.1, np.float32)
    tail[0] = 100.0
    codes, scale = mx_quantize(tail, "fp4_e2m1", 0, 32)
    assert scale.shape == (2, 1) and list(scale.ravel()) == [16.0, 2.0 ** -6]
    np.testing.assert_array_equal(mx_round(tail, "fp4_e2m1", 0, 32)[32:], 0.09375)
    assert mx_round(np.array([[3.7]], np.float32), "fp4_e2m1", 0, 32)[0, 0] == np.float32(3.7)


def test_mxfp8_converts_to_fp8(tmp_path):
    src = save(mx_model("fp8_e4m3"), tmp_path / "mxfp8.onnx")
    out = tmp_path / "mxfp8.trt.onnx"
    report = convert(src, out, ConvertOptions(calibration=calibration(tmp_path), progress=False))
    assert not report.remaining_blockers, report.summary()
    assert "TensorRT-ready FP8 (" in report.check["headline"]
    written = assert_qdq_contract(out)
    assert op_types(written) <= {"MatMul", "Relu", "Add", "QuantizeLinear", "DequantizeLinear"}
    assert not any(n.domain == QUARK for n in written.graph.node)
    codes = qdq_code_types(written)
    assert codes and set(codes.values()) == {TensorProto.FLOAT8E4M3FN}, codes
    assert {"w0", "w1"} <= {q["tensor"].removesuffix("_quantized") for q in report.quantized if q["kind"] == "weight"}
    formats = {q["format"] for q in report.quantized}
    assert formats == {"fp8"}, formats
    assert {a["rule"] for a in report.approximated} == {"block-quantize-dequantize"}
    data = feeds(8, 2)
    # measured 26.6 dB against the float model (per-tensor calibrated FP8 for MX's per-block scales)
    assert snr_db(run_ort(mx_model("fp8_e4m3", mx=False), data), run_ort(out, data)) > 23
    assert_tensorrt_ready(out)


@pytest.mark.parametrize("gemm", [False, True], ids=["matmul", "gemm"])
def test_mxfp4_weights_become_fp4_blocks_for_blackwell(gemm, tmp_path):
    from trt_bridge.tensorrt.build import build_engine

    src = save(mx_model("fp4_e2m1", activations=False, gemm=gemm), tmp_path / "mxfp4.onnx")
    out = tmp_path / "mxfp4.trt.onnx"
    report = convert(src, out, ConvertOptions(formats=FormatOptions(compute_capability="12.0"), progress=False))
    assert not report.remaining_blockers and not report.approximated, report.summary()
    assert report.check["ready"] and "FP4 weight-only" in report.check["headline"]
    written = onnx.load(str(out))
    assert op_types(written) == {"MatMul", "Relu", "DequantizeLinear", *(["Gemm"] if gemm else ["Add"])}
    rounded = mx_model("fp4_e2m1", activations=False, gemm=gemm, mx=False, rounded=("w0", "w1"))
    want = {i.name: numpy_helper.to_array(i) for i in rounded.graph.initializer}
    for layer, weight, axis in (("mm0", "w0", 0), ("fc", "w1", 1 if gemm else 0)):
        dq, inits = weight_dq(written, layer)
        codes, scale = inits[dq.input[0]], numpy_helper.to_array(inits[dq.input[1]])
        assert codes.data_type == TensorProto.FLOAT4E2M1 and scale.dtype == np.float32
        assert {a.name: a.i for a in dq.attribute} == {"axis": axis, "block_size": 16}
        assert np.all(np.log2(scale) == np.round(np.log2(scale)))  # E8M0: powers of two, each repeated per 16
        # the FP4 DequantizeLinear computes Quark's MX rounding of the weight bit for bit
        dequantized = reference(helper.make_model(helper.make_graph(
            [dq], "dq", [], [helper.make_tensor_value_info(dq.output[0], TensorProto.FLOAT, None)],
            [inits[dq.input[0]], inits[dq.input[1]], *([inits[dq.input[2]]] if len(dq.input) > 2 else [])]),
            opset_imports=[helper.make_opsetid("", 23)]), [{}])[0]
        np.testing.assert_array_equal(dequantized, want[weight])
    data = feeds(4, 2)
    # the float model with Quark's rounded weights: the same arithmetic but for the order of float32 sums
    for expect, got in zip(reference(rounded, data), reference(written, data), strict=True):
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    assert len(build_engine(out, compute_capability="SM120")) > 0


def test_mxfp4_weights_become_int4_blocks_without_a_target(tmp_path):
    src = save(mx_model("fp4_e2m1", activations=False, gemm=True), tmp_path / "mxfp4.onnx")
    out = tmp_path / "mxfp4.int4.onnx"
    report = convert(src, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers and report.check["ready"], report.summary()
    assert {a["rule"] for a in report.approximated} == {"fp4-target"}
    assert {(f["was"], f["format"]) for f in report.formats} == {("fp4", "int4")}
    written = assert_qdq_contract(out)
    assert not any(n.domain == QUARK for n in written.graph.node)
    for layer, axis in (("mm0", 0), ("fc", 1)):
        dq, inits = weight_dq(written, layer)
        assert inits[dq.input[0]].data_type == TensorProto.INT4
        assert {a.name: a.i for a in dq.attribute} == {"axis": axis, "block_size": 16}
    data = feeds(8, 2)
    rounded = mx_model("fp4_e2m1", activations=False, gemm=True, mx=False, rounded=("w0", "w1"))
    # measured 17.9 dB: Quark's FP4 values re-quantized as INT4, block by block (tests/test_fp4.py: > 15 alike)
    assert snr_db(run_ort(rounded, data), run_ort(out, data)) > 15
    assert_tensorrt_ready(out)


def _mx_source(model: onnx.ModelProto, data) -> list[np.ndarray]:
    """What an MXFP4 export of :func:`mx_model` computes: every MX round trip as Quark's kernel does
    (:func:`mx_round`), the rest in float."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    outs = []
    for feed in data:
        values = {**inits, **feed}
        for node in model.graph.node:
            ins = [values[i] for i in node.input]
            if node.op_type == "MXQuantizeDequantize":
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                out = mx_round(ins[0], attrs["element_dtype"].decode(), attrs["axis"], attrs["block_size"])
            elif node.op_type == "MatMul":
                out = ins[0] @ ins[1]
            elif node.op_type == "Relu":
                out = np.maximum(ins[0], 0)
            else:  # Add
                out = ins[0] + ins[1]
            values[node.output[0]] = out.astype(np.float32)
        outs.append(values["y"])
    return outs


def test_mxfp4_activations_become_tensorrts_dynamic_fp4_for_blackwell(tmp_path):
    """MXFP4 activations are TensorRT's dynamic FP4 blocks for 12.0 (NVFP4: blocks of 16 with FP8 scales, finer than
    MX's 32 with powers of two), their GEMMs W4A4 (the weight blocked along its output channels re-quantized FP4
    along the reduction axis, reported); without a target the nearest form: INT8 activations, the FP4 weight
    INT4 weight-only."""
    from trt_bridge.lower.layer_precisions import layer_precisions
    from trt_bridge.runtime.fp4_dynamic import OP
    from trt_bridge.runtime.session import session
    from trt_bridge.tensorrt.build import build_engine

    model = mx_model("fp4_e2m1", w0_axis=1)
    src = save(model, tmp_path / "mxfp4.onnx")
    out = tmp_path / "mxfp4.trt.onnx"
    report = convert(src, out, ConvertOptions(calibration=calibration(tmp_path), progress=False,
                                              formats=FormatOptions(compute_capability="12.0")))
    assert not report.remaining_blockers and report.check["ready"], report.summary()
    whats = {a["node"]: a["what"] for a in report.approximated if a["rule"] == "block-quantize-dequantize"}
    assert set(whats) == {"x_mx", "r_mx", "w0_mx"}, whats
    assert "TensorRT's dynamic FP4 blocks of 16" in whats["x_mx"] and "not the reduction axis" in whats["w0_mx"]
    written = onnx.load(str(out))
    assert not any(n.domain == QUARK for n in written.graph.node)
    assert [n.op_type for n in written.graph.node].count(OP) == 2
    assert layer_precisions(written)["counts"]["fp4"] == 2  # both GEMMs W4A4
    data = feeds(8, 2)
    float_out = reference(mx_model("fp4_e2m1", w0_axis=1, mx=False), data)
    s = session(out)
    got = [s.run(None, f)[0] for f in data]
    source_db, got_db = snr_db(float_out, _mx_source(model, data)), snr_db(float_out, got)
    assert got_db > source_db, (got_db, source_db)  # measured: the MXFP4 source 13.5 dB, its conversion 15.5 dB
    assert len(build_engine(out, compute_capability="SM120")) > 0
    older = convert(src, tmp_path / "older.onnx", ConvertOptions(calibration=calibration(tmp_path), progress=False))
    counts = layer_precisions(onnx.load(str(tmp_path / "older.onnx")))["counts"]
    assert counts.get("fp4", 0) == 0 and counts["int8"] == 1 and counts["int4-w"] == 1, counts
    assert older.check["ready"]
