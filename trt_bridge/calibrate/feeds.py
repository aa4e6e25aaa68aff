"""What a calibration feed is, and the validation of every feed against the model's inputs.

A feed is ``{input name: array}``; :class:`FeedSource` is the base of every source of them
(:mod:`trt_bridge.calibrate.feed_sources`: files, data-loader scripts, random feeds).

Every feed is checked (names, dtype, rank, fixed dims) before it reaches
onnxruntime, so a mismatch is reported with the input's name and both shapes
instead of as a broadcast error deep inside the graph. Given the model
(``open_feeds(..., model=...)`` in :mod:`trt_bridge.calibrate.feed_sources`), each
distinct set of feed shapes is also checked against what shape inference implies for
every broadcasting node (:mod:`trt_bridge.ir.shapes`): a feed whose shapes make a
node's inputs impossible to broadcast is reported with the input, the node and both shapes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from trt_bridge.errors import CalibrationDataError
from trt_bridge.ir.decoder import is_past
from trt_bridge.ir.shapes import BroadcastChecker, BroadcastConflict, shape_text

Feed = dict[str, np.ndarray]
log = logging.getLogger("trt_bridge.calibrate")


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]  # int: fixed; str/None: dynamic

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def batch(self) -> int:
        first = self.shape[0] if self.shape else 1
        return first if isinstance(first, int) and first > 0 else 1

    def shape_text(self) -> str:
        return shape_text(self.shape)


def model_inputs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (graph inputs that are not initializers)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    inits = {i.name for i in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        )
        specs.append(InputSpec(vi.name, np.dtype(tensor_dtype_to_np_dtype(tt.elem_type)), dims))
    return specs


def validate_feed(feed: object, inputs: list[InputSpec], where: str) -> Feed:
    """Check one feed against the model's inputs; return it with dtypes matched."""
    if not isinstance(feed, dict):
        raise CalibrationDataError(f"{where}: a feed must be a dict of input name → array, got {type(feed).__name__}.")
    names = [i.name for i in inputs]
    keys = [k for k in feed if not isinstance(k, str)]
    if keys:
        raise CalibrationDataError(f"{where}: the feed's key {keys[0]!r} ({type(keys[0]).__name__}) is not an input "
                                   f"name; key each array by its input's name (a string): {', '.join(names)}.")
    unknown = sorted(set(feed) - set(names))
    if unknown:
        raise CalibrationDataError(
            f"{where}: '{unknown[0]}' is not an input of the model. The model's inputs are: "
            f"{', '.join(names)}. Rename the array to the input it is meant for."
        )
    out: Feed = {}
    for spec in inputs:
        if spec.name not in feed:
            raise CalibrationDataError(
                f"{where}: no data for input '{spec.name}' (expected shape {spec.shape_text()}, "
                f"{spec.dtype}). Given: {', '.join(sorted(feed)) or 'nothing'}."
            )
        try:
            arr = np.asarray(feed[spec.name])
        except (ValueError, TypeError) as exc:  # a ragged nested list: rows of different lengths
            raise CalibrationDataError(f"{where}: input '{spec.name}' is not an array of one shape ({exc}); give a "
                                       "numpy array (nested lists must have rows of equal length).") from None
        if arr.dtype == object:
            raise CalibrationDataError(f"{where}: input '{spec.name}' holds Python objects, not numbers; give a "
                                       f"numeric numpy array of shape {spec.shape_text()}.")
        if arr.ndim != spec.rank:
            raise CalibrationDataError(
                f"{where}: input '{spec.name}' expects rank {spec.rank}, shape {spec.shape_text()}, "
                f"but the feed has shape {list(arr.shape)} (rank {arr.ndim}). Reshape the data to the "
                "model's input shape."
            )
        for axis, (want, got) in enumerate(zip(spec.shape, arr.shape)):
            if isinstance(want, int) and want > 0 and want != got:
                raise CalibrationDataError(
                    f"{where}: input '{spec.name}' expects shape {spec.shape_text()} but the feed has "
                    f"shape {list(arr.shape)}: dimension {axis} is {got}, the model fixes it at {want}."
                )
        out[spec.name] = _match_dtype(arr, spec, where)
    check_decoder_feed(out, inputs, where)
    return out


def check_decoder_feed(feed: Feed, inputs: list[InputSpec], where: str) -> None:
    """A decoder's feed (``input_ids``, ``attention_mask`` and its key/value cache) must be one step of its loop: one
    batch, and a mask as long as the past and the new tokens together (prefill: a past of length 0). A window cache
    (a past length named ``*sliding*``, onnxruntime-genai's Mistral) may be shorter than what the mask covers."""
    ids, mask = feed.get("input_ids"), feed.get("attention_mask")
    pasts = [(spec, feed[spec.name]) for spec in inputs if is_past(spec.name) and feed[spec.name].ndim == 4]
    if ids is None or mask is None or not pasts or ids.ndim != 2 or mask.ndim != 2:
        return
    spec, past = pasts[0]
    batches = {"input_ids": ids.shape[0], "attention_mask": mask.shape[0], spec.name: past.shape[0]}
    if len(set(batches.values())) > 1:
        raise CalibrationDataError(f"{where}: the decoder's inputs disagree on the batch: "
                                   f"{', '.join(f'{k} {v}' for k, v in batches.items())}. Give one batch to all.")
    window = "sliding" in str(spec.shape[2] or "")
    new, length, seen = ids.shape[1], mask.shape[1], past.shape[2]
    if length < new or (not window and length > seen + new):
        raise CalibrationDataError(
            f"{where}: 'attention_mask' is {length} long, but this step feeds {new} new token(s) after a past "
            f"'{spec.name}' of {seen}: the mask covers the past and the new tokens, {seen + new} here (a prefill "
            "feed has a past of length 0 and a mask as long as input_ids).")


