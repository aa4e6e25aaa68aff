"""Issues 16, 28 and 37: every hostile case of ``cases.py``, ``cases_round2.py``, ``cases_round3.py`` and
``cases_round3_values.py`` ends in a clear one-line error (or the documented outcome), with no traceback, nothing
overwritten and no partial or non-finite model written."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.cases import CASES, Case
from tests.hostile.cases_round2 import CASES as ROUND2
from tests.hostile.cases_round3 import OUTPUT_CASES
from tests.hostile.cases_round3_inputs import BOUNDS_CASES, EXTERNAL_DATA_CASES
from tests.hostile.cases_round3_values import VALUE_CASES

ROOT = Path(__file__).resolve().parents[2]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_inprocess(argv: list[str], capsys, caplog) -> tuple[int, str]:
    from trt_bridge.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # noqa: BLE001 - that is the failure this suite looks for
        pytest.fail(f"an exception escaped the CLI (a traceback for the user): {exc!r}")
    captured = capsys.readouterr()
    return code, captured.err + caplog.text, captured.out


def _run_subprocess(case: Case, argv: list[str], d: Path) -> tuple[int, str]:
    code = case.preamble + "import sys\nfrom trt_bridge.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, value in (case.env or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=d, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out = ""
    if case.pipe_to_true:
        proc.stdout.close()  # the reader (`| true`) is gone before anything is written
        err = proc.stderr.read().decode()
    else:
        try:
            out, err = (b.decode(errors="backslashreplace") for b in proc.communicate(timeout=case.timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"the command hung: still running after {case.timeout} s")
    proc.wait(timeout=120)
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return code, err, out


ALL = CASES + ROUND2 + OUTPUT_CASES + VALUE_CASES + EXTERNAL_DATA_CASES + BOUNDS_CASES


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_hostile(case: Case, case_dir: Path, capsys, caplog) -> None:
    d = case_dir
    case.make(d)
    before = {name: _digest(d / name) for name in case.unchanged}
    argv = [a.replace("{d}", str(d)) for a in case.argv]
    code, err, out = _run_subprocess(case, argv, d) if case.subprocess else _run_inprocess(argv, capsys, caplog)
    assert "Traceback" not in err, err
    assert "RuntimeWarning" not in err, err  # numpy's warnings stay out of the user's way
    for text in case.not_in_err:
        assert text not in err, err
    assert code == case.exit, f"exit {code}, expected {case.exit}: {err}"
    assert case.fragment.lower() in (err + out).lower(), err + out
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) <= 1, err
    for name, digest in before.items():
        assert _digest(d / name) == digest, f"{name} was modified"
    for name in case.absent:
        assert not (d / name).exists(), f"{name} was written"
    if case.then is not None:
        case.then(d)
    leftovers = [p.name for p in d.iterdir() if p.name.startswith(".trt-bridge-")]
    assert not leftovers, f"temporary files left: {leftovers}"
