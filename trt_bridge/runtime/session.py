"""onnxruntime sessions for measuring what a converted model computes.

onnxruntime's CPU provider fuses DequantizeLinear → MatMul/Conv ← DequantizeLinear into
its own integer kernels. On x86 CPUs without VNNI those kernels multiply u8×s8 pairs with
16-bit saturation, so a Q/DQ model can score several dB worse in onnxruntime than the
same model in TensorRT (which accumulates in int32). For accuracy measurements
trt-bridge therefore keeps Q/DQ as float simulation (``session.disable_quant_qdq``):
the values TensorRT's int8 kernels compute, up to accumulation order.

A model with bfloat16 layers (``--high-precision bf16``) runs as its float32 emulation
(:func:`trt_bridge.runtime.bf16.emulate_bfloat16`: every bfloat16 result rounded as TensorRT
stores it), since the CPU provider has no bfloat16 kernels.

trt-bridge's plugin nodes (``DynamicInt8Gemm``) run as their decomposition into standard ops with the same
integer math (:func:`trt_bridge.ir.dynamic_gemm.decompose`), the reference the plugin's kernels are held to.

The integer ops of a quantized source (``MatMulInteger``, ``ConvInteger``, ``QLinearConv``, ...) saturate the
same way on those CPUs; they run with their int8 weights offset to uint8
(:mod:`trt_bridge.runtime.exact_integer`), which onnxruntime computes exactly everywhere.

TensorRT's dynamic FP4 activations (``TRT_FP4DynamicQuantize``, domain ``trt``) run as their exact emulation in
standard ops (:func:`trt_bridge.runtime.fp4_dynamic.fp4_dynamic_emulated`), then FP4 weights as their float values.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import onnx

from trt_bridge.formats import FP8, code_types
from trt_bridge.ir.deferred import with_data
from trt_bridge.ir.dynamic_gemm import decompose, disabled_optimizers, has_plugin_nodes
from trt_bridge.ir.model import read_model
from trt_bridge.ir.types import holds_codes
from trt_bridge.runtime.bf16 import emulate_bfloat16, has_bfloat16
from trt_bridge.runtime.exact_integer import exact_integer, has_saturating_ops
from trt_bridge.runtime.fp4 import fp4_dequantized, has_float4_codes
from trt_bridge.runtime.fp4_dynamic import fp4_dynamic_emulated, has_fp4_dynamic
from trt_bridge.runtime.process import owns_process


def session(model: str | Path | onnx.ModelProto | bytes, simulate_qdq: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if simulate_qdq:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    model = _bfloat16_emulated(with_data(model) if isinstance(model, onnx.ModelProto) else model)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    return create_session(model, options, exact=True)


T = TypeVar("T")


def cores() -> int:
    """The CPU cores this process may run on (a container's or ``taskset``'s limit, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def feed_workers() -> int:
    """How many feeds a measuring session runs at once (:func:`in_order`): two where there are two cores.

    Measured on 2 cores (YOLOv8n at 320×320, its Q/DQ model as float simulation): one feed at a time on two
    intra-op threads took 32 ms a feed, two feeds at a time on one thread each 18 ms. A small model's layers are
    too short for two threads to share one well; two feeds share nothing."""
    return 2 if cores() >= 2 else 1


def measuring_threads(options) -> None:
    """Set ``options`` (onnxruntime's ``SessionOptions``) for :func:`in_order`: the cores shared out among
    :func:`feed_workers` runs, no spinning (a waiting thread would take a core from the other run)."""
    options.intra_op_num_threads = max(1, cores() // feed_workers())
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")


def in_order(run: Callable[[T], Any], items: Iterable[T], workers: int | None = None
             ) -> Iterator[tuple[T, Future]]:
    """``(item, future of run(item))`` in the order of ``items``, with up to ``workers`` (default
    :func:`feed_workers`) runs going at once, ahead of the consumer: onnxruntime runs without the GIL, so the
    caller's work on one result overlaps the runs of the next. At most ``workers + 1`` results are held. A run's
    exception is raised by its future's ``result()``."""
    workers = workers or feed_workers()
    pending: deque[tuple[T, Future]] = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for item in items:
                pending.append((item, pool.submit(run, item)))
                if len(pending) > workers:
                    yield pending.popleft()
            while pending:
                yield pending.popleft()
        finally:  # the consumer stopped early: what has not started never will
            for _, job in pending:
                job.cancel()


def quiet_default_logger() -> None:
    """Sessions made by others with default options (onnx-graphsurgeon's constant folding) log onnxruntime's
    optimizer warnings ("UnsqueezeElimination cannot remove node") through the default logger: errors only, in
    the command line's own process (fatal only: what onnxruntime refuses reaches the user as its exception, in
    trt-bridge's one line; -vv leaves onnxruntime's log on)."""
    if not owns_process():
        return
    import onnxruntime as ort

    ort.set_default_logger_severity(4)


_OPSETS: dict[int, str | None] = {}


def opset_problem(version: int) -> str | None:
    """Why the installed onnxruntime cannot run a model of ``ai.onnx`` opset ``version`` (None: it can), found by
    loading a one-node model of that opset (once per version). A model it cannot load could be neither calibrated
    nor verified, and a converted model keeps its source's opset."""
    if version not in _OPSETS:
        import re

        import onnxruntime as ort
        from onnx import TensorProto, helper

        value = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", value,
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)])
        probe.ir_version = 8
        options = ort.SessionOptions()
        options.log_severity_level = 4
        try:
            ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
            _OPSETS[version] = None
        except Exception as exc:  # noqa: BLE001 - its refusal is the answer
            supported = re.search(r"support for domain ai\.onnx is till opset (\d+)", str(exc))
            up_to = f"opsets up to {supported.group(1)}" if supported else "older opsets only"
            _OPSETS[version] = f"onnxruntime {ort.__version__} runs {up_to}"
    return _OPSETS[version]


