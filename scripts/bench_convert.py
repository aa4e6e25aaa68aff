"""Benchmark `trt_bridge.convert` on a BERT-base-sized encoder (or a model you give).

    python scripts/bench_convert.py                       # 12 layers, hidden 768, seq 128 (≈85 M params)
    python scripts/bench_convert.py --layers 2 --hidden 256
    python scripts/bench_convert.py --model dynamic.onnx --calib-data calib.npz
    python scripts/bench_convert.py --json

Runs the real CLI in a child process and prints the wall time of every conversion
stage, the total, and the conversion's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from trt_bridge import samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--feeds", type=int, default=8, help="calibration feeds (default 8)")
    parser.add_argument("--model", type=Path, help="benchmark this dynamically quantized model instead")
    parser.add_argument("--calib-data", help="calibration data for --model (default: 8 random feeds)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory(prefix="trt-bridge-bench-") as tmp:
        work = Path(tmp)
        setup = {}
        if args.model is None:
            from onnxruntime.quantization import quantize_dynamic

            start = time.perf_counter()
            model = samples.transformer_block(hidden=args.hidden, heads=args.heads, seq=args.seq, layers=args.layers)
            params = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
            onnx.save(model, str(work / "float.onnx"))
            del model
            quantize_dynamic(str(work / "float.onnx"), str(work / "dynamic.onnx"))
            setup = {"params": params, "build_and_quantize_s": time.perf_counter() - start}
            source = work / "dynamic.onnx"
            np.savez(work / "calib.npz", x=samples.sequence_feeds(args.feeds, 1, args.seq, args.hidden)[:, 0])
            calib = ["--calib-data", str(work / "calib.npz")]
        else:
            source = args.model
            calib = ["--calib-data", args.calib_data] if args.calib_data else ["--calib-random", "8"]
        # The conversion runs in a child process (the real CLI), so its peak memory is its own.
        command = [sys.executable, "-m", "trt_bridge", "convert", str(source), "-o", str(work / "converted.onnx"),
                   "--json", "-q", *calib]
        start = time.perf_counter()
        child = subprocess.run(command, capture_output=True, text=True)
        total = time.perf_counter() - start
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            return child.returncode
        report = json.loads(child.stdout)
        result = {
            "model": str(args.model or f"encoder L{args.layers} H{args.hidden} S{args.seq}"),
            **setup,
            "model_mib": source.stat().st_size / 2**20,
            "stages_s": report["seconds"],
            "convert_s": total,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,  # Linux: KiB
            "calibration_feeds": report["calibration"]["feeds"] if report["calibration"] else 0,
            "quantized_tensors": len(report["quantized"]),
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"model: {result['model']}" + (f", {result['params'] / 1e6:.1f} M params" if setup else ""))
    print(f"source size: {result['model_mib']:.1f} MiB; {result['quantized_tensors']} tensors quantized; "
          f"{result['calibration_feeds']} calibration feeds")
    print(f"{'stage':<12}{'seconds':>10}")
    for stage, seconds in result["stages_s"].items():
        print(f"{stage:<12}{seconds:>10.2f}")
    print(f"{'convert':<12}{total:>10.2f}  (wall time of the CLI, interpreter start included)")
    print(f"peak RSS of the conversion: {result['peak_rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
