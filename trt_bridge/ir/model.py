"""Loading and saving ONNX models: external data, models over 2 GB, atomic writes.

Only ``onnx`` is imported here; it is light enough to load eagerly.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import onnx

from trt_bridge.errors import ModelLoadError, TrtBridgeError
from trt_bridge.ir.repair import dedupe_initializers, import_used_domains
from trt_bridge.ir.store import store_of

log = logging.getLogger("trt_bridge.ir.model")

#: Protobuf cannot serialize a message of 2 GiB or more; above this size the
#: weights go to an external-data file beside the model.
PROTOBUF_LIMIT = 2**31 - 1
#: Keep some headroom under the hard limit for the graph itself.
EXTERNAL_DATA_THRESHOLD = int(1.8 * 2**30)

MIN_QDQ_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear need `axis`


def load_model(path: str | os.PathLike, declared: dict[str, int] | None = None,
               repairs: list[str] | None = None) -> onnx.ModelProto:
    """Load ``path`` with its external data, checked and with inferred shapes (:func:`validate_model`);
    raise ModelLoadError with the fix on failure. ``repairs`` receives a line per load-time repair
    (``trt_bridge.ir.repair``)."""
    path = Path(path)
    check_name_lengths(path, "model")
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not an ONNX model file. Give the .onnx file inside it.")
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file. Check the path to the ONNX model.")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, others raise OSError
        raise ModelLoadError(
            f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc}). "
            "Re-export the model, or check that the file is complete."
        ) from exc
    _check_external_data_present(model, path)
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot read its external data ({exc}).") from exc
    if not model.graph.node:
        raise ModelLoadError(f"{path}: the graph has no nodes; nothing to convert.")
    if not model.graph.output:
        raise ModelLoadError(f"{path}: the graph has no outputs, so it computes nothing; fix the exporter (a model "
                             "needs at least one graph output).")
    _check_input_dims(model, path)
    return validate_model(model, path, declared=declared, repairs=repairs)


def _check_input_dims(model: onnx.ModelProto, path) -> None:
    """A graph input dimension must be a positive size, a name, or unknown: a negative or zero one is refused."""
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers or not value.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                raise ModelLoadError(f"{path}: input '{value.name}' declares dimension {dim.dim_value} at axis {axis}; "
                                     "a dimension is a positive size or a name (dynamic). Fix the exporter's "
                                     "input shape.")


def check_name_lengths(path: str | os.PathLike, what: str) -> None:
    """Refuse a path with a component longer than the file system takes (``NAME_MAX``, 255 bytes on most), which
    the operating system would only report as errno 36 deep inside a read or a write."""
    path = Path(path)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > 255:
            raise TrtBridgeError(f"the {what} path {str(path)[:80]}... has a file name of {size} bytes: too long "
                                 "(file systems take at most 255). Choose a shorter name.")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name the same file (through links and ``..``; a file that does not exist yet
    compares by its resolved path)."""
    try:
        if Path(a).exists() and Path(b).exists():
            return os.path.samefile(a, b)
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return os.path.abspath(a) == os.path.abspath(b)


def _external_locations(model: onnx.ModelProto) -> dict[str, list[str]]:
    """External-data file name → the tensors stored in it."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    locations: dict[str, list[str]] = {}
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            locations.setdefault(location, []).append(tensor.name)
    return locations


def external_data_files(path: str | os.PathLike) -> list[Path]:
    """The external-data files a model file refers to (read from its header only)."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    return [path.parent / loc for loc in sorted(_external_locations(model))]


def _check_external_data_present(model: onnx.ModelProto, path: Path) -> None:
    missing = {loc: names for loc, names in _external_locations(model).items()
               if not (path.parent / loc).is_file()}
    if missing:
        lines = ", ".join(
            f"'{loc}' (tensors {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            for loc, names in sorted(missing.items())
        )
        raise ModelLoadError(
            f"{path}: external data file(s) missing next to the model: {lines}. "
            f"Copy the data file(s) into {path.parent} alongside the .onnx file."
        )


def is_large(model: onnx.ModelProto) -> bool:
    """Too big for one protobuf message: weights must live in an external-data file.

    Estimated from the tensor payloads (computing ``ByteSize`` of a large model costs
    about a second each time); the threshold keeps headroom for the graph itself.
    """
    return _payload_bytes(model) > EXTERNAL_DATA_THRESHOLD


