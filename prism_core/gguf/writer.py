"""Write Prism tensors and metadata as a GGUF (version 3) file.

Prism writes the (small, fixed) layout itself instead of through ``gguf.GGUFWriter``,
because that writer always inserts ``general.architecture``, refuses empty arrays and
packs arrays item by item: a loaded file could not be saved back exactly. Files written
here are checked to load in ``gguf.GGUFReader`` (tests/test_gguf.py).

Metadata value types, when a value does not say (pass ``(value, GGUFValueType.X)`` to
choose, or ``(items, GGUFValueType.ARRAY, GGUFValueType.X)`` / ``(items, GGUFValueType.X)``
for an array of X):

- ``bool`` -> BOOL; ``str`` -> STRING; ``bytes`` -> STRING holding those bytes.
- ``int`` -> UINT32 when in [0, 2**32) (what llama.cpp reads counts and ids as), else INT32,
  else INT64, else UINT64; beyond that an error.
- ``float`` -> FLOAT32 (llama.cpp reads float keys as FLOAT32; ask for FLOAT64 to keep a double).
- NumPy scalars and 1-dim arrays -> their dtype's type (float16 and others with no GGUF type: error).
- lists and tuples -> an array: all str -> STRING, all bool -> BOOL, all int -> the first of
  UINT32, INT32, INT64, UINT64 holding every item, ints and floats -> FLOAT32; empty or mixed:
  give the item type. Arrays of arrays are refused (ggml's reader rejects them).
- a loaded file's :class:`~prism_core.gguf.reader.Metadata` keeps each key's recorded type.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BoundExceeded, InvalidArgument, TypeMismatch, Unsupported
from ..tensor import MAX_DIMS, MAX_NAME, Tensor, contiguous_strides, nbytes_of
from ..types import GGMLType
from .format import (
    ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT,
    DTYPES,
    FLOAT_TYPES,
    INT_TYPES,
    MAGIC,
    MAX_ARRAY_ITEMS,
    MAX_KEY_BYTES,
    MAX_STRING_BYTES,
    STRUCT_CODES,
    VERSION,
    V,
    encode_text,
    is_value_type,
    pad,
)
from .reader import LazyStrings, Metadata

_INT_ORDER = (V.UINT32, V.INT32, V.INT64, V.UINT64)
_RANGES = {t: (int(np.iinfo(DTYPES[t]).min), int(np.iinfo(DTYPES[t]).max)) for t in INT_TYPES}
_NP_TYPES = {np.dtype(np.bool_): V.BOOL, **{dt.newbyteorder("="): t for t, dt in DTYPES.items() if t != V.BOOL}}


def _int_type(values: Sequence[int], key: str) -> V:
    lo, hi = min(values), max(values)
    for t in _INT_ORDER:
        if _RANGES[t][0] <= lo and hi <= _RANGES[t][1]:
            return t
    raise BoundExceeded(f"gguf save: key {key!r}: integer {lo if lo < 0 else hi} fits no GGUF integer type")


def _np_type(dtype: np.dtype, key: str) -> V:
    t = _NP_TYPES.get(np.dtype(dtype).newbyteorder("="))
    if t is None:
        raise TypeMismatch(f"gguf save: key {key!r}: NumPy dtype {dtype} has no GGUF value type")
    return t


def _item_type(items: Sequence[Any], key: str) -> V:
    if isinstance(items, np.ndarray):
        return _np_type(items.dtype, key)
    if not items:
        raise InvalidArgument(f"gguf save: key {key!r}: an empty array needs its item type: "
                              "pass (value, GGUFValueType.ARRAY, GGUFValueType.X)")
    if any(isinstance(x, (list, tuple, np.ndarray)) for x in items):
        raise Unsupported(f"gguf save: key {key!r}: arrays of arrays are not valid GGUF for ggml's reader")
    if all(isinstance(x, (str, bytes)) for x in items):
        return V.STRING
    if all(isinstance(x, (bool, np.bool_)) for x in items):
        return V.BOOL
    if all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in items):
        return _int_type([int(x) for x in items], key)
    if all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
           for x in items):
        return V.FLOAT32
    raise TypeMismatch(f"gguf save: key {key!r}: array items of mixed or unsupported types "
                       f"({sorted({type(x).__name__ for x in items})}); give the item type")


def _typed(key: str, value: Any, meta: Mapping[str, Any]) -> tuple[Any, V, V | None]:
    """(value, value type, item type or None) for one metadata entry."""
    if isinstance(meta, Metadata):
        return value, meta.types[key], meta.element_types.get(key)
    if isinstance(value, tuple) and 2 <= len(value) <= 3 and all(map(is_value_type, value[1:])):
        v, t, *sub = (value[0], *map(V, value[1:]))
        if t == V.ARRAY:
            return v, t, sub[0] if sub else _item_type(v, key)
        if sub:
            raise InvalidArgument(f"gguf save: key {key!r}: an item type is only for ARRAY values")
        if isinstance(v, (list, tuple, np.ndarray)) and t != V.STRING:
            return v, V.ARRAY, t  # (items, X): an array of X
        return v, t, None
    if isinstance(value, (bool, np.bool_)):
        return value, V.BOOL, None
    if isinstance(value, (str, bytes)):
        return value, V.STRING, None
    if isinstance(value, np.generic):
        return value, _np_type(value.dtype, key), None
    if isinstance(value, int):
        return value, _int_type([value], key), None
    if isinstance(value, float):
        return value, V.FLOAT32, None
    if isinstance(value, np.ndarray) and value.ndim != 1:
        raise InvalidArgument(f"gguf save: key {key!r}: arrays must be 1-dim, got shape {value.shape}")
    if isinstance(value, (list, tuple, np.ndarray)):
        return value, V.ARRAY, _item_type(value, key)
    raise TypeMismatch(f"gguf save: key {key!r}: cannot store a {type(value).__name__} as GGUF metadata")


def _string(s: Any, key: str) -> bytes:
    if isinstance(s, np.str_):
        s = str(s)
    if not isinstance(s, (str, bytes)):
        raise TypeMismatch(f"gguf save: key {key!r}: expected a string, got {type(s).__name__}")
    raw = encode_text(s) if isinstance(s, str) else bytes(s)
    if len(raw) > MAX_STRING_BYTES:
        raise BoundExceeded(f"gguf save: key {key!r}: a string of {len(raw)} bytes is over the bound")
    return struct.pack("<Q", len(raw)) + raw


def _scalar(v: Any, t: V, key: str) -> bytes:
    if t == V.STRING:
        return _string(v, key)
    if t == V.BOOL:
        if not isinstance(v, (bool, np.bool_, int, np.integer)) or int(v) not in (0, 1):
            raise TypeMismatch(f"gguf save: key {key!r}: BOOL needs True/False, got {v!r}")
        return bytes([int(v)])
    if t in INT_TYPES:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeMismatch(f"gguf save: key {key!r}: {t.name} needs an int, got {v!r}")
        lo, hi = _RANGES[t]
        if not lo <= int(v) <= hi:
            raise BoundExceeded(f"gguf save: key {key!r}: {v} is outside {t.name}'s range [{lo}, {hi}]")
        return struct.pack(STRUCT_CODES[t], int(v))
    if t in FLOAT_TYPES:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeMismatch(f"gguf save: key {key!r}: {t.name} needs a number, got {v!r}")
        return np.array(v, DTYPES[t]).tobytes()
    raise InvalidArgument(f"gguf save: key {key!r}: {t.name} is not a scalar value type")


def _array(items: Any, t: V, key: str) -> bytes:
    if isinstance(items, LazyStrings) and t == V.STRING:  # read from a file and not decoded: copied as stored
        return struct.pack("<IQ", t, items.count) + bytes(items.encoded())
    if t == V.ARRAY:
        raise Unsupported(f"gguf save: key {key!r}: arrays of arrays are not valid GGUF for ggml's reader")
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple, np.ndarray)):
        raise TypeMismatch(f"gguf save: key {key!r}: an ARRAY value must be a list, tuple or 1-dim array")
    n = len(items)
    if n > MAX_ARRAY_ITEMS:
        raise BoundExceeded(f"gguf save: key {key!r}: {n} items, over the bound {MAX_ARRAY_ITEMS}")
    head = struct.pack("<IQ", t, n)
    if t == V.STRING:
        return head + b"".join(_string(s, key) for s in items)
    arr = np.asarray(items)
    if arr.ndim != 1 and n:
        raise InvalidArgument(f"gguf save: key {key!r}: arrays must be 1-dim, got shape {arr.shape}")
    if n and t in INT_TYPES | {V.BOOL}:
        if arr.dtype.kind not in "biu":
            raise TypeMismatch(f"gguf save: key {key!r}: an array of {t.name} needs integers, got {arr.dtype}")
        lo, hi = (0, 1) if t == V.BOOL else _RANGES[t]
        if int(arr.min()) < lo or int(arr.max()) > hi:
            raise BoundExceeded(f"gguf save: key {key!r}: items outside {t.name}'s range [{lo}, {hi}]")
    elif n and arr.dtype.kind not in "biuf":
        raise TypeMismatch(f"gguf save: key {key!r}: an array of {t.name} needs numbers, got {arr.dtype}")
    return head + arr.astype(DTYPES[t]).tobytes()


def _key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"gguf save: metadata keys must be non-empty str, got {key!r}")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise BoundExceeded(f"gguf save: key {key[:30]!r}... is over {MAX_KEY_BYTES} bytes")
    return key


def _tensor_bytes(t: Tensor) -> bytes | memoryview:
    if t.is_contiguous():
        return memoryview(t.storage())[t.view_offs:t.view_offs + t.nbytes]
    if t.traits.is_quantized:
        raise Unsupported(f"gguf save: {t.label} is a non-contiguous view of quantized data; save a cont() of it")
    return np.ascontiguousarray(t.host()).tobytes()


def _named(tensors: Mapping[str, Tensor] | Sequence[Tensor]) -> list[tuple[str, Tensor]]:
    pairs = list(tensors.items()) if isinstance(tensors, Mapping) else [(t.name, t) for t in tensors]
    seen: set[str] = set()
    for name, t in pairs:
        if not isinstance(t, Tensor):
            raise InvalidArgument(f"gguf save: {name!r} is a {type(t).__name__}, not a Tensor")
        if not isinstance(name, str):
            raise InvalidArgument(f"gguf save: tensor names must be str, got {name!r}")
        if len(name.encode("utf-8")) > MAX_NAME:
            raise BoundExceeded(f"gguf save: tensor name {name[:20]!r}... is over {MAX_NAME} bytes")
        if name in seen:
            raise InvalidArgument(f"gguf save: duplicate tensor name {name!r} (unnamed tensors: pass a mapping)")
        seen.add(name)
    return pairs


@dataclass(frozen=True)
class TensorEntry:
    """A tensor of a file being written: its name, ggml type and extents as stored (ggml order, its n_dims)."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        ne = tuple(self.ne) + (1,) * (MAX_DIMS - len(self.ne))
        return nbytes_of(self.type, ne, contiguous_strides(self.type, ne))


