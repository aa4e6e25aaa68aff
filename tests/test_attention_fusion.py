"""The decomposed attention the lift rules write, as one ONNX ``Attention``-23 node where it computes in float16 or
bfloat16 (``lower/attention_fusion.py``): TensorRT's dedicated attention kernels.

The rule is called directly on what the lift rules leave of onnxruntime's fused nodes (both forms: the grouped one
of ``GroupQueryAttention`` with a boolean causal mask, the per-head one of ``MultiHeadAttention`` with an additive
padding mask)::

    q, k, v (float16) ─ GroupQueryAttention / MultiHeadAttention ─ y   (the source, in onnxruntime)
      ─ lift ─ MatMul ─ Mul(scale) ─ Where|Add(mask) ─ Softmax ─ MatMul ─ y
      ─ fuse ─ Attention(q, k, v, mask; scale) ─ y                        (one node, no Softmax)

then on real decoders through ``convert``: one Attention per layer, the same tokens as the source's loop, and
TensorRT-RTX builds them at the prefill and decode profiles (the build fails for a float32 Attention, so a build
proves TensorRT took the dedicated form); a float32 conversion keeps the decomposed form and still builds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_builds_at, save, snr_db
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent / "lift"))
from apply_rule import lifted, run_outputs  # noqa: E402
from test_group_query_attention import CASES, NKV, H, N, gqa_model  # noqa: E402

import trt_bridge  # noqa: E402
from trt_bridge.ir.model import default_opset  # noqa: E402
from trt_bridge.ir.types import infer_shapes  # noqa: E402
from trt_bridge.lift.group_query_attention import GroupQueryAttention  # noqa: E402
from trt_bridge.lift.ort_multihead_attention import OrtMultiHeadAttention  # noqa: E402
from trt_bridge.lower.attention_fusion import FLOAT32, raise_opset  # noqa: E402
from trt_bridge.lower.attention_pass import fuse_attention  # noqa: E402
from trt_bridge.lower.precision import to_low_precision  # noqa: E402
from trt_bridge.runtime.bf16 import emulate_bfloat16  # noqa: E402
from trt_bridge.tensorrt.decoder_profiles import decoder_profiles, model_inputs_shapes  # noqa: E402

DATA = Path(__file__).parent / "data" / "decoders"
#: the GroupQueryAttention model's inputs at a prefill (no past) and a decode (one token, a past) profile
PROFILES = {
    "prefill": {"q": ((1, 1, N * H), (1, 16, N * H), (2, 128, N * H)),
                "k": ((1, 1, NKV * H), (1, 16, NKV * H), (2, 128, NKV * H)),
                "v": ((1, 1, NKV * H), (1, 16, NKV * H), (2, 128, NKV * H)),
                "past_key": ((1, NKV, 0, H),) * 2 + ((2, NKV, 0, H),),
                "past_value": ((1, NKV, 0, H),) * 2 + ((2, NKV, 0, H),),
                "attention_mask": ((1, 1), (1, 16), (2, 128))},
    "decode": {"q": ((1, 1, N * H),) * 2 + ((2, 1, N * H),), "k": ((1, 1, NKV * H),) * 2 + ((2, 1, NKV * H),),
               "v": ((1, 1, NKV * H),) * 2 + ((2, 1, NKV * H),),
               "past_key": ((1, NKV, 1, H), (1, NKV, 32, H), (2, NKV, 63, H)),
               "past_value": ((1, NKV, 1, H), (1, NKV, 32, H), (2, NKV, 63, H)),
               "attention_mask": ((1, 2), (1, 33), (2, 64))},
}


def _float16_gqa(**attrs) -> onnx.ModelProto:
    """The GroupQueryAttention model of tests/lift/test_group_query_attention.py in float16 (caches included)."""
    model = gqa_model(dtype=TensorProto.FLOAT16, **attrs)
    for i, init in enumerate(model.graph.initializer):
        if init.data_type == TensorProto.FLOAT:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).astype(np.float16), init.name))
    return model


def _fused(model: onnx.ModelProto, rule, node: str):
    out, _ = lifted(model, (rule, node))
    return fuse_attention(infer_shapes(out))


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.fixture(scope="module")
def gqa16():
    source = _float16_gqa()
    fused, result = _fused(source, GroupQueryAttention(), "gqa")
    return source, fused, result


def test_grouped_attention_becomes_one_attention_node(gqa16):
    source, fused, result = gqa16
    ops = _ops(fused)
    assert ops.count("Attention") == 1 and not {"Softmax", "MatMul", "Where"} & set(ops[ops.index("Attention"):])
    assert "Softmax" not in ops and len(result.fused) == 1 and not result.declined
    assert default_opset(fused) == 23 and result.opset == (17, 23)  # onnx's version converter from 17
    node = next(n for n in fused.graph.node if n.op_type == "Attention")
    assert len(node.output) == 1 and helper.get_attribute_value(node.attribute[0]) == float(np.float16(H ** -0.5))
    onnx.checker.check_model(fused, full_check=True)
    decomposed, _ = lifted(source, (GroupQueryAttention(), "gqa"))
    again, result = fuse_attention(infer_shapes(raise_opset(decomposed, 17)))  # already at 23: nothing to raise
    assert result.fused == ["gqa/Softmax"] and result.opset is None and _ops(again).count("Attention") == 1


@pytest.mark.parametrize("case", ["prompt", "decode", "decode-long", "subsequent-prompt"])
def test_fused_attention_computes_what_onnxruntime_computes_of_the_source(gqa16, case):
    """float16 throughout: y within float16's precision of the source's (SNR > 40 dB), the caches exact."""
    source, fused, _ = gqa16
    batch, new, past, mask = CASES[case]
    rng = np.random.default_rng(2)
    sizes = {"q": (batch, new, N * H), "k": (batch, new, NKV * H), "v": (batch, new, NKV * H),
             "past_key": (batch, NKV, past, H), "past_value": (batch, NKV, past, H)}
    feeds = [{"attention_mask": np.asarray(mask, np.int64)}
             | {k: rng.normal(size=size).astype(np.float16) for k, size in sizes.items()} for _ in range(2)]
    # a right-padded first prompt leaves its padded query rows undefined in onnxruntime
    rows = np.asarray(mask, bool)[:, :new] if past == 0 else np.ones((batch, new), bool)
    for want, got in zip(run_outputs(source, feeds), run_outputs(fused, feeds)):
        assert snr_db([want[0][rows].astype(np.float32)], [got[0][rows].astype(np.float32)]) > 40
        for w, g in zip(want[1:], got[1:]):
            np.testing.assert_array_equal(g, w)


def test_fused_attention_builds_at_prefill_and_decode(gqa16, tmp_path):
    assert_builds_at(save(gqa16[1], tmp_path / "fused.onnx"), PROFILES)


def test_float32_and_softcap_stay_decomposed():
    for model, reason in ((gqa_model(), FLOAT32), (_float16_gqa(softcap=2.0), "softcap: TensorRT-RTX 1.7's parser")):
        out, result = _fused(model, GroupQueryAttention(), "gqa")
        assert "Softmax" in _ops(out) and "Attention" not in _ops(out) and not result.fused
        assert [r.startswith(reason) for r in result.declined.values()] == [True]
        assert default_opset(out) == 17  # nothing fused: no upgrade


def test_a_bfloat16_softcap_attention_stays_decomposed_and_finite():
    """The mask's lowest score is finite in bfloat16 (float32's lowest rounds to -inf there, which convert refuses as
    a non-finite constant), and the emulated bfloat16 model computes the source's y."""
    source = gqa_model(softcap=2.0)
    out, _ = lifted(source, (GroupQueryAttention(), "gqa"))
    low, _ = to_low_precision(infer_shapes(out), "bf16")
    fused, result = fuse_attention(low)
    assert not result.fused and "softcap" in next(iter(result.declined.values()))
    assert all(np.isfinite(numpy_helper.to_array(i).astype(np.float32)).all() for i in fused.graph.initializer)
    batch, new, past, mask = CASES["decode"]
    rng = np.random.default_rng(4)
    sizes = {"q": (batch, new, N * H), "k": (batch, new, NKV * H), "v": (batch, new, NKV * H),
             "past_key": (batch, NKV, past, H), "past_value": (batch, NKV, past, H)}
    feed = {"attention_mask": np.asarray(mask, np.int64)} | {k: rng.normal(size=z).astype(np.float32)
                                                             for k, z in sizes.items()}
    want, got = run_outputs(source, [feed])[0], run_outputs(emulate_bfloat16(fused), [feed])[0]
    assert snr_db([want[0]], [got[0]]) > 30


