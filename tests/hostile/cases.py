"""The hostile-input cases of issue 16, one row each: how the inputs are made, the command, and what must hold.

Every row runs through the real CLI entry point (``trt_bridge.cli.main``, or ``python -m trt_bridge`` in a
subprocess where a pipe or a signal is part of the case) and must end with the expected exit code, a one-line
error holding ``fragment``, no traceback, the ``unchanged`` files byte for byte as they were and the ``absent``
files not there (no partial or non-finite model written).

The guarantees they name (docs/reliability.md):
  G1 no input of a command is ever modified or overwritten (models, feeds, scale files, manifests)
  G2 a failed conversion writes nothing: no partial model, no model with non-finite or non-positive scales
  G3 non-finite or non-positive scales and weights are refused where they enter (source model, scale file, QAT)
  G4 a feed with a NaN input or NaN outputs is skipped, with a warning and a count; none left is an error
  G5 every error is one line, non-zero exit, no traceback
  G6 a manifest cannot write outside its folder (unless --output is given) nor expand YAML aliases without bound
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

LONG = "m" * 300  # a file name over NAME_MAX (255)


@dataclass(frozen=True)
class Case:
    id: str
    guarantee: str
    make: Callable[[Path], None]  # builds the case's inputs in its folder (float.onnx, qop.onnx, ... are there)
    argv: list[str]  # {d} is the case's folder
    exit: int
    fragment: str  # in stderr (or the log), case-insensitive
    unchanged: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    subprocess: bool = False  # run `python -m trt_bridge` (pipes, signals)
    pipe_to_true: bool = False  # stdout is a pipe closed at once (`| true`)
    preamble: str = ""  # python run in the subprocess before the CLI (fault injection)
    then: Callable[[Path], None] | None = None  # further assertions on the case's folder
    env: dict[str, str | None] | None = None  # the subprocess's environment changes (None: the variable unset)
    timeout: float = 300  # seconds a subprocess may run (a hang fails the case, it does not stall the suite)
    not_in_err: tuple[str, ...] = ()  # text stderr must not hold (another library's log lines)


def nothing(d: Path) -> None:
    pass


def _edit_initializer(src: Path, dst: Path, pick: Callable[[onnx.TensorProto], bool], change) -> None:
    model = onnx.load(str(src))
    for init in model.graph.initializer:
        if pick(init):
            arr = numpy_helper.to_array(init).copy()
            init.CopyFrom(numpy_helper.from_array(change(arr).astype(arr.dtype), init.name))
            break
    else:
        raise AssertionError("no initializer matched")
    onnx.save(model, str(dst))


def weight(value: float, name: str = "w2"):
    def make(d: Path) -> None:
        def change(a):
            a.flat[0] = value
            return a
        _edit_initializer(d / "float.onnx", d / "bad.onnx", lambda t: t.name == name, change)
    return make


def _first_quantizer_scale(src: str, dst: str, value: float):
    """``src`` with the scale of its first QuantizeLinear (the input's) replaced by ``value``, written to ``dst``."""
    def make(d: Path) -> None:
        model = onnx.load(str(d / src))
        scale = next(n for n in model.graph.node if n.op_type == "QuantizeLinear").input[1]
        _edit_initializer(d / src, d / dst, lambda t: t.name == scale, lambda a: np.full_like(a, value))
    return make


def source_scale(value: float):
    """qop.onnx with the first activation scale (the input's QuantizeLinear) replaced by ``value``."""
    return _first_quantizer_scale("qop.onnx", "bad.onnx", value)


def no_outputs(d: Path) -> None:
    model = onnx.load(str(d / "float.onnx"))
    del model.graph.output[:]
    onnx.save(model, str(d / "no_outputs.onnx"))
    (d / "prev_good.onnx").write_bytes((d / "b1.onnx").read_bytes())


def input_dims(*dims):
    def make(d: Path) -> None:
        model = onnx.load(str(d / "float.onnx"))
        shape = model.graph.input[0].type.tensor_type.shape
        for dim, v in zip(shape.dim, dims):
            dim.Clear()
            dim.dim_value = v
        onnx.save(model, str(d / "bad.onnx"))
    return make


def cache(value_hex: str):
    def make(d: Path) -> None:
        (d / "bad.cache").write_text(f"TRT-100300-EntropyCalibration2\nx: {value_hex}\n")
    return make


def json_amax(tensor_kind: str, amax):
    def make(d: Path) -> None:
        doc = json.loads((d / "s.json").read_text())
        name = next(k for k, v in doc["tensors"].items() if v["kind"] == tensor_kind)
        doc["tensors"][name]["amax"] = amax
        (d / "bad.json").write_text(json.dumps(doc))
    return make


def feeds_with(fill):
    def make(d: Path) -> None:
        x = np.load(d / "calib.npz")["x"].copy()
        fill(x)
        np.savez(d / "bad.npz", x=x)
    return make


def all_nan(x):
    x[...] = np.nan


def one_huge(x):
    x.flat[0] = 3e38


def feeds_one_nan(x):
    x[1].flat[0] = np.nan


def _skipped_in_report(d: Path, skipped: int, used: int) -> None:
    calibration = json.loads((d / "r.json").read_text())["calibration"]
    assert (calibration["skipped_feeds"], calibration["feeds"]) == (skipped, used), calibration
    model = onnx.load(str(d / "out.onnx"))
    assert all(np.isfinite(numpy_helper.to_array(t)).all() for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT)


def qat_scale(value: float):
    """A QAT export (the converted b1.onnx stands in for one) whose input scale is ``value``."""
    return _first_quantizer_scale("b1.onnx", "qat.onnx", value)


def modelopt_amax(value: float):
    def make(d: Path) -> None:
        np.savez(d / "amax.npz", **{"conv1.input_quantizer._amax": np.array(value, np.float32),
                                    "conv1.weight_quantizer._amax": np.full((8, 1, 1, 1), 0.5, np.float32)})
    return make


def device(d: Path) -> None:
    """``d/null``: a private character device like /dev/null (a real /dev node would be at stake otherwise)."""
    import os
    import stat

    import pytest

    try:
        os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, AttributeError, OSError):
        pytest.skip("no permission to make a device node here")


