"""Write the example pipeline's fixtures: sample models (float and onnxruntime quantize_dynamic) and their
calibration and evaluation feeds, plus feeds for the shared zoo models that need calibration.

    python scripts/pipeline/make_fixtures.py [--out pipeline-example]

`make pipeline-example` runs this, then `trt-bridge pipeline scripts/pipeline/example.yaml`.
Everything is seeded: the same files every time.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "pipeline-example")
    args = parser.parse_args()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from trt_bridge import samples

    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice to pre-process the model
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    fixtures = {
        "conv_net": (samples.conv_net(), lambda n, s: samples.image_feeds(n, s)),
        "encoder": (samples.transformer_block(layers=2), lambda n, s: samples.sequence_feeds(n, s, 16, 64)),
    }
    for name, (model, feeds) in fixtures.items():
        onnx.save(model, str(out / f"{name}.float.onnx"))
        quantize_dynamic(str(out / f"{name}.float.onnx"), str(out / f"{name}.dynamic.onnx"), per_channel=False,
                         weight_type=QuantType.QUInt8)
        np.savez(out / f"{name}.calib.npz", x=feeds(32, 1))
        np.savez(out / f"{name}.eval.npz", x=feeds(16, 2))
    np.savez(out / "mnist.calib.npz", Input3=samples.digit_feeds(32, 1))
    np.savez(out / "mnist.eval.npz", Input3=samples.digit_feeds(16, 2))
    print(f"fixtures written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
