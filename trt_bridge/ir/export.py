"""A graph back to a ModelProto, holding each large weight once (or putting it in a weight store)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_bridge.ir.deferred import DeferredValues, source_range
from trt_bridge.ir.derived import DerivedValues
from trt_bridge.ir.store import WeightStore, release_weight, storable

#: constants at least this large are copied once into an exported model (see :func:`export_model`)
BIG_CONSTANT = 1 << 20


def export_model(graph: gs.Graph, store: WeightStore | None = None, consume: bool = False) -> onnx.ModelProto:
    """``gs.export_onnx(graph)``, copying each large weight that still lives in its source TensorProto once.

    onnx-graphsurgeon puts the source protos into a GraphProto and ``onnx.helper.make_model`` copies that
    into the ModelProto: while both exist, with the source, a model over 2 GB is held three times. Here the
    large protos are exported as weightless stand-ins and copied into the finished model one by one. With a
    ``store``, every large weight (a source proto's or an array) goes into the store's file instead, and the
    model refers to it there (:mod:`trt_bridge.ir.store`); a weight derived from compact values
    (:mod:`trt_bridge.ir.derived`) gets a range of the store's file it fills only once a session needs it.
    ``consume``: the graph is not used after the export (its large constants are left weightless); each large
    weight's bytes leave it once copied into the model (protobuf frees a TensorProto's bytes only with the whole
    TensorProto: clearing its ``raw_data`` freed nothing), so the weights are held about once, not twice."""
    swapped = {}
    limit = BIG_CONSTANT if store is None else store.MIN_BYTES
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        data_type = _large_type(values, store is not None or consume) if isinstance(tensor, gs.Constant) else None
        if data_type is None or values.nbytes < limit or (store is not None and not storable(data_type)):
            continue
        stand_in = onnx.TensorProto(name=tensor.name, data_type=data_type, dims=values.shape)
        swapped[tensor.name] = (tensor, values)
        tensor._values = LazyValues(stand_in)
    try:
        model = gs.export_onnx(graph)
    finally:
        if not consume:
            for tensor, values in swapped.values():
                tensor._values = values
    for init in model.graph.initializer:
        if init.name not in swapped:
            continue
        # consumed: the graph keeps the stand-in, and each weight's own copy goes as soon as the model has it
        tensor, values = swapped.pop(init.name) if consume else swapped[init.name]
        if isinstance(values, DerivedValues):
            if store is not None:
                store.put_derived(init, values)  # computed when a session needs them, if ever
            else:
                init.CopyFrom(onnx.numpy_helper.from_array(values.load(), tensor.name))
        elif store is not None and isinstance(values, DeferredValues):
            store.put_range(init, *source_range(values.header))  # file to file: never in memory whole
        elif store is not None:
            source = values.tensor if isinstance(values, LazyValues) else None
            store.put(init, source.raw_data if source is not None and source.HasField("raw_data")
                      else np.asarray(values.load() if source is not None else values))
        elif isinstance(values, np.ndarray):  # (consumed only: see above)
            _copy_array(init, values, tensor.name)
        else:
            init.CopyFrom(values.tensor)
            init.name = tensor.name
        del values
    if consume:
        for tensor, values in swapped.values():  # (none: every stand-in is an initializer)
            tensor._values = values
    return model


def _large_type(values, arrays: bool) -> int | None:
    """The ONNX type of a constant's values that the export copies itself (None: onnx-graphsurgeon exports it):
    derived, deferred and TensorProto-held values without reading them, and numpy arrays where ``arrays``."""
    if isinstance(values, DerivedValues):  # (its .tensor computes the values: ask nothing else of it)
        return onnx.helper.np_dtype_to_tensor_dtype(values.dtype)
    if isinstance(values, DeferredValues):  # (its .tensor reads the file: the header says the rest)
        return values.header.data_type
    if isinstance(values, LazyValues) and isinstance(values.tensor, onnx.TensorProto):
        return values.tensor.data_type
    if arrays and isinstance(values, np.ndarray) and values.dtype != object:
        try:
            return onnx.helper.np_dtype_to_tensor_dtype(values.dtype)
        except (KeyError, ValueError, TypeError):  # a type ONNX has no tensor of: onnx-graphsurgeon's to say
            return None
    return None


#: numpy types whose values are their raw data as ONNX stores it (no packing, no conversion)
_RAW_KINDS = "biuf"


def _copy_array(init: onnx.TensorProto, values: np.ndarray, name: str) -> None:
    """``init`` given ``values``: the plain types' bytes taken, a weight store's mapped pages dropped, then handed to
    the proto (two copies of the weight at a time, not three), the others through ``numpy_helper.from_array``
    (4-bit packing, bfloat16, FP8)."""
    array = np.asarray(values)
    if array.dtype.kind in _RAW_KINDS and array.dtype.isnative and array.dtype.itemsize in (1, 2, 4, 8) \
            and array.dtype.name != "bfloat16" and onnx.helper.np_dtype_to_tensor_dtype(array.dtype) == init.data_type:
        data = array.tobytes()
        release_weight(array)
        init.raw_data = data
    else:
        init.CopyFrom(onnx.numpy_helper.from_array(array, name))

