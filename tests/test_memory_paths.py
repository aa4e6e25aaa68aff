"""What keeps a large decoder's conversion from holding its weights twice (issue 36, the 0.85 B int4 decoder of
``scripts/decoders/large.py``: peak 3.7 -> 2.1 GB), each checked to change nothing in what is written:

- a MatMulNBits node, once rewritten, lets go of the copy of its packed codes and scales onnx-graphsurgeon loaded
  (``lift.base.detach``: a dead constant is cyclic garbage, otherwise held until Python's cyclic collector runs);
- ``shifted_blocks`` works out a wide weight a few thousand output channels at a time (the same codes, scales and
  shifts as all at once);
- a consumed export hands each large weight from the graph to the model one at a time, numpy arrays included;
- a model under 2 GB is written field by field (``ir.save.write_streamed``), never serialized whole;
- the final strict check runs on the weightless skeleton.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent / "lift"))

from tests.helpers import run_ort  # noqa: E402
from trt_bridge.ir.export import export_model  # noqa: E402
from trt_bridge.ir.save import write_streamed  # noqa: E402
from trt_bridge.lift import lift  # noqa: E402
from trt_bridge.lift.shifted_blocks import shifted_blocks  # noqa: E402

RNG = np.random.default_rng(7)


def _pack(values: np.ndarray) -> np.ndarray:
    pairs = values.reshape(*values.shape[:-1], -1, 2).astype(np.uint8)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def _two_nbits(shared: bool) -> onnx.ModelProto:
    """x [2, 64] ─ MatMulNBits(B, scales) ─ y1, x ─ MatMulNBits(B or B2, scales) ─ y2 (K 64, N 32, blocks of 32,
    zero point 8 where absent: the asymmetric codes below need the shifted side path)."""
    k, n, b = 64, 32, 32
    inits = {"scales": RNG.uniform(0.01, 0.03, (n, k // b)).astype(np.float32),
             "zp": _pack(RNG.integers(0, 16, (n, k // b))).reshape(-1)}
    names = ["B", "B" if shared else "B2"]
    for name in set(names):
        inits[name] = _pack(RNG.integers(0, 16, (k, n)).T.reshape(n, k // b, b))
    nodes = [helper.make_node("MatMulNBits", ["x", w, "scales", "zp"], [f"y{i}"], f"nbits{i}", domain="com.microsoft",
                              K=k, N=n, bits=4, block_size=b) for i, w in enumerate(names)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, n]) for i in range(2)],
                              [numpy_helper.from_array(v, name) for name, v in inits.items()])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("shared", [False, True])
def test_a_rewritten_matmulnbits_lets_go_of_what_it_read_and_a_shared_weight_stays(shared):
    model = _two_nbits(shared)
    graph = gs.import_onnx(model)
    sources = {t.name: t for t in graph.tensors().values() if t.name in ("B", "B2", "scales", "zp")}
    ctx = lift(graph)
    assert ctx.fired["matmul-nbits"] == ["nbits0", "nbits1"]
    # every source constant was read by the rule; once both nodes are rewritten none of them holds its values
    assert all(t.values.size == 0 for t in sources.values()), {n: t.values.size for n, t in sources.items()}
    assert not [n for n in graph.nodes if n.op == "MatMulNBits"]
    x = RNG.normal(size=(2, 64)).astype(np.float32)
    got = run_ort(export_model(graph), [{"x": x}])
    want = run_ort(model, [{"x": x}])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)  # the lifted float graph computes the source


def test_a_shared_weight_keeps_its_values_until_its_last_reader_is_rewritten():
    from trt_bridge.lift.base import detach

    graph = gs.import_onnx(_two_nbits(True))
    first, second = [n for n in graph.nodes if n.op == "MatMulNBits"]
    weight = first.inputs[1]
    assert weight.values.size  # loaded
    detach(first)
    assert weight.values.size and second.inputs[1] is weight  # the second node still reads it
    detach(second)
    assert weight.values.size == 0
    gc.collect()


def test_shifted_blocks_over_chunks_of_columns_are_those_of_the_whole_weight(monkeypatch):
    import trt_bridge.lift.shifted_blocks as sb

    k, n, b = 64, 37, 16
    codes = RNG.integers(0, 16, (k, n)).astype(np.uint8)
    zero_point = RNG.integers(0, 16, (k // b, n)).astype(np.uint8)
    scale = (RNG.uniform(0.01, 0.03, (k // b, n)) * RNG.choice([-1, 1], (k // b, n))).astype(np.float32)
    whole = shifted_blocks(codes, zero_point, scale, b)
    monkeypatch.setattr(sb, "COLUMNS", 8)  # 5 chunks, the last of 5 columns
    chunked = sb.shifted_blocks(codes, zero_point, scale, b)
    for field in ("codes", "scale", "offset"):
        a, c = getattr(whole, field), getattr(chunked, field)
        assert a.dtype == c.dtype and a.shape == c.shape
        np.testing.assert_array_equal(a, c)
    assert sb.shifted_blocks(codes, np.full_like(zero_point, 8), np.abs(scale), b) is None  # every block fits


def test_a_consumed_export_writes_the_same_model_and_leaves_the_graph_weightless():
    w = RNG.normal(size=(600, 600)).astype(np.float32)  # 1.4 MB: a large constant
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 600])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 600])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    kept, consumed = gs.import_onnx(model), gs.import_onnx(model)
    for g in (kept, consumed):
        g.tensors()["w"].values = np.array(w)  # a numpy array, as a rule or lowering leaves a weight
    a, b = export_model(kept), export_model(consumed, consume=True)
    assert a.graph == b.graph
    np.testing.assert_array_equal(numpy_helper.to_array(b.graph.initializer[0]), w)
    np.testing.assert_array_equal(kept.tensors()["w"].values, w)  # not consumed: the graph as it was
    assert consumed.tensors()["w"]._values.tensor.raw_data == b""  # consumed: a weightless stand-in


def test_a_streamed_model_loads_equal_and_is_the_same_bytes_each_time(tmp_path):
    w = RNG.normal(size=(300, 1000)).astype(np.float32)  # 1.2 MB: written as its header, then its raw bytes
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1000])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(3, np.int64), "s")],
                              doc_string="a graph")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="trt-bridge",
                              doc_string="a model")
    helper.set_model_props(model, {"key": "value"})
    model.graph.initializer[0].doc_string = "a weight"  # a big tensor's other fields travel with its header
    paths = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for path in paths:
        write_streamed(model, path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert onnx.load(str(paths[0])) == model
    onnx.checker.check_model(str(paths[0]), full_check=True)
    x = RNG.normal(size=(2, 300)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(paths[0], [{"x": x}])[0], run_ort(model, [{"x": x}])[0])
    empty = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    write_streamed(empty, tmp_path / "c.onnx")  # no initializers: written as onnx writes it
    assert onnx.load(str(tmp_path / "c.onnx")) == empty


def test_the_final_check_still_refuses_a_model_onnx_rejects():
    from trt_bridge.errors import InternalError
    from trt_bridge.ir.finalize import finalize

    w = np.ones((300, 300), np.float16)  # a large float16 weight against a float32 activation: types disagree
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InternalError, match="strict checks"):
        finalize(model, 17, check=True)
