"""The optimization profiles a decoder with a KV cache gets when no shapes are given: prefill and decode.

A model is a decoder here when its inputs are named as onnxruntime-genai and Optimum name them:

- a token input: ``input_ids`` [batch, sequence] or ``inputs_embeds`` [batch, sequence, hidden];
- at least one past: ``past_key_values.N.key`` / ``past_key_values.N.value`` (also ``past_key_*`` / ``past_value_*``,
  e.g. ``past_key_0``), each [batch, kv_heads, past_length, head_size];
- optionally ``position_ids`` [batch, sequence] and ``attention_mask`` [batch, past_length + sequence].

and every dynamic dimension is one of those (batch, sequence, past length, total length): an input it cannot place
(``cache_position``, a dynamic head count) leaves the model to the ordinary default (each dynamic dimension 1), so a
guess never builds an engine for shapes nobody meant. The two profiles (batch 1; a dimension the model fixes keeps its
value):

- ``prefill``: sequence 1..128 (opt 16), past length 0, attention mask 1..128 (opt 16);
- ``decode``: sequence 1, past length 1..512 (opt 128), attention mask 2..513 (opt 129).

A window cache (``windows``: pasts whose length is named ``*sliding*``, onnxruntime-genai's Mistral with
``GroupQueryAttention``'s ``sliding_window_cache``) holds its capacity at every step, never 0 rows, and its length is
no part of the mask's: it gets 1..512 (opt 128) at both profiles, the mask the lengths above.

TensorRT-RTX 1.7.1 takes a 0-length past in a profile (an empty tensor: the Concat of past and new keys is the new
keys) and builds it ahead of time; :data:`PREFILL_PAST` is that length. Decode shapes (one query token) may build
where prefill ones do not (TENSORRT_QUANTIZATION.md): ``trt-bridge build`` and ``check`` then name the profile that
fails (:mod:`.build`).
"""

from __future__ import annotations

from trt_bridge.ir.decoder import is_past
from trt_bridge.ir.model import read_model
from trt_bridge.tensorrt.profiles import Profile, Shape

#: (min, opt, max) of the sequence and past lengths of each default profile
PREFILL_SEQUENCE = (1, 16, 128)
PREFILL_PAST = 0  # TensorRT-RTX 1.7.1 accepts a 0-length dimension in a profile (verified: tests/test_check.py)
DECODE_PAST = (1, 128, 512)

#: input name → (rank, the axis of its dynamic length, which length: 'sequence' or 'total')
_TOKENS = {"input_ids": (2, 1, "sequence"), "inputs_embeds": (3, 1, "sequence"), "position_ids": (2, 1, "sequence"),
           "attention_mask": (2, 1, "total")}


def decoder_profiles(inputs: dict[str, Shape], windows: frozenset[str] = frozenset()) -> tuple[Profile, ...]:
    """The prefill and decode profiles of a decoder with inputs ``inputs`` (name → shape, -1 for a dynamic
    dimension: TensorRT's network inputs; ``windows``: the pasts that are window caches, :func:`window_pasts`); ()
    when it is not one, or has a dynamic dimension this module cannot place."""
    if not any(is_past(n) for n in inputs) or not ({"input_ids", "inputs_embeds"} & set(inputs)):
        return ()
    roles: dict[str, dict[int, str]] = {}  # input → {axis: 'batch' | 'sequence' | 'total' | 'past'}
    for name, shape in inputs.items():
        if is_past(name):
            if len(shape) != 4:
                return ()
            roles[name] = {0: "batch", 2: "window" if name in windows else "past"}
        elif name in _TOKENS:
            rank, axis, length = _TOKENS[name]
            if len(shape) != rank:
                return ()
            roles[name] = {0: "batch", axis: length}
        else:
            roles[name] = {}
        if any(d < 0 and axis not in roles[name] for axis, d in enumerate(shape)):
            return ()
    prefill = {"sequence": PREFILL_SEQUENCE, "past": (PREFILL_PAST,) * 3, "window": DECODE_PAST}
    decode = {"sequence": (1, 1, 1), "past": DECODE_PAST, "window": DECODE_PAST}
    return tuple(Profile(_shapes(inputs, roles, lengths), name) for name, lengths in
                 (("prefill", prefill), ("decode", decode)))


def _shapes(inputs: dict[str, Shape], roles: dict[str, dict[int, str]], lengths: dict[str, tuple[int, int, int]]
            ) -> dict[str, tuple[Shape, Shape, Shape]]:
    lengths = {**lengths, "batch": (1, 1, 1),
               "total": tuple(s + p for s, p in zip(lengths["sequence"], lengths["past"]))}
    out = {}
    for name, shape in inputs.items():
        if all(d >= 0 for d in shape):
            continue
        trio = tuple(tuple(lengths[roles[name][axis]][i] if d < 0 else d for axis, d in enumerate(shape))
                     for i in range(3))
        out[name] = trio
    return out


def model_inputs_shapes(model) -> dict[str, Shape]:
    """An ONNX model's inputs as :func:`decoder_profiles` takes them (name → shape, -1 for a symbolic or unknown
    dimension), for callers that have the model and no TensorRT network (benchmarks, tests)."""
    return {v.name: tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)
            for v in model.graph.input}


def window_pasts(path, inputs: dict[str, Shape]) -> frozenset[str]:
    """The past inputs of the ONNX model at ``path`` that are window caches (their length named ``*sliding*``);
    the model is read (its header) only when ``inputs`` has a past."""
    if not any(is_past(n) for n in inputs):
        return frozenset()
    model = read_model(path, external_data=False)
    return frozenset(v.name for v in model.graph.input if is_past(v.name) and len(v.type.tensor_type.shape.dim) > 2
                     and "sliding" in v.type.tensor_type.shape.dim[2].dim_param)
