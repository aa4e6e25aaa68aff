"""Import ModelOpt quantizer ranges (``_amax`` buffers) from a PyTorch state dict.

ModelOpt (NVIDIA TensorRT Model Optimizer) keeps each quantizer's range in a buffer named
``<module path>.<quantizer>._amax``: ``encoder.layer.0.attention.self.query.input_quantizer._amax``
(0-d: per tensor) and ``...query.weight_quantizer._amax`` (per output channel: shape [out, 1]
for a Linear's [out, in] weight, [K, 1, 1, 1] for a Conv's; or 0-d). Exporters put the module
path into node names: ``/encoder/layer.0/attention/self/query/MatMul``. So a module path is
matched to the weighted nodes (Conv, ConvTranspose, MatMul, Gemm) whose name, split at ``/``
and ``.``, is the module's path plus one last component (the op), or is the path itself:

* exactly, else by suffix (the checkpoint or the ONNX names carry an extra prefix, such as
  ``model.`` or ``/bert``);
* ``input_quantizer`` → the node's data input (through a Q/DQ pair to the tensor quantized),
  ``weight_quantizer`` → its constant weight, per channel along
  :func:`trt_bridge.lift.weights.weight_axis` (a Linear's [out] amax sits on a MatMul weight's last
  axis, on a transB Gemm's axis 0);
* a module matching nodes that read different tensors is *ambiguous*; keys of other quantizers
  (``output_quantizer``, ``*_bmm_quantizer``, ...), modules matching no node, and amax shapes
  that do not fit the weight are *unmatched*, with the reason; keys not ending in ``._amax``
  (weights, ``_pre_quant_scale``) are ignored;
* several keys on one tensor (q, k and v projections reading one LayerNorm output) give it
  the largest amax, so nothing clips (listed under ``shared``).

Files: ``.npz`` (``np.savez(path, **{k: v.float().numpy() for k, v in sd.items()})``),
``.safetensors`` (needs the ``safetensors`` package) or a PyTorch checkpoint (``.pt``, ``.pth``,
``.ckpt``, ``.bin``; needs torch, loaded with ``weights_only=True``; ``model_state_dict``,
``state_dict`` or ``model`` inside it are unwrapped).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.errors import MissingDependencyError, TrtBridgeError
from trt_bridge.lift.weights import weight_axis
from trt_bridge.scales.model_scales import Constants, weight_name
from trt_bridge.scales.table import ScaleEntry, ScaleTable

WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul")
#: a dynamically quantized target's integer ops, as the float op whose weight layout they share
FLOAT_OP = {"MatMulInteger": "MatMul", "ConvInteger": "Conv", "DynamicQuantizeMatMul": "MatMul"}
MAPPED = ("input_quantizer", "weight_quantizer")
_TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")


def read_modelopt_amax(path: str | os.PathLike, model: onnx.ModelProto) -> tuple[ScaleTable, dict]:
    """Read the ``_amax`` buffers in ``path`` and map them onto ``model``'s tensors.

    Returns the table (source ``"modelopt:<file name>"``) and a report
    ``{"matched": [...], "unmatched": [...], "ambiguous": [...], "shared": [...], "ignored": n}``."""
    path = Path(path)
    return amax_table(load_state_dict(path), model, f"modelopt:{path.name}")


def load_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a ``.npz``, ``.safetensors`` or PyTorch checkpoint file, as float64 numpy arrays."""
    path = Path(path)
    if not path.is_file():
        raise TrtBridgeError(f"{path}: no such file. Check the path to the ModelOpt checkpoint.")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                return {k: _floats(path, k, data[k]) for k in data.files}
        except (OSError, ValueError) as exc:
            raise TrtBridgeError(f"{path}: not a readable .npz state dict ({exc}).") from exc
    if suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError as exc:
            raise MissingDependencyError(f"{path}: reading .safetensors needs the safetensors package: "
                                         "pip install safetensors (or save the state dict with numpy.savez).") \
                from exc
        try:
            return {k: _floats(path, k, v) for k, v in load_file(str(path)).items()}
        except Exception as exc:  # safetensors raises its own SafetensorError (and TypeError for bfloat16)
            raise TrtBridgeError(f"{path}: not a readable safetensors file for numpy ({exc}); save the amax "
                                 "buffers as float32.") from exc
    if suffix in _TORCH_SUFFIXES:
        return _torch_state_dict(path)
    raise TrtBridgeError(f"{path}: unknown checkpoint type '{suffix}'; give a .npz, .safetensors or PyTorch "
                         f"({', '.join(_TORCH_SUFFIXES)}) file.")


