"""Per-layer localization: which quantized layer costs the accuracy.

The reference and the candidate share their float tensor names (``convert`` keeps them; lifting
names only the tensors it adds), so every tensor both compute is aligned by name. A quantized
reference (the model the candidate was converted from) is lifted first, exactly as ``convert``
lifts it: its float form has the candidate's names, and each layer is then measured against the
float computation the source stands for. Both models run
on the same feeds with those tensors exposed as outputs in bounded batches (``batch`` tensors per
session, never all at once: exposing every tensor defeats fusions and memory planning), and each
tensor's SNR against its reference value is accumulated feed by feed.

A quantized layer is a node of the candidate that reads a DequantizeLinear output. Its input SNR is
that of the activations it quantizes (their float values before the QuantizeLinear, traced back
through re-centring to the tensor both models have), its output SNR that of what it computes. The
error it adds is the difference of the two noise-to-signal ratios, expressed as an SNR:
``added = −10·log10(1/snr_out − 1/snr_in)`` (linear ratios): a layer whose input is exact adds
all of its output's error, and a layer given a bad scale adds far more than its neighbours.

The added error credits a layer downstream that amplifies an error it inherits (a head convolution after
a broken ``Concat`` scale "adds" a lot of error it did not make). So each layer is also measured on its
own (:func:`isolated_errors`: its output against a copy of it that reads its activations before their
Q/DQ), and layers are ranked by that isolated SNR first, lowest (worst) first, then by the added one: the
quantization point that is broken is named first. Both are reported.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.calibrate.session import CalibrationSession
from trt_bridge.ir.model import read_model, validate_model
from trt_bridge.ir.types import FLOAT_TYPES, elem_types, infer_shapes, value_types
from trt_bridge.lift.pipeline import lift_model
from trt_bridge.runtime.bf16 import emulate_bfloat16
from trt_bridge.verification.metrics import SnrAccumulator

#: an SNR above this counts as exact in differences (identical tensors have an infinite SNR)
EXACT_DB = 200.0
#: layers whose added error is within this of the worst layer's are named to keep in higher precision
SUGGEST_WITHIN_DB = 3.0


@dataclass(frozen=True)
class TensorSnr:
    tensor: str
    producer: str  # the candidate node that computes it
    op: str
    index: int  # position of the producer along the candidate graph (topological order)
    snr_db: float | None  # None: identical


@dataclass(frozen=True)
class LayerError:
    node: str
    op: str
    index: int
    output: str  # the tensor its SNR is measured on (its own output, or the first one both models have)
    output_index: int  # position of that tensor's producer (where the plot puts the layer)
    inputs: tuple[str, ...]  # the float activations it quantizes
    snr_in_db: float | None  # worst SNR of those activations (None: identical)
    snr_out_db: float | None
    drop_db: float | None  # snr_in − snr_out (None when the input is exact)
    added_db: float | None  # the SNR of the error this layer adds (None: it adds none)
    isolated_db: float | None = None  # the SNR of the error it makes on its own (None: none; see isolated_errors)


@dataclass
class Localization:
    tensors: list[TensorSnr]
    layers: list[LayerError]  # ranked: the largest error made on its own first, then the largest added
    suggestion: list[str]  # node names to keep in higher precision: the layers making the most error
    batches: int
    feeds: int
    reference_lifted: bool = False  # the reference was quantized: layers are measured against its lifted form

    def exclude_nodes(self) -> str | None:
        """The ``convert --exclude-nodes`` regex that keeps the suggested nodes in higher precision."""
        if not self.suggestion:
            return None
        return "^(" + "|".join(re.escape(n) for n in self.suggestion) + ")$"


def quantized_layers(model: onnx.ModelProto) -> list[tuple[int, onnx.NodeProto, tuple[str, ...]]]:
    """(index, node, float activations it quantizes) for every node reading a DequantizeLinear output."""
    producer = {out: node for node in model.graph.node for out in node.output}
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        activations, reads_dq = [], False
        for name in node.input:
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            reads_dq = True
            q = producer.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                activations.append(q.input[0])
        if reads_dq:
            found.append((index, node, tuple(activations)))
    return found


def localize(reference: str | Path, candidate: str | Path, feeds: list[dict[str, np.ndarray]], batch: int = 64,
             top: int = 3, progress: bool = True) -> Localization:
    """Align, run in batches of ``batch`` exposed tensors, rank the quantized layers of ``candidate``."""
    ref_model, lifted = float_reference(reference)
    cand_model = read_model(candidate)

    for model in (ref_model, cand_model):  # exposed tensors need types (models often carry no value_info)
        if not model.graph.value_info:
            infer_shapes(model)
    ref_tensors = {o for n in ref_model.graph.node for o in n.output} | {i.name for i in ref_model.graph.input}
    ref_types, cand_types = elem_types(ref_model), elem_types(cand_model)
    layers_of = quantized_layers(cand_model)
    order: list[tuple[str, onnx.NodeProto, int]] = []
    for index, node in enumerate(cand_model.graph.node):
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        order.extend((out, node, index) for out in node.output if out and out in ref_tensors
                     and _float_typed(out, ref_types) and _float_typed(out, cand_types))
    inputs_needed = {a for _, _, acts in layers_of for a in acts if a in ref_tensors}
    graph_inputs = {i.name for i in cand_model.graph.input}
    names = [name for name, _, _ in order] + sorted(inputs_needed & graph_inputs)
    accumulators = {name: SnrAccumulator() for name in names}
    batches = [names[i:i + batch] for i in range(0, len(names), batch)]

    run_cand = emulate_bfloat16(cand_model) or cand_model  # once, not per batch (the sessions find none left)

    for chunk in _progress(batches, progress):
        fetch = [n for n in chunk if n not in graph_inputs]
        with CalibrationSession(ref_model, fetch, True, f"{reference} with its tensors exposed") as ref, \
                CalibrationSession(run_cand, fetch, True, f"{candidate} with its tensors exposed") as cand:
            for (feed, ref_out), (_, cand_out) in zip(ref.outputs(fetch, feeds), cand.outputs(fetch, feeds)):
                for name, r, c in zip(fetch, ref_out, cand_out):
                    if np.asarray(r).dtype.kind == "f" and np.shape(r) == np.shape(c):
                        accumulators[name].add(r, c)
                for name in chunk:
                    if name in graph_inputs:
                        accumulators[name].add(feed[name], feed[name])
    # None: exact; a NaN tensor counts as the worst possible (-inf)
    snr = {name: _exact_or_worst(acc.snr_db()) for name, acc in accumulators.items() if acc.count}
    isolated = isolated_errors(cand_model, feeds, batch)
    tensors = [TensorSnr(name, node.name, node.op_type, index, snr[name]) for name, node, index in order
               if name in snr]
    layers = []
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in cand_model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = {i.name for i in cand_model.graph.initializer}
    producers = {o: n for n in cand_model.graph.node for o in n.output}
    position = {name: index for name, _, index in order}
    for index, node, activations in layers_of:
        out = _aligned_output(node.output[0], snr, consumers, constants)
        if out is None:
            continue
        sources = [_aligned_input(a, snr, producers, constants) for a in activations]
        measured = [snr[a] for a in sources if a is not None]
        snr_in = None if all(v is None for v in measured) else min(v for v in measured if v is not None)
        snr_out = snr[out]
        drop = None if snr_in is None or snr_out is None else snr_in - snr_out
        layers.append(LayerError(node.name, node.op_type, index, out, position.get(out, index),
                                 tuple(a for a in sources if a), snr_in, snr_out, drop, _added(snr_in, snr_out),
                                 isolated.get(node.name)))
    layers.sort(key=_rank)
    # the worst layer, and those within SUGGEST_WITHIN_DB of it: the ones that cost the accuracy
    worst = _rank(layers[0])[:2] if layers else None
    suggestion = [layer.node for layer in layers[:top]
                  if _rank(layer)[0] == worst[0] and _rank(layer)[1] <= worst[1] + SUGGEST_WITHIN_DB]
    return Localization(tensors, layers, suggestion, len(batches), len(feeds), lifted)


def _rank(layer: LayerError) -> tuple:
    """The sort key: the layers measured on their own first, worst isolated SNR first; then by added error
    (a layer without an isolated measure, e.g. no activation of its own, ranks after them)."""
    if layer.isolated_db is not None:
        return (0, layer.isolated_db, math.inf if layer.added_db is None else layer.added_db, layer.index)
    return (1, math.inf if layer.added_db is None else layer.added_db, math.inf, layer.index)


def _float_typed(name: str, types: dict[str, int]) -> bool:
    """Only float tensors of known type are exposed (onnxruntime needs each output's type)."""

    return types.get(name) in FLOAT_TYPES


def _exact_or_worst(value: float) -> float | None:
    if value == math.inf:
        return None
    return -math.inf if math.isnan(value) else value


def float_reference(path: str | Path) -> tuple[onnx.ModelProto, bool]:
    """The per-layer reference: a float model as it is; a quantized one (the source of a conversion) in its
    lifted float form, which computes what the source means with the source's weights and carries the
    tensor names convert gave the candidate (a QOperator model's own tensors are uint8 codes)."""
    model = read_model(path)
    quantized = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}
    if not any(n.op_type in quantized or n.op_type.startswith("QLinear") or (n.domain or "") not in ("", "ai.onnx")
               for n in model.graph.node):
        return model, False

    declared: dict[str, int] = {}
    lifted, _ = lift_model(validate_model(model, path, declared=declared), path, declared=declared)
    return lifted, True