def create_session(model, options, providers=("CPUExecutionProvider",), exact: bool = False):
    """``onnxruntime.InferenceSession`` (trt-bridge's plugin nodes as their decomposition), retried without
    graph optimizations where onnxruntime's own optimizer fails on a valid model.

    onnxruntime's constant folding (1.2x) fails to initialize some valid models, torch's dynamo exports
    converted among them ("AddInitializedOrtValue: Attempt to replace the existing tensor"). Its graph
    optimizations only fuse and fold, so the model computes the same without them.

    ``exact``: uint8 × int8 integer ops run on uint8 weights (:mod:`trt_bridge.runtime.exact_integer`), for
    measuring what a model computes; timing (``bench``) runs the model's own ops. A model whose big weights are
    deferred (:mod:`trt_bridge.ir.deferred`) is given a copy that holds them.
    """
    import onnxruntime as ort

    if isinstance(model, onnx.ModelProto):
        model = with_data(model)
    if isinstance(model, (str, os.PathLike)):  # onnxruntime reads the file's external data itself: checked first
        read_model(model, external_data=False)
    if owns_process():  # the command line: onnxruntime's own log lines stay off stderr (see above)
        quiet_default_logger()
        options.log_severity_level = 4
    given = model
    if isinstance(model, bytes):  # parsed once for the looks below, not once per look
        model = parsed = onnx.ModelProto.FromString(model)
    model, disabled = _plugins_decomposed(model)
    dynamic = _loaded_if(model, has_fp4_dynamic)  # TensorRT's dynamic FP4 activations (runtime/fp4_dynamic.py)
    model = model if dynamic is None else fp4_dynamic_emulated(dynamic)
    fp4 = _loaded_if(model, has_float4_codes)  # no FP4 kernel: its weights' float values (runtime/fp4.py)
    model = model if fp4 is None else fp4_dequantized(fp4)
    if exact:
        model = _exact(model)
    if _loaded_if(model, has_float8_codes) is not None:
        if options.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if isinstance(given, bytes) and model is parsed:  # nothing rewritten: the bytes given, not serialized again
        model = given
    elif isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    extra = {"disabled_optimizers": list(disabled)} if disabled else {}
    try:
        return ort.InferenceSession(model, options, providers=list(providers), **extra)
    except Exception as exc:
        if "Attempt to replace the existing tensor" not in str(exc):
            raise
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return ort.InferenceSession(model, options, providers=list(providers))


#: the FP8 code types (TensorProto)
FLOAT8_TYPES = code_types(FP8)


def has_float8_codes(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds FP8 codes (zero points, weights). onnxruntime 1.2x's extended graph optimizations
    compute an FP8 Q/DQ model wrong on CPU (an onnxruntime FP8 MNIST: -7.7 dB against its float model with them,
    8.1 dB without; the same model's Q/DQ as float simulation agrees with the latter), so its sessions stop at the
    basic level."""
    return holds_codes(model, FLOAT8_TYPES)


def _bfloat16_emulated(model: str | Path | onnx.ModelProto | bytes):
    """``model`` itself, or the float32 emulation of its bfloat16 layers (as a ModelProto)."""
    proto = _loaded_if(model, has_bfloat16)
    emulated = None if proto is None else emulate_bfloat16(proto)
    return model if emulated is None else emulated


def _plugins_decomposed(model: str | Path | onnx.ModelProto | bytes):
    """``(model, ())`` itself, or (as a ModelProto) with trt-bridge's plugin nodes as standard ops, and the
    onnxruntime optimizers its session must not run."""
    proto = _loaded_if(model, has_plugin_nodes)
    return (model, ()) if proto is None else (decompose(proto), disabled_optimizers(proto))


def _exact(model: str | Path | onnx.ModelProto | bytes):
    """``model`` itself, or (as a ModelProto) with its uint8 × int8 integer ops on uint8 weights, which onnxruntime
    computes exactly on every CPU."""
    proto = _loaded_if(model, has_saturating_ops)
    exact = None if proto is None else exact_integer(proto)
    return model if exact is None else exact


def _loaded_if(model: str | Path | onnx.ModelProto | bytes, wanted) -> onnx.ModelProto | None:
    """``model`` as a ModelProto with its weights where ``wanted(proto)`` holds, else None (a file is first read
    without its external data, to look)."""
    if isinstance(model, bytes):
        proto = onnx.ModelProto.FromString(model)
    elif isinstance(model, onnx.ModelProto):
        proto = model
    else:
        if not wanted(read_model(model, external_data=False)):
            return None
        proto = read_model(model)
    return proto if wanted(proto) else None
