"""The ``trt-bridge`` command line, run through its real entry points in subprocesses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_qdq_contract, assert_tensorrt_ready, quantize_dynamic, run_exact, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper

import trt_bridge
from trt_bridge.runtime.session import session
from trt_bridge.samples import conv_net, image_feeds

SCRIPT = Path(sys.executable).parent / "trt-bridge"
ENTRY_POINTS = {
    "module": [sys.executable, "-m", "trt_bridge"],
    "script": [str(SCRIPT)],
}
#: imported on use only (onnx, numpy and onnx-graphsurgeon, which the rules use throughout, load with the package)
HEAVY = ("onnxruntime", "tensorrt", "tensorrt_rtx", "polygraphy", "cuda")
CALIB_FEEDS = 4


def cli(*args, entry: str = "module", cwd: Path | None = None) -> subprocess.CompletedProcess:
    if entry == "script" and not SCRIPT.is_file():
        pytest.skip(f"the trt-bridge console script is not installed next to {sys.executable}")
    return subprocess.run([*ENTRY_POINTS[entry], *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def error_message(result: subprocess.CompletedProcess, *, one_line: bool = True) -> str:
    """Exit status 2, no traceback, and the error on one stderr line; return that line (or all of it)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("[")]
    assert lines and lines[0].startswith("trt-bridge convert: error: "), result.stderr
    if one_line:
        assert len(lines) == 1, result.stderr
        return lines[0]
    return "\n".join(lines)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """A small conv net (float and quantize_dynamic'ed) with calibration data, built once."""
    root = tmp_path_factory.mktemp("cli-corpus")
    float_path = save(conv_net(channels=(8, 16)), root / "float.onnx")
    quant_path = quantize_dynamic(float_path, root / "model.onnx")
    feeds = image_feeds(CALIB_FEEDS, seed=0)  # [4, 1, 3, 32, 32]: one feed per index of axis 0
    np.savez(root / "calib.npz", x=feeds)
    return {"float": float_path, "quant": quant_path, "calib": root / "calib.npz", "feeds": feeds}


@pytest.fixture
def model(corpus, tmp_path) -> Path:
    """A private copy of the quantized model (outputs are written beside it)."""
    return Path(shutil.copy(corpus["quant"], tmp_path / "model.onnx"))


# ---------------------------------------------------------------- help and version


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_help_works_and_is_fast(entry):
    start = time.perf_counter()
    result = cli("--help", entry=entry)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert "usage: trt-bridge" in result.stdout and "convert" in result.stdout
    assert elapsed < 3.0, f"--help took {elapsed:.2f} s"

    sub = cli("convert", "--help", entry=entry)
    assert sub.returncode == 0
    for flag in ("--calib-data", "--calib-random", "--calib-method", "--report", "--json", "-o"):
        assert flag in sub.stdout


def _imported(*args: str) -> set[str]:
    result = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("command", ["convert", "check", "verify", "build", "bench", "pipeline", "scales"])