def _header(entries: dict[str, tuple[Any, V, V | None]], tensors: Sequence[TensorEntry], alignment: int) -> bytes:
    kv = [_string(k, k) + struct.pack("<I", t) + (_array(v, sub, k) if t == V.ARRAY else _scalar(v, t, k))
          for k, (v, t, sub) in entries.items()]
    header = bytearray(MAGIC + struct.pack("<IQQ", VERSION, len(tensors), len(kv)))
    for b in kv:
        header += b
    offset = 0
    for e in tensors:
        header += _string(e.name, e.name) + struct.pack(f"<I{len(e.ne)}QIQ", len(e.ne), *e.ne, int(e.type), offset)
        offset += pad(e.nbytes, alignment)
    if tensors:
        header += bytes(pad(len(header), alignment) - len(header))
    return bytes(header)


def _entries(metadata: Mapping[str, Any] | None, alignment: int | None) -> tuple[dict, int]:
    entries = {} if metadata is None else {k: _typed(_key(k), v, metadata) for k, v in metadata.items()}
    if ALIGNMENT_KEY in entries:
        v, t, _ = entries[ALIGNMENT_KEY]
        if t != V.UINT32:
            raise TypeMismatch(f"gguf save: {ALIGNMENT_KEY} must be UINT32, got {t.name}")
        if alignment is not None and alignment != v:
            raise InvalidArgument(f"gguf save: alignment={alignment} disagrees with metadata {ALIGNMENT_KEY}={v}")
        alignment = v
    elif alignment is not None and alignment != DEFAULT_ALIGNMENT:
        entries[ALIGNMENT_KEY] = (alignment, V.UINT32, None)
    alignment = DEFAULT_ALIGNMENT if alignment is None else alignment
    if (isinstance(alignment, bool) or not isinstance(alignment, (int, np.integer)) or alignment <= 0
            or alignment & (alignment - 1)):
        raise InvalidArgument(f"gguf save: alignment must be a power of two, got {alignment!r}")
    return entries, int(alignment)


