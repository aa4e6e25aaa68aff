"""Rule ``dequantize-gathered`` (``lift/dequantize_gathered.py``) called directly: a quantized table read through
Gather and dequantized afterwards becomes the dequantized table read through the same Gather, exactly what the
source computes; a per-axis scale on the axis the Gather indexes is declined."""

from __future__ import annotations

import numpy as np
import pytest
from apply_rule import assert_same_outputs, build_model, declined, lifted, ops_left, tensor_info
from onnx import TensorProto, helper

from trt_bridge.lift.dequantize_gathered import DequantizeGathered

RNG = np.random.default_rng(37)
V, H, B, S = 20, 8, 2, 5


#   T_q uint8 [20, 8] ─ Gather(ids [2, 5]) ─ g [2, 5, 8] ─ DQ(s, z[, axis]) ─ y [2, 5, 8]
def _gathered(scale: np.ndarray, axis: int | None = None):
    nodes = [helper.make_node("Gather", ["T_q", "ids"], ["g"], "gather", axis=0),
             helper.make_node("DequantizeLinear", ["g", "s", "z"], ["y"], "dq",
                              **({} if axis is None else {"axis": axis}))]
    inits = {"T_q": RNG.integers(0, 256, (V, H)).astype(np.uint8), "s": scale,
             "z": np.full(scale.shape, 120, np.uint8)}
    return build_model(nodes, [tensor_info("ids", [B, S], TensorProto.INT64)], [tensor_info("y", [B, S, H])], inits,
                 value_info=[tensor_info("g", [B, S, H], TensorProto.UINT8)])


@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
def test_the_dequantized_table_is_gathered(per_column):
    scale = (RNG.random(H) * 0.1 + 0.01).astype(np.float32) if per_column else np.float32(0.03)
    source = _gathered(np.asarray(scale), axis=2 if per_column else None)
    out, _ = lifted(source, (DequantizeGathered(), "dq"))
    assert ops_left(out) == ["Gather"]
    feeds = [{"ids": RNG.integers(0, V, (B, S)).astype(np.int64)} for _ in range(3)]
    assert_same_outputs(source, out, feeds, rtol=0, atol=0)


def test_a_scale_on_the_indexed_axis_is_declined_untouched():
    source = _gathered((RNG.random(S) * 0.1 + 0.01).astype(np.float32), axis=1)
    assert declined(source, DequantizeGathered(), "dq") == "the scale's axis is the one Gather 'gather' indexes"
