"""The Python API (trt_bridge.convert, check, verify, build): the CLI's commands with its flags as keywords, the
same reports (``to_dict()`` is ``--json``'s content), the same refusals raised as trt_bridge errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from helpers import quantize_dynamic, run_ort, save, snr_db

import trt_bridge
from trt_bridge import samples


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """float.onnx (conv_net), model.onnx (its quantize_dynamic form), calib.npz (6 feeds), model.trt.onnx (converted
    once through the API, with a report file)."""
    root = tmp_path_factory.mktemp("api")
    fpath = save(samples.conv_net(), root / "float.onnx")
    quantize_dynamic(fpath, root / "model.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(6, seed=1))
    report = trt_bridge.convert(root / "model.onnx", root / "model.trt.onnx", calib_data=root / "calib.npz",
                                quiet=True, report=root / "report.json")
    return root, report


def _held_out_snr(root, path) -> float:
    held_out = [{"x": f} for f in samples.image_feeds(8, seed=2)]
    return snr_db(run_ort(root / "float.onnx", held_out), run_ort(path, held_out))


def test_exports_are_lazy_and_listed():
    code = "import sys, trt_bridge; print(sorted(m for m in ('onnx', 'numpy', 'trt_bridge.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert {"convert", "check", "verify", "build", "TrtBridgeError", "OptionError"} <= set(trt_bridge.__all__)
    assert {"convert", "check", "verify", "build"} <= set(dir(trt_bridge))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        trt_bridge.nothing  # noqa: B018


def test_verify_is_the_function_even_after_its_package_is_imported():
    import trt_bridge.verification  # noqa: F401 - the package that once was trt_bridge.verify

    assert callable(trt_bridge.verify) and trt_bridge.verify.__module__ == "trt_bridge.api"


def test_convert_writes_the_model_and_returns_the_report(workdir):
    root, report = workdir
    assert (root / "model.trt.onnx").is_file() and not report.remaining_blockers
    data = json.loads(json.dumps(report.to_dict()))
    assert data["quantized"] and data == json.loads((root / "report.json").read_text())
    assert _held_out_snr(root, root / "model.trt.onnx") > 28


def test_check_returns_the_findings(workdir):
    root, _ = workdir
    source = trt_bridge.check(root / "model.onnx", trt="off", costs="off")
    assert not source.ready and {f.rule for f in source.blockers} >= {"no-importer"}
    ready = trt_bridge.check(str(root / "model.trt.onnx"), trt="off", costs="off", json=root / "check.json")
    assert ready.ready and json.loads(json.dumps(ready.to_dict()))["ready"] is True
    assert json.loads((root / "check.json").read_text())["ready"] is True


def test_verify_with_numpy_feeds(workdir):
    root, _ = workdir
    feeds = [{"x": f} for f in samples.image_feeds(4, seed=3)]
    report = trt_bridge.verify(root / "float.onnx", root / "model.trt.onnx", data=feeds, min_snr=[20], costs="off",
                               quiet=True)
    assert report.passed and report.outputs[0].output == "logits"
    assert json.loads(json.dumps(report.to_dict()))["passed"] is True
    stacked = {"x": samples.image_feeds(4, seed=3)}  # one array per input, a feed per index of axis 0
    stacked = trt_bridge.verify(root / "float.onnx", root / "model.trt.onnx", data=stacked, min_snr="logits=20",
                                costs="off", quiet=True)
    assert stacked.passed


def test_model_proto_in_memory_and_numpy_calibration(tmp_path, workdir):
    root, _ = workdir
    model = onnx.load(root / "model.onnx")
    report = trt_bridge.convert(model, tmp_path / "out.onnx", calib_data={"x": samples.image_feeds(6, seed=1)},
                                quiet=True, skip_check=True, give_back=False, calib_method="max")
    assert report.calibration["method"] == "max"
    assert _held_out_snr(root, tmp_path / "out.onnx") > 28
    assert trt_bridge.check(onnx.load(tmp_path / "out.onnx"), trt="off", costs="off").ready
    with pytest.raises(trt_bridge.OptionError, match="give the output path"):
        trt_bridge.convert(model)


@pytest.mark.parametrize("argv, kwargs", [
    (["--calib-method", "best"], {"calib_method": "best"}),
    (["--percentile", "101"], {"percentile": 101}),
    (["--calib-max", "x"], {"calib_max": "x"}),
    (["--scales", "model", "--scales", "data"], {"scales": ["model", "data"]}),
])
def test_a_bad_option_raises_the_clis_message(workdir, argv, kwargs):
    root, _ = workdir
    with pytest.raises(trt_bridge.TrtBridgeError) as raised:
        trt_bridge.convert(root / "model.onnx", root / "never.onnx", calib_data=root / "calib.npz", **kwargs)
    cli = subprocess.run([sys.executable, "-m", "trt_bridge", "convert", "model.onnx", "-o", "never.onnx",
                          "--calib-data", "calib.npz", *argv], cwd=root, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and str(raised.value) in cli.stderr, (str(raised.value), cli.stderr)
    assert not (root / "never.onnx").exists()


def test_an_unknown_keyword_names_the_options(workdir):
    root, _ = workdir
    with pytest.raises(TypeError, match="'calib_dat'.*calib_data") as raised:
        trt_bridge.convert(root / "model.onnx", root / "never.onnx", calib_dat="calib.npz")
    assert isinstance(raised.value, trt_bridge.OptionError)
    with pytest.raises(trt_bridge.OptionError, match="takes True or False"):
        trt_bridge.convert(root / "model.onnx", root / "never.onnx", skip_check="yes")


def test_build_ahead_of_time(workdir, tmp_path):
    if importlib.util.find_spec("tensorrt_rtx") is None:
        pytest.skip("ahead-of-time builds need TensorRT-RTX (pip install 'trt-bridge[rtx]')")
    root, _ = workdir
    result = trt_bridge.build(root / "model.trt.onnx", tmp_path / "model.engine", compute_capability="8.9",
                              shapes="x:1x3x32x32", quiet=True, json=tmp_path / "build.json")
    assert (tmp_path / "model.engine").stat().st_size > 0 and result.info["tensorrt"]["module"] == "tensorrt_rtx"
    assert json.loads(json.dumps(result.to_dict())) == json.loads((tmp_path / "build.json").read_text())


def test_an_fp8_conversion_prints_nothing_of_graphsurgeon(tmp_path, capfd):
    """onnx-graphsurgeon warns on stdout about FP8 constants (a type numpy lacks) that trt-bridge reads on purpose;
    the API keeps them to errors while it works, as the CLI does, and restores the caller's level."""
    from onnx_graphsurgeon.logger import G_LOGGER

    source = save(samples.conv_net(), tmp_path / "float.onnx")
    before = G_LOGGER.severity
    report = trt_bridge.convert(source, tmp_path / "out.onnx", fp8=True, calib_random=2, quiet=True)
    assert {q["format"] for q in report.quantized} == {"fp8"}
    assert "[W]" not in capfd.readouterr().out and G_LOGGER.severity == before
