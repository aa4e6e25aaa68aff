"""On a GPU runner with TensorRT (TRT_BRIDGE_GPU=1): engines with trt-bridge's DynamicInt8Gemm plugin compute
what its reference computes.

- one plugin node alone: the engine's output equals the numpy reference bit for bit (the kernels' integer math
  and float32 roundings), fp32 and fp16, both granularities;
- a converted transformer (``--activations dynamic``): the engine agrees with onnxruntime's run of the source
  (its other layers are TensorRT's own float kernels, so to within float rounding: SNR above 40 dB).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from helpers import quantize_dynamic, run_ort, save, snr_db
from onnx import TensorProto, helper
from trt_bridge.plugins import reference
from trt_bridge.plugins.registry import register_builtin

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ActivationOptions, ConvertOptions
from trt_bridge.ir.dynamic_gemm import DOMAIN, OP_TYPE, plugin_attributes
from trt_bridge.tensorrt import import_tensorrt, is_rtx
from trt_bridge.tensorrt.build import build_engine

pytestmark = pytest.mark.gpu


def _runner(engine: bytes):
    trt = import_tensorrt()
    if is_rtx(trt):
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
    register_builtin(trt)
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(engine))


@pytest.mark.parametrize("granularity", ["tensor", "token"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_one_plugin_node_matches_the_reference_bit_for_bit(tmp_path, granularity, dtype):
    rng = np.random.default_rng(7)
    k, n = 384, 1536
    weight = rng.integers(-128, 128, (k, n)).astype(np.int8)
    zero_point = rng.integers(-3, 4, n).astype(np.int32)
    scale = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    node = helper.make_node(OP_TYPE, ["x"], ["y"], name="gemm", domain=DOMAIN,
                            **plugin_attributes(weight, zero_point, scale, bias, granularity))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, [4, 37, k])],
                              [helper.make_tensor_value_info("y", elem, [4, 37, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    path = save(model, tmp_path / "gemm.onnx")
    x = (rng.standard_normal((4, 37, k)) * 3).astype(dtype)
    want = reference.dynamic_gemm(x, weight, zero_point, scale, bias, granularity)
    with _runner(build_engine(path, compute_capability=None)) as runner:
        got = runner.infer({"x": x})["y"]
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_converted_transformer_engine_agrees_with_onnxruntime(tmp_path):
    fpath = save(samples.transformer_block(layers=2), tmp_path / "float.onnx")
    dpath = quantize_dynamic(fpath, tmp_path / "dynamic.onnx", per_channel=True)
    out = tmp_path / "plugin.onnx"
    convert(dpath, out, ConvertOptions(activations=ActivationOptions("dynamic"), progress=False))
    assert sum(n.op_type == OP_TYPE for n in onnx.load(str(out)).graph.node) == 12
    feeds = [{"x": f} for f in samples.sequence_feeds(4, 2, 16, 64)]
    expected = run_ort(out, feeds)
    with _runner(build_engine(out, compute_capability=None)) as runner:
        got = [runner.infer(feed)[next(iter(runner.get_output_metadata()))] for feed in feeds]
    assert snr_db(expected, got) > 40
