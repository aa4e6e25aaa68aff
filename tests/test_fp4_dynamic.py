"""TensorRT's dynamic FP4 activations (``TRT_FP4DynamicQuantize`` → DequantizeLinear → DequantizeLinear) run in
onnxruntime as their exact emulation in standard ops (trt_bridge/runtime/fp4_dynamic.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import save
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.runtime.fp4_dynamic import OP, dequantized, fp4_dynamic_emulated, quantized
from trt_bridge.runtime.session import session

K, N, BLOCK = 64, 32, 16


def activation_nodes(x: str = "x", out: str = "xd") -> list[onnx.NodeProto]:
    """ModelOpt's NVFP4 activation: x ─ TRT_FP4DynamicQuantize(g) ─ DQ(block scales, g) ─ DQ(codes, scales)."""
    return [helper.make_node(OP, [x, "g"], ["x4", "s8"], "x_fp4", domain="trt", axis=-1, block_size=BLOCK,
                             scale_type=TensorProto.FLOAT8E4M3FN),
            helper.make_node("DequantizeLinear", ["s8", "g"], ["s"], "x_scale_dq"),
            helper.make_node("DequantizeLinear", ["x4", "s"], [out], "x_dq", axis=-1, block_size=BLOCK)]


def make_model(nodes, inputs, outputs, inits, opset: int = 23) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fp4_dynamic", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("trt", 1)])
    model.ir_version = 11
    return model


