"""What a decoder with a key/value cache looks like to trt-bridge: the names onnxruntime-genai and Optimum give its
cache inputs, and the cache dimensions an exporter's config beside the model states.

- cache inputs: ``past_key_values.N.key`` / ``past_key_values.N.value`` (also ``past_key_*`` / ``past_value_*``,
  e.g. ``past_key_0``), each [batch, kv_heads, past_length, head_size];
- configs: onnxruntime-genai's ``genai_config.json`` (``model.decoder.num_key_value_heads``, ``head_size``) or
  Hugging Face's ``config.json`` (``num_key_value_heads``, ``head_dim`` or ``hidden_size / num_attention_heads``).

onnxruntime-genai declares the head size of its caches symbolic (``kv_cache_dim``); TensorRT needs it fixed, and
the config says what it is (:mod:`trt_bridge.prepare.decoder_dims` writes it into a converted model,
:mod:`trt_bridge.tensorrt.decoder_profiles` and :mod:`trt_bridge.verification.decoder` read it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_PAST = (re.compile(r"past_key_values\.\d+\.(key|value)"), re.compile(r"past_(key|value)_\w+"))


def is_past(name: str) -> bool:
    """A key/value-cache input of onnxruntime-genai's or Optimum's naming."""
    return any(pattern.fullmatch(name) for pattern in _PAST)


def config_dims(folder: Path) -> dict[str, int]:
    """The cache dimensions the exporter's config in ``folder`` states: ``{"heads": kv heads, "head": head size}``,
    or {} where there is no readable config."""
    try:
        genai = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        return {"heads": int(genai["num_key_value_heads"]), "head": int(genai["head_size"])}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        hf = json.loads((folder / "config.json").read_text())
        heads = int(hf["num_attention_heads"])
        return {"heads": int(hf.get("num_key_value_heads") or heads),
                "head": int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)}
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return {}