def test_a_subcommands_help_imports_nothing_heavy(command):
    """`trt-bridge COMMAND --help` imports the command's arguments (cli/COMMAND_args.py), not the command: no onnx,
    numpy, onnx-graphsurgeon, onnxruntime or TensorRT (measured: 0.10-0.13 s each, from 0.45-0.83 s)."""
    from trt_bridge.cli.commands import COMMANDS, arguments_module

    # sys.modules as the command exits (-X importtime does not see a module importlib.import_module loads)
    code = ("import sys\nfrom trt_bridge.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sys.modules), file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code, command, "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and f"usage: trt-bridge {command}" in result.stdout, result.stderr
    imported = set(result.stderr.split()) - _imported("-c", "pass")  # less cuda-python's .pth import of `cuda`
    assert arguments_module(command) in imported
    heavy = sorted(m for m in imported if m.split(".")[0] in ("onnx", "numpy", "onnx_graphsurgeon", *HEAVY))
    assert not heavy, f"{command} --help imported {heavy}"
    assert COMMANDS[command][0] not in imported  # the command's own module: only once it runs


def test_top_level_help_imports_no_subcommand_and_neither_onnx_nor_numpy():
    """`trt-bridge --help` lists every subcommand from the command table (cli/commands.py) without importing one."""
    from trt_bridge.cli.commands import COMMANDS

    imported = _imported("-m", "trt_bridge", "--help") - _imported("-c", "pass")
    assert "trt_bridge.cli" in imported and "trt_bridge.cli.commands" in imported
    assert not {m for m in imported if m.split(".")[0] in ("onnx", "numpy", "onnx_graphsurgeon", *HEAVY)}
    assert not {module for module, _ in COMMANDS.values()} & imported
    listed = cli("--help").stdout
    assert all(name in listed for name in COMMANDS)
    chosen = cli("check", "--help")  # the chosen subcommand is built whole
    assert chosen.returncode == 0 and "--costs" in chosen.stdout


def test_importing_the_cli_and_building_the_parser_stays_light():
    def loaded(code: str) -> set[str]:
        result = subprocess.run([sys.executable, "-c", code + "print('\\n'.join(sorted(sys.modules)))"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return set(result.stdout.split())

    modules = loaded("import sys, trt_bridge.cli as c; c.build_parser(); ")
    assert "trt_bridge.cli.convert_args" in modules
    modules -= loaded("import sys; ")  # the interpreter's own start-up (cuda-python's .pth imports `cuda`)
    assert not {m for m in modules if m.split(".")[0] in HEAVY}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_version(entry):
    result = cli("--version", entry=entry)
    assert result.returncode == 0
    assert result.stdout.strip() == f"trt-bridge {trt_bridge.__version__}"


# ---------------------------------------------------------------- successful conversions


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_convert_with_npz_prints_summary(entry, corpus, model, tmp_path):
    out = tmp_path / "out.onnx"
    result = cli("convert", model, "--int8", "-o", out, "--calib-data", corpus["calib"], "--calib-method", "percentile",
                 entry=entry)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"converted {model} -> {out}" in result.stdout
    assert "rule dynamic-integer-op: 4 node(s)" in result.stdout
    assert "quantized: 4 activation(s), 4 weight(s)" in result.stdout
    assert f"calibration: {CALIB_FEEDS} feed(s), method percentile" in result.stdout

    assert_qdq_contract(out)
    feeds = [{"x": f} for f in image_feeds(3, seed=1)]
    reference, converted = run_ort(corpus["float"], feeds), run_ort(out, feeds)
    assert converted[0].shape == (1, 10)
    assert snr_db(reference, converted) > 15.0


def test_json_output_parses_and_lists_quantized_tensors(corpus, model, tmp_path):
    out = tmp_path / "out.onnx"
    result = cli("convert", model, "-o", out, "--calib-data", corpus["calib"], "--json", "--calib-method", "mse")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # stdout is the JSON and nothing else
    assert Path(report["output"]) == out.resolve()
    kinds = [q["kind"] for q in report["quantized"]]
    assert kinds.count("activation") == 4 and kinds.count("weight") == 4
    assert {"tensor", "scale", "source"} <= set(report["quantized"][0])
    assert all(q["scale"] for q in report["quantized"])
    assert report["calibration"]["feeds"] == CALIB_FEEDS and report["calibration"]["method"] == "mse"
    assert "converted" not in result.stdout


def test_report_is_written_as_json(corpus, model, tmp_path):
    out, report_path = tmp_path / "out.onnx", tmp_path / "reports" / "report.json"
    result = cli("convert", model, "-o", out, "--calib-data", corpus["calib"], "--report", report_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["input"] == str(model) and Path(report["output"]) == out.resolve()
    assert len(report["quantized"]) == 8
    assert report["rules"][0]["rule"] == "dynamic-integer-op" and len(report["rules"][0]["nodes"]) == 4
    assert "converted" in result.stdout  # the summary is still printed


def test_default_output_path_is_beside_the_input(corpus, model, tmp_path):
    result = cli("convert", model, "--calib-data", corpus["calib"], "-q")
    assert result.returncode == 0, result.stderr
    expected = tmp_path / "model.int8.onnx"
    assert expected.is_file()
    assert result.stdout == ""  # -q: no summary
    onnx.checker.check_model(onnx.load(str(expected)), full_check=True)


def test_input_model_is_not_modified(corpus, model, tmp_path):
    before = model.read_bytes()
    result = cli("convert", model, "-o", tmp_path / "out.onnx", "--calib-data", corpus["calib"])
    assert result.returncode == 0, result.stderr
    assert model.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "out.onnx"]  # no temp files left


def test_refuses_to_overwrite_the_input(corpus, model, tmp_path):
    before = model.read_bytes()
    (tmp_path / "sub").mkdir()
    for output in (model, tmp_path / "sub" / ".." / "model.onnx"):
        msg = error_message(cli("convert", model, "-o", output, "--calib-data", corpus["calib"]))
        assert "is the input model" in msg and "-o" in msg
    assert model.read_bytes() == before


def test_conversion_is_deterministic(corpus, model, tmp_path):
    outputs = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    for out in outputs:
        result = cli("convert", model, "-o", out, "--calib-data", corpus["calib"], "-q")
        assert result.returncode == 0, result.stderr
    assert outputs[0].read_bytes() == outputs[1].read_bytes()


def save_external(model: onnx.ModelProto, path: Path) -> Path:
    """Save with every initializer in ``<name>.data`` (rewritten as raw_data first: onnx only
    moves raw_data tensors out, and quantize_dynamic writes small scales as float_data)."""
    for i, init in enumerate(model.graph.initializer):
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init), init.name))
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)
    return path


