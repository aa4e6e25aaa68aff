"""``trt-bridge bench``: latency of TensorRT engines and ONNX models, side by side.

* Engines (``.engine``/``.plan``/``.trt``) run with TensorRT and cuda-python
  (:mod:`.engine_runner`): CUDA events around each ``execute_async_v3`` (a CUDA graph
  launch when the engine can be captured), host↔device copies timed or not.
* ONNX models run in onnxruntime with the chosen execution provider (:mod:`.ort_runner`),
  timed with ``time.perf_counter`` per run: the baseline.

Each model gets warm-up runs, then at least ``iterations`` timed runs and at least
``duration`` seconds; the statistics are trtexec's (:mod:`.stats`). Rows keep the
order given; ``ratio`` is the speed-up versus the first row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from trt_bridge.bench.engine_runner import ENGINE_SUFFIXES, EngineRunner, no_gpu_error
from trt_bridge.bench.inputs import concrete_specs
from trt_bridge.bench.ort_runner import OrtRunner, check_provider
from trt_bridge.bench.report import BenchReport, BenchRow, Machine
from trt_bridge.bench.stats import LatencyStats
from trt_bridge.calibrate.feeds import model_inputs
from trt_bridge.choices import check_bound
from trt_bridge.errors import TrtBridgeError
from trt_bridge.tensorrt.build import costs_or_none
from trt_bridge.tensorrt.costs import COST_TARGET
from trt_bridge.tensorrt.cuda import gpu_name, gpu_problem
from trt_bridge.tensorrt.sidecar import read_sidecar

__all__ = ["BenchOptions", "BenchReport", "BenchRow", "LatencyStats", "Machine", "bench", "kind_of"]

log = logging.getLogger("trt_bridge.bench")

TRANSFERS = ("include", "exclude")


@dataclass(frozen=True)
class BenchOptions:
    """Every option of ``trt-bridge bench`` (one field per CLI flag)."""

    iterations: int = 100  # at least this many timed runs
    warmup: int = 10  # untimed runs first
    duration: float | None = None  # seconds: time at least this long
    shapes: dict[str, tuple[int, ...]] | None = None  # dynamic inputs (engines: set_input_shape; onnx: feed shapes)
    data: str | None = None  # feeds as calibration takes them (the first feed is used); else random, seeded
    seed: int = 0
    transfers: str = "exclude"  # engines (and GPU onnxruntime providers): time host<->device copies or not
    cuda_graph: bool = True  # engines: capture a CUDA graph when possible, else fall back with a logged reason
    provider: str = "cpu"  # onnx: cpu | cuda | tensorrt (onnxruntime execution provider)
    threads: int | None = None  # onnxruntime intra-op threads
    plugins: tuple[str, ...] = ()  # engines: plugin files to register besides those the sidecar lists
    #: ONNX rows: build ahead of time for this compute capability and show the engine's size and activation memory
    #: (TensorRT-RTX; where no GPU times TensorRT, the costs it can still state); None: not measured
    costs: str | None = COST_TARGET

    def check(self) -> None:
        for name in ("iterations", "warmup", "duration", "threads", "seed"):
            check_bound(name, getattr(self, name))
        if self.transfers not in TRANSFERS:
            raise TrtBridgeError(f"--transfers must be include or exclude, got '{self.transfers}'.")


def kind_of(path: Path) -> str:
    """``"onnx"`` or ``"engine"``, from the file name."""
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return "onnx"
    if suffix in ENGINE_SUFFIXES:
        return "engine"
    raise TrtBridgeError(f"{path}: bench takes ONNX models (.onnx) and serialized TensorRT engines "
                         f"({', '.join(ENGINE_SUFFIXES)}); rename the file to say which it is.")


def bench(paths: list[str | Path], options: BenchOptions = BenchOptions()) -> BenchReport:
    """Time every model in ``paths`` (engines and ONNX models) and report them side by side.

    Everything that can be checked without running (files, kinds, the GPU for engines, the
    onnxruntime provider, the options) is checked before the first model runs.
    """
    options.check()
    if not paths:
        raise TrtBridgeError("bench needs at least one engine or ONNX model.")
    models = [(Path(p), kind_of(Path(p))) for p in paths]
    for path, _ in models:
        if not path.is_file():
            raise TrtBridgeError(f"{path}: no such file.")
    engines = [path for path, kind in models if kind == "engine"]
    if engines:
        problem = gpu_problem()
        if problem:
            raise no_gpu_error(engines[0], problem)
    if any(kind == "onnx" for _, kind in models):
        check_provider(options.provider)
    per_model = _shapes_per_model(models, options)  # checked for every model before any runs

    rows, tensorrt = [], None
    for path, kind in models:
        row, label = _run(path, kind, per_model[path])
        tensorrt = tensorrt or label
        rows.append(row)
        log.info("%s: median %.3f ms, %.1f inferences/s (%s)", path, row.stats.median, row.stats.throughput,
                 row.backend)
    first = rows[0].stats.median
    for row in rows:
        row.ratio = first / row.stats.median if row.stats.median > 0 else None
    gpu = gpu_name() if engines or options.provider != "cpu" else None
    return BenchReport(rows, options, Machine.here(gpu=gpu, tensorrt=tensorrt))


def _input_names(path: Path, kind: str) -> list[str] | None:
    """A model's input names without running it: the ONNX graph's, or an engine's sidecar (None: unknown)."""
    if kind == "onnx":
        try:
            return [i.name for i in model_inputs(onnx.load(str(path), load_external_data=False))]
        except Exception as exc:  # noqa: BLE001 - not ONNX: the runner says so, with the file
            raise TrtBridgeError(f"{path}: not a readable ONNX model ({type(exc).__name__}).") from exc
    try:
        return [i["name"] for i in read_sidecar(path)["inputs"]]
    except Exception:  # noqa: BLE001 - an engine without a sidecar: its inputs are known once deserialized
        return None


