"""A decoder's declared input and output dimensions, made what TensorRT's optimization profiles need.

1. The symbolic heads and head size of its key/value cache become what its exporter's config states.

onnxruntime-genai declares its caches ``past_key_values.N.key`` [batch, kv heads, past length, ``kv_cache_dim``]:
the head size is a name, not a number, although the model computes with one head size only. TensorRT builds an
optimization profile per shape range and needs every dimension that is not a length fixed, so a converted model
states it, as the ``genai_config.json`` (or Hugging Face ``config.json``) beside the source does::

    Before:  past_key_values.0.key  float [batch_size, 2, past_sequence_length, kv_cache_dim]
             present.0.key          float [batch_size, 2, total_sequence_length, kv_cache_dim]
    After:   past_key_values.0.key  float [batch_size, 2, past_sequence_length, 16]
             present.0.key          float [batch_size, 2, total_sequence_length, 16]

The names and types of the model's inputs and outputs stay; only the symbolic heads and head size become numbers.
Nothing changes without a config beside the source file, or for a dimension the model already fixes.

2. An attention mask whose length shares its name with the new tokens' gets a name of its own. Optimum's merged
decoders (``decoder_model_merged.onnx``) take the names of the decoder without a past: ``attention_mask`` [batch,
``sequence_length``] beside ``input_ids`` [batch, ``sequence_length``]. onnxruntime runs a decode step anyway (the mask
is one longer than the new tokens); TensorRT holds equally named dimensions equal and refuses the decode profile
("Input dimensions with this name have different constant values")::

    Before:  input_ids [batch_size, sequence_length], attention_mask [batch_size, sequence_length]
    After:   input_ids [batch_size, sequence_length], attention_mask [batch_size, total_sequence_length]
"""

from __future__ import annotations

from pathlib import Path

import onnx

from trt_bridge.ir.decoder import config_dims, is_past
from trt_bridge.prepare.change import Change

NAME = "decoder-dims"


def decoder_dims(model: onnx.ModelProto, where: str | Path) -> list[Change]:
    """Both steps of the module docstring on ``model`` (in place); ``where``: the source file."""
    return pin_cache_dims(model, where) + untie_mask_length(model)


def untie_mask_length(model: onnx.ModelProto) -> list[Change]:
    """Give ``attention_mask``'s length its own name where it shares the new tokens' in a model with a cache."""
    inputs = {v.name: v for v in model.graph.input}
    mask, tokens = inputs.get("attention_mask"), inputs.get("input_ids") or inputs.get("inputs_embeds")
    if mask is None or tokens is None or not any(is_past(n) for n in inputs) or _rank(mask) != 2 or _rank(tokens) < 2:
        return []
    length, new = mask.type.tensor_type.shape.dim[1], tokens.type.tensor_type.shape.dim[1]
    if not length.dim_param or length.dim_param != new.dim_param:
        return []
    taken = {d.dim_param for v in [*model.graph.input, *model.graph.output] for d in v.type.tensor_type.shape.dim}
    fresh = next(n for n in ("total_sequence_length", *(f"total_sequence_length_{i}" for i in range(1, 99)))
                 if n not in taken)
    old, length.dim_param = length.dim_param, fresh
    return [Change(NAME, "", f"'attention_mask' dimension 1 '{old}' is '{fresh}': it is the past and the new "
                             f"tokens, not '{old}' of '{tokens.name}'")]


def pin_cache_dims(model: onnx.ModelProto, where: str | Path) -> list[Change]:
    """Write the config's kv heads (axis 1) and head size (axis 3) into ``model``'s cache inputs and their present
    outputs where those are symbolic (in place); ``where``: the source file, whose folder holds the config."""
    source = Path(where)
    caches = [v for v in model.graph.input if is_past(v.name)]
    if not caches or not source.is_file():
        return []
    dims = config_dims(source.parent)
    if not dims:
        return []
    presents = [v for v in model.graph.output if v.name.startswith("present") and _rank(v) == 4]
    changes = []
    for value in [*caches, *presents]:
        shape = value.type.tensor_type.shape
        if _rank(value) != 4:
            continue
        for axis, key in ((1, "heads"), (3, "head")):
            dim = shape.dim[axis]
            if dim.HasField("dim_param") and not dim.HasField("dim_value"):
                what = f"'{value.name}' dimension {axis} '{dim.dim_param}' is {dims[key]} ({_config_name(source)})"
                dim.dim_value = dims[key]
                changes.append(Change(NAME, "", what))
    return changes


def _rank(value: onnx.ValueInfoProto) -> int:
    t = value.type.tensor_type
    return len(t.shape.dim) if t.HasField("shape") else -1


def _config_name(source: Path) -> str:
    return "genai_config.json" if (source.parent / "genai_config.json").is_file() else "config.json"
