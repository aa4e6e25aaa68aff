"""Calibrate a lifted graph's activations in one onnxruntime session, smoothing where asked, in two passes.

Pass 1 records per-channel maxima of the smoothing candidates (MatMul inputs) and the ranges of everything else.
A candidate's few massive channels are then split off into a float side path (:mod:`.outliers`), smoothing
divides each candidate by its factors ``s`` (folded into the LayerNormalization, or a Mul, so the tensor keeps
its name), and pass 2 records the candidates' ranges as ``x / s`` without the split channels, on the same
session.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import onnx

from trt_bridge.annotations import Annotations
from trt_bridge.calibrate.feeds import FeedSource
from trt_bridge.calibrate.observers import CalibMethod, RangeObserver
from trt_bridge.calibrate.outliers import Split, split_outliers
from trt_bridge.calibrate.session import CalibrationResult, CalibrationSession, HeldOut, finish
from trt_bridge.calibrate.smooth import MIN_ROWS, ChannelMaxObserver, Rescaled, Smoothed, candidates, smooth
from trt_bridge.ir.store import store_of

log = logging.getLogger("trt_bridge.calibrate")


def calibrate_graph(graph, annotations: Annotations, lifted: onnx.ModelProto, needed: list[str], feeds: FeedSource,
                    method: CalibMethod, percentile: float, alpha: float | None, progress: bool = True,
                    held_out: HeldOut | None = None, split: bool = True
                    ) -> tuple[CalibrationResult, list[Smoothed], list[Split]]:
    """Observe ``needed`` on the float model ``lifted`` (whose graph is ``graph``) over ``feeds``; with ``alpha``
    (SmoothQuant's), split off the massive channels (with ``split``) and smooth the candidates that saw enough
    rows first. Returns the result, what was smoothed and what was split. ``held_out`` gets every observer as it
    stood where each held-out split starts, and the last feeds with the model's outputs."""
    start = time.perf_counter()
    observers = {t: RangeObserver(method, percentile) for t in needed}
    todo = [] if alpha is None else [t for t in candidates(graph, annotations) if t in observers]
    smoothed, splits = [], []
    with CalibrationSession(lifted, needed) as session:
        if not todo:
            count = session.run(observers, feeds, progress, held_out=held_out)
        else:
            maxima = {t: ChannelMaxObserver() for t in todo}
            count = session.run({**{t: o for t, o in observers.items() if t not in maxima}, **maxima}, feeds,
                                progress, desc="calibrating (1/2)", held_out=held_out)
            enough = {t: m.max for t, m in maxima.items() if m.rows >= MIN_ROWS}
            for t in sorted(set(maxima) - set(enough)):
                log.info("not smoothing %r: calibration saw %d row(s) per channel, fewer than %d", t,
                         maxima[t].rows, MIN_ROWS)
            splits = split_outliers(graph, annotations, enough) if split else []
            smoothed, factors = smooth(graph, annotations, enough, alpha)
            store = store_of(lifted)
            if store is not None:  # smoothing read the weights through the graph's maps: the session maps them too
                store.release_pages()
            # observed as the int8 path reads them: divided by s, without the split channels (zero weight rows)
            seen = {t: 1.0 / factors[t] if t in factors else None for t in todo}
            for done in splits:
                mult = np.ones(enough[done.tensor].size) if seen[done.tensor] is None else seen[done.tensor].copy()
                mult[list(done.channels)] = 0.0
                seen[done.tensor] = mult
            session.run({t: observers[t] if m is None else Rescaled(observers[t], m) for t, m in seen.items()},
                        feeds, progress, desc="calibrating (2/2)",
                        held_out=None if held_out is None else held_out.sibling())
        skipped = len(session.skipped)
    return finish(observers, count, time.perf_counter() - start, method, skipped), smoothed, splits
