"""`convert --high-precision fp16`: the non-quantized layers in float16, the sensitive and the out-of-range ones
kept in float32; float16 Q/DQ stay fusable; the result stays within 0.5 dB of the float32 one, runs in
onnxruntime and builds in TensorRT-RTX. Also the per-layer precision census in the report and `check`."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, save, snr_db

from trt_bridge import samples
from trt_bridge.convert import ConvertOptions, convert
from trt_bridge.runtime import session

LOUD = 30000.0  # this block's residual stream then reaches ~1e5: float16 overflows without the range check


def _block(root, loud: float):
    src = save(samples.transformer_block(layers=2), root / "tb.onnx")
    np.savez(root / "calib.npz", x=samples.sequence_feeds(16, 1, 16, 64) * loud)
    feeds = [{"x": f * loud} for f in samples.sequence_feeds(8, 2, 16, 64)]
    return root, src, feeds


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    return _block(tmp_path_factory.mktemp("fp16"), 1.0)


@pytest.fixture(scope="module")
def loud(tmp_path_factory):
    return _block(tmp_path_factory.mktemp("fp16-loud"), LOUD)


def _snr(src, out, feeds):
    reference = [session(src).run(None, f)[0] for f in feeds]
    return snr_db(reference, [session(out).run(None, f)[0].astype(np.float32) for f in feeds])


def test_fp16_keeps_sensitive_and_out_of_range_layers_in_fp32(block):
    root, src, feeds = block
    outs = {}
    for hp in ("fp32", "fp16"):
        outs[hp] = root / f"tb.{hp}.onnx"
        report = convert(src, outs[hp], ConvertOptions(calib_data=str(root / "calib.npz"), high_precision=hp,
                                                       progress=False))
        assert_qdq_contract(outs[hp])
        assert report.check["ready"]
    kept = {k["node"]: k["reason"] for k in report.precision["kept_in_float32"]}
    assert kept and all("numerically sensitive" in r for r in kept.values())  # LayerNorm, Softmax
    counts = report.precision["counts"]
    assert counts["int8"] == 12 and counts["fp16"] > counts["fp32"] > 0
    model = onnx.load(str(outs["fp16"]))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # interface kept
    scales = {i.name: i.data_type for i in model.graph.initializer}
    assert any(n.op_type == "DequantizeLinear" and scales.get(n.input[1]) == onnx.TensorProto.FLOAT16
               for n in model.graph.node)  # float16 Q/DQ, read and written directly
    snr32, snr16 = _snr(src, outs["fp32"], feeds), _snr(src, outs["fp16"], feeds)
    assert np.isfinite(snr16) and snr16 > snr32 - 0.5, (snr32, snr16)
    assert_tensorrt_ready(outs["fp16"])


def test_loud_activations_stay_fp32(loud):
    """Pre-LayerNorm activations of ~1e5 (beyond float16's 65504): the range check keeps the layers that read or
    write them in float32, and the model stays finite and accurate."""
    root, src, feeds = loud
    out = root / "tb.fp16.onnx"
    report = convert(src, out, ConvertOptions(calib_data=str(root / "calib.npz"), high_precision="fp16",
                                              progress=False))
    reasons = [k["reason"] for k in report.precision["kept_in_float32"]]
    assert any("beyond float16's safe range" in r for r in reasons)
    good = [session(out).run(None, f)[0] for f in feeds]
    reference = [session(src).run(None, f)[0] for f in feeds]
    assert all(np.isfinite(o).all() for o in good) and snr_db(reference, good) > 30
    assert onnx.load(str(out)).graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert_tensorrt_ready(out)


def test_check_reports_layer_precisions(block):
    from trt_bridge.checks import CheckOptions, TrtProbe, check_model

    root, src, _ = block
    out = root / "tb.fp16.onnx"
    if not out.exists():
        convert(src, out, ConvertOptions(calib_data=str(root / "calib.npz"), high_precision="fp16", progress=False))
    report = check_model(out, CheckOptions(TrtProbe.OFF))
    assert report.precisions["counts"]["int8"] == 12 and "FP16" in report.summary()
