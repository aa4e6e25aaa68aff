"""Calibration feed sources (.npz, folders, loader scripts, random) and per-feed validation."""

from __future__ import annotations

import logging
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trt_bridge.calibrate.feed_sources import open_feeds
from trt_bridge.calibrate.feeds import InputSpec, model_inputs, validate_feed
from trt_bridge.errors import CalibrationDataError


#   x[B,3,4] ────────────── Mul ─────────── Add ─ Identity ─ y[B,3,4]
#   t[1] ────────────────────┘               │
#   ids[B,3,4]:int64 ─ Cast(float) ──────────┘
#
# B is the batch: a name (dynamic) or a fixed int. ``t`` (a UNet-style timestep,
# declared [1]) and ``ids`` (an integer input) are optional; without them x feeds
# the Identity directly.
def tiny_model(batch: int | str = "B", with_t: bool = True, with_ids: bool = False) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 4])]
    nodes, cur = [], "x"
    if with_t:
        inputs.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [1]))
        nodes.append(helper.make_node("Mul", [cur, "t"], ["xt"], "mul"))
        cur = "xt"
    if with_ids:
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, 3, 4]))
        nodes.append(helper.make_node("Cast", ["ids"], ["ids_f"], "cast", to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Add", [cur, "ids_f"], ["sum"], "add"))
        cur = "sum"
    nodes.append(helper.make_node("Identity", [cur], ["y"], "out"))
    graph = helper.make_graph(nodes, "tiny", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                   [batch, 3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def specs(**kwargs) -> list[InputSpec]:
    return model_inputs(tiny_model(**kwargs))


def x_data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def calib_error(data, inputs, random_count=None) -> str:
    """Open the source and pull every feed; return the CalibrationDataError's message."""
    with pytest.raises(CalibrationDataError) as info:
        list(open_feeds(None if data is None else str(data), random_count, inputs))
    return str(info.value)


# ---------------------------------------------------------------- model inputs


def test_model_inputs_reads_names_dtypes_and_shapes():
    got = specs(batch="B", with_t=True, with_ids=True)
    assert [s.name for s in got] == ["x", "t", "ids"]
    assert [s.dtype for s in got] == [np.float32, np.float32, np.int64]
    assert got[0].shape == ("B", 3, 4) and got[0].batch == 1 and got[0].shape_text() == "[B, 3, 4]"
    assert got[1].shape == (1,)
    assert specs(batch=2, with_t=False)[0].batch == 2


def test_model_inputs_skips_initializers_listed_as_inputs():
    model = tiny_model(with_t=True)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(1, np.float32), "t"))
    assert [s.name for s in model_inputs(model)] == ["x"]


# ---------------------------------------------------------------- .npz


def test_npz_rank_plus_one_gives_one_feed_per_index(tmp_path):
    x = x_data(5, 1, 3, 4)
    t = np.arange(5, dtype=np.float32).reshape(5, 1)
    np.savez(tmp_path / "c.npz", x=x, t=t)
    source = open_feeds(str(tmp_path / "c.npz"), None, specs())
    assert source.total == 5
    feeds = list(source)
    assert len(feeds) == 5
    for i, feed in enumerate(feeds):
        assert set(feed) == {"x", "t"}
        np.testing.assert_array_equal(feed["x"], x[i])
        assert feed["t"].shape == (1,) and feed["t"][0] == i


def test_npz_rank_equal_split_along_fixed_batch_of_two(tmp_path):
    x = x_data(6, 3, 4)
    np.savez(tmp_path / "c.npz", x=x)
    source = open_feeds(str(tmp_path / "c.npz"), None, specs(batch=2, with_t=False))
    assert source.total == 3
    feeds = list(source)
    assert [f["x"].shape for f in feeds] == [(2, 3, 4)] * 3
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in feeds]), x)


