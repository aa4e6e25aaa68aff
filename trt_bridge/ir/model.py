"""Loading ONNX models (with their external data) and validating them: checker, shape inference, node order,
load-time repairs, per-axis Q/DQ below opset 13. Saving is :mod:`trt_bridge.ir.save`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx

from trt_bridge.errors import ModelLoadError
from trt_bridge.ir.deferred import defer_external_data
from trt_bridge.ir.files import check_external_data, check_name_lengths
from trt_bridge.ir.names import name_nodes, node_label
from trt_bridge.ir.repair import (
    block_scale_axis,
    dedupe_initializers,
    drop_io_value_info,
    import_used_domains,
    per_axis_scale_lengths,
    single_value_field,
)
from trt_bridge.ir.types import declared_types, infer_shapes, skeleton

log = logging.getLogger("trt_bridge.ir.model")


MIN_QDQ_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear need `axis`


def load_model(path: str | os.PathLike, declared: dict[str, int] | None = None,
               repairs: list[str] | None = None, defer: bool = False) -> onnx.ModelProto:
    """Load ``path`` with its external data, checked and with inferred shapes (:func:`validate_model`);
    raise ModelLoadError with the fix on failure. ``repairs`` receives a line per load-time repair
    (``trt_bridge.ir.repair``). ``defer``: a model with large external data keeps its big weights in their file
    until they are read (:mod:`trt_bridge.ir.deferred`)."""
    path = Path(path)
    check_name_lengths(path, "model")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model file. Give the .onnx file inside it.")
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file. Check the path to the ONNX model.")
    model = read_model(path, defer=defer)
    if not model.graph.node:
        raise ModelLoadError(f"{path}: the graph has no nodes; nothing to convert.")
    if not model.graph.output:
        raise ModelLoadError(f"{path}: the graph has no outputs, so it computes nothing; fix the exporter (a model "
                             "needs at least one graph output).")
    _check_input_dims(model, path)
    _check_dense(model, path)
    return validate_model(model, path, declared=declared, repairs=repairs)


def read_model(path: str | os.PathLike, external_data: bool = True, defer: bool = False) -> onnx.ModelProto:
    """The ONNX file ``path`` as it is (no checker, no repairs), with its external data where ``external_data``;
    that data checked first (:func:`~trt_bridge.ir.files.check_external_data`: inside the model's folder, no links,
    regular files, large enough) whether it is read or not. The one way trt-bridge reads a model file."""
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, others raise OSError
        raise ModelLoadError(
            f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc}). "
            "Re-export the model, or check that the file is complete."
        ) from exc
    check_external_data(model, path)  # outside the folder, links, pipes, devices, truncated: before reading
    if external_data:
        try:
            if defer:
                defer_external_data(model, path.parent)
            else:
                onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot read its external data ({exc}).") from exc
    return model


def _check_input_dims(model: onnx.ModelProto, path) -> None:
    """A graph input is a tensor of known rank (TensorRT and calibration need it) whose dimensions are positive
    sizes, names or unknown: a sequence, map or optional input, a missing shape and a negative size are refused."""
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            what = (kind or "value of no type").replace("_type", "")
            raise ModelLoadError(f"{path}: input '{value.name}' is a {what}, not a tensor; TensorRT and trt-bridge "
                                 "take tensor inputs only. Re-export the model "
                                 "with tensor inputs (e.g. stack a sequence into one tensor).")
        if not value.type.tensor_type.HasField("shape"):
            raise ModelLoadError(f"{path}: input '{value.name}' declares no shape, not even its rank; TensorRT and "
                                 "calibration need each input's rank. Re-export the model with the input's shape "
                                 "(dynamic dimensions may be names, e.g. ['batch', 3, 224, 224]).")
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                raise ModelLoadError(f"{path}: input '{value.name}' declares dimension {dim.dim_value} at axis {axis}; "
                                     "a dimension is a positive size or a name (dynamic). Fix the exporter's "
                                     "input shape.")


def _check_dense(model: onnx.ModelProto, path) -> None:
    """Sparse initializers (``graph.sparse_initializer``) are refused: neither trt-bridge's passes nor TensorRT's
    parser read them."""
    sparse = model.graph.sparse_initializer
    if sparse:
        name = sparse[0].values.name or "(unnamed)"
        raise ModelLoadError(f"{path}: the graph holds {len(sparse)} sparse initializer(s) (e.g. '{name}'), which "
                             "TensorRT's parser does not read; store them as dense initializers (e.g. "
                             "onnx.numpy_helper.from_array of the densified values) and convert that model.")


def constant_protos(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The main graph's constants by name: initializers and the values of ``Constant`` nodes, as the
    TensorProtos the model holds (nothing is converted or copied)."""
    protos = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    protos[node.output[0]] = attr.t
    return protos