def _added(snr_in: float | None, snr_out: float | None) -> float | None:
    """The SNR of the error a layer adds: its output's noise-to-signal ratio less its input's."""
    if snr_out is None:
        return None
    ratio_out = 10.0 ** (-snr_out / 10.0)
    ratio_in = 0.0 if snr_in is None else 10.0 ** (-snr_in / 10.0)
    added = ratio_out - ratio_in
    if snr_in is None:
        return snr_out
    return None if added <= 0 else -10.0 * math.log10(added)


def _aligned_input(name: str, aligned: dict, producers: dict, constants: set[str], steps: int = 3) -> str | None:
    """The tensor both models have that a quantized activation comes from: re-centring puts a
    Sub (and a Pad) with constants between it and the QuantizeLinear, ``--high-precision`` a Cast."""
    for _ in range(steps + 1):
        if name in aligned:
            return name
        node = producers.get(name)
        if node is None or node.op_type not in ("Add", "Sub", "Mul", "Div", "Pad", "Cast"):
            return None
        variables = [i for i in node.input if i and i not in constants]
        if len(variables) != 1:
            return None
        name = variables[0]
    return None


def _aligned_output(name: str, aligned: dict, consumers: dict, constants: set[str], steps: int = 3) -> str | None:
    """The first tensor from ``name`` on that both models compute: a lifted layer's own output can be a new
    tensor (a dynamic conv's, before its bias Add), so follow single readers that apply a constant."""
    for _ in range(steps + 1):
        if name in aligned:
            return name
        readers = consumers.get(name, [])
        if len(readers) != 1 or readers[0].op_type not in ("Add", "Sub", "Mul", "Div", "Reshape", "Transpose", "Cast") \
                or not all(i == name or i in constants for i in readers[0].input):
            return None
        name = readers[0].output[0]
    return None


