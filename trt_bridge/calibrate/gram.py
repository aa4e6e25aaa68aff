"""The Gram matrix ``XᵀX`` of a layer's input over the calibration feeds, and its mean magnitude per channel: what
AWQ's and GPTQ's weight roundings (:mod:`trt_bridge.calibrate.awq`, :mod:`trt_bridge.calibrate.gptq`) read instead
of the activations themselves."""

from __future__ import annotations

import numpy as np


class GramObserver:
    """``XᵀX`` and the mean of ``|x|`` per channel of the last axis, over every row seen (non-finite values as 0).
    Rows are gathered up to ``BATCH_VALUES`` values first: one large product instead of a small one per feed."""

    BATCH_VALUES = 1 << 21  # 8 MB of float32

    def __init__(self) -> None:
        self._gram: np.ndarray | None = None
        self._abs_sum: np.ndarray | None = None
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0
        self.rows = 0

    def update(self, values: np.ndarray) -> None:
        v = np.asarray(values, np.float32)
        v = v.reshape(-1, v.shape[-1])
        if not np.isfinite(v).all():
            v = np.where(np.isfinite(v), v, 0.0).astype(np.float32)
        self._pending.append(v)
        self._pending_rows += v.shape[0]
        self.rows += v.shape[0]
        if self._pending_rows * v.shape[1] >= self.BATCH_VALUES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        v = np.concatenate(self._pending)
        self._pending, self._pending_rows = [], 0
        gram, abs_sum = (v.T @ v).astype(np.float64), np.abs(v).sum(axis=0, dtype=np.float64)
        if self._gram is None:
            self._gram, self._abs_sum = gram, abs_sum
        else:
            self._gram += gram
            self._abs_sum += abs_sum

    def joined(self, other: GramObserver) -> GramObserver:
        """This one with ``other``'s rows added (in place)."""
        self._flush()
        if other.gram is not None:
            self._gram, self._abs_sum = self._gram + other.gram, self._abs_sum + other._abs_sum
            self.rows += other.rows
        return self

    @property
    def gram(self) -> np.ndarray | None:
        self._flush()
        return self._gram

    @property
    def mean_abs(self) -> np.ndarray:
        self._flush()
        return self._abs_sum / max(self.rows, 1)
