"""The ``trt-bridge`` command line. Subcommands live in one module each."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
import warnings

from trt_bridge import __version__
from trt_bridge.cli.commands import COMMANDS, arguments_module
from trt_bridge.cli.common import EXIT_ERROR, absolute_paths, check_bounds, check_input_files
from trt_bridge.errors import Terminated, TrtBridgeError
from trt_bridge.runtime.process import own_process


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Only the subcommand ``argv`` names has its arguments' module imported and its
    flags added (every one when ``argv`` is None); the others are listed with their one-line help, so
    ``trt-bridge --help`` imports no subcommand, and a subcommand's ``--help`` nothing heavy
    (:mod:`trt_bridge.cli.commands`)."""
    parser = argparse.ArgumentParser(
        prog="trt-bridge",
        description="Get quantized ONNX models onto NVIDIA TensorRT as real INT8 engines.",
    )
    parser.add_argument("--version", action="version", version=f"trt-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for name, (_, text) in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(arguments_module(name)).add_parser(sub)
        else:
            sub.add_parser(name, help=text, add_help=False)  # listed; its flags are added when it is chosen
    return parser


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else
                                          logging.INFO if verbose == 1 else logging.WARNING)
    logging.basicConfig(level=level, format="[%(levelname)s] %(message)s", stream=sys.stderr)
    logging.getLogger("trt_bridge").setLevel(level)


def _quiet_graphsurgeon(verbose: int) -> None:
    """onnx-graphsurgeon prints its warnings (a type numpy lacks, a missing colour module) on stdout, where
    they would corrupt `--json` output: keep them to errors unless -vv is given."""
    from onnx_graphsurgeon.logger import G_LOGGER

    G_LOGGER.colors = False
    if verbose < 2:
        G_LOGGER.severity = G_LOGGER.ERROR


#: the signals that end a command like Ctrl-C does (unwinding: nothing committed, temporary files removed)
ENDING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _on_signal(signum, frame) -> None:
    raise Terminated(signum, signal.Signals(signum).name)


def _stdout_gone() -> None:
    """The reader of stdout went away (``| head``, ``| true``): send whatever is still buffered to /dev/null, so
    the interpreter's final flush raises nothing either."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _printable_streams() -> None:
    """Whatever stdout and stderr encode (ASCII in a C locale), printing a path or a name they cannot encode must
    not fail after the work is done: such characters are written as backslash escapes (\\xf6)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a text file of the io module (a test's capture)
            pass


def _return_freed_memory() -> None:
    """Have glibc's malloc serve allocations of 1 MiB and more (weights) with mmap, always: its default raises that
    threshold as large blocks are freed, after which freed weights stay in the heap, counted against the process.
    With it, a model over 2 GB is held about once less through convert. No-op where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """The CLI. Whatever happens, it ends with an exit status and at most one line on stderr: 0/1 as each command
    documents, 2 for an error in the input (or an unexpected one, whose traceback ``-vv`` shows), 130 on Ctrl-C,
    141 when stdout's reader went away, 143 on SIGTERM and 129 on SIGHUP (temporary files removed, no output
    written: outputs are committed only once the command has succeeded, :mod:`trt_bridge.ir.commit`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    _printable_streams()
    absolute_paths(args)  # before any user code (a loader, a plugin file) can change the working folder
    _return_freed_memory()
    verbose = getattr(args, "verbose", 0)
    try:
        check_input_files(args)  # a pipe or a device as an input: refused before anything opens it
        check_bounds(args)  # every numeric option within its documented bound (trt_bridge.choices.BOUNDS)
    except TrtBridgeError as exc:
        print(f"trt-bridge {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    level_before = logging.getLogger("trt_bridge").level  # restored when main returns (a caller's own process)
    _configure_logging(verbose, getattr(args, "quiet", False))
    _quiet_graphsurgeon(verbose)
    if verbose < 2:
        own_process()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, _on_signal) for signum in ENDING_SIGNALS}
    try:
        with warnings.catch_warnings():
            if verbose < 2:  # numpy's overflow/invalid-value warnings are noise to a user; -vv shows them
                warnings.simplefilter("ignore", RuntimeWarning)
            return importlib.import_module(COMMANDS[args.command][0]).run(args)  # the command's work
    except TrtBridgeError as exc:
        print(f"trt-bridge {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"trt-bridge {args.command}: terminated ({exc.name}); nothing was left half-written", file=sys.stderr)
        return 128 + exc.signum
    except BrokenPipeError:
        _stdout_gone()
        return 141
    except OSError as exc:  # a file system refusal the command did not foresee: a name too long, a full disk
        where = f" {exc.filename}" if exc.filename else ""
        print(f"trt-bridge {args.command}: error: {exc.strerror or exc}:{where}"[:2000], file=sys.stderr)
        return EXIT_ERROR
    except (RecursionError, MemoryError) as exc:
        print(f"trt-bridge {args.command}: error: out of {'memory' if isinstance(exc, MemoryError) else 'stack'} "
              f"({type(exc).__name__}: {_one_line(exc)}); the input is too large or too deeply nested.",
              file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - a bug: one line for the user, the traceback with -vv
        logging.getLogger("trt_bridge").debug("traceback of the unexpected error", exc_info=True)
        print(f"trt-bridge {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug in "
              "trt-bridge; please report it with the command and its input; -vv shows the traceback)", file=sys.stderr)
        return EXIT_ERROR
    except BaseException as exc:  # noqa: BLE001 - SystemExit, CancelledError, ... from a library: never "success"
        logging.getLogger("trt_bridge").debug("traceback of the unexpected exit", exc_info=True)
        code = f"({exc.code!r})" if isinstance(exc, SystemExit) else ""
        print(f"trt-bridge {args.command}: error: the command was ended by {type(exc).__name__}{code}"
              f"{': ' + _one_line(exc) if str(exc) and not code else ''} before it finished; nothing it did is "
              "complete (-vv shows the traceback).", file=sys.stderr)
        return EXIT_ERROR
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        logging.getLogger("trt_bridge").setLevel(level_before)


def _one_line(exc: BaseException, limit: int = 2000) -> str:
    """``exc``'s message on one line (multi-line messages, such as a list of blockers, keep their lines
    joined with ' | '), at most ``limit`` characters."""
    text = " | ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return text if len(text) <= limit else text[:limit] + " ..."
