"""A large source model's big weights left in its external-data file until something reads them.

protobuf holds a parsed model in one arena that is freed only with the whole model, so a source loaded with its
external data stays resident until the conversion has lifted every weight from it: a 0.75 GB int4 decoder held
0.75 GB beside everything lifting made. Deferred, each big initializer is a reference into the file (its
``offset`` and ``length`` as the source wrote them) and is read when a reader asks for it, one tensor at a time::

    load_model(path, defer=True)          small tensors loaded; each big one's location becomes
                                          "<DEFERRED>/<token>/<location>" (a name no file has: onnx's own readers
                                          fail on it rather than read another file)
    tensor_array(t)                       the values (read from the file for a deferred tensor)
    loaded(t)                             a standalone TensorProto with the data
    import_graph(model)                   gs.import_onnx, its deferred constants read when they are (DeferredValues)
    with_data(model)                      a copy holding every deferred tensor's data (an onnxruntime session's)
    source_range(t)                       (file, offset, length): the weight store copies file to file

The file was checked when the model was read (:func:`trt_bridge.ir.files.check_external_data`: inside the model's
folder, a regular file, long enough) and is not written while the command runs (its outputs never overwrite an
input). A model is deferred only where its external data is large (:data:`DEFER_TOTAL`): small models keep the
one familiar form.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.errors import InternalError
from trt_bridge.ir.size import tensor_bytes

#: a model whose external data holds at least this many bytes has its big tensors deferred
DEFER_TOTAL = 256 << 20
#: the tensors deferred: at least this many bytes (the small ones are read at once, as before)
DEFER_MIN = 1 << 20
#: the first part of a deferred tensor's location
DEFERRED = "trt-bridge-deferred"

_FOLDERS: dict[str, Path] = {}  # token -> the source model's folder


def _entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def defer_external_data(model: onnx.ModelProto, folder: Path) -> int:
    """Load ``model``'s external data from ``folder``, each tensor of :data:`DEFER_MIN` bytes or more left in its
    file and marked deferred (where the external data total :data:`DEFER_TOTAL`; else all of it loaded, as
    ``onnx.load_external_data_for_model`` does); returns how many were deferred."""
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_tensor, uses_external_data

    external = [t for t in _get_all_tensors(model) if uses_external_data(t)]
    sizes = [tensor_bytes(t) for t in external]
    initializers = {id(t) for t in model.graph.initializer}  # (the main graph's: what import_graph defers)
    large = sum(sizes) >= DEFER_TOTAL
    token = secrets.token_hex(8)
    deferred = 0
    for tensor, size in zip(external, sizes):
        if not (large and size >= DEFER_MIN and id(tensor) in initializers):
            load_external_data_for_tensor(tensor, str(folder))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
            continue
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = f"{DEFERRED}/{token}/{entry.value}"
        deferred += 1
    if deferred:
        _FOLDERS[token] = Path(folder)
    return deferred


def is_deferred(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL and \
        _entries(tensor).get("location", "").startswith(DEFERRED + "/")


def source_range(tensor: onnx.TensorProto) -> tuple[Path, int, int]:
    """(file, offset, length) of a deferred tensor's bytes."""
    entries = _entries(tensor)
    _, token, location = entries["location"].split("/", 2)
    if token not in _FOLDERS:
        raise InternalError(f"tensor '{tensor.name}' refers to a deferred source that is no longer open")
    return _FOLDERS[token] / location, int(entries.get("offset", 0)), tensor_bytes(tensor)


def loaded(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor`` with its data: itself where it holds it, else a standalone copy read from the source file."""
    if not is_deferred(tensor):
        return tensor
    path, offset, length = source_range(tensor)
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    with open(path, "rb") as f:
        f.seek(offset)
        copy.raw_data = f.read(length)
    return copy


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """``numpy_helper.to_array(tensor)``, reading a deferred tensor from its file."""
    return onnx.numpy_helper.to_array(loaded(tensor))


class DeferredValues(LazyValues):
    """onnx-graphsurgeon's lazy values of a deferred tensor: shape and type from its ``header``, the values (and
    ``tensor``: a standalone copy with the data) read from the file each time they are asked for."""

    def __init__(self, header: onnx.TensorProto) -> None:
        # (not LazyValues.__init__: it reads ``tensor``, which would read the file)
        from onnx_graphsurgeon.importers.onnx_importer import get_itemsize, get_onnx_tensor_dtype

        self.header = header
        self.shape = tuple(int(d) for d in header.dims)
        self.dtype = get_onnx_tensor_dtype(header)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * get_itemsize(self.dtype)

    @property
    def tensor(self) -> onnx.TensorProto:
        return loaded(self.header)

    @tensor.setter
    def tensor(self, value: onnx.TensorProto) -> None:  # (LazyValues.__init__ sets it)
        self.header = value

    def load(self) -> np.ndarray:
        return np.array(tensor_array(self.header))


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """``gs.import_onnx(model)`` whose deferred constants read their values from the file when they are read (the
    main graph's: only its initializers are deferred)."""
    graph = gs.import_onnx(model)
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        if isinstance(tensor, gs.Constant) and type(values) is LazyValues and is_deferred(values.tensor):
            tensor._values = DeferredValues(values.tensor)
            tensor.data_location = None  # (an array a rule gives it is exported with its data, not as a reference)
    return graph


def with_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself, or (where it has deferred tensors) a copy holding their data: what a reader that takes a
    whole model (an onnxruntime session) is given."""
    if not any(is_deferred(t) for t in model.graph.initializer):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        if is_deferred(tensor):
            tensor.CopyFrom(loaded(tensor))
    return copy

