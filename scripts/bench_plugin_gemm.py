"""Benchmark the dynamic INT8 GEMM plugin's kernels on this machine's GPU (a benchmark, not a test).

For each (M, K, N), float16 input, both granularities: the plugin's whole dynamic path (quantize + int8 GEMM +
epilogue, exactly what the TensorRT plugin's enqueue runs) and its GEMM alone, each captured once into a CUDA
graph and timed with CUDA events around every sample of REPLAYS back-to-back replays (so that launch latency
does not count; after warm-up; the median over --runs samples). Baselines, when torch
with CUDA is importable: torch's float16 matmul (cuBLAS; close to what TensorRT's FP16 GEMM does) and
torch._int_mm on pre-quantized int8 (cuBLAS int8; the static-INT8 analogue), also replayed from CUDA graphs.

TensorRT itself is not needed (nor installed on the benchmark machine): the kernels are launched through
cuda-python, so these are kernel times, without TensorRT's (small) per-plugin overhead.

    python scripts/bench_plugin_gemm.py [--runs 100] [--json bench.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

try:  # before cuda-python loads: torch 2.11 failed to import after it on the H100 image (a schema parse error)
    import torch
except Exception as exc:  # noqa: BLE001 - any failure only drops the baselines, and is said
    torch, TORCH_PROBLEM = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
else:
    TORCH_PROBLEM = None if torch.cuda.is_available() else "torch sees no CUDA GPU"

from trt_bridge.plugins import kernels  # noqa: E402

SHAPES = ((128, 384, 1536), (1024, 384, 1536), (4096, 768, 3072), (4096, 3072, 768), (8192, 4096, 4096))
WARMUP = 10
REPLAYS = 10  # graph replays per timed sample


class Gpu:
    def __init__(self, gemm: str):
        self.kernels = kernels.GemmKernels(gemm)
        self.driver = kernels.driver_module()
        self.stream = int(self.call(self.driver.cuStreamCreate(0), "creating a stream"))
        self.allocations = []

    def call(self, result, what):
        return kernels.check(self.driver, result, what)

    def alloc(self, nbytes: int) -> int:
        ptr = int(self.call(self.driver.cuMemAlloc(nbytes), f"allocating {nbytes} bytes"))
        self.allocations.append(ptr)
        return ptr

    def upload(self, array: np.ndarray) -> int:
        ptr = self.alloc(array.nbytes)
        self.call(self.driver.cuMemcpyHtoD(ptr, np.ascontiguousarray(array), array.nbytes), "copying to the GPU")
        return ptr

    def graph(self, enqueue):
        """``enqueue(stream)`` captured into an instantiated CUDA graph."""
        driver = self.driver
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self.call(driver.cuStreamBeginCapture(self.stream, mode), "starting a graph capture")
        enqueue(self.stream)
        graph = self.call(driver.cuStreamEndCapture(self.stream), "ending the graph capture")
        return self.call(driver.cuGraphInstantiate(graph, 0), "instantiating the graph")

    def time_graph(self, graph_exec, runs: int) -> float:
        """Median microseconds of one replay (over samples of REPLAYS replays)."""
        driver = self.driver
        start, end = (self.call(driver.cuEventCreate(0), "creating an event") for _ in range(2))
        elapsed = getattr(driver, "cuEventElapsedTime", None) or driver.cuEventElapsedTime_v2
        times = []
        for i in range(WARMUP + runs):
            self.call(driver.cuEventRecord(start, self.stream), "recording an event")
            for _ in range(REPLAYS):
                self.call(driver.cuGraphLaunch(graph_exec, self.stream), "launching the graph")
            self.call(driver.cuEventRecord(end, self.stream), "recording an event")
            self.call(driver.cuEventSynchronize(end), "waiting for the graph")
            if i >= WARMUP:
                times.append(1000.0 * float(self.call(elapsed(start, end), "reading the event time")) / REPLAYS)
        for event in (start, end):
            self.call(driver.cuEventDestroy(event), "destroying an event")
        return statistics.median(times)

    def close(self) -> None:
        self.call(self.driver.cuStreamSynchronize(self.stream), "synchronizing")
        for ptr in self.allocations:
            self.call(self.driver.cuMemFree(ptr), "freeing")
        self.allocations.clear()


def bench_plugin(gpu: Gpu, m: int, k: int, n: int, runs: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    x = gpu.upload(rng.standard_normal((m, k)).astype(np.float16))
    y = gpu.alloc(2 * m * n)
    packed = kernels.pack_weights(rng.integers(-128, 128, (k, n), dtype=np.int8), rng.integers(-8, 8, n))
    result = {}
    with gpu.kernels.upload(packed, rng.uniform(1e-3, 1e-2, n), rng.standard_normal(n)) as weights:
        for granularity in kernels.GRANULARITIES:
            workspace = gpu.alloc(kernels.workspace_size(m, k, granularity))
            host = time.perf_counter()
            gpu.kernels.run(gpu.stream, x, True, m, weights, granularity, y, workspace)
            result[f"{granularity}_host_enqueue_us"] = 1e6 * (time.perf_counter() - host)
            whole = gpu.graph(lambda s, g=granularity, w=workspace: gpu.kernels.run(s, x, True, m, weights, g, y, w))
            result[f"{granularity}_us"] = gpu.time_graph(whole, runs)
            gemm = gpu.graph(lambda s, g=granularity, w=workspace: gpu.kernels.gemm(s, m, weights, g, y, True, w))
            result[f"{granularity}_gemm_only_us"] = gpu.time_graph(gemm, runs)
        gpu.call(gpu.driver.cuStreamSynchronize(gpu.stream), "synchronizing")
    result["kernel"] = gpu.kernels.gemm_kernel(m, n)[0]
    gpu.close()
    return result


def bench_torch(m: int, k: int, n: int, runs: int) -> dict[str, float]:
    if TORCH_PROBLEM is not None:
        return {}

    def timed(fn) -> float:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()  # cuBLAS picks its algorithm and workspace before capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for i in range(WARMUP + runs):
            start.record()
            for _ in range(REPLAYS):
                graph.replay()
            end.record()
            end.synchronize()
            if i >= WARMUP:
                times.append(1000.0 * start.elapsed_time(end) / REPLAYS)
        return statistics.median(times)

    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    result = {"torch_fp16_us": timed(lambda: torch.matmul(a, b))}
    a8 = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
    b8 = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8).t()  # column-major, as cuBLASLt wants
    try:
        result["torch_int8_us"] = timed(lambda: torch._int_mm(a8, b8))
    except RuntimeError as exc:  # shapes or GPU _int_mm does not support
        result["torch_int8_error"] = str(exc).splitlines()[0]
    return result


def tops(m: int, k: int, n: int, us: float | None) -> str:
    return f"{2 * m * k * n / (us * 1e-6) / 1e12:6.1f}" if us else "     -"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="timed replays per measurement (median; >= 50)")
    parser.add_argument("--gemm", choices=kernels.GEMMS, default="auto", help="the plugin's GEMM kernel")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args(argv)
    runs = max(args.runs, 50)
    gpu = Gpu(args.gemm)
    name = kernels.driver_module().cuDeviceGetName(64, gpu.call(gpu.driver.cuCtxGetDevice(), "reading the device"))
    device = name[1].split(b"\0")[0].decode()
    rows = []
    columns = ("tensor_us", "token_us", "tensor_gemm_only_us", "torch_fp16_us", "torch_int8_us")
    print(f"{device} (sm_{gpu.kernels.arch}), float16 input; µs per call (TOPS), the median of {runs} samples of "
          f"{REPLAYS} CUDA-graph replays")
    if TORCH_PROBLEM is not None:
        print(f"no torch baselines: {TORCH_PROBLEM}")
    print(f"{'M':>6} {'K':>5} {'N':>5} | {'plugin tensor':>15} | {'plugin token':>15} | {'int8 GEMM only':>15} | "
          f"{'torch fp16':>15} | {'torch int8':>15} | kernel")
    for m, k, n in SHAPES:
        row = {"m": m, "k": k, "n": n, **bench_plugin(gpu, m, k, n, runs), **bench_torch(m, k, n, runs)}
        rows.append(row)
        cells = " | ".join(f"{row[c]:7.1f} ({tops(m, k, n, row[c])})" if c in row else f"{'-':>15}"
                           for c in columns)
        print(f"{m:>6} {k:>5} {n:>5} | {cells} | {row['kernel']}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": device, "arch": gpu.kernels.arch, "runs": runs, "replays_per_sample": REPLAYS,
                       "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
