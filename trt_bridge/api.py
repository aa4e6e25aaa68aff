"""The Python API: ``trt-bridge convert``, ``check``, ``verify`` and ``build``, called from Python.

Each function takes the subcommand's positional arguments, then its flags as keyword arguments named as the flags
are (``--calib-data`` is ``calib_data=``, ``--high-precision`` is ``high_precision=``), and returns the report the
command prints; its ``to_dict()`` is what ``--json`` writes. The keywords go through the command line's own parser
and option classes, so a bad value is refused with the message the CLI prints, raised as
:class:`~trt_bridge.errors.OptionError` (or another :class:`~trt_bridge.errors.TrtBridgeError`), never ``sys.exit``.

    import trt_bridge

    report = trt_bridge.convert("model.onnx", "model.trt.onnx", calib_data="calib.npz")
    print(report.summary())
    assert trt_bridge.check("model.trt.onnx").ready

Keyword values:

- a flag without a value (``--skip-check``, ``--no-smooth``) takes ``True``; a ``--no-X`` flag is also ``X=False``
  (``give_back=False`` is ``--no-give-back``);
- a repeatable flag (``--scales``, ``--min-snr``, ``--compute-capability``) takes one value or a list;
- a flag taking several values (``--plugins``, ``--shapes``) takes a list; ``--min-shapes`` and its kin take a
  list of lists for several profiles;
- ``None`` is the flag's default;
- a value is a str, a path, an int, a float or an enum; a REGEX flag (``exclude_nodes=``, ...) also takes a compiled
  ``re.Pattern`` (its pattern); anything else is refused (:class:`~trt_bridge.errors.OptionError` naming the keyword);
- every path is made absolute when the call starts, while no user code runs in any thread
  (:data:`trt_bridge.user_code.WORKING_FOLDER`): a loader changing the working folder cannot redirect it;
- models are paths or in-memory ``onnx.ModelProto``; feeds (``calib_data=``, ``eval_data=``, ``data=``) are what the
  flag takes (an ``.npz``, a folder, ``loader.py[:function]``) or numpy arrays: a dict ``{input name: array}``
  (read as an ``.npz`` is) or a list of such dicts, one feed each.

The CLI's exit status 1 is a field of the report here: ``ConversionReport.remaining_blockers`` and ``.accuracy``,
``CheckReport.ready``, ``VerifyReport.passed``; a model TensorRT refuses to build raises
:class:`~trt_bridge.tensorrt.build.EngineBuildError`.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import math
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from trt_bridge.checks.findings import CheckReport
from trt_bridge.cli import build as build_command
from trt_bridge.cli import build_args, check_args, convert_args, verify_args
from trt_bridge.cli import check as check_command
from trt_bridge.cli import convert as convert_command
from trt_bridge.cli import verify as verify_command
from trt_bridge.cli.common import absolute_paths, check_bounds, check_input_files, emit_report
from trt_bridge.conversion.report import ConversionReport
from trt_bridge.errors import OptionError, UnknownOptionError
from trt_bridge.ir.save import save_model
from trt_bridge.tensorrt.build import BuildResult
from trt_bridge.user_code import working_folder
from trt_bridge.verification import VerifyReport

__all__ = ["build", "check", "convert", "option_names", "verify"]

#: Model arguments: a path, or a model in memory
Model = str | os.PathLike | onnx.ModelProto
#: Feed arguments: what ``--calib-data`` takes, or numpy feeds
Feeds = str | os.PathLike | Mapping[str, Any] | list[Mapping[str, Any]]

#: command → (the module that adds its flags, the module whose ``execute`` runs it), as ``trt-bridge`` has them
COMMANDS = {"convert": (convert_args, convert_command), "check": (check_args, check_command),
            "verify": (verify_args, verify_command), "build": (build_args, build_command)}
#: flags with no meaning in a function call (it prints nothing; the report is returned)
NOT_OPTIONS = ("help", "verbose")
#: the options that take feeds
FEED_OPTIONS = ("calib_data", "eval_data", "data")


def convert(model: Model, output: str | os.PathLike | None = None, **options: Any) -> ConversionReport:
    """Convert ``model`` into a TensorRT-ready INT8 model written to ``output`` (``trt-bridge convert``).

    Args:
        model: the source model: a path or an ``onnx.ModelProto`` (never modified).
        output: the model to write; default ``MODEL.int8.onnx`` beside a model given as a path.
        **options: the flags of ``trt-bridge convert`` (``calib_data=``, ``calib_method=``, ``high_precision=``,
            ``exclude_nodes=``, ``scales=``, ``report=``, ...; :func:`option_names` lists them).

    Returns:
        The conversion report (``--json``'s content as ``to_dict()``, the CLI's summary as ``summary()``). A model
        that is written but that TensorRT would still not build as INT8 has ``remaining_blockers``; one that
        misses ``accuracy_target=`` has ``accuracy["met"]`` False (the CLI's exit status 1).

    Raises:
        TrtBridgeError: what the CLI reports with exit status 2 (:class:`~trt_bridge.errors.OptionError` for a bad
            option, with the CLI's message).

    Example:
        ```python
        import trt_bridge

        report = trt_bridge.convert("model.onnx", "model.trt.onnx", calib_data="calib.npz", quiet=True)
        print(report.summary())
        ```
    """
    if output is None and isinstance(model, onnx.ModelProto):
        raise OptionError("trt_bridge.convert(model, output): give the output path for a model given in memory.")
    return _run("convert", [model], {"output": output, **options})


def check(model: Model, **options: Any) -> CheckReport:
    """Why TensorRT would not build ``model`` as INT8, and what convert does about it (``trt-bridge check``).

    Args:
        model: a path or an ``onnx.ModelProto``.
        **options: the flags of ``trt-bridge check``: ``data=`` (feeds to check against the model), ``trt="off"``,
            ``plugins=``, ``costs=``, ``compute_capability=`` (the target GPU: FP8 below 8.9, FP4 below 10.0
            are blockers), ``shapes=``, ``min_shapes=``/``opt_shapes=``/``max_shapes=`` (the costs build's, as
            ``build`` takes them), ``json=FILE``.

    Returns:
        The findings: ``ready`` (the CLI's exit status 0), ``findings``, ``blockers``, ``to_dict()``.

    Example:
        ```python
        report = trt_bridge.check("model.trt.onnx", trt="off")
        assert report.ready, report.summary()
        ```
    """
    return _run("check", [model], options)


def verify(reference: Model, model: Model, data: Feeds | None = None, **options: Any) -> VerifyReport:
    """Compare ``model`` (a converted model) against ``reference`` on the same feeds (``trt-bridge verify``).

    Args:
        reference: the float model, or the original quantized one (a path or an ``onnx.ModelProto``).
        model: the converted model (the CLI's CANDIDATE).
        data: the feeds: what ``--data`` takes, or numpy feeds; None with ``random=N`` for random ones.
        **options: the flags of ``trt-bridge verify``: ``min_snr=``, ``min_cosine=``, ``max_abs=`` (a value,
            ``"OUTPUT=VALUE"``, or a list of them), ``random=``, ``seed=``, ``per_layer=True``, ``html=FILE``,
            ``engine=``, ...

    Returns:
        The comparison: ``passed`` (every gate; the CLI's exit status 0), ``outputs``, ``to_dict()``.

    Example:
        ```python
        report = trt_bridge.verify("float.onnx", "model.trt.onnx", data="calib.npz", min_snr=25)
        assert report.passed
        ```
    """
    return _run("verify", [reference, model], {"data": data, **options})


def build(model: Model, engine: str | os.PathLike | None = None, **options: Any) -> BuildResult:
    """Build a TensorRT engine and its sidecar JSON from ``model`` (``trt-bridge build``).

    Args:
        model: a TensorRT-ready ONNX model (a path or an ``onnx.ModelProto``).
        engine: the engine file; default MODEL with the suffix ``.engine``, beside a model given as a path.
        **options: the flags of ``trt-bridge build``: ``compute_capability=`` (TensorRT-RTX, ahead of time),
            ``shapes=``, ``min_shapes=``/``opt_shapes=``/``max_shapes=``, ``timing_cache=``, ``workspace=``, ...

    Returns:
        The build: ``engine``, ``sidecar`` and ``info`` (what the sidecar holds); ``to_dict()``.

    Raises:
        EngineBuildError: TensorRT refused the model (the CLI's exit status 1); a
            :class:`~trt_bridge.tensorrt.build.ModelRejectedError` carries its parser's errors.

    Example:
        ```python
        result = trt_bridge.build("model.trt.onnx", "model.engine", compute_capability="8.9")
        ```
    """
    if engine is None and isinstance(model, onnx.ModelProto):
        raise OptionError("trt_bridge.build(model, engine): give the engine path for a model given in memory.")
    if "output" in options:
        raise UnknownOptionError("trt_bridge.build() takes the engine path as `engine`, not `output=`.")
    return _run("build", [model], {"output": engine, **options})


def option_names(command: str) -> list[str]:
    """The keyword options ``trt_bridge.<command>`` takes (the flags of ``trt-bridge <command>``)."""
    if command not in COMMANDS:
        raise OptionError(f"no command '{command}'; the API's commands are: {', '.join(COMMANDS)}.")
    return sorted(set(_option_table(_command_parser(command))) - {"output"})  # the functions' own parameter


class _Parser(argparse.ArgumentParser):
    """The command line's parser, raising where the CLI would print its usage and exit 2."""

    def error(self, message: str):
        raise OptionError(message)

    def exit(self, status: int = 0, message: str | None = None):
        raise OptionError((message or "").strip() or f"the parser ended with status {status}")


def _command_parser(command: str) -> argparse.ArgumentParser:
    """The parser ``trt-bridge`` uses for ``command`` (its module adds the flags), as a :class:`_Parser`."""
    sub = _Parser(prog="trt-bridge").add_subparsers(dest="command", required=True)
    COMMANDS[command][0].add_parser(sub)
    return sub.choices[command]


def _option_table(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.Action, str, bool]]:
    """keyword → (action, flag, whether the keyword is the action's destination rather than its flag)."""
    actions = [a for a in parser._actions if a.option_strings and a.dest not in NOT_OPTIONS]
    table = {}
    for action in actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                table.setdefault(flag[2:].replace("-", "_"), (action, flag, False))
    for action in actions:  # give_back=False for --no-give-back, output= for -o
        flag = max(action.option_strings, key=len)
        table.setdefault(action.dest, (action, flag, True))
    return table


def _run(command: str, models: list[Model], options: dict[str, Any]):
    cwd = working_folder()  # once, at entry, while no user code runs: every path is absolute from here on
    parser = _command_parser(command)
    table = _option_table(parser)
    unknown = sorted(set(options) - set(table))
    if unknown:
        raise UnknownOptionError(
            f"trt_bridge.{command}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; its options "
            f"(the flags of `trt-bridge {command}`, '-' written '_') are: {', '.join(option_names(command))}.")
    with tempfile.TemporaryDirectory(prefix="trt-bridge-api-") as folder:
        argv = [_model_argument(m, Path(folder), i) for i, m in enumerate(models)]
        for name, value in options.items():
            if name in FEED_OPTIONS:
                value = _feeds_argument(value, Path(folder), name)
            argv += _tokens(name, value, *table[name])
        args = parser.parse_args(argv)
        absolute_paths(args, cwd, inputs=True)  # inputs too: another thread's loader may change the folder
        args.command = command
        if getattr(args, "json", None) == "-":
            raise OptionError(f"json=: name a file (trt_bridge.{command} returns the report; its to_dict() is the "
                              "JSON).")
        check_input_files(args)
        check_bounds(args)
        with _graphsurgeon_errors_only():
            report = COMMANDS[command][1].execute(args)
        if command != "convert" and getattr(args, "json", None):  # convert writes its own report files
            emit_report(args.json, report.to_json(), None)
        return report


@contextlib.contextmanager
def _graphsurgeon_errors_only():
    """onnx-graphsurgeon's warnings about types numpy lacks (FP8 codes, which trt-bridge reads on purpose) go to
    stdout; keep them to errors while trt-bridge works, as the command line does, then restore the caller's level."""
    from onnx_graphsurgeon.logger import G_LOGGER

    saved = G_LOGGER.severity
    G_LOGGER.severity = max(saved, G_LOGGER.ERROR)
    try:
        yield
    finally:
        G_LOGGER.severity = saved


def _tokens(name: str, value: Any, action: argparse.Action, flag: str, by_destination: bool) -> list[str]:
    """The command-line arguments that give ``value`` to the flag of ``action``."""
    if value is None:
        return []
    if action.nargs == 0:  # a switch
        if not isinstance(value, (bool, np.bool_)):
            raise OptionError(f"{name}= takes True or False (the flag {flag}), got {value!r}")
        given = value == action.const if by_destination else bool(value)
        return [flag] if given else []
    if action.nargs in ("+", "*"):  # several values: a list (a list of lists: the flag repeated)
        if isinstance(value, (str, os.PathLike)) or not isinstance(value, (list, tuple)):
            groups = [[value]]
        elif value and all(isinstance(v, (list, tuple)) for v in value):
            groups = list(value)
        else:
            groups = [list(value)]
        return [token for group in groups for token in (flag, *(_text(name, action, v) for v in group))]
    repeatable = type(action).__name__ == "_AppendAction"
    values = list(value) if repeatable and isinstance(value, (list, tuple)) else [value]
    return [f"{flag}={_text(name, action, v)}" for v in values]


def _text(name: str, action: argparse.Action, value: Any) -> str:
    """``value`` as the flag of ``action`` spells it: a str, a path (``os.PathLike``), an int or float, an enum
    (its value); for a REGEX flag (``exclude_nodes=``, ``include_ops=``, ``exclude_ops=``) also a compiled
    ``re.Pattern`` (its pattern; flags written inline, ``(?i)``). Anything else is refused, never its repr."""
    if isinstance(value, (bool, np.bool_)):
        raise OptionError(f"{name}=: {value!r} is not a value for a flag that takes one")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, re.Pattern) and action.metavar == "REGEX":
        if not isinstance(value.pattern, str) or value.flags & ~re.UNICODE:
            raise OptionError(f"{name}=: a compiled pattern is taken as its text, so its flags would be lost; write "
                              f"them inline (re.compile('(?i)...')) or pass the pattern as a str.")
        return value.pattern
    if isinstance(value, enum.Enum):
        value = value.value  # as the flag spells it
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise OptionError(f"{name}=: {value!r} is not a finite number")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    kinds = "a str or a compiled re.Pattern" if action.metavar == "REGEX" else "a str, a path, an int or a float"
    plural = " (or a list of them)" if action.nargs in ("+", "*") or type(action).__name__ == "_AppendAction" else ""
    raise OptionError(f"{name}= takes {kinds}{plural}, not {type(value).__name__} ({value!r:.80})")


def _model_argument(model: Model, folder: Path, index: int) -> str:
    """A model argument as the command line takes it: a path (a model in memory is saved to ``folder`` first)."""
    if isinstance(model, onnx.ModelProto):
        _check_loaded(model)
        return str(save_model(model, folder / f"model{index}.onnx"))
    if not isinstance(model, (str, os.PathLike)):
        raise OptionError(f"a model is a path or an onnx.ModelProto, not {type(model).__name__}")
    text = os.fspath(model)
    return f".{os.sep}{text}" if text.startswith("-") else text  # never read as a flag


def _check_loaded(model: onnx.ModelProto) -> None:
    """A model in memory holds its weights: one read with ``load_external_data=False`` keeps them in files beside the
    file it came from, which the copy trt-bridge saves cannot find."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    unloaded = [t for t in _get_all_tensors(model) if uses_external_data(t) and not t.HasField("raw_data")]
    if unloaded:
        location = next((e.value for e in unloaded[0].external_data if e.key == "location"), "?")
        raise OptionError(f"the model given in memory keeps the data of {len(unloaded)} tensor(s) in external files "
                          f"(e.g. '{unloaded[0].name}' in '{location}'), which trt-bridge cannot find from a model in "
                          "memory: load it with its data (onnx.load(path), or onnx.load_external_data_for_model("
                          "model, folder)), or pass the model's path instead.")


def _feeds_argument(value: Any, folder: Path, name: str) -> Any:
    """Numpy feeds as the flag takes them: a dict of arrays as an ``.npz``, a list of dicts as a folder of them."""
    if value is None or isinstance(value, (str, os.PathLike)):
        return value
    if isinstance(value, Mapping):
        path = folder / f"{name}.npz"
        np.savez(path, **_arrays(value, name))
        return str(path)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
        feeds = folder / name
        feeds.mkdir()
        for i, feed in enumerate(value):
            np.savez(feeds / f"{i:06d}.npz", **_arrays(feed, name))
        return str(feeds)
    raise OptionError(f"{name}= takes a path (an .npz, a folder of feeds, loader.py[:function]), a dict "
                      f"{{input name: array}} or a list of such dicts, not {type(value).__name__}")


def _arrays(feed: Mapping[str, Any], name: str) -> dict[str, np.ndarray]:
    arrays = {}
    for key, array in feed.items():
        if not isinstance(key, str):
            raise OptionError(f"{name}=: feeds are keyed by input name (a str), not {key!r}")
        arrays[key] = np.asarray(array)
    return arrays
