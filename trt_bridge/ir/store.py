"""A model over 2 GB is held in memory once: while it is converted, its large weights live in a private file.

protobuf keeps a parsed message's memory in one arena until the whole message goes (clearing a tensor's
``raw_data`` frees nothing), and onnxruntime's calibration session holds its own copy of every weight, so a
lifted model kept in TensorProtos is held twice while it is calibrated (2.1x the float model's bytes were
measured on a 2.3 GB encoder). With a store, the lifted float model is a weightless *header* whose large
initializers refer to one file in a private temporary folder:

    source TensorProtos ─ export_model(graph, store) ─▶ header (refs) + weights-<token>.data (4 KiB aligned)
                                                           │                     │
                       store.attach(graph): constants ◀────┘── np.memmap ────────┤
                       onnxruntime sessions: store.session_model(header) ─ maps ─┘

The graph reads the weights as copy-on-write memory maps (a rule that writes into one gets private pages);
onnxruntime maps the same file. A page both have read counts twice in the resident set (once per map), so
``release_pages`` hands back the pages the graph's maps read (smoothing reads every weight it scales while the
calibration session runs): the page cache keeps them, a later read maps them again. Nothing here reaches an
output model: exporting the graph again copies each weight's values into the new model, and ``close`` deletes
the folder.
"""

from __future__ import annotations

import ctypes
import mmap
import secrets
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np
import onnx

from trt_bridge.errors import InternalError
from trt_bridge.ir.derived import DerivedValues

#: the page size onnxruntime maps external data by: every weight starts on such a boundary
ALIGN = 4096

_OPEN: dict[str, WeightStore] = {}  # by file name: the header's tensors name their file, not their store

#: madvise(2)'s advice that drops a range's pages from this process's map (Linux; not in every Python's mmap module)
MADV_DONTNEED = 4
#: /proc/self/pagemap's bits: the page is present, swapped out, or a file page (not a private copy)
_PRESENT, _SWAPPED, _FILE_PAGE = 1 << 63, 1 << 62, 1 << 61


class WeightStore:
    """One private folder holding large weights in one file; a context manager that deletes it on exit."""

    #: weights of at least this many bytes go to the file; smaller ones stay in the header
    MIN_BYTES = 1 << 20

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="trt-bridge-weights-")
        self.folder = Path(self._dir.name)
        self.location = f"weights-{secrets.token_hex(8)}.data"
        self._file = open(self.folder / self.location, "wb")  # noqa: SIM115 - closed by close()
        self._sessions = 0
        self._end = 0  # the file's logical end: appended weights and reserved ranges
        self._pending: dict[int, tuple[DerivedValues, onnx.TensorProto]] = {}  # offset -> values not written yet
        self._maps: list[weakref.ref] = []  # the maps ``array`` handed out (arrays are not hashable: no WeakSet)
        _OPEN[self.location] = self

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def put(self, tensor: onnx.TensorProto, payload: bytes | np.ndarray) -> None:
        """Append ``payload`` to the file and make ``tensor`` (weightless: type and dims set) refer to it."""
        data = memoryview(np.ascontiguousarray(payload)).cast("B") if isinstance(payload, np.ndarray) else payload
        offset = self._reserve(tensor, len(data))
        self._file.seek(offset)
        self._file.write(data)

    def put_range(self, tensor: onnx.TensorProto, path: Path, offset: int, length: int, chunk: int = 64 << 20) -> None:
        """Copy ``length`` bytes at ``offset`` of the file ``path`` (a deferred source weight:
        :mod:`trt_bridge.ir.deferred`) into the store, ``chunk`` bytes at a time, and make ``tensor`` refer to them."""
        start = self._reserve(tensor, length)
        self._file.seek(start)
        with open(path, "rb") as source:
            source.seek(offset)
            left = length
            while left:
                data = source.read(min(chunk, left))
                if not data:
                    raise InternalError(f"{path} ends before the {length} bytes of tensor '{tensor.name}'")
                self._file.write(data)
                left -= len(data)

    def put_derived(self, tensor: onnx.TensorProto, values: DerivedValues) -> None:
        """Make ``tensor`` refer to a range of the file that ``values`` fill when first needed (a session's model,
        :meth:`array`); until then :meth:`attach` gives the graph ``values`` themselves, nothing computed."""
        self._pending[self._reserve(tensor, values.nbytes)] = (values, tensor)

    def _reserve(self, tensor: onnx.TensorProto, nbytes: int) -> int:
        """An aligned range of ``nbytes`` at the file's end, ``tensor`` (weightless) made to refer to it."""
        offset = -(-self._end // ALIGN) * ALIGN
        self._end = offset + nbytes
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return offset

    def _write_pending(self, offsets=None) -> None:
        """Compute and write the reserved ranges at ``offsets`` (all of them by default), one weight at a time."""
        for offset in list(self._pending if offsets is None else offsets):
            values, _ = self._pending.pop(offset)
            self._file.seek(offset)
            self._file.write(memoryview(np.ascontiguousarray(values.load())).cast("B"))
        if self._file.seek(0, 2) < self._end:  # a range reserved last and not written yet still reads as zeros
            self._file.truncate(self._end)

    def holds(self, tensor: onnx.TensorProto) -> bool:
        return tensor.data_location == onnx.TensorProto.EXTERNAL and _location(tensor) == self.location

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        """The values of ``tensor`` (one this store holds), mapped from the file copy-on-write."""
        fields = {e.key: e.value for e in tensor.external_data}
        if int(fields["offset"]) in self._pending:
            self._write_pending([int(fields["offset"])])
        self._file.flush()
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        mapped = np.memmap(self.folder / self.location, dtype=dtype, mode="c", offset=int(fields["offset"]),
                           shape=tuple(tensor.dims))
        self._maps = [ref for ref in self._maps if ref() is not None]
        self._maps.append(weakref.ref(mapped))
        return mapped

    def release_pages(self, only: np.ndarray | None = None) -> int:
        """Drop the pages the graph's maps of this store (or the one map ``only``) have read from the resident set
        (they stay in the page cache; reading them again maps them again); return the bytes released. A map a rule
        wrote into (it holds private copies of pages) keeps its pages. Linux only: 0 elsewhere."""
        maps = [mapped for mapped in (ref() for ref in self._maps) if mapped is not None]
        if only is not None:
            maps = [mapped for mapped in maps if mapped is only]
        if not sys.platform.startswith("linux") or not maps:
            return 0
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            pagemap = open("/proc/self/pagemap", "rb", buffering=0)  # noqa: SIM115 - closed below
        except OSError:
            return 0
        released = 0
        with pagemap:
            for mapped in maps:
                start, end = _inner_pages(mapped.ctypes.data, mapped.nbytes)
                if end > start and not _has_private_pages(pagemap, start, end):
                    if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED) == 0:
                        released += end - start
        return released

    def attach(self, graph) -> int:
        """Give every constant of ``graph`` (imported from a header of this store) its mapped values; return
        how many. onnx-graphsurgeon would read an external tensor relative to the working directory."""
        import onnx_graphsurgeon as gs
        from onnx_graphsurgeon.ir.tensor import LazyValues

        count = 0
        for tensor in graph.tensors().values():
            lazy = getattr(tensor, "_values", None)
            if isinstance(tensor, gs.Constant) and isinstance(lazy, LazyValues) and self.holds(lazy.tensor):
                pending = self._pending.get(int(next(e.value for e in lazy.tensor.external_data if e.key == "offset")))
                tensor.values = pending[0] if pending is not None else self.array(lazy.tensor)
                tensor.data_location = None  # or the graph's next export would mark the values external
                count += 1
        return count

    def session_model(self, model: onnx.ModelProto) -> str:
        """Write the header ``model`` beside the weights file and return its path, for onnxruntime to load
        (it resolves the weights relative to the model's folder and maps them)."""
        self._write_pending()
        self._file.flush()
        self._sessions += 1
        path = self.folder / f"session-{self._sessions}.onnx"
        path.write_bytes(model.SerializeToString())
        return str(path)

    def close(self) -> None:
        self._pending.clear()
        if not self._file.closed:
            self._file.close()
        _OPEN.pop(self.location, None)
        self._dir.cleanup()