def validate_model(model: onnx.ModelProto, path: str | os.PathLike, strict: bool = False,
                   declared: dict[str, int] | None = None, repairs: list[str] | None = None) -> onnx.ModelProto:
    """Run ``onnx.checker`` and shape inference on ``model`` (in place); raise ModelLoadError.

    A graph that refers to tensors nobody produces, nodes out of order or attributes
    of the wrong type surface here, named by onnx, instead of as a stack trace from deep
    inside the conversion. Inputs whose types contradict their op are left to the type pass
    (``prepare.types``); ``declared`` receives the exporter's own ``value_info`` types first,
    because inference then replaces them with its guesses.
    """
    drop_io_value_info(model, path)  # an input's or output's type is its own, not a value_info's
    if declared is not None:  # the exporter's own types, before inference fills in (and guesses) the rest
        declared.update(declared_types(model.graph.value_info))
    model = _upgrade_per_axis_qdq(model, path)
    sort_nodes(model, path)
    claim_ort_contrib_ops(model, path)  # onnxruntime's contrib ops written in the ONNX domain
    dedupe_initializers(model, path, repairs)  # what onnxruntime runs and onnx rejects, read as onnxruntime does
    single_value_field(model, path, repairs)
    per_axis_scale_lengths(model, path, repairs)
    block_scale_axis(model, path, repairs)
    import_used_domains(model, path, repairs)
    name_nodes(model)  # every message from here on names a node, an unnamed one as its op type and index
    weightless = skeleton(model)
    try:
        _check_ignoring_missing_io_shapes(weightless)
    except onnx.checker.ValidationError as exc:
        raise ModelLoadError(f"{path}: not a valid ONNX model: {_first_lines(exc)}. Fix the exporter's "
                             "output (onnx.checker.check_model reports the same).") from exc
    try:
        return infer_shapes(model, strict=strict)
    except Exception as exc:  # onnx raises InferenceError / TypeError-like errors from C++
        raise ModelLoadError(f"{path}: ONNX shape inference fails: {_first_lines(exc)}. The model's declared "
                             "types or shapes contradict its ops; fix them in the exporter.") from exc


#: onnxruntime's contrib kernels registered under the ONNX domain, which its transformer optimizer writes there:
#: SimplifiedLayerNormalization (RMS norm; T5, LLaMA-style models) at any opset, LayerNormalization below
#: opset 17 (before ONNX had one). onnx.checker rejects them ("No Op registered ... with domain_version").
_ORT_ONNX_DOMAIN_OPS = {"SimplifiedLayerNormalization": 10 ** 9, "LayerNormalization": 17}


