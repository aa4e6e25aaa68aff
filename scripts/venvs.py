"""The virtualenvs the corpus scripts run exporters and quantizers in (never trt-bridge's own dependencies)."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path


def venv_python(folder: Path, packages: list[str], tag: str) -> Path | None:
    """``folder``'s python, the venv made and filled with ``packages`` on first use (again when they change; its
    ``pip freeze`` beside it); None if they do not install. ``tag`` prefixes the progress lines."""
    python = folder / "bin" / "python"
    stamp = folder / ".installed"
    if not stamp.is_file() or stamp.read_text() != " ".join(packages):
        print(f"[{tag}] creating {folder} ({' '.join(packages)})", flush=True)
        venv.create(folder, with_pip=True, clear=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *packages])
        if done.returncode != 0:
            print(f"[{tag}] {folder.name}: its packages did not install; skipped", flush=True)
            return None
        stamp.write_text(" ".join(packages))
        freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
        (folder / "pip-freeze.txt").write_text(freeze)
    return python
