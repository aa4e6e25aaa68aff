"""The size of a model's external data, checked against what its tensors declare before anything is read: a tensor
whose data file (from its offset, or its declared length) is shorter than its shape and type need is a truncated or
mismatched copy; reading it would fail deep inside onnx or numpy ("cannot reshape array of size ...")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from trt_bridge.errors import ModelLoadError

if TYPE_CHECKING:  # numpy and onnx are imported where a model is read (the command line imports this module)
    import onnx

#: types of 4 bits a value, packed two a byte (onnx.TensorProto.INT4, UINT4, FLOAT4E2M1)
_NIBBLE_TYPES = {22, 21, 23}


def declared_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes ``tensor``'s shape and type take stored raw (None: a string tensor, whose size is not fixed)."""
    import numpy as np
    import onnx

    count = int(np.prod(tensor.dims, dtype=object)) if tensor.dims else 1
    if tensor.data_type in _NIBBLE_TYPES:
        return (count + 1) // 2
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} bytes"


def check_external_sizes(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Refuse ``model`` (read from ``path``, its external data not loaded) when a tensor's external data is shorter
    than the tensor declares: its file from the offset, or its ``length`` entry."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    folder = Path(path).parent
    sizes: dict[str, int] = {}
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        need = declared_bytes(tensor)
        location = info.get("location", "")
        if need is None or not location:
            continue
        if location not in sizes:
            try:
                sizes[location] = (folder / location).stat().st_size
            except OSError:
                continue  # a missing file is named by the check of external data files
        try:
            offset, length = int(info.get("offset", 0) or 0), info.get("length")
            length = None if length in (None, "") else int(length)
        except ValueError:
            raise ModelLoadError(f"{path}: tensor '{tensor.name}' has an external-data offset or length that is no "
                                 f"integer ({info.get('offset')!r}, {info.get('length')!r}); re-export the model.") \
                from None
        have = max(sizes[location] - offset, 0) if length is None else min(length, max(sizes[location] - offset, 0))
        if have < need:
            shape = "x".join(str(d) for d in tensor.dims) or "scalar"
            kind = onnx.TensorProto.DataType.Name(tensor.data_type).lower()
            raise ModelLoadError(
                f"{path}: tensor '{tensor.name}' ({kind} [{shape}]) declares {_size(need)}, but its external data "
                f"file '{location}' holds only {_size(have)} for it (file {_size(sizes[location])}, offset {offset}"
                f"{'' if length is None else f', length {length}'}): the external data file is shorter than the "
                "tensor's declared size. Copy the complete data file next to the model (or re-export it).")
