"""Measure SNR (dB vs the float model) of dynamic sources and of their conversions per calibration method.

    python scripts/accuracy_table.py [--shared ../shared/models]

Prints the markdown table the README quotes. Calibration and evaluation feeds are
different seeds of the same synthetic generators (trt_bridge.samples).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from trt_bridge import samples
from trt_bridge.calibrate.observers import CalibMethod
from trt_bridge.convert import convert
from trt_bridge.convert.options import CalibrationOptions, ConvertOptions
from trt_bridge.runtime.session import session
from trt_bridge.verify.metrics import snr_db


def _run(path: Path, feeds: np.ndarray) -> np.ndarray:
    sess = session(path)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: f})[0] for f in feeds])


def _row(label: str, float_path: Path, dynamic_path: Path, calib: np.ndarray, held_out: np.ndarray,
         workdir: Path) -> str:
    input_name = onnx.load(str(float_path), load_external_data=False).graph.input[0].name
    np.savez(workdir / "calib.npz", **{input_name: calib})
    reference = _run(float_path, held_out)
    cells = [f"{snr_db(reference, _run(dynamic_path, held_out)):.1f}"]
    for method in CalibMethod:
        out = workdir / f"converted-{method.value}.onnx"
        convert(dynamic_path, out, ConvertOptions(calibration=CalibrationOptions(data=str(workdir / "calib.npz"),
                                                                                 method=method), progress=False))
        cells.append(f"{snr_db(reference, _run(out, held_out)):.1f}")
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "models")
    args = parser.parse_args()
    print("| model (onnxruntime `quantize_dynamic`, uint8 weights) | dynamic source | "
          + " | ".join(m.value for m in CalibMethod) + " |")
    print("|---|---" + "|---" * len(CalibMethod) + "|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        mnist = args.shared / "mnist-12.onnx"
        if mnist.is_file():
            print(_row("ONNX Model Zoo MNIST (`mnist-12-uint8`)", mnist, args.shared / "mnist-12-uint8.onnx",
                       samples.digit_feeds(32, 1)[:, 0], samples.digit_feeds(200, 2), work))
        else:
            print(f"(skipping MNIST: {mnist} not found)", file=sys.stderr)
        for label, model, calib, held_out in (
            ("sample conv net", samples.conv_net(), samples.image_feeds(32, 1), samples.image_feeds(32, 2)),
            ("sample 2-layer transformer encoder", samples.transformer_block(layers=2),
             samples.sequence_feeds(32, 1, 16, 64)[:, 0], samples.sequence_feeds(32, 2, 16, 64)),
        ):
            fpath = work / "float.onnx"
            onnx.save(model, str(fpath))
            dpath = work / "dynamic.onnx"
            quantize_dynamic(str(fpath), str(dpath), weight_type=QuantType.QUInt8)
            print(_row(label, fpath, dpath, calib, held_out, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
