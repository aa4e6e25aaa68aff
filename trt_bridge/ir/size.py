"""How big a model is (protobuf cannot hold 2 GiB: the weights then go to external data), and letting a dropped
copy go."""

from __future__ import annotations

import onnx

#: Protobuf cannot serialize a message of 2 GiB or more; above this size the
#: weights go to an external-data file beside the model.
PROTOBUF_LIMIT = 2**31 - 1


#: Keep some headroom under the hard limit for the graph itself.
EXTERNAL_DATA_THRESHOLD = int(1.8 * 2**30)


def is_large(model: onnx.ModelProto) -> bool:
    """Too big for one protobuf message: weights must live in an external-data file.

    Estimated from the tensor payloads (computing ``ByteSize`` of a large model costs
    about a second each time); the threshold keeps headroom for the graph itself.
    """
    return too_large(payload_bytes(model))


def too_large(nbytes: int) -> bool:
    """``nbytes`` of weights are too many for one protobuf message (:func:`is_large`, for a size already known)."""
    return nbytes > EXTERNAL_DATA_THRESHOLD


def payload_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for tensor in model.graph.initializer:
        total += tensor_bytes(tensor)
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                total += tensor_bytes(attr.t)
    return total


#: how many times its bytes a constant of these types takes once lifted to float32
_WIDENED = {onnx.TensorProto.INT8: 4, onnx.TensorProto.UINT8: 4, onnx.TensorProto.FLOAT8E4M3FN: 4,
            onnx.TensorProto.FLOAT8E5M2: 4, onnx.TensorProto.INT4: 8, onnx.TensorProto.UINT4: 8,
            onnx.TensorProto.BFLOAT16: 2}


def lifted_bytes(model: onnx.ModelProto) -> int:
    """What ``model``'s weights take once lifted to float32, at most: every integer, 8-bit float and bfloat16
    initializer widened to 4 bytes a value (float16 stays float16), a com.microsoft ``MatMulNBits``' packed codes
    (uint8, 8 / ``bits`` values a byte) at 32 / ``bits`` times their bytes. A 0.75 GB int4 decoder lifts to 3.5 GB."""
    bits = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and len(node.input) > 1:
            bits[node.input[1]] = next((a.i for a in node.attribute if a.name == "bits"), 4) or 4
    widened = sum(tensor_bytes(t) * ((32 // bits[t.name] if t.name in bits else _WIDENED.get(t.data_type, 1)) - 1)
                  for t in model.graph.initializer)
    return payload_bytes(model) + widened


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a tensor's values. Raw data is sized from its shape and type: reading ``raw_data`` (or
    ``ByteSize``) copies the bytes, 50 ms for a 90 MB encoder, which added up over a conversion's sessions."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:  # (not loaded: its file holds the bytes)
        length = next((e.value for e in tensor.external_data if e.key == "length"), None)
        if length is not None:
            return int(length)
    if (tensor.HasField("raw_data") or tensor.data_location == onnx.TensorProto.EXTERNAL) \
            and tensor.data_type not in (0, onnx.TensorProto.STRING):
        count = 1
        for dim in tensor.dims:
            count *= dim
        if tensor.data_type in _PACKED_4BIT:
            return (count + 1) // 2
        try:
            return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):  # a type this onnx does not map to numpy
            pass
    return tensor.ByteSize()


#: 4-bit types pack two values per byte of raw data
_PACKED_4BIT = {getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1")
                if hasattr(onnx.TensorProto, name)}


#: below this many bytes of weights, a dropped copy of the model is left to Python's collector (collecting it at once
#: and trimming the heap cost about 40 ms a time on a 1 MB classifier, and gains nothing there)
RELEASE_BYTES = 64 << 20


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

