"""Reading and writing scale files safely: every reader and writer of :mod:`trt_bridge.scales` goes through here.

Reading refuses a missing, unreadable or empty file with a message naming it; JSON that does not parse,
or is nested too deeply to parse (Python's recursion limit), is refused with the file and line.
Writing checks the output path first, then writes atomically (a temporary file beside it, then a rename).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.files import check_writable, write_text_atomic


def read_bytes(path: Path) -> bytes:
    """The bytes of the scale file ``path``; an error when it is missing, unreadable or empty."""
    if not path.is_file():
        raise TrtBridgeError(f"{path}: no such file. Check the path to the scale file.")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TrtBridgeError(f"{path}: cannot read the scale file ({exc}).") from exc
    if not data.strip():
        raise TrtBridgeError(f"{path}: the scale file is empty.")
    return data


def decoded(path: Path) -> tuple[str | None, bytes]:
    """The file's text (None when it is not UTF-8: a binary format) and its bytes."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8"), data
    except UnicodeDecodeError:
        return None, data


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of the scale file ``path``; ``what`` names the format expected, for the error."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrtBridgeError(f"{path}: not a text file, so not a {what} ({exc}).") from exc


def parse_json(text: str, path: Path):
    """``text`` (the content of ``path``) parsed as JSON; an error naming the file and line when it is not."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrtBridgeError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno}).") from exc
    except RecursionError:
        raise TrtBridgeError(f"{path}: JSON nested too deeply to be a scale table (a scale table is two objects "
                             "deep).") from None


def write_text_file(path: str | os.PathLike, text: str, what: str) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    check_writable(path, what)
    return write_text_atomic(path, text, what)
