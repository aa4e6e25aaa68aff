"""What every subcommand shares: exit statuses, the output flags, the output-path check and ``--json``."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.files import check_writable, external_data_files, same_file, write_text_atomic

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    group.add_argument("-q", "--quiet", action="store_true", help="only errors; no progress bars")
    group.add_argument("--json", nargs="?", const="-", metavar="FILE",
                       help="write the report as JSON to FILE, or to stdout without FILE")


def add_plugins_flag(parser) -> None:
    """``--plugins PATH ...``: TensorRT plugin libraries or Python files registering plugin creators."""
    parser.add_argument("--plugins", nargs="+", action="extend", default=[], metavar="PATH",
                        help="TensorRT plugins to register first: plugin libraries (.so) or Python files that "
                             "register plugin creators (.py); trt-bridge's own plugins need no flag")


def check_output_path(path, protected, what: str) -> None:
    """Fail before any work if the file ``path`` (a report, an export, a model) would overwrite one of
    ``protected`` (every file the command reads: models, their external data, feeds, scale files, loader
    scripts, and its other outputs), or cannot be written."""
    if path is None or str(path) == "-":
        return
    protected = [p for p in protected if p is not None and str(p) != "-"]
    for model in list(protected):  # a model's external data is as much an input as the model
        if str(model).endswith(".onnx") and Path(model).is_file():
            try:
                protected += external_data_files(model)
            except Exception:  # noqa: BLE001 - an unreadable model fails later, with its own message
                pass
    for other in protected:
        if same_file(path, other):
            raise TrtBridgeError(f"the {what} {path} is also {other}, which this command reads or writes; it would "
                                 f"be overwritten. Choose another file name for the {what}.")
    check_writable(path, what)


def emit_report(json_target: str | None, json_text: str, text: str | None) -> None:
    """What ``--json`` asks for: ``-`` prints the JSON report instead of ``text``; a FILE gets it written
    (atomically) and ``text`` is printed too. ``text`` None prints nothing (``--quiet``)."""
    if json_target == "-":
        print(json_text)
        return
    if json_target:
        write_text_atomic(json_target, json_text + "\n")
    if text is not None:
        print(text)
