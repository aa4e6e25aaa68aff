"""The hostile-input cases of issue 28 ("hostile input, round two"), one row each, run by ``test_hostile.py``
as ``cases.py``'s rows are (same :class:`Case`, same assertions).

The guarantees they name (docs/reliability.md): G1–G6 as in ``cases.py``, and
  G7 non-regular files (pipes, devices, sockets) are refused as inputs before they are opened, and an output that
     is a dangling symbolic link or a link loop is refused
  G8 user code (data loaders, ``--plugins`` scripts) cannot end the command: ``sys.exit``, any ``BaseException``
     and a change of the working folder are caught; a loader is capped (``--calib-max``)
  G9 numbers from files are bounded before use (bit widths, huge integers), and what the installed onnxruntime
     cannot run (opset, float8 Q/DQ, sparse initializers, sequence inputs) is refused up front with a clear line
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.hostile.cases import CONVERT, Case, device, manifest, nothing, write

LOADER = "import numpy as np\n"
FEED = "{'x': np.zeros((1, 3, 16, 16), np.float32)}"


def loader(body: str, name: str = "loader.py"):
    return write(name, LOADER + body)


def _needs_trt() -> None:
    """``--plugins`` files run only where a TensorRT module is installed (they register with it)."""
    import importlib.util

    import pytest

    if not any(importlib.util.find_spec(m) for m in ("tensorrt_rtx", "tensorrt")):
        pytest.skip("no TensorRT module: --plugins files are not run")


def plugin(body: str):
    def make(d: Path) -> None:
        _needs_trt()
        (d / "p.py").write_text(body)
    return make


def feeds_folder(d: Path) -> None:
    """``feeds/`` with two .npz feeds, as convert --calib-data and verify/bench --data take a folder."""
    (d / "feeds").mkdir()
    x = np.load(d / "calib.npz")["x"]
    for i in range(2):
        np.savez(d / "feeds" / f"{i}.npz", x=x[i])


def eval_copy(d: Path) -> None:
    shutil.copy(d / "calib.npz", d / "ev.npz")


def fifo(name: str):
    def make(d: Path) -> None:
        (d / name).parent.mkdir(exist_ok=True)
        os.mkfifo(d / name)
    return make


def fifo_in_folder(d: Path) -> None:
    feeds_folder(d)
    os.mkfifo(d / "feeds" / "2.npz")


def chdir_loader(d: Path) -> None:
    """``sub/loader.py`` changes the working folder to ``sub/``, which holds a precious ``out.onnx``."""
    (d / "sub").mkdir()
    (d / "sub" / "loader.py").write_text(LOADER + "import os\nos.chdir(os.path.dirname(os.path.abspath(__file__)))\n"
                                         f"def load_data():\n    os.chdir(os.path.dirname(__file__))\n"
                                         f"    return [{FEED}, {FEED}]\n")
    (d / "sub" / "out.onnx").write_bytes(b"precious")


def _written(*names: str):
    def then(d: Path) -> None:
        for name in names:
            assert (d / name).is_file() and (d / name).stat().st_size > 0, f"{name} was not written"
    return then


def _model_with(edit, name: str = "bad.onnx"):
    def make(d: Path) -> None:
        model = onnx.load(str(d / "float.onnx"))
        edit(model)
        onnx.save(model, str(d / name))
    return make


def _opset(version: int):
    def edit(model: onnx.ModelProto) -> None:
        model.opset_import[0].version = version
    return edit


def qop_opset(version: int):
    def make(d: Path) -> None:
        model = onnx.load(str(d / "qop.onnx"))
        _opset(version)(model)
        onnx.save(model, str(d / "bad.onnx"))
    return make


def _sparse(model: onnx.ModelProto) -> None:
    values = numpy_helper.from_array(np.array([1.0], np.float32), "extra")
    indices = numpy_helper.from_array(np.array([0], np.int64), "extra_indices")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))


def _sequence_input(model: onnx.ModelProto) -> None:
    model.graph.input.append(helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None))


def _no_shape(model: onnx.ModelProto) -> None:
    model.graph.input[0].type.tensor_type.ClearField("shape")


def _failing_constant(model: onnx.ModelProto) -> None:
    """y = fc(...) + ReduceSum(Reshape(c6 [6], [4])): a constant subgraph that fails when run (onnx-graphsurgeon's
    constant folding runs it in an onnxruntime session, which logs the failure on stderr itself)."""
    model.graph.initializer.extend([numpy_helper.from_array(np.arange(6, dtype=np.float32), "c6"),
                                    numpy_helper.from_array(np.array([4], np.int64), "shape4")])
    model.graph.node[-1].output[0] = "y0"
    model.graph.node.extend([helper.make_node("Reshape", ["c6", "shape4"], ["c4"], name="bad_reshape"),
                             helper.make_node("ReduceSum", ["c4"], ["s"], name="sum", keepdims=0),
                             helper.make_node("Add", ["y0", "s"], ["y"], name="add_sum")])


def fp8_qdq(d: Path, code: int = TensorProto.FLOAT8E4M3FN, opset: int = 19) -> None:
    """x → QuantizeLinear(float8e4m3fn) → DequantizeLinear → the float net's first Conv (opset 19)."""
    model = onnx.load(str(d / "float.onnx"))
    model.opset_import[0].version = opset
    model.ir_version = 9 if opset < 21 else 10
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "x_scale")
    zp = helper.make_tensor("x_zp", code, [], [0.0])
    model.graph.initializer.extend([scale, zp])
    q = helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"], name="q_x")
    dq = helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x_dq"], name="dq_x")
    conv = model.graph.node[0]
    conv.input[0] = "x_dq"
    nodes = [q, dq, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(d / "bad.onnx"))


