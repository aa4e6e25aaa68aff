"""Issue 37: what is converted rather than refused among the values that got past the loaders. INT4 activation codes
(TensorRT's INT4 is weight-only) become INT8 activations, reported; a MatMulNBits whose K is no multiple of its block
is padded to whole blocks (A's last axis padded with zeros) and stays exact, and TensorRT-RTX builds it (it rejected,
or misread as blocks of K / blocks rows, what was written before); a MatMulNBits block scale of 0 (a block of
zeros) converts exactly. The refusals are ``tests/hostile/cases_round3.py``'s rows; here check and convert are held
to agree on them, and verify's verdict on a non-finite candidate is checked on its metrics."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.helpers import assert_qdq_contract, assert_tensorrt_ready, op_types, run_ort, save, snr_db
from tests.hostile.cases_round3_values import activation_qdq_model, fp8_weight_model, nbits_model
from tests.hostile.conftest import feeds, float_net
from trt_bridge.checks import CheckOptions, check_model
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import ConvertOptions
from trt_bridge.errors import UnsupportedPatternError
from trt_bridge.runtime.session import session
from trt_bridge.verification.metrics import Accumulator

EXACT_DB = 100.0  # the codes kept exactly: measured 133–144 dB (float32 sums rounded otherwise)


def _feeds(model: onnx.ModelProto, count: int = 4) -> list[dict[str, np.ndarray]]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(11)
    return [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(count)]


def _simulated(path, feeds_):
    return [session(path, simulate_qdq=True).run(None, f)[0] for f in feeds_]


@pytest.mark.parametrize("form", ["int4-zero-point", "uint4-zero-point", "output_dtype-int4"])
def test_int4_activation_codes_become_int8_and_are_reported(form, tmp_path):
    code, output_dtype, zero_point = {"int4-zero-point": (TensorProto.INT4, None, 0),
                                      "uint4-zero-point": (TensorProto.UINT4, None, 8),
                                      "output_dtype-int4": (TensorProto.INT8, TensorProto.INT4, 0)}[form]
    source = save(activation_qdq_model(0.5, TensorProto.FLOAT, code, opset=21, output_dtype=output_dtype,
                                       zero_point=zero_point), tmp_path / "int4_act.onnx")
    checked = check_model(source, CheckOptions(trt="off"))  # check does not call it ready: convert fixes it
    four = [f for f in checked.findings if f.rule == "qdq-zero-point" and "4-bit activation codes" in f.why]
    assert not checked.ready and four and all(f.fixable for f in four)
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert [a["rule"] for a in report.approximated] == ["qdq-pair"]
    assert "become INT8 (TensorRT quantizes INT4 weights only)" in report.approximated[0]["what"]
    assert check_model(out, CheckOptions(trt="off")).ready
    model = assert_qdq_contract(out)
    codes = {i.name: i.data_type for i in model.graph.initializer}
    kept = [codes.get(n.input[2]) for n in model.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2]
    assert kept and set(kept) == {TensorProto.INT8}  # no INT4 activation left
    assert {"Conv", "Gemm", "QuantizeLinear", "DequantizeLinear"} <= op_types(out)
    data = [{"x": f} for f in feeds()]
    reference = run_ort(save(float_net(), tmp_path / "float.onnx"), data)
    # int8 over the source's own range [-4, 3.5]: closer to the float model than the source's int4 (measured
    # 18.0 dB against the source itself, the int4 codes' own error)
    assert snr_db(reference, _simulated(out, data)) > snr_db(reference, run_ort(source, data)) + 10
    assert_tensorrt_ready(out)


#: K not a multiple of the block: (K, block, zero points, g_idx kind)
PADDED = {"k40-b16": (40, 16, True, None), "k100-b32": (100, 32, True, None),
          "k100-b32-act-order": (100, 32, False, "act-order"), "k72-b64-no-zero-points": (72, 64, False, None)}


@pytest.mark.parametrize("case", list(PADDED))
def test_k_not_a_multiple_of_the_block_is_padded_exact_and_builds(case, tmp_path):
    k, block, zero_points, g_kind = PADDED[case]
    g_idx = None
    if g_kind == "act-order":
        g_idx = np.random.default_rng(2).permutation(np.arange(k) // block)
    source = save(nbits_model(k=k, block=block, zero_points=zero_points, g_idx=g_idx), tmp_path / "source.onnx")
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert not report.approximated and not report.remaining_blockers
    model = assert_qdq_contract(out)
    ops = op_types(model)
    assert "MatMulNBits" not in ops and "Pad" in ops and ("Gather" in ops) == (g_kind == "act-order")
    blocks = -(-k // block)
    weights = [i for i in model.graph.initializer if i.data_type == TensorProto.INT4 and "zero_point" not in i.name]
    assert [list(w.dims) for w in weights] == [[blocks * block, 24]]  # whole blocks for TensorRT
    data = _feeds(onnx.load(str(source)))
    assert snr_db(run_ort(source, data), _simulated(out, data)) > EXACT_DB
    assert_tensorrt_ready(out)


def test_k_not_a_multiple_with_groups_that_are_no_blocks_is_padded_and_requantized(tmp_path):
    g_idx = np.random.default_rng(4).integers(0, 4, 100)
    source = save(nbits_model(k=100, block=32, zero_points=False, g_idx=g_idx), tmp_path / "source.onnx")
    out = tmp_path / "out.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert [a["rule"] for a in report.approximated] == ["matmul-nbits"]
    data = _feeds(onnx.load(str(source)))
    assert snr_db(run_ort(source, data), _simulated(out, data)) > 18.0  # re-quantized blocks: measured 27.0 dB
    assert "Pad" in op_types(out)
    assert_tensorrt_ready(out)


def test_a_zero_block_scale_is_a_block_of_zeros_converted_exactly(tmp_path):
    source = save(nbits_model(scale_at_3=0.0), tmp_path / "source.onnx")
    report = check_model(source, CheckOptions(trt="off"))
    assert not [f for f in report.findings if f.rule == "qdq-scale"]  # check and convert agree: no refusal
    out = tmp_path / "out.onnx"
    convert(source, out, ConvertOptions(progress=False))
    scales = [onnx.numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer if i.name.endswith("_scale")]
    assert scales and all(np.all(s >= np.finfo(np.float32).tiny) for s in scales)  # no 0 or subnormal written
    data = _feeds(onnx.load(str(source)))
    assert snr_db(run_ort(source, data), _simulated(out, data)) > EXACT_DB


#: sources check names a blocker for and convert refuses, each with what both say
REFUSED = {
    "fp8-nan-code": (lambda: fp8_weight_model(0x7F), "non-finite code"),
    "bf16-zero-scale": (lambda: activation_qdq_model(0.0), "scale 'x_scale' = 0"),
    "nbits-subnormal-scale": (lambda: nbits_model(scale_at_3=1e-40), "block scale"),
    "nbits-bias-n-plus-1": (lambda: nbits_model(bias=1), "bias 'bias' of shape [25]"),
    "nbits-block-size-24": (lambda: nbits_model(k=48, block=24, zero_points=False), "block_size=24"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_check_and_convert_agree_on_what_is_refused(case, tmp_path):
    build, words = REFUSED[case]
    source = save(build(), tmp_path / "bad.onnx")
    report = check_model(source, CheckOptions(trt="off"))
    refusals = [f for f in report.findings if f.rule == "qdq-scale" and words in f.why]
    assert len(refusals) == 1 and not refusals[0].fixable and refusals[0].severity.value == "blocker"
    assert not report.ready
    with pytest.raises(UnsupportedPatternError, match="bad.onnx") as refused:
        convert(source, tmp_path / "out.onnx", ConvertOptions(progress=False))
    assert words in str(refused.value)
    assert not (tmp_path / "out.onnx").exists()


def test_a_non_finite_candidate_fails_whatever_the_gates():
    reference = np.linspace(-1, 1, 40, dtype=np.float32).reshape(4, 10)
    for bad in (np.inf, np.nan):
        acc = Accumulator()
        acc.add(reference, np.full_like(reference, bad))
        metrics = acc.result("y", "candidate")
        assert not metrics.passed
        assert metrics.failures == ["the candidate's outputs are non-finite: 40 of 40 value(s) NaN or Inf where "
                                    "the reference's are finite"]
        assert math.isnan(metrics.snr_db) or metrics.snr_db == -math.inf
    acc = Accumulator()  # Inf where the reference has Inf too (a -Inf mask passed through) is no failure
    masked = reference.copy()
    masked[0, 0] = -np.inf
    acc.add(masked, masked)
    assert acc.result("y", "candidate").passed