def _payload_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for tensor in model.graph.initializer:
        total += len(tensor.raw_data) if tensor.raw_data else tensor.ByteSize()
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                total += len(attr.t.raw_data) if attr.t.raw_data else attr.t.ByteSize()
    return total


def infer_shapes(model: onnx.ModelProto, strict: bool = False) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` without shipping the weights to C++ and back.

    ``strict``: any inconsistency (types that contradict an op, shapes that do not broadcast) raises;
    otherwise inference is best effort. Shape inference needs the weights' shapes, not their values (except small ones,
    such as Reshape targets, which data propagation reads): it runs on a skeleton
    whose large initializers are graph inputs of the same type and shape, and the
    inferred value_info is copied back.
    """
    inferred = onnx.shape_inference.infer_shapes(_skeleton(model), check_type=strict, strict_mode=strict,
                                                 data_prop=True)
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for target, source in ((model.graph.output, inferred.graph.output),):
        for mine, theirs in zip(target, source):
            if not mine.type.tensor_type.HasField("shape") and theirs.type.tensor_type.HasField("shape"):
                mine.CopyFrom(theirs)
    return model


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The types of the model's tensors: its own value_info when it has some (a loaded or finalized model
    carries inferred ones), else best-effort shape inference on a weight-free skeleton."""
    source = model.graph
    if not source.value_info and source.node:
        try:
            source = onnx.shape_inference.infer_shapes(_skeleton(model), check_type=False, strict_mode=False).graph
        except Exception:  # noqa: BLE001 - best effort: the declared inputs and outputs only
            source = model.graph
    return {v.name: v.type for v in (*source.value_info, *source.output, *source.input)}


#: the floating-point element types
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """:func:`value_types` as element types (``TensorProto`` enums)."""
    return {name: t.tensor_type.elem_type for name, t in value_types(model).items()}


def declared_types(values) -> dict[str, int]:
    """The element types that ``values`` (value_info, graph outputs) declare; entries without one are left out."""
    return {v.name: v.type.tensor_type.elem_type for v in values
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}


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
    (``sanitize.types``); ``declared`` receives the exporter's own ``value_info`` types first,
    because inference then replaces them with its guesses.
    """
    if declared is not None:  # the exporter's own types, before inference fills in (and guesses) the rest
        declared.update(declared_types(model.graph.value_info))
    model = _upgrade_per_axis_qdq(model, path)
    sort_nodes(model, path)
    claim_ort_contrib_ops(model, path)  # onnxruntime's contrib ops written in the ONNX domain
    dedupe_initializers(model, path, repairs)  # what onnxruntime runs and onnx rejects, read as onnxruntime does
    import_used_domains(model, path, repairs)
    skeleton = _skeleton(model)
    try:
        _check_ignoring_missing_io_shapes(skeleton)
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
    ``sanitize.ort_fused`` writes them back as standard ONNX; returns the nodes moved."""
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
    """Put the main graph's nodes in topological order (in place), as onnx requires and onnxruntime does
    not: AMD Quark, for one, writes graphs out of order. Stable: nodes already in order keep it.
    Returns whether anything moved; a cycle is left for onnx.checker to name, a tensor no one produces is
    refused here with the node that reads it."""
    import heapq

    graph = model.graph
    done = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    known = done | set(producer) | {i.values.name for i in graph.sparse_initializer}
    orphan = next(((n, x) for n in graph.node for x in n.input if x not in known), None)
    if orphan is not None:  # no order can fix it (Intel Neural Compressor's QOperator EfficientNet)
        raise ModelLoadError(f"{path}: node '{orphan[0].name}' ({orphan[0].op_type}) reads '{orphan[1]}', which no "
                             "node, initializer or graph input produces, so onnxruntime refuses the model too: the "
                             "tool that wrote it lost that tensor. Re-export or re-quantize the model.")
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
    log.warning("%s: the graph's nodes were not in topological order (onnx requires it); sorted them", path)
    return True


def _outer_names(node: onnx.NodeProto) -> list[str]:
    """Names a node's subgraphs read (they may come from the outer graph)."""
    names = []
    for attr in node.attribute:
        for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for inner in g.node:
                names.extend(inner.input)
                names.extend(_outer_names(inner))
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


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without its large weights: each becomes a graph input of the same type and shape."""
    skeleton = onnx.ModelProto()
    if _payload_bytes(model) < (1 << 20):
        skeleton.CopyFrom(model)
        return skeleton
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(skeleton, field, getattr(model, field))
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    graph = skeleton.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    declared = {i.name for i in model.graph.input}
    for tensor in model.graph.initializer:
        if len(tensor.raw_data) > 1024 or tensor.data_location == onnx.TensorProto.EXTERNAL:
            if tensor.name not in declared:
                graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                                      list(tensor.dims)))
        else:
            graph.initializer.append(tensor)
    return skeleton


def release_memory() -> None:
    """Free a dropped copy of a model now and hand the memory back to the operating system. An
    onnx-graphsurgeon graph is a web of cycles (nodes and tensors refer to each other), so it, and the
    TensorProtos its constants refer to, go only when the cycle collector runs; then glibc's ``malloc_trim``
    returns the freed heap pages."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def is_special_file(path: str | os.PathLike) -> bool:
    """``path`` (through links) exists and is neither a regular file nor a folder: a device (``/dev/null``), a
    pipe, a socket. Such a target is written into, never replaced."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def check_writable(path: str | os.PathLike, what: str) -> None:
    """Fail before any work if ``path`` cannot be written (``what``: 'output model', 'report', ...)."""
    path = Path(path)
    check_name_lengths(path, what)
    if is_special_file(path) and what == "output model":
        raise TrtBridgeError(f"the {what} {path} is not a regular file (a device, a pipe or a socket): a model is "
                             "written atomically, by replacing the file, which would replace that node. Give a regular "
                             "file path.")
    if is_special_file(path):
        return  # a device or a pipe (a report to /dev/stdout): written into, never replaced
    if path.is_dir():
        raise TrtBridgeError(f"the {what} path {path} is a directory; give a file name (e.g. {path / 'model.onnx'}).")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise TrtBridgeError(f"cannot write the {what} {path}: {parent} is a file, not a directory.")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise TrtBridgeError(f"cannot write the {what} {path}: permission denied in {parent}. "
                             "Choose a writable location.")
    try:  # os.access trusts the mode bits: a read-only mount, /proc or root squash only show when writing
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".trt-bridge-probe-"):
            pass
    except OSError as exc:
        raise TrtBridgeError(f"cannot write the {what} {path}: {exc.strerror or exc} in {parent}. Choose a writable "
                             "location.") from None


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, protect: tuple[Path, ...] = ()) -> Path:
    """Write ``model`` to ``path`` atomically.

    The model (and, over :data:`EXTERNAL_DATA_THRESHOLD`, its ``<name>.data`` file) is
    first written into a temporary folder beside the target, then renamed into
    place, so a crash never leaves a half-written model behind. ``protect`` lists
    files that must never be overwritten (the input model).
    """
    path = Path(path).resolve()
    for p in protect:
        if path == Path(p).resolve():
            raise TrtBridgeError(
                f"refusing to overwrite the input model {p}; choose another output path with -o."
            )
    if is_special_file(path):
        raise TrtBridgeError(f"the output model {path} is not a regular file (a device, a pipe or a socket); give a "
                             "regular file path with -o.")
    try:
        return _save_model(model, path, protect)
    except OSError as exc:
        raise TrtBridgeError(f"cannot write the output model {path}: {exc.strerror or exc}. "
                             "Check free disk space and permissions, or choose another path with -o.") from exc


def _save_model(model: onnx.ModelProto, path: Path, protect: tuple[Path, ...]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    external = is_large(model)
    data_name = path.name + ".data"
    if external and any((path.parent / data_name).resolve() == Path(p).resolve() for p in protect):
        raise TrtBridgeError(
            f"writing {path} would overwrite the input model's external data {path.parent / data_name}; "
            "choose another output name with -o."
        )
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".trt-bridge-") as tmp:
        tmp_model = Path(tmp) / path.name
        if external:
            log.info("model is over 2 GB: writing weights to %s", data_name)
            onnx.save_model(write_external_data(model, Path(tmp), data_name), str(tmp_model))
            umask = os.umask(0)
            os.umask(umask)
            for written in (Path(tmp) / data_name, tmp_model):
                os.chmod(written, 0o666 & ~umask)
            os.replace(Path(tmp) / data_name, path.parent / data_name)
        else:
            onnx.save_model(model, str(tmp_model))
        os.replace(tmp_model, path)
    return path


def write_external_data(model: onnx.ModelProto, folder: Path, location: str, threshold: int = 1024,
                        align: int = 4096) -> onnx.ModelProto:
    """Write ``model``'s initializers of ``threshold`` bytes or more, one after the other, into
    ``folder/location``; return a model that refers to them there. ``model`` is left as it is:
    ``onnx.save_model(..., save_as_external_data=True)`` would empty its tensors, so a model saved for an
    onnxruntime session lost its weights to the session's temporary folder. Nothing is copied beyond one
    tensor at a time (a tensor stored in fields rather than raw bytes is converted alone)."""
    from onnx import numpy_helper

    skeleton = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(skeleton, field, getattr(model, field))
    skeleton.opset_import.extend(model.opset_import)
    skeleton.metadata_props.extend(model.metadata_props)
    skeleton.functions.extend(model.functions)
    graph = skeleton.graph
    for field in ("node", "input", "output", "value_info", "sparse_initializer", "quantization_annotation"):
        getattr(graph, field).extend(getattr(model.graph, field))
    graph.name, graph.doc_string = model.graph.name, model.graph.doc_string
    with open(folder / location, "wb") as data:
        for tensor in model.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                from trt_bridge.errors import InternalError

                raise InternalError(f"tensor '{tensor.name}' has no data loaded (it refers to external data)")
            payload = tensor.raw_data if tensor.HasField("raw_data") else None
            if payload is None and tensor.ByteSize() >= threshold:
                payload = numpy_helper.to_array(tensor).tobytes()
            if payload is None or len(payload) < threshold:
                graph.initializer.append(tensor)
                continue
            offset = data.tell()
            if offset % align:
                data.write(b"\0" * (align - offset % align))
                offset = data.tell()
            data.write(payload)
            ref = graph.initializer.add()
            ref.name, ref.data_type, ref.doc_string = tensor.name, tensor.data_type, tensor.doc_string
            ref.dims.extend(tensor.dims)
            ref.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(payload)))):
                entry = ref.external_data.add()
                entry.key, entry.value = key, value
    return skeleton


def serialize_for_session(model: onnx.ModelProto, workdir: str) -> str | bytes:
    """What onnxruntime's InferenceSession should be given for ``model``.

    Small models go as bytes; models over the protobuf limit are written with
    external data into ``workdir`` and passed by path; a header whose weights live in a
    :class:`~trt_bridge.ir.store.WeightStore` is written beside them, for onnxruntime to map.
    """
    store = store_of(model)
    if store is not None:
        return store.session_model(model)
    if not is_large(model):
        return model.SerializeToString()
    target = Path(workdir) / "model.onnx"
    onnx.save_model(write_external_data(model, Path(workdir), "model.onnx.data"), str(target))
    return str(target)


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise ModelLoadError("the model imports no default ONNX opset; it is not a valid ONNX model.")


def write_bytes_atomic(path: str | os.PathLike, data: bytes, what: str = "file") -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then a rename. The file gets the
    usual mode (0666 less the umask), not the temporary file's private 0600."""
    path = Path(path)
    if is_special_file(path):  # /dev/stdout, /dev/null, a pipe: written into, never replaced
        try:
            with open(path, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise TrtBridgeError(f"cannot write the {what} {path}: {exc.strerror or exc}.") from exc
        return path
    if path.is_symlink():  # replace what the link points to, and keep the link
        path = path.resolve()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=".trt-bridge-", delete=False) as f:
            tmp = f.name
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise TrtBridgeError(f"cannot write the {what} {path}: {exc.strerror or exc}. Choose a writable "
                             "location.") from exc
    return path


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> Path:
    """Write a text file (a report) atomically, UTF-8 with Unix newlines."""
    return write_bytes_atomic(path, text.encode("utf-8"), what)