def claim_ort_contrib_ops(model: onnx.ModelProto, path="model") -> list[str]:
    """Move onnxruntime's contrib ops that sit in the ONNX domain to com.microsoft (in place), where
    ``prepare.ort_fused`` writes them back as standard ONNX; returns the nodes moved."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    moved = [n for n in model.graph.node if n.domain in ("", "ai.onnx")
             and opset < _ORT_ONNX_DOMAIN_OPS.get(n.op_type, 0)]
    for node in moved:
        node.domain = "com.microsoft"
    if moved and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    if moved:
        log.warning("%s: %d onnxruntime contrib op(s) in the ONNX domain (%s, opset %d) are read as "
                    "com.microsoft ops and written back as standard ONNX", path, len(moved),
                    ", ".join(sorted({n.op_type for n in moved})), opset)
    return [n.name for n in moved]


def sort_nodes(model: onnx.ModelProto, path="model") -> bool:
    """Put the main graph's nodes, and then each control-flow body's, in topological order (in place), as onnx
    requires and onnxruntime does not: AMD Quark, for one, writes graphs out of order. A node with a body waits for
    the outer names its body reads. Stable: nodes already in order keep it.
    Returns whether anything moved; a cycle is left for onnx.checker to name, a tensor no one produces is
    refused here with the node that reads it (in the main graph)."""
    graph = model.graph
    done = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    known = done | set(producer) | {i.values.name for i in graph.sparse_initializer}
    orphan = next(((n, x, i) for i, n in enumerate(graph.node) for x in n.input if x not in known), None)
    if orphan is not None:  # no order can fix it (Intel Neural Compressor's QOperator EfficientNet)
        reader, name, index = orphan
        raise ModelLoadError(f"{path}: node '{node_label(reader, index)}' ({reader.op_type}) reads '{name}', which no "
                             "node, initializer or graph input produces, so onnxruntime refuses the model too: the "
                             "tool that wrote it lost that tensor. Re-export or re-quantize the model.")
    moved = _sort_graph(graph, done, producer)
    if moved:
        log.warning("%s: the graph's nodes were not in topological order (onnx requires it); sorted them", path)
    bodies = _sort_bodies(graph)
    if bodies:
        log.warning("%s: the nodes of %d control-flow body(ies) (e.g. '%s') were not in topological order (onnx "
                    "requires it, onnxruntime sorts them itself); sorted them", path, len(bodies), bodies[0])
    return moved or bool(bodies)


def _sort_bodies(graph: onnx.GraphProto) -> list[str]:
    """Sort every control-flow body under ``graph`` (in place; a name a body does not define comes from outside it,
    so it waits for nothing); returns the names of the nodes whose body moved."""
    moved = []
    for node in graph.node:
        for attr in node.attribute:
            for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                done = {i.name for i in (*body.input, *body.initializer)} | {""}
                if _sort_graph(body, done, {o: i for i, n in enumerate(body.node) for o in n.output if o}):
                    moved.append(f"{node.name or node.op_type} {attr.name}")
                moved += _sort_bodies(body)
    return moved


def _sort_graph(graph: onnx.GraphProto, done: set[str], producer: dict[str, int]) -> bool:
    """Kahn's algorithm on ``graph``'s nodes (``producer``: tensor → index of its node; ``done``: names available
    from the start), the smallest original index first: stable. Whether anything moved (a cycle moves nothing)."""
    import heapq

    needs = [{producer[x] for x in (*n.input, *_outer_names(n)) if x in producer and x not in done}
             for n in graph.node]
    if all(max(deps, default=-1) < i for i, deps in enumerate(needs)):
        return False  # already in order (the usual case: one pass)
    readers: dict[int, list[int]] = {}
    for i, deps in enumerate(needs):
        for d in deps:
            readers.setdefault(d, []).append(i)
    missing = [len(deps - {i}) if i not in deps else -1 for i, deps in enumerate(needs)]
    heap = [i for i, m in enumerate(missing) if m == 0]
    order = []
    while heap:  # Kahn's algorithm, the smallest original index first: stable
        i = heapq.heappop(heap)
        order.append(i)
        for r in readers.get(i, ()):
            missing[r] -= 1
            if missing[r] == 0:
                heapq.heappush(heap, r)
    if len(order) != len(graph.node):
        return False  # a cycle: the checker names it
    nodes = [graph.node[i] for i in order]
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    return True


def _outer_names(node: onnx.NodeProto) -> list[str]:
    """Names a node's subgraphs read from outside themselves (from the outer graph, or further out): what the
    subgraph's own nodes, inputs and initializers define is left out, so a name a body defines for itself never
    makes the node wait for an outer node of the same name."""
    names = []
    for attr in node.attribute:
        for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            local = {o for n in g.node for o in n.output} | {i.name for i in (*g.input, *g.initializer)}
            for inner in g.node:
                names.extend(x for x in (*inner.input, *_outer_names(inner)) if x not in local)
            names.extend(o.name for o in g.output if o.name not in local)  # a body may return an outer tensor
    return names


def _upgrade_per_axis_qdq(model: onnx.ModelProto, path) -> onnx.ModelProto:
    """onnxruntime's quantize_static writes per-channel Q/DQ (``axis``, opset 13) into models of
    older opsets, which onnx rejects but onnxruntime runs. Convert such a model to opset 13, as
    the quantizer meant: the Q/DQ nodes without their ``axis`` through the version converter,
    then the attribute back."""
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), MIN_QDQ_OPSET)
    if opset >= MIN_QDQ_OPSET:
        return model
    axes = {}  # keyed by the node's output: the converter may add nodes, never renames outputs
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "axis":
                    axes[node.output[0]] = onnx.AttributeProto()
                    axes[node.output[0]].CopyFrom(attr)
            kept = [a for a in node.attribute if a.name != "axis"]
            del node.attribute[:]
            node.attribute.extend(kept)
    if not axes:
        return model
    log.warning("%s: opset %d with per-channel QuantizeLinear/DequantizeLinear (axis needs opset %d): "
                "converting the model to opset %d", path, opset, MIN_QDQ_OPSET, MIN_QDQ_OPSET)
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, MIN_QDQ_OPSET)
    except Exception as exc:
        raise ModelLoadError(f"{path}: per-channel QuantizeLinear/DequantizeLinear (axis) in an opset-{opset} "
                             f"model, and converting it to opset {MIN_QDQ_OPSET} failed ({_first_lines(exc)}). "
                             f"Re-export or re-quantize the model at opset {MIN_QDQ_OPSET} or newer.") from exc
    for node in converted.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.output[0] in axes:
            node.attribute.append(axes.pop(node.output[0]))
    if axes:
        raise ModelLoadError(f"{path}: per-channel Q/DQ in an opset-{opset} model; converting it to opset "
                             f"{MIN_QDQ_OPSET} lost {len(axes)} of them. Re-quantize at opset {MIN_QDQ_OPSET}.")
    return converted


def _check_ignoring_missing_io_shapes(skeleton: onnx.ModelProto) -> None:
    """``onnx.checker.check_model``, except for a graph input or output declared without a shape.

    The checker requires the field; onnxruntime and TensorRT accept its absence (unknown rank),
    and shape inference fills in outputs, so a model that lacks it is not invalid for us.
    """
    missing = [v for v in (*skeleton.graph.input, *skeleton.graph.output)
               if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    if not missing:
        onnx.checker.check_model(skeleton)
        return
    stripped = onnx.ModelProto()
    stripped.CopyFrom(skeleton)
    names = {v.name for v in missing}
    for field in (stripped.graph.input, stripped.graph.output):
        for v in field:
            if v.name in names:
                v.type.tensor_type.shape.dim.add().dim_param = "_unknown_rank_"  # rank is not checked here
    onnx.checker.check_model(stripped)


def _first_lines(exc: Exception, limit: int = 3) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return " ".join(lines[:limit]).rstrip(".")


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise ModelLoadError("the model imports no default ONNX opset; it is not a valid ONNX model.")


