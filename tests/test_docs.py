"""The documentation site builds strictly (`make docs`): no broken link, anchor, include or API reference, and the
API reference names the public functions. (Its examples run in tests/test_readme.py.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    assert MKDOCS is not None, "mkdocs is not installed: pip install -e '.[dev]' (make test does)"
    out = tmp_path_factory.mktemp("site")
    # from another folder than the checkout's root: every include is found relative to mkdocs.yml (issue 38)
    result = subprocess.run([MKDOCS, "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                            cwd=out.parent, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def test_site_builds_strictly_with_every_page(site):
    pages = ["getting-started", "guide/convert", "guide/check", "guide/verify", "guide/build", "guide/bench",
             "guide/pipeline", "guide/scales", "calibration", "precision", "sources", "accuracy", "dynamic-int8",
             "reliability", "results", "corpus", "real-models", "api", "ARCHITECTURE", "layout", "changelog"]
    assert (site / "index.html").is_file()
    assert [p for p in pages if not (site / p / "index.html").is_file()] == []


def test_home_page_lists_the_formats_the_readme_lists(site):
    """The site's home page and the README name the same formats (the home page said INT8 only)."""
    formats = ("INT8", "FP8", "INT4 weight-only", "FP4")
    first = (ROOT / "README.md").read_text().splitlines()[2]
    assert all(f in first for f in formats)
    home = re.sub(r"<[^>]+>", "", (site / "index.html").read_text())
    assert all(f in home for f in formats)


def test_api_reference_names_the_public_functions(site):
    text = re.sub(r"<[^>]+>", "", (site / "api" / "index.html").read_text())
    for name in ("convert", "check", "verify", "build"):
        assert f"trt_bridge.{name}" in text
    assert "calib_data" in text and "OptionError" in text


def test_generated_tables_are_included_not_pasted(site):
    """The measurement pages include the files the scripts write (pymdownx.snippets), which are not pages
    themselves."""
    results = (site / "results" / "index.html").read_text()
    assert "scripts/accuracy_table.py" in results and "cost_table.py" in results
    assert (ROOT / "docs" / "corpus-matrix.md").read_text().count("| ") > 100
    assert "585 of 585 cells" in (site / "corpus" / "index.html").read_text()
    assert not (site / "accuracy-table").exists()


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#[\w-]+)?\)", readme):
        assert (ROOT / link).is_file(), link