def test_model_with_external_data_converts(corpus, tmp_path):
    src = save_external(onnx.load(str(corpus["quant"])), tmp_path / "ext.onnx")
    loaded = onnx.load(str(src), load_external_data=False)
    assert loaded.graph.initializer and all(
        i.data_location == TensorProto.EXTERNAL for i in loaded.graph.initializer)
    out = tmp_path / "out" / "ext.int8.onnx"
    result = cli("convert", src, "-o", out, "--calib-data", corpus["calib"])
    assert result.returncode == 0, result.stderr
    converted = assert_qdq_contract(out)
    assert converted.graph.initializer
    [y] = run_ort(out, [{"x": corpus["feeds"][0]}])
    assert y.shape == (1, 10) and np.isfinite(y).all()


# ---------------------------------------------------------------- error paths


def test_missing_model_file(tmp_path):
    missing = tmp_path / "nope.onnx"
    msg = error_message(cli("convert", missing, "--calib-random", "1"))
    assert str(missing) in msg and "no such file" in msg


def test_file_that_is_not_onnx(tmp_path):
    bogus = tmp_path / "model.onnx"
    bogus.write_text("this is not an ONNX model\n")
    msg = error_message(cli("convert", bogus, "--calib-random", "1"))
    assert str(bogus) in msg and "not a readable ONNX model" in msg


def test_external_data_file_missing(corpus, tmp_path):
    src = save_external(onnx.load(str(corpus["quant"])), tmp_path / "ext.onnx")
    (tmp_path / "ext.onnx.data").unlink()
    msg = error_message(cli("convert", src, "--calib-data", corpus["calib"]))
    assert str(src) in msg and "external data" in msg and "'ext.onnx.data'" in msg and "missing" in msg


def test_npz_naming_an_unknown_input(model, tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, image=image_feeds(2, seed=0))
    msg = error_message(cli("convert", model, "--calib-data", calib))
    assert "'image' is not an input of the model" in msg and "inputs are: x" in msg


def test_calibration_data_with_the_wrong_shape(model, tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.zeros((2, 1, 3, 16, 16), np.float32))
    msg = error_message(cli("convert", model, "--calib-data", calib))
    assert "'x'" in msg and "[N, 3, 32, 32]" in msg and "[1, 3, 16, 16]" in msg


def test_calibration_data_with_the_wrong_rank(model, tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.zeros((3, 32, 32), np.float32))
    msg = error_message(cli("convert", model, "--calib-data", calib))
    assert "'x'" in msg and "[N, 3, 32, 32]" in msg and "[3, 32, 32]" in msg


def test_dynamic_model_without_calibration_data(model):
    """Its activations keep the ranges the source computed per inference; with --runtime-ranges off it needs data."""
    msg = error_message(cli("convert", model, "--runtime-ranges", "off"))
    assert "no static scale" in msg and "--calib-data" in msg and "--runtime-ranges off" in msg
    done = cli("convert", model, "--skip-check")
    assert done.returncode == 0 and "runtime ranges:" in done.stdout, done.stderr
    out = model.with_name(model.stem + ".int8.onnx")
    feeds = [{"x": f} for f in image_feeds(4, seed=6)]
    simulated = session(out, simulate_qdq=True)
    assert snr_db(run_exact(model, feeds), [simulated.run(None, f)[0] for f in feeds]) > 30
    assert_tensorrt_ready(out)


