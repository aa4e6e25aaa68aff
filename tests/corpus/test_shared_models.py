"""Real quantized models from public model zoos (../shared/models); skipped when absent."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_exact, run_ort, snr_db

from trt_bridge import samples
from trt_bridge.convert import ConvertOptions, convert
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.tensorrt.build import parse


def test_mnist_dynamic_uint8_converts_builds_and_keeps_accuracy(shared_models, tmp_path):
    """ONNX Model Zoo MNIST, dynamically quantized (DynamicQuantizeLinear, ConvInteger, MatMulInteger)."""
    source = shared_models / "mnist-12-uint8.onnx"
    before = source.read_bytes()
    rejected = parse(source)
    assert not rejected.ok and any("DynamicQuantizeLinear" in e for e in rejected.errors)

    np.savez(tmp_path / "calib.npz", Input3=samples.digit_feeds(32, seed=1)[:, 0])
    out = tmp_path / "mnist-int8.onnx"
    report = convert(source, out, ConvertOptions(calib_data=str(tmp_path / "calib.npz"), progress=False))
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


@pytest.mark.parametrize("name", [
    "mnist-12-int8.onnx", "mobilenetv2-12-int8.onnx", "mlperf-tiny-resnet8-int8.onnx",
    "mlperf-tiny-dscnn-kws-int8.onnx", "mlperf-tiny-autoencoder-int8.onnx",
])
def test_qoperator_models_fail_clearly_until_their_rules_exist(shared_models, tmp_path, name):
    """QOperator models are a later input family: convert must name the nodes, not crash or write junk."""
    out = tmp_path / "out.onnx"
    with pytest.raises(UnsupportedPatternError, match=r"QLinear\w+ '"):
        convert(shared_models / name, out, ConvertOptions(calib_random=1, progress=False))
    assert not out.exists()