def _still_a_device(d: Path) -> None:
    import stat

    assert stat.S_ISCHR((d / "null").stat().st_mode), "the device node was replaced by a file"


def write(name: str, text: str):
    def make(d: Path) -> None:
        (d / name).write_text(text)
    return make


def manifest(body: str):
    return write("m.yaml", "models:\n  - name: m\n    source: float.onnx\n" + body)


def nested_json(d: Path) -> None:
    depth = 200_000
    (d / "deep.json").write_text("[" * depth + "]" * depth)


ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
    f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n" for i in range(8)) + \
    "output: *i\nmodels: [{name: m, source: float.onnx}]\n"

CONVERT = ["convert", "{d}/float.onnx", "--calib-data", "{d}/calib.npz"]

CASES = [
    # ---- data loss: an output that is another input of the same command (G1)
    Case("convert-output-is-calib-data", "G1", nothing,
         ["convert", "{d}/float.onnx", "-o", "{d}/calib.npz", "--calib-data", "{d}/calib.npz"],
         2, "calib.npz", unchanged=("calib.npz",)),
    Case("verify-json-is-data", "G1", nothing,
         ["verify", "{d}/float.onnx", "{d}/b1.onnx", "--data", "{d}/calib.npz", "--json", "{d}/calib.npz"],
         2, "calib.npz", unchanged=("calib.npz",)),
    Case("convert-report-is-scale-file", "G1", nothing,
         [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/s.json", "--report", "{d}/s.json"],
         2, "s.json", unchanged=("s.json",), absent=("out.onnx",)),
    Case("convert-output-is-scale-file", "G1", nothing,
         [*CONVERT, "-o", "{d}/s.json", "--scales", "{d}/s.json"], 2, "s.json", unchanged=("s.json",)),
    Case("convert-report-is-loader", "G1", write("loader.py", "import numpy as np\n"
                                                 "def load_data():\n    return [{'x': np.zeros((1,3,16,16),"
                                                 " np.float32)}]\n"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py", "--report",
          "{d}/loader.py"], 2, "loader.py", unchanged=("loader.py",), absent=("out.onnx",)),
    Case("scales-export-over-external-data", "G1", lambda d: onnx.save(
        onnx.load(str(d / "b1.onnx")), str(d / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
        size_threshold=0), ["scales", "export", "{d}/ext.onnx", "--format", "json", "-o", "{d}/ext.onnx.data"], 2,
         "ext.onnx.data", unchanged=("ext.onnx.data",)),
    Case("pipeline-json-is-source", "G1", manifest(""),
         ["pipeline", "{d}/m.yaml", "--json", "{d}/float.onnx"], 2, "float.onnx", unchanged=("float.onnx",)),
    Case("no-graph-outputs", "G2", no_outputs,
         ["convert", "{d}/no_outputs.onnx", "-o", "{d}/prev_good.onnx", "--calib-random", "2"],
         2, "no outputs", unchanged=("prev_good.onnx", "no_outputs.onnx")),
    Case("sigterm-before-rename", "G2", nothing, [*CONVERT, "-o", "{d}/out.onnx", "-q"],
         143, "terminated", absent=("out.onnx",), subprocess=True,
         preamble="import os, signal\n_r = os.replace\n"
                  "def _replace(a, b, **k):\n    os.kill(os.getpid(), signal.SIGTERM)\n    return _r(a, b, **k)\n"
                  "os.replace = _replace\n"),
    Case("inf-weight", "G3", weight(np.inf),  # conv2 is small enough to stay float unless forced
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/calib.npz", "--include-ops", "Conv"],
         2, "w2",
         absent=("out.onnx",)),
    Case("inf-weight-left-in-float", "G3", weight(-np.inf),  # conv2 stays float: still refused at the source
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/calib.npz"], 2, "w2",
         absent=("out.onnx",)),
    Case("nan-bias", "G3", weight(np.nan, "bf"),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/calib.npz"], 2, "bf",
         absent=("out.onnx",)),
    Case("check-nan-weight", "G3", weight(np.nan, "w1"), ["check", "{d}/bad.onnx", "--trt", "off"], 1,
         "convert refuses the model"),
    Case("nan-weight", "G3", weight(np.nan, "w1"),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/calib.npz"], 2, "w1",
         absent=("out.onnx",)),
    Case("inf-source-scale", "G3", source_scale(np.inf), ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx"],
         2, "scale", absent=("out.onnx",)),
    Case("zero-source-scale", "G3", source_scale(0.0), ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx"],
         2, "scale", absent=("out.onnx",)),
    Case("negative-source-scale", "G3", source_scale(-0.02), ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx"],
         2, "scale", absent=("out.onnx",)),
    Case("nan-source-scale", "G3", source_scale(np.nan), ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx"],
         2, "scale", absent=("out.onnx",)),
    # ---- scale files (G3)
    *[Case(f"trt-cache-scale-{bits}", "G3", cache(bits),
           [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/bad.cache"], 2, "finite and positive",
           absent=("out.onnx",)) for bits in ("00000000", "00000001", "3c", "80000000", "7f800000", "7fc00000")],
    Case("json-activation-amax-0", "G3", json_amax("activation", 0),
         [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/bad.json"], 2, "amax", absent=("out.onnx",)),
    Case("json-weight-amax-0", "G3", json_amax("weight", 0),
         [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/bad.json"], 2, "amax", absent=("out.onnx",)),
    Case("json-nested-200000-deep", "G5", nested_json,
         [*CONVERT, "-o", "{d}/out.onnx", "--scales", "{d}/deep.json"], 2, "deep.json", absent=("out.onnx",)),
    # ---- calibration (G4)
    Case("calib-all-nan", "G4", feeds_with(all_nan),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/bad.npz"], 2, "non-finite",
         absent=("out.onnx",)),
    Case("calib-one-huge-value", "G4", feeds_with(one_huge),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/bad.npz"], 2, "",
         absent=("out.onnx",)),
    Case("calib-one-nan-feed", "G4", feeds_with(feeds_one_nan),  # skipped, counted, and the rest calibrate
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/bad.npz", "--report",
          "{d}/r.json"], 0, "1 calibration feed(s) of 4 skipped", then=lambda d: _skipped_in_report(d, 1, 3)),
    # ---- QAT imports (G3)
    *[Case(f"qat-onnx-scale-{name}", "G3", qat_scale(value),
           [*CONVERT, "-o", "{d}/out.onnx", "--qat", "{d}/qat.onnx"], 2, "scale", absent=("out.onnx",))
      for name, value in (("0", 0.0), ("inf", np.inf), ("nan", np.nan), ("negative", -0.05))],
    *[Case(f"modelopt-amax-{name}", "G3", modelopt_amax(value),
           [*CONVERT, "-o", "{d}/out.onnx", "--qat", "{d}/amax.npz"], 2, "amax", absent=("out.onnx",))
      for name, value in (("0", 0.0), ("inf", np.inf), ("nan", np.nan), ("negative", -1.0))],
    Case("check-zero-source-scale", "G3", source_scale(0.0), ["check", "{d}/bad.onnx", "--trt", "off"], 1,
         "convert refuses the model"),
    Case("calib-random-huge-input", "G5", input_dims(1, 3, 100_000, 100_000),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "too large",
         absent=("out.onnx",)),
    Case("calib-random-2^40-input", "G5", input_dims(1, 3, 2**40, 2**40),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "too large",
         absent=("out.onnx",)),
    Case("input-dim-negative", "G5", input_dims(1, 3, -5, 16),
         ["convert", "{d}/bad.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "-5", absent=("out.onnx",)),
    Case("loader-sys-exit-0", "G5", write("loader.py", "import sys\nsys.exit(0)\n"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py"], 2, "loader.py",
         absent=("out.onnx",)),
    Case("loader-sys-exit-in-function", "G5", write("loader.py", "import sys\ndef load_data():\n    sys.exit(3)\n"),
         ["convert", "{d}/float.onnx", "-o", "{d}/out.onnx", "--calib-data", "{d}/loader.py"], 2, "loader.py",
         absent=("out.onnx",)),
    # ---- manifests (G5, G6)
    Case("manifest-calib-data-int", "G5", manifest("    calib_data: 123\n"), ["pipeline", "{d}/m.yaml"], 2,
         "calib_data", absent=("m-output",)),
    Case("manifest-reference-list", "G5", manifest("    reference: [a, b]\n"), ["pipeline", "{d}/m.yaml"], 2,
         "reference", absent=("m-output",)),
    Case("manifest-calib-method-bogus", "G5", manifest("    calib_random: 2\n    convert: {calib_method: bogus}\n"),
         ["pipeline", "{d}/m.yaml"], 2, "calib_method", absent=("m-output",)),
    Case("manifest-percentile-200", "G5", manifest("    calib_random: 2\n    convert: {percentile: 200}\n"),
         ["pipeline", "{d}/m.yaml"], 2, "percentile", absent=("m-output",)),
    Case("manifest-output-is-file", "G5", lambda d: (manifest("")(d), (d / "m.yaml").write_text(
        "output: calib.npz\n" + (d / "m.yaml").read_text())), ["pipeline", "{d}/m.yaml"], 2, "calib.npz",
         unchanged=("calib.npz",)),
    Case("manifest-not-yaml", "G5", write("m.yaml", "models: [\n  {name: m,\n"), ["pipeline", "{d}/m.yaml"], 2,
         "not valid YAML"),
    Case("manifest-alias-bomb", "G6", write("m.yaml", ALIAS_BOMB), ["pipeline", "{d}/m.yaml"], 2, "alias"),
    Case("manifest-output-outside", "G6", lambda d: (manifest("")(d), (d / "m.yaml").write_text(
        "output: ../../../../somewhere-outside\n" + (d / "m.yaml").read_text())), ["pipeline", "{d}/m.yaml"], 2,
         "outside"),
    # ---- pipes and names (G5)
    Case("check-stdout-closed", "G5", nothing, ["check", "{d}/b1.onnx", "--trt", "off"], 141, "",
         subprocess=True, pipe_to_true=True),
    Case("convert-stdout-closed", "G5", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--skip-check"], 141, "",
         subprocess=True, pipe_to_true=True),
    Case("output-name-too-long", "G5", nothing, [*CONVERT, "-o", "{d}/" + LONG + ".onnx"], 2, "too long"),
    Case("input-name-too-long", "G5", nothing, ["convert", "{d}/" + LONG + ".onnx", "-o", "{d}/out.onnx",
                                                "--calib-random", "2"], 2, "too long", absent=("out.onnx",)),
    Case("report-name-too-long", "G5", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--report", "{d}/" + LONG],
         2, "too long", absent=("out.onnx",)),
    # ---- also found
    Case("output-is-a-device", "G1", device, [*CONVERT, "-o", "{d}/null"], 2, "not a regular file",
         then=_still_a_device),
    Case("report-to-a-device", "G1", device, [*CONVERT, "-o", "{d}/out.onnx", "--report", "{d}/null", "-q"], 0, "",
         then=_still_a_device),
    Case("report-unwritable", "G2", nothing, [*CONVERT, "-o", "{d}/out.onnx", "--report", "/proc/report.json"], 2,
         "cannot write the report", absent=("out.onnx",)),
    Case("model-is-directory", "G5", lambda d: (d / "dir.onnx").mkdir(),
         ["convert", "{d}/dir.onnx", "-o", "{d}/out.onnx", "--calib-random", "2"], 2, "directory",
         absent=("out.onnx",)),
    Case("check-model-is-directory", "G5", lambda d: (d / "dir.onnx").mkdir(), ["check", "{d}/dir.onnx"], 2,
         "directory"),
]
