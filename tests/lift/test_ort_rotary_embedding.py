"""onnxruntime's com.microsoft ``RotaryEmbedding`` written back as standard ONNX (``lift/ort_rotary_embedding.py``),
against onnxruntime running the fused node: 3-D inputs with ``num_heads`` given or 0 (the form whose TensorRT-RTX
parser import dies by SIGFPE), 4-D [B, N, S, H] inputs, halves and interleaved pairs, partial rotary, position ids
[B, S] and one offset [1]; TensorRT-RTX builds the result; declines name their reason.

    x [B, S, N·H] | [B, N, S, H], position_ids [B, S] | [1], cos_cache, sin_cache [64, d/2]
      ─ RotaryEmbedding(num_heads, rotary_embedding_dim, interleaved) ─ y
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from apply_rule import declined, lifted, ops_left, run_outputs  # noqa: E402
from helpers import assert_builds_at, save  # noqa: E402

from trt_bridge.lift.ort_rotary_embedding import OrtRotaryEmbedding  # noqa: E402

N, H, MAX_POS = 2, 32, 64
RNG = np.random.default_rng(0)


def rotary_model(rank=3, heads=N, rotary_dim=0, interleaved=0, offset=False, **attrs):
    d = rotary_dim or H
    inv = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    angles = np.arange(MAX_POS)[:, None] * inv[None, :]
    shape = ["B", "S", N * H] if rank == 3 else ["B", N, "S", H]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1] if offset else ["B", "S"])]
    node = helper.make_node("RotaryEmbedding", ["x", "position_ids", "cos_cache", "sin_cache"], ["y"], "rotary",
                            domain="com.microsoft", num_heads=heads, rotary_embedding_dim=rotary_dim,
                            interleaved=interleaved, **attrs)
    graph = helper.make_graph([node], "rotary", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos_cache"),
                               numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin_cache")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(rank, offset, batch=2, seq=5):
    shape = (batch, seq, N * H) if rank == 3 else (batch, N, seq, H)
    positions = np.array([7], np.int64) if offset else np.stack([np.arange(seq) + 3 * i for i in range(batch)])
    return [{"x": RNG.normal(size=shape).astype(np.float32), "position_ids": positions.astype(np.int64)}]


VARIANTS = {
    "3d": {}, "3d-num-heads-0": {"heads": 0}, "4d": {"rank": 4, "heads": 0}, "interleaved": {"interleaved": 1},
    "partial": {"rotary_dim": H // 2}, "partial-interleaved": {"rotary_dim": H // 2, "interleaved": 1},
    "offset": {"offset": True},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rotary_embedding_is_written_back_exactly(tmp_path, variant):
    args = VARIANTS[variant]
    model = rotary_model(**args)
    out, _ = lifted(model, (OrtRotaryEmbedding(), "rotary"))
    assert "RotaryEmbedding" not in ops_left(out)
    onnx.checker.check_model(out, full_check=True)
    feeds = _feeds(args.get("rank", 3), args.get("offset", False))
    for want, got in zip(run_outputs(model, feeds), run_outputs(out, feeds)):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    if variant in ("3d-num-heads-0", "partial-interleaved", "offset"):
        shape = (lambda s: ((1, 1, *s), (1, 16, *s), (2, 64, *s)))((N * H,))
        positions = ((1,), (1,), (1,)) if args.get("offset") else ((1, 1), (1, 16), (2, 64))
        assert_builds_at(save(out, tmp_path / "rotary.onnx"), {"prefill": {"x": shape, "position_ids": positions}})


@pytest.mark.parametrize("args, reason", [
    ({"is_packed_batching": 1}, "is_packed_batching=1"),
    ({"scale": 2.0}, "scale=2.0"),
    ({"rotary_dim": 2 * H}, "is not half of rotary_embedding_dim"),
])
def test_declines_name_their_reason(args, reason):
    assert reason in declined(rotary_model(**args), OrtRotaryEmbedding(), "rotary")
