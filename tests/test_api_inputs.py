"""Issue 37: the Python API's hostile inputs. Keyword values are type-checked (a compiled pattern for a REGEX option
is its pattern; a set, bytes or an object is refused naming the keyword, never taken as its repr); every path is made
absolute once, at entry, while no user code runs, so a loader that changes the working folder in one thread cannot
redirect another thread's relative output; a ModelProto whose external data is not loaded is a TrtBridgeError naming
a tensor. External data is checked by every reader of a model (the one gate ``check_external_data``)."""

from __future__ import annotations

import os
import re
import threading

import numpy as np
import onnx
import pytest

import trt_bridge
from tests.hostile.conftest import feeds, float_net
from trt_bridge.errors import OptionError, TrtBridgeError


@pytest.fixture
def folder(tmp_path):
    onnx.save(float_net(), str(tmp_path / "float.onnx"))
    np.savez(tmp_path / "calib.npz", x=feeds())
    return tmp_path


def _quantized_inputs(path) -> dict[str, bool]:
    model = onnx.load(str(path))
    made_by = {o: n.op_type for n in model.graph.node for o in n.output}
    return {n.name: made_by.get(n.input[0]) == "DequantizeLinear" for n in model.graph.node
            if n.op_type in ("Conv", "Gemm")}


def test_a_compiled_pattern_excludes_as_its_text(folder):
    common = dict(calib_data=folder / "calib.npz", quiet=True, skip_check=True, calib_method="max", give_back=False)
    trt_bridge.convert(folder / "float.onnx", folder / "all.onnx", **common)
    trt_bridge.convert(folder / "float.onnx", folder / "pattern.onnx", exclude_nodes=re.compile("conv1"), **common)
    trt_bridge.convert(folder / "float.onnx", folder / "text.onnx", exclude_nodes="conv1", **common)
    assert _quantized_inputs(folder / "all.onnx")["conv1"]  # quantized unless excluded
    assert not _quantized_inputs(folder / "pattern.onnx")["conv1"]  # was kept quantized (the pattern's repr)
    assert _quantized_inputs(folder / "pattern.onnx") == _quantized_inputs(folder / "text.onnx")


@pytest.mark.parametrize("options, message", [
    ({"exclude_nodes": re.compile("CONV1", re.IGNORECASE)}, "flags would be lost"),
    ({"exclude_nodes": {"conv1"}}, "exclude_nodes= takes a str or a compiled re.Pattern, not set"),
    ({"exclude_nodes": b"conv1"}, "exclude_nodes= takes a str or a compiled re.Pattern, not bytes"),
    ({"include_ops": 3 + 4j}, "include_ops= takes a str or a compiled re.Pattern, not complex"),
    ({"calib_max": object()}, "calib_max= takes a str, a path, an int or a float, not object"),
    ({"percentile": float("nan")}, "percentile=: nan is not a finite number"),
    ({"calib_data": 3.5}, "calib_data= takes a path"),
    ({"scales": [{"a": 1}]}, "scales= takes a str, a path, an int or a float (or a list of them), not dict"),
    ({"smooth": re.compile("0.5")}, "smooth= takes a str, a path, an int or a float, not Pattern"),
])
def test_keyword_types_are_checked(folder, options, message):
    with pytest.raises(OptionError) as info:
        trt_bridge.convert(folder / "float.onnx", folder / "out.onnx", quiet=True,
                           **{"calib_random": None if "calib_data" in options else 2, **options})
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (folder / "out.onnx").exists()


def test_numpy_scalars_are_their_values(folder):
    report = trt_bridge.convert(folder / "float.onnx", folder / "out.onnx", calib_random=np.int64(2), quiet=True,
                                skip_check=True, percentile=np.float32(99.9))
    assert (folder / "out.onnx").is_file() and report.to_dict()