def test_both_calib_data_and_calib_random(corpus, model):
    msg = error_message(cli("convert", model, "--calib-data", corpus["calib"], "--calib-random", "2"))
    assert "not both" in msg


def test_missing_calibration_data(model, tmp_path):
    msg = error_message(cli("convert", model, "--calib-data", tmp_path / "none.npz"))
    assert "none.npz" in msg and "not found" in msg


#   A[N,4]:uint8 (a plain graph input, not from DynamicQuantizeLinear) ─┐
#   B[4,3]:int8 (initializer) ───────────────────────────── MatMulInteger 'mmi' ─ Cast(float) ─ y[N,3]
def integer_input_model() -> onnx.ModelProto:
    b = numpy_helper.from_array(np.arange(-6, 6, dtype=np.int8).reshape(4, 3), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["acc"], "mmi"),
         helper.make_node("Cast", ["acc"], ["y"], "to_float", to=TensorProto.FLOAT)],
        "integer_input", [helper.make_tensor_value_info("A", TensorProto.UINT8, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], [b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_unsupported_pattern_names_the_node(tmp_path):
    src = save(integer_input_model(), tmp_path / "int_input.onnx")
    msg = error_message(cli("convert", src), one_line=False)
    first, *rest = msg.splitlines()
    assert str(src) in first and "could not be rewritten" in first
    assert any("MatMulInteger 'mmi'" in line and "'A'" in line for line in rest), msg
    assert not (tmp_path / "int_input.int8.onnx").exists()


def test_a_tensor_nobody_produces_is_named_with_its_reader(tmp_path):
    """A node reading a tensor nobody produces: the node and the tensor, not a stack trace from the lift."""
    graph = helper.make_graph([helper.make_node("Relu", ["ghost"], ["y"], "relu")], "broken",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "broken.onnx")
    msg = error_message(cli("convert", src, "--calib-random", "1"))
    assert str(src) in msg and "node 'relu' (Relu) reads 'ghost', which no node" in msg


def test_model_whose_types_no_cast_can_reconcile(tmp_path):
    """And(bool, float): no type And accepts holds a float, so convert names the node, the inputs and their types."""
    graph = helper.make_graph([helper.make_node("And", ["b", "x"], ["y"], "and")], "mixed",
                              [helper.make_tensor_value_info("b", TensorProto.BOOL, [2]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, [2])])
    src = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "mixed.onnx")
    msg = error_message(cli("convert", src, "--calib-random", "1"))
    assert msg == (f"trt-bridge convert: error: {src}: And 'and' reads 'b' bool, 'x' float32, and no type that And "
                   "accepts (bool) holds them all. Fix the exporter (cast the inputs explicitly before this op) and "
                   "re-export.")


@pytest.mark.parametrize("where", ["output-under-a-file", "output-is-a-directory", "report-under-a-file"])
def test_unwritable_output_or_report_fails_before_any_work(corpus, model, tmp_path, where):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = {"output-under-a-file": ["-o", blocker / "out.onnx"],
            "output-is-a-directory": ["-o", tmp_path],
            "report-under-a-file": ["--report", blocker / "report.json"]}[where]
    msg = error_message(cli("convert", model, "--calib-data", corpus["calib"], *args))
    assert "cannot write" in msg or "is a directory" in msg
    assert str(args[1]) in msg or str(blocker) in msg
    assert not (tmp_path / "model.int8.onnx").exists()  # failed before converting


def test_bad_regular_expression_is_named(model, corpus):
    msg = error_message(cli("convert", model, "--calib-data", corpus["calib"], "--exclude-nodes", "conv[("))
    assert "--exclude-nodes 'conv[('" in msg and "not a regular expression" in msg


def test_scales_data_needs_calibration_data(model):
    msg = error_message(cli("convert", model, "--scales", "data"))
    assert "--scales data" in msg and "--calib-data" in msg


def test_float_model_converts_through_the_cli(corpus, tmp_path):
    out = tmp_path / "float.int8.onnx"
    result = cli("convert", corpus["float"], "-o", out, "--calib-data", corpus["calib"], "--exclude-nodes", "^fc",
                 "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["placement"] == "tensorrt" and report["quantized"]
    assert all("fc" not in c for q in report["quantized"] for c in q["consumers"])
    assert_qdq_contract(out)
