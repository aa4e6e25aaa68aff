"""The onnxruntime baseline: one session with the requested execution provider, timed per run.

Unlike accuracy measurements (:mod:`trt_bridge.runtime.session`), the session keeps onnxruntime's
own Q/DQ fusion: a benchmark measures the integer kernels onnxruntime really runs. With
the CUDA or TensorRT provider and ``transfers="exclude"``, inputs live on the GPU and
outputs stay there (I/O binding), so host↔device copies are not timed; with
``transfers="include"`` every run takes host arrays and returns host arrays.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.bench.inputs import concrete_specs, first_feed
from trt_bridge.calibrate.feeds import Feed, model_inputs
from trt_bridge.errors import MissingDependencyError, ModelLoadError, TrtBridgeError
from trt_bridge.runtime.session import create_session

log = logging.getLogger("trt_bridge.bench")

#: --provider → (onnxruntime execution provider, label)
PROVIDERS = {
    "cpu": ("CPUExecutionProvider", "CPU"),
    "cuda": ("CUDAExecutionProvider", "CUDA"),
    "tensorrt": ("TensorrtExecutionProvider", "TensorRT EP"),
}


#: ops that make a model quantized for the CPU-latency caveat (Q/DQ, integer ops, com.microsoft quantized ops)
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                           "ConvInteger", "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention",
                           "DynamicQuantizeLSTM", "QEmbedLayerNormalization", "DynamicInt8Gemm"})


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph has quantized ops."""
    return any(n.op_type in QUANTIZED_OPS or n.op_type.startswith("QLinear") for n in model.graph.node)


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu "
                                     "for the CUDA and TensorRT providers).") from exc
    return onnxruntime


def check_provider(provider: str) -> str:
    """The onnxruntime name of ``provider``; a clear error when it is unknown or not available here."""
    if provider not in PROVIDERS:
        raise TrtBridgeError(f"unknown onnxruntime provider '{provider}'; choose one of {', '.join(PROVIDERS)}.")
    ort = _onnxruntime()
    name = PROVIDERS[provider][0]
    available = ort.get_available_providers()
    if name not in available:
        raise TrtBridgeError(
            f"the onnxruntime provider '{provider}' ({name}) is not available: onnxruntime {ort.__version__} here "
            f"offers {', '.join(available)}. Install onnxruntime-gpu (CUDA and TensorRT providers, on a machine "
            "with an NVIDIA GPU), or bench with --provider cpu.")
    return name


class OrtRunner:
    """Runs one ONNX model in onnxruntime on one feed, and times it."""

    def __init__(self, path: str | Path, options):
        self.path, self.options = Path(path), options
        ort = _onnxruntime()
        name = check_provider(options.provider)
        model = self._load()
        specs = model_inputs(model)
        #: a quantized model on onnxruntime's CPU provider: Q/DQ and integer ops as CPU integer math
        self.simulated = options.provider == "cpu" and is_quantized(model)
        where = str(self.path)
        concrete = concrete_specs(specs, options.shapes, where)
        self.feed, self.feed_source = first_feed(specs, concrete, options.data, options.seed, where, options.shapes)
        del model

        session_options = ort.SessionOptions()
        session_options.log_severity_level = 3
        if options.threads is not None:
            session_options.intra_op_num_threads = options.threads
        providers = [name] + (["CUDAExecutionProvider"] if options.provider == "tensorrt" else [])
        providers += ["CPUExecutionProvider"] if name != "CPUExecutionProvider" else []
        try:
            self.session = create_session(str(self.path), session_options, providers)
        except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
            raise TrtBridgeError(f"{self.path}: onnxruntime cannot load the model: {exc}") from exc
        if name not in self.session.get_providers():
            raise TrtBridgeError(f"{self.path}: onnxruntime fell back from {name} to "
                                 f"{', '.join(self.session.get_providers())} (see onnxruntime's log for the reason: "
                                 "a missing CUDA/cuDNN/TensorRT library is the usual one).")
        self.device_io = options.provider != "cpu" and options.transfers == "exclude"
        self._binding = self._bind() if self.device_io else None
        label = PROVIDERS[options.provider][1]
        extras = [f"{options.threads} threads"] if options.threads else []
        if options.provider != "cpu":
            extras.append("with transfers" if not self.device_io else "device I/O")
        self.backend = f"onnxruntime {label}" + (f" ({', '.join(extras)})" if extras else "")

    def _load(self) -> onnx.ModelProto:
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: no such file. Check the path to the ONNX model.")
        try:
            return onnx.load(str(self.path), load_external_data=False)
        except Exception as exc:
            raise ModelLoadError(f"{self.path}: not a readable ONNX model ({type(exc).__name__}: {exc}).") from exc

    def _bind(self):
        ort = _onnxruntime()
        binding = self.session.io_binding()
        self._device_inputs = {name: ort.OrtValue.ortvalue_from_numpy(arr, "cuda", 0)
                               for name, arr in self.feed.items()}
        for name, value in self._device_inputs.items():
            binding.bind_ortvalue_input(name, value)
        for out in self.session.get_outputs():
            binding.bind_output(out.name, "cuda")
        return binding

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        return {name: list(arr.shape) for name, arr in self.feed.items()}

    def infer(self, feed: Feed | None = None) -> dict[str, np.ndarray]:
        """One run on ``feed`` (default: the benchmark's feed), outputs on the host."""
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, feed if feed is not None else self.feed)))

    def _once(self) -> None:
        if self._binding is not None:
            self.session.run_with_iobinding(self._binding)
        else:
            self.session.run(None, self.feed)

    def measure(self) -> tuple[list[float], float]:
        """Warm up, then time runs until both ``iterations`` and ``duration`` are reached: (ms per run, wall s)."""
        options = self.options
        try:
            for _ in range(options.warmup):
                self._once()
            times, clock = [], time.perf_counter
            start = clock()
            while len(times) < options.iterations or clock() - start < (options.duration or 0.0):
                t0 = clock()
                self._once()
                times.append((clock() - t0) * 1000.0)
            return times, clock() - start
        except TrtBridgeError:
            raise
        except Exception as exc:
            raise TrtBridgeError(f"{self.path}: onnxruntime failed to run the model: {exc}") from exc
