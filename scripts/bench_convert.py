"""Benchmark ``trt_bridge.conversion.convert`` on a BERT-base-sized encoder, or on a model you give.

    python scripts/bench_convert.py                          # 12 layers, hidden 768, seq 128 (≈85 M params)
    python scripts/bench_convert.py --layers 2 --hidden 256  # a quick run
    python scripts/bench_convert.py --model dynamic.onnx --calib-data calib.npz
    python scripts/bench_convert.py --json

The encoder (trt_bridge.samples.transformer_block) is built, quantized with onnxruntime's
quantize_dynamic and given seeded calibration feeds in a child process, so that this
process's peak memory (ru_maxrss) is what the conversion itself needed: the conversion
runs here, in-process, and its wall time is reported per stage (report.seconds).
All files go to a temporary folder that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path


def _prepare(folder: str, layers: int, hidden: int, heads: int, seq: int, feeds: int, queue) -> None:
    """Child process: write float.onnx, dynamic.onnx and calib.npz into ``folder``; report timings."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from trt_bridge import samples

    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice to pre-process the model
    work = Path(folder)
    start = time.perf_counter()
    model = samples.transformer_block(hidden=hidden, heads=heads, seq=seq, layers=layers)
    params = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    built = time.perf_counter()
    onnx.save(model, str(work / "float.onnx"))
    del model
    saved = time.perf_counter()
    quantize_dynamic(str(work / "float.onnx"), str(work / "dynamic.onnx"), per_channel=False,
                     weight_type=QuantType.QUInt8)
    quantized = time.perf_counter()
    np.savez(work / "calib.npz", x=samples.sequence_feeds(feeds, 1, seq, hidden))  # [feeds, 1, seq, hidden]
    queue.put({"params": params, "build_s": built - start, "save_float_s": saved - built,
               "quantize_dynamic_s": quantized - saved})


def prepare(work: Path, args: argparse.Namespace) -> dict:
    """Build the encoder in a fresh child process (its ~2 GB peak must not count as the conversion's)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_prepare, args=(str(work), args.layers, args.hidden, args.heads, args.seq,
                                               args.feeds, queue))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"building the benchmark model failed (exit code {child.exitcode})")
    return queue.get()


def rss_mib() -> float | None:
    """The current resident set size (Linux only)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # macOS: bytes, Linux: KiB


def size_text(mib: float) -> str:
    return f"{mib:.1f} MiB" if mib >= 1 else f"{mib * 1024:.0f} KiB"


def default_heads(hidden: int) -> int:
    """12 heads at BERT-base's 768; otherwise heads of 64 channels (or one head for a small model)."""
    if hidden % 12 == 0 and hidden // 12 >= 16:
        return 12
    return max(1, hidden // 64) if hidden % 64 == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (default 12)")
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (default 768)")
    parser.add_argument("--heads", type=int, help="attention heads (default: 12 at hidden 768, else hidden/64)")
    parser.add_argument("--seq", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument("--feeds", type=int, default=8, help="calibration feeds (default 8; ignored with --calib-data)")
    parser.add_argument("--model", type=Path, help="benchmark converting this dynamically quantized model instead")
    parser.add_argument("--calib-data", metavar="DATA",
                        help="calibration data for --model, as for trt-bridge convert (default: --feeds random feeds)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    args.heads = args.heads or default_heads(args.hidden)
    if args.model is None and args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.feeds < 1:
        parser.error("--feeds must be at least 1")
    if args.model is not None and not args.model.is_file():
        parser.error(f"--model {args.model}: no such file")

    from trt_bridge.conversion import convert
    from trt_bridge.conversion.options import CalibrationOptions, ConvertOptions
    from trt_bridge.errors import TrtBridgeError

    with tempfile.TemporaryDirectory(prefix="trt-bridge-bench-") as tmp:
        work = Path(tmp)
        if args.model is None:
            if not args.json:
                print(f"building encoder L{args.layers} H{args.hidden} A{args.heads} S{args.seq} and quantizing it "
                      "with quantize_dynamic (child process) ...", flush=True)
            setup = prepare(work, args)
            source = work / "dynamic.onnx"
            options = ConvertOptions(calibration=CalibrationOptions(data=str(work / "calib.npz")), progress=False)
            name = f"encoder L{args.layers} H{args.hidden} A{args.heads} S{args.seq}"
        else:
            setup, source, name = {}, args.model, str(args.model)
            options = ConvertOptions(calibration=CalibrationOptions(data=args.calib_data,
                                                                    random=None if args.calib_data else args.feeds),
                                     progress=False)
        logging.getLogger().setLevel(logging.ERROR)  # --calib-random's warning; convert's own errors still raise
        if not args.json:
            print(f"converting {name} ...", flush=True)
        rss_before = rss_mib()
        start = time.perf_counter()
        try:
            report = convert(source, work / "converted.onnx", options)
        except TrtBridgeError as exc:
            print(f"conversion failed: {exc}", file=sys.stderr)
            return 2
        total = time.perf_counter() - start
        result = {
            "model": name,
            **setup,
            "source_mib": source.stat().st_size / 2**20,
            "output_mib": Path(report.output).stat().st_size / 2**20,
            "calibration_feeds": report.calibration["feeds"] if report.calibration else 0,
            "quantized_tensors": len(report.quantized),
            "stages_s": report.seconds,
            "convert_s": total,
            "rss_before_mib": rss_before,
            "peak_rss_mib": peak_rss_mib(),
        }

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print()
    if setup:
        print(f"model   : {name}, {setup['params'] / 1e6:.1f} M params (built in {setup['build_s']:.1f} s, "
              f"quantize_dynamic {setup['quantize_dynamic_s']:.1f} s)")
    else:
        print(f"model   : {name}")
    print(f"sizes   : {size_text(result['source_mib'])} dynamic -> {size_text(result['output_mib'])} converted; "
          f"{result['quantized_tensors']} tensors quantized; {result['calibration_feeds']} calibration feeds")
    print()
    print(f"{'stage':<12}{'seconds':>9}{'share':>8}")
    print("-" * 29)
    for stage, seconds in result["stages_s"].items():
        print(f"{stage:<12}{seconds:>9.2f}{seconds / total:>8.0%}")
    other = total - sum(result["stages_s"].values())  # building the report, freeing the graphs
    print(f"{'other':<12}{other:>9.2f}{other / total:>8.0%}")
    print("-" * 29)
    print(f"{'total':<12}{total:>9.2f}")
    print()
    before = f" (RSS before converting: {rss_before:.0f} MiB)" if rss_before is not None else ""
    print(f"peak RSS of this process: {result['peak_rss_mib']:.0f} MiB{before}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