class StreamWriter:
    """A GGUF v3 file written tensor by tensor, for data that does not fit in memory at once: the header
    (metadata and every tensor's name, type and extents) first, then each tensor's bytes in order, in as many
    :meth:`write` calls as convenient (padding is added when a tensor is complete). The file appears under
    ``path`` only when :meth:`close` finds every tensor written; leaving the ``with`` block on an exception, or
    closing early, removes the partial file::

        with StreamWriter("out.gguf", [TensorEntry("w", GGMLType.Q8_0, (256, 4))], meta) as w:
            for block in blocks_of_rows:
                w.write(block)
    """

    def __init__(self, path: str | os.PathLike[str], tensors: Sequence[TensorEntry],
                 metadata: Mapping[str, Any] | None = None, *, alignment: int | None = None) -> None:
        entries, self.alignment = _entries(metadata, alignment)
        seen: set[str] = set()
        for e in tensors:
            if not isinstance(e.name, str) or len(e.name.encode("utf-8")) > MAX_NAME:
                raise BoundExceeded(f"gguf save: tensor name {str(e.name)[:20]!r}... is over {MAX_NAME} bytes")
            if e.name in seen:
                raise InvalidArgument(f"gguf save: duplicate tensor name {e.name!r}")
            seen.add(e.name)
        header = _header(entries, tensors, self.alignment)
        self.path = os.fspath(path)
        self._tmp = f"{self.path}.partial"
        self._sizes = [e.nbytes for e in tensors]
        self._names = [e.name for e in tensors]
        self._i, self._done = 0, 0  # the tensor being written, its bytes so far
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - held until close()
        try:
            self._file.write(header)
            self._skip_empty()
        except BaseException:
            self.abort()
            raise

    @property
    def current(self) -> str | None:
        """The name of the tensor the next bytes belong to (None once all are written)."""
        return self._names[self._i] if self._i < len(self._names) else None

    def _skip_empty(self) -> None:
        while self._i < len(self._sizes) and self._sizes[self._i] == 0:
            self._i += 1

    def write(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Append bytes of the current tensor (and past its end, of the next ones)."""
        mv = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data).cast("B")
        while len(mv):
            if self._i >= len(self._sizes):
                raise InvalidArgument(f"gguf save: {len(mv)} bytes written past the last tensor")
            take = min(len(mv), self._sizes[self._i] - self._done)
            self._file.write(mv[:take])
            mv, self._done = mv[take:], self._done + take
            if self._done == self._sizes[self._i]:
                self._file.write(bytes(pad(self._done, self.alignment) - self._done))
                self._i, self._done = self._i + 1, 0
                self._skip_empty()

    def close(self) -> None:
        """Finish the file: an error (and no file) unless every tensor's bytes were written."""
        if self._file.closed:
            return
        if self._i < len(self._sizes):
            name, done, size = self._names[self._i], self._done, self._sizes[self._i]
            self.abort()
            raise InvalidArgument(f"gguf save: {self.path}: tensor {name!r} has {done} of its {size} bytes "
                                  f"({len(self._sizes) - self._i} tensors unfinished); no file written")
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Stop and remove the partial file."""
        if not self._file.closed:
            self._file.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def save(path: str | os.PathLike[str], tensors: Mapping[str, Tensor] | Sequence[Tensor],
         metadata: Mapping[str, Any] | None = None, *, alignment: int | None = None) -> None:
    """Write ``tensors`` (a name -> Tensor mapping, or tensors named by their own names) and
    ``metadata`` (see the module doc for value types) to ``path`` as GGUF v3.

    ``alignment`` (a power of two) pads the data section and each tensor; when it is not 32
    it is written as ``general.alignment`` (metadata that carries that key decides instead).
    Everything is checked before the file is touched; the file appears complete or not at all."""
    pairs = _named(tensors)
    specs = [TensorEntry(name, t.type, tuple(t.ne[:t.n_dims])) for name, t in pairs]
    with StreamWriter(path, specs, metadata, alignment=alignment) as w:
        for _, t in pairs:
            w.write(_tensor_bytes(t))
