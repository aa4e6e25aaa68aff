"""A command's outputs as one unit: staged, then committed together once the command has succeeded.

Every file a command writes (a converted model and its ``.data``, its ``--report``, an engine and its sidecar) is
first written into a hidden folder beside its target (``.trt-bridge-*``, on the same file system) and renamed into
place by :meth:`Outputs.commit`, all of them one after the other:

- with each target folder locked (``fcntl.flock`` on the folder itself: no lock file is left behind), so two runs
  writing the same outputs at once commit one after the other, and the outputs are always all of one run;
- with SIGINT, SIGTERM and SIGHUP held until the last rename, so a signal can never leave some of the outputs of a
  run beside the others of an earlier one (the signal takes effect right after);
- a failure before the commit (an error, a signal, a failed check) removes the staged files and leaves the targets
  as they were; a rename that fails takes back the renames before it.

A target that is a device or a pipe (``--report /dev/stdout``) is written into at the commit, never replaced.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from pathlib import Path

from trt_bridge.errors import TrtBridgeError

#: the signals held while outputs are renamed into place
HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP are recorded, not acted on, inside the block; the first one that came is acted
    on (its previous handler called) when it ends. Only the main thread handles signals: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {}
    for signum in HELD_SIGNALS:
        try:
            previous[signum] = signal.signal(signum, lambda s, f: arrived.append(s))
        except (OSError, ValueError):
            pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if arrived:
            signum = arrived[0]
            handler = previous.get(signum)
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def _is_special(path: Path) -> bool:
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


@contextlib.contextmanager
def folders_locked(folders):
    """An exclusive ``flock`` on each folder (in a fixed order, so two runs cannot deadlock), held in the block."""
    import fcntl

    fds = []
    try:
        for folder in sorted({str(Path(f)) for f in folders}):
            try:
                fd = os.open(folder, os.O_RDONLY)
            except OSError:
                continue  # not lockable (removed meanwhile): the rename reports it
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass  # a file system without flock: the renames are still atomic one by one
        yield
    finally:
        for fd in fds:
            os.close(fd)  # closing releases the lock


class Outputs:
    """The outputs of one command, staged beside their targets until :meth:`commit`. Use as a context manager: on
    leaving it, whatever was not committed is removed."""

    def __init__(self) -> None:
        self._folders: dict[Path, tempfile.TemporaryDirectory] = {}
        self._staged: dict[Path, Path | bytes] = {}  # target → staged file (or the bytes for a device/pipe)
        self.committed = False

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()

    @staticmethod
    def target(path: str | os.PathLike) -> Path:
        """Where ``path`` is written: absolute, through a link to a file (the link is kept)."""
        path = Path(path).absolute()
        return path.resolve() if path.is_symlink() else path

    def folder(self, path: str | os.PathLike) -> Path:
        """The staging folder beside ``path``'s target (made on first use)."""
        parent = self.target(path).parent
        if parent not in self._folders:
            parent.mkdir(parents=True, exist_ok=True)
            self._folders[parent] = tempfile.TemporaryDirectory(dir=parent, prefix=".trt-bridge-")
        return Path(self._folders[parent].name)

    def stage(self, path: str | os.PathLike) -> Path:
        """The staged file for ``path`` (same name, in the staging folder), to be written by the caller."""
        target = self.target(path)
        if target in self._staged:
            raise TrtBridgeError(f"{path} is written twice by one command; give each output its own path.")
        staged = self.folder(target) / target.name
        self._staged[target] = staged
        return staged

    def stage_bytes(self, path: str | os.PathLike, data: bytes, what: str = "file") -> Path:
        """Stage ``data`` for ``path``; returns the staged file (or the target, for a device or a pipe)."""
        target = self.target(path)
        if _is_special(target):  # /dev/stdout, a pipe: written into at the commit
            self._staged[target] = bytes(data)
            return target
        staged = self.stage(target)
        try:
            staged.write_bytes(data)
        except OSError as exc:
            raise TrtBridgeError(f"cannot write the {what} {path}: {exc.strerror or exc}. Choose a writable "
                                 "location.") from exc
        return staged

    def stage_text(self, path: str | os.PathLike, text: str, what: str = "file") -> Path:
        return self.stage_bytes(path, text.encode("utf-8"), what)

    def staged(self, path: str | os.PathLike) -> Path | None:
        found = self._staged.get(self.target(path))
        return found if isinstance(found, Path) else None

    def commit(self) -> list[Path]:
        """Rename every staged file into place, under the folders' locks and with signals held; returns the
        targets. A rename that fails removes the targets renamed before it (no mixed set is left) and raises."""
        umask = os.umask(0)
        os.umask(umask)
        done: list[Path] = []
        with signals_held(), folders_locked(self._folders):
            try:
                for target, staged in self._staged.items():
                    if isinstance(staged, bytes):
                        with open(target, "wb") as f:
                            f.write(staged)
                        continue
                    if not staged.exists():
                        continue  # staged but never written (the command wrote nothing there)
                    os.chmod(staged, 0o666 & ~umask)
                    os.replace(staged, target)
                    done.append(target)
            except OSError as exc:
                for target in done:
                    target.unlink(missing_ok=True)
                raise TrtBridgeError(f"cannot write {exc.filename or 'an output'}: {exc.strerror or exc}; no "
                                     "output of this run was kept. Check free space and permissions.") from exc
            self.committed = True
        self.discard()
        return done

    def discard(self) -> None:
        """Remove the staging folders and what is still in them."""
        for folder in self._folders.values():
            folder.cleanup()
        self._folders.clear()
        if not self.committed:
            self._staged.clear()
