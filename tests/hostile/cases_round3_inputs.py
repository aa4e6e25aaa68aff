"""The hostile-input cases of issue 37 ("hostile input, round three"), one row each, run by ``test_hostile.py`` as
``cases.py``'s rows are (same :class:`Case`, same assertions).

``EXTERNAL_DATA_CASES`` (G7, G1): a model whose external data is a symbolic link out of its folder, a named pipe, a
link to ``/dev/zero``, a location with ``..`` or an absolute one, or a file that is a folder, is refused by every
command before anything opens it (``build`` embedded the linked file's bytes and hung on a pipe); external data in a
real subfolder still builds. ``BOUNDS_CASES`` (G9): every numeric option has a documented bound, checked where it
enters (``trt_bridge.choices.BOUNDS``): one line, exit 2, nothing written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx

from tests.hostile.cases import CONVERT, Case, nothing
from tests.hostile.conftest import float_net


def _external(d: Path, folder: str = "ext", location: str = "ext.data") -> Path:
    """``d/folder/m.onnx`` with every weight in ``d/folder/location``."""
    (d / folder).mkdir(exist_ok=True)
    (d / folder / Path(location).parent).mkdir(parents=True, exist_ok=True)
    onnx.save(float_net(), str(d / folder / "m.onnx"), save_as_external_data=True, location=location,
              size_threshold=0)
    return d / folder / location


def linked_outside(d: Path) -> None:
    """ext/ext.data is a link to secret/w.data, outside the model's folder."""
    data = _external(d)
    (d / "secret").mkdir()
    shutil.move(str(data), d / "secret" / "w.data")
    data.symlink_to(d / "secret" / "w.data")


def fifo_data(d: Path) -> None:
    data = _external(d)
    data.unlink()
    os.mkfifo(data)


def dev_zero_data(d: Path) -> None:
    data = _external(d)
    data.unlink()
    data.symlink_to("/dev/zero")


def folder_data(d: Path) -> None:
    data = _external(d)
    data.unlink()
    data.mkdir()


def linked_subfolder(d: Path) -> None:
    """ext/sub/w.data where ext/sub is a link to a folder elsewhere."""
    data = _external(d, location="sub/w.data")
    (d / "elsewhere").mkdir()
    shutil.move(str(data), d / "elsewhere" / "w.data")
    (d / "ext" / "sub").rmdir()
    (d / "ext" / "sub").symlink_to(d / "elsewhere")


def relocated(location: str):
    """ext/m.onnx whose header names ``location`` (``../w.data``, an absolute path) for its data, which is there."""
    def make(d: Path) -> None:
        data = _external(d)
        model = onnx.load(str(d / "ext" / "m.onnx"), load_external_data=False)
        target = Path(location) if os.path.isabs(location) else d / "ext" / location
        if not os.path.isabs(location):
            shutil.copy(data, target)
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save(model, str(d / "ext" / "m.onnx"))
    return make


def in_subfolder(d: Path) -> None:
    _external(d, location="weights/w.data")


EXT = "{d}/ext/m.onnx"
BUILD = ["build", EXT, "-o", "{d}/e.engine"]
LINK = "is a symbolic link"
NOT_REGULAR = "not a regular file"
NO_ENGINE = ("e.engine", "e.engine.json")

EXTERNAL_DATA_CASES = [
    # ---- a link out of the model's folder: build embedded the linked file (exit 0); every command refuses it now
    Case("ext-link-outside-build", "G7", linked_outside, BUILD, 2, LINK, unchanged=("secret/w.data",),
         absent=NO_ENGINE),
    Case("ext-link-outside-check", "G7", linked_outside, ["check", EXT], 2, LINK),
    Case("ext-link-outside-convert", "G7", linked_outside, ["convert", EXT, "-o", "{d}/out.onnx", "--calib-random",
                                                          "2"], 2, LINK, absent=("out.onnx",)),
    Case("ext-link-outside-verify-reference", "G7", linked_outside, ["verify", EXT, "{d}/b1.onnx", "--random", "2"],
         2, LINK),
    Case("ext-link-outside-bench", "G7", linked_outside, ["bench", EXT, "--iterations", "2", "--costs", "off"], 2,
         LINK),
    Case("ext-link-outside-scales-export", "G7", linked_outside,
         ["scales", "export", EXT, "--format", "json", "-o", "{d}/s2.json"], 2, LINK, absent=("s2.json",)),
    Case("ext-subfolder-link-build", "G7", linked_subfolder, BUILD, 2, LINK, absent=NO_ENGINE),
    Case("ext-dotdot-location-build", "G7", relocated("../w.data"), BUILD, 2, "not a file inside the model's folder",
         absent=NO_ENGINE),
    Case("ext-absolute-location-build", "G7", relocated("/etc/hostname"), BUILD, 2,
         "not a file inside the model's folder", absent=NO_ENGINE),
    Case("ext-dotdot-location-check", "G7", relocated("../w.data"), ["check", EXT, "--trt", "off"], 2,
         "not a file inside the model's folder"),
    # ---- a pipe or a device as external data: build hung forever; refused before anything opens it
    Case("ext-fifo-build", "G7", fifo_data, BUILD, 2, NOT_REGULAR, absent=NO_ENGINE, subprocess=True, timeout=120),
    Case("ext-fifo-check", "G7", fifo_data, ["check", EXT], 2, NOT_REGULAR, subprocess=True, timeout=120),
    Case("ext-fifo-bench", "G7", fifo_data, ["bench", EXT, "--iterations", "2", "--costs", "off"], 2, NOT_REGULAR,
         subprocess=True, timeout=120),
    Case("ext-fifo-verify-candidate", "G7", fifo_data, ["verify", "{d}/float.onnx", EXT, "--random", "2"], 2,
         NOT_REGULAR, subprocess=True, timeout=120),
    Case("ext-dev-zero-build", "G7", dev_zero_data, BUILD, 2, LINK, absent=NO_ENGINE, subprocess=True, timeout=120),
    Case("ext-folder-build", "G7", folder_data, BUILD, 2, NOT_REGULAR, absent=NO_ENGINE),
    # ---- what stays accepted: external data in a real subfolder of the model's folder
    Case("ext-in-subfolder-builds", "G7", in_subfolder, BUILD, 0, "sidecar"),
]

