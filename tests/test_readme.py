"""Every `$ trt-bridge ...` example and every Python block in README.md and the documentation site (docs/**.md) runs,
on sample models: model.onnx (quantize_dynamic), qoperator.onnx and qdq.onnx (quantize_static), float.onnx, and
model.trt.onnx (converted from model.onnx). An example several pages show runs once.

A code block that must not run (the setup commands) follows a line ``<!-- not run: REASON -->``; a ``sh``/``bash``
block without it fails :func:`test_every_code_block_runs_or_says_why_not`. Blocks without a language or marked
``text`` are output and diagrams; a ``$ trt-bridge`` line in them runs all the same (the README's before/after)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_builds_at, assert_tensorrt_ready, quantize_dynamic, quantize_static, run_ort, save, snr_db
from onnxruntime.quantization import QuantFormat

from trt_bridge import samples

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the pages whose examples run: the front page and every page of the site (mkdocs.yml)
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<marker><!-- not run: [^>]+-->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$",
                   re.MULTILINE | re.DOTALL)
#: (page, language, body, marked not to run) of every fenced block at the start of a line
BLOCKS = [(page, m["lang"], m["body"], bool(m["marker"])) for page in PAGES for m in FENCE.finditer(page.read_text())]
NOT_RUN = {body for _, _, body, marked in BLOCKS if marked}


def _commands(page: Path) -> list[str]:
    text = page.read_text()
    for body in NOT_RUN:
        text = text.replace(body, "")
    return re.findall(r"^\$ (trt-bridge .+)$", text, flags=re.MULTILINE)


README_EXAMPLES = _commands(README)
EXAMPLES = sorted({command for page in PAGES for command in _commands(page)})
#: the Python blocks, each once (pages repeat the quickstart)
PYTHON = list(dict.fromkeys(body for _, lang, body, marked in BLOCKS if lang == "python" and not marked))

LOADER = '''
import numpy as np

def load_data():
    rng = np.random.default_rng(0)
    for _ in range(4):
        yield {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
'''


@pytest.fixture
def workdir(tmp_path):
    fpath = save(samples.conv_net(), tmp_path / "float.onnx")
    quantize_dynamic(fpath, tmp_path / "model.onnx")
    feeds = samples.image_feeds(6, seed=1)
    np.savez(tmp_path / "calib.npz", x=feeds)
    (tmp_path / "feeds").mkdir()
    for i, feed in enumerate(feeds):
        np.savez(tmp_path / "feeds" / f"{i:03d}.npz", x=feed)
    (tmp_path / "loader.py").write_text(LOADER)
    for name, fmt in (("qoperator.onnx", QuantFormat.QOperator), ("qdq.onnx", QuantFormat.QDQ)):
        quantize_static(fpath, tmp_path / name, [{"x": f} for f in feeds], quant_format=fmt)
    return tmp_path


def _assert_converted(workdir: Path, source: str, path: str = "model.trt.onnx", argv=()) -> None:
    """``path``, converted from ``source``, builds in TensorRT-RTX and computes the float model's function on
    held-out inputs (calib.npz is seed 1). Measured 37.5-37.9 dB converted from float.onnx, 31.1-35.2 dB from the
    quantized sources (their own weight rounding and 6 calibration inputs; 38.4 dB on those inputs); FP8 30.8 dB
    (3 mantissa bits), INT4 weight-only blocks of the classifier head 18.2 dB, NVFP4 W4A4 (``--fp4``: its GEMM, the
    convolutions FP8) 32.6 dB, built for SM 12.0 (TensorRT refuses FP4 for 8.9)."""
    held_out = [{"x": f} for f in samples.image_feeds(8, seed=2)]
    bar = 34 if source == "float.onnx" else 28
    bar = 15 if "--int4" in argv else 27 if "--fp8" in argv or "--fp4" in argv else bar
    snr = snr_db(run_ort(workdir / "float.onnx", held_out), run_ort(workdir / path, held_out))
    assert snr > bar, (source, path, snr)
    if "--fp4" in argv:
        assert_builds_at(workdir / path, {"fixed": {"x": ((1, 3, 32, 32),) * 3}}, compute_capability="12.0")
    else:
        assert_tensorrt_ready(workdir / path)


def test_readme_has_examples():
    assert len(README_EXAMPLES) >= 4 and len(EXAMPLES) >= 15 and PYTHON


def test_every_code_block_runs_or_says_why_not():
    """Shell blocks are marked not to run (with the reason); a console block holds `$ trt-bridge` commands only."""
    unmarked = [f"{page.relative_to(ROOT)}: ```{lang}" for page, lang, _, marked in BLOCKS
                if lang in ("sh", "bash", "shell") and not marked]
    assert unmarked == []
    stray = [f"{page.relative_to(ROOT)}: {line}" for page, lang, body, marked in BLOCKS if lang == "console"
             and not marked for line in body.splitlines() if not line.startswith("$ trt-bridge ")]
    assert stray == []


@pytest.mark.parametrize("code", PYTHON, ids=[f"python-{i}" for i in range(len(PYTHON))])
def test_python_block_runs(workdir, code):
    """A Python block of the README or the site runs in the sample folder; a conversion it writes is TensorRT-ready
    and accurate."""
    result = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    if (workdir / "model.trt.onnx").is_file():
        _assert_converted(workdir, "model.onnx")


@pytest.mark.parametrize("command", EXAMPLES)
def test_readme_example_runs(workdir, command):
    argv = shlex.split(command)
    if _is_decoder_example(argv):
        _decoder_example(workdir, argv)
        return
    if argv[1] == "check":
        _check_example(workdir, argv)
        return
    if argv[1] == "verify":
        _verify_example(workdir, argv)
        return
    if argv[1] in ("build", "bench"):
        _engine_example(workdir, argv)
        return
    if argv[1] == "scales" or "--scales" in argv and argv[argv.index("--scales") + 1] not in ("model", "data"):
        _scales_example(workdir, argv)
        return
    result = subprocess.run([sys.executable, "-m", "trt_bridge", *argv[1:]], cwd=workdir, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (workdir / "model.trt.onnx").is_file()
    if "--json" in argv:
        assert json.loads(result.stdout)["quantized"]
    else:
        assert f"converted {argv[2]} -> " in result.stdout
    if "--report" in argv and argv[2] == "model.onnx":
        assert json.loads((workdir / "report.json").read_text())["rules"][0]["rule"] == "dynamic-integer-op"
    _assert_converted(workdir, argv[2], argv=argv)


def _check_example(workdir: Path, argv: list[str]) -> None:
    """A source model is not TensorRT-ready (exit 1); a converted one is (exit 0)."""
    model = argv[2]
    if model == "model.trt.onnx":
        subprocess.run([sys.executable, "-m", "trt_bridge", "convert", "model.onnx", "-o", model, "--calib-data",
                        "calib.npz", "-q"], cwd=workdir, check=True, timeout=120)
        _assert_converted(workdir, "model.onnx", model)
    result = subprocess.run([sys.executable, "-m", "trt_bridge", *argv[1:]], cwd=workdir, capture_output=True,
                            text=True, timeout=120)
    ready = model.endswith(".trt.onnx")
    assert result.returncode == (0 if ready else 1), result.stderr
    assert result.stdout.startswith(f"{model}: {'TensorRT-ready INT8' if ready else 'not TensorRT-ready'}")
    if "--json" in argv:
        target = argv[argv.index("--json") + 1]
        assert json.loads((workdir / target).read_text())["ready"] is ready


DECODERS = ROOT / "tests" / "data" / "decoders"
#: what docs/decoders.md converts first, where an example reads the converted decoder
CONVERTED_DECODER = ("llama-genai-cpu-int4/model.onnx", "llama-trt/model.onnx")


def _is_decoder_example(argv: list[str]) -> bool:
    return any(Path(a).parts[0] in {p.name for p in DECODERS.iterdir()} or a == CONVERTED_DECODER[1]
               for a in argv[2:] if not a.startswith("-"))


def _decoder_example(workdir: Path, argv: list[str]) -> None:
    """An example on the real tiny decoders of tests/data/decoders (docs/decoders.md, guide/verify.md): it exits 0;
    a converted decoder holds no com.microsoft op, check calls it ready, verify's generation loop ran."""
    shutil.copytree(DECODERS, workdir, dirs_exist_ok=True)
    if CONVERTED_DECODER[1] in argv and argv[1] != "convert":
        subprocess.run([sys.executable, "-m", "trt_bridge", "convert", *CONVERTED_DECODER[:1], "-o",
                        CONVERTED_DECODER[1], "-q", "--skip-check"], cwd=workdir, check=True, timeout=300)
    result = subprocess.run([sys.executable, "-m", "trt_bridge", *argv[1:]], cwd=workdir, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    if argv[1] == "convert":
        out = onnx.load(str(workdir / argv[argv.index("-o") + 1]), load_external_data=False)
        assert all((n.domain or "") in ("", "ai.onnx") for n in out.graph.node)
    elif argv[1] == "check":
        assert "TensorRT-ready" in result.stdout.splitlines()[0]
    elif argv[1] == "verify":
        assert "greedy next-token agreement (teacher-forced): " in result.stdout and "PASS" in result.stdout


def _verify_example(workdir: Path, argv: list[str]) -> None:
    """The converted model against the float one: the README's gates pass (exit 0), the reports are written."""
    subprocess.run([sys.executable, "-m", "trt_bridge", "convert", "float.onnx", "-o", argv[3], "--calib-data",
                    "calib.npz", "-q"], cwd=workdir, check=True, timeout=120)
    _assert_converted(workdir, "float.onnx", argv[3])
    result = subprocess.run([sys.executable, "-m", "trt_bridge", *argv[1:]], cwd=workdir, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "candidate 'logits': SNR " in result.stdout and "PASS" in result.stdout
    if "--html" in argv:
        assert "<svg" in (workdir / argv[argv.index("--html") + 1]).read_text()
    if "--json" in argv:
        assert json.loads((workdir / argv[argv.index("--json") + 1]).read_text())["passed"] is True


def _engine_example(workdir: Path, argv: list[str]) -> None:
    """build (ahead of time with TensorRT-RTX) and bench (onnxruntime rows) on the converted sample."""
    if "model.trt.onnx" in argv:
        subprocess.run([sys.executable, "-m", "trt_bridge", "convert", "float.onnx", "-o", "model.trt.onnx",
                        "--calib-data", "calib.npz", "-q"], cwd=workdir, check=True, timeout=120)
        _assert_converted(workdir, "float.onnx")
    result = subprocess.run([sys.executable, "-m", "trt_bridge", *argv[1:]], cwd=workdir, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    if argv[1] == "build":
        engine = workdir / argv[argv.index("-o") + 1]
        assert engine.stat().st_size > 0 and json.loads(Path(f"{engine}.json").read_text())["tensorrt"]
        assert (workdir / "timing.cache").is_file()
    else:
        assert "| model |" in (workdir / "latency.md").read_text() and "onnxruntime CPU" in result.stdout


def _scales_example(workdir: Path, argv: list[str]) -> None:
    """Export a converted model's scales as a TensorRT cache, and convert again with that cache."""
    subprocess.run([sys.executable, "-m", "trt_bridge", "convert", "model.onnx", "-o", "model.trt.onnx",
                    "--calib-data", "calib.npz", "-q"], cwd=workdir, check=True, timeout=120)
    _assert_converted(workdir, "model.onnx")
    if argv[1] != "scales":
        subprocess.run([sys.executable, "-m", "trt_bridge", "scales", "export", "model.trt.onnx", "--format",
                        "trt-cache", "-o", "calib.cache", "-q"], cwd=workdir, check=True, timeout=120)
    result = subprocess.run([sys.executable, "-m", "trt_bridge", *argv[1:]], cwd=workdir, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    if argv[1] == "scales":
        assert (workdir / "calib.cache").read_text().startswith("TRT-")
    else:
        assert "imported scales:" in result.stdout
        _assert_converted(workdir, argv[2], argv[argv.index("-o") + 1])
