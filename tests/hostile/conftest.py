"""Fixtures of the hostile-input suite: a small Conv-Relu-Conv-Gemm net, its QOperator form, feeds, a converted
model and its scale table, built once per session and copied into each case's own folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def float_net(seed: int = 0) -> onnx.ModelProto:
    """x [1,3,16,16] → Conv(8) → Relu → Conv(8, stride 2) → Flatten → Gemm(10) → y [1,10]."""
    rng = np.random.default_rng(seed)

    def init(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [init("w1", (8, 3, 3, 3)), init("b1", (8,), 0.1), init("w2", (8, 8, 3, 3)), init("b2", (8,), 0.1),
             init("wf", (10, 8 * 8 * 8), 0.05), init("bf", (10,), 0.1)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Flatten", ["c2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def feeds(count: int = 4, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 1, 3, 16, 16)).astype(np.float32)


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory) -> Path:
    """float.onnx, qop.onnx (quantize_static QOperator), calib.npz, b1.onnx (float.onnx converted) and s.json
    (b1's scales)."""
    import logging

    from onnxruntime.quantization import QuantFormat

    from tests.helpers import quantize_static
    from trt_bridge.cli import main

    level = logging.getLogger("trt_bridge").level
    d = tmp_path_factory.mktemp("hostile-base")
    onnx.save(float_net(), str(d / "float.onnx"))
    data = feeds()
    np.savez(d / "calib.npz", x=data)
    quantize_static(d / "float.onnx", d / "qop.onnx", [{"x": f} for f in data], quant_format=QuantFormat.QOperator)
    assert main(["convert", str(d / "float.onnx"), "-o", str(d / "b1.onnx"), "--calib-data", str(d / "calib.npz"),
                 "-q", "--skip-check"]) == 0
    assert main(["scales", "export", str(d / "b1.onnx"), "--format", "json", "-o", str(d / "s.json"), "-q"]) == 0
    logging.getLogger("trt_bridge").setLevel(level)  # -q set it to errors only
    return d


@pytest.fixture
def case_dir(base_dir, tmp_path) -> Path:
    for p in base_dir.iterdir():
        shutil.copy(p, tmp_path / p.name)
    return tmp_path


@pytest.fixture(autouse=True)
def _keep_log_levels():
    """The CLI sets the trt_bridge logger's level (-q: errors only); the tests after these expect it as it was."""
    import logging

    logger = logging.getLogger("trt_bridge")
    level = logger.level
    yield
    logger.setLevel(level)
