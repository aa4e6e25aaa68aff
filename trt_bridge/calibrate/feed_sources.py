"""Calibration feed sources, and the one a user asked for (:func:`open_feeds`).

Sources (all yield ``{input name: array}`` one feed at a time, validated by
:class:`trt_bridge.calibrate.feeds.FeedSource`):

* ``.npz``: keys are input names. An array of rank ``input rank + 1`` holds one feed
  per index of axis 0; an array of the input's own rank is split along the batch axis
  into chunks of the model's batch size (1 when the batch is dynamic).
* a folder of ``.npz`` (one feed each) or ``.npy`` files (single-input models), in name order.
* a Polygraphy-style data-loader script: ``loader.py`` (function ``load_data``) or
  ``loader.py:function``, returning an iterable of feed dicts.
* random feeds (``--calib-random N``), seeded, only when asked for.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.calibrate.feeds import FeedSource, InputSpec
from trt_bridge.choices import FEED_LIMIT
from trt_bridge.errors import CalibrationDataError
from trt_bridge.ir.files import check_regular_input
from trt_bridge.ir.shapes import BroadcastChecker
from trt_bridge.user_code import import_user_file, user_code

log = logging.getLogger("trt_bridge.calibrate")
#: the largest random feed input drawn (bytes): a model declaring [1, 3, 100000, 100000] is refused, not allocated
RANDOM_FEED_LIMIT = 4 * 2**30


class NpzFeeds(FeedSource):
    def __init__(self, path: Path, inputs: list[InputSpec]):
        super().__init__(inputs)
        self.path, self.description = path, str(path)
        try:
            npz = np.load(path, allow_pickle=False)
        except Exception as exc:
            raise CalibrationDataError(f"{path}: not a readable .npz file ({exc}).") from exc
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise CalibrationDataError(f"{path}: holds a single array (a .npy file named .npz), not arrays keyed by "
                                       "input name. Save it with np.savez(path, INPUT=array), or rename it .npy and "
                                       "put it in a folder of feeds.")
        with npz:
            self._arrays = self._read(npz, inputs)
        counts = {spec.name: self._count(spec, self._arrays[spec.name]) for spec in inputs}
        if len(set(counts.values())) != 1:
            detail = ", ".join(f"'{k}': {v}" for k, v in counts.items())
            raise CalibrationDataError(f"{path}: inputs hold different numbers of feeds ({detail}).")
        self.total = next(iter(counts.values()))

    def _read(self, npz, inputs: list[InputSpec]) -> dict[str, np.ndarray]:
        path = self.path
        names = {i.name for i in inputs}
        unknown = sorted(set(npz.files) - names)
        if unknown:
            raise CalibrationDataError(
                f"{path}: array '{unknown[0]}' is not an input of the model. The model's inputs are: "
                f"{', '.join(sorted(names))}."
            )
        missing = sorted(names - set(npz.files))
        if missing:
            raise CalibrationDataError(
                f"{path}: no array for input '{missing[0]}'. Arrays given: {', '.join(npz.files)}."
            )
        arrays = {}
        for name in sorted(names):
            try:
                arrays[name] = npz[name]  # members are read lazily: errors surface here
            except Exception as exc:
                raise CalibrationDataError(
                    f"{path}: cannot read array '{name}' ({exc}). Save plain numeric arrays with np.savez."
                ) from exc
        return arrays

    def _count(self, spec: InputSpec, arr: np.ndarray) -> int:
        if arr.ndim == spec.rank + 1:
            return arr.shape[0]
        if arr.ndim == spec.rank == 0:
            return 1  # a scalar input given one scalar
        if arr.ndim == spec.rank and spec.rank > 0:
            if arr.shape[0] % spec.batch:
                raise CalibrationDataError(
                    f"{self.path}: input '{spec.name}' has {arr.shape[0]} samples on the batch axis, not a "
                    f"multiple of the model's batch size {spec.batch}."
                )
            return arr.shape[0] // spec.batch
        raise CalibrationDataError(
            f"{self.path}: array '{spec.name}' has shape {list(arr.shape)}; the input's shape is "
            f"{spec.shape_text()}. Give either one feed per index of axis 0 (rank {spec.rank + 1}) "
            f"or samples stacked on the batch axis (rank {spec.rank})."
        )

    def raw(self):
        for i in range(self.total):
            feed = {}
            for spec in self.inputs:
                arr = self._arrays[spec.name]
                if arr.ndim == spec.rank + 1:
                    feed[spec.name] = arr[i]
                elif arr.ndim == 0:
                    feed[spec.name] = arr
                else:
                    feed[spec.name] = arr[i * spec.batch:(i + 1) * spec.batch]
            yield f"{self.path} (feed {i})", feed


class FolderFeeds(FeedSource):
    def __init__(self, path: Path, inputs: list[InputSpec]):
        super().__init__(inputs)
        self.description = str(path)
        self.files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy"))
        if not self.files:
            raise CalibrationDataError(f"{path}: folder has no .npz or .npy files.")
        for p in self.files:
            check_regular_input(p, "calibration feed")
        if any(p.suffix == ".npy" for p in self.files) and len(inputs) != 1:
            raise CalibrationDataError(
                f"{path}: .npy files hold one array, but the model has {len(inputs)} inputs; use .npz files "
                "whose keys are the input names."
            )
        self.total = len(self.files)

    def raw(self):
        for p in self.files:
            try:
                if p.suffix == ".npy":
                    feed = {self.inputs[0].name: np.load(p, allow_pickle=False)}
                else:
                    with np.load(p, allow_pickle=False) as z:
                        feed = {k: z[k] for k in z.files}
            except Exception as exc:
                raise CalibrationDataError(f"{p}: cannot read ({exc}).") from exc
            yield str(p), feed


class ScriptFeeds(FeedSource):
    copies = True  # a loader may refill its buffers (arrays, memoryviews) for the next feed, which is read ahead

    def __init__(self, spec: str, inputs: list[InputSpec]):
        super().__init__(inputs)
        path_text, _, func = spec.partition(":")
        self.path, self.func = Path(path_text), func or "load_data"
        self.description = f"{self.path}:{self.func}"
        check_regular_input(self.path, "data-loader script")
        if not self.path.is_file():
            raise CalibrationDataError(f"{self.path}: data-loader script not found.")
        module = import_user_file(self.path, "trt_bridge_user_loader", f"{self.path} (data-loader script)",
                                  CalibrationDataError, "; it must define a function that returns the feeds")
        self._load = getattr(module, self.func, None)
        if not callable(self._load):
            raise CalibrationDataError(
                f"{self.path}: defines no function '{self.func}'. Name it with {self.path}:FUNCTION."
            )

    def raw(self):
        hint = "; it must return an iterable of {input name: array} dicts"
        with user_code(f"{self.description} (the data loader)", CalibrationDataError, hint):
            iterator = iter(self._load())
        i, end = 0, object()
        while True:
            with user_code(f"{self.description} (the data loader, at feed {i})", CalibrationDataError, hint):
                feed = next(iterator, end)
            if feed is end:
                return
            yield f"{self.description} (feed {i})", feed
            i += 1


class RandomFeeds(FeedSource):
    def __init__(self, count: int, inputs: list[InputSpec], seed: int = 0):
        super().__init__(inputs)
        self.total, self.seed = count, seed
        self.description = f"{count} random feeds"
        dynamic = [f"{i.name}{i.shape_text()}" for i in inputs if any(not isinstance(d, int) for d in i.shape)]
        if dynamic:
            log.warning("random feeds use 1 for dynamic dimensions of %s", ", ".join(dynamic))
        for spec in inputs:
            shape = self._shape(spec)
            size = math.prod(shape) * max(np.dtype(spec.dtype).itemsize, 8)  # drawn in float64 or int64
            if size > RANDOM_FEED_LIMIT:
                raise CalibrationDataError(
                    f"input '{spec.name}' {list(shape)} is too large for a random feed ({size / 2**30:.3g} GiB; the "
                    f"limit is {RANDOM_FEED_LIMIT / 2**30:.0f} GiB). Pass --calib-data with real inputs of the size "
                    "the model runs at.")

    @staticmethod
    def _shape(spec: InputSpec) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) and d > 0 else 1 for d in spec.shape)

    def raw(self):
        rng = np.random.default_rng(self.seed)
        for i in range(self.total):
            feed = {}
            for spec in self.inputs:
                shape = self._shape(spec)
                if np.issubdtype(spec.dtype, np.floating):
                    feed[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
                elif spec.dtype == np.bool_:
                    feed[spec.name] = rng.integers(0, 2, shape).astype(bool)
                else:
                    feed[spec.name] = rng.integers(0, 2, shape).astype(spec.dtype)
            yield f"random feed {i}", feed


def source_path(spec) -> Path | None:
    """The file or folder a calibration data spec names (``loader.py:fn`` names ``loader.py``); None for None."""
    if spec is None:
        return None
    text = str(spec)
    return Path(text.split(":", 1)[0] if ".py:" in text else text)


def open_feeds(data: str | None, random_count: int | None, inputs: list[InputSpec], *,
               model: onnx.ModelProto | BroadcastChecker | None = None, limit: int | None = FEED_LIMIT,
               flag: str = "--calib-max") -> FeedSource:
    """The feed source a user asked for with ``--calib-data`` or ``--calib-random``, reading at most ``limit``
    feeds per pass (``flag`` names the option that sets it, in the warning at the cap).

    With ``model`` (or its :class:`BroadcastChecker`), each distinct set of feed shapes is also checked
    against the model's broadcasting nodes (:meth:`FeedSource.check_broadcasts`).
    """
    if data is None and random_count is not None and limit is not None and random_count > limit:
        raise CalibrationDataError(f"--calib-random {random_count} asks for more feeds than {flag} {limit}; give "
                                   f"{flag} {random_count} too if that many are meant.")
    source = _open_feeds(data, random_count, inputs).capped(None if data is None else limit, flag)
    return source.check_broadcasts(model) if model is not None else source


def _open_feeds(data: str | None, random_count: int | None, inputs: list[InputSpec]) -> FeedSource:
    if data is not None and random_count is not None:
        raise CalibrationDataError("give either --calib-data or --calib-random, not both.")
    if data is None:
        if random_count is None:
            raise CalibrationDataError("no calibration data given.")
        if random_count < 1:
            raise CalibrationDataError("--calib-random needs a positive number of feeds.")
        log.warning("calibrating on %d random feeds: scales from noise are poor; pass --calib-data "
                    "with real inputs for a usable model", random_count)
        return RandomFeeds(random_count, inputs)
    path = source_path(data)
    check_regular_input(path, "calibration data")
    if path.suffix == ".py":
        return ScriptFeeds(data, inputs)
    if path.is_dir():
        return FolderFeeds(path, inputs)
    if not path.exists():
        raise CalibrationDataError(f"{path}: calibration data not found.")
    if path.suffix == ".npz":
        return NpzFeeds(path, inputs)
    raise CalibrationDataError(
        f"{path}: unknown calibration data format; give an .npz file, a folder of .npz/.npy files, "
        "or a data-loader script (loader.py or loader.py:function)."
    )
