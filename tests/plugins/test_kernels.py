"""The dynamic INT8 GEMM plugin's kernels without a GPU: NVRTC compiles them for every architecture, the build
script writes them, the numpy reference is onnxruntime's DynamicQuantizeLinear (+ MatMulInteger chain) bit for bit,
and the kernels' integer algebra (int8 activations, row/column sums, wrapping corrections) is the plain definition.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from trt_bridge.plugins import build, kernels, reference

from trt_bridge.errors import TrtBridgeError

RNG_SEED = 20261126


@pytest.mark.parametrize("arch", kernels.ARCHITECTURES)
def test_nvrtc_compiles_every_architecture(arch):
    image = kernels.compile_kernels(arch)
    assert image[:4] == b"\x7fELF"  # a cubin
    for name in kernels.FUNCTIONS:
        assert name.encode() in image


def test_ptx_target_and_source():
    ptx = kernels.compile_kernels(90, "ptx").decode().rstrip("\x00")
    assert ".target sm_90" in ptx
    for name in kernels.FUNCTIONS:
        assert f".entry {name}(" in ptx
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in ptx
    assert "fma.rn.f32" not in ptx  # no contraction anywhere
    assert "#include" not in kernels.source()
    with pytest.raises(TrtBridgeError, match="compile target"):
        kernels.compile_kernels(90, "fatbin")


def test_compile_failure_is_a_kernel_compile_error():
    with pytest.raises(kernels.KernelCompileError, match="sm_30.*this NVRTC builds for"):
        kernels.compile_kernels(30)


def test_build_script_writes_two_architectures(tmp_path, capsys):
    assert build.main(["--out", str(tmp_path / "out"), "--arch", "86", "90"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("sm_86: ") and "registers: " in lines[1]
    for arch in (86, 90):
        data = (tmp_path / "out" / f"dynamic_gemm.sm_{arch}.cubin").read_bytes()
        assert data == kernels.compile_kernels(arch)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["dynamic_gemm.sm_86.cubin",
                                                                   "dynamic_gemm.sm_90.cubin"]
    assert build.main(["--out", str(tmp_path / "ptx"), "--arch", "80", "--target", "ptx"]) == 0
    assert (tmp_path / "ptx" / "dynamic_gemm.sm_80.ptx").read_text().rstrip().endswith("}")
    assert build.main(["--out", str(tmp_path / "bad"), "--arch", "30"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: NVRTC could not compile") and "\n" not in err


def dql_session():
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"])
    graph = helper.make_graph([node], "dql", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, ["a", "b"]),
                               helper.make_tensor_value_info("y_scale", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("y_zero_point", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def random_tensors(rng, count):
    kinds = ("mixed", "positive", "negative", "zero", "quarters", "constant", "wide", "tiny")
    for i in range(count):
        kind = kinds[i % len(kinds)]
        shape = (int(rng.integers(1, 9)), int(rng.integers(1, 70)))
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(10.0 ** rng.uniform(-3, 3))
        if kind == "positive":
            x = np.abs(x)
        elif kind == "negative":
            x = -np.abs(x)
        elif kind == "zero":
            x = np.zeros(shape, np.float32)
        elif kind == "quarters":  # many exact ties for the rounding
            x = (np.round(x * 4) / 4).astype(np.float32)
        elif kind == "constant":
            x = np.full(shape, np.float32(rng.uniform(-5, 5)), np.float32)
        elif kind == "wide":
            x = (rng.uniform(-1, 1, shape) * 1e30).astype(np.float32)
        elif kind == "tiny":
            x = (rng.uniform(-1, 1, shape) * 1e-30).astype(np.float32)
        yield kind, x


def test_quantize_per_tensor_is_onnxruntime_dynamic_quantize_linear():
    session, rng = dql_session(), np.random.default_rng(RNG_SEED)
    seen = set()
    for kind, x in random_tensors(rng, 400):
        codes, scale, zero_point = reference.quantize_per_tensor(x)
        ort_codes, ort_scale, ort_zp = session.run(None, {"x": x})
        assert codes.dtype == np.uint8 and isinstance(scale, np.float32) and zero_point.dtype == np.uint8
        assert np.array_equal(codes, ort_codes), kind
        assert scale.tobytes() == ort_scale.astype(np.float32).tobytes(), kind
        assert int(zero_point) == int(ort_zp), kind
        seen.add((kind, int(zero_point) in (0, 255)))
    assert ("positive", True) in seen and ("negative", True) in seen and ("mixed", False) in seen


def matmul_integer_chain_session(bias: bool):
    """onnxruntime's own dynamic GEMM: DynamicQuantizeLinear, MatMulInteger, Cast, Mul (scale product), Add.

    The int8 weight and its zero points are fed offset to uint8 (+128, the same products): onnxruntime's uint8 ×
    int8 kernel saturates pair sums in int16 on x86 CPUs without VNNI, its uint8 × uint8 one is exact everywhere
    (see trt_bridge.runtime.exact_integer)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xzp", "wzp"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["prod"]),
             helper.make_node("Mul", ["accf", "prod"], ["y0" if bias else "y"])]
    if bias:
        nodes.append(helper.make_node("Add", ["y0", "b"], ["y"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", "k"]),
              helper.make_tensor_value_info("w", TensorProto.UINT8, ["k", "n"]),
              helper.make_tensor_value_info("wzp", TensorProto.UINT8, ["n"]),
              helper.make_tensor_value_info("ws", TensorProto.FLOAT, ["n"])]
    if bias:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"]))
    graph = helper.make_graph(nodes, "gemm", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def random_gemm(rng, m, k, n, bias=True):
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 10) + rng.uniform(-1, 1)).astype(np.float32)
    weight = rng.integers(-128, 128, (k, n), dtype=np.int8)
    zero_point = rng.integers(-128, 128, n).astype(np.int32)
    scale = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    return x, weight, zero_point, scale, b


@pytest.mark.parametrize("bias", [False, True])
def test_tensor_granularity_is_onnxruntime_matmul_integer_chain(bias):
    rng = np.random.default_rng(RNG_SEED + bias)
    session = matmul_integer_chain_session(bias)
    for m, k, n in ((1, 1, 1), (3, 7, 5), (37, 64, 33), (16, 383, 129), (5, 1024, 8)):
        x, weight, zero_point, scale, b = random_gemm(rng, m, k, n, bias)
        feeds = {"x": x, "w": (weight.astype(np.int16) + 128).astype(np.uint8),
                 "wzp": (zero_point + 128).astype(np.uint8), "ws": scale}
        if bias:
            feeds["b"] = b
        (expected,) = session.run(None, feeds)
        got = reference.dynamic_gemm(x, weight, zero_point, scale, b, "tensor")
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), expected.view(np.uint32)), (m, k, n)


