"""The hostile-input cases of issue 37 ("hostile input, round three"), one row each, run by ``test_hostile.py`` as
the earlier rounds' rows are (same :class:`Case`, same assertions).

``OUTPUT_CASES``: outputs written only once a command has succeeded, as units (G2); signals (SIGINT, SIGTERM,
SIGHUP) leave nothing behind; targets that run a format are accepted where the installed builder cannot build for
them; the pipeline never writes over its own artifacts nor through a planted link, and a manifest with a key given
twice is refused (G1, G6).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx

from tests.hostile.cases import CONVERT, Case, manifest, write
from tests.hostile.cases_round2 import fp8_qdq

#: a private TMPDIR (the subprocess's ``tempfile``): whatever a case leaves there is a leftover
PRIVATE_TMP = "import os, tempfile\nos.makedirs('tmp', exist_ok=True)\ntempfile.tempdir = os.path.abspath('tmp')\n"


def _in_check(action: str) -> str:
    """A preamble: convert's check stage (after the model is staged, before it is committed) does ``action``."""
    return (PRIVATE_TMP + "import signal\nimport trt_bridge.conversion.output as _o\n_c = _o.check_model\n"
            f"def _check(path, options):\n    {action}\n    return _c(path, options)\n_o.check_model = _check\n")


def _at_commit_of(name: str, signum: str) -> str:
    """A preamble: ``signum`` arrives just as the first output named ``name`` is renamed into place."""
    return ("import os, signal\n_r = os.replace\n_sent = []\n"
            f"def _replace(a, b, **k):\n    if str(b).endswith('{name}') and not _sent:\n"
            f"        _sent.append(1)\n        os.kill(os.getpid(), signal.{signum})\n    return _r(a, b, **k)\n"
            "os.replace = _replace\n")


def _nothing_left(d: Path) -> None:
    """No output of the run, and nothing in the private TMPDIR (trt-bridge-calib-*, trt-bridge-float-*)."""
    left = sorted(p.name for p in (d / "tmp").iterdir()) if (d / "tmp").is_dir() else []
    assert not left, f"temporary folders left in TMPDIR: {left}"


def _both_committed(d: Path) -> None:
    """A signal during the commit: the model and its report are both there, the report naming that model."""
    assert (d / "out.onnx").is_file() and (d / "r.json").is_file()
    onnx.load(str(d / "out.onnx"))
    assert json.loads((d / "r.json").read_text())["output"] == str(d / "out.onnx")


def fp4_source(d: Path) -> None:
    """An NVFP4 weight-only MatMul (two-level block scales) as ModelOpt writes it: FP4 runs on 10.0 and newer."""
    from tests.test_fp4 import fp4_weight_model

    onnx.save(fp4_weight_model(True, False)[0], str(d / "fp4.onnx"))


def sighup_loader(d: Path) -> None:
    """A loader whose third feed takes SIGHUP (calibration under way: its session's folder exists)."""
    (d / "loader.py").write_text(
        "import os, signal\nimport numpy as np\n"
        "def load_data():\n    for i in range(8):\n        if i == 2:\n"
        "            os.kill(os.getpid(), signal.SIGHUP)\n"
        "        yield {'x': np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype(np.float32)}\n")


def linked_model_folder(d: Path) -> None:
    """``m.yaml`` (output m-output) whose model folder ``m-output/m`` is a planted link to ``elsewhere/``."""
    manifest("")(d)
    (d / "elsewhere").mkdir()
    (d / "m-output").mkdir()
    os.symlink(d / "elsewhere", d / "m-output" / "m")


def _elsewhere_empty(d: Path) -> None:
    assert not list((d / "elsewhere").iterdir())


def _summary_kept(d: Path) -> None:
    assert (d / "keep.md").read_text() == "keep\n"


def pipeline_md_planted(d: Path) -> None:
    manifest("")(d)
    (d / "m-output").mkdir()
    (d / "keep.md").write_text("keep\n")


REPORT = ["--report", "{d}/r.json"]

