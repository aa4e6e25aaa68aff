"""``trt-bridge build``: engines built ahead of time with TensorRT-RTX for SM 8.9 (no GPU needed) from converted
fixtures, their sidecars, profiles, the timing cache, and clear errors for a model TensorRT rejects, for flags
the installed TensorRT lacks and for a missing TensorRT. Engine runs are in tests/gpu/test_build_gpu.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import subprocess
import sys
from datetime import datetime

import numpy as np
import pytest
from helpers import assert_tensorrt_ready, quantize_dynamic, run_ort, save, snr_db
from onnx import TensorProto, helper, numpy_helper
from test_cli import cli

from trt_bridge import __version__, samples
from trt_bridge.checks.findings import parser_findings
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.tensorrt.build import EngineBuildError, ModelRejectedError, build
from trt_bridge.tensorrt.options import BuildOptions
from trt_bridge.tensorrt.profiles import Profile, parse_shapes
from trt_bridge.tensorrt.sidecar import read_sidecar

pytest.importorskip("tensorrt_rtx", reason="ahead-of-time builds need TensorRT-RTX (pip install 'trt-bridge[rtx]')")

SM89 = BuildOptions(compute_capabilities=("8.9",), progress=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """conv_net (dynamic batch N) quantized by onnxruntime (rejected by TensorRT) and converted by trt-bridge."""
    root = tmp_path_factory.mktemp("build")
    fpath = save(samples.conv_net(channels=(8, 16)), root / "float.onnx")
    dynamic = quantize_dynamic(fpath, root / "dynamic.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(4, 0))
    converted = root / "converted.onnx"
    convert(dynamic, converted, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")),
                                               progress=False, check=False))
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    # measured 19.8 dB (38.4 on the 4 calibration inputs; the source itself: 36.3): the held-out inputs reach
    # past the calibrated range of fc's 16-wide input, which static INT8 then clips
    assert snr_db(run_ort(fpath, held_out), run_ort(converted, held_out)) > 17
    assert_tensorrt_ready(converted)
    return {"dynamic": dynamic, "converted": converted}


def _reshape_to_1x4(tmp_path):
    """x[N,4] ─ Reshape([1,4]) ─ y: builds only for profiles whose every shape has N = 1, so whether TensorRT's
    builder accepts it shows which shapes reached it."""
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"], "reshape")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.array([1, 4], np.int64), "s")])
    return save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "reshape.onnx")


def test_engine_and_sidecar_ahead_of_time_for_sm89(models, tmp_path):
    model = models["converted"]
    before = model.read_bytes()
    result = build(model, tmp_path / "out" / "model.engine", SM89)

    engine = tmp_path / "out" / "model.engine"
    assert result.engine == str(engine) and result.sidecar == f"{engine}.json" and result.seconds > 0
    data = engine.read_bytes()
    assert len(data) > 0 and model.read_bytes() == before
    assert [p.name for p in engine.parent.iterdir() if p.name.startswith(".")] == []  # no temporary files left
    info = read_sidecar(engine)
    assert info == result.info == json.loads(result.to_json())["info"]
    assert info["trt_bridge_version"] == __version__
    assert info["tensorrt"]["module"] == "tensorrt_rtx" and info["tensorrt"]["version"]
    assert info["target"]["compute_capabilities"] == ["8.9"] and info["target"]["device"] is None
    assert info["model"] == {"path": str(model.resolve()), "sha256": hashlib.sha256(before).hexdigest(),
                             "size": len(before), "external_data": []}
    assert info["engine"]["sha256"] == hashlib.sha256(data).hexdigest() and info["engine"]["size"] == len(data)
    assert info["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 3, 32, 32]}]
    assert info["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}]
    assert info["profiles"] == [{"x": {"min": [1, 3, 32, 32], "opt": [1, 3, 32, 32], "max": [1, 3, 32, 32]}}]
    assert info["flags"]["strongly_typed"] is True and info["flags"]["precision_flags"] == []
    assert info["timing_cache"] is None and info["build_seconds"] > 0
    created = datetime.fromisoformat(info["created"].replace("Z", "+00:00"))
    assert created.utcoffset().total_seconds() == 0


def test_profiles_from_the_cli_are_honoured(models, tmp_path):
    engine = tmp_path / "two-profiles.engine"
    result = cli("build", models["converted"], "-o", engine, "--compute-capability", "8.9", "-q",
                 "--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:4x3x32x32", "--max-shapes", "x:[8,3,32,32]",
                 "--min-shapes", "x:16x3x32x32", "--opt-shapes", "x:16x3x32x32", "--max-shapes", "x:32x3x32x32")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # -q: errors only
    assert read_sidecar(engine)["profiles"] == [
        {"x": {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}},
        {"x": {"min": [16, 3, 32, 32], "opt": [16, 3, 32, 32], "max": [32, 3, 32, 32]}}]

    # the shapes reach TensorRT's builder: N = 1 builds, N = 2 is rejected by it, naming the shape
    reshape = _reshape_to_1x4(tmp_path)
    assert build(reshape, tmp_path / "n1.engine", BuildOptions(profiles=(Profile.fixed({"x": (1, 4)}),),
                                                                compute_capabilities=("8.9",), progress=False))
    with pytest.raises(EngineBuildError, match=r"TensorRT's builder \(tensorrt_rtx .*Reshaping \[2,4\] to \[1,4\]"):
        build(reshape, tmp_path / "n2.engine", BuildOptions(profiles=(Profile.fixed({"x": (2, 4)}),),
                                                             compute_capabilities=("8.9",), progress=False))
    assert not (tmp_path / "n2.engine").exists() and not (tmp_path / "n2.engine.json").exists()


def test_several_compute_capabilities_and_one_tensorrt_rtx_lacks(models, tmp_path):
    result = build(models["converted"], tmp_path / "m.engine",
                   BuildOptions(compute_capabilities=("SM89", "12.0", "8.9"), progress=False))
    assert result.info["target"]["compute_capabilities"] == ["8.9", "12.0"]
    assert result.info["target"]["description"] == "compute capabilities 8.9, 12.0"
    with pytest.raises(TrtBridgeError) as error:
        build(models["converted"], tmp_path / "h100.engine", BuildOptions(compute_capabilities=("9.0",)))
    message = str(error.value)
    assert message.startswith("--compute-capability 9.0: tensorrt_rtx ") and "cannot build for compute capability " \
        "9.0 (Hopper, 9.0, is a datacenter GPU: build on it with datacenter TensorRT); it builds for " in message
    assert "8.9" in message.rsplit("builds for", 1)[1]
    with pytest.raises(TrtBridgeError, match="'ampere' is not a compute capability such as 8.9"):
        build(models["converted"], tmp_path / "x.engine", BuildOptions(compute_capabilities=("ampere",)))


def test_timing_cache_is_saved_and_reused(models, tmp_path):
    cache = tmp_path / "ci" / "timing.cache"
    args = ("build", models["converted"], "-o", tmp_path / "m.engine", "--compute-capability", "8.9",
            "--timing-cache", cache, "--json")
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    saved = json.loads(first.stdout)["info"]["timing_cache"]
    assert cache.is_file() and saved["saved_bytes"] == cache.stat().st_size > 0 and saved["loaded_bytes"] == 0
    content = cache.read_bytes()

    second = cli(*args)
    assert second.returncode == 0, second.stderr
    reused = json.loads(second.stdout)["info"]["timing_cache"]
    assert reused["loaded_bytes"] == len(content) and reused["path"] == str(cache.resolve())
    assert cache.read_bytes() == content  # TensorRT-RTX's timing cache is a no-op: the file is kept as it is
    assert reused["effective"] is False and read_sidecar(tmp_path / "m.engine")["timing_cache"] == reused


def test_a_model_tensorrt_rejects_lists_the_parser_findings(models, tmp_path):
    with pytest.raises(ModelRejectedError) as error:
        build(models["dynamic"], tmp_path / "api.engine", SM89)
    assert {(f.rule, f.op) for f in parser_findings(error.value.errors)} == {
        ("no-importer", "DynamicQuantizeLinear"), ("no-importer", "ConvInteger"), ("no-importer", "MatMulInteger")}

    engine = tmp_path / "dynamic.engine"
    result = cli("build", models["dynamic"], "-o", engine, "--compute-capability", "8.9")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == (f"trt-bridge build: error: {models['dynamic']}: TensorRT's ONNX parser (tensorrt_rtx "
                        f"{error.value.args[0].split('tensorrt_rtx ')[1].split(')')[0]}) rejects the model "
                        "(8 finding(s)):")
    assert lines[1] == "  [no-importer] DynamicQuantizeLinear 'x_QuantizeLinear': UNSUPPORTED_NODE: no importer for " \
                       "this op"
    assert "  [no-importer] MatMulInteger 'fc_quant': UNSUPPORTED_NODE: no importer for this op" in lines
    assert lines[-1].startswith(f"  `trt-bridge check {models['dynamic']}` says what convert does about each")
    assert not engine.exists() and not (tmp_path / "dynamic.engine.json").exists()

    as_json = cli("build", models["dynamic"], "-o", engine, "--compute-capability", "8.9", "--json")
    data = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and data["engine"] is None and len(data["findings"]) == 8
    assert data["findings"][0]["severity"] == "blocker" and data["findings"][0]["node"] == "x_QuantizeLinear"


def test_missing_tensorrt_is_a_clear_error(models, tmp_path):
    """Without TensorRT: an import that fails the way a missing package does (Python's documented
    ``sys.modules[name] = None``), in a subprocess running the real entry point."""
    code = ("import sys; sys.modules['tensorrt'] = sys.modules['tensorrt_rtx'] = None; "
            "from trt_bridge.cli import main; sys.exit(main(sys.argv[1:]))")
    engine = tmp_path / "m.engine"
    result = subprocess.run([sys.executable, "-c", code, "build", str(models["converted"]), "-o", str(engine)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "trt-bridge build: error: TensorRT is not installed. On any machine: pip install 'trt-bridge[rtx]' "
        "(TensorRT-RTX: parse and build ahead of time); on a GPU machine with datacenter TensorRT: pip install "
        "'trt-bridge[trt]'.")
    assert not engine.exists()

    absent = [m for m in ("tensorrt", "tensorrt_rtx") if importlib.util.find_spec(m) is None]
    if absent:  # the module asked for by name is not installed
        with pytest.raises(MissingDependencyError, match=rf"^{absent[0]} is not installed \(it was asked for by "
                                                         r"name\)\. Install it: pip install 'trt-bridge\["):
            build(models["converted"], engine, BuildOptions(module=absent[0], progress=False))


@pytest.mark.parametrize(("args", "message"), [
    (("--shapes", "x:1x4x32x32"), "{model}: profile 1 gives input 'x' the min shape [1, 4, 32, 32], but the model "
                                  "fixes dimension 1 at 3 ([?, 3, 32, 32])."),
    (("--shapes", "y:1x3"), "{model}: profile 1 names 'y', which is not an input of the model; its inputs are: "
                            "x [?, 3, 32, 32]."),
    (("--min-shapes", "x:1x3x32x32", "--opt-shapes", "x:4x3x32x32"),
     "--min-shapes 1 time(s), --opt-shapes 1 time(s), --max-shapes 0 time(s): each profile needs all three (the "
     "i-th of each form profile i)."),
    (("--min-shapes", "x:8x3x32x32", "--opt-shapes", "x:4x3x32x32", "--max-shapes", "x:8x3x32x32"),
     "{model}: profile 1 gives input 'x' min [8, 3, 32, 32], opt [4, 3, 32, 32], max [8, 3, 32, 32]: every "
     "dimension needs min <= opt <= max."),
    (("--weakly-typed",), "--weakly-typed: tensorrt_rtx {version} builds strongly typed networks only"),
    (("--hardware-compatibility", "ampere+"), "--hardware-compatibility ampere+: TensorRT-RTX has no "
                                              "hardware-compatibility levels"),
    (("--builder-optimization-level", "9"), "--builder-optimization-level 9: TensorRT takes 0 to 5"),
    (("-o", "{model}"), "the engine {model} would overwrite the model {model}; choose another path."),
], ids=["fixed-dim", "unknown-input", "incomplete-trio", "min-over-opt", "weakly-typed", "hardware-compat",
        "opt-level", "overwrite-model"])
def test_usage_errors_exit_2_before_building(models, tmp_path, args, message):
    import tensorrt_rtx

    model = models["converted"]
    before = model.read_bytes()
    args = tuple(a.format(model=model) for a in args)
    output = () if "-o" in args else ("-o", tmp_path / "m.engine")
    result = cli("build", model, *output, "--compute-capability", "8.9", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("trt-bridge build: error: " + message.format(model=model,
                                                                                version=tensorrt_rtx.__version__))
    assert model.read_bytes() == before and not (tmp_path / "m.engine").exists()


def test_version_compatible_on_tensorrt_rtx_says_why_it_fails(models, tmp_path):
    """TensorRT-RTX 1.7 has the VERSION_COMPATIBLE flag but no lean runtime to embed."""
    try:
        result = build(models["converted"], tmp_path / "vc.engine", BuildOptions(
            compute_capabilities=("8.9",), version_compatible=True, workspace=1 << 28, progress=False))
    except EngineBuildError as error:
        assert "drop --version-compatible" in str(error)
        assert not (tmp_path / "vc.engine").exists()
    else:  # a TensorRT-RTX that builds them
        assert result.info["flags"]["version_compatible"] is True


def test_progress_monitor_reports_the_builder_phases(models, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="trt_bridge.tensorrt")
    result = build(models["converted"], tmp_path / "m.engine", BuildOptions(
        compute_capabilities=("8.9",), optimization_level=1, workspace=256 << 20, progress=True))
    phases = [r.getMessage() for r in caplog.records if r.getMessage().startswith("TensorRT phase: ")]
    assert phases[0].startswith("TensorRT phase: Building engine (") and len(phases) > 3
    assert result.info["flags"]["builder_optimization_level"] == 1
    assert result.info["flags"]["workspace"] == 256 << 20


def test_parse_shapes():
    assert parse_shapes(["x:1x3x224x224"]) == {"x": (1, 3, 224, 224)}
    assert parse_shapes(["x:[1,3,224,224]", "mask:1x128,ids:[1, 128]"]) == {
        "x": (1, 3, 224, 224), "mask": (1, 128), "ids": (1, 128)}
    assert parse_shapes(["input:0:2X4", "scalar:[]"]) == {"input:0": (2, 4), "scalar": ()}
    for bad in ("x", "x:", "x:1x-3", "x:1xa", ":1x3", "x:[1,3"):
        with pytest.raises(TrtBridgeError, match=r"is not NAME:DIMS \(e\.g\. x:1x3x224x224 or x:\[1,3,224,224\]"):
            parse_shapes([bad])
    with pytest.raises(TrtBridgeError, match=r"input 'x' is given two shapes \(\[1, 3\] and \[2, 3\]\)"):
        parse_shapes(["x:1x3,x:2x3"])


def test_read_sidecar_of_an_engine_without_one(tmp_path):
    engine = tmp_path / "foreign.engine"
    engine.write_bytes(b"\0")
    with pytest.raises(TrtBridgeError, match=r"foreign\.engine: no sidecar .*foreign\.engine\.json\. The engine was "
                                             "not built by `trt-bridge build`"):
        read_sidecar(engine)
