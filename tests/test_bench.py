"""``trt-bridge bench`` on ONNX models with onnxruntime's CPU provider: statistics as trtexec computes
them, rows side by side with the speed-up versus the first, strict JSON, the markdown table, --duration,
--shapes, --data, provider validation, and an engine on a machine without a GPU. (Engines on a GPU:
tests/gpu/test_bench_gpu.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import assert_tensorrt_ready, run_ort, save, snr_db

from trt_bridge import samples
from trt_bridge.bench import BenchOptions, LatencyStats, bench
from trt_bridge.bench.inputs import parse_shapes
from trt_bridge.bench.ort_runner import OrtRunner
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.errors import TrtBridgeError

FAST = BenchOptions(iterations=20, warmup=2)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The float conv net (dynamic batch N) and its int8 conversion from random calibration."""
    root = tmp_path_factory.mktemp("bench")
    fpath = save(samples.conv_net(channels=(8, 16)), root / "float.onnx")
    int8 = root / "int8.onnx"
    convert(fpath, int8, ConvertOptions(calibration=CalibrationOptions(random=2), progress=False, check=False))
    held_out = [{"x": f} for f in samples.image_feeds(8, 2)]
    assert snr_db(run_ort(fpath, held_out), run_ort(int8, held_out)) > 40  # measured 44.8 dB
    assert_tensorrt_ready(int8)
    return {"root": root, "float": fpath, "int8": int8}


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trt_bridge", "bench", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def assert_ordered(stats: LatencyStats) -> None:
    assert 0 < stats.min <= stats.median <= stats.p90 <= stats.p95 <= stats.p99 <= stats.max
    assert stats.min <= stats.mean <= stats.max


def markdown_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            assert line.endswith("|"), line
            rows.append([c.strip() for c in line.replace("\\|", "\0")[1:-1].split("|")])
    return rows


# ---------------------------------------------------------------- statistics


def test_statistics_are_trtexecs():
    stats = LatencyStats.from_times([float(t) for t in range(100, 0, -1)], total_seconds=2.0)
    assert (stats.min, stats.max, stats.median, stats.mean) == (1.0, 100.0, 50.5, 50.5)
    # trtexec leaves out the slowest floor((100 - p)% of n) times and takes the next one
    assert (stats.p90, stats.p95, stats.p99) == (90.0, 95.0, 99.0)
    assert stats.iterations == 100 and stats.throughput == 50.0 and stats.total_seconds == 2.0
    odd = LatencyStats.from_times([3.0, 1.0, 2.0], 1.0)
    assert (odd.median, odd.p90, odd.p99) == (2.0, 3.0, 3.0)
    ten = LatencyStats.from_times(list(range(1, 11)), 1.0)
    assert (ten.median, ten.p90, ten.p95, ten.p99) == (5.5, 9, 10, 10)


def test_parse_shapes():
    assert parse_shapes(["x:1x3x224x224,mask:1x128", "ids:1X128"]) == {
        "x": (1, 3, 224, 224), "mask": (1, 128), "ids": (1, 128)}
    assert parse_shapes(["encoder:input:2x16"]) == {"encoder:input": (2, 16)}  # the last colon splits
    assert parse_shapes(None) is None
    for bad in ("x", "x:", ":1x2", "x:1xa", "x:-1x3"):
        with pytest.raises(TrtBridgeError, match="is not NAME:DIMS"):
            parse_shapes([bad])
    with pytest.raises(TrtBridgeError, match="input 'x' is given two shapes"):
        parse_shapes(["x:1x2", "x:2x2"])


# ---------------------------------------------------------------- onnxruntime rows


def test_two_models_side_by_side(models):
    report = bench([models["float"], models["int8"]], FAST)
    first, second = report.rows
    assert [r.path for r in report.rows] == [str(models["float"]), str(models["int8"])]
    for row in report.rows:
        assert row.kind == "onnx" and row.backend == "onnxruntime CPU" and row.cuda_graph is None
        assert_ordered(row.stats)
        assert row.stats.iterations == 20
        assert row.stats.total_seconds >= row.stats.mean * 20 / 1000
        assert row.stats.throughput == pytest.approx(20 / row.stats.total_seconds)
        assert row.inputs == {"x": [1, 3, 32, 32]} and row.feed == "random (seed 0)"
    assert first.ratio == 1.0
    assert second.ratio == pytest.approx(first.stats.median / second.stats.median)
    assert report.machine.onnxruntime and report.machine.cpu and report.machine.tensorrt is None


