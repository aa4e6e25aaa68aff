"""``check``'s static predictions against what TensorRT-RTX 1.7.1's parser does with one-node models: the
com.microsoft ops it imports are warnings (contrib-op), those it rejects blockers (no-importer); an int4 blocked
DequantizeLinear with negative scales is predicted as convert makes it (INT4 blocks kept, a float side path)."""

from __future__ import annotations

import onnx
import pytest
from decoder_models import contrib, int4_negative_scales, rotary
from helpers import save
from test_cli import cli

from trt_bridge.checks import CheckOptions, Severity, TrtProbe, check_model
from trt_bridge.ir.tensorrt_ops import RTX_IMPORTS_CONTRIB
from trt_bridge.tensorrt.parse import parse

pytest.importorskip("tensorrt_rtx")

STATIC = CheckOptions(TrtProbe.OFF)
IMPORTED = {"RotaryEmbedding": lambda: rotary(num_heads=2), "RotaryEmbedding-4d": lambda: rotary(num_heads=0, rank=4),
            **{op: (lambda op=op: contrib(op)) for op in ("SkipSimplifiedLayerNormalization", "Gelu",
                                                          "MultiHeadAttention")}}
REJECTED = ("GroupQueryAttention", "MatMulNBits", "MultiHeadAttention-past")


def test_the_imported_set_is_the_verified_one():
    assert {name.split("-")[0] for name in IMPORTED} == RTX_IMPORTS_CONTRIB


@pytest.mark.parametrize("name", sorted(IMPORTED))
def test_imported_contrib_op_is_a_warning(name, tmp_path):
    path = save(IMPORTED[name](), tmp_path / "m.onnx")
    assert parse(path).ok  # the claim, verified
    node = next(n for n in onnx.load(str(path)).graph.node if n.domain == "com.microsoft")
    found = [f for f in check_model(path, STATIC).findings if f.node == node.name]
    assert [(f.rule, f.severity) for f in found] == [("contrib-op", Severity.WARNING)], [f.lines() for f in found]
    assert "TensorRT-RTX 1.7.1's parser imports it" in found[0].why


@pytest.mark.parametrize("name", REJECTED)
def test_rejected_contrib_op_is_a_blocker(name, tmp_path):
    path = save(contrib(name), tmp_path / "m.onnx")
    assert not parse(path).ok
    found = [f for f in check_model(path, STATIC).findings if f.node == "n"]
    assert [(f.rule, f.severity) for f in found] == [("no-importer", Severity.BLOCKER)]
    if name == "MultiHeadAttention-past":
        assert "with a single context output" in found[0].why


def test_int4_negative_scales_prediction_matches_convert(tmp_path):
    src = save(int4_negative_scales(), tmp_path / "int4.onnx")
    finding = next(f for f in check_model(src, STATIC).findings if f.node == "dq_w")
    assert finding.rule == "qdq-scale" and finding.fixable
    assert "stays INT4 in blocks of 32" in finding.fix and "int8" not in finding.fix, finding.fix
    assert "float side path" in finding.fix
    out = tmp_path / "int4.trt.onnx"
    result = cli("convert", src, "-o", out)
    assert result.returncode == 0, (result.stdout, result.stderr)
    model = onnx.load(str(out))
    inits = {i.name: i for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dq) == 1 and inits[dq[0].input[0]].data_type == onnx.TensorProto.INT4
    assert {a.name: a.i for a in dq[0].attribute}.get("block_size") == 32
    assert any(n.name.endswith("/block_shift") for n in model.graph.node)
