"""Run and time a serialized TensorRT engine with cuda-python (``trtexec``'s measurement, from Python).

::

    deserialize ─ execution context ─ set_input_shape (--shapes / --data / profile opt)
      ─ per I/O tensor: cudaMalloc + pinned host buffer, set_tensor_address
      ─ warm-up: one plain execute_async_v3 (TensorRT needs an enqueue before capture),
        CUDA graph capture (falls back to plain enqueues, with the reason logged), more warm-up
      ─ timed chunks: [event ─ (H2D) ─ enqueue/graph launch ─ (D2H) ─ event] × n, one sync per chunk

Each iteration's latency is the CUDA-event time between its two events (the GPU time of
that inference, plus the copies with ``transfers="include"``); throughput is iterations
over the wall-clock time of the timed run. Everything allocated is freed on ``close()``
(the runner is a context manager). Every CUDA call is checked (:func:`trt_bridge.tensorrt.cuda.call`).
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_bridge.bench.inputs import concrete_specs, first_feed
from trt_bridge.calibrate.feeds import Feed, InputSpec
from trt_bridge.errors import TrtBridgeError
from trt_bridge.plugins.registry import register_for_engine
from trt_bridge.tensorrt import import_tensorrt, is_rtx
from trt_bridge.tensorrt.cuda import call, error_text, gpu_problem, runtime
from trt_bridge.tensorrt.logger import Logger
from trt_bridge.tensorrt.sidecar import SidecarMismatchError, read_sidecar

log = logging.getLogger("trt_bridge.bench")

#: iterations enqueued between two synchronizations of the timed run
CHUNK = 32
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


@dataclass
class _Tensor:
    name: str
    is_input: bool
    shape: tuple[int, ...]
    nbytes: int
    device: int  # device pointer
    pinned: int  # page-locked host pointer
    host: np.ndarray  # a view of the pinned buffer (raw bytes for types numpy lacks)


def no_gpu_error(path: Path, problem: str) -> TrtBridgeError:
    return TrtBridgeError(f"{path}: running a TensorRT engine needs an NVIDIA GPU, and {problem}. Bench the ONNX "
                          "model with onnxruntime here (bench MODEL.onnx), or run this on a machine with a GPU.")


def _built_with(engine: Path) -> str | None:
    """The TensorRT module the engine's sidecar names (an engine runs only with the TensorRT that built it)."""
    try:
        return read_sidecar(engine)["tensorrt"]["module"]
    except SidecarMismatchError:  # an engine beside another's sidecar: refused, never run with the wrong facts
        raise
    except Exception:  # noqa: BLE001 - no sidecar (built elsewhere): the default module
        return None


