"""On a GPU runner (TRT_BRIDGE_GPU=1): `bench` deserializes and runs engines with cuda-python, its
outputs are Polygraphy's TrtRunner's on the same inputs (plain enqueues and the captured CUDA graph),
and its timings behave: statistics ordered, copies timed only with --transfers include, --duration,
--shapes against the optimization profile, resources freed, the CLI with engines and ONNX side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from helpers import run_ort, save, snr_db
from onnx import TensorProto, helper

from trt_bridge import samples
from trt_bridge.bench import BenchOptions, bench
from trt_bridge.bench.engine_runner import EngineRunner
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.tensorrt import import_tensorrt, is_rtx
from trt_bridge.tensorrt.build import build_engine

pytestmark = pytest.mark.gpu

BIG = (8, 3, 512, 512)  # 25 MB in, 25 MB out: copies dwarf the kernel


def relu_model() -> onnx.ModelProto:
    """x[8,3,512,512] ─ Relu ─ y: almost no compute, large transfers."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], "relu")], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(BIG))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(BIG))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Float and int8 engines of the conv net (batch 1), a batch-4 engine, and the Relu engine."""
    if is_rtx(import_tensorrt()):
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
    root = tmp_path_factory.mktemp("bench-gpu")
    fpath = save(samples.conv_net(), root / "float.onnx")
    np.savez(root / "calib.npz", x=samples.image_feeds(16, 1))
    int8 = root / "int8.onnx"
    convert(fpath, int8, ConvertOptions(calibration=CalibrationOptions(data=str(root / "calib.npz")), progress=False))
    relu = save(relu_model(), root / "relu.onnx")
    paths = {"root": root, "float.onnx": fpath, "int8.onnx": int8, "relu.onnx": relu}
    builds = (("float", fpath, None), ("int8", int8, None), ("batch4", fpath, {"x": (4, 3, 32, 32)}),
              ("relu", relu, None))
    for name, model, shapes in builds:
        paths[f"{name}.engine"] = root / f"{name}.engine"
        paths[f"{name}.engine"].write_bytes(build_engine(model, compute_capability=None, shapes=shapes))
    return paths


def assert_ordered(stats) -> None:
    assert 0 < stats.min <= stats.median <= stats.p90 <= stats.p95 <= stats.p99 <= stats.max
    assert stats.min <= stats.mean <= stats.max and stats.throughput > 0


@pytest.mark.parametrize("name", ["float.engine", "int8.engine", "batch4.engine"])
def test_outputs_match_polygraphy_trt_runner(built, name):
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    batch = 4 if name == "batch4.engine" else 1
    feeds = [{"x": f} for f in samples.image_feeds(4, seed=3, shape=(batch, 3, 32, 32))]
    with TrtRunner(EngineFromBytes(built[name].read_bytes())) as polygraphy:
        # Polygraphy may hand back views of buffers it reuses: copy each result
        expected = [{k: np.array(v, copy=True) for k, v in polygraphy.infer(feed).items()} for feed in feeds]
    with EngineRunner(built[name], BenchOptions()) as runner:
        plain = [runner.infer(feed) for feed in feeds]
        captured = runner.capture()
        graphed = [runner.infer(feed) for feed in feeds]
    if not is_rtx(import_tensorrt()):
        assert captured, runner.graph_note
    for ours, theirs in ((plain, expected), (graphed, expected)):
        for a, b in zip(ours, theirs):
            assert set(a) == set(b) == {"logits"} and a["logits"].shape == (batch, 10)
            np.testing.assert_allclose(a["logits"], b["logits"], rtol=1e-5, atol=1e-5)
    assert runner.tensors == [] and runner.context is None  # closed


def test_engine_computes_what_onnxruntime_does(built):
    feeds = [{"x": f} for f in samples.image_feeds(4, seed=4)]
    with EngineRunner(built["float.engine"], BenchOptions()) as runner:
        gpu = [runner.infer(feed)["logits"] for feed in feeds]
    assert snr_db(run_ort(built["float.onnx"], feeds), gpu) > 30  # TF32 at most