def release_weight(values: np.ndarray) -> int:
    """Once a weight is read (quantized), drop its pages from the resident set if a store maps it
    (:meth:`WeightStore.release_pages`): onnxruntime's session maps the same file, and each map's pages count.
    0 for any other array."""
    while isinstance(values, np.ndarray) and not isinstance(values, np.memmap):
        values = values.base
    if not isinstance(values, np.memmap):
        return 0
    return sum(store.release_pages(values) for store in list(_OPEN.values()))


def storable(dtype: np.dtype | int) -> bool:
    """Whether weights of this type (numpy, or an ONNX TensorProto type) can be mapped as numpy arrays."""
    if isinstance(dtype, int):
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
        except (KeyError, ValueError):
            return False
    return np.dtype(dtype).kind in "biuf" and np.dtype(dtype).name != "bfloat16"


def store_of(model: onnx.ModelProto) -> WeightStore | None:
    """The open store ``model``'s weights live in, if any."""
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            store = _OPEN.get(_location(tensor))
            if store is not None:
                return store
            raise InternalError(f"tensor '{tensor.name}' refers to external data that is not loaded")
    return None


def _inner_pages(address: int, nbytes: int) -> tuple[int, int]:
    """The whole pages inside ``[address, address + nbytes)``."""
    return -(-address // mmap.PAGESIZE) * mmap.PAGESIZE, (address + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE


def _has_private_pages(pagemap, start: int, end: int) -> bool:
    """Whether a page of ``[start, end)`` (page-aligned addresses of this process) is a private copy (written
    through a copy-on-write map) rather than a page of the mapped file: dropping it would lose what was written."""
    data = _pagemap_read(pagemap, start, end)
    if len(data) != (end - start) // mmap.PAGESIZE * 8:
        return True  # unknown: keep the pages
    entries = np.frombuffer(data, dtype=np.uint64)
    resident = (entries & np.uint64(_PRESENT | _SWAPPED)) != 0
    return bool(np.any(resident & ((entries & np.uint64(_FILE_PAGE)) == 0)))


def _pagemap_read(pagemap, start: int, end: int) -> bytes:
    """``/proc/self/pagemap``'s entries (8 bytes a page) for the pages of ``[start, end)``."""
    first, count = start // mmap.PAGESIZE, (end - start) // mmap.PAGESIZE
    pagemap.seek(first * 8)
    data = b""
    while len(data) < count * 8:
        chunk = pagemap.read(count * 8 - len(data))
        if not chunk:
            break
        data += chunk
    return data[: len(data) // 8 * 8]


def _location(tensor: onnx.TensorProto) -> str | None:
    return next((e.value for e in tensor.external_data if e.key == "location"), None)
