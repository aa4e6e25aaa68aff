"""A TensorRT parser that kills its process: ``check`` and ``build`` run it in a child process
(trt_bridge/tensorrt/parse_child.py) and report the crash as a finding or a one-line error naming the node.
TensorRT-RTX 1.7.1's parser dies by SIGFPE on a com.microsoft RotaryEmbedding with num_heads 0 on a 3-D input."""

from __future__ import annotations

import signal
import time

import pytest
from decoder_models import rotary
from helpers import save
from test_cli import cli

from trt_bridge.checks import CheckOptions, TrtProbe, check_model
from trt_bridge.tensorrt.build import ModelRejectedError, build
from trt_bridge.tensorrt.options import BuildOptions
from trt_bridge.tensorrt.parse import parse

pytest.importorskip("tensorrt_rtx")

CRASH = "crashed on RotaryEmbedding node 'rope_q' (signal 8, SIGFPE)"


@pytest.fixture(scope="module")
def crashing(tmp_path_factory):
    return save(rotary(num_heads=0), tmp_path_factory.mktemp("crash") / "rope.onnx")


def test_isolated_parse_names_the_node_it_died_on(crashing, tmp_path):
    result = parse(crashing, isolated=True)
    assert not result.ok and result.crash is not None
    assert (result.crash.signal, result.crash.node, result.crash.op) == (signal.SIGFPE, "rope_q", "RotaryEmbedding")
    assert [e.rule for e in result.details] == ["tensorrt-crash"] and CRASH in result.details[0].text
    unnamed = rotary(num_heads=0, name="")  # the parser calls it node_of_y; the index names it for check
    result = parse(save(unnamed, tmp_path / "unnamed.onnx"), isolated=True)
    assert result.crash.node == "node_of_y" and result.details[0].index == 1 and result.details[0].node == ""


def test_isolated_parse_costs_little_and_agrees(tmp_path):
    """The child costs a Python start-up and TensorRT's import (0.2-0.4 s measured here) and says what the parser in
    this process says."""
    path = save(rotary(num_heads=2), tmp_path / "rope2.onnx")
    parse(path)
    start = time.perf_counter()
    isolated = parse(path, isolated=True)
    assert time.perf_counter() - start < 10
    inline = parse(path)
    assert (isolated.ok, isolated.layers, isolated.crash) == (inline.ok, inline.layers, None) and isolated.ok


def test_check_cli_reports_the_crash(crashing):
    result = cli("check", crashing, "--costs", "off")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("parser: crashed (SIGFPE on RotaryEmbedding 'rope_q'))"), lines[0]
    # the static rule predicted it; the parser's crash is its TensorRT line
    assert any(line.startswith("  [tensorrt-crash] RotaryEmbedding 'rope_q': TensorRT-RTX 1.7.1's parser crashes")
               for line in lines), result.stdout
    assert any(line.startswith("      TensorRT: ") and CRASH in line for line in lines), result.stdout


def test_check_without_static_prediction_still_reports_the_crash(crashing):
    report = check_model(crashing, CheckOptions(costs=None))
    crash = [f for f in report.findings if f.rule == "tensorrt-crash"]
    assert len(crash) == 1 and crash[0].node == "rope_q" and CRASH in crash[0].tensorrt
    assert report.parser.crash == "SIGFPE on RotaryEmbedding 'rope_q'" and not report.ready
    assert report.to_dict()["parser"]["crash"] == "SIGFPE on RotaryEmbedding 'rope_q'"
    static = check_model(crashing, CheckOptions(TrtProbe.OFF))
    assert [f.rule for f in static.findings if f.node == "rope_q"] == ["tensorrt-crash"]


def test_build_fails_in_one_line_naming_the_node(crashing, tmp_path):
    engine = tmp_path / "rope.engine"
    result = cli("build", crashing, "-o", engine, "--compute-capability", "8.9", "-q")
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trt-bridge build: error: ") and CRASH in lines[0], result.stderr
    assert not engine.exists()
    with pytest.raises(ModelRejectedError, match="SIGFPE") as caught:
        build(crashing, tmp_path / "api.engine", BuildOptions(compute_capabilities=("8.9",), progress=False))
    assert [e.rule for e in caught.value.errors] == ["tensorrt-crash"]
