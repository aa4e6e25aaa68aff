"""Run onnxruntime on the lifted float model, feed by feed, into streaming observers."""

from __future__ import annotations

import copy
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx

from trt_bridge.annotations import QMAX
from trt_bridge.calibrate.feeds import FeedSource
from trt_bridge.calibrate.observers import CalibMethod, RangeObserver
from trt_bridge.errors import CalibrationDataError, MissingDependencyError
from trt_bridge.ir.save import serialize_for_session
from trt_bridge.ir.size import payload_bytes
from trt_bridge.ir.store import store_of
from trt_bridge.ir.values import FLOAT32_TINY
from trt_bridge.runtime.bf16 import emulate_bfloat16
from trt_bridge.runtime.session import create_session, in_order, measuring_threads

log = logging.getLogger("trt_bridge.calibrate")


@dataclass(frozen=True)
class CalibrationResult:
    observers: dict[str, RangeObserver]
    feeds: int
    seconds: float
    method: CalibMethod
    skipped: int = 0  # feeds left out because a value was NaN or Inf
    percentile: float | None = None  # for method percentile: None is the observers' own
    keep_max: frozenset[str] = frozenset()  # tensors whose range is their max whatever the method

    def amax(self, tensor: str, center: float = 0.0) -> float:
        method = CalibMethod.MAX if tensor in self.keep_max else self.method
        return self.observers[tensor].amax(center, method, self.percentile)

    def scale(self, tensor: str, center: float = 0.0) -> float:
        """Symmetric int8 scale; a tensor that was all zeros gets scale 1/127 (any positive scale is exact), and
        one whose range is so small that amax/127 would be subnormal gets float32's smallest normal number (TensorRT
        and onnx.checker take no subnormal scale; values that small are zero to every float32 layer after it: a
        random-weight EfficientNet's projection output reached 7e-37)."""
        amax = self.amax(tensor, center)
        return max(amax / QMAX, FLOAT32_TINY) if amax > 0 else 1.0 / QMAX


def _import_ort():
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a core dependency
        raise MissingDependencyError("onnxruntime is needed for calibration: pip install onnxruntime") from exc
    return ort


def calibrate(model: onnx.ModelProto, tensors: list[str], feeds: FeedSource, method: CalibMethod,
              percentile: float = 99.99, progress: bool = True) -> CalibrationResult:
    """Observe ``tensors`` of the float ``model`` on every feed into range observers (``method`` auto is the
    conversion's choice among the others: :mod:`trt_bridge.conversion.range_choice`)."""
    if CalibMethod(method) is CalibMethod.AUTO:
        raise ValueError("calibrate() takes max, percentile, entropy or mse; auto is chosen by a conversion")
    start = time.perf_counter()
    observers = {t: RangeObserver(method, percentile) for t in tensors}
    with CalibrationSession(model, tensors) as session:
        count = session.run(observers, feeds, progress)
    return finish(observers, count, time.perf_counter() - start, method, len(session.skipped))


def finish(observers: dict[str, RangeObserver], count: int, seconds: float, method: CalibMethod, skipped: int = 0
           ) -> CalibrationResult:
    for t, obs in observers.items():
        if obs.max == 0.0:
            log.warning("activation '%s' was zero on every calibration feed", t)
    if skipped:
        log.warning("%d calibration feed(s) of %d skipped: they gave NaN or Inf values", skipped, count + skipped)
    return CalibrationResult(observers, count, seconds, CalibMethod(method), skipped)


