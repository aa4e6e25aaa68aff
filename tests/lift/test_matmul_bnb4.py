"""Rule matmul-bnb4 (onnxruntime's com.microsoft MatMulBnb4: bitsandbytes' NF4 / FP4 lookup codes, one absmax per
block of the flattened weight): hand-built NF4 and FP4 sources, packed by a numpy reference of the specification
written here (high nibble first, W [N, K] flattened row by row), which onnxruntime's CPU provider runs as the
reference computes. Each converts to INT4 weight-only blocks (int4 blocked DequantizeLinear → MatMul, no MatMulBnb4),
the lifted float weight the exact dequantization, reported in ``approximated`` (TensorRT has no lookup-table
form), near the source (the INT4 re-quantization's error only) and builds in TensorRT-RTX for SM 8.9."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from apply_rule import build_model, declined, lifted, ops_left, tensor_info  # noqa: E402
from helpers import assert_tensorrt_ready, op_types, run_ort, save, snr_db  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.options import ConvertOptions  # noqa: E402
from trt_bridge.lift.matmul_bnb4 import MatMulBnb4  # noqa: E402
from trt_bridge.lift.pipeline import lift_model  # noqa: E402
from trt_bridge.runtime.session import session  # noqa: E402

RNG = np.random.default_rng(29)

#: bitsandbytes' tables, written out again from the specification (onnxruntime's blockwise_quant_block_bnb4.h)
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)
FP4 = np.array([0.0, 0.0052083333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25,
                -0.0, -0.0052083333, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667, -0.25], np.float32)
TABLES = {"fp4": (0, FP4), "nf4": (1, NF4)}


def _quantize(w: np.ndarray, block: int, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [N, K] as MatMulBnb4 holds it: (B, the codes of the flattened weight two a byte, the first in the high four
    bits; absmax, one per ``block`` elements), each code the table value nearest the element over its block's
    absmax."""
    flat = w.reshape(-1).astype(np.float32)
    blocks = -(-flat.size // block)
    padded = np.concatenate([flat, np.zeros(blocks * block - flat.size, np.float32)]).reshape(blocks, block)
    absmax = np.abs(padded).max(axis=1)
    codes = np.abs(padded[..., None] / absmax[:, None, None] - table).argmin(axis=-1).reshape(-1)[:flat.size]
    codes = np.concatenate([codes, np.zeros(codes.size % 2, codes.dtype)]).reshape(-1, 2).astype(np.uint8)
    return (codes[:, 0] << 4 | codes[:, 1]).astype(np.uint8), absmax.astype(np.float32)


def _dequantize(packed: np.ndarray, absmax: np.ndarray, n: int, k: int, block: int, table: np.ndarray) -> np.ndarray:
    """The specification's dequantized B [N, K]: element i = table[code i] · absmax[i / block], in float32."""
    codes = np.stack([packed >> 4, packed & 15], axis=-1).reshape(-1)[:n * k]
    return (table[codes] * np.repeat(absmax, block)[:n * k]).reshape(n, k)


def _bnb4_model(kind: str, k: int = 256, n: int = 96, block: int = 64, trans_b: int = 1) -> onnx.ModelProto:
    """x [2, 5, K (N for transB 0)] ─ MatMulBnb4(W [N, K] in NF4/FP4 blocks) ─ y."""
    quant_type, table = TABLES[kind]
    w = (RNG.normal(size=(n, k)) / 16).astype(np.float32)
    packed, absmax = _quantize(w, block, table)
    node = helper.make_node("MatMulBnb4", ["x", "B", "absmax"], ["y"], "bnb4", domain="com.microsoft", K=k, N=n,
                            block_size=block, quant_type=quant_type, transB=trans_b)
    a, out = (k, n) if trans_b else (n, k)
    return build_model([node], [tensor_info("x", [2, 5, a])], [tensor_info("y", [2, 5, out])],
                       {"B": packed, "absmax": absmax}, opset=21, microsoft=True)


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _reference(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The specification's Y in float64: A · dequantized Bᵀ (transB 1) or A · dequantized B (transB 0)."""
    attrs = {a.name: a.i for a in model.graph.node[0].attribute}
    inits = _inits(model)
    table = FP4 if attrs["quant_type"] == 0 else NF4
    w = _dequantize(inits["B"], inits["absmax"], attrs["N"], attrs["K"], attrs["block_size"], table).astype(np.float64)
    w = w.T if attrs.get("transB", 1) else w
    return [f["x"].astype(np.float64) @ w for f in feeds]


def _feeds(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return [{"x": RNG.normal(size=shape).astype(np.float32)} for _ in range(4)]


@pytest.mark.parametrize("kind", list(TABLES))
def test_onnxruntime_runs_the_packing_as_the_reference_does(kind):
    model = _bnb4_model(kind)
    feeds = _feeds(model)
    assert snr_db(_reference(model, feeds), run_ort(model, feeds)) > 100.0


#: (table, K, N, source block, INT4 block): blocks dividing K kept, else 64
CASES = {"nf4": ("nf4", 256, 96, 64, 64), "fp4": ("fp4", 256, 96, 64, 64),
         "nf4-blocks-of-128": ("nf4", 256, 96, 128, 128), "nf4-blocks-across-rows": ("nf4", 96, 40, 128, 64)}


@pytest.mark.parametrize("case", list(CASES))
def test_converts_to_int4_blocks_reported_as_approximated(tmp_path, case):
    kind, k, n, block, int4_block = CASES[case]
    model = _bnb4_model(kind, k, n, block)
    source = save(model, tmp_path / "source.onnx")
    out = tmp_path / "converted.onnx"
    report = convert(source, out, ConvertOptions(progress=False))
    assert not report.remaining_blockers
    assert [(a["rule"], a["node"]) for a in report.approximated] == [("matmul-bnb4", "bnb4")]
    assert kind.upper() in report.approximated[0]["what"]
    converted = onnx.load(str(out))
    assert "MatMulBnb4" not in op_types(converted)
    assert op_types(converted) <= {"DequantizeLinear", "MatMul"}
    (dq,) = [node for node in converted.graph.node if node.op_type == "DequantizeLinear"]
    codes = _inits(converted)[dq.input[0]]
    assert codes.dtype == ml_dtypes.int4 and codes.shape == (k, n)
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": int4_block}
    # the lifted weight: the exact dequantization of the source's codes, transposed to [K, N]
    lifted_model, _ = lift_model(onnx.load(str(source)))
    (weight,) = [i for i in lifted_model.graph.initializer if i.name != "x"]
    inits = _inits(model)
    table = TABLES[kind][1]
    assert np.array_equal(numpy_helper.to_array(weight), _dequantize(inits["B"], inits["absmax"], n, k, block, table).T)
    feeds = _feeds(model)
    want = run_ort(source, feeds)
    assert snr_db(want, run_ort(lifted_model, feeds)) > 100.0  # the lift alone is exact
    got = [session(out, simulate_qdq=True).run(None, f)[0] for f in feeds]
    assert snr_db(want, got) > MIN_DB
    assert_tensorrt_ready(out)


#: the INT4 re-quantization's error (symmetric int4 blocks of NF4/FP4 values): measured 20.4 dB (NF4), 19.6 (FP4),
#: 19.6 (NF4 in blocks of 128), 20.3 (NF4 blocks across rows of W, re-quantized in blocks of 64)
MIN_DB = 17.0


# --- the rule called directly ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(TABLES))
def test_rule_lifts_to_the_exact_float_matmul(kind):
    model = _bnb4_model(kind)
    out, ctx = lifted(model, (MatMulBnb4(), "bnb4"))
    assert ops_left(out) == ["MatMul"]
    (spec,) = ctx.annotations.weights.values()
    assert (spec.format.name, spec.block_size, spec.axis, spec.source.value, spec.codes) == \
        ("int4", 64, 1, "requantized-weights", None)
    assert [(a.rule, a.node) for a in ctx.approximated] == [("matmul-bnb4", "bnb4")]
    feeds = _feeds(model)
    assert snr_db(run_ort(model, feeds), run_ort(out, feeds)) > 100.0


def test_rule_follows_the_specification_for_trans_b_0():
    # Y = A · dequantized B [N, K]: A's last axis N, blocks of 64 (the source's run along K, the output axis);
    # checked against the numpy reference: onnxruntime 1.32's CPU kernel computes A · Bᵀ whatever transB says
    model = _bnb4_model("nf4", k=128, n=64, block=32, trans_b=0)
    out, ctx = lifted(model, (MatMulBnb4(), "bnb4"))
    (spec,) = ctx.annotations.weights.values()
    assert spec.block_size == 64
    feeds = _feeds(model)
    assert snr_db(_reference(model, feeds), run_ort(out, feeds)) > 100.0


def test_rule_declines_what_it_cannot_read_untouched():
    model = _bnb4_model("nf4")
    next(a for a in model.graph.node[0].attribute if a.name == "quant_type").i = 2
    assert "quant_type=2" in declined(model, MatMulBnb4(), "bnb4")
    model = _bnb4_model("fp4")
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones(5, np.float32), "absmax"))
    assert "absmax" in declined(model, MatMulBnb4(), "bnb4")
