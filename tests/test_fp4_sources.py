"""NVFP4 W4A4 sources (issue 39, item 3): TensorRT's dynamic FP4 activation (``TRT_FP4DynamicQuantize`` →
DequantizeLinear → DequantizeLinear, as ModelOpt exports it and ``convert --fp4`` writes it) is lifted to its float
tensor annotated FP4 (lift/fp4_dynamic.py): kept FP4 for a target that runs it, the nearest form TensorRT builds for
an older one (INT4 weight-only: TensorRT builds no FP8 × INT4 layer), reported in ``approximated``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import save, snr_db
from test_fp4_dynamic import K, w4a4_model

from trt_bridge.choices import FormatOptions
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.lower.layer_precisions import layer_precisions
from trt_bridge.runtime.fp4_dynamic import OP
from trt_bridge.runtime.session import session


def _convert(src, out, target):
    return convert(src, out, ConvertOptions(formats=FormatOptions(compute_capability=target), progress=False))


def _feeds(count=6):
    rng = np.random.default_rng(7)
    return [{"x": (rng.normal(size=(4, K)) * 2).astype(np.float32)} for _ in range(count)]


def _run(path, feeds):
    s = session(path)
    return [s.run(None, f)[0] for f in feeds]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvfp4")
    model, _ = w4a4_model(0.02)
    return root, save(model, root / "w4a4.onnx")


def test_an_nvfp4_source_stays_fp4_for_blackwell(source):
    root, src = source
    out = root / "sm120.onnx"
    report = _convert(src, out, "12.0")
    assert report.rules and any(hit.rule == "fp4-dynamic-activation" for hit in report.rules)
    model = onnx.load(str(out))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count(OP) == 1 and layer_precisions(model)["counts"] == {"fp4": 1}
    q = next(n for n in model.graph.node if n.op_type == OP)
    g = next(i for i in model.graph.initializer if i.name == q.input[1])
    assert float(onnx.numpy_helper.to_array(g)) == pytest.approx(0.02, rel=1e-6)  # its global scale kept
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    weight = producers[next(n for n in model.graph.node if n.op_type == "MatMul").input[1]]
    two_level = producers[weight.input[1]]  # the source's NVFP4 two levels come back (not one float32 per block)
    assert two_level.op_type == "DequantizeLinear"
    assert inits[two_level.input[0]].data_type == onnx.TensorProto.FLOAT8E4M3FN
    feeds = _feeds()
    got, want = _run(out, feeds), _run(src, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))  # the same numbers, through the emulation
    assert report.check["ready"] and "TensorRT-ready FP4" in report.check["headline"]  # built for SM 12.0
    assert not report.approximated


@pytest.mark.parametrize("target", ["8.9", None])
def test_an_nvfp4_source_for_an_older_target_becomes_int4_weight_only(source, target):
    root, src = source
    out = root / f"older-{target}.onnx"
    report = _convert(src, out, target)
    model = onnx.load(str(out))
    assert OP not in {n.op_type for n in model.graph.node}
    assert layer_precisions(model)["counts"] == {"int4-w": 1}
    notes = [a["what"] for a in report.approximated]
    assert any("FP4 activation 'x' written in" in n for n in notes) and any("INT4" in n for n in notes)
    feeds = _feeds()
    assert snr_db(_run(src, feeds), _run(out, feeds)) > 15  # W4A16 against W4A4: the activation unrounded
    assert report.check["ready"]


def test_a_dynamic_fp4_activation_tensorrt_does_not_take_is_declined_by_name(tmp_path):
    model, _ = w4a4_model(0.02)
    for node in model.graph.node:
        if node.op_type == OP:
            for attr in node.attribute:
                if attr.name == "block_size":
                    attr.i = 32
    src = save(model, tmp_path / "b32.onnx")
    with pytest.raises(TrtBridgeError) as error:
        _convert(src, tmp_path / "out.onnx", "12.0")
    message = str(error.value)  # the lift's leftover report: each node with why no rule took it
    assert message.startswith(f"{src}: ")
    assert ("TRT_FP4DynamicQuantize 'x_fp4': axis -1, block size 32: TensorRT quantizes FP4 activations in blocks "
            "of 16 along the last axis") in message
    assert not (tmp_path / "out.onnx").exists()