OUTPUT_CASES = [
    # ---- convert commits its model and report only once the check and costs have passed (G2)
    Case("convert-check-fails-after-save", "G2", lambda d: None, [*CONVERT, "-o", "{d}/out.onnx", *REPORT],
         2, "the check failed here", absent=("out.onnx", "r.json"), subprocess=True,
         preamble=_in_check("from trt_bridge.errors import TrtBridgeError\n"
                            "    raise TrtBridgeError('the check failed here')"), then=_nothing_left),
    Case("convert-sigterm-in-check", "G2", lambda d: None, [*CONVERT, "-o", "{d}/out.onnx", *REPORT],
         143, "terminated (SIGTERM)", absent=("out.onnx", "r.json"), subprocess=True,
         preamble=_in_check("os.kill(os.getpid(), signal.SIGTERM)"), then=_nothing_left),
    Case("convert-sighup-in-check", "G2", lambda d: None, [*CONVERT, "-o", "{d}/out.onnx", *REPORT],
         129, "terminated (SIGHUP)", absent=("out.onnx", "r.json"), subprocess=True,
         preamble=_in_check("os.kill(os.getpid(), signal.SIGHUP)"), then=_nothing_left),
    Case("convert-sigint-in-check", "G2", lambda d: None, [*CONVERT, "-o", "{d}/out.onnx", *REPORT],
         130, "interrupted", absent=("out.onnx", "r.json"), subprocess=True,
         preamble=_in_check("os.kill(os.getpid(), signal.SIGINT)"), then=_nothing_left),
    Case("convert-sighup-in-calibration", "G2", sighup_loader,
         ["convert", "{d}/float.onnx", "--calib-data", "{d}/loader.py", "-o", "{d}/out.onnx", *REPORT],
         129, "terminated (SIGHUP)", absent=("out.onnx", "r.json"), subprocess=True, preamble=PRIVATE_TMP,
         then=_nothing_left),
    Case("convert-sigterm-between-renames", "G2", lambda d: None, [*CONVERT, "-o", "{d}/out.onnx", *REPORT, "-q"],
         143, "terminated", subprocess=True, preamble=_at_commit_of("out.onnx", "SIGTERM"), then=_both_committed),
    Case("build-sighup-between-renames", "G2", lambda d: None,
         ["build", "{d}/b1.onnx", "-o", "{d}/e.engine", "--compute-capability", "8.9", "-q"], 129, "terminated",
         subprocess=True, preamble=_at_commit_of("e.engine", "SIGHUP"),
         then=lambda d: _pair_matches(d / "e.engine")),
    # ---- a target that runs the format is accepted; only the build this machine cannot do is skipped
    Case("convert-fp8-for-hopper", "G9", fp8_qdq,
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2", "--compute-capability", "9.0"],
         0, "cannot build for compute capability 9.0"),
    Case("convert-fp4-for-sm100", "G9", fp4_source,
         ["convert", "{d}/fp4.onnx", "-o", "{d}/out.onnx", "--compute-capability", "10.0"], 0,
         "cannot build for compute capability 10.0"),
    Case("check-fp4-for-sm100", "G9", fp4_source, ["check", "{d}/fp4.onnx", "--compute-capability", "10.0"], 0,
         "build the engine on the target"),  # a warning: NVFP4 two-level scales are constants to TensorRT
    Case("build-fp8-for-hopper-still-refused", "G9", fp8_qdq,
         ["build", "{d}/bad.onnx", "-o", "{d}/e.engine", "--compute-capability", "9.0"], 2,
         "cannot build for compute capability 9.0", absent=("e.engine", "e.engine.json")),
    # ---- pipeline: never over its own artifacts, never through a planted link; keys given twice (G1, G6)
    Case("pipeline-json-over-converted-model", "G1", manifest(""),
         ["pipeline", "{d}/m.yaml", "--json", "{d}/m-output/m/m.int8.onnx"], 2, "which the pipeline writes itself",
         absent=("m-output/m/m.int8.onnx",)),
    Case("pipeline-json-over-pipeline-md", "G1", manifest(""),
         ["pipeline", "{d}/m.yaml", "--json", "{d}/m-output/pipeline.md"], 2, "which the pipeline writes itself",
         absent=("m-output/pipeline.md",)),
    Case("pipeline-json-in-model-folder", "G1", manifest(""),
         ["pipeline", "{d}/m.yaml", "--json", "{d}/m-output/m/summary.json"], 2, "folder the pipeline writes",
         absent=("m-output/m",)),
    Case("pipeline-json-over-engine", "G1",
         manifest("targets:\n  - name: ada\n    compute_capabilities: ['8.9']\n"),
         ["pipeline", "{d}/m.yaml", "--json", "{d}/m-output/m/m.ada.engine.json"], 2,
         "which the pipeline writes itself", absent=("m-output/m",)),
    Case("pipeline-linked-model-folder", "G1", linked_model_folder, ["pipeline", "{d}/m.yaml"], 2,
         "is a symbolic link", then=_elsewhere_empty),
    Case("pipeline-linked-artifact", "G1",
         lambda d: (pipeline_md_planted(d), os.symlink(d / "keep.md", d / "m-output" / "pipeline.md")),
         ["pipeline", "{d}/m.yaml"], 2, "is a symbolic link", unchanged=("keep.md",), then=_summary_kept),
    Case("manifest-duplicate-key", "G6",
         manifest("    gates:\n      min_snr_db: 10\n    gates:\n      max_latency_ms: 5\n"),
         ["pipeline", "{d}/m.yaml"], 2, "'gates' is given twice", absent=("m-output",)),
    Case("manifest-duplicate-top-level-key", "G6",
         write("m.yaml", "models:\n  - name: m\n    source: float.onnx\noutput: a\noutput: b\n"),
         ["pipeline", "{d}/m.yaml"], 2, "line 5", absent=("a", "b")),
    Case("manifest-duplicate-flow-key", "G6", write("m.yaml", "models: [{name: m, source: float.onnx, name: n}]\n"),
         ["pipeline", "{d}/m.yaml"], 2, "'name' is given twice", absent=("m-output", "n-output")),
]


def _pair_matches(engine: Path) -> None:
    """The engine and its sidecar are one build's: the sidecar records the engine's SHA-256."""
    from trt_bridge.tensorrt.sidecar import read_sidecar

    info = read_sidecar(engine)  # raises where they do not match
    assert info["engine"]["size"] == engine.stat().st_size
