"""Measure trt-bridge on the real-weight corpus: one row per (model, form), in
docs/real-models-table.json and docs/real-models-table.md.

    python scripts/realmodels/run.py [--cache .corpus/realmodels] [--only NAME ...] [--forms FORM ...]
        [--calib 16] [--eval 16] [--timeout 900] [--json docs/real-models-table.json]
        [--markdown docs/real-models-table.md]
        [--baseline OLD.json] [--table-only]

Forms: ``float-int8`` / ``float-fp8`` (the float model, calibrated by trt-bridge, ``--int8`` / ``--fp8``),
``dynamic`` (onnxruntime ``quantize_dynamic``, int8 per-channel weights; calibrated by trt-bridge), ``qdq`` and
``qop`` (``quantize_static`` QDQ / QOperator, uint8 activations, int8 per-channel weights, calibrated by onnxruntime
on the same feeds; converted with the model's own scales). Each row: the source's SNR against the float model (as
onnxruntime runs it), the converted model's SNR against the float model and against the source (Q/DQ simulated in
float, as TensorRT computes), the worst output's, on held-out feeds (other seeds, other pictures); whether
``trt-bridge check`` finds it TensorRT-ready (TensorRT-RTX's parser included); and whether TensorRT-RTX builds it
ahead of time for SM 8.9 at the manifest's shapes. Every row runs in its own process (``--one``): a crash, a
timeout or an exception becomes that row's error, never the end of the run. Run it before and after a change:
``--baseline`` names the rows that moved (a build gained or lost, an error, a worst SNR more than 1 dB away).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import feeds as feed_makers  # noqa: E402
from fetch import fetch  # noqa: E402
from manifest import BY_NAME, MODELS, RealModel  # noqa: E402
from table import changes, markdown  # noqa: E402

FORMS = ("float-int8", "float-fp8", "dynamic", "qdq", "qop")


def _save_feeds(folder: Path, feeds: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, feed in enumerate(feeds):
        np.savez(folder / f"feed{i:03d}.npz", **feed)
    return folder


def _load_feeds(folder: Path) -> list[dict]:
    return [dict(np.load(f)) for f in sorted(folder.glob("*.npz"))]


def prepare(model: RealModel, files: Path, work: Path, calib: int, held: int) -> Path:
    """The float model as the sources are made from it (constants folded; opset 13 at least, which onnxruntime's
    per-channel Q/DQ needs), and its calibration and held-out feeds (keyed by its input names)."""
    import onnx
    import onnx.version_converter
    import onnx_graphsurgeon as gs

    float_path = work / "float.onnx"
    if float_path.is_file():
        return float_path
    work.mkdir(parents=True, exist_ok=True)
    graph = gs.import_onnx(onnx.load(str(files / model.member)))
    graph.fold_constants().cleanup()
    proto = gs.export_onnx(graph)
    if next(i.version for i in proto.opset_import if i.domain in ("", "ai.onnx")) < 13:
        proto = onnx.version_converter.convert_version(proto, 13)
    inputs = [i.name for i in proto.graph.input]
    make = getattr(feed_makers, model.feeds)
    for name, count, seed in (("calib", calib, 1), ("eval", held, 2)):
        feeds = make(files, count, seed)
        if set(feeds[0]) != set(inputs) and len(inputs) == len(feeds[0]) == 1:
            feeds = [{inputs[0]: next(iter(f.values()))} for f in feeds]
        _save_feeds(work / name, feeds)
    onnx.save(proto, str(float_path))
    return float_path


def make_source(form: str, float_path: Path, out: Path, calib: list[dict]) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if form.startswith("float"):
        return float_path
    if form == "dynamic":
        quantize_dynamic(str(float_path), str(out), per_channel=True, weight_type=QuantType.QInt8)
        return out

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter(calib)

        def get_next(self):
            return next(self._feeds, None)

    quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QDQ if form == "qdq"
                    else QuantFormat.QOperator, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return out


def _worst(report) -> dict:
    """The worst output's SNR (dB), each output's, and the worst top-1 agreement of classifier-like outputs."""
    snrs = {o.output: round(float(o.snr_db), 2) for o in report.outputs}
    top1 = [o.top1 for o in report.outputs if o.top1 is not None]
    return {"worst": min(snrs.values()) if snrs else None, "outputs": snrs, "top1": min(top1) if top1 else None}


def _shapes(eval_dir: Path) -> list[str]:
    """The build's fixed shapes: the held-out feeds' (NAME:DIMS)."""
    return [f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in _load_feeds(eval_dir)[0].items()]


def float_build(model: RealModel, cache: Path, calib: int, held: int) -> dict:
    """Whether TensorRT-RTX builds the float model itself (SM 8.9): a row whose conversion does not build is then
    TensorRT's limit, not the conversion's."""
    import trt_bridge

    work = cache / "work" / model.name
    float_path = prepare(model, cache / "files", work, calib, held)
    try:
        built = trt_bridge.build(float_path, work / "float.engine", compute_capability="8.9",
                                 shapes=_shapes(work / "eval"), quiet=True)
        return {"model": model.name, "form": "float", "built": True,
                "engine_mib": round(built.info["engine"]["size"] / 2**20, 2)}
    except Exception as exc:  # recorded, as every stage's error
        return {"model": model.name, "form": "float", "built": False, "error": f"{type(exc).__name__}: {exc}"[:400]}


def one(model: RealModel, form: str, cache: Path, calib: int, held: int) -> dict:
    """Make the source, convert, verify, check and build one (model, form); every stage's result or error."""
    import trt_bridge

    if form == "float":
        return float_build(model, cache, calib, held)
    row: dict = {"model": model.name, "form": form}
    files = cache / "files"
    work = cache / "work" / model.name
    float_path = prepare(model, files, work, calib, held)
    calib_dir, eval_dir = work / "calib", work / "eval"
    stage = "source"
    try:
        t = time.time()
        source = make_source(form, float_path, work / f"{form}.src.onnx", _load_feeds(calib_dir))
        row["source_seconds"] = round(time.time() - t, 1)
        if source != float_path:
            row["source_snr"] = _worst(trt_bridge.verify(float_path, source, data=eval_dir, quiet=True))["worst"]
        stage = "convert"
        out = work / f"{form}.trt.onnx"
        options = {"fp8": True} if form == "float-fp8" else {"int8": True}
        if form in ("float-int8", "float-fp8", "dynamic"):
            options["calib_data"] = calib_dir
        t = time.time()
        report = trt_bridge.convert(source, out, quiet=True, skip_check=True, **options)
        row["convert_seconds"] = round(time.time() - t, 1)
        row["given_back"] = len((report.given_back or {}).get("layers", []) or [])
        stage = "verify"
        row["snr_vs_float"] = _worst(trt_bridge.verify(float_path, out, data=eval_dir, quiet=True))
        if source != float_path:
            row["snr_vs_source"] = _worst(trt_bridge.verify(source, out, data=eval_dir, quiet=True))["worst"]
        stage = "check"
        checked = trt_bridge.check(out, costs="off", quiet=True)
        row["ready"] = checked.ready
        row["parser"] = None if checked.parser is None else {"ok": checked.parser.ok, "errors": checked.parser.errors}
        row["blockers"] = [f"[{f.rule}] {f.where}: {f.why}"[:300] for f in checked.blockers]
        stage = "build"
        t = time.time()
        built = trt_bridge.build(out, work / f"{form}.engine", compute_capability="8.9", shapes=_shapes(eval_dir),
                                 quiet=True)
        row["build_seconds"] = round(time.time() - t, 1)
        row["engine_mib"] = round(built.info["engine"]["size"] / 2**20, 2)
        row["built"] = True
    except Exception as exc:  # a row, not the end of the run
        row["error"] = f"{stage}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc) else ''}"
        row["traceback"] = traceback.format_exc()[-3000:]
        row.setdefault("built", False)
    return row


