"""Dropout: the identity at inference, whatever mode the exporter left it in.

Before:                                                     After:
  x ─ Conv ─ c ─ Dropout(ratio, training_mode=1) ─ d ─ Relu   x ─ Conv ─ c ─ Relu
                      └─ mask ─ Cast ─ ...                   true[shape] ─ Cast ─ ...

Any opset: ``training_mode`` input (12+), ``ratio`` attribute (7-11), ``is_test``
attribute (1-6). A used mask becomes an all-true constant (ones of the data type
before opset 10) when its shape is static; otherwise the Dropout stays and a warning
names it. A Dropout writing a graph output is bypassed like an Identity (the output
keeps its name); where that cannot be done it becomes an Identity.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_graphsurgeon as gs

from trt_bridge.ir.names import NameAllocator
from trt_bridge.prepare.change import Change
from trt_bridge.prepare.identity import bypass, is_graph_output, output_note

log = logging.getLogger("trt_bridge.prepare")

EVAL_HINT = "export the model in eval mode (model.eval()) or with static shapes"


def _scalar(values) -> str:
    flat = np.asarray(values).reshape(-1)
    if flat.size != 1:
        return f"<{flat.size} values>"
    if flat.dtype.kind in "biu":
        return str(int(flat[0]))
    return f"{float(flat[0]):g}"


def _constant_values(tensor: gs.Tensor) -> np.ndarray | None:
    """The values of an initializer or of a Constant node's output (sanitizing runs before folding).
    None for types numpy lacks (bfloat16): reading those would convert the constant for good."""
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is not None and producer.op == "Constant" and isinstance(producer.attrs.get("value"), gs.Constant):
        tensor = producer.attrs["value"]
    if not isinstance(tensor, gs.Constant) or isinstance(tensor.dtype, int):
        return None
    return tensor.values


def mode(node: gs.Node) -> str:
    """' (ratio=0.1, training_mode=1)': what the node says about its mode, as written in the model."""
    parts = [f"{attr}={_scalar(node.attrs[attr])}" for attr in ("ratio", "is_test") if attr in node.attrs]
    for i, label in ((1, "ratio"), (2, "training_mode")):
        if len(node.inputs) > i and node.inputs[i].name:
            tensor = node.inputs[i]
            values = _constant_values(tensor)
            parts.append(f"{label}={_scalar(values)}" if values is not None else f"{label} from '{tensor.name}'")
    return f" ({', '.join(parts)})" if parts else ""


def _static(shape) -> tuple[int, ...] | None:
    if shape is None or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def all_true_mask(graph: gs.Graph, data: gs.Tensor, mask: gs.Tensor) -> np.ndarray | str:
    """The mask of a Dropout at inference (all true; ones of the data type before opset 10),
    or why it cannot be written as a constant."""
    if is_graph_output(graph, mask):
        return f"its mask '{mask.name}' is a graph output; {EVAL_HINT}"
    shape = _static(mask.shape) or _static(data.shape)
    if shape is None:
        return f"its mask '{mask.name}' is read and its shape {mask.shape or data.shape} is not static; {EVAL_HINT}"
    dtype = mask.dtype if mask.dtype is not None else (np.bool_ if graph.opset >= 10 else data.dtype)
    try:
        return np.ones(shape, dtype=np.dtype(dtype))
    except TypeError:
        return f"the type of its mask '{mask.name}' ({dtype}) has no numpy equivalent"


class RemoveDropout:
    name = "remove-dropout"

    def apply(self, graph: gs.Graph) -> list[Change]:
        changes = []
        names = None
        for node in [n for n in graph.nodes if n.op == "Dropout" and (n.domain or "") in ("", "ai.onnx")]:
            data, output, desc, note = node.inputs[0], node.outputs[0], mode(node), ""
            mask = node.outputs[1] if len(node.outputs) > 1 else None
            if mask is not None and (mask.outputs or is_graph_output(graph, mask)):
                ones = all_true_mask(graph, data, mask)
                if isinstance(ones, str):
                    log.warning("kept Dropout '%s': %s", node.name, ones)
                    continue
                names = names or NameAllocator(graph)
                bypass(graph, gs.Constant(names(f"{node.name}_mask"), ones), mask)
                note = f"; its mask is a constant all-true {ones.dtype}{list(ones.shape)}"
            at_output = is_graph_output(graph, output)
            reason = bypass(graph, data, output)
            if reason is None:
                what = f"removed Dropout{desc}: inference ignores it{note}{output_note(at_output, data)}"
            else:
                node.op = "Identity"
                node.attrs.clear()
                while len(node.inputs) > 1:
                    node.inputs.pop()
                while len(node.outputs) > 1:
                    node.outputs.pop()
                what = f"replaced Dropout{desc} with Identity: inference ignores it{note}; a node stays as {reason}"
            changes.append(Change(self.name, node.name, what))
        return changes
