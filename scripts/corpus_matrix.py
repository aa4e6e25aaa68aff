"""Convert every corpus model, build it with TensorRT-RTX; write the matrix as markdown (docs/corpus-matrix.md).

    python scripts/corpus_matrix.py [OUT] [--only ARCH ...] [--cells TOOL-MODE ...] [--markdown FILE] [--json FILE]

OUT (default ``.corpus``) is what ``scripts/corpus/build.py`` made: ``OUT/float/<arch>.onnx`` with
``.calib.npz`` / ``.eval.npz``, and ``OUT/quantized/<tool>-<mode>/<arch>.onnx``. For each cell:

- the source's SNR against the float model on the held-out feeds (onnxruntime runs the source as it
  is, its own integer kernels; where it cannot, the value the quantizer's script measured with its
  own custom-op library in ``OUT/quantized/<tool>-source-snr.json``, else '-');
- ``trt-bridge convert``: dynamic sources and float models calibrated on the 16 calibration feeds,
  static sources with their own scales (``--scales model``), an AIMET float export with its encodings
  (``<arch>.encodings`` beside it, as ``--scales``; its source SNR is that of ``<arch>.sim.onnx``, the same
  quantization as AIMET simulates it, exported as Q/DQ);
- the converted model's SNR (Q/DQ simulated in float, as TensorRT computes) on the same feeds;
- whether TensorRT-RTX parses it and builds it ahead of time for SM 8.9.

SNR is of the first output, in dB, over all held-out feeds. A cell that fails says where.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, ScaleOptions
from trt_bridge.errors import TrtBridgeError
from trt_bridge.verification.metrics import snr_db

STATIC_HINTS = ("static", "qdq", "qop", "xint8", "a8w8", "a16w8", "bfp", "default", "mixed", "transformer")


@dataclass
class Cell:
    arch: str
    column: str
    source_snr: float | None = None
    converted: bool = False
    snr: float | None = None
    parses: bool | None = None
    builds: bool | None = None
    error: str | None = None
    seconds: float | None = None
    rules: dict | None = None


def _feeds(path: Path) -> list[dict]:
    data = dict(np.load(path))
    count = len(next(iter(data.values())))
    return [{k: v[i] for k, v in data.items()} for i in range(count)]


def _outputs(model: Path, feeds: list[dict], simulate: bool) -> np.ndarray:
    from trt_bridge.runtime.session import session

    sess = session(model, simulate_qdq=simulate)
    names = {i.name for i in sess.get_inputs()}
    return np.concatenate([np.asarray(sess.run(None, {k: v for k, v in f.items() if k in names})[0]).ravel()
                           for f in feeds])


def _is_dynamic(column: str) -> bool:
    return "dynamic" in column or column == "float"


def _measured_by_quantizer(column: str, source: Path) -> float | None:
    """The source's SNR as its quantizer script measured it with its own custom-op library
    (``OUT/quantized/<tool>-source-snr.json``, keyed ``<tool>-<mode>/<arch>.onnx``), if it did."""
    table = source.parents[1] / f"{column.split('-')[0]}-source-snr.json"
    if not table.is_file():
        return None
    value = json.loads(table.read_text()).get(f"{column}/{source.name}")
    return round(float(value), 2) if isinstance(value, int | float) else None


def measure(arch: str, column: str, source: Path, float_dir: Path, work: Path, reference: np.ndarray) -> Cell:
    from trt_bridge.tensorrt.build import build_engine
    from trt_bridge.tensorrt.parse import parse

    cell = Cell(arch, column)
    held_out = _feeds(float_dir / f"{arch}.eval.npz")
    if column != "float":
        # a float export with its encodings (AIMET) is measured as its quantizer simulates it: '<arch>.sim.onnx'
        simulated = source.with_suffix(".sim.onnx")
        try:
            cell.source_snr = round(snr_db(reference, _outputs(simulated if simulated.is_file() else source,
                                                               held_out, simulate=False)), 2)
        except Exception:  # onnxruntime cannot run some quantizers' custom ops: their script may have measured it
            cell.source_snr = _measured_by_quantizer(column, source)
    calib = str(float_dir / f"{arch}.calib.npz")
    scales = tuple(str(p) for p in (source.with_suffix(".encodings"),) if p.is_file())
    options = ConvertOptions(calibration=CalibrationOptions(data=calib if _is_dynamic(column) or scales else None),
                             scales=ScaleOptions(files=scales), progress=False, check=False)
    out = work / f"{column}-{arch}.onnx"
    t0 = time.perf_counter()
    try:
        try:
            report = convert(source, out, options)
        except TrtBridgeError as exc:
            if options.calibration.data is not None or "no static scale" not in str(exc):
                raise
            # a static source with some tensors left to calibrate: give it the data
            report = convert(source, out, ConvertOptions(calibration=CalibrationOptions(data=calib),
                                                         scales=ScaleOptions(policy=None), progress=False, check=False))
    except Exception as exc:
        cell.error = f"{type(exc).__name__}: {exc}"
        return cell
    cell.seconds = round(time.perf_counter() - t0, 2)
    cell.converted = True
    cell.rules = {r.rule: len(r.nodes) for r in report.rules}
    try:
        cell.snr = round(snr_db(reference, _outputs(out, held_out, simulate=True)), 2)
    except Exception as exc:  # still try TensorRT: onnxruntime's optimizer has failed where TensorRT builds
        cell.error = f"onnxruntime: {_first_line(str(exc))[:300]}"
    parsed = parse(out)
    cell.parses = parsed.ok
    if not cell.parses:
        cell.error = f"TensorRT's parser: {'; '.join(parsed.errors) or 'rejects it'}"
    if cell.parses:
        try:
            build_engine(out)
            cell.builds = True
        except Exception as exc:
            cell.builds, cell.error = False, f"build: {exc}"
    return cell


def _first_line(text: str | None) -> str:
    return next(iter((text or "").splitlines()), "")


def _mark(cell: Cell) -> str:
    if not cell.converted:
        return "✗ convert"
    if not cell.builds:
        return f"{cell.snr:.1f} ✗ build" if cell.snr is not None else "✗ build"
    if cell.snr is None:
        return "✗ onnxruntime"
    src = "–" if cell.source_snr is None else f"{cell.source_snr:.1f}"
    return f"{cell.snr:.1f} ({src})" if cell.column != "float" else f"{cell.snr:.1f}"


def _table(cells: list[Cell], columns: list[str]) -> list[str]:
    archs = sorted({c.arch for c in cells if c.column in columns})
    by = {(c.arch, c.column): c for c in cells}
    lines = ["| architecture | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for arch in archs:
        lines.append(f"| {arch} | " + " | ".join(_mark(by[arch, col]) if (arch, col) in by else ""
                                                  for col in columns) + " |")
    return lines


def _counts(cells: list[Cell]) -> tuple[int, int, int, int]:
    """(cells that convert and build, cells, quantized cells within 1 dB of their source, measurable ones)"""
    ok = sum(1 for c in cells if c.converted and c.builds)
    measured = [c for c in cells if c.column != "float" and c.builds and c.source_snr is not None
                and c.snr is not None]
    return ok, len(cells), sum(1 for c in measured if c.snr >= c.source_snr - 1.0), len(measured)


def markdown(cells: list[Cell]) -> str:
    """One table per quantizer (columns ``<tool>-<mode>``; onnxruntime's first, with the float column), then the
    totals."""
    quantized = sorted({c.column for c in cells} - {"float"}, key=lambda c: (not c.startswith("ort-"), c))
    tools: dict[str, list[str]] = {}
    for column in ["float"] * any(c.column == "float" for c in cells) + quantized:
        tool = (quantized[0] if quantized else column).split("-")[0] if column == "float" else column.split("-")[0]
        tools.setdefault(tool, []).append(column)
    lines: list[str] = []
    for tool, columns in tools.items():
        ok, total, within, measured = _counts([c for c in cells if c.column in columns and c.column != "float"])
        lines += [*_table(cells, columns), "", f"{tool}: {ok} of {total} quantized cells convert and build; "
                  f"{within} of {measured} with a measurable source are within 1 dB of it or better.", ""]
    ok, total, within, measured = _counts(cells)
    lines += [f"{ok} of {total} cells convert and build for SM 8.9; {within} of {measured} quantized cells with a "
              "measurable source are within 1 dB of their source's SNR or better."]
    failures = [c for c in cells if not (c.converted and c.builds)]
    if failures:
        lines += ["", "Cells that do not convert or build:", ""]
        lines += [f"- {c.column} / {c.arch}: {_first_line(c.error)[:300]}" for c in failures]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?", default=Path(".corpus"))
    ap.add_argument("--only", nargs="*", help="architectures")
    ap.add_argument("--cells", nargs="*", help="columns (tool-mode, or 'float')")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from-json", type=Path, help="write the tables of a matrix measured before (its --json)")
    args = ap.parse_args()
    if args.from_json:
        table = markdown([Cell(**c) for c in json.loads(args.from_json.read_text())])
        print(table)
        if args.markdown:
            args.markdown.write_text(table)
        return 0
    logging.disable(logging.WARNING)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    float_dir = args.out / "float"
    sources = [("float", p) for p in sorted(float_dir.glob("*.onnx"))]
    sources += [(p.parent.name, p) for p in sorted((args.out / "quantized").glob("*/*.onnx"))]
    sources = [(col, p) for col, p in sources if (float_dir / p.name).is_file()
               and (not args.only or p.stem in args.only) and (not args.cells or col in args.cells)]
    cells, references = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for column, path in sources:
            arch = path.stem
            if arch not in references:
                references[arch] = _outputs(float_dir / path.name, _feeds(float_dir / f"{arch}.eval.npz"), False)
            cell = measure(arch, column, path, float_dir, Path(tmp), references[arch])
            cells.append(cell)
            print(f"{column:>24} {arch:<22} {_mark(cell)}"
                  + (f"  {_first_line(cell.error)[:160]}" if cell.error else ""), flush=True)
    table = markdown(cells)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
