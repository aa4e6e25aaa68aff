"""Real quantized models from public model zoos (../shared/models); skipped when absent."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_exact, run_ort, snr_db

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.tensorrt.parse import parse


def test_mnist_dynamic_uint8_converts_builds_and_keeps_accuracy(shared_models, tmp_path):
    """ONNX Model Zoo MNIST, dynamically quantized (DynamicQuantizeLinear, ConvInteger, MatMulInteger)."""
    source = shared_models / "mnist-12-uint8.onnx"
    before = source.read_bytes()
    rejected = parse(source)
    assert not rejected.ok and any("DynamicQuantizeLinear" in e for e in rejected.errors)

    np.savez(tmp_path / "calib.npz", Input3=samples.digit_feeds(32, seed=1)[:, 0])
    out = tmp_path / "mnist-int8.onnx"
    report = convert(source, out, ConvertOptions(calibration=CalibrationOptions(data=str(tmp_path / "calib.npz")),
                                                 progress=False))
    assert source.read_bytes() == before  # the input is never modified

    assert report.rules[0].rule == "dynamic-integer-op" and len(report.rules[0].nodes) == 3
    assert not op_types(out) & {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)

    held_out = [{"Input3": f} for f in samples.digit_feeds(200, seed=2)]
    reference = run_ort(shared_models / "mnist-12.onnx", held_out)
    snr_source = snr_db(reference, run_exact(source, held_out))
    snr_converted = snr_db(reference, run_ort(out, held_out))
    assert snr_converted >= snr_source - 1.0, (snr_source, snr_converted)
    top1 = np.mean([np.argmax(r) == np.argmax(c) for r, c in zip(reference, run_ort(out, held_out))])
    assert top1 >= 0.97


def _feeds(name: str, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Inputs of the right shape and a plausible range for each zoo model (see shared/models/README.md)."""
    if name.startswith("mnist"):
        return [{"Input3": f} for f in samples.digit_feeds(count, seed)]
    if name.startswith("mobilenet"):
        return [{"input": f} for f in samples.image_feeds(count, seed, (1, 3, 224, 224))]
    if "resnet8" in name:
        return [{"input.1": f} for f in samples.image_feeds(count, seed, (16, 3, 32, 32))]
    if "dscnn" in name:
        return [{"input.1": f} for f in samples.image_feeds(count, seed, (1, 1, 49, 10))]
    rng = np.random.default_rng(seed)  # the autoencoder: 640 log-mel features per row
    return [{"onnx::Gemm_0": rng.standard_normal((217, 640)).astype(np.float32)} for _ in range(count)]


QOPERATOR_MODELS = ["mnist-12-int8.onnx", "mobilenetv2-12-int8.onnx", "mlperf-tiny-resnet8-int8.onnx",
                    "mlperf-tiny-dscnn-kws-int8.onnx", "mlperf-tiny-autoencoder-int8.onnx"]


@pytest.mark.parametrize("name", QOPERATOR_MODELS)
def test_qoperator_model_converts_builds_and_keeps_the_sources_accuracy(shared_models, tmp_path, name):
    """QOperator zoo models (QLinearConv/MatMul, com.microsoft QLinearAdd/GlobalAveragePool, uint8 zero
    points, float BatchNormalization between DQ and Q) convert with the model's own scales, build in
    TensorRT-RTX, and compute the float model's function at least as well as the source does.

    The reference is the source's float meaning: its graph with weights dequantized and no activation
    quantization (``lift_model``; MNIST also has the zoo's float model, checked too)."""
    from trt_bridge.ir.model import load_model
    from trt_bridge.lift.pipeline import lift_model
    from trt_bridge.runtime.session import session

    source = shared_models / name
    assert not parse(source).ok
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert {r.rule for r in report.rules} >= {"qoperator", "dequantize-constant", "qdq-pair"}
    assert all(q["source"] in ("model", "exact-weights", "requantized-weights") for q in report.quantized)
    converted = assert_qdq_contract(out)
    assert not {n.op_type for n in converted.graph.node} & {"QLinearConv", "QLinearMatMul", "QLinearAdd"}
    assert_tensorrt_ready(out)

    held_out = _feeds(name, 4, seed=2)
    lifted, _ = lift_model(load_model(source), source)
    original = session(source, simulate_qdq=False)  # the QOperator model as onnxruntime runs it
    reference = run_ort(lifted, held_out)
    snr_source = snr_db(reference, [original.run(None, f)[0] for f in held_out])
    snr_converted = snr_db(reference, run_ort(out, held_out))
    assert snr_converted >= snr_source - 1.0, (snr_source, snr_converted)
    if name == "mnist-12-int8.onnx":
        float_reference = run_ort(shared_models / "mnist-12.onnx", held_out)
        assert snr_db(float_reference, run_ort(out, held_out)) >= \
            snr_db(float_reference, [original.run(None, f)[0] for f in held_out]) - 1.0
