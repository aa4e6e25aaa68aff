"""Issue 37: a command's outputs are one unit (:mod:`trt_bridge.ir.commit`): an engine and its sidecar are renamed
into place together under the folder's lock, so two runs writing one output at once leave one run's pair, and a
pair that does not match (a copy of one file without the other) is refused where it is read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.commit import Outputs, folders_locked
from trt_bridge.tensorrt.sidecar import SidecarMismatchError, read_sidecar

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

WRITER = """
import hashlib, json, os, sys
from trt_bridge.ir.commit import Outputs
engine, tag, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(rounds):
    data = (tag * 4096 + str(i)).encode() + os.urandom(64)
    with Outputs() as outputs:
        outputs.stage_bytes(engine, data)
        outputs.stage_text(engine + ".json", json.dumps({"tag": tag, "round": i,
                                                         "sha256": hashlib.sha256(data).hexdigest()}))
        outputs.commit()
"""


def _pair(engine: Path) -> tuple[str, str]:
    side = json.loads(Path(f"{engine}.json").read_text())
    return side["sha256"], hashlib.sha256(engine.read_bytes()).hexdigest()


def test_two_writers_of_one_pair_never_mix_them(tmp_path):
    """Two processes commit 150 engine+sidecar pairs each to one path; a reader that takes the folder's lock sees a
    matching pair every time, and the pair left at the end matches."""
    engine = tmp_path / "e.engine"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(engine), tag, "150"], env=ENV)
               for tag in ("a", "b")]
    seen = 0
    while any(w.poll() is None for w in writers):
        with folders_locked([tmp_path]):
            if engine.exists():
                recorded, actual = _pair(engine)
                assert recorded == actual, "an engine beside another engine's sidecar"
                seen += 1
        time.sleep(0.001)
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    recorded, actual = _pair(engine)
    assert recorded == actual and seen > 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".trt-bridge-")]


def test_a_failed_rename_takes_back_the_ones_before_it(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "inside").write_text("x")  # a non-empty folder: no file can be renamed over it
    with Outputs() as outputs:
        outputs.stage_bytes(tmp_path / "a.bin", b"new")
        outputs.stage_bytes(tmp_path / "b", b"new")
        with pytest.raises(TrtBridgeError, match="no output of this run was kept"):
            outputs.commit()
    assert not (tmp_path / "a.bin").exists() and (tmp_path / "b" / "inside").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_nothing_is_written_without_a_commit(tmp_path):
    (tmp_path / "old.onnx").write_bytes(b"previous")
    with Outputs() as outputs:
        staged = outputs.stage_bytes(tmp_path / "old.onnx", b"new")
        assert staged.parent.name.startswith(".trt-bridge-") and staged.read_bytes() == b"new"
    assert (tmp_path / "old.onnx").read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.onnx"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    from tests.hostile.conftest import feeds, float_net
    from trt_bridge.cli import main

    pytest.importorskip("tensorrt_rtx")
    d = tmp_path_factory.mktemp("outputs")
    onnx.save(float_net(), str(d / "float.onnx"))
    import numpy as np

    np.savez(d / "calib.npz", x=feeds())
    assert main(["convert", str(d / "float.onnx"), "-o", str(d / "m.onnx"), "--calib-data", str(d / "calib.npz"),
                 "-q", "--skip-check"]) == 0
    return d / "m.onnx"


def _build(model: Path, engine: Path, cc: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trt_bridge", "build", str(model), "-o", str(engine),
                             "--compute-capability", cc, "-q"], env=ENV, stderr=subprocess.PIPE, text=True)


def test_two_builds_to_one_engine_leave_one_build(converted, tmp_path):
    """`build` for SM 8.9 and for SM 12.0 to one -o at once: the engine and the sidecar left are one build's."""
    engine = tmp_path / "m.engine"
    for _ in range(2):
        builds = [_build(converted, engine, cc) for cc in ("8.9", "12.0")]
        for b in builds:
            _, err = b.communicate(timeout=300)
            assert b.returncode == 0, err
        info = read_sidecar(engine)  # raises where the sidecar records another engine
        assert info["engine"]["sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()
        assert info["target"]["compute_capabilities"] in (["8.9"], ["12.0"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.engine", "m.engine.json"]


def test_an_engine_beside_another_ones_sidecar_is_refused(converted, tmp_path):
    for cc, name in (("8.9", "a.engine"), ("12.0", "b.engine")):
        b = _build(converted, tmp_path / name, cc)
        assert b.wait(timeout=300) == 0, b.stderr.read()
    shutil.copy(tmp_path / "b.engine", tmp_path / "a.engine")  # copied without its sidecar
    with pytest.raises(SidecarMismatchError, match=r"a\.engine: its sidecar .*a\.engine\.json describes another"):
        read_sidecar(tmp_path / "a.engine")
    assert read_sidecar(tmp_path / "b.engine")["target"]["compute_capabilities"] == ["12.0"]


def _convert(source: Path, calib: Path, out: Path, report: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trt_bridge", "convert", str(source), "--calib-data", str(calib),
                             "-o", str(out), "--report", str(report), "-q", *extra], env=ENV,
                            stderr=subprocess.PIPE, text=True)


def test_two_converts_to_one_output_leave_one_runs_model_and_report(converted, tmp_path):
    """Two `convert -o m.onnx --report r.json` at once, one with --high-precision fp16: the model and the report left
    are one run's (the report's layer precisions are the model's)."""
    from trt_bridge.lower.layer_precisions import layer_precisions

    d = converted.parent
    out, report = tmp_path / "m.onnx", tmp_path / "r.json"
    runs = [_convert(d / "float.onnx", d / "calib.npz", out, report),
            _convert(d / "float.onnx", d / "calib.npz", out, report, "--high-precision", "fp16")]
    for run in runs:
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err
    recorded = json.loads(report.read_text())["check"]["precisions"]["counts"]
    assert layer_precisions(onnx.load(str(out)))["counts"] == recorded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "r.json"]