def _fp4_approximated(d: Path) -> None:
    """An FP4 Q/DQ of the input converts (it was refused before lift/fp4_activation_qdq.py): without a target that
    runs FP4, and before a convolution, it becomes INT8; no FP4 code is left."""
    model = onnx.load(str(d / "out.onnx"))
    codes = {i.name: i.data_type for i in model.graph.initializer}
    assert TensorProto.FLOAT4E2M1 not in codes.values()
    assert any(n.op_type == "QuantizeLinear" and codes.get(n.input[2]) == TensorProto.INT8 for n in model.graph.node)


def _fp8_kept(d: Path) -> None:
    """An FP8 source converts (it was refused before FP8 was a format): its input's FP8 Q/DQ is kept."""
    model = onnx.load(str(d / "out.onnx"))
    codes = {i.name: i.data_type for i in model.graph.initializer}
    assert any(n.op_type == "QuantizeLinear" and codes.get(n.input[2]) == TensorProto.FLOAT8E4M3FN
               for n in model.graph.node)


def npy_named_npz(d: Path) -> None:
    np.save(d / "fake.npy", np.load(d / "calib.npz")["x"])
    (d / "fake.npy").rename(d / "fake.npz")


def aimet(bw) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        doc = {"version": "1.0.0", "activation_encodings": [
            {"name": "x", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": bw, "is_sym": False, "scale": [0.02],
             "offset": [-128.0]}], "param_encodings": []}
        (d / "a.encodings").write_text(json.dumps(doc))
    return make


def huge_int_amax(d: Path) -> None:
    doc = json.loads((d / "s.json").read_text())
    name = next(k for k, v in doc["tensors"].items() if v["kind"] == "activation")
    text = json.dumps(doc).replace(json.dumps({name: doc["tensors"][name]})[1:-1],
                                   json.dumps(name) + ': {"amax": ' + "1" + "0" * 400 + ', "kind": "activation"}')
    (d / "bad.json").write_text(text)


def dangling(d: Path) -> None:
    (d / "link.onnx").symlink_to(d / "nowhere" / "deep" / "model.onnx")


def loop(d: Path) -> None:
    (d / "loop.onnx").symlink_to(d / "loop.onnx")


def json_manifest(d: Path) -> None:
    """A manifest written as JSON (YAML takes it), named as the pipeline's own summary, output in its folder."""
    (d / "pipeline.json").write_text(json.dumps({"output": ".", "models": [
        {"name": "m", "source": "float.onnx", "calib_random": 2}]}))


