"""Stages of a pipeline and what each did, in the spirit of onnx-ir's ``PassResult``.

A stage is a named function over a shared state that returns the records it contributes (for a conversion: the
report's fields) and how many things it changed; :func:`run_stages` runs a tuple of them in order and times each.
The order is data, so a reader sees the whole pipeline in one place (``trt_bridge.conversion.STAGES``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("trt_bridge.stage")


@dataclass
class StageResult:
    """What one stage did: how many things it changed (rules fired, tensors quantized, files written, ...) and the
    records it contributes to the report; :func:`run_stages` fills in its name and wall time."""

    changed: int = 0
    records: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Stage:
    """``run(state) -> StageResult``; skipped where ``when(state)`` is false."""

    name: str
    run: Callable[[Any], StageResult]
    when: Callable[[Any], bool] = lambda state: True


def run_stages(stages: tuple[Stage, ...], state) -> list[StageResult]:
    """Run ``stages`` over ``state`` in order; return their results, each timed."""
    results = []
    for stage in stages:
        if not stage.when(state):
            continue
        start = time.perf_counter()
        result = stage.run(state)
        result.name, result.seconds = stage.name, time.perf_counter() - start
        log.debug("stage %s: %d change(s) in %.2f s", stage.name, result.changed, result.seconds)
        results.append(result)
    return results


def merged_records(results: list[StageResult]) -> dict[str, Any]:
    """Every stage's records in one mapping (a later stage's record of the same key wins), plus ``seconds``."""
    merged: dict[str, Any] = {}
    for result in results:
        merged.update(result.records)
    merged["seconds"] = {result.name: result.seconds for result in results}
    return merged