def _progress(batches, enabled: bool):
    if not enabled or len(batches) < 2:
        return batches
    try:
        from tqdm import tqdm
    except ImportError:
        return batches
    return tqdm(batches, desc="per-layer", unit="batch", leave=False, disable=None)


@dataclass(frozen=True)
class Isolated:
    """What each quantized layer does on its own (:func:`isolated`)."""

    snr: dict[str, float | None]  # layer → SNR of its own error (None: none; -inf: NaN)
    shifts: dict[str, np.ndarray]  # layer (of the ops asked for) → its error's mean per output channel, per feed


def isolated(candidate: str | Path | onnx.ModelProto, feeds: list[dict[str, np.ndarray]], batch: int = 64,
             shift_ops: tuple[str, ...] = ()) -> Isolated:
    """The error each quantized layer of ``candidate`` makes on its own: its output against a copy of it that
    reads its activations before their Q/DQ (same weights), on the candidate's own tensors. Unlike the added
    error of :func:`localize`, this does not depend on how the layer treats the error it inherits (a layer whose
    output is cleaner than its input still quantizes). Its SNR for every layer; for the layers of ``shift_ops``
    (output channels on axis 1) also the error's mean per channel, one row per feed ([feeds, channels], float64;
    a feed whose mean is not finite gives no row). One onnxruntime session per ``batch // 2`` layers, each with
    its copies added."""
    accumulators: dict[str, SnrAccumulator] = {}
    rows: dict[str, list[np.ndarray]] = {}
    for node, quantized, plain in _with_unquantized_copies(candidate, feeds, batch):
        accumulators.setdefault(node.name, SnrAccumulator()).add(plain, quantized)
        if node.op_type in shift_ops and quantized.ndim >= 2 and quantized.shape == plain.shape:
            error = np.asarray(quantized, np.float64) - np.asarray(plain, np.float64)
            mean = error.mean(axis=tuple(i for i in range(error.ndim) if i != 1))
            if np.isfinite(mean).all():
                rows.setdefault(node.name, []).append(mean)
    return Isolated({name: _exact_or_worst(acc.snr_db()) for name, acc in accumulators.items()},
                    {name: np.stack(found) for name, found in rows.items()})