def _torch_state_dict(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(
            f"{path}: reading a PyTorch checkpoint needs torch (pip install torch). Or save the amax buffers "
            "without it: np.savez('amax.npz', **{k: v.float().cpu().numpy() for k, v in state_dict.items() "
            "if k.endswith('_amax')}).") from exc
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors of many kinds
        raise TrtBridgeError(f"{path}: cannot load the PyTorch checkpoint with weights_only=True ({exc}).") from exc
    for key in ("model_state_dict", "state_dict", "model"):
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            state = state[key]
            break
    if not isinstance(state, Mapping):
        raise TrtBridgeError(f"{path}: holds a {type(state).__name__}, not a state dict.")
    return {k: _floats(path, k, v.detach().float().cpu().numpy()) for k, v in state.items()
            if isinstance(k, str) and hasattr(v, "detach")}


def _floats(path: Path, key: str, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu":
        raise TrtBridgeError(f"{path}: '{key}' is not a numeric tensor ({arr.dtype}).")
    return arr.astype(np.float64)


def _tokens(name: str) -> tuple[str, ...]:
    return tuple(t for t in re.split(r"[./]", name) if t)


def _suffix_match(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One path ends with the other (a prefix such as ``model`` or ``bert`` on one side only)."""
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    return bool(short) and long[len(long) - len(short):] == short


class _Graph:
    def __init__(self, model: onnx.ModelProto):
        self.constants = Constants(model)
        self.producers = {out: n for n in model.graph.node for out in n.output if out}
        self.weighted = [n for n in model.graph.node if n.op_type in WEIGHTED and len(n.input) >= 2]
        self.scopes: dict[tuple[str, ...], list[onnx.NodeProto]] = {}
        for node in self.weighted:
            toks = _tokens(node.name)
            for scope in {toks, toks[:-1]}:
                if scope:
                    self.scopes.setdefault(scope, []).append(node)

    def nodes_of(self, module: tuple[str, ...]) -> list[onnx.NodeProto]:
        exact = self.scopes.get(module)
        if exact:
            return _unique(exact)
        return _unique([n for scope, nodes in self.scopes.items() if _suffix_match(scope, module) for n in nodes])

    def activation(self, tensor: str) -> str:
        """The float tensor a data input quantizes: through DequantizeLinear ← QuantizeLinear, or the input of
        the DynamicQuantizeLinear that feeds a dynamically quantized op."""
        dq = self.producers.get(tensor)
        if dq is not None and dq.op_type == "DynamicQuantizeLinear":
            return dq.input[0]
        if dq is not None and dq.op_type == "DequantizeLinear":
            q = self.producers.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                return q.input[0]
        return tensor

    def weight(self, tensor: str) -> str | None:
        """The constant weight a weight input reads (through Q/DQ), or None."""
        if tensor in self.constants:
            return tensor
        dq = self.producers.get(tensor)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        if dq.input[0] in self.constants:
            return weight_name(dq.input[0])
        q = self.producers.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and q.input[0] in self.constants:
            return q.input[0]
        return None

    def weight_tensor(self, node: onnx.NodeProto) -> str | None:
        """The constant holding ``node``'s weight values (the int8 initializer in a converted model)."""
        t = node.input[1]
        while t not in self.constants:
            producer = self.producers.get(t)
            if producer is None or producer.op_type not in ("DequantizeLinear", "QuantizeLinear"):
                return None
            t = producer.input[0]
        return t


def _unique(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    seen, out = set(), []
    for n in nodes:
        if n.name not in seen:
            seen.add(n.name)
            out.append(n)
    return out


def amax_table(state: Mapping[str, np.ndarray], model: onnx.ModelProto, source: str = "modelopt"
               ) -> tuple[ScaleTable, dict]:
    """Map a state dict's ``*_quantizer._amax`` entries onto ``model`` (see the module doc)."""
    import onnx_graphsurgeon as gs

    graph = _Graph(model)
    report: dict = {"matched": [], "unmatched": [], "ambiguous": [], "shared": [], "ignored": 0}
    found: dict[str, list[tuple[str, str, np.ndarray, int | None]]] = {}  # tensor → (key, kind, amax, axis)
    for key in sorted(state):
        if not key.endswith("._amax"):
            report["ignored"] += 1
            continue
        parts = key[: -len("._amax")].rsplit(".", 1)
        quantizer = parts[-1]
        module = _tokens(parts[0]) if len(parts) == 2 else ()
        if quantizer not in MAPPED:
            report["unmatched"].append({"key": key, "reason": f"'{quantizer}' is not mapped to ONNX tensors "
                                        "(only input_quantizer and weight_quantizer are)"})
            continue
        nodes = graph.nodes_of(module)
        if not nodes:
            report["unmatched"].append({"key": key, "reason": f"no Conv/ConvTranspose/MatMul/Gemm node is named "
                                        f"after module '{'.'.join(module)}'"})
            continue
        amax = np.asarray(state[key], np.float64)
        if quantizer == "input_quantizer":
            tensors = _unique_values(graph.activation(n.input[0]) for n in nodes)
            kind, axis = "activation", None
        else:
            tensors = _unique_values(graph.weight(n.input[1]) for n in nodes)
            kind, axis = "weight", None
        if len(tensors) > 1:
            report["ambiguous"].append({"key": key, "candidates": [n.name for n in nodes],
                                        "tensors": [t for t in tensors if t is not None]})
            continue
        tensor = tensors[0]
        if tensor is None:
            report["unmatched"].append({"key": key, "reason": f"the weight of {nodes[0].op_type} '{nodes[0].name}' "
                                        "is not a constant"})
            continue
        if kind == "activation" and amax.size != 1:
            report["unmatched"].append({"key": key, "reason": f"{amax.size} amax values for activation '{tensor}'; "
                                        "TensorRT quantizes activations per tensor"})
            continue
        if kind == "weight" and amax.size != 1:
            stored = graph.weight_tensor(nodes[0])
            shape = graph.constants.shape(stored)
            op = FLOAT_OP.get(nodes[0].op_type, nodes[0].op_type)
            axis = weight_axis(gs.Node(op, attrs=_attrs(nodes[0])), len(shape))
            if not 0 <= axis < len(shape) or shape[axis] != amax.size:
                report["unmatched"].append({"key": key, "reason": f"{amax.size} amax values (shape "
                                            f"{list(amax.shape)}) do not fit weight '{tensor}' {list(shape)} "
                                            f"per channel on axis {axis}"})
                continue
        found.setdefault(tensor, []).append((key, kind, amax.reshape(-1) if amax.size > 1 else amax.reshape(()),
                                             axis))
        report["matched"].append({"key": key, "tensor": tensor, "kind": kind, "nodes": [n.name for n in nodes]})

    table = ScaleTable()
    for tensor, hits in found.items():
        kind, axis = hits[0][1], next((h[3] for h in hits if h[3] is not None), None)
        try:
            amax = np.maximum.reduce(np.broadcast_arrays(*[h[2] for h in hits])) if len(hits) > 1 else hits[0][2]
        except ValueError:  # per-channel amax of different lengths on one tensor
            report["ambiguous"].append({"key": hits[0][0], "candidates": [h[0] for h in hits], "tensors": [tensor]})
            continue
        if len(hits) > 1:
            report["shared"].append({"tensor": tensor, "keys": [h[0] for h in hits]})
        value = float(amax) if amax.ndim == 0 else tuple(float(v) for v in amax)
        table.add(ScaleEntry(tensor, value, axis if amax.ndim else None, kind, source))
    return table, report


def _unique_values(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "transB"}
