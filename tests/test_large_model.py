"""Models over 2 GB (issue 16), on a small BERT-style encoder with the large-model threshold lowered so the same
path runs in seconds: weights read from and written to external data, calibration through an onnxruntime
session saved with external data, and the final check from disk. Before the fix, saving the model for the
calibration session emptied its tensors, so the output pointed into the session's deleted ``model.onnx.data``
("should be stored in model.onnx.data, but it is not regular file"). The full-size run (2.3 GB, peak memory)
is ``scripts/large_model.py OUT`` (outside ``make test``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import assert_qdq_contract, assert_tensorrt_ready, load_script, run_ort, snr_db
from trt_bridge.cli import main
from trt_bridge.ir.store import WeightStore


@pytest.fixture(autouse=True)
def _keep_log_levels():
    """The CLI (run in-process here) sets the trt_bridge logger's level; later tests expect it as it was."""
    import logging

    level = logging.getLogger("trt_bridge").level
    yield
    logging.getLogger("trt_bridge").setLevel(level)

def test_a_large_model_converts_through_external_data(tmp_path, monkeypatch):
    import trt_bridge.ir.size

    src = load_script("large_model").build(tmp_path / "float", hidden=64, layers=2, vocab=1000, seq=16, heads=4)
    monkeypatch.setattr(trt_bridge.ir.size, "EXTERNAL_DATA_THRESHOLD", 100_000)  # the encoder has 660 KB
    monkeypatch.setattr(WeightStore, "MIN_BYTES", 1024)  # its weights (16-256 KB) go through the weight store
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "calib.npz", input_ids=rng.integers(0, 1000, (8, 1, 16), np.int64))
    out = tmp_path / "int8" / "model.int8.onnx"
    assert main(["convert", str(src), "-o", str(out), "--calib-data", str(tmp_path / "calib.npz"), "-q"]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.int8.onnx", "model.int8.onnx.data"]
    header = onnx.load(str(out), load_external_data=False)
    locations = {e.value for t in header.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"model.int8.onnx.data"}
    onnx.checker.check_model(str(out), full_check=True)
    assert_qdq_contract(out)
    assert_tensorrt_ready(out)  # TensorRT-RTX parses it with its external data and builds it
    feeds = [{"input_ids": rng.integers(0, 1000, (1, 16), np.int64)} for _ in range(4)]
    # measured 33.4 dB against the float encoder (random weights, 8 calibration feeds); the bar is 3 dB under it
    assert snr_db(run_ort(src, feeds), run_ort(out, feeds)) > 30.4
    # the source and its external data are untouched
    assert (tmp_path / "float" / "model.onnx.data").exists()


def test_the_session_copy_leaves_the_model_whole(tmp_path, monkeypatch):
    import trt_bridge.ir.size
    from trt_bridge.ir.model import load_model
    from trt_bridge.ir.save import serialize_for_session

    src = load_script("large_model").build(tmp_path / "float", hidden=64, layers=1, vocab=500, seq=8, heads=4)
    monkeypatch.setattr(trt_bridge.ir.size, "EXTERNAL_DATA_THRESHOLD", 100_000)
    model = load_model(src)
    before = {t.name: t.SerializeToString() for t in model.graph.initializer}
    path = serialize_for_session(model, str(tmp_path))
    assert Path(path).exists() and (tmp_path / "model.onnx.data").exists()
    assert {t.name: t.SerializeToString() for t in model.graph.initializer} == before


def test_the_weight_store_changes_no_output_byte_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """A model over 2 GB is held once (its lifted weights live in a private file, mapped by the graph and by
    onnxruntime: :mod:`trt_bridge.ir.store`). The output is the same, byte for byte, as with every weight held in
    memory, and the private folder is gone afterwards."""
    import tempfile

    import trt_bridge.ir.size

    src = load_script("large_model").build(tmp_path / "float", hidden=64, layers=2, vocab=1000, seq=16, heads=4)
    monkeypatch.setattr(trt_bridge.ir.size, "EXTERNAL_DATA_THRESHOLD", 100_000)
    np.savez(tmp_path / "calib.npz", input_ids=np.random.default_rng(1).integers(0, 1000, (8, 1, 16), np.int64))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    outputs, stored = {}, []
    put, put_range = WeightStore.put, WeightStore.put_range
    monkeypatch.setattr(WeightStore, "put", lambda self, tensor, payload: (stored.append(tensor.name),
                                                                          put(self, tensor, payload)))
    monkeypatch.setattr(WeightStore, "put_range", lambda self, tensor, *where: (  # (a deferred source weight)
        stored.append(tensor.name), put_range(self, tensor, *where)))
    for name, min_bytes in (("stored", 1024), ("held", 1 << 40)):
        monkeypatch.setattr(WeightStore, "MIN_BYTES", min_bytes)
        stored.clear()
        out = tmp_path / name / "model.onnx"
        assert main(["convert", str(src), "-o", str(out), "--calib-data", str(tmp_path / "calib.npz"), "-q"]) == 0
        outputs[name] = [(out.parent / f).read_bytes() for f in ("model.onnx", "model.onnx.data")]
        assert len(stored) == (16 if name == "stored" else 0)  # 2 embeddings, 12 weight matrices, 2 FFN biases (1 KiB)
    assert outputs["stored"] == outputs["held"]
    assert list(scratch.iterdir()) == []  # the store's folder and the sessions' files are gone


def _two_matmuls(w1: np.ndarray, w2: np.ndarray) -> onnx.ModelProto:
    """x [2, 8] ─ MatMul(w1 [8, 300]) ─ MatMul(w2 [300, 5]) ─ y."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_weight_store_maps_what_it_holds_and_serves_onnxruntime(tmp_path):
    """``put`` writes a weight 4 KiB-aligned and turns its proto into a reference; ``array`` maps it back
    copy-on-write; ``attach`` gives an imported graph's constants their mapped values; a session over the header
    computes what the model with its weights computes; ``close`` removes the folder."""
    import onnx_graphsurgeon as gs

    from trt_bridge.ir.save import serialize_for_session
    from trt_bridge.ir.store import ALIGN, store_of

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 300)).astype(np.float32), rng.standard_normal((300, 5)).astype(np.float32)
    model = _two_matmuls(w1, w2)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    expected = run_ort(model, [{"x": x}])[0]
    with WeightStore() as store:
        header = onnx.ModelProto()
        header.CopyFrom(model)
        for tensor, values in zip(header.graph.initializer, (w1, w2)):
            store.put(tensor, values)
            assert store.holds(tensor) and not tensor.raw_data
            assert int({e.key: e.value for e in tensor.external_data}["offset"]) % ALIGN == 0
            np.testing.assert_array_equal(store.array(tensor), values)
        assert store_of(header) is store
        imported = gs.import_onnx(header)
        assert store.attach(imported) == 2
        assert all(t.data_location is None for t in imported.tensors().values() if isinstance(t, gs.Constant))
        np.testing.assert_array_equal(imported.tensors()["w2"].values, w2)
        path = serialize_for_session(header, str(tmp_path))
        assert Path(path).parent == store.folder
        np.testing.assert_array_equal(run_ort(Path(path), [{"x": x}])[0], expected)
        folder = store.folder
    assert not folder.exists()
    assert store_of(model) is None


@pytest.mark.parametrize("data_type", [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                                       onnx.TensorProto.INT8, onnx.TensorProto.INT64, onnx.TensorProto.BOOL,
                                       onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT8E4M3FN,
                                       onnx.TensorProto.INT4, onnx.TensorProto.UINT4])
def test_a_tensors_size_is_read_from_its_shape_and_type_as_its_raw_data_holds_it(data_type):
    from trt_bridge.ir.size import tensor_bytes

    tensor = onnx.TensorProto(data_type=data_type, dims=[3, 5])
    packed = data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
    tensor.raw_data = b"x" * (8 if packed else 15 * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    assert tensor_bytes(tensor) == len(tensor.raw_data)
    typed = onnx.numpy_helper.from_array(np.arange(4, dtype=np.int32))
    typed.ClearField("raw_data")
    typed.int32_data.extend(range(4))
    assert tensor_bytes(typed) == typed.ByteSize()  # values in a typed field: sized by protobuf


def test_calibration_sessions_of_large_models_do_not_prepack_weights(monkeypatch):
    """onnxruntime's MatMul prepacking copies every weight (2.6 GB more at the peak of a 2.9 GB encoder's
    conversion): calibration sessions over weights of ``PREPACK_LIMIT`` bytes or more turn it off."""
    from onnx import TensorProto, helper, numpy_helper

    import trt_bridge.calibrate.session as calib

    w = np.ones((64, 64), np.float32)  # 16 KB
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    prepacking = []

    def create(m, options, *args, **kwargs):
        try:
            prepacking.append(options.get_session_config_entry("session.disable_prepacking") != "1")
        except RuntimeError:  # onnxruntime's answer for an entry never set
            prepacking.append(True)
        return create_session(m, options, *args, **kwargs)

    create_session = calib.create_session
    monkeypatch.setattr(calib, "create_session", create)
    for limit in (1 << 20, 16 << 10):  # over the model's 16 KB of weights, then at it
        monkeypatch.setattr(calib, "PREPACK_LIMIT", limit)
        with calib.CalibrationSession(model, ["y"]) as session:
            np.testing.assert_array_equal(session.session.run(["y"], {"x": np.ones((1, 64), np.float32)})[0],
                                          np.full((1, 64), 64, np.float32))
    assert prepacking == [True, False]


def test_a_stores_read_pages_leave_the_resident_set_and_written_ones_stay():
    """A weight read through the store's map is dropped from the resident set once read (the calibration session
    maps the same file; each map's pages count): ``release_weight`` on an array viewing it. A map a rule wrote
    into holds private pages: it keeps them, and what was written."""
    from trt_bridge.ir.store import release_weight

    w = np.arange(3 * 4096, dtype=np.float32).reshape(3, 4096)  # three pages of 16 KiB each
    with WeightStore() as store:
        tensors = [onnx.TensorProto(name=n, data_type=onnx.TensorProto.FLOAT, dims=[3, 4096]) for n in "ab"]
        for tensor in tensors:
            store.put(tensor, w)
        read, written = (store.array(t) for t in tensors)
        assert float(np.asarray(read).sum()) == float(w.sum())
        written[0, :4] = -1.0
        assert release_weight(np.asarray(read)[1:]) > 0  # a view of the map: the map's pages go
        assert release_weight(written) == 0 and release_weight(w) == 0
        np.testing.assert_array_equal(read, w)  # mapped again from the file
        assert (written[0, :4] == -1.0).all() and (written[1:] == w[1:]).all()


def test_the_lifted_size_counts_what_lifting_widens():
    """A 4-bit decoder is small as a file and large once lifted: MatMulNBits' packed codes take 32 / bits times
    their bytes in float32, int8 codes 4 times; the store (a model over 2 GB held once) is chosen on that size
    (a 0.75 GB onnxruntime-genai int4 export lifts to 3.5 GB)."""
    from pathlib import Path

    from trt_bridge.ir.size import lifted_bytes, payload_bytes, tensor_bytes

    model = onnx.load(str(Path(__file__).parent / "data" / "decoders" / "llama-genai-cpu-int4" / "model.onnx"))
    packed = {n.input[1] for n in model.graph.node if n.op_type == "MatMulNBits"}
    codes = sum(tensor_bytes(t) for t in model.graph.initializer if t.name in packed)
    assert codes and lifted_bytes(model) == payload_bytes(model) + 7 * codes


def _nbits_source(tmp_path: Path) -> Path:
    """x [2, 512] ─ MatMulNBits(K=512, N=768, 4 bits, blocks of 32, packed zero points) ─ y: its float weight
    (1.5 MB) is one the weight store takes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    k, n, block = 512, 768, 32
    q = rng.integers(0, 16, (n, k // block, block)).astype(np.uint8)
    zp = rng.integers(0, 16, (n, k // block // 2 * 2)).astype(np.uint8)
    inits = [numpy_helper.from_array(q[..., 0::2] | (q[..., 1::2] << 4), "B"),
             numpy_helper.from_array((rng.uniform(0.01, 0.03, (n, k // block))
                                      * rng.choice([-1, 1], (n, k // block))).astype(np.float32), "scales"),
             numpy_helper.from_array(zp[:, 0::2] | (zp[:, 1::2] << 4), "zp")]
    node = helper.make_node("MatMulNBits", ["x", "B", "scales", "zp"], ["y"], "nbits", domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(
        "com.microsoft", 1)])
    path = tmp_path / "nbits.onnx"
    onnx.save(model, str(path))
    return path


def test_a_weight_only_conversion_through_the_store_computes_no_float_weight(tmp_path, monkeypatch):
    """The lifted float weight of a MatMulNBits is derived from its codes (:mod:`trt_bridge.ir.derived`): through
    the weight store, a weight-only conversion never computes it (lowering writes the codes), and writes the same
    graph and weights as the eager path, which computes what onnxruntime computes of the source."""
    import trt_bridge.ir.size
    from trt_bridge.ir.derived import DerivedValues
    from trt_bridge.runtime.session import session

    source = _nbits_source(tmp_path)
    eager = tmp_path / "eager.onnx"
    assert main(["convert", str(source), "-o", str(eager), "--skip-check", "-q"]) == 0
    computed = []
    load = DerivedValues.load
    monkeypatch.setattr(DerivedValues, "load", lambda self: (computed.append(self.shape), load(self))[1])
    monkeypatch.setattr(trt_bridge.ir.size, "EXTERNAL_DATA_THRESHOLD", 100_000)
    monkeypatch.setattr(WeightStore, "MIN_BYTES", 1024)
    stored = tmp_path / "stored.onnx"
    assert main(["convert", str(source), "-o", str(stored), "--skip-check", "-q"]) == 0
    assert computed == []
    a, b = onnx.load(str(stored)), onnx.load(str(eager))  # (the stored one "over 2 GB": its weights in a .data file)
    assert [n.SerializeToString() for n in a.graph.node] == [n.SerializeToString() for n in b.graph.node]
    assert {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in a.graph.initializer} == {
        t.name: onnx.numpy_helper.to_array(t).tobytes() for t in b.graph.initializer}
    x = np.random.default_rng(4).standard_normal((2, 512)).astype(np.float32)
    want = run_ort(source, [{"x": x}])[0]
    got = session(stored, simulate_qdq=True).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_stores_derived_weights_are_written_when_a_session_needs_them(tmp_path):
    """``put_derived`` reserves a range and computes nothing; ``attach`` gives the graph the derived values
    themselves; ``session_model`` (and ``array``) write them first, so onnxruntime reads the computed values."""
    import onnx_graphsurgeon as gs

    from trt_bridge.ir.derived import DerivedValues

    rng = np.random.default_rng(5)
    w1, w2 = rng.standard_normal((8, 300)).astype(np.float32), rng.standard_normal((300, 5)).astype(np.float32)
    calls = []
    derived = DerivedValues(lambda: (calls.append(1), w1 * 2)[1], w1.shape, np.float32)
    assert derived.shape == (8, 300) and derived.dtype == np.float32 and derived.nbytes == w1.nbytes and not calls
    header = _two_matmuls(w1, w2)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    expected = (x @ (w1 * 2)) @ w2
    with WeightStore() as store:
        store.put_derived(header.graph.initializer[0], derived)  # reserved first: nothing after it written yet
        store.put(header.graph.initializer[1], w2)
        assert not calls and store.holds(header.graph.initializer[0])
        imported = gs.import_onnx(header)
        assert store.attach(imported) == 2
        assert imported.tensors()["w1"]._values is derived and not calls
        np.testing.assert_allclose(run_ort(Path(store.session_model(header)), [{"x": x}])[0], expected, rtol=1e-5)
        assert len(calls) == 1
        np.testing.assert_array_equal(store.array(header.graph.initializer[0]), w1 * 2)
        assert len(calls) == 1  # written once
    bad = DerivedValues(lambda: w1.astype(np.float16), w1.shape, np.float32)
    with pytest.raises(Exception, match="not the declared float32"):
        bad.load()