def test_json_is_strict_and_markdown_is_a_table(models):
    report = bench([models["float"], models["int8"], models["float"]], BenchOptions(iterations=5, warmup=1))

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    data = json.loads(report.to_json(), parse_constant=no_constants)
    assert [r["kind"] for r in data["rows"]] == ["onnx"] * 3 and data["rows"][0]["ratio"] == 1.0
    assert set(data["rows"][0]["stats"]) == {"median", "mean", "min", "max", "p90", "p95", "p99", "throughput",
                                             "iterations", "total_seconds"}
    assert data["options"]["iterations"] == 5 and data["options"]["provider"] == "cpu"
    assert data["machine"]["onnxruntime"] and "speed-up" in data["ratio"]

    rows = markdown_rows(report.markdown())
    assert len(rows) == 2 + 3 and len({len(r) for r in rows}) == 1
    header, align, *body = rows
    assert header[:4] == ["model", "kind", "backend", "inputs"] and header[-1] == "speed-up vs first"
    assert header[4:11] == [f"{h} (ms)" for h in ("median", "mean", "min", "max", "p90", "p95", "p99")]
    assert align[:4] == ["---"] * 4 and set(align[4:]) == {"---:"}
    assert body[0][0] == f"`{models['float']}`" and body[0][3] == "x 1x3x32x32" and body[0][-1] == "1.00x"
    assert float(body[1][4]) == pytest.approx(report.rows[1].stats.median, abs=1e-3)

    summary = report.summary().splitlines()
    assert summary[0].startswith("bench: at least 5 iterations after 1 warm-up, random inputs (seed 0)")
    assert summary[1].split()[:3] == ["model", "backend", "median"] and summary[1].endswith("speed-up")
    assert summary[2].startswith(str(models["float"])) and summary[2].endswith("1.00x")
    assert report.table().splitlines() == summary[1:5]


def test_duration_is_honoured(models):
    [row] = bench([models["float"]], BenchOptions(iterations=1, warmup=0, duration=0.3)).rows
    assert row.stats.total_seconds >= 0.3 and row.stats.iterations > 1


def test_shapes_set_the_dynamic_batch(models):
    options = BenchOptions(iterations=3, warmup=1, shapes={"x": (4, 3, 32, 32)})
    [row] = bench([models["float"]], options).rows
    assert row.inputs == {"x": [4, 3, 32, 32]}
    runner = OrtRunner(models["float"], options)
    assert runner.feed["x"].shape == (4, 3, 32, 32) and runner.feed["x"].dtype == np.float32
    assert runner.infer()["logits"].shape == (4, 10)
    with pytest.raises(TrtBridgeError, match="fixes dimension 2 at 32"):
        bench([models["float"]], BenchOptions(shapes={"x": (4, 3, 16, 16)}))
    with pytest.raises(TrtBridgeError, match="--shapes names 'y', which is an input of none of the models"):
        bench([models["float"]], BenchOptions(shapes={"y": (1,)}))


def test_data_gives_the_feed(models, tmp_path):
    feeds = samples.image_feeds(3, seed=5, shape=(2, 3, 32, 32))  # 3 feeds of batch 2
    np.savez(tmp_path / "eval.npz", x=feeds)
    options = BenchOptions(iterations=3, warmup=1, data=str(tmp_path / "eval.npz"))
    [row] = bench([models["float"]], options).rows
    assert row.inputs == {"x": [2, 3, 32, 32]} and row.feed == f"{tmp_path / 'eval.npz'} (first feed)"
    runner = OrtRunner(models["float"], options)
    np.testing.assert_array_equal(runner.feed["x"], feeds[0])
    with pytest.raises(TrtBridgeError, match="but the first feed of .* has \\[2, 3, 32, 32\\]"):
        bench([models["float"]], BenchOptions(data=options.data, shapes={"x": (1, 3, 32, 32)}))
    np.savez(tmp_path / "wrong.npz", y=feeds)
    with pytest.raises(TrtBridgeError, match="'y' is not an input of the model"):
        bench([models["float"]], BenchOptions(data=str(tmp_path / "wrong.npz")))


