"""Run several onnxruntime-genai model builder commands in one process (run inside the genai venv).

    python scripts/decoders/genai_batch.py JOBS.json

``JOBS.json`` is a list of ``{"argv": [...builder arguments...], "out": folder, "command": shown}``. Each job is
exactly ``python -m onnxruntime_genai.models.builder ARGV`` (the module is re-run with ``runpy`` as
``__main__`` and that ``sys.argv``); running them in one process only saves re-importing torch and
transformers for every export. Each job writes ``out/export.json``: the command, exit status, seconds and, on
failure, the error's last lines (its stdout/stderr, builder INFO lines left out).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def run_job(job: dict) -> dict:
    out = Path(job["out"])
    buf = io.StringIO()
    t = time.time()
    rc = 0
    argv = sys.argv
    sys.argv = ["onnxruntime_genai.models.builder", *job["argv"]]
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=False)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 -- recorded, the next job goes on
        buf.write(traceback.format_exc())
        rc = 1
    finally:
        sys.argv = argv
    out.mkdir(parents=True, exist_ok=True)
    info = {"exporter": "onnxruntime-genai", "command": job["command"], "rc": rc,
            "seconds": round(time.time() - t, 1)}
    if rc != 0:
        lines = buf.getvalue().strip().splitlines()
        info["error"] = "\n".join(ln for ln in lines if "[INFO]" not in ln and "Saving " not in ln)[-3000:]
    (out / "export.json").write_text(json.dumps(info, indent=1) + "\n")
    status = "ok" if rc == 0 else "FAILED: " + (info["error"].splitlines() or ["?"])[-1][:200]
    print(f"[genai] {out.parent.parent.name}/{out.parent.name}/{out.name}: {status} ({info['seconds']} s)", flush=True)
    return info


def main() -> int:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    for job in jobs:
        run_job(job)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
