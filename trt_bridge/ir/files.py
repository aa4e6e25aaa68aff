"""Paths and files: name lengths, the same file twice, external-data files, writable targets, atomic writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trt_bridge.errors import ModelLoadError, TrtBridgeError
from trt_bridge.ir.external_sizes import check_external_sizes

if TYPE_CHECKING:  # onnx is imported where a model is read: the command line's --help imports this module
    import onnx


def check_name_lengths(path: str | os.PathLike, what: str) -> None:
    """Refuse a path with a component longer than the file system takes (``NAME_MAX``, 255 bytes on most), which
    the operating system would only report as errno 36 deep inside a read or a write."""
    path = Path(path)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > 255:
            raise TrtBridgeError(f"the {what} path {str(path)[:80]}... has a file name of {size} bytes: too long "
                                 "(file systems take at most 255). Choose a shorter name.")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name the same file (through links and ``..``; a file that does not exist yet
    compares by its resolved path)."""
    try:
        if Path(a).exists() and Path(b).exists():
            return os.path.samefile(a, b)
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return os.path.abspath(a) == os.path.abspath(b)


def external_locations(model: onnx.ModelProto) -> dict[str, list[str]]:
    """External-data file name → the tensors stored in it."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    locations: dict[str, list[str]] = {}
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            locations.setdefault(location, []).append(tensor.name)
    return locations


def external_data_files(path: str | os.PathLike) -> list[Path]:
    """The external-data files a model file refers to (read from its header only), each checked by
    :func:`check_external_data`: the one gate every command's reader (onnx, onnxruntime, TensorRT's parser) passes.
    A file that is not readable as ONNX has none here (its reader says what is wrong with it)."""
    import onnx

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not ONNX (or not there): the command's own reader names the problem
        return []
    return check_external_data(model, path)


def check_external_data(model: onnx.ModelProto, path: str | os.PathLike) -> list[Path]:
    """Check the external data of ``model`` (its header, read from ``path``) before anything opens it, and return
    its files. Refused (ModelLoadError), naming the file and a tensor: a location outside the model's folder
    (absolute, ``..``, or through a symbolic link: the reader would embed another file's bytes), a missing file, one
    that is not a regular file (a pipe would block the reader forever, ``/dev/zero`` never end) and a tensor whose
    declared size or ``offset``/``length`` lie beyond the file's end. Every reader of a model goes through here:
    ``load_model`` (convert, check, verify, scales, pipeline), onnxruntime sessions on a path (verify, bench) and
    TensorRT's parser (build, check, convert's own check, costs)."""
    import stat

    path = Path(path)
    folder = path.parent
    real_folder = Path(os.path.realpath(folder))
    locations = external_locations(model)
    missing = {}
    for location, names in locations.items():
        where = f"{path}: tensor '{names[0]}' stores its data in '{location}'"
        plain = Path(os.path.normpath(real_folder / location))
        if not location or os.path.isabs(location) or real_folder not in plain.parents:
            raise ModelLoadError(f"{where}, which is not a file inside the model's folder {folder}; external data "
                                 "must lie beside the model. Re-save the model with a relative location.")
        target = folder / location
        if not os.path.lexists(target):
            missing[location] = names
            continue
        real = Path(os.path.realpath(target))
        if real != plain:
            raise ModelLoadError(f"{where}, which is a symbolic link (to {real}); external data is read from regular "
                                 "files in the model's folder only (a link could point anywhere). Copy the data file "
                                 f"into {folder} in place of the link.")
        if not stat.S_ISREG(os.stat(target).st_mode):
            raise ModelLoadError(f"{where}, which is not a regular file (a named pipe, a socket, a device or a "
                                 "folder): trt-bridge reads external data from regular files only (a pipe would block "
                                 "the reader). Give the model its data file.")
    if missing:
        lines = ", ".join(f"'{loc}' (tensors {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                          for loc, names in sorted(missing.items()))
        raise ModelLoadError(f"{path}: external data file(s) missing next to the model: {lines}. Copy the data "
                             f"file(s) into {folder} alongside the .onnx file.")
    check_external_sizes(model, path)  # a truncated data file, or one of another model
    return [folder / loc for loc in sorted(locations)]


def is_special_file(path: str | os.PathLike) -> bool:
    """``path`` (through links) exists and is neither a regular file nor a folder: a device (``/dev/null``), a
    pipe, a socket. Such a target is written into, never replaced."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def check_regular_input(path: str | os.PathLike, what: str) -> None:
    """Refuse an input that exists but is not a regular file (a named pipe, a socket, a device) before it is opened:
    reading a pipe blocks until a writer comes, which may be never."""
    if is_special_file(path):
        raise TrtBridgeError(f"the {what} {path} is not a regular file (a named pipe, a socket or a device): "
                             "trt-bridge reads regular files only (a pipe would block it). Give a regular file.")