def reference_in_output(d: Path) -> None:
    """The manifest's reference is where the pipeline writes its converted model (output: ., model m)."""
    (d / "m").mkdir()
    shutil.copy(d / "float.onnx", d / "m" / "m.int8.onnx")
    (d / "m.yaml").write_text("output: .\nmodels:\n  - name: m\n    source: float.onnx\n"
                              "    reference: m/m.int8.onnx\n    calib_random: 2\n")


def _two_reports(d: Path) -> None:
    for name in ("r1.json", "r2.json"):
        assert json.loads((d / name).read_text())["quantized"], f"{name}: not the conversion report"


def _feed_count(count: int):
    def then(d: Path) -> None:
        calibration = json.loads((d / "r.json").read_text())["calibration"]
        assert calibration["feeds"] <= count, calibration
    return then


def _fifo_still(name: str):
    def then(d: Path) -> None:
        import stat

        assert stat.S_ISFIFO(os.lstat(d / name).st_mode), f"{name} was replaced"
    return then


#: stdout that encodes ASCII only, file names in UTF-8 (a C locale's stdout where the file system is UTF-8; a pure
#: C locale, PYTHONUTF8=0, cannot even name such a file)
ASCII_STDOUT = {"PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0"}
FOREVER = loader(f"def load_data():\n    while True:\n        yield {FEED}\n")
BASE_EXCEPTION = "import asyncio\n"
VERIFY = ["verify", "{d}/float.onnx", "{d}/b1.onnx"]
PIPELINE_EXIT = ("output: out\nmodels:\n  - name: m\n    source: float.onnx\n    calib_random: 2\n"
                 "    gates: {min_snr: 1000}\ntargets:\n  - name: ada\n    compute_capabilities: ['8.9']\n")

