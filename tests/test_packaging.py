"""The wheel built from the checkout carries the package, trt_bridge.plugins with its CUDA sources, the entry point
and the metadata (installing it into a fresh virtualenv is left to CI runners with time: its dependencies are
heavy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    # a copy of what the build reads, so setuptools' build/ and egg-info stay out of the checkout (and a stale
    # build/lib there cannot leak removed modules into the wheel)
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("trt_bridge", "plugins"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
                             "--quiet", "--wheel-dir", str(out)], cwd=source, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    [path] = out.glob("trt_bridge-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_carries_the_package_and_the_plugin_sources(wheel):
    names = set(wheel.namelist())
    package = {Path(n).relative_to("trt_bridge").as_posix() for n in names if n.startswith("trt_bridge/")}
    expected = {p.relative_to(ROOT / "trt_bridge").as_posix() for p in (ROOT / "trt_bridge").rglob("*.py")}
    assert expected - package == set()
    assert {"plugins/__init__.py", "plugins/dynamic_gemm.cu", "plugins/plugin.py", "api.py"} <= package
    assert {p.name for p in (ROOT / "plugins").glob("*.cu")} <= {Path(n).name for n in package if n.endswith(".cu")}


def test_wheel_metadata_entry_point_and_version(wheel):
    from trt_bridge import __version__

    info = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "trt-bridge = trt_bridge.cli:main" in wheel.read(info).decode()
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert f"Version: {__version__}" in metadata and "Provides-Extra: dev" in metadata
    assert "# trt-bridge" in metadata  # the README is the long description


def test_module_entry_point_and_version():
    from trt_bridge import __version__

    version = subprocess.run([sys.executable, "-m", "trt_bridge", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"trt-bridge {__version__}"
    usage = subprocess.run([sys.executable, "-m", "trt_bridge", "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "convert" in usage.stdout


def test_wheel_installs_in_a_fresh_virtualenv(wheel, tmp_path):
    """Without its dependencies (too heavy to install again): the command line's --version and --help need none."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                              "--no-index", wheel.filename], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-4000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed wheel, not a checkout
    version = subprocess.run([str(venv / "bin" / "trt-bridge"), "--version"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60, env=env)
    assert version.returncode == 0 and version.stdout.startswith("trt-bridge "), version.stderr
    usage = subprocess.run([str(python), "-m", "trt_bridge", "--help"], capture_output=True, text=True, cwd=tmp_path,
                           timeout=60, env=env)
    assert usage.returncode == 0 and "pipeline" in usage.stdout, usage.stderr
    sources = subprocess.run([str(python), "-c", "import importlib.resources as r; "
                              "print(r.files('trt_bridge.plugins').joinpath('dynamic_gemm.cu').is_file())"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env)
    assert sources.stdout.strip() == "True", sources.stderr