def _mha16() -> onnx.ModelProto:
    """q, k, v [B, S, 32] float16, key padding mask [B, L] ─ MultiHeadAttention(2 heads) ─ y"""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["B", "S", 32]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "S"]))
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "mask"], ["y"], "mha", domain="com.microsoft",
                            num_heads=2)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT16,
                                                                                  ["B", "S", 32])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)])


def test_per_head_attention_with_an_additive_mask(tmp_path):
    source = _mha16()
    fused, result = _fused(source, OrtMultiHeadAttention(), "mha")
    assert _ops(fused).count("Attention") == 1 and "Softmax" not in _ops(fused) and result.opset == (21, 23)
    rng = np.random.default_rng(5)
    feeds = [{**{n: rng.normal(size=(2, 7, 32)).astype(np.float16) for n in "qkv"},
              "mask": (np.arange(7)[None] < np.array([[4], [7]])).astype(np.int32)} for _ in range(2)]
    want, got = run_outputs(source, feeds), run_outputs(fused, feeds)
    assert snr_db([w[0].astype(np.float32) for w in want], [g[0].astype(np.float32) for g in got]) > 40
    shapes = {n: ((1, 1, 32), (1, 16, 32), (2, 128, 32)) for n in "qkv"} | {"mask": ((1, 1), (1, 16), (2, 128))}
    assert_builds_at(save(fused, tmp_path / "mha.onnx"), {"prefill": shapes})