def inside_folder(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` (existing or not) lies inside the existing folder ``folder`` (through links and ``..``)."""
    try:
        if not Path(folder).is_dir():
            return False
        return Path(folder).resolve() in Path(path).resolve().parents
    except (OSError, RuntimeError):
        return False


def check_link_target(path: str | os.PathLike, what: str) -> None:
    """Refuse a symbolic link that leads nowhere (writing through it would make folders nobody named) or in a
    loop (nothing can be written through it)."""
    path = Path(path)
    if not path.is_symlink():
        try:  # a link loop above the file name
            path.resolve(strict=False)
        except (OSError, RuntimeError):
            raise TrtBridgeError(f"the {what} path {path} goes through a symbolic link loop; give a path whose "
                                 "links lead somewhere.") from None
        return
    try:
        path.resolve(strict=True)
    except RuntimeError:
        raise TrtBridgeError(f"the {what} path {path} is a symbolic link in a loop (it leads to itself); remove the "
                             "link or give another path.") from None
    except OSError:
        raise TrtBridgeError(f"the {what} path {path} is a symbolic link to {os.readlink(path)}, which does not "
                             "exist; writing through it would create files and folders nobody named. Remove the "
                             "link or give another path.") from None


def check_writable(path: str | os.PathLike, what: str) -> None:
    """Fail before any work if ``path`` cannot be written (``what``: 'output model', 'report', ...)."""
    path = Path(path)
    check_name_lengths(path, what)
    check_link_target(path, what)
    if is_special_file(path) and what == "output model":
        raise TrtBridgeError(f"the {what} {path} is not a regular file (a device, a pipe or a socket): a model is "
                             "written atomically, by replacing the file, which would replace that node. Give a regular "
                             "file path.")
    if is_special_file(path):
        return  # a device or a pipe (a report to /dev/stdout): written into, never replaced
    if path.is_dir():
        raise TrtBridgeError(f"the {what} path {path} is a directory; give a file name (e.g. {path / 'model.onnx'}).")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise TrtBridgeError(f"cannot write the {what} {path}: {parent} is a file, not a directory.")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise TrtBridgeError(f"cannot write the {what} {path}: permission denied in {parent}. "
                             "Choose a writable location.")
    try:  # os.access trusts the mode bits: a read-only mount, /proc or root squash only show when writing
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".trt-bridge-probe-"):
            pass
    except OSError as exc:
        raise TrtBridgeError(f"cannot write the {what} {path}: {exc.strerror or exc} in {parent}. Choose a writable "
                             "location.") from None


def write_bytes_atomic(path: str | os.PathLike, data: bytes, what: str = "file") -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then a rename. The file gets the
    usual mode (0666 less the umask), not the temporary file's private 0600."""
    path = Path(path)
    if is_special_file(path):  # /dev/stdout, /dev/null, a pipe: written into, never replaced
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise TrtBridgeError(f"cannot write the {what} {path}: {exc.strerror or exc}.") from exc
        return path
    if path.is_symlink():  # replace what the link points to, and keep the link
        path = path.resolve()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=".trt-bridge-", delete=False) as f:
            tmp = f.name
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise TrtBridgeError(f"cannot write the {what} {path}: {exc.strerror or exc}. Choose a writable "
                             "location.") from exc
    return path


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> Path:
    """Write a text file (a report) atomically, UTF-8 with Unix newlines."""
    return write_bytes_atomic(path, text.encode("utf-8"), what)

