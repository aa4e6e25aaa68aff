"""lift/dynamic_gemm_plugin.py: quantize_dynamic's MatMul → one DynamicInt8Gemm node (convert --activations dynamic).

The rule is called directly on small graphs (match, then rewrite; a decline leaves graph and context as they
were); the converted models are compared with their source in onnxruntime, which runs the node as its
decomposition (trt_bridge.ir.dynamic_gemm.decompose), and parsed and built ahead of time by TensorRT-RTX."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from apply_rule import build_model, declined, lifted, ops_left, run_outputs, tensor_info
from helpers import assert_tensorrt_ready, quantize_dynamic, save, snr_db
from onnx import TensorProto, helper

from trt_bridge import samples
from trt_bridge.checks import check_model
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.dynamic_gemm import DOMAIN, OP_TYPE, decompose, node_arrays
from trt_bridge.lift.dynamic_gemm_plugin import DynamicGemmPlugin

K, N = 16, 6


def _source(weight_type=np.int8, per_column=False, bias=True, epilogue="Mul", seed=0) -> onnx.ModelProto:
    """onnxruntime's quantize_dynamic MatMul, as it writes it::

        x [2, 3, K] ─ DynamicQuantizeLinear ─ q, s, z
        q, W [K, N], z, w_zp ─ MatMulInteger ─ Cast(float) ─ Mul(·, Mul(s, w_scale)) [─ Add(bias)] ─ y
    """
    rng = np.random.default_rng(seed)
    info = np.iinfo(weight_type)
    weight = rng.integers(info.min, info.max + 1, size=(K, N)).astype(weight_type)
    shape = (N,) if per_column else ()
    w_zp = rng.integers(info.min // 2 + 64, info.max // 2, size=shape).astype(weight_type) if weight_type == np.uint8 \
        else rng.integers(-5, 6, size=shape).astype(np.int8)
    w_scale = rng.uniform(0.001, 0.01, size=shape).astype(np.float32)
    inits = {"W": weight, "w_zp": w_zp, "w_scale": w_scale, "bias": rng.standard_normal(N).astype(np.float32)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
             helper.make_node("MatMulInteger", ["q", "W", "z", "w_zp"], ["acc"], name="matmul"),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["s", "w_scale"], ["prod"], name="scale_mul")]
    if epilogue == "Mul":
        nodes.append(helper.make_node("Mul", ["accf", "prod"], ["y0"], name="dequant"))
    else:  # a quantizer that divides: same value, another rounding, so not this rule's
        nodes += [helper.make_node("Reciprocal", ["prod"], ["inv"], name="inv"),
                  helper.make_node("Div", ["accf", "inv"], ["y0"], name="dequant")]
    last = "y0"
    if bias:
        nodes.append(helper.make_node("Add", ["y0", "bias"], ["y"], name="bias"))
        last = "y"
    else:
        nodes[-1].output[0] = "y"
    del last
    return build_model(nodes, [tensor_info("x", [2, 3, K])], [tensor_info("y", [2, 3, N])], inits)


def _feeds(seed=1, n=6):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((2, 3, K)) * rng.uniform(0.1, 5)).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("weight_type", [np.int8, np.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_one_plugin_node_reproduces_the_source_bit_for_bit(weight_type, per_column, bias):
    source = _source(weight_type, per_column, bias)
    out, ctx = lifted(source, (DynamicGemmPlugin(), "matmul"))
    assert ops_left(out) == [OP_TYPE]
    node = out.graph.node[0]
    assert node.domain == DOMAIN and list(node.input) == ["x"] and list(node.output) == ["y"]
    arrays = node_arrays(node)
    assert arrays["weight"].dtype == np.int8 and arrays["weight"].shape == (K, N)
    assert arrays["weight_scale"].size == (N if per_column else 1)
    assert (arrays["bias"] is not None) == bias
    assert not ctx.annotations.activations  # nothing left to calibrate
    feeds = _feeds()
    for want, got in zip(run_outputs(source, feeds), run_outputs(out, feeds)):
        assert np.array_equal(want[0], got[0])


def test_per_token_granularity_keeps_small_rows_accurate():
    source = _source(np.int8, per_column=True)
    rng = np.random.default_rng(3)
    # rows of very different ranges: one scale for the whole tensor leaves the small rows a few codes
    feeds = [{"x": (rng.standard_normal((2, 3, K)) * np.array([0.01, 1, 30])[None, :, None]).astype(np.float32)}
             for _ in range(4)]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in source.graph.initializer}
    w = (inits["W"].astype(np.float32) - inits["w_zp"]) * inits["w_scale"]
    small_rows = [(f["x"] @ w)[:, 0] for f in feeds]  # without the bias, which both add exactly
    tensor, _ = lifted(source, (DynamicGemmPlugin("tensor"), "matmul"))
    token, _ = lifted(source, (DynamicGemmPlugin("token"), "matmul"))
    assert ops_left(token) == [OP_TYPE] and node_arrays(token.graph.node[0])["granularity"] == "token"
    bias = inits["bias"]
    snr_tensor = snr_db(small_rows, [o[0][:, 0] - bias for o in run_outputs(tensor, feeds)])
    snr_token = snr_db(small_rows, [o[0][:, 0] - bias for o in run_outputs(token, feeds)])
    assert snr_token > 30 and snr_token > snr_tensor + 20, (snr_tensor, snr_token)


def test_decomposition_is_standard_onnx():
    out, _ = lifted(_source(np.uint8, per_column=True), (DynamicGemmPlugin("token"), "matmul"))
    plain = decompose(out)
    assert all(n.domain in ("", "ai.onnx") for n in plain.graph.node)
    assert DOMAIN not in {o.domain for o in plain.opset_import}
    onnx.checker.check_model(plain, full_check=True)
    assert decompose(plain) is plain  # nothing left to decompose


def test_declines_an_epilogue_it_cannot_reproduce():
    reason = declined(_source(epilogue="Div"), DynamicGemmPlugin(), "matmul")
    assert "Mul(x_scale, w_scale)" in reason


def test_declines_a_weight_that_is_not_constant():
    model = _source()
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "W"))
    model.graph.input.append(tensor_info("W", [K, N], TensorProto.INT8))
    assert "not a constant" in declined(model, DynamicGemmPlugin(), "matmul")


def test_declines_codes_not_from_dynamic_quantize_linear():
    model = _source()
    model.graph.node[1].input[2] = "w_zp_x"  # the activation zero point is not the DynamicQuantizeLinear's
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(128, np.uint8), "w_zp_x"))
    assert "zero point" in declined(model, DynamicGemmPlugin(), "matmul")


@pytest.mark.parametrize("kwargs", [{}, {"per_channel": True}, {"weight_type": "QUInt8"}],
                         ids=["int8", "per-channel", "uint8"])
def test_convert_writes_plugin_nodes_tensorrt_builds(tmp_path, kwargs):
    from onnxruntime.quantization import QuantType

    if "weight_type" in kwargs:
        kwargs = {"weight_type": QuantType.QUInt8}
    fpath = save(samples.transformer_block(layers=1), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", **kwargs)
    out = tmp_path / "plugin.onnx"
    report = convert(dpath, out, ConvertOptions(activations=ActivationOptions("dynamic"), progress=False))
    assert report.calibration is None  # no calibration data needed
    assert len(report.plugin["layers"]) == 6 and report.plugin["granularity"] == "tensor"
    model = onnx.load(str(out))
    assert sum(n.op_type == OP_TYPE for n in model.graph.node) == 6
    assert not {n.op_type for n in model.graph.node} & {"DynamicQuantizeLinear", "MatMulInteger"}
    held_out = [{"x": f} for f in samples.sequence_feeds(4, 2, 16, 64)]
    for want, got in zip(run_outputs(onnx.load(str(dpath)), held_out), run_outputs(model, held_out)):
        assert np.array_equal(want[0], got[0])
    assert_tensorrt_ready(out)
    checked = check_model(out)
    assert checked.ready and {f.rule for f in checked.findings} == {"plugin"}
    assert report.precision["counts"]["int8"] == 6


def test_static_is_the_default_and_granularity_needs_dynamic():
    assert ConvertOptions().activations.mode == "static"
    with pytest.raises(TrtBridgeError, match="--activations dynamic"):
        ActivationOptions("static", "token")
    with pytest.raises(TrtBridgeError, match="choose static or dynamic"):
        ActivationOptions("plugin")