def test_npz_rank_equal_split_with_dynamic_batch_gives_batch_one(tmp_path):
    x = x_data(4, 3, 4)
    np.savez(tmp_path / "c.npz", x=x)
    feeds = list(open_feeds(str(tmp_path / "c.npz"), None, specs(batch="B", with_t=False)))
    assert len(feeds) == 4
    for i, feed in enumerate(feeds):
        assert feed["x"].shape == (1, 3, 4)
        np.testing.assert_array_equal(feed["x"][0], x[i])


def test_npz_batch_not_a_multiple_of_fixed_batch(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(5, 3, 4))
    msg = calib_error(tmp_path / "c.npz", specs(batch=2, with_t=False))
    assert "'x'" in msg and "5 samples" in msg and "batch size 2" in msg


def test_npz_unknown_key_names_it_and_the_model_inputs(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(2, 1, 3, 4), t=np.ones((2, 1), np.float32), image=x_data(2, 3))
    msg = calib_error(tmp_path / "c.npz", specs())
    assert "'image'" in msg and "not an input" in msg
    assert "t" in msg and "x" in msg.split("inputs are:")[1]


def test_npz_missing_input(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(2, 1, 3, 4))
    msg = calib_error(tmp_path / "c.npz", specs())
    assert "no array for input 't'" in msg and "Arrays given: x" in msg


def test_npz_wrong_rank_names_input_and_both_shapes(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(3, 4))  # the input is [B, 3, 4]
    msg = calib_error(tmp_path / "c.npz", specs(with_t=False))
    assert "'x'" in msg and "[3, 4]" in msg and "[B, 3, 4]" in msg
    assert "rank 4" in msg and "rank 3" in msg  # how to fix: the two accepted layouts


def test_npz_wrong_fixed_dim_unet_timestep(tmp_path):
    # Two feeds, each with a timestep of shape [2] (e.g. classifier-free guidance) for t[1].
    np.savez(tmp_path / "c.npz", x=x_data(2, 1, 3, 4), t=np.ones((2, 2), np.float32))
    msg = calib_error(tmp_path / "c.npz", specs())
    assert "'t'" in msg and "[1]" in msg and "[2]" in msg
    assert "dimension 0 is 2" in msg and "fixes it at 1" in msg


def test_npz_wrong_inner_dim(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(2, 1, 3, 5), t=np.ones((2, 1), np.float32))
    msg = calib_error(tmp_path / "c.npz", specs())
    assert "'x'" in msg and "[B, 3, 4]" in msg and "[1, 3, 5]" in msg and "dimension 2 is 5" in msg


def test_npz_inputs_with_different_numbers_of_feeds(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(3, 1, 3, 4), t=np.ones((2, 1), np.float32))
    msg = calib_error(tmp_path / "c.npz", specs())
    assert "different numbers of feeds" in msg and "'x': 3" in msg and "'t': 2" in msg


def test_npz_int_given_for_float_input(tmp_path):
    np.savez(tmp_path / "c.npz", x=np.ones((2, 1, 3, 4), np.int32), t=np.ones((2, 1), np.float32))
    msg = calib_error(tmp_path / "c.npz", specs())
    assert "'x'" in msg and "float32" in msg and "int32" in msg and ".astype(np.float32)" in msg


def test_npz_float_given_for_int_input(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(2, 1, 3, 4), ids=np.ones((2, 1, 3, 4), np.float32))
    msg = calib_error(tmp_path / "c.npz", specs(with_t=False, with_ids=True))
    assert "'ids'" in msg and "int64" in msg and "float32" in msg and ".astype(np.int64)" in msg


def test_npz_float64_is_accepted_and_cast_to_float32(tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 1, 3, 4))  # float64
    np.savez(tmp_path / "c.npz", x=x, t=np.ones((2, 1)))
    feeds = list(open_feeds(str(tmp_path / "c.npz"), None, specs()))
    assert len(feeds) == 2
    assert all(f["x"].dtype == np.float32 and f["t"].dtype == np.float32 for f in feeds)
    np.testing.assert_allclose(feeds[1]["x"], x[1].astype(np.float32))


