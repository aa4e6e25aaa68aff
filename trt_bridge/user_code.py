"""Running the user's own Python code (data-loader scripts, ``--plugins`` files): the one place that does.

User code may do anything: call ``sys.exit(0)`` (which would end the command with "success"), raise a
``BaseException`` that is not an ``Exception`` (``asyncio.CancelledError``, ``GeneratorExit``), or change the
working folder. :func:`user_code` turns every such ending into a one-line :class:`TrtBridgeError` naming the file,
and puts the working folder back; only Ctrl-C and SIGTERM pass through (they stop the command as they always do).
Paths given on the command line are made absolute before any user code runs (``trt_bridge.cli``), so a
changed folder cannot redirect an output either.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from trt_bridge.errors import Terminated, TrtBridgeError

log = logging.getLogger("trt_bridge.user_code")

#: held while user code runs (it may change the working folder, which is the whole process's) and while the
#: Python API reads the working folder to make its paths absolute (:func:`working_folder`): a loader that changes
#: it in one thread cannot redirect another thread's relative paths
WORKING_FOLDER = threading.RLock()


def working_folder() -> str | None:
    """The process's working folder, read when no user code is running in any thread (None: it was removed)."""
    with WORKING_FOLDER:
        return _cwd()


@contextmanager
def user_code(what: str, error: type[TrtBridgeError] = TrtBridgeError, hint: str = "",
              failed: str = "the user code failed") -> Iterator[None]:
    """Run the block (the user's code) so that nothing it does ends the command: ``what`` names it in the
    error ("loader.py:load_data, at feed 3"), ``hint`` says what it should do instead, ``failed`` what an exception
    it raises means."""
    with WORKING_FOLDER:
        yield from _guarded(what, error, hint, failed)


def _guarded(what: str, error: type[TrtBridgeError], hint: str, failed: str) -> Iterator[None]:
    cwd = _cwd()
    try:
        yield
    except (KeyboardInterrupt, Terminated, TrtBridgeError):
        raise
    except SystemExit as exc:
        raise error(f"{what}: the user code called sys.exit({exc.code!r}); it must not end the process"
                    f"{hint}.") from None
    except Exception as exc:  # noqa: BLE001 - the user's code: say where it failed
        raise error(f"{what}: {failed} ({type(exc).__name__}: {_first_line(exc)}){hint}.") from exc
    except BaseException as exc:  # noqa: BLE001 - CancelledError, GeneratorExit, ...: one line, not a traceback
        raise error(f"{what}: the user code raised {type(exc).__name__}{': ' + _first_line(exc) if str(exc) else ''}"
                    f"{hint}.") from None
    finally:
        if cwd is not None and _cwd() != cwd:
            log.warning("%s changed the working folder; trt-bridge changed it back to %s", what, cwd)
            os.chdir(cwd)


def import_user_file(path: Path, module_name: str, what: str, error: type[TrtBridgeError] = TrtBridgeError,
                     hint: str = "") -> ModuleType:
    """Run the Python file ``path`` as module ``module_name`` under :func:`user_code`."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise error(f"{what}: not a Python file that can be imported.")
    module = importlib.util.module_from_spec(spec)
    with user_code(what, error, hint, failed="running it failed: it failed to import"):
        spec.loader.exec_module(module)
    return module


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + " ..."


__all__ = ["WORKING_FOLDER", "import_user_file", "user_code", "working_folder"]
