"""Issue 8's measurements on real models: plain INT8, `--accuracy-target`, and `--high-precision fp16|bf16`.

    python scripts/measure_precision.py MODEL.onnx:N,C,H,W [...] [--target-gain DB]

For each float model: convert with calibration on document-like inputs (16 feeds), measure the SNR
against the float model on 16 held-out feeds (onnxruntime, Q/DQ simulated as TensorRT computes), then
convert with `--accuracy-target` = plain INT8 + DB (default 3 dB) and report what it gave back, then
with `--high-precision fp16` and `bf16` and report their SNR beside the float32 one (bfloat16 emulated in
float32, as `verify` runs it) and whether TensorRT-RTX builds them. `--no-target` skips the accuracy target.
The PP-OCRv4 detector and recognizer (a transformer) come in the `rapidocr-onnxruntime` 1.4.4 wheel.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from measure_real_models import outputs, pages  # noqa: E402

from trt_bridge.conversion import convert  # noqa: E402
from trt_bridge.conversion.accuracy import convert_to_target  # noqa: E402
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions, PrecisionOptions  # noqa: E402
from trt_bridge.verification.metrics import snr_db  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="MODEL.onnx:N,C,H,W")
    parser.add_argument("--target-gain", type=float, default=3.0)
    parser.add_argument("--no-target", action="store_true", help="only the high-precision columns")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    print("| model | INT8 SNR dB | target dB | reached dB | layers given back | INT8 layers left | fp32-HP SNR | "
          "fp16-HP SNR | bf16-HP SNR | builds (SM 8.9) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for item in args.models:
        path, _, shape_text = item.rpartition(":")
        shape = tuple(int(d) for d in shape_text.split(","))
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            import onnx

            name = onnx.load(path, load_external_data=False).graph.input[0].name
            calib, held = pages(16, 1, shape), pages(16, 2, shape)
            np.savez(work / "calib.npz", **{name: calib})
            np.savez(work / "eval.npz", **{name: held})
            reference = outputs(Path(path), held, simulate=False)
            base = ConvertOptions(calibration=CalibrationOptions(data=str(work / "calib.npz")), progress=False,
                                  check=False)
            convert(path, work / "int8.onnx", base)
            plain = snr_db(reference, outputs(work / "int8.onnx", held))
            target, reached, given, ranked, left = plain + args.target_gain, "-", "-", "-", "-"
            if not args.no_target:
                _, result = convert_to_target(path, work / "target.onnx", base, target, str(work / "eval.npz"))
                reached = f"{snr_db(reference, outputs(work / 'target.onnx', held)):.2f}"
                given, ranked, left = len(result.chosen.excluded), len(result.ranking), result.chosen.quantized_layers
            from trt_bridge.tensorrt.build import build_engine

            snrs, builds = {}, []
            for hp in ("fp16", "bf16"):
                options = replace(base, precision=PrecisionOptions(high_precision=hp))
                report = convert(path, work / f"{hp}.onnx", options)
                snrs[hp] = snr_db(reference, outputs(work / f"{hp}.onnx", held))
                try:
                    build_engine(work / f"{hp}.onnx", compute_capability="SM89", shapes={name: shape})
                    built = "yes"
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    built = f"no ({type(exc).__name__})"
                layers = ", ".join(f"{k} {v}" for k, v in report.precision["counts"].items())
                builds.append(f"{hp} {built} ({layers})")
            print(f"| {Path(path).name} | {plain:.2f} | {target:.2f} | {reached} | {given} of {ranked} | {left} | "
                  f"{plain:.2f} | {snrs['fp16']:.2f} | {snrs['bf16']:.2f} | {'; '.join(builds)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