def test_quantize_per_token():
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.54, 0.01], [-127.0, 63.5, 0.5]], np.float32)
    codes, scales = reference.quantize_per_token(x)
    assert scales.dtype == np.float32 and scales[0] == 1.0 and scales[1] == np.float32(2.54) / np.float32(127)
    assert codes.dtype == np.int8 and codes[0].tolist() == [0, 0, 0]
    assert codes[1].tolist() == [50, -127, 0] and codes[2].tolist() == [-127, 64, 0]  # 63.5 ties to even 64
    assert np.abs(codes).max() <= 127


def extreme_cases(rng):
    k, n = 1031, 7
    yield "x at its max", np.full((4, k), 3.5, np.float32), np.full((k, n), -128, np.int8), np.full(n, 127)
    yield "x at its min", np.full((4, k), -3.5, np.float32), np.full((k, n), 127, np.int8), np.full(n, -128)
    big = np.full((2, 32999), 1e3, np.float32)
    yield "K near the limit", big, np.full((32999, 3), -128, np.int8), np.array([127, -128, 0])
    mixed = rng.standard_normal((9, k)).astype(np.float32)
    mixed[:, ::2] = mixed.max()
    yield "mixed extremes", mixed, rng.choice(np.array([-128, 127], np.int8), (k, n)), rng.choice([-128, 127], n)
    yield "zeros", np.zeros((3, 5), np.float32), rng.integers(-128, 128, (5, 2), dtype=np.int8), np.array([5, -9])