BOUNDS_CASES = [
    Case("bound-block-size-huge", "G9", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--int4", "--block-size",
                                                        "1073741824"], 2, "from 2 to 4096", absent=("out.onnx",)),
    Case("bound-calib-max-huge", "G9", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--calib-max",
                                                       "1000000000000"], 2, "at most 1000000", absent=("out.onnx",)),
    Case("bound-eval-random-huge", "G9", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--accuracy-target", "20",
                                                         "--eval-random", "1000000000"], 2, "--eval-random must be",
         absent=("out.onnx",)),
    Case("bound-accuracy-target-huge", "G9", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--accuracy-target",
                                                             "1e308"], 2, "from -1000 to 1000", absent=("out.onnx",)),
    Case("bound-verify-random-huge", "G9", nothing, ["verify", "{d}/float.onnx", "{d}/b1.onnx", "--random",
                                                           "1000000000"], 2, "--random must be at least 1 and at most"),
    Case("bound-verify-top-k-huge", "G9", nothing, ["verify", "{d}/float.onnx", "{d}/b1.onnx", "--random", "2",
                                                          "--top-k", "1000000000000"], 2, "--top-k must be"),
    Case("bound-verify-layer-feeds-huge", "G9", nothing,
         ["verify", "{d}/float.onnx", "{d}/b1.onnx", "--random", "2", "--per-layer", "--layer-feeds", "100000000000"],
         2, "--layer-feeds must be"),
    Case("bound-verify-steps-huge", "G9", nothing, ["verify", "{d}/float.onnx", "{d}/b1.onnx", "--random", "2",
                                                          "--steps", "10000000000"], 2, "--steps must be"),
    Case("bound-verify-min-cosine-above-1", "G9", nothing,
         ["verify", "{d}/float.onnx", "{d}/b1.onnx", "--random", "2", "--min-cosine", "5"], 2, "-1 to 1"),
    Case("bound-verify-max-abs-negative", "G9", nothing,
         ["verify", "{d}/float.onnx", "{d}/b1.onnx", "--random", "2", "--max-abs", "logits=-1"], 2, "0 or more"),
    Case("bound-bench-iterations-huge", "G9", nothing, ["bench", "{d}/b1.onnx", "--iterations", "100000000000"],
         2, "--iterations must be at least 1 and at most", timeout=60, subprocess=True),
    Case("bound-bench-warmup-huge", "G9", nothing, ["bench", "{d}/b1.onnx", "--warmup", "100000000000"], 2,
         "--warmup must be 0 or more", timeout=60, subprocess=True),
    Case("bound-bench-duration-huge", "G9", nothing, ["bench", "{d}/b1.onnx", "--duration", "1e300"], 2,
         "at most 86400", timeout=60, subprocess=True),
    Case("bound-bench-threads-huge", "G9", nothing, ["bench", "{d}/b1.onnx", "--threads", "100000000"], 2,
         "--threads must be at least 1 and at most 1024", timeout=60, subprocess=True),
    Case("bound-build-workspace-huge", "G9", nothing, ["build", "{d}/b1.onnx", "-o", "{d}/e.engine",
                                                             "--workspace", "100000T"], 2, "at most 1T",
         absent=NO_ENGINE),
    Case("bound-build-shape-dimension-huge", "G9", nothing,
         ["build", "{d}/b1.onnx", "-o", "{d}/e.engine", "--shapes", "x:99999999999999999999x3x16x16"], 2,
         "at most 2147483647", absent=NO_ENGINE),
    Case("bound-check-shape-volume-huge", "G9", nothing,
         ["check", "{d}/b1.onnx", "--shapes", "x:65536x65536x3x1"], 2, "at most 2147483647"),
]