def chain_model(g: float, opset: int = 23) -> onnx.ModelProto:
    """x[b, t, K] ─ the activation chain ─ xd (and the float block scales s)."""
    return make_model(activation_nodes(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", K])],
                      [helper.make_tensor_value_info("xd", TensorProto.FLOAT, ["b", "t", K]),
                       helper.make_tensor_value_info("s", TensorProto.FLOAT, ["b", "t", K // BLOCK])],
                      [numpy_helper.from_array(np.array(g, np.float32), "g")], opset)


def hard_activations(g: float) -> np.ndarray:
    """Random blocks and the edge cases: a zero block, ties at the E2M1 midpoints, values beyond 6·scale (the FP8
    scale rounded down), amax giving subnormal FP8 scales and scales below FP8's smallest subnormal."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(3, 5, K)) * rng.uniform(0.01, 30, size=(3, 5, 1))).astype(np.float32)
    x[0, 0, :16] = 0
    d = np.float32(0.5) * np.float32(g)  # an FP8-exact block scale: amax 3·g gives d = 0.5·g
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, 0.1])
    x[0, 1, :16] = (ties * d).astype(np.float32)
    x[0, 2, :16] = np.float32(6 * 1.0625 * g) * rng.uniform(-1, 1, 16).astype(np.float32)  # amax/6/g a tie → 1.0
    x[0, 2, 3] = np.float32(6 * 1.0625 * g)
    x[0, 3, :16] = rng.normal(size=16).astype(np.float32) * np.float32(g * 0.01)  # FP8 scale subnormal
    x[0, 4, :16] = rng.normal(size=16).astype(np.float32) * np.float32(g * 1e-5)  # below FP8: scale 0
    x[1, 0, :16] = rng.normal(size=16).astype(np.float32) * np.float32(g * 1e4)  # amax/6/g beyond 448: saturates
    return x


def test_numpy_reference_is_tensorrts_definition():
    """Spot values of the reference: ties go to the even code, beyond ±6 saturates, a zero block stays zero."""
    g = 0.01
    x = hard_activations(g)
    codes, scales = quantized(x, g)
    s = scales.astype(np.float32)
    assert s[0, 0, 0] == 0 and not codes[0, 0, :16].astype(np.float32).any()
    assert s[0, 1, 0] == 0.5
    np.testing.assert_array_equal(codes[0, 1, :16].astype(np.float32),
                                  [0, 1, 1, 2, 2, 4, 4, 6, 0, -1, -1, -2, -2, -4, -4, 0])
    assert s[0, 2, 0] == 1.0 and codes[0, 2, 3].astype(np.float32) == 6  # 6.375 saturates at 6
    assert 0 < s[0, 3, 0] < 2.0 ** -6  # a subnormal FP8 E4M3 scale, kept
    assert s[0, 4, 0] == 0 and not dequantized(x, g)[0, 4, :16].any()
    assert s[1, 0, 0] == 448
    assert scales.dtype == ml_dtypes.float8_e4m3fn and codes.dtype == ml_dtypes.float4_e2m1fn


@pytest.mark.parametrize("g", [0.01, 1.0, 3.7e-4])
def test_emulation_equals_the_numpy_reference_bit_for_bit(g):
    model = chain_model(g)
    emulated = fp4_dynamic_emulated(model)
    ops = {(n.domain or "", n.op_type) for n in emulated.graph.node}
    assert all(domain == "" for domain, _ in ops) and ("", "DequantizeLinear") not in ops, ops
    assert {"ReduceMax", "Cast", "Div", "Greater", "GreaterOrEqual", "Sum", "Sign", "Mul", "Reshape"} <= \
        {op for _, op in ops}
    assert "trt" not in {o.domain for o in emulated.opset_import}
    assert fp4_dynamic_emulated(emulated) is emulated  # nothing left to emulate
    x = hard_activations(g)
    got, scales = session(model).run(["xd", "s"], {"x": x})  # trt-bridge's session emulates the source itself
    want = dequantized(x, g)
    assert got.dtype == np.float32
    assert got.tobytes() == want.tobytes()  # bit for bit
    codes, s8 = quantized(x, g)
    assert scales.tobytes() == (s8.astype(np.float32) * np.float32(g)).tobytes()


def w4a4_model(g: float = 0.02) -> tuple[onnx.ModelProto, np.ndarray]:
    """x[4, K] ─ FP4 activation chain ─ MatMul(DQ(W: FP4 E2M1, blocks of 16 along K, NVFP4 two-level scales)) ─ y,
    and W's float values."""
    rng = np.random.default_rng(3)
    codes = rng.choice([-6, -3, -1.5, -0.5, 0, 0.5, 1, 2, 4, 6], size=(K, N)).astype(ml_dtypes.float4_e2m1fn)
    block_scales = rng.uniform(0.5, 8, size=(K // BLOCK, N)).astype(ml_dtypes.float8_e4m3fn)
    wg = np.array(0.0123, np.float32)
    nodes = [*activation_nodes(),
             helper.make_node("DequantizeLinear", ["w_s8", "w_g"], ["w_s"], "w_scale_dq"),
             helper.make_node("DequantizeLinear", ["w_fp4", "w_s"], ["w"], "w_dq", axis=0, block_size=BLOCK),
             helper.make_node("MatMul", ["xd", "w"], ["y"], "fc")]
    inits = [numpy_helper.from_array(np.array(g, np.float32), "g"), numpy_helper.from_array(codes, "w_fp4"),
             numpy_helper.from_array(block_scales, "w_s8"), numpy_helper.from_array(wg, "w_g")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])], inits)
    w = codes.astype(np.float32) * np.repeat(block_scales.astype(np.float32) * wg, BLOCK, axis=0)
    return model, w


def test_w4a4_model_runs_in_onnxruntime_and_its_source_builds_for_sm120(tmp_path):
    from trt_bridge.tensorrt.build import EngineBuildError, build_engine
    from trt_bridge.tensorrt.parse import parse

    g = 0.02
    model, w = w4a4_model(g)
    path = save(model, tmp_path / "w4a4.onnx")
    x = np.random.default_rng(4).normal(size=(4, K)).astype(np.float32) * 2
    x[1, :16] = 0
    (y,) = session(path).run(None, {"x": x})
    np.testing.assert_allclose(y, dequantized(x, g) @ w, rtol=1e-5, atol=1e-5)
    # the un-emulated source: TensorRT-RTX parses it and builds it ahead of time for SM 12.0
    assert parse(path).ok
    assert len(build_engine(path, compute_capability="SM120")) > 0
    with pytest.raises(EngineBuildError, match="fp4"):  # and refuses it for SM 8.9: the build is no formality
        build_engine(path, compute_capability="SM89")


def test_verify_says_it_compared_an_emulation(tmp_path):
    from trt_bridge.verification import VerifyOptions, verify

    model, _ = w4a4_model()
    path = save(model, tmp_path / "w4a4.onnx")
    report = verify(path, path, VerifyOptions(random=2))
    assert report.passed and report.emulated == [str(path), str(path)]
    assert "compared an emulation" in report.summary() and OP in report.summary()
    assert report.to_dict()["emulated"] == [str(path), str(path)]


def test_what_cannot_be_emulated_is_refused_by_name():
    with pytest.raises(UnsupportedPatternError, match="opset 19"):
        fp4_dynamic_emulated(chain_model(0.01, opset=17))
    model = chain_model(0.01)
    model.graph.node.append(helper.make_node("Identity", ["x4"], ["raw"], "peek"))
    with pytest.raises(UnsupportedPatternError, match="peek: reads the FP4 codes 'x4'"):
        fp4_dynamic_emulated(model)
    odd = chain_model(0.01)
    odd.graph.node[0].attribute[1].i = 32
    with pytest.raises(UnsupportedPatternError, match="x_fp4: .*block_size=16"):
        fp4_dynamic_emulated(odd)
