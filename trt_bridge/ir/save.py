"""Saving models (atomically, with external data over 2 GB, never over an input) and handing them to onnxruntime."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx

from trt_bridge.errors import InternalError, TrtBridgeError
from trt_bridge.ir.commit import Outputs
from trt_bridge.ir.files import is_special_file
from trt_bridge.ir.size import is_large, tensor_bytes
from trt_bridge.ir.store import store_of

log = logging.getLogger("trt_bridge.ir.model")


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, protect: tuple[Path, ...] = ()) -> Path:
    """Write ``model`` to ``path`` atomically.

    The model (and, over :data:`EXTERNAL_DATA_THRESHOLD`, its ``<name>.data`` file) is
    first written into a temporary folder beside the target, then renamed into
    place, so a crash never leaves a half-written model behind. ``protect`` lists
    files that must never be overwritten (the input model).
    """
    with Outputs() as outputs:
        stage_model(model, path, outputs, protect=protect)
        outputs.commit()
    return Path(path).resolve()


def stage_model(model: onnx.ModelProto, path: str | os.PathLike, outputs: Outputs, *,
                protect: tuple[Path, ...] = ()) -> Path:
    """Write ``model`` (and its ``.data`` over 2 GB) for ``path`` into ``outputs``' staging folder beside it;
    returns the staged model file, which :meth:`Outputs.commit` renames into place with the command's other
    outputs."""
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
        return _stage_model(model, path, outputs, protect)
    except OSError as exc:
        raise TrtBridgeError(f"cannot write the output model {path}: {exc.strerror or exc}. "
                             "Check free disk space and permissions, or choose another path with -o.") from exc


def _stage_model(model: onnx.ModelProto, path: Path, outputs: Outputs, protect: tuple[Path, ...]) -> Path:
    external = is_large(model)
    data_name = path.name + ".data"
    if external and any((path.parent / data_name).resolve() == Path(p).resolve() for p in protect):
        raise TrtBridgeError(
            f"writing {path} would overwrite the input model's external data {path.parent / data_name}; "
            "choose another output name with -o."
        )
    if external:  # staged first: renamed into place before the model that refers to it
        log.info("model is over 2 GB: writing weights to %s", data_name)
        outputs.stage(path.parent / data_name)
    staged = outputs.stage(path)
    if external:
        onnx.save_model(write_external_data(model, staged.parent, data_name), str(staged))
    else:
        write_streamed(model, staged)
    return staged


#: GraphProto's ``initializer`` and ModelProto's ``graph`` fields as length-delimited protobuf tags (field 5 and 7,
#: wire type 2)
_INITIALIZER_TAG, _GRAPH_TAG = bytes([5 << 3 | 2]), bytes([7 << 3 | 2])


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def write_streamed(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` to ``path`` as ``onnx.save_model`` would, without serializing it whole: the model and graph
    without their initializers first, then each initializer as its own field, one tensor in memory at a time
    (``SerializeToString`` of a 0.75 GB decoder held a second 0.75 GB copy). Protobuf reads a message's fields in
    any order, so ``onnx.load`` gives back an equal model; the bytes differ from ``save_model``'s in the order of
    the fields only, and the same model gives the same bytes."""
    if not model.graph.initializer:
        onnx.save_model(model, str(path))
        return
    head, graph = _fields_but(model, onnx.ModelProto(), "graph"), _fields_but(model.graph, onnx.GraphProto(),
                                                                               "initializer")
    graph_bytes = graph.SerializeToString()
    parts = [_tensor_parts(t) for t in model.graph.initializer]  # (header bytes, raw data bytes or None)
    sizes = [len(h) if n is None else len(h) + len(_RAW_TAG) + len(_varint(n)) + n for h, n in parts]
    length = len(graph_bytes) + sum(len(_INITIALIZER_TAG) + len(_varint(n)) + n for n in sizes)
    with open(path, "wb") as out:
        out.write(head.SerializeToString())
        out.write(_GRAPH_TAG + _varint(length))
        out.write(graph_bytes)
        for tensor, (header, raw), size in zip(model.graph.initializer, parts, sizes):
            out.write(_INITIALIZER_TAG + _varint(size) + header)
            if raw is not None:  # the raw bytes, read once (protobuf's own serialization held two copies)
                data = tensor.raw_data
                if len(data) != raw:
                    raise InternalError(f"tensor '{tensor.name}' holds {len(data)} bytes, not the {raw} its shape "
                                        "and type need")
                out.write(_RAW_TAG + _varint(raw))
                out.write(data)
                del data


#: TensorProto's ``raw_data`` field as a length-delimited tag (field 9, wire type 2)
_RAW_TAG = bytes([9 << 3 | 2])
#: a tensor's fields besides its raw data (a typed-field tensor is serialized as it is)
_TYPED = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _tensor_parts(tensor: onnx.TensorProto) -> tuple[bytes, int | None]:
    """A tensor's serialized fields but ``raw_data``, and the raw data's length (None: the whole tensor serialized,
    a small one or one in typed fields)."""
    if not tensor.HasField("raw_data") or any(len(getattr(tensor, f)) for f in _TYPED) \
            or tensor_bytes(tensor) < (1 << 20):
        return tensor.SerializeToString(), None
    return _fields_but(tensor, onnx.TensorProto(), "raw_data").SerializeToString(), tensor_bytes(tensor)


def _fields_but(message, into, skipped: str):
    """``into`` given every field ``message`` has set but ``skipped``, which is never read (a tensor's ``raw_data``
    would be copied by reading it)."""
    for field in message.DESCRIPTOR.fields:
        if field.name == skipped:
            continue
        if getattr(field, "is_repeated", None) or getattr(field, "label", None) == 3:  # (3: LABEL_REPEATED)
            getattr(into, field.name).extend(getattr(message, field.name))
        elif message.HasField(field.name) if field.has_presence else getattr(message, field.name):
            if field.type == field.TYPE_MESSAGE:
                getattr(into, field.name).CopyFrom(getattr(message, field.name))
            else:
                setattr(into, field.name, getattr(message, field.name))
    return into


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