def test_int32_is_accepted_for_int64_input_but_out_of_range_is_not():
    inputs = specs(with_t=False, with_ids=True)
    x = x_data(1, 3, 4)
    ok = validate_feed({"x": x, "ids": np.full((1, 3, 4), 7, np.int32)}, inputs, "here")
    assert ok["ids"].dtype == np.int64 and int(ok["ids"].max()) == 7
    narrow = [InputSpec("ids", np.dtype(np.int8), (1,))]
    with pytest.raises(CalibrationDataError, match=r"here: input 'ids' is int8 .*do not fit"):
        validate_feed({"ids": np.array([300], np.int64)}, narrow, "here")


def test_npz_that_is_not_an_archive(tmp_path):
    (tmp_path / "c.npz").write_text("not a zip archive")
    msg = calib_error(tmp_path / "c.npz", specs())
    assert str(tmp_path / "c.npz") in msg and "not a readable .npz" in msg


# ---------------------------------------------------------------- validate_feed directly


def test_validate_feed_unet_timestep_shape():
    inputs = specs()
    with pytest.raises(CalibrationDataError) as info:
        validate_feed({"x": x_data(1, 3, 4), "t": np.array([10.0, 10.0], np.float32)}, inputs, "feed 0")
    msg = str(info.value)
    assert msg.startswith("feed 0: ")
    assert "input 't' expects shape [1]" in msg and "feed has shape [2]" in msg


def test_validate_feed_unknown_and_missing_names():
    inputs = specs()
    with pytest.raises(CalibrationDataError, match=r"'mask' is not an input of the model.*x, t"):
        validate_feed({"x": x_data(1, 3, 4), "t": np.ones(1, np.float32), "mask": np.ones(1)}, inputs, "w")
    with pytest.raises(CalibrationDataError, match=r"no data for input 't' \(expected shape \[1\], float32\)"):
        validate_feed({"x": x_data(1, 3, 4)}, inputs, "w")
    with pytest.raises(CalibrationDataError, match="a feed must be a dict"):
        validate_feed([x_data(1, 3, 4)], inputs, "w")


def test_validate_feed_wrong_rank():
    with pytest.raises(CalibrationDataError) as info:
        validate_feed({"x": x_data(3, 4)}, specs(with_t=False), "w")
    msg = str(info.value)
    assert "'x' expects rank 3, shape [B, 3, 4]" in msg and "shape [3, 4] (rank 2)" in msg


def test_validate_feed_dynamic_dims_accept_any_size():
    out = validate_feed({"x": x_data(7, 3, 4)}, specs(with_t=False), "w")
    assert out["x"].shape == (7, 3, 4)


# ---------------------------------------------------------------- folders


def test_folder_of_npz_in_name_order(tmp_path):
    folder = tmp_path / "feeds"
    folder.mkdir()
    for i in (2, 0, 1):  # written out of order
        np.savez(folder / f"feed_{i:03d}.npz", x=np.full((1, 3, 4), i, np.float32), t=np.array([i], np.float32))
    (folder / "README.txt").write_text("ignored")
    source = open_feeds(str(folder), None, specs())
    assert source.total == 3
    feeds = list(source)
    assert [float(f["t"][0]) for f in feeds] == [0.0, 1.0, 2.0]
    assert [float(f["x"].mean()) for f in feeds] == [0.0, 1.0, 2.0]


def test_folder_of_npy_for_single_input_model_in_name_order(tmp_path):
    for name, value in (("b.npy", 2.0), ("a.npy", 1.0), ("c.npy", 3.0)):
        np.save(tmp_path / name, np.full((1, 3, 4), value, np.float32))
    feeds = list(open_feeds(str(tmp_path), None, specs(with_t=False)))
    assert [float(f["x"][0, 0, 0]) for f in feeds] == [1.0, 2.0, 3.0]
    assert all(set(f) == {"x"} and f["x"].shape == (1, 3, 4) for f in feeds)