def isolated_errors(candidate: str | Path | onnx.ModelProto, feeds: list[dict[str, np.ndarray]], batch: int = 64
                    ) -> dict[str, float | None]:
    """The SNR of the error each quantized layer of ``candidate`` makes on its own (:func:`isolated`)."""
    return isolated(candidate, feeds, batch).snr


def _with_unquantized_copies(candidate: str | Path | onnx.ModelProto, feeds: list[dict[str, np.ndarray]],
                             batch: int):
    """``(node, quantized output, unquantized copy's output)`` per quantized layer and feed:
    the candidate with a copy of each layer that reads the activations before their Q/DQ, ``batch // 2`` layers'
    copies to one onnxruntime session."""
    model = candidate if isinstance(candidate, onnx.ModelProto) else read_model(candidate)
    types = {n: t.tensor_type.elem_type for n, t in value_types(model).items()}
    producer = {o: n for n in model.graph.node for o in n.output}
    layers = [(node, acts) for _, node, acts in quantized_layers(model) if acts and node.output]
    step = max(1, batch // 2)
    for start in range(0, len(layers), step):
        chunk = layers[start:start + step]
        work = onnx.ModelProto()
        work.CopyFrom(model)
        fetch, casts = [], set()
        for node, _ in chunk:
            inputs = []
            for name in node.input:
                dq = producer.get(name)
                q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
                if q is None or q.op_type != "QuantizeLinear":
                    inputs.append(name)
                    continue
                source = q.input[0]
                if types.get(source) != types.get(name) and types.get(name):  # a float32 layer of a bf16 graph
                    if f"{source}__as_{name}" not in casts:  # one Cast per tensor, however many layers read it
                        casts.add(f"{source}__as_{name}")
                        work.graph.node.append(onnx.helper.make_node("Cast", [source], [f"{source}__as_{name}"],
                                                                     name=f"{source}__as_{name}", to=types[name]))
                    source = f"{source}__as_{name}"
                inputs.append(source)
            copy = onnx.helper.make_node(node.op_type, inputs, [f"{o}__unquantized" for o in node.output],
                                         name=f"{node.name}__unquantized", domain=node.domain)
            copy.attribute.extend(node.attribute)
            work.graph.node.append(copy)
            for out in node.output:  # exposed outputs need their type (a float16 model's are float16)
                if types.get(out):
                    work.graph.value_info.append(onnx.helper.make_tensor_value_info(f"{out}__unquantized",
                                                                                    types[out], None))
            fetch += [node.output[0], f"{node.output[0]}__unquantized"]
        with CalibrationSession(work, fetch, True, "the candidate with unquantized layer copies") as session:
            for _, values in session.outputs(fetch, feeds):
                for (node, _), quantized, plain in zip(chunk, values[0::2], values[1::2]):
                    yield node, quantized, plain