@dataclass
class HeldOut:
    """The last ``size`` feeds of a calibration, held out to judge scales fitted on the feeds before them:
    ``snapshot`` holds the observers as they stood before feed ``total − size``; where ``capture``, the held-out
    feeds are kept with the model's outputs on them. A source whose feed count is unknown until it ends (a
    data-loader script) keeps the observers as they stood before each of its newest feeds instead, and learns
    ``total`` at the end (:meth:`end`)."""

    total: int | None
    size: int
    min_feeds: int = 8
    capture: bool = True
    snapshot: dict = field(default_factory=dict)  # {tensor: observer before feed total − size}
    feeds: list = field(default_factory=list)
    outputs: list = field(default_factory=list)  # per kept feed: {graph output name: value}
    indices: list = field(default_factory=list)  # per kept feed: its index (feeds with NaN or Inf are not kept)
    _recent: list = field(default_factory=list)  # unknown total: (index, observers before it), the newest

    @staticmethod
    def size_for(total: int, most: int = 8) -> int:
        """The held-out size: the largest power of two up to a quarter of ``total`` and ``most``; 0 for none."""
        h = 0
        while max(h * 2, 2) <= min(most, total // 4):
            h = max(h * 2, 2)
        return h

    @staticmethod
    def split(total: int | None, min_feeds: int = 8, most: int = 8) -> HeldOut | None:
        """None for fewer than ``min_feeds`` feeds; an unknown ``total`` holds out ``most`` until :meth:`end`
        knows it."""
        if total is not None and total < min_feeds:
            return None
        size = HeldOut.size_for(total, most) if total is not None else most
        return HeldOut(total, size, min_feeds) if size else None

    def sibling(self) -> HeldOut:
        """The same split for another pass over the feeds: its snapshot joins this one; nothing is captured."""
        return HeldOut(self.total, self.size, self.min_feeds, False, self.snapshot)

    def keeps(self, index: int) -> bool:
        return self.capture and self.size > 0 and (self.total is None or index >= self.total - self.size)

    def before(self, index: int, observers: dict) -> None:
        """Called before feed ``index`` is observed: snapshot where the held-out feeds start (or, with an
        unknown total, before each of the newest feeds)."""
        if self.total is None and self.size:
            self._recent.append((index, self._copies(observers)))
            del self._recent[:-(self.size + 1)]
        elif self.size and index == self.total - self.size:
            self.snapshot.update(self._copies(observers))

    def kept(self, index: int, feed: dict, outputs: dict) -> None:
        self.feeds.append({k: np.array(v, copy=True) for k, v in feed.items()})
        self.outputs.append(outputs)
        self.indices.append(index)
        if self.total is None:  # only the newest ``size`` can be held out
            first = index - self.size + 1
            while self.indices and self.indices[0] < first:
                del self.feeds[0], self.outputs[0], self.indices[0]

    def end(self, iterated: int) -> None:
        """After a pass over ``iterated`` feeds: a split of unknown total learns it and takes its snapshot."""
        if self.total is not None:
            return
        self.total = iterated
        self.size = min(self.size, self.size_for(iterated)) if iterated >= self.min_feeds else 0
        for index, taken in self._recent:
            if self.size and index == iterated - self.size:
                self.snapshot.update(taken)
        self._recent = []
        first = iterated - self.size
        keep = [k for k, index in enumerate(self.indices) if index >= first and self.size]
        self.feeds, self.outputs = [self.feeds[k] for k in keep], [self.outputs[k] for k in keep]
        self.indices = [self.indices[k] for k in keep]

    @staticmethod
    def _copies(observers: dict) -> dict:
        taken = {}
        for name, obs in observers.items():
            inner = getattr(obs, "observer", obs)  # calibrate.smooth.Rescaled wraps the range observer
            if isinstance(inner, RangeObserver):
                taken[name] = copy.deepcopy(inner)
        return taken


#: weights of this many bytes or more are calibrated without onnxruntime's weight prepacking, which copies every
#: MatMul's weight (2.6 GB more at the peak of a 2.9 GB encoder's conversion; its calibration was no slower without)
PREPACK_LIMIT = 512 << 20


class CalibrationSession:
    """One onnxruntime session over ``model`` that can fetch any of ``tensors``, feed by feed (``.session``
    for direct runs; ``simulate_qdq`` for a model with Q/DQ).

    The model is not copied: the tensors are appended to its outputs while the session
    is created and removed again. Memory holds two feeds' activations at a time (the model runs on the next
    feed while the observers take this one's). (A model with
    bfloat16 layers is, under ``simulate_qdq``: it runs as its float32 emulation, see
    :func:`trt_bridge.runtime.bf16.emulate_bfloat16`.)
    """

    def __init__(self, model: onnx.ModelProto, tensors: list[str], simulate_qdq: bool = False,
                 what: str = "the lifted float model"):
        ort = _import_ort()
        if simulate_qdq:
            model = emulate_bfloat16(model) or model
        self.graph_inputs = {i.name for i in model.graph.input}
        self.graph_outputs = [o.name for o in model.graph.output]
        present = {o.name for o in model.graph.output}
        added = [t for t in tensors if t not in self.graph_inputs and t not in present]
        known = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
        for name in added:  # float16 models expose float16 tensors
            model.graph.output.append(onnx.helper.make_tensor_value_info(
                name, known.get(name) or onnx.TensorProto.FLOAT, None))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.log_severity_level = 3
        measuring_threads(options)
        if simulate_qdq:  # a Q/DQ model: Q/DQ in float, as TensorRT computes them (trt_bridge.runtime.session)
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        store = store_of(model)
        if store is not None or payload_bytes(model) >= PREPACK_LIMIT:
            # onnxruntime packs each MatMul's weight into a copy of its own: the model's weights held twice
            options.add_session_config_entry("session.disable_prepacking", "1")
        if store is not None:  # the session maps the store's file: the graph's reads of it go from the resident set
            store.release_pages()
        self.skipped: set[int] = set()  # feeds left out because they gave a NaN or Inf (by index)
        self._workdir = tempfile.TemporaryDirectory(prefix="trt-bridge-calib-")
        try:
            self.session = create_session(serialize_for_session(model, self._workdir.name), options)
        except Exception as exc:
            self.close()
            raise CalibrationDataError(f"onnxruntime cannot run {what}: {exc}") from exc
        finally:
            del model.graph.output[len(model.graph.output) - len(added):]

    def __enter__(self) -> CalibrationSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.session = None
        self._workdir.cleanup()

    def run(self, observers: dict, feeds: FeedSource, progress: bool = True, desc: str = "calibrating",
            held_out: HeldOut | None = None) -> int:
        """Hand every feed's value of each observed tensor to ``observers[name].update``; return the feed count.
        With ``held_out``, snapshot the observers where its held-out feeds start (and keep feeds and outputs)."""
        fetch = [t for t in observers if t not in self.graph_inputs]
        # the model's outputs decide whether a feed counts (G4): fetched on every feed
        outs = [o for o in self.graph_outputs if o not in fetch]
        count, first_bad = 0, None
        index = -1

        def names_of(i: int) -> list[str]:
            return fetch + outs

        for index, feed, job in self._ahead(_progress(feeds, progress, desc), names_of):
            if held_out is not None:
                held_out.before(index, observers)
            keep = held_out is not None and held_out.keeps(index)
            try:
                names, outputs = job.result()
            except Exception as exc:
                raise CalibrationDataError(
                    f"onnxruntime failed on calibration feed {index} "
                    f"({', '.join(f'{k}{list(v.shape)}' for k, v in feed.items())}): {exc}"
                ) from exc
            got = dict(zip(names, outputs))
            # A feed with a NaN input, or on which the model's own outputs are NaN, must not decide a range: leave
            # it out. Inside the model, NaN and ±Inf are legitimate where they never reach an output (an attention
            # mask's -Inf, a padded row's NaN): the observers leave those values out.
            bad = bad_feed(feed, {o: got[o] for o in self.graph_outputs if o in got}, index)
            if bad is not None:
                if index not in self.skipped:
                    log.warning("calibration feed %d skipped: %s", index, bad)
                self.skipped.add(index)
                first_bad = first_bad or (index, bad)
                continue
            for name in fetch:
                observers[name].update(_as_float32(got[name]))
            for name in observers:
                if name in self.graph_inputs:
                    observers[name].update(_as_float32(feed[name]))
            if keep:
                held_out.kept(index, feed, {o: got[o] for o in self.graph_outputs if o in got})
            count += 1
        if held_out is not None:
            held_out.end(index + 1)
        if count == 0 and first_bad is not None:
            raise CalibrationDataError(
                f"every calibration feed ({len(self.skipped)}) holds or gives non-finite values, so no range can "
                f"be measured ({first_bad[1]}). Check the calibration data for NaN or values near float32's limit, "
                "and that the source model computes finite outputs on it.")
        return count

    def _ahead(self, feeds, names_of):
        """``(index, feed, job)`` per feed in order, ``job`` the future of ``(names fetched, their values)`` from
        onnxruntime's run on it: the runs of the next feeds go on (in worker threads, without the GIL) while the
        observers take this one's."""
        run = self.session.run

        def start(item):
            index, feed = item
            names = names_of(index)
            return names, (run(names, feed) if names else [])

        for (index, feed), job in in_order(start, enumerate(feeds)):
            yield index, feed, job

    def outputs(self, names: list[str], feeds) -> Iterator[tuple[dict, list]]:
        """``(feed, values of names)`` for each of ``feeds`` in order, several feeds running at once
        (:func:`~trt_bridge.runtime.session.in_order`); onnxruntime's error on a feed is raised as it is."""
        run = self.session.run
        for feed, job in in_order(lambda feed: run(names, feed) if names else [], feeds):
            yield feed, job.result()


def bad_feed(feed: dict, outputs: dict, index: int) -> str | None:
    """Why calibration feed ``index`` must be left out, or None: an input holding NaN, or an output of the model
    that is NaN on it (the source itself computes no result there). ±Inf is no reason: an input's is an attention
    mask's, an output's a log-probability of a masked position (log 0)."""
    for name, value in feed.items():
        if has_nan(value):
            return f"input '{name}' of feed {index} holds NaN"
    for name, value in outputs.items():
        if has_nan(value):
            return f"the source model itself outputs NaN on feed {index} (output '{name}')"
    return None


def has_nan(value) -> bool:
    """A NaN anywhere in ``value``: its max is NaN (one pass, no temporary; Inf of either sign is no NaN)."""
    value = np.asarray(value)
    return np.issubdtype(value.dtype, np.inexact) and value.size > 0 and bool(np.isnan(value.max()))


def _as_float32(value):
    """Observers accumulate in float32 at least (float16 histograms and sums overflow)."""
    import numpy as np

    value = np.asarray(value)
    return value.astype(np.float32) if value.dtype == np.float16 else value


def _progress(feeds: FeedSource, enabled: bool, desc: str):
    if not enabled:
        return iter(feeds)
    try:
        from tqdm import tqdm
    except ImportError:
        return iter(feeds)
    return tqdm(feeds, total=feeds.total, desc=desc, unit="feed", leave=False, disable=None)

