"""NVFP4 W4A4 (``convert --fp4``) beside ``--fp8``, ``--int8`` and ``--int4`` (weight-only), all for SM 12.0.

    python scripts/fp4_w4a4.py [OUT_DIR]

For each float model (the sample transformer blocks, the corpus's BERT exports in tests/data/corpus/float): the
four conversions calibrated on the same feeds, their SNR against the float model on held-out feeds (onnxruntime; the
FP4 activations through trt-bridge's exact emulation of TensorRT's dynamic FP4 quantization), and the engine size
and activation memory TensorRT-RTX reports for an ahead-of-time SM 12.0 build. Then ``--fp4 --accuracy-target``
at ``--fp8``'s SNR less 6 dB (the held-out feeds as evaluation data): the layers it moves to FP8 to get there
(``fp4/fp8`` in the form column counts the GEMMs of each). Prints a markdown table.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from trt_bridge import samples
from trt_bridge.choices import FormatOptions
from trt_bridge.conversion import convert
from trt_bridge.conversion.accuracy import convert_to_target
from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
from trt_bridge.lower.layer_precisions import layer_precisions
from trt_bridge.runtime.session import session
from trt_bridge.verification.metrics import snr_db

ROOT = Path(__file__).resolve().parents[1]
FORMS = {"--fp4": {"activations": "fp4"}, "--fp8": {"activations": "fp8"}, "--int8": {},
         "--int4": {"weights": "int4"}}


def models(folder: Path):
    """(name, float model, calibration .npz, held-out feeds) for each model measured."""
    for hidden, layers in ((128, 2), (256, 4)):
        path = folder / f"transformer-{hidden}x{layers}.onnx"
        onnx.save(samples.transformer_block(seed=0, hidden=hidden, heads=4, seq=64, layers=layers), path)
        calib = folder / f"transformer-{hidden}x{layers}.npz"
        np.savez(calib, x=samples.sequence_feeds(16, 0, 64, hidden))
        yield path.stem, path, calib, [{"x": f} for f in samples.sequence_feeds(8, 9, 64, hidden)]
    corpus = ROOT / "tests" / "data" / "corpus" / "float"
    for name in ("bert", "bert-dynamo"):
        held = np.load(corpus / f"{name}.eval.npz")
        count = len(next(iter(held.values())))
        yield name, corpus / f"{name}.onnx", corpus / f"{name}.calib.npz", [
            {k: held[k][i] for k in held.files} for i in range(count)]


def outputs(path: Path, feeds) -> list[np.ndarray]:
    s = session(path)
    return [np.concatenate([np.asarray(o).ravel() for o in s.run(None, f)]) for f in feeds]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    print("| model | form | SNR vs float (dB) | engine (MiB) | activation memory (MiB) | float engine (MiB) |")
    print("|---|---|---|---|---|---|")
    for name, src, calib, held in models(out):
        reference = outputs(src, held)
        scores = {}
        for flag, formats in FORMS.items():
            target = out / f"{name}{flag.replace('--', '.')}.onnx"
            options = ConvertOptions(calibration=CalibrationOptions(data=str(calib)), progress=False,
                                     formats=FormatOptions(compute_capability="12.0", **formats))
            try:
                report = convert(src, target, options)
            except Exception as error:  # noqa: BLE001 - a failure is a row
                print(f"| {name} | {flag} | failed: {str(error).splitlines()[0][:120]} | | | |")
                continue
            db = scores[flag] = snr_db(np.concatenate(reference), np.concatenate(outputs(target, held)))
            costs = report.costs or {}
            mine, ref = costs.get("output") or {}, costs.get("float") or {}

            def mib(value):
                return f"{value / 2**20:.2f}" if value else "?"
            print(f"| {name} | {flag} | {db:.2f} | {mib(mine.get('engine_bytes'))} | "
                  f"{mib(mine.get('activation_bytes'))} | {mib(ref.get('engine_bytes'))} |", flush=True)
        if "--fp8" in scores:
            target_row(out, name, src, calib, held, reference, scores["--fp8"] - 6.0)


def target_row(out: Path, name: str, src: Path, calib: Path, held, reference, target_db: float) -> None:
    """``--fp4 --accuracy-target target_db`` measured on the held-out feeds: one row."""
    eval_data = out / f"{name}.eval.npz"
    np.savez(eval_data, **{k: np.stack([f[k] for f in held]) for k in held[0]})
    target = out / f"{name}.fp4-target.onnx"
    options = ConvertOptions(calibration=CalibrationOptions(data=str(calib)), progress=False, check=False,
                             formats=FormatOptions(compute_capability="12.0", activations="fp4"))
    convert_to_target(src, target, options, target_db, eval_data=str(eval_data))
    counts = layer_precisions(onnx.load(str(target)))["counts"]
    db = snr_db(np.concatenate(reference), np.concatenate(outputs(target, held)))
    print(f"| {name} | --fp4 --accuracy-target {target_db:.2f} ({counts.get('fp4', 0)}/{counts.get('fp8', 0)}) | "
          f"{db:.2f} | | | |", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="fp4-w4a4-")))