def test_provider_and_option_errors(models):
    import onnxruntime

    with pytest.raises(TrtBridgeError, match="unknown onnxruntime provider 'rocm'"):
        bench([models["float"]], BenchOptions(provider="rocm"))
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        with pytest.raises(TrtBridgeError, match="provider 'cuda' \\(CUDAExecutionProvider\\) is not available"):
            bench([models["float"]], BenchOptions(provider="cuda"))
    for options, message in ((BenchOptions(iterations=0), "--iterations must be at least 1"),
                             (BenchOptions(warmup=-1), "--warmup must be 0 or more"),
                             (BenchOptions(duration=-1.0), "--duration must be a finite number of seconds"),
                             (BenchOptions(transfers="some"), "--transfers must be include or exclude"),
                             (BenchOptions(threads=0), "--threads must be at least 1")):
        with pytest.raises(TrtBridgeError, match=message):
            bench([models["float"]], options)
    with pytest.raises(TrtBridgeError, match="bench takes ONNX models"):
        bench([models["root"] / "model.bin"])
    with pytest.raises(TrtBridgeError, match="no such file"):
        bench([models["root"] / "missing.onnx"])


def test_threads_are_passed_to_onnxruntime(models):
    runner = OrtRunner(models["float"], BenchOptions(threads=1))
    assert runner.backend == "onnxruntime CPU (1 threads)"
    assert runner.session.get_session_options().intra_op_num_threads == 1


# ---------------------------------------------------------------- the command line


def test_cli_table_json_and_markdown_files(models, tmp_path):
    result = cli(models["float"], models["int8"], "--iterations", "10", "--warmup", "1", "--shapes", "x:2x3x32x32",
                 "--json", tmp_path / "bench.json", "--markdown", tmp_path / "bench.md")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("bench: at least 10 iterations") and lines[1].split()[0] == "model"
    assert lines[2].startswith(str(models["float"])) and lines[3].startswith(str(models["int8"]))
    detail = next(line for line in lines if line.startswith(f"  {models['int8']}: "))
    assert detail.startswith(f"  {models['int8']}: x[2, 3, 32, 32] from random (seed 0); TensorRT engine ")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert [r["inputs"]["x"] for r in data["rows"]] == [[2, 3, 32, 32]] * 2
    assert data["options"]["shapes"] == {"x": [2, 3, 32, 32]}
    assert len(markdown_rows((tmp_path / "bench.md").read_text())) == 4

    stdout = cli(models["float"], "--iterations", "3", "--warmup", "0", "--seed", "3", "--threads", "1",
                 "--transfers", "include", "--no-cuda-graph", "--json", "-q")
    assert stdout.returncode == 0, stdout.stderr
    data = json.loads(stdout.stdout)  # stdout is the JSON alone
    assert data["rows"][0]["stats"]["iterations"] == 3 and data["rows"][0]["feed"] == "random (seed 3)"
    assert {k: data["options"][k] for k in ("warmup", "threads", "transfers", "cuda_graph", "provider")} == {
        "warmup": 0, "threads": 1, "transfers": "include", "cuda_graph": False, "provider": "cpu"}


def test_cli_engine_without_gpu_is_a_clear_error(models, tmp_path):
    from trt_bridge.tensorrt.cuda import gpu_problem

    if gpu_problem() is None:
        pytest.skip("this machine has a GPU: tests/gpu/test_bench_gpu.py runs engines")
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not run")
    result = cli(models["float"], engine)
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == ""
    [line] = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith(f"trt-bridge bench: error: {engine}: running a TensorRT engine needs an NVIDIA GPU")
    with pytest.raises(TrtBridgeError, match="needs an NVIDIA GPU"):
        bench([engine])


def test_models_with_other_inputs_side_by_side_and_shapes_checked_first(tmp_path):
    """--shapes applies to the models that have each input; a wrong shape for the last model fails before the
    first one runs (no minutes of timing thrown away)."""
    import time

    import onnx
    from onnx import TensorProto, helper

    def model(name, inputs):
        graph = helper.make_graph([helper.make_node("Relu", [inputs[0]], ["y"], "relu")], name,
                                  [helper.make_tensor_value_info(i, TensorProto.FLOAT, ["N", 8]) for i in inputs],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
        path = tmp_path / f"{name}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    a, b = model("a", ["x"]), model("b", ["x", "z"])
    report = bench([a, b], BenchOptions(iterations=3, warmup=1, shapes={"x": (2, 8), "z": (2, 8)}))
    assert [r.inputs for r in report.rows] == [{"x": [2, 8]}, {"x": [2, 8], "z": [2, 8]}]
    start = time.perf_counter()
    with pytest.raises(TrtBridgeError, match="rank 3"):
        bench([a, b], BenchOptions(duration=5.0, shapes={"x": (2, 8), "z": (2, 8, 1)}))
    assert time.perf_counter() - start < 3  # refused before a's five seconds