class EngineRunner:
    """A deserialized engine with its buffers, stream and (when capturable) CUDA graph."""

    def __init__(self, path: str | Path, options):
        self.path, self.options = Path(path), options
        self.cuda_graph = False
        self.graph_note: str | None = None  # why no CUDA graph is used
        self.tensors: list[_Tensor] = []
        self.feed: Feed = {}
        self.feed_source = ""
        self._cudart = None
        self._stream = None
        self._graph = self._graph_exec = None
        self._events: list = []
        self._ran = False
        self.context = self.engine = self._runtime = None

    # ------------------------------------------------------------------ set-up and tear-down

    def __enter__(self) -> EngineRunner:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self) -> None:
        problem = gpu_problem()
        if problem:
            raise no_gpu_error(self.path, problem)
        if not self.path.is_file():
            raise TrtBridgeError(f"{self.path}: no such file. Check the path to the engine.")
        self._cudart = cudart = runtime()
        trt = self._trt = import_tensorrt(_built_with(self.path))
        self.label = f"{'TensorRT-RTX' if is_rtx(trt) else 'TensorRT'} {getattr(trt, '__version__', '?')}"
        self._logger = Logger(trt)
        self._runtime = trt.Runtime(self._logger)
        register_for_engine(trt, self.path, self.options.plugins)
        self.engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
        if self.engine is None:
            raise TrtBridgeError(
                f"{self.path}: {self.label} cannot deserialize the engine ({self._said()}). An engine runs only "
                "with the TensorRT version it was built with (datacenter TensorRT: also on the same GPU model); "
                "rebuild it on this machine.")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise TrtBridgeError(f"{self.path}: cannot create an execution context ({self._said()}); the GPU may "
                                 "be out of memory.")
        self._stream = call(cudart, "cudaStreamCreate", what=f"{self.path}: creating a CUDA stream")
        self._set_shapes()
        self._allocate()
        for t in self.tensors:
            if t.is_input:
                np.copyto(t.host, self.feed[t.name], casting="no")

    def _said(self) -> str:
        return "; ".join(self._logger.messages[-3:]) or "TensorRT gave no reason"

    def _names(self) -> list[str]:
        return [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]

    def _is_input(self, name: str) -> bool:
        return self.engine.get_tensor_mode(name) == self._trt.TensorIOMode.INPUT

    def _numpy_type(self, name: str):
        try:
            return np.dtype(self._trt.nptype(self.engine.get_tensor_dtype(name)))
        except TypeError:  # bfloat16, fp8, int4, ...: no numpy type
            return None

    def _set_shapes(self) -> None:
        engine, where = self.engine, str(self.path)
        specs, defaults = [], {}
        for name in filter(self._is_input, self._names()):
            if engine.is_shape_inference_io(name):
                raise TrtBridgeError(f"{where}: input '{name}' is a shape tensor; bench feeds only execution "
                                     "tensors (benchmark this engine with trtexec --shapes).")
            dtype = self._numpy_type(name)
            if dtype is None:
                raise TrtBridgeError(f"{where}: input '{name}' has TensorRT type {engine.get_tensor_dtype(name)}, "
                                     "which numpy cannot hold; bench cannot make data for it.")
            shape = tuple(engine.get_tensor_shape(name))
            specs.append(InputSpec(name, dtype, tuple(d if d >= 0 else None for d in shape)))
            if any(d < 0 for d in shape):
                defaults[name] = tuple(engine.get_tensor_profile_shape(name, 0)[1])  # the profile's opt shape
        concrete = concrete_specs(specs, self.options.shapes, where, defaults)
        self.feed, self.feed_source = first_feed(specs, concrete, self.options.data, self.options.seed, where,
                                                 self.options.shapes)
        for name, array in self.feed.items():
            if not self.context.set_input_shape(name, tuple(array.shape)):
                lo, opt, hi = (list(s) for s in engine.get_tensor_profile_shape(name, 0))
                raise TrtBridgeError(f"{where}: the engine cannot run input '{name}' with shape {list(array.shape)}: "
                                     f"its optimization profile allows {lo} to {hi} (opt {opt}). Give --shapes "
                                     "within that range, or rebuild the engine for this shape.")

    def _allocate(self) -> None:
        cudart, trt, where = self._cudart, self._trt, str(self.path)
        for name in self._names():
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise TrtBridgeError(f"{where}: the shape of '{name}' ({list(shape)}) depends on the data; bench "
                                     "runs engines whose output shapes follow from the input shapes only.")
            linear = getattr(trt.TensorFormat, "LINEAR", None)
            if linear is not None and self.engine.get_tensor_format(name) != linear:
                raise TrtBridgeError(f"{where}: I/O tensor '{name}' has the vectorized format "
                                     f"{self.engine.get_tensor_format(name)}; bench handles linear I/O only.")
            dtype = self._numpy_type(name)
            count = math.prod(shape)
            itemsize = dtype.itemsize if dtype is not None else self.engine.get_tensor_dtype(name).itemsize
            nbytes = math.ceil(count * itemsize)
            size = max(nbytes, 1)
            device = call(cudart, "cudaMalloc", size, what=f"{where}: allocating {size} bytes for '{name}'")
            self.tensors.append(_Tensor(name, self._is_input(name), shape, nbytes, int(device), 0, np.empty(0)))
            tensor = self.tensors[-1]
            tensor.pinned = int(call(cudart, "cudaMallocHost", size, what=f"{where}: pinned host memory for '{name}'"))
            raw = np.frombuffer((ctypes.c_uint8 * size).from_address(tensor.pinned), np.uint8)[:nbytes]
            tensor.host = raw.view(dtype).reshape(shape) if dtype is not None else raw
            if not self.context.set_tensor_address(name, tensor.device):
                raise TrtBridgeError(f"{where}: TensorRT refused the address of '{name}' ({self._said()}).")

    def close(self) -> None:
        """Free the graph, events, buffers and stream; safe to call twice and after a failed set-up."""
        cudart = self._cudart
        if cudart is not None:
            if self._stream is not None:
                cudart.cudaStreamSynchronize(self._stream)
            if self._graph_exec is not None:
                cudart.cudaGraphExecDestroy(self._graph_exec)
            if self._graph is not None:
                cudart.cudaGraphDestroy(self._graph)
            for event in self._events:
                cudart.cudaEventDestroy(event)
            for t in self.tensors:
                t.host = np.empty(0)  # no view may outlive the pinned buffer
                if t.pinned:
                    cudart.cudaFreeHost(t.pinned)
                if t.device:
                    cudart.cudaFree(t.device)
            if self._stream is not None:
                cudart.cudaStreamDestroy(self._stream)
        self._graph = self._graph_exec = self._stream = None
        self._events, self.tensors = [], []
        self.context = self.engine = self._runtime = None  # the context goes before its engine

    # ------------------------------------------------------------------ running

    @property
    def backend(self) -> str:
        extras = (["cuda graph"] if self.cuda_graph else []) + (
            ["with transfers"] if self.options.transfers == "include" else [])
        return self.label + (f" ({', '.join(extras)})" if extras else "")

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        return {t.name: list(t.shape) for t in self.tensors if t.is_input}

    def _copy(self, inputs: bool) -> None:
        cudart = self._cudart
        kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice if inputs else cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for t in self.tensors:
            if t.is_input == inputs and t.nbytes:
                dst, src = (t.device, t.pinned) if inputs else (t.pinned, t.device)
                call(cudart, "cudaMemcpyAsync", dst, src, t.nbytes, kind, self._stream,
                     what=f"{self.path}: copying '{t.name}' {'to' if inputs else 'from'} the GPU")

    def _enqueue(self) -> None:
        if self._graph_exec is not None:
            call(self._cudart, "cudaGraphLaunch", self._graph_exec, self._stream,
                 what=f"{self.path}: launching the CUDA graph")
        elif not self.context.execute_async_v3(int(self._stream)):
            raise TrtBridgeError(f"{self.path}: TensorRT failed to enqueue the engine ({self._said()}).")
        self._ran = True

    def _sync(self, what: str) -> None:
        call(self._cudart, "cudaStreamSynchronize", self._stream, what=f"{self.path}: {what}")

    def infer(self, feed: Feed | None = None) -> dict[str, np.ndarray]:
        """One inference on ``feed`` (default: the benchmark's feed; same shapes); outputs copied to the host."""
        for t in self.tensors:
            if t.is_input and feed is not None:
                if t.name not in feed or tuple(np.shape(feed[t.name])) != t.shape:
                    got = list(np.shape(feed[t.name])) if t.name in feed else "nothing"
                    raise TrtBridgeError(f"{self.path}: infer() needs input '{t.name}' with shape {list(t.shape)} "
                                         f"(the shape the runner was set up with), got {got}.")
                np.copyto(t.host, np.asarray(feed[t.name]), casting="same_kind")
        self._copy(inputs=True)
        self._enqueue()
        self._copy(inputs=False)
        self._sync("running the engine")
        return {t.name: t.host.copy() for t in self.tensors if not t.is_input}

    def capture(self) -> bool:
        """Capture one enqueue into a CUDA graph (after a plain run); on failure keep plain enqueues and
        record why in ``graph_note``."""
        if not self._ran:
            self.infer()
        reason = self._capture()
        if reason is None:
            try:  # a graph that instantiates can still fail to launch
                self._enqueue()
                self._sync("running the captured CUDA graph")
            except TrtBridgeError as exc:
                self._drop_graph()
                reason = str(exc)
        self.cuda_graph, self.graph_note = reason is None, reason
        if reason:
            log.warning("%s: no CUDA graph, timing plain enqueues: %s", self.path, reason)
        return self.cuda_graph

    def _capture(self) -> str | None:
        cudart, context, handle = self._cudart, self.context, int(self._stream)
        if hasattr(context, "is_stream_capturable") and not context.is_stream_capturable(handle):
            return ("TensorRT says this engine cannot be captured (data-dependent shapes, loops, conditionals "
                    "or plugins that synchronize)")
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        call(cudart, "cudaStreamBeginCapture", self._stream, mode, what=f"{self.path}: starting CUDA graph capture")
        try:
            enqueued = context.execute_async_v3(handle)
        finally:  # end the capture whatever happened, or the stream stays in capture mode
            err, graph = cudart.cudaStreamEndCapture(self._stream)
        if int(err) != 0 or not enqueued:
            if int(err) == 0:
                cudart.cudaGraphDestroy(graph)
            cudart.cudaGetLastError()  # capture errors are not sticky: clear the last error
            return (f"capture failed ({error_text(cudart, err)})" if int(err) != 0
                    else f"TensorRT could not enqueue during capture ({self._said()})")
        self._graph = graph
        err, graph_exec = cudart.cudaGraphInstantiate(graph, 0)
        if int(err) != 0:
            self._drop_graph()
            cudart.cudaGetLastError()
            return f"the captured graph does not instantiate ({error_text(cudart, err)})"
        self._graph_exec = graph_exec
        return None

    def _drop_graph(self) -> None:
        if self._graph_exec is not None:
            self._cudart.cudaGraphExecDestroy(self._graph_exec)
        if self._graph is not None:
            self._cudart.cudaGraphDestroy(self._graph)
        self._graph = self._graph_exec = None

    def measure(self) -> tuple[list[float], float]:
        """Warm up (capturing a CUDA graph when asked), then time until both ``iterations`` and ``duration``
        are reached: (ms per iteration, wall-clock seconds of the timed run)."""
        options, cudart = self.options, self._cudart
        include = options.transfers == "include"
        self.infer()  # the plain enqueue TensorRT needs before capture; also the first warm-up run
        if options.cuda_graph:
            self.capture()
        else:
            self.graph_note = "--no-cuda-graph"
        for _ in range(max(options.warmup - 1, 0)):
            if include:
                self.infer()
            else:
                self._enqueue()
        self._sync("warming up")
        if not self._events:
            self._events = [call(cudart, "cudaEventCreate", what=f"{self.path}: creating CUDA events")
                            for _ in range(2 * CHUNK)]
        times: list[float] = []
        clock, duration = time.perf_counter, options.duration or 0.0
        start = clock()
        while len(times) < options.iterations or clock() - start < duration:
            n = min(CHUNK, options.iterations - len(times)) if len(times) < options.iterations else CHUNK
            for i in range(n):
                self._record(self._events[2 * i])
                if include:
                    self._copy(inputs=True)
                self._enqueue()
                if include:
                    self._copy(inputs=False)
                self._record(self._events[2 * i + 1])
            self._sync("timing the engine")
            for i in range(n):
                times.append(call(cudart, "cudaEventElapsedTime", self._events[2 * i], self._events[2 * i + 1],
                                  what=f"{self.path}: reading CUDA event times"))
        return times, clock() - start

    def _record(self, event) -> None:
        call(self._cudart, "cudaEventRecord", event, self._stream, what=f"{self.path}: recording a CUDA event")