CASES = [
    # ---- data loss (G1): every file a command reads is protected, files inside folders included
    Case("convert-output-is-eval-data", "G1", eval_copy,
         [*CONVERT, "-o", "{d}/ev.npz", "--accuracy-target", "10", "--eval-data", "{d}/ev.npz"], 2, "ev.npz",
         unchanged=("ev.npz",)),
    Case("convert-output-in-calib-folder", "G1", feeds_folder,
         ["convert", "{d}/float.onnx", "--calib-data", "{d}/feeds", "-o", "{d}/feeds/0.npz"], 2, "feeds",
         unchanged=("feeds/0.npz",)),
    Case("convert-report-in-calib-folder", "G1", feeds_folder,
         ["convert", "{d}/float.onnx", "--calib-data", "{d}/feeds", "-o", "{d}/out.onnx", "--report",
          "{d}/feeds/1.npz"], 2, "feeds", unchanged=("feeds/1.npz",), absent=("out.onnx",)),
    Case("convert-json-in-calib-folder", "G1", feeds_folder,
         ["convert", "{d}/float.onnx", "--calib-data", "{d}/feeds", "-o", "{d}/out.onnx", "--json",
          "{d}/feeds/1.npz"], 2, "feeds", unchanged=("feeds/1.npz",), absent=("out.onnx",)),
    Case("verify-json-in-data-folder", "G1", feeds_folder,
         [*VERIFY, "--data", "{d}/feeds", "--json", "{d}/feeds/0.npz"], 2, "feeds", unchanged=("feeds/0.npz",)),
    Case("bench-json-in-data-folder", "G1", feeds_folder,
         ["bench", "{d}/float.onnx", "--data", "{d}/feeds", "--iterations", "2", "--warmup", "0", "--json",
          "{d}/feeds/0.npz"], 2, "feeds", unchanged=("feeds/0.npz",)),
    Case("check-json-is-plugins", "G1", write("p.py", "X = 1\n"),
         ["check", "{d}/b1.onnx", "--trt", "off", "--plugins", "{d}/p.py", "--json", "{d}/p.py"], 2, "p.py",
         unchanged=("p.py",)),
    Case("verify-json-is-plugins", "G1", write("p.py", "X = 1\n"),
         [*VERIFY, "--random", "2", "--plugins", "{d}/p.py", "--json", "{d}/p.py"], 2, "p.py",
         unchanged=("p.py",)),
    Case("build-output-is-plugins", "G1", write("p.py", "X = 1\n"),
         ["build", "{d}/b1.onnx", "-o", "{d}/p.py", "--plugins", "{d}/p.py"], 2, "p.py", unchanged=("p.py",)),
    Case("build-timing-cache-is-plugins", "G1", write("p.py", "X = 1\n"),
         ["build", "{d}/b1.onnx", "-o", "{d}/e.engine", "--plugins", "{d}/p.py", "--timing-cache", "{d}/p.py"], 2,
         "p.py", unchanged=("p.py",), absent=("e.engine",)),
    Case("pipeline-summary-over-json-manifest", "G1", json_manifest, ["pipeline", "{d}/pipeline.json", "-q"], 2,
         "pipeline.json", unchanged=("pipeline.json",)),
    Case("pipeline-model-over-reference", "G1", reference_in_output, ["pipeline", "{d}/m.yaml", "-q"], 2,
         "m.int8.onnx", unchanged=("m/m.int8.onnx",)),
    Case("loader-chdir-relative-output", "G1", chdir_loader,
         ["convert", "float.onnx", "--calib-data", "sub/loader.py", "-o", "out.onnx", "--report", "r.json",
          "--skip-check", "--calib-method", "max"], 0, "", unchanged=("sub/out.onnx",), subprocess=True,
         then=_written("out.onnx", "r.json")),
    Case("loader-chdir-default-output", "G1",
         lambda d: (chdir_loader(d), (d / "sub" / "float.int8.onnx").write_bytes(b"precious")),
         ["convert", "float.onnx", "--calib-data", "sub/loader.py", "--skip-check", "--calib-method", "max"], 0, "",
         unchanged=("sub/float.int8.onnx",), subprocess=True, then=_written("float.int8.onnx")),
    Case("ascii-stdout-unicode-output", "G2", nothing,  # the summary names the output; stdout encodes ASCII only
         [*CONVERT, "-o", "{d}/mödel-ü.onnx", "--calib-method", "max"], 0, "m\\xf6del-\\xfc.onnx", subprocess=True,
         env=ASCII_STDOUT, then=_written("mödel-ü.onnx")),
    # ---- unsafe (G9, G7)
    Case("aimet-bw-10000000000", "G9", aimet(10_000_000_000),
         [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/a.encodings"], 2, "bw", absent=("out.onnx",),
         subprocess=True, timeout=60),
    Case("output-dangling-symlink", "G7", dangling, [*CONVERT, "-o", "{d}/link.onnx"], 2, "does not exist",
         absent=("nowhere",)),
    # ---- silent wrong (G8, G1, G9)
    Case("check-plugin-sys-exit-0", "G8", plugin("import sys\nsys.exit(0)\n"),
         ["check", "{d}/float.onnx", "--plugins", "{d}/p.py"], 2, "p.py"),
    Case("build-plugin-sys-exit-0", "G8", plugin("import sys\nsys.exit(0)\n"),
         ["build", "{d}/b1.onnx", "-o", "{d}/e.engine", "--plugins", "{d}/p.py"], 2, "p.py",
         absent=("e.engine",)),
    Case("pipeline-plugin-sys-exit-0", "G8", lambda d: (plugin("import sys\nsys.exit(0)\n")(d),
                                                       write("m.yaml", PIPELINE_EXIT)(d)),
         ["pipeline", "{d}/m.yaml", "--plugins", "{d}/p.py"], 1, "p.py"),
    Case("report-and-json-both-written", "G1", nothing,
         [*CONVERT, "-o", "{d}/out.onnx", "--report", "{d}/r1.json", "--json", "{d}/r2.json", "-q",
          "--calib-method", "max", "--skip-check"], 0, "", then=_two_reports),
    Case("opset-beyond-onnxruntime", "G9", qop_opset(99),  # the model's own scales: no onnxruntime session runs
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx"], 2, "opset 99", absent=("out.onnx",)),
    # ---- tracebacks (G8)
    Case("loader-cancelled-error", "G8", loader(BASE_EXCEPTION + "def load_data():\n"
                                                "    raise asyncio.CancelledError()\n"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py"], 2, "loader.py",
         absent=("out.onnx",)),
    Case("loader-cancelled-error-mid-way", "G8", loader(BASE_EXCEPTION + f"def load_data():\n    yield {FEED}\n"
                                                        "    raise asyncio.CancelledError()\n"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py"], 2, "loader.py",
         absent=("out.onnx",)),
    Case("plugin-cancelled-error", "G8", plugin(BASE_EXCEPTION + "raise asyncio.CancelledError()\n"),
         ["check", "{d}/float.onnx", "--plugins", "{d}/p.py"], 2, "p.py"),
    # ---- hangs (G7, G8)
    Case("calib-data-fifo", "G7", fifo("pipe.npz"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/pipe.npz"], 2, "regular file",
         absent=("out.onnx",), subprocess=True, timeout=60, then=_fifo_still("pipe.npz")),
    Case("fifo-in-feeds-folder", "G7", fifo_in_folder,
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/feeds"], 2, "regular file",
         absent=("out.onnx",), subprocess=True, timeout=60),
    Case("timing-cache-fifo", "G7", fifo("cache.bin"),
         ["build", "{d}/b1.onnx", "-o", "{d}/e.engine", "--timing-cache", "{d}/cache.bin"], 2, "regular file",
         absent=("e.engine",), subprocess=True, timeout=60, then=_fifo_still("cache.bin")),
    Case("model-is-a-fifo", "G7", fifo("m.onnx"), ["check", "{d}/m.onnx", "--trt", "off"], 2, "regular file",
         subprocess=True, timeout=60, then=_fifo_still("m.onnx")),
    Case("qat-is-a-fifo", "G7", fifo("qat.onnx"), [*CONVERT, "-o", "{d}/out.onnx", "--qat", "{d}/qat.onnx"], 2,
         "regular file", absent=("out.onnx",), subprocess=True, timeout=60),
    Case("load-inputs-is-a-fifo", "G7", fifo("in.json"), [*VERIFY, "--load-inputs", "{d}/in.json"], 2,
         "regular file", subprocess=True, timeout=60),
    Case("verify-data-fifo", "G7", fifo("pipe.npz"), [*VERIFY, "--data", "{d}/pipe.npz"], 2, "regular file",
         subprocess=True, timeout=60),
    Case("loader-yields-forever", "G8", FOREVER,
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py", "--calib-max", "6",
          "--report", "{d}/r.json", "--skip-check"], 0, "--calib-max N reads up to N", subprocess=True, timeout=120,
         then=_feed_count(6)),
    Case("manifest-calib-max", "G8", lambda d: (FOREVER(d), manifest(
        "    calib_data: loader.py\n    convert: {calib_max: 4, calib_method: max}\n")(d)),
         ["pipeline", "{d}/m.yaml"], 0, "stopped at 4 feeds", subprocess=True, timeout=180),
    Case("check-data-loader-forever", "G8", FOREVER, ["check", "{d}/b1.onnx", "--trt", "off", "--data",
                                                      "{d}/loader.py"], 0, "stopped at 512 feeds", subprocess=True,
         timeout=120),
    Case("calib-random-10^12", "G9", nothing, ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-random",
                                                "1000000000000"], 2, "--calib-random must be at least 1 and at most",
         absent=("out.onnx",),
         subprocess=True, timeout=60),
    Case("calib-max-zero", "G5", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--calib-max", "0"], 2,
         "--calib-max must be at least 1", absent=("out.onnx",)),
    # ---- one clear line instead of an internal error (G5, G9)
    Case("float8-qdq", "G9", fp8_qdq, ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 0,
         "", then=_fp8_kept),
    Case("float4-qdq", "G9", lambda d: fp8_qdq(d, TensorProto.FLOAT4E2M1, 23),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 0, "", then=_fp4_approximated),
    Case("sparse-initializer", "G9", _model_with(_sparse),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "sparse",
         absent=("out.onnx",)),
    Case("sequence-input", "G9", _model_with(_sequence_input),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "seq",
         absent=("out.onnx",)),
    Case("npy-named-npz", "G5", npy_named_npz,
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/fake.npz"], 2, ".npy",
         absent=("out.onnx",)),
    Case("loader-ragged-batch", "G5", loader("def load_data():\n    return [{'x': [[1.0, 2.0], [3.0]]}]\n"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py"], 2, "'x'",
         absent=("out.onnx",)),
    Case("loader-mixed-key-types", "G5", loader(f"def load_data():\n    f = {FEED}\n    f[0] = f['x']\n"
                                                "    return [f]\n"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py"], 2, "key 0",
         absent=("out.onnx",)),
    Case("json-amax-10^400", "G9", huge_int_amax, [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/bad.json"], 2,
         "amax", absent=("out.onnx",)),
    Case("aimet-bw-100000", "G9", aimet(100_000), [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/a.encodings"],
         2, "bw", absent=("out.onnx",)),
    Case("output-symlink-loop", "G7", loop, [*CONVERT, "-o", "{d}/loop.onnx"], 2, "symbolic link in a loop"),
    Case("verify-seed-negative", "G5", nothing, [*VERIFY, "--random", "2", "--seed", "-1"], 2, "--seed"),
    Case("bench-seed-negative", "G5", nothing, ["bench", "{d}/float.onnx", "--seed", "-1", "--iterations", "2"], 2,
         "--seed"),
    Case("input-without-shape", "G5", _model_with(_no_shape),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "no shape",
         absent=("out.onnx",)),
    Case("onnxruntime-log-silenced", "G9", _model_with(_failing_constant),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "bad_reshape",
         absent=("out.onnx",), subprocess=True, not_in_err=("[E:onnxruntime", "[W:onnxruntime")),
    # ---- more of the same classes, found on the way
    Case("report-dangling-symlink", "G7", lambda d: (d / "r.json").symlink_to(d / "gone" / "r.json"),
         [*CONVERT, "-o", "{d}/out.onnx", "--report", "{d}/r.json"], 2, "does not exist",
         absent=("out.onnx", "gone")),
    Case("model-is-a-device", "G7", device, ["check", "{d}/null", "--trt", "off"], 2, "regular file"),
    Case("verify-loader-sys-exit-0", "G8", loader("import sys\ndef load_data():\n    sys.exit(0)\n"),
         [*VERIFY, "--data", "{d}/loader.py"], 2, "sys.exit(0)"),
    Case("bench-loader-cancelled-error", "G8", loader(BASE_EXCEPTION + "def load_data():\n"
                                                      "    raise asyncio.CancelledError()\n"),
         ["bench", "{d}/float.onnx", "--data", "{d}/loader.py", "--iterations", "2", "--warmup", "0"], 2,
         "CancelledError"),
    Case("manifest-calib-max-text", "G5", manifest("    calib_data: calib.npz\n    convert: {calib_max: ten}\n"),
         ["pipeline", "{d}/m.yaml"], 2, "calib_max", absent=("m-output",)),
    Case("manifest-bench-provider-gpu", "G5", manifest("    calib_random: 2\n    bench: {provider: gpu}\n"),
         ["pipeline", "{d}/m.yaml"], 2, "provider", absent=("m-output",)),
    Case("manifest-bench-warmup-negative", "G5", manifest("    calib_random: 2\n    bench: {warmup: -1}\n"),
         ["pipeline", "{d}/m.yaml"], 2, "warmup", absent=("m-output",)),
    Case("manifest-eval-data-missing", "G5", manifest("    calib_random: 2\n    eval_data: gone.npz\n"),
         ["pipeline", "{d}/m.yaml"], 2, "gone.npz", absent=("m-output",)),
    Case("manifest-bench-iterations-ten", "G5", manifest("    calib_random: 2\n    bench: {iterations: ten}\n"),
         ["pipeline", "{d}/m.yaml"], 2, "iterations", absent=("m-output",)),
]
