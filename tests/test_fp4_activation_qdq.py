"""FP4 Q/DQ of activations (issue 39, item 3): an opset-23 QuantizeLinear → DequantizeLinear pair with FLOAT4E2M1
codes of a computed tensor, per tensor or in static blocks of 16 along the last axis (lift/fp4_activation_qdq.py),
becomes TensorRT's dynamic FP4 where the target runs FP4 GEMMs, FP8 or INT8 over the same range elsewhere, each
reported in ``approximated``. onnxruntime 1.32 has no FP4 QuantizeLinear: the source runs in onnx's reference
evaluator (numpy), the converted model in onnxruntime with TensorRT's FP4 emulated (runtime/fp4_dynamic.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_builds_at, op_types, run_exact, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper

from trt_bridge.choices import FormatOptions
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.runtime.fp4_dynamic import OP

M, K, N = 8, 64, 32
RNG = np.random.default_rng(3)
X_SCALE = 4.0  # the activations' spread: the source's per-tensor scale covers ±amax of the calibration data
W = (RNG.normal(size=(K, N)) / np.sqrt(K)).astype(np.float32)
KERNEL = (RNG.normal(size=(32, 32, 3, 3)) / 17).astype(np.float32)


def _x(count: int = 4, shape=(M, K)) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [{"x": (rng.normal(size=shape) * X_SCALE).astype(np.float32)} for _ in range(count)]


def fp4_model(layout: str = "tensor", reader: str = "matmul", scale=None, zero=None, attrs=None) -> onnx.ModelProto:
    """x ─ Q(s; FLOAT4E2M1) ─ DQ(s) ─ MatMul(W) (or a 3×3 Conv of 32 channels); ``layout`` "tensor" (one scale) or
    "blocks" (a static scale per block of 16 along the last axis); ``reader`` "matmul", "fp4-weight" (W as FP4
    blocks of 16 along K, a DequantizeLinear of constant codes) or "conv"."""
    shape = [1, 32, 8, 8] if reader == "conv" else [M, K]
    amax = 4.5 * X_SCALE  # about 4.5 σ of the activations
    if scale is None:
        blocks = (shape[0], shape[1], shape[2], shape[3] // 16) if reader == "conv" else (M, K // 16)
        spread = np.linspace(0.6, 1.0, int(np.prod(blocks))).reshape(blocks)  # the blocks' static ranges differ
        scale = (amax / 6 * spread).astype(np.float32) if layout == "blocks" else np.array(amax / 6, np.float32)
    attrs = attrs if attrs is not None else ({"axis": -1, "block_size": 16} if layout == "blocks" else {})
    q_in = ["x", "s"] + (["z"] if zero is not None else [])
    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "s")]
    if zero is not None:
        inits.append(helper.make_tensor("z", TensorProto.FLOAT4E2M1, np.shape(zero), np.ravel(zero).tolist()))
    nodes = [helper.make_node("QuantizeLinear", q_in, ["xq"], "x_q", output_dtype=TensorProto.FLOAT4E2M1, **attrs),
             helper.make_node("DequantizeLinear", ["xq"] + q_in[1:], ["xd"], "x_dq", **attrs)]
    if reader == "conv":
        inits.append(numpy_helper.from_array(KERNEL, "k"))
        nodes.append(helper.make_node("Conv", ["xd", "k"], ["y"], "conv", pads=[1, 1, 1, 1]))
        out = [1, 32, 8, 8]
    elif reader == "fp4-weight":
        ws = (np.abs(W).reshape(K // 16, 16, N).max(axis=1) / 6).astype(np.float32)
        codes = np.clip(W / np.repeat(ws, 16, axis=0), -6, 6)
        inits += [helper.make_tensor("wq", TensorProto.FLOAT4E2M1, [K, N], codes.ravel().tolist()),
                  numpy_helper.from_array(ws, "ws")]
        nodes += [helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], "w_dq", axis=0, block_size=16),
                  helper.make_node("MatMul", ["xd", "w"], ["y"], "matmul")]
        out = [M, N]
    else:
        inits.append(numpy_helper.from_array(W, "w"))
        nodes.append(helper.make_node("MatMul", ["xd", "w"], ["y"], "matmul"))
        out = [M, N]
    graph = helper.make_graph(nodes, "fp4_activation_qdq", [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    return model


def float_model(reader: str = "matmul") -> onnx.ModelProto:
    """The source without its activation Q/DQ: what both are compared with."""
    model = fp4_model(reader=reader)
    nodes = [n for n in model.graph.node if n.op_type not in ("QuantizeLinear",) and n.name != "x_dq"]
    for n in nodes:
        n.input[:] = ["x" if i == "xd" else i for i in n.input]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _convert(src, out, target):
    return convert(src, out, ConvertOptions(formats=FormatOptions(compute_capability=target), progress=False))


@pytest.mark.parametrize("layout", ["tensor", "blocks"])
@pytest.mark.parametrize("target,ops", [("12.0", {OP, "DequantizeLinear", "MatMul"}),
                                        ("8.9", {"QuantizeLinear", "DequantizeLinear", "MatMul"}),
                                        (None, {"QuantizeLinear", "DequantizeLinear", "MatMul"})])
def test_op_types_and_the_approximation_for_each_target(tmp_path, layout, target, ops):
    src = save(fp4_model(layout), tmp_path / "src.onnx")
    report = _convert(src, tmp_path / "out.onnx", target)
    assert op_types(tmp_path / "out.onnx") == ops
    [approx] = [a for a in report.approximated if a["rule"] == "fp4-activation-qdq"]
    assert approx["node"] == "x_q"
    written = {"12.0": "dynamic FP4: blocks of 16", "8.9": "written in FP8", None: "written in INT8"}[target]
    assert written in approx["what"] and "'x'" in approx["what"]
    fmt = {"12.0": "fp4", "8.9": "fp8", None: "int8"}[target]
    assert {f["format"] for f in report.formats if f["tensor"] == "x"} <= {fmt}


def test_conv_reader_is_fp8_for_an_fp4_target(tmp_path):
    src = save(fp4_model(reader="conv"), tmp_path / "src.onnx")
    report = _convert(src, tmp_path / "out.onnx", "12.0")
    assert OP not in op_types(tmp_path / "out.onnx") and "QuantizeLinear" in op_types(tmp_path / "out.onnx")
    [approx] = [a for a in report.approximated if a["rule"] == "fp4-activation-qdq"]
    assert "written in FP8" in approx["what"] and "Conv input 0 is not a GEMM's activation" in approx["what"]
    feeds = _x(2, (1, 32, 8, 8))
    reference = run_ort(float_model("conv"), feeds)
    assert snr_db(reference, run_ort(tmp_path / "out.onnx", feeds)) > snr_db(reference, run_exact(src, feeds))


@pytest.mark.parametrize("layout", ["tensor", "blocks"])
@pytest.mark.parametrize("reader", ["matmul", "fp4-weight"])
def test_converted_is_at_least_as_accurate_as_the_source(tmp_path, layout, reader):
    """The source's FP4 math (onnx's reference evaluator) and the 12.0 output (TensorRT's dynamic FP4, emulated),
    both against the float model; the FP8 (8.9) output too."""
    src = save(fp4_model(layout, reader), tmp_path / "src.onnx")
    feeds = _x()
    reference = run_ort(float_model(reader) if reader == "matmul" else _float_of(src), feeds)
    source = snr_db(reference, run_exact(src, feeds))
    _convert(src, tmp_path / "fp4.onnx", "12.0")
    _convert(src, tmp_path / "fp8.onnx", "8.9")
    fp4 = snr_db(reference, run_ort(tmp_path / "fp4.onnx", feeds))
    fp8 = snr_db(reference, run_ort(tmp_path / "fp8.onnx", feeds))
    assert 10 < source <= fp4 + 0.1, (source, fp4)
    assert fp8 > source, (source, fp8)


def _float_of(src) -> onnx.ModelProto:
    """The FP4-weight source with its activation pair removed: the float model of its (FP4) weight."""
    model = onnx.load(str(src))
    nodes = [n for n in model.graph.node if n.name not in ("x_q", "x_dq")]
    for n in nodes:
        n.input[:] = ["x" if i == "xd" else i for i in n.input]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


@pytest.mark.parametrize("layout", ["tensor", "blocks"])
def test_outputs_build_for_sm120_and_sm89(tmp_path, layout):
    src = save(fp4_model(layout, "fp4-weight"), tmp_path / "src.onnx")
    for target in ("12.0", "8.9"):
        out = tmp_path / f"out{target}.onnx"
        _convert(src, out, target)
        assert_builds_at(out, {"static": {"x": ((M, K),) * 3}}, target)


@pytest.mark.parametrize("change,expected", [
    (dict(scale=np.array(0.0, np.float32)), "scale is not finite and positive"),
    (dict(scale=np.array(np.inf, np.float32)), "scale is not finite and positive"),
    (dict(scale=np.array(-1.0, np.float32)), "scale is not finite and positive"),
    (dict(zero=np.array(1.0, np.float32)), "zero point is not 0"),
    (dict(scale=np.full((M, K // 32), 1.0, np.float32), attrs={"axis": -1, "block_size": 32}),
     "block size 32 on axis -1"),
    (dict(scale=np.full((M // 16 + 1, K), 1.0, np.float32), attrs={"axis": 0, "block_size": 16}),
     "block size 16 on axis 0"),
    (dict(scale=np.full((K,), 1.0, np.float32), attrs={"axis": 1}), "per axis"),
])
def test_bad_input_is_one_line_naming_the_node_and_nothing_is_written(tmp_path, change, expected):
    model = fp4_model(**change)
    src = tmp_path / "src.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "out.onnx"
    with pytest.raises(UnsupportedPatternError) as error:
        _convert(src, out, "12.0")
    message = str(error.value)
    assert "\n" not in message and "'x_q'" in message and expected in message, message
    assert not out.exists()