def _match_dtype(arr: np.ndarray, spec: InputSpec, where: str) -> np.ndarray:
    if arr.dtype == spec.dtype:
        return arr
    same_kind = (np.issubdtype(arr.dtype, np.floating) and np.issubdtype(spec.dtype, np.floating)) or (
        np.issubdtype(arr.dtype, np.integer) and np.issubdtype(spec.dtype, np.integer)
    )
    if not same_kind:
        raise CalibrationDataError(
            f"{where}: input '{spec.name}' is {spec.dtype} but the feed is {arr.dtype}. "
            f"Convert the data with .astype(np.{spec.dtype})."
        )
    if np.issubdtype(spec.dtype, np.integer):
        info = np.iinfo(spec.dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise CalibrationDataError(
                f"{where}: input '{spec.name}' is {spec.dtype} but the feed's {arr.dtype} values do not fit in it."
            )
    return arr.astype(spec.dtype)


class FeedSource:
    """An iterable of validated feeds; ``total`` is known for file sources."""

    description = "feeds"
    total: int | None = None
    #: Checks the feeds' shapes against the model's broadcasting nodes (see :meth:`check_broadcasts`).
    broadcasts: BroadcastChecker | None = None
    #: At most this many distinct sets of feed shapes are checked (one shape inference each).
    max_shape_checks = 16
    #: Each feed is copied once validated: the source may reuse its buffers, and calibration reads a feed ahead.
    copies = False
    #: The most feeds one pass reads (``--calib-max``); a source with more stops there, with a warning.
    limit: int | None = None
    flag = "--calib-max"  # the option that sets ``limit``, for the warning
    _capped = False

    def __init__(self, inputs: list[InputSpec]):
        self.inputs = inputs
        self._shape_sets: set[tuple] = set()

    def capped(self, limit: int | None, flag: str = "--calib-max") -> FeedSource:
        """Read at most ``limit`` feeds per pass (None: all)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise CalibrationDataError(f"{flag} must be a positive number of feeds, got {limit!r}.")
        self.limit, self.flag = limit, flag
        if limit is not None and self.total is not None:
            self.total = min(self.total, limit)
        return self

    def check_broadcasts(self, model: onnx.ModelProto | BroadcastChecker) -> FeedSource:
        """Also check each distinct set of feed shapes against ``model``'s broadcasting nodes (or a checker
        of them already made, whose results are cached).

        Keeps only the model's skeleton (no large weights). Conflicts the model's declared
        shapes already have are its own problem (``check`` reports them), not the feeds'.
        """
        checker = model if isinstance(model, BroadcastChecker) else BroadcastChecker(model)
        self.broadcasts, self._shape_sets = checker, set()
        return self

    def raw(self) -> Iterable[tuple[str, object]]:  # (where, feed)
        raise NotImplementedError

    def check(self) -> None:
        """Validate the first feed now, so a wrong name, dtype or shape fails before any work starts."""
        for _ in self:
            return

    def __iter__(self) -> Iterator[Feed]:
        count = 0
        for where, feed in self.raw():
            if self.limit is not None and count >= self.limit:
                if not self._capped:
                    self._capped = True
                    log.warning("%s: stopped at %d feeds; it has more (%s).", self.description, self.limit,
                                f"{self.flag} N reads up to N" if self.flag.startswith("--") else self.flag)
                return
            count += 1
            feed = validate_feed(feed, self.inputs, where)
            if self.copies:
                feed = {name: np.array(value, copy=True) for name, value in feed.items()}
            self._check_shapes(feed, where)
            yield feed
        if count == 0:
            raise CalibrationDataError(f"{self.description}: yielded no feeds.")

    def _check_shapes(self, feed: Feed, where: str) -> None:
        if self.broadcasts is None:
            return
        shapes = tuple(sorted((name, arr.shape) for name, arr in feed.items()))
        if shapes in self._shape_sets or len(self._shape_sets) >= self.max_shape_checks:
            return
        self._shape_sets.add(shapes)
        conflicts = self.broadcasts.new_conflicts(dict(shapes))
        if conflicts:
            raise CalibrationDataError(broadcast_error(where, conflicts[0], feed, self.inputs))


def broadcast_error(where: str, conflict: BroadcastConflict, feed: Feed, inputs: list[InputSpec]) -> str:
    """The message for a feed whose shapes make ``conflict``: the input(s), the node, both shapes, the fix."""
    declared = {spec.name: spec for spec in inputs}
    names = [name for name in conflict.reaches_from if name in feed] or sorted(feed)
    given = [f"'{name}' with shape {list(feed[name].shape)} (the model declares {declared[name].shape_text()})"
             for name in names]
    subject = f"input {given[0]} breaks" if len(given) == 1 else f"inputs {', '.join(given)} break"
    quoted = ", ".join(f"'{name}'" for name in names)
    return (f"{where}: {subject} {conflict.message()}. Give {quoted} the shape the model expects, one for "
            f"which these shapes agree at output axis {conflict.axis} (or re-export the model for the shape "
            "you calibrate with).")