def _reference(name: str, folder: Path) -> Path:
    """The exact meaning of a MatMulNBits source: every MatMulNBits at accuracy_level 0 (float activations)."""
    source = DATA / name / "model.onnx"
    model = onnx.load(str(source))
    for attr in (a for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute):
        if attr.name == "accuracy_level":
            attr.i = 0
    path = folder / "reference" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")
    (path.parent / "genai_config.json").write_text((source.parent / "genai_config.json").read_text())
    return path


#: real decoder → (convert's options, Attention nodes wanted, least logits SNR against the source's loop)
DECODERS = {"fp16": ("llama-genai-cpu-int4", {"high_precision": "fp16"}, 2, 50.0),  # measured 62.2 dB
            "bf16": ("llama-genai-cpu-int4", {"high_precision": "bf16"}, 2, 33.0),  # 39.9 dB
            "fp32": ("llama-genai-cpu-int4", {}, 0, 100.0)}  # 127.8 dB: decomposed


@pytest.mark.parametrize("kind", list(DECODERS))
def test_real_decoder_converts_fused_generates_and_builds(tmp_path, kind):
    name, options, attention, snr = DECODERS[kind]
    out = tmp_path / "converted" / "model.onnx"
    report = trt_bridge.convert(DATA / name / "model.onnx", out, skip_check=True, quiet=True, **options)
    converted = onnx.load(str(out), load_external_data=False)
    ops = _ops(converted)
    assert ops.count("Attention") == attention and ops.count("Softmax") == 2 - attention
    fused = report.to_dict()["attention"]
    assert len(fused["fused"]) == attention and (kind != "fp32" or set(fused["declined"].values()) == {FLOAT32})
    assert (default_opset(converted) == 23) == bool(attention)
    result = trt_bridge.verify(_reference(name, tmp_path), out, prompts=2, steps=8, costs="off",
                               quiet=True).generation
    assert result.token_agreement == 1.0 and result.logits_snr_db >= snr, (result.token_agreement,
                                                                           result.logits_snr_db)
    if kind == "fp16":  # bfloat16 builds as float16 does (measured: prefill 0.98 s, decode 0.80 s); the float32
        # conversion's builds at both profiles: tests/corpus/test_decoder_slice.py (llama-genai-cpu-int4)
        profiles = decoder_profiles(model_inputs_shapes(converted))
        assert_builds_at(out, {p.name: p.shapes for p in profiles})