def test_a_loader_changing_the_folder_in_one_thread_redirects_no_other_threads_output(folder, monkeypatch):
    """Thread A's loader moves the process to ``elsewhere`` and stays there a while; thread B converts with relative
    paths meanwhile. B's paths are read once, while no user code runs, so B writes beside its model."""
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
    onnx.save(float_net(seed=5), str(elsewhere / "float.onnx"))  # what a redirected relative input would read
    moved, go_on = threading.Event(), threading.Event()
    (folder / "loader.py").write_text(
        "import os, numpy as np\n"
        "import tests.test_api_inputs as t\n"
        "def load():\n"
        f"    os.chdir({str(elsewhere)!r})\n"
        "    t.MOVED.set()\n"
        "    t.GO_ON.wait(2.0)\n"
        "    for i in range(2):\n"
        "        yield {'x': np.zeros((1, 3, 16, 16), np.float32)}\n")
    monkeypatch.setattr("tests.test_api_inputs.MOVED", moved, raising=False)
    monkeypatch.setattr("tests.test_api_inputs.GO_ON", go_on, raising=False)
    monkeypatch.chdir(folder)
    errors = []

    def thread_a():
        try:
            trt_bridge.convert("float.onnx", "a.onnx", calib_data="loader.py:load", quiet=True, skip_check=True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    a = threading.Thread(target=thread_a)
    a.start()
    assert moved.wait(60), "the loader never ran"
    timer = threading.Timer(0.3, go_on.set)  # B enters while A's loader still holds the process elsewhere
    timer.start()
    trt_bridge.convert("float.onnx", "b.onnx", calib_random=2, quiet=True, skip_check=True)
    a.join(120)
    timer.cancel()
    assert not errors, errors
    assert os.getcwd() == str(folder)  # the loader's change was undone
    assert (folder / "a.onnx").is_file() and (folder / "b.onnx").is_file()
    assert not (elsewhere / "a.onnx").exists() and not (elsewhere / "b.onnx").exists()


def _unloaded(folder):
    onnx.save(float_net(), str(folder / "ext.onnx"), save_as_external_data=True, location="ext.data",
              size_threshold=0)
    return onnx.load(str(folder / "ext.onnx"), load_external_data=False)


@pytest.mark.parametrize("call", [
    lambda m, d: trt_bridge.build(m, d / "m.engine"),
    lambda m, d: trt_bridge.convert(m, d / "out.onnx", calib_random=2, quiet=True),
    lambda m, d: trt_bridge.check(m, trt="off"),
    lambda m, d: trt_bridge.verify(m, d / "float.onnx", random=2),
])
def test_a_model_in_memory_without_its_external_data_is_refused(folder, call):
    with pytest.raises(TrtBridgeError, match=r"keeps the data of 6 tensor\(s\) in external files \(e.g. 'w1' in "
                                             r"'ext.data'\)") as info:
        call(_unloaded(folder), folder)
    assert not isinstance(info.value, FileNotFoundError)
    assert not (folder / "m.engine").exists() and not (folder / "out.onnx").exists()


def test_every_reader_goes_through_the_external_data_gate(tmp_path):
    """The same link out of the model's folder is refused by each reader: onnx (load_model, read_model), an
    onnxruntime session on the path, TensorRT's parser in and out of process, and build."""
    from trt_bridge.ir.model import load_model, read_model
    from trt_bridge.runtime.session import create_session, session
    from trt_bridge.tensorrt.build import build
    from trt_bridge.tensorrt.parse import parse

    (tmp_path / "m").mkdir()
    onnx.save(float_net(), str(tmp_path / "m" / "ext.onnx"), save_as_external_data=True, location="ext.data",
              size_threshold=0)
    os.replace(tmp_path / "m" / "ext.data", tmp_path / "secret.data")
    (tmp_path / "m" / "ext.data").symlink_to(tmp_path / "secret.data")
    path = tmp_path / "m" / "ext.onnx"
    import onnxruntime as ort

    readers = [lambda: load_model(path), lambda: read_model(path, external_data=False), lambda: session(path),
               lambda: create_session(str(path), ort.SessionOptions()), lambda: parse(path),
               lambda: parse(path, isolated=True), lambda: build(path, tmp_path / "e.engine")]
    for reader in readers:
        with pytest.raises(TrtBridgeError, match="is a symbolic link"):
            reader()
    assert not (tmp_path / "e.engine").exists()
