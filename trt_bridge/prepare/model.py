"""Prepare a ModelProto for lifting: unique node names, integer pad codes retyped, bfloat16 per the policy, a
decoder's input dimensions as TensorRT's profiles need them, and a Cast wherever a node's inputs contradict its
schema."""

from __future__ import annotations

from pathlib import Path

import onnx

from trt_bridge.ir.names import name_nodes
from trt_bridge.ir.types import elem_types
from trt_bridge.prepare.decoder_dims import decoder_dims
from trt_bridge.prepare.pad_code import retype_pad_codes
from trt_bridge.prepare.types import Bf16Policy, agree_types, convert_bf16


def prepare(model: onnx.ModelProto, where: str | Path = "model", bf16: Bf16Policy = Bf16Policy.FP32,
            declared: dict[str, int] | None = None) -> list:
    """Make ``model``'s types agree with its ops (in place): bfloat16 per ``bf16``, then a Cast wherever
    a node's inputs contradict its schema. ``declared``: the exporter's value_info types, as
    :func:`load_model` captured them (None: the model's value_info is the exporter's). Returns the
    changes (``prepare.change.Change``)."""
    name_nodes(model)
    changes = retype_pad_codes(model, elem_types(model), str(where)) + convert_bf16(model, bf16)
    changes += decoder_dims(model, where)
    if declared is not None and bf16 is not Bf16Policy.KEEP:
        target = onnx.TensorProto.FLOAT if bf16 is Bf16Policy.FP32 else onnx.TensorProto.FLOAT16
        declared = {k: target if v == onnx.TensorProto.BFLOAT16 else v for k, v in declared.items()}
    return changes + agree_types(model, str(where), declared)

