"""``--constant-inputs NAME=VALUE``: an input the output holds as a constant, so the Ifs that branch on it are
inlined when lifting (``prepare.constant_if``)::

    Before:                                                  After (--constant-inputs sr=16000):
      sr (int64 input) ─ Equal(16000) ─▶ If ─ then: 16 kHz     sr = 16000 (initializer) ─ Equal ─ [folded]
                                             └ else: 8 kHz       input ─ the 16 kHz branch's nodes ─ output

For a model TensorRT cannot build with its If: TensorRT-RTX builds no conditional whose branches hold another
conditional or an LSTM whose state outputs are read (Silero VAD's sample-rate If: "Assertion tScope.getType() !=
ScopeType::kUNDEFINED failed ... graphScope.cpp"), and it checks both branches' shapes over the whole profile, which
no one input length satisfies when each branch takes its own (576 samples at 16 kHz, 288 at 8 kHz). One output per
value builds; the input is gone from the output, and calibration feeds leave it out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trt_bridge.errors import TrtBridgeError
from trt_bridge.prepare.change import Change

NAME = "constant-input"


def apply(model: onnx.ModelProto, values: dict[str, float], path: str | Path) -> list[Change]:
    """Turn each input of ``model`` named in ``values`` into an initializer of that value (in place): its declared
    type, and its shape, which must be static (a scalar, or any shape of one element)."""
    changes = []
    inputs = {i.name: i for i in model.graph.input}
    initialized = {t.name for t in model.graph.initializer}
    for name, value in values.items():
        declared = inputs.get(name)
        if declared is None or name in initialized:
            names = ", ".join(repr(i) for i in inputs if i not in initialized)
            raise TrtBridgeError(f"{path}: --constant-inputs names '{name}', which is not an input of the model; its "
                                 f"inputs are {names}.")
        kind = declared.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim]
        if None in dims or int(np.prod(dims, dtype=np.int64)) != 1:
            raise TrtBridgeError(f"{path}: --constant-inputs {name}={value:g}: input '{name}' has shape "
                                 f"{dims if kind.HasField('shape') else 'unknown'}; only an input of one element (a "
                                 "scalar or [1]) can be held as a constant.")
        dtype = helper.tensor_dtype_to_np_dtype(kind.elem_type)
        held = np.array(value).astype(dtype)
        if float(held) != value:
            raise TrtBridgeError(f"{path}: --constant-inputs {name}={value:g}: input '{name}' is {dtype.name}, which "
                                 f"holds {float(held):g} instead; give a value of its type.")
        model.graph.input.remove(declared)
        model.graph.initializer.append(numpy_helper.from_array(held.reshape(dims), name))
        changes.append(Change(NAME, "", f"input '{name}' held as the constant {float(held):g} ({dtype.name}): the "
                                        "output serves that value only, and takes no such input"))
    return changes