def _shapes_per_model(models, options: BenchOptions) -> dict:
    """Each model's options with the --shapes of its own inputs (models with other inputs can be benched
    side by side), every ONNX model's shapes checked against its inputs before the first run."""
    if not options.shapes:
        return {path: options for path, _ in models}
    known: set[str] = set()
    out = {}
    for path, kind in models:
        names = _input_names(path, kind)
        if names is None:
            out[path] = options
            known |= set(options.shapes)
            continue
        known |= set(names)
        out[path] = replace(options, shapes={k: v for k, v in options.shapes.items() if k in names} or None)
        if kind == "onnx" and out[path].shapes:
            concrete_specs(model_inputs(onnx.load(str(path), load_external_data=False)), out[path].shapes,
                           str(path))
    unknown = sorted(set(options.shapes) - known)
    if unknown:
        raise TrtBridgeError(f"--shapes names '{unknown[0]}', which is an input of none of the models.")
    return out


def _run(path: Path, kind: str, options: BenchOptions) -> tuple[BenchRow, str | None]:
    if kind == "onnx":
        runner = OrtRunner(path, options)
        times, seconds = runner.measure()
        row = BenchRow(str(path), kind, runner.backend, LatencyStats.from_times(times, seconds),
                       inputs=runner.input_shapes, feed=runner.feed_source, simulated=runner.simulated,
                       costs=costs_or_none(path, options.costs, options.plugins, options.shapes) if options.costs
                       else None)
        return row, None
    with EngineRunner(path, options) as runner:
        times, seconds = runner.measure()
        row = BenchRow(str(path), kind, runner.backend, LatencyStats.from_times(times, seconds),
                       inputs=runner.input_shapes, feed=runner.feed_source, cuda_graph=runner.cuda_graph,
                       note=None if runner.cuda_graph or not options.cuda_graph else
                       f"no CUDA graph: {runner.graph_note}")
        return row, runner.label