def test_folder_of_npy_needs_a_single_input_model(tmp_path):
    np.save(tmp_path / "a.npy", x_data(1, 3, 4))
    msg = calib_error(tmp_path, specs(with_t=True))
    assert ".npy" in msg and "2 inputs" in msg and ".npz" in msg


def test_folder_feeds_are_validated(tmp_path):
    np.savez(tmp_path / "0.npz", x=x_data(1, 3, 4), t=np.ones(1, np.float32))
    np.savez(tmp_path / "1.npz", x=x_data(1, 3, 4), t=np.ones(2, np.float32))
    msg = calib_error(tmp_path, specs())
    assert str(tmp_path / "1.npz") in msg and "'t'" in msg and "[1]" in msg and "[2]" in msg


def test_empty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("no arrays here")
    msg = calib_error(tmp_path, specs())
    assert str(tmp_path) in msg and "no .npz or .npy files" in msg


# ---------------------------------------------------------------- loader scripts


LOADER = """\
import numpy as np


def {name}():
    for i in range(3):
        yield {{"x": np.full((1, 3, 4), i, np.float32), "t": np.array([{scale} * i], np.float64)}}
"""


def test_loader_script_default_function(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(LOADER.format(name="load_data", scale=10))
    source = open_feeds(str(script), None, specs())
    feeds = list(source)
    assert len(feeds) == 3
    assert [float(f["t"][0]) for f in feeds] == [0.0, 10.0, 20.0]
    assert all(f["t"].dtype == np.float32 for f in feeds)  # float64 from the script, cast


def test_loader_script_named_function(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(LOADER.format(name="myfunc", scale=5))
    feeds = list(open_feeds(f"{script}:myfunc", None, specs()))
    assert [float(f["t"][0]) for f in feeds] == [0.0, 5.0, 10.0]
    assert [float(f["x"].max()) for f in feeds] == [0.0, 1.0, 2.0]


def test_loader_script_without_the_function(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(LOADER.format(name="load_data", scale=1))
    msg = calib_error(f"{script}:myfunc", specs())
    assert "no function 'myfunc'" in msg and f"{script}:FUNCTION" in msg


def test_loader_script_feeds_are_validated(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np

        def load_data():
            return [{"x": np.zeros((1, 3, 4), np.float32), "t": np.zeros(2, np.float32)}]
        """))
    msg = calib_error(script, specs())
    assert "loader.py:load_data (feed 0)" in msg and "'t'" in msg and "[1]" in msg and "[2]" in msg


def test_loader_script_that_fails_to_import(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text("raise RuntimeError('boom')\n")
    msg = calib_error(script, specs())
    assert "failed to import" in msg and "boom" in msg


def test_loader_script_not_found(tmp_path):
    msg = calib_error(f"{tmp_path / 'nope.py'}:load", specs())
    assert "nope.py" in msg and "not found" in msg


def test_loader_that_yields_nothing(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text("def load_data():\n    return []\n")
    msg = calib_error(script, specs())
    assert "yielded no feeds" in msg


# ---------------------------------------------------------------- random feeds


def test_random_feeds_count_shapes_determinism_and_warning(caplog):
    inputs = specs(batch="B", with_t=True, with_ids=True)
    with caplog.at_level(logging.WARNING, logger="trt_bridge.calibrate"):
        first = list(open_feeds(None, 4, inputs))
    assert len(first) == 4
    for feed in first:
        assert feed["x"].shape == (1, 3, 4) and feed["x"].dtype == np.float32
        assert feed["t"].shape == (1,)
        assert feed["ids"].dtype == np.int64
    assert not np.array_equal(first[0]["x"], first[1]["x"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("4 random feeds" in w and "--calib-data" in w for w in warnings)
    assert any("dynamic dimensions" in w and "x[B, 3, 4]" in w for w in warnings)

    second = list(open_feeds(None, 4, inputs))
    for a, b in zip(first, second, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_random_feeds_with_fixed_shapes_use_them():
    feeds = list(open_feeds(None, 2, specs(batch=2, with_t=False)))
    assert [f["x"].shape for f in feeds] == [(2, 3, 4)] * 2


def test_random_feeds_need_a_positive_count():
    assert "positive" in calib_error(None, specs(), random_count=0)


# ---------------------------------------------------------------- choosing the source


def test_both_calib_data_and_calib_random(tmp_path):
    np.savez(tmp_path / "c.npz", x=x_data(1, 1, 3, 4), t=np.ones((1, 1), np.float32))
    msg = calib_error(tmp_path / "c.npz", specs(), random_count=3)
    assert "--calib-data" in msg and "--calib-random" in msg and "not both" in msg


def test_no_source_at_all():
    assert "no calibration data" in calib_error(None, specs())


def test_nonexistent_path(tmp_path):
    missing = tmp_path / "missing.npz"
    msg = calib_error(missing, specs())
    assert str(missing) in msg and "not found" in msg


def test_unknown_suffix(tmp_path):
    data = tmp_path / "calib.csv"
    data.write_text("1,2,3\n")
    msg = calib_error(data, specs())
    assert str(data) in msg and "unknown calibration data format" in msg
    assert ".npz" in msg and "loader.py:function" in msg


# ---------------------------------------------------------------- unreadable arrays, failing loaders, scalars


def test_npz_with_an_object_array(tmp_path):
    np.savez(tmp_path / "c.npz", x=np.array([None, 1], dtype=object))
    msg = calib_error(tmp_path / "c.npz", specs(with_t=False))
    assert "'x'" in msg or "c.npz" in msg


def test_loader_function_that_raises(tmp_path):
    script = tmp_path / "loader.py"
    script.write_text("def load_data():\n    raise KeyError('oops')\n    yield {}\n")
    msg = calib_error(script, specs())
    assert "load_data" in msg and "oops" in msg


def test_npz_scalar_input(tmp_path):
    np.savez(tmp_path / "c.npz", s=np.float32(3.0))
    feeds = list(open_feeds(str(tmp_path / "c.npz"), None, [InputSpec("s", np.dtype(np.float32), ())]))
    assert len(feeds) == 1 and float(feeds[0]["s"]) == 3.0


def test_a_decoder_feed_is_one_step_of_its_loop():
    """A decoder's feed: the mask covers the past and the new tokens (prefill: past 0); one batch for all; a window
    cache (a past length named '*sliding*', onnxruntime-genai's Mistral) may be shorter than the mask."""

    def inputs(past_length="past_sequence_length"):
        return [InputSpec("input_ids", np.dtype(np.int64), ("batch", "sequence")),
                InputSpec("attention_mask", np.dtype(np.int64), ("batch", "total")),
                InputSpec("past_key_values.0.key", np.dtype(np.float32), ("batch", 2, past_length, 16))]

    def feed(batch, new, past, mask):
        return {"input_ids": np.ones((batch, new), np.int64), "attention_mask": np.ones((batch, mask), np.int64),
                "past_key_values.0.key": np.zeros((batch, 2, past, 16), np.float32)}

    validate_feed(feed(1, 5, 0, 5), inputs(), "prefill")
    validate_feed(feed(2, 1, 7, 8), inputs(), "decode")
    validate_feed(feed(1, 1, 8, 20), inputs("past_sliding_length"), "window")
    with pytest.raises(CalibrationDataError, match=r"^bad: 'attention_mask' is 9 long, but this step feeds 5 new "
                                                   r"token\(s\) after a past 'past_key_values.0.key' of 0"):
        validate_feed(feed(1, 5, 0, 9), inputs(), "bad")
    with pytest.raises(CalibrationDataError, match="disagree on the batch: input_ids 2, attention_mask 1"):
        validate_feed({**feed(2, 1, 7, 8), "attention_mask": np.ones((1, 8), np.int64)}, inputs(), "batch")