def test_engines_and_onnx_side_by_side(built):
    paths = [built["int8.engine"], built["float.engine"], built["float.onnx"]]
    report = bench(paths, BenchOptions(iterations=50, warmup=5))
    assert [r.kind for r in report.rows] == ["engine", "engine", "onnx"]
    trt = import_tensorrt()
    for row in report.rows[:2]:
        assert row.backend.startswith("TensorRT-RTX " if is_rtx(trt) else "TensorRT ")
        assert row.inputs == {"x": [1, 3, 32, 32]} and row.stats.iterations == 50
        assert row.cuda_graph == ("cuda graph" in row.backend)
        if not is_rtx(trt):
            assert row.cuda_graph, row.note
        elif not row.cuda_graph:
            assert row.note.startswith("no CUDA graph: ")
    for row in report.rows:
        assert_ordered(row.stats)
    assert report.rows[0].ratio == 1.0
    assert report.rows[2].ratio == pytest.approx(report.rows[0].stats.median / report.rows[2].stats.median)
    assert report.machine.gpu and report.machine.tensorrt.endswith(trt.__version__)
    json.loads(report.to_json())
    assert len([line for line in report.markdown().splitlines() if line.startswith("|")]) == 5


def test_transfers_include_times_the_copies(built):
    exclude = bench([built["relu.engine"]], BenchOptions(iterations=20, warmup=3)).rows[0]
    include = bench([built["relu.engine"]], BenchOptions(iterations=20, warmup=3, transfers="include",
                                                         cuda_graph=False)).rows[0]
    assert "with transfers" in include.backend and "with transfers" not in exclude.backend
    assert include.cuda_graph is False and include.note is None and "cuda graph" not in include.backend
    assert_ordered(exclude.stats)
    assert_ordered(include.stats)
    # 50 MB across PCIe/NVLink takes milliseconds; a Relu over it, tens of microseconds
    assert include.stats.median > 3 * exclude.stats.median


def test_duration_and_profile_shapes(built):
    [row] = bench([built["float.engine"]], BenchOptions(iterations=1, warmup=1, duration=0.2)).rows
    assert row.stats.total_seconds >= 0.2 and row.stats.iterations > 1
    [row] = bench([built["batch4.engine"]], BenchOptions(iterations=5)).rows  # dynamic N: the profile's opt
    assert row.inputs == {"x": [4, 3, 32, 32]}
    with pytest.raises(TrtBridgeError, match=r"its optimization profile allows \[4, 3, 32, 32\] to \[4, 3, 32, 32\]"):
        bench([built["batch4.engine"]], BenchOptions(shapes={"x": (2, 3, 32, 32)}))


def test_data_feeds_the_engine(built, tmp_path):
    feeds = samples.image_feeds(2, seed=6)
    np.savez(tmp_path / "eval.npz", x=feeds)
    options = BenchOptions(data=str(tmp_path / "eval.npz"))
    with EngineRunner(built["float.engine"], options) as runner:
        np.testing.assert_array_equal(runner.feed["x"], feeds[0])
        out = runner.infer()["logits"]
    assert snr_db(run_ort(built["float.onnx"], [{"x": feeds[0]}]), [out]) > 30


def test_bad_engine_and_freed_memory(built, tmp_path):
    from trt_bridge.tensorrt.cuda import call, runtime

    bad = tmp_path / "bad.engine"
    bad.write_bytes(b"\0" * 64)
    with pytest.raises(TrtBridgeError, match="cannot deserialize the engine"):
        bench([bad])
    cudart = runtime()

    def free() -> int:
        return call(cudart, "cudaMemGetInfo", what="reading free GPU memory")[0]

    def cycle() -> None:
        with EngineRunner(built["relu.engine"], BenchOptions(iterations=10, warmup=1)) as runner:
            runner.measure()

    cycle()  # one-time allocations (TensorRT's and CUDA's own) happen here
    before = free()
    for _ in range(5):  # 50 MB of device buffers each: a leak would show as 250 MB
        cycle()
    assert before - free() < 64 << 20


def test_cli_with_engines(built, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "trt_bridge", "bench", built["int8.engine"], built["float.onnx"], "--iterations", "20",
         "--json", "--markdown", tmp_path / "bench.md"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["kind"] for r in data["rows"]] == ["engine", "onnx"] and data["machine"]["gpu"]
    assert "| `" in (tmp_path / "bench.md").read_text()


def test_onnxruntime_cuda_provider_with_and_without_transfers(built):
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed")
    device = bench([built["float.onnx"]], BenchOptions(iterations=10, provider="cuda")).rows[0]
    host = bench([built["float.onnx"]], BenchOptions(iterations=10, provider="cuda", transfers="include")).rows[0]
    assert device.backend == "onnxruntime CUDA (device I/O)" and host.backend == "onnxruntime CUDA (with transfers)"
    assert_ordered(device.stats)
    assert_ordered(host.stats)