@pytest.mark.parametrize("granularity", kernels.GRANULARITIES)
def test_kernel_algorithm_is_the_plain_definition(granularity):
    rng = np.random.default_rng(RNG_SEED + 7)
    cases = [(f"random {m}x{k}x{n}", *random_gemm(rng, m, k, n)[:3])
             for m, k, n in ((1, 1, 1), (2, 3, 5), (37, 63, 17), (8, 64, 64), (5, 65, 9), (33, 383, 31))]
    for name, x, weight, zero_point in [*cases, *extreme_cases(rng)]:
        expected = reference.accumulator(x, weight, zero_point, granularity)
        got = reference.kernel_algorithm(x, weight, zero_point, granularity)
        assert got.dtype == np.int32 and got.shape == expected.shape, name
        assert np.array_equal(got.astype(np.int64), expected), name
        if name == "K near the limit":  # (255 - 0) * (-128 - 127) * K and 127 * (-128 - 127) * K, just inside int32
            assert expected.min() == (-65025 if granularity == "tensor" else -32385) * 32999


def test_pack_weights_layout_and_checks():
    rng = np.random.default_rng(RNG_SEED + 3)
    weight = rng.integers(-128, 128, (70, 3), dtype=np.int8)
    zero_point = np.array([-128, 0, 127])
    packed = kernels.pack_weights(weight, zero_point)
    assert packed.weight_nk.shape == (3, 128) and packed.k_padded == 128 and (packed.k, packed.n) == (70, 3)
    assert np.array_equal(packed.weight_nk[:, :70], weight.T) and not packed.weight_nk[:, 70:].any()
    assert np.array_equal(packed.col_sums, weight.astype(np.int64).sum(axis=0))
    assert np.array_equal(packed.col_correction, weight.astype(np.int64).sum(axis=0) - 70 * zero_point)
    with pytest.raises(TrtBridgeError, match="int8"):
        kernels.pack_weights(weight.astype(np.int16), zero_point)
    with pytest.raises(TrtBridgeError, match=r"\[-128, 127\]"):
        kernels.pack_weights(weight, np.array([0, 0, 128]))
    assert kernels.pack_weights(np.ones((kernels.MAX_K, 1), np.int8), np.zeros(1, np.int32)).k == 33025
    with pytest.raises(TrtBridgeError, match="K = 33026 is too large"):
        kernels.pack_weights(np.ones((33026, 1), np.int8), np.zeros(1, np.int32))


def test_workspace_layout():
    tensor = kernels.workspace_layout(37, 383, "tensor")
    assert tensor["q"] == 0 and tensor["rowsum"] == kernels.round_up(37 * 384, 256)
    assert all(offset % 256 == 0 for offset in tensor.values())
    assert tensor["size"] == kernels.workspace_size(37, 383, "tensor") >= tensor["params"] + 16
    token = kernels.workspace_layout(37, 383, "token")
    assert set(token) == {"q", "rowsum", "rowscale", "size"} and token["size"] >= token["rowscale"] + 4 * 37
    with pytest.raises(TrtBridgeError, match="granularity"):
        kernels.workspace_size(1, 1, "channel")


@pytest.mark.parametrize("granularity", kernels.GRANULARITIES)
def test_dynamic_gemm_3d_and_float16(granularity):
    rng = np.random.default_rng(RNG_SEED + 11)
    x, weight, zero_point, scale, bias = random_gemm(rng, 2 * 3, 19, 11)
    y32 = reference.dynamic_gemm(x, weight, zero_point, scale, bias, granularity)
    y3d = reference.dynamic_gemm(x.reshape(2, 3, 19), weight, zero_point, scale, bias, granularity)
    assert y3d.shape == (2, 3, 11) and np.array_equal(y3d.reshape(6, 11), y32)
    x16 = x.astype(np.float16).reshape(2, 3, 19)
    y16 = reference.dynamic_gemm(x16, weight, zero_point, scale, bias, granularity)
    assert y16.dtype == np.float16 and y16.shape == (2, 3, 11)
    widened = reference.dynamic_gemm(x16.astype(np.float32), weight, zero_point, scale, bias, granularity)
    assert np.array_equal(y16, widened.astype(np.float16))  # widened exactly, narrowed once at the end
    acc = reference.accumulator(x, weight, zero_point, granularity)
    _, row_scale, _ = reference.quantize(x, granularity)
    by_hand = acc.astype(np.float32) * (row_scale[:, None] * scale[None, :]) + bias
    assert np.array_equal(y32, by_hand.astype(np.float32))
    assert np.abs(y32 - (x @ (weight.astype(np.float32) - zero_point) * scale + bias)).max() < 0.05 * np.abs(y32).max()
