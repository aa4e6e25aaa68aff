"""Run onnxruntime on the lifted float model, feed by feed, into streaming observers."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass

import onnx

from trt_bridge.calibration.feeds import FeedSource
from trt_bridge.calibration.observers import QMAX, CalibMethod, RangeObserver
from trt_bridge.errors import CalibrationDataError, MissingDependencyError
from trt_bridge.model import serialize_for_session

log = logging.getLogger("trt_bridge.calibration")


@dataclass(frozen=True)
class CalibrationResult:
    observers: dict[str, RangeObserver]
    feeds: int
    seconds: float
    method: CalibMethod

    def amax(self, tensor: str, center: float = 0.0) -> float:
        return self.observers[tensor].amax(center)

    def scale(self, tensor: str, center: float = 0.0) -> float:
        """Symmetric int8 scale; a tensor that was all zeros gets scale 1/127 (any positive scale is exact)."""
        amax = self.amax(tensor, center)
        return (amax if amax > 0 else 1.0) / QMAX


def _import_ort():
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a core dependency
        raise MissingDependencyError("onnxruntime is needed for calibration: pip install onnxruntime") from exc
    return ort


def calibrate(model: onnx.ModelProto, tensors: list[str], feeds: FeedSource, method: CalibMethod,
              percentile: float = 99.99, progress: bool = True) -> CalibrationResult:
    """Observe ``tensors`` of the float ``model`` on every feed into range observers."""
    observers = {t: RangeObserver(method, percentile) for t in tensors}
    count, seconds = observe(model, observers, feeds, progress)
    for t, obs in observers.items():
        if obs.max == 0.0:
            log.warning("activation '%s' was zero on every calibration feed", t)
    return CalibrationResult(observers, count, seconds, CalibMethod(method))


def observe(model: onnx.ModelProto, observers: dict, feeds: FeedSource, progress: bool = True,
            desc: str = "calibrating") -> tuple[int, float]:
    """Run ``model`` on every feed and hand each observed tensor to ``observers[name].update``.

    One onnxruntime session, one feed at a time: memory holds one feed's activations.
    The model is not copied: the observed tensors are appended to its outputs for the
    session and removed again.
    """
    ort = _import_ort()
    start = time.perf_counter()
    graph_inputs = {i.name for i in model.graph.input}
    exposed = [t for t in observers if t not in graph_inputs]
    present = {o.name for o in model.graph.output}
    added = [name for name in exposed if name not in present]
    for name in added:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    count = 0
    with tempfile.TemporaryDirectory(prefix="trt-bridge-calib-") as workdir:
        try:
            try:
                session = ort.InferenceSession(serialize_for_session(model, workdir), options,
                                               providers=["CPUExecutionProvider"])
            finally:
                del model.graph.output[len(model.graph.output) - len(added):]
        except Exception as exc:
            raise CalibrationDataError(f"onnxruntime cannot run the lifted float model: {exc}") from exc
        for feed in _progress(feeds, progress, desc):
            try:
                outputs = session.run(exposed, feed) if exposed else []
            except Exception as exc:
                raise CalibrationDataError(
                    f"onnxruntime failed on calibration feed {count} "
                    f"({', '.join(f'{k}{list(v.shape)}' for k, v in feed.items())}): {exc}"
                ) from exc
            for name, value in zip(exposed, outputs):
                observers[name].update(value)
            for name in observers:
                if name in graph_inputs:
                    observers[name].update(feed[name])
            count += 1
    return count, time.perf_counter() - start


def _progress(feeds: FeedSource, enabled: bool, desc: str):
    if not enabled:
        return iter(feeds)
    try:
        from tqdm import tqdm
    except ImportError:
        return iter(feeds)
    return tqdm(feeds, total=feeds.total, desc=desc, unit="feed", leave=False, disable=None)

