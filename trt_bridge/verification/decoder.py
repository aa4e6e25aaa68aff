"""What makes a model a decoder with a key/value cache, and the shapes of its cache, read from its inputs.

The inputs the generation loop of ``verify`` drives (onnxruntime-genai's and Optimum's naming)::

    input_ids            [batch, seq]             int64 (or int32)
    attention_mask       [batch, past + seq]      ones, one longer each step
    position_ids         [batch, seq]             optional: the positions of the new tokens
    past_key_values.N.key / .value  [batch, kv_heads, past, head]   the cache; empty (past 0) at prefill (a
                                             window cache, ``past_sliding_length``: its capacity at every step)
    use_cache_branch     [1] bool                 optional: Optimum's merged If (False at prefill, True after)

and its outputs ``logits`` [batch, seq, vocab] and ``present.N.key`` / ``.value`` (fed back as the pasts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx

from trt_bridge.errors import TrtBridgeError
from trt_bridge.ir.decoder import config_dims

INPUT_IDS, ATTENTION_MASK, POSITION_IDS, USE_CACHE_BRANCH = ("input_ids", "attention_mask", "position_ids",
                                                             "use_cache_branch")
#: how an exporter names the present output of a past input (first match wins)
PRESENT_NAMES = (("past_key_values", "present"), ("past_key_values", "present_key_values"), ("past", "present"))


@dataclass(frozen=True)
class CacheTensor:
    """One past input and the present output that becomes it at the next step."""

    past: str
    present: str
    dtype: str  # numpy name of the element type: 'float32', 'float16'
    shape: tuple[int | str, ...]  # declared: ints, or the names of symbolic dimensions
    past_axis: int  # the axis that grows by the new tokens each step


@dataclass(frozen=True)
class DecoderSignature:
    input_ids_dtype: str
    attention_mask_dtype: str
    position_ids_dtype: str | None  # None: the model takes no position_ids
    cache: tuple[CacheTensor, ...]
    logits: str
    vocab: int | None  # the last dimension of logits (None: symbolic)
    use_cache_branch: bool
    batch: int | None  # a fixed batch size (None: dynamic)

    @property
    def outputs(self) -> list[str]:
        return [self.logits, *(c.present for c in self.cache)]


def _dims(value: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in value.type.tensor_type.shape.dim)


def _present_name(past: str, outputs: set[str]) -> str | None:
    for old, new in PRESENT_NAMES:
        if past.startswith(old) and new + past[len(old):] in outputs:
            return new + past[len(old):]
    return None


def decoder_signature(model: onnx.ModelProto) -> DecoderSignature | None:
    """The decoder a model is, or None when it is not one.

    A decoder has an ``input_ids`` input, an ``attention_mask`` input, at least one cache input
    (``past_key_values.N.key``, ``past.N.value``, ...) of rank 3 or more whose matching ``present...`` output
    exists, and a ``logits`` output (else: its first output of rank 3). Only the graph's inputs and outputs are
    read (no weights are needed).
    """
    inputs = {i.name: i for i in model.graph.input}
    outputs = {o.name: o for o in model.graph.output}
    if INPUT_IDS not in inputs or ATTENTION_MASK not in inputs:
        return None
    cache = []
    for name, value in inputs.items():
        present = _present_name(name, set(outputs)) if name.startswith("past") else None
        shape = _dims(value)
        if present is None or len(shape) < 3:
            continue
        axes = [i for i, d in enumerate(shape) if isinstance(d, str) and ("past" in d or "seq" in d)]
        cache.append(CacheTensor(name, present, _dtype(value), shape, axes[0] if axes else len(shape) - 2))
    logits = "logits" if "logits" in outputs else next((o.name for o in model.graph.output if len(_dims(o)) == 3),
                                                       None)
    if not cache or logits is None:
        return None
    vocab = _dims(outputs[logits])[-1]
    batch = _dims(inputs[INPUT_IDS])[0]
    return DecoderSignature(_dtype(inputs[INPUT_IDS]), _dtype(inputs[ATTENTION_MASK]),
                            _dtype(inputs[POSITION_IDS]) if POSITION_IDS in inputs else None, tuple(cache), logits,
                            vocab if isinstance(vocab, int) and vocab > 0 else None, USE_CACHE_BRANCH in inputs,
                            batch if isinstance(batch, int) and batch > 0 else None)


def _dtype(value: onnx.ValueInfoProto) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name


def decoder_pair(paths: tuple[Path, Path], headers: tuple[onnx.ModelProto, onnx.ModelProto],
                 generation_asked: bool) -> tuple[DecoderSignature, DecoderSignature] | None:
    """Both models' signatures when both are decoders; None when neither is (an error when the generation loop's
    options were given for them, or when only one is a decoder)."""
    signatures = tuple(decoder_signature(h) for h in headers)
    if all(s is None for s in signatures):
        if generation_asked:
            raise TrtBridgeError(f"--prompts, --steps, --prompt-length and --min-token-agreement apply to decoders "
                                 f"with a key/value cache (input_ids, attention_mask, past_key_values.*); {paths[1]} "
                                 "is none: drop them.")
        return None
    if any(s is None for s in signatures):
        which, other = paths if signatures[0] else paths[::-1]
        raise TrtBridgeError(f"{which} is a decoder with a key/value cache and {other} is not: verify compares two "
                             "forms of one model.")
    return signatures


def empty_cache_shapes(model: onnx.ModelProto, path: Path, signature: DecoderSignature,
                       fallback: dict[str, tuple[int, ...]] | None = None) -> dict[str, tuple[int, ...]]:
    """The shape of each past input at prefill (batch 1, past length 0), every other dimension resolved.

    A window cache (a past length named ``*sliding*``: onnxruntime's ``GroupQueryAttention`` with
    ``sliding_window_cache=1``, onnxruntime-genai's Mistral) holds the same rows at every step, at least the window
    (onnxruntime refuses fewer): :func:`window_capacity`, or ``fallback``'s.

    A symbolic dimension (onnxruntime-genai declares the head size ``kv_cache_dim``) is taken, in this order,
    from the present output's declared shape, from the exporter's config beside the model (genai_config.json,
    config.json: the first free axis is the key/value heads, the last the head size), or from ``fallback`` (the
    other model's shapes: a converted model need not keep the configs beside it).
    """
    outputs = {o.name: _dims(o) for o in model.graph.output}
    config = window = None
    shapes = {}
    for c in signature.cache:
        present = outputs.get(c.present, ())
        free = [i for i in range(1, len(c.shape)) if i != c.past_axis]
        dims = []
        for axis, dim in enumerate(c.shape):
            if axis == c.past_axis and "sliding" in str(dim):  # a window cache: as many rows as it holds
                window = window if window is not None else window_capacity(model, path)
                dims.append(window or (fallback or {}).get(c.past, (0,) * len(c.shape))[axis])
                continue
            if axis == 0 or axis == c.past_axis:
                dims.append(1 if axis == 0 else 0)
                continue
            if not isinstance(dim, int) and len(present) == len(c.shape) and isinstance(present[axis], int):
                dim = present[axis]
            if not isinstance(dim, int):
                config = config_dims(path.parent) if config is None else config
                dim = config.get("heads" if axis == free[0] else "head" if axis == free[-1] else "", dim)
            if not isinstance(dim, int) and fallback and c.past in fallback:
                dim = fallback[c.past][axis]
            if not isinstance(dim, int):
                raise TrtBridgeError(
                    f"{path}: dimension {axis} ('{dim}') of the cache input '{c.past}' is symbolic and neither its "
                    f"output '{c.present}', a genai_config.json/config.json beside the model nor the other model "
                    "gives it; put the exporter's config beside the model.")
            dims.append(dim)
        shapes[c.past] = tuple(dims)
    return shapes


def window_capacity(model: onnx.ModelProto, path: Path) -> int:
    """The rows of a window cache, as the loop feeds them: the largest ``local_window_size`` of the model's
    ``GroupQueryAttention`` nodes with ``sliding_window_cache=1``, else the window (and slack) of the
    genai_config.json beside it; 0 where neither says (a converted model: the source's is taken)."""
    windows = [0]
    for node in model.graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        if node.op_type == "GroupQueryAttention" and attrs.get("sliding_window_cache", 0) == 1:
            windows.append(int(attrs.get("local_window_size", 0)))
    if max(windows) > 0:
        return max(windows)
    try:
        window = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]["sliding_window"]
        return int(window["window_size"]) + int(window.get("cache_slack", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return 0
