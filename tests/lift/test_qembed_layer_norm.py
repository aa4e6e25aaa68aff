"""Rule ``qembed-layer-norm`` (``lift/qembed_layer_norm.py``) called directly: com.microsoft
``QEmbedLayerNormalization`` becomes Gather + Add + LayerNormalization (and the mask index's ReduceSum) on its
dequantized tables, what onnxruntime's kernel computes; a table with a scale per row is declined."""

from __future__ import annotations

import numpy as np
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info
from onnx import TensorProto, helper

from trt_bridge.lift.qembed_layer_norm import QEmbedLayerNorm

RNG = np.random.default_rng(53)
B, S, D, V = 2, 5, 16, 30
TABLES = {"word": (V, D), "pos": (12, D), "seg": (2, D), "gamma": (D,), "beta": (D,)}


#   ids [2, 5], segment_ids, mask ─ QEmbedLayerNormalization(word_q [30, 16], pos_q [12, 16], seg_q [2, 16], γ_q, β_q:
#                                    uint8, a scale and zero point each) ─ y [2, 5, 16], mask_index [2]
def _qembed(word_scale_per_row: bool = False):
    inits = {}
    for name, shape in TABLES.items():
        inits[f"{name}_q"] = RNG.integers(0, 256, shape).astype(np.uint8)
        inits[f"{name}_s"] = np.float32(RNG.random() * 0.02 + 0.005)
        inits[f"{name}_z"] = np.uint8(RNG.integers(100, 156))
    if word_scale_per_row:
        inits["word_s"] = (RNG.random(V) * 0.02 + 0.005).astype(np.float32)
    names = list(TABLES)
    node = helper.make_node("QEmbedLayerNormalization",
                            ["ids", "segment_ids", *[f"{n}_q" for n in names], "mask", *[f"{n}_s" for n in names],
                             *[f"{n}_z" for n in names]], ["y", "mask_index"], "qembed", domain="com.microsoft",
                            epsilon=1e-5)
    int32 = TensorProto.INT32
    inputs = [tensor_info(name, [B, S], int32) for name in ("ids", "segment_ids", "mask")]
    return build_model([node], inputs, [tensor_info("y", [B, S, D]), tensor_info("mask_index", [B], int32)], inits,
                       microsoft=True)


def test_the_standard_graph_on_the_dequantized_tables():
    source = _qembed()
    out, ctx = lifted(source, (QEmbedLayerNorm(), "qembed"))
    # word and segment rows gathered, positions sliced (0 … S−1: Shape, Gather), summed, normalized; the mask's ones
    # counted (Equal, Cast, ReduceSum)
    assert ops_left(out) == ["Add", "Add", "Cast", "Equal", "Gather", "Gather", "Gather", "LayerNormalization",
                             "ReduceSum", "Shape", "Slice"]
    assert not ctx.annotations.activations and not ctx.annotations.weights  # no matrix product to quantize
    feeds = [{"ids": RNG.integers(0, V, (B, S)).astype(np.int32), "segment_ids": RNG.integers(0, 2, (B, S)).astype(
        np.int32), "mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)} for _ in range(3)]
    assert_same_outputs(source, out, feeds, rtol=1e-4, atol=1e-4)


def test_a_scale_per_row_is_declined_untouched():
    reason = declined(_qembed(word_scale_per_row=True), QEmbedLayerNorm(), "qembed")
    assert reason == "word_embedding 'word_q' and its scale and zero point must be constants, per tensor"