def run_row(name: str, form: str, args) -> dict:
    """``one`` in a process of its own, so that a crash or a hang is this row's error."""
    result = args.cache / "work" / name / f"{form}.row.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--one", name, form, "--cache", str(args.cache), "--calib", str(args.calib),
           "--eval", str(args.eval)]
    t = time.time()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "form": form, "built": False, "error": f"timeout after {args.timeout} s"}
    if result.is_file():
        row = json.loads(result.read_text())
    else:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        row = {"model": name, "form": form, "built": False,
               "error": f"process ended with status {done.returncode}: {tail[0][:300]}"}
    row["seconds"] = round(time.time() - t, 1)
    if row.get("error"):  # the work folder's paths differ from one checkout to the next
        row["error"] = row["error"].replace(f"{args.cache / 'work' / name}/", "")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=ROOT / ".corpus" / "realmodels")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME))
    parser.add_argument("--forms", nargs="+", choices=FORMS, help="default: all (the float model's build always)")
    parser.add_argument("--calib", type=int, default=16)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "real-models-table.json",
                        help="the rows (tracebacks stay in CACHE/work/MODEL/FORM.row.json)")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "real-models-table.md")
    parser.add_argument("--baseline", type=Path, help="an earlier run's JSON: list what changed against it")
    parser.add_argument("--table-only", action="store_true", help="rewrite the markdown from the JSON; run nothing")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "FORM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    if args.one:
        name, form = args.one
        row = one(BY_NAME[name], form, args.cache, args.calib, args.eval)
        (args.cache / "work" / name / f"{form}.row.json").write_text(json.dumps(row, indent=1))
        return 0
    models = [BY_NAME[n] for n in args.only] if args.only else MODELS
    json_path = args.json
    rows = json.loads(json_path.read_text()) if json_path.is_file() else []
    if not args.table_only:
        fetch(models, args.cache)
    for model in [] if args.table_only else models:
        for form in dict.fromkeys(("float", *(args.forms or model.forms))):  # the float build first
            row = {k: v for k, v in run_row(model.name, form, args).items() if k != "traceback"}
            rows = [r for r in rows if (r["model"], r["form"]) != (model.name, form)] + [row]
            print(json.dumps(row), flush=True)
            json_path.write_text(json.dumps(rows, indent=1))
    order = {m.name: i for i, m in enumerate(MODELS)}
    rows.sort(key=lambda r: (order.get(r["model"], 99), ("float", *FORMS).index(r["form"])))
    json_path.write_text(json.dumps(rows, indent=1))
    args.markdown.write_text(markdown(rows, MODELS))
    print(f"{json_path}, {args.markdown}")
    if args.baseline:
        found = changes(rows, json.loads(args.baseline.read_text()))
        print("\n".join(found) if found else f"no change against {args.baseline}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
