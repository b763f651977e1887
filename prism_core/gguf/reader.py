"""Parse and validate a GGUF file's header (metadata and tensor infos) from a byte buffer.

Prism parses the header itself rather than through ``gguf.GGUFReader`` (gguf 0.19): that
reader builds a NumPy view per array item (8 s on the Gemma 3 270M file's 262k-token
vocabulary, against a target of well under one) and trusts counts before checking them
against the file: a 60-byte file whose UINT8 array claims 2**40 items kept it looping for
over two minutes, with no error. Here every
count and length is checked against the bytes left before anything is allocated or looped
over, so work and memory stay linear in the file size whatever the header claims, and
every check of ggml's reader (src/gguf.cpp) becomes a :class:`MalformedFile` naming the
file, the byte offset and what was wrong. String arrays are only walked here (to find
where they end); their items are decoded on first access (:class:`LazyStrings`).
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import InvalidArgument, MalformedFile
from ..tensor import MAX_DIMS, MAX_NAME, MAX_NE, contiguous_strides, nbytes_of
from ..types import GGMLType, as_type, traits
from .format import (
    ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT,
    DTYPES,
    MAGIC,
    MAX_ARRAY_ITEMS,
    MAX_STRING_BYTES,
    MIN_KV_BYTES,
    MIN_TENSOR_INFO_BYTES,
    STRUCT_CODES,
    VERSION,
    V,
    decode_text,
    pad,
)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_SCALARS = {t: struct.Struct(code) for t, code in STRUCT_CODES.items()}


class LazyStrings:
    """A string array in the file, decoded on first use: ``count`` strings from ``start``, each a u64
    length (also in ``lengths``) and its bytes."""

    __slots__ = ("buf", "start", "count", "lengths")

    def __init__(self, buf: memoryview, start: int, count: int, lengths: array) -> None:
        self.buf, self.start, self.count, self.lengths = buf, start, count, lengths

    def encoded(self) -> memoryview:
        """The items as the file stores them (each a u64 length and its bytes): what a writer copies."""
        return self.buf[self.start:self.start + 8 * self.count + sum(self.lengths)]

    def decode(self, limit: int | None = None) -> list[str]:
        buf, pos, out = self.buf, self.start, []
        for _ in range(self.count if limit is None else min(limit, self.count)):
            (n,) = _U64.unpack_from(buf, pos)  # lengths were checked when the header was parsed
            out.append(decode_text(buf[pos + 8:pos + 8 + n]))
            pos += 8 + n
        return out


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the file describes it (what ``prism gguf`` lists)."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]  # as stored: n_dims extents, ggml order (dim 0 first)
    offset: int  # from the start of the data section
    nbytes: int
    file_offset: int  # absolute: data_offset + offset

    @property
    def ne4(self) -> tuple[int, int, int, int]:
        return tuple(self.ne) + (1,) * (MAX_DIMS - len(self.ne))  # type: ignore[return-value]


@dataclass
class Header:
    version: int
    alignment: int
    data_offset: int
    file_size: int
    values: dict[str, Any] = field(default_factory=dict)  # decoded, or LazyStrings
    types: dict[str, V] = field(default_factory=dict)
    element_types: dict[str, V] = field(default_factory=dict)  # arrays only
    tensors: list[TensorInfo] = field(default_factory=list)


class _Cursor:
    __slots__ = ("buf", "pos", "end", "path")

    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf, self.pos, self.end, self.path = buf, 0, len(buf), path

    def fail(self, msg: str, at: int | None = None) -> MalformedFile:
        at = self.pos if at is None else at
        return MalformedFile(f"{self.path}: byte {at}: {msg}", self.path, at)

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise self.fail(f"{what} needs {n} bytes but the file has only {self.end - self.pos} left "
                            f"(truncated or a bogus length)")

    def unpack(self, s: struct.Struct, what: str) -> Any:
        self.need(s.size, what)
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def raw_string(self, what: str) -> memoryview:
        at = self.pos
        n = self.unpack(_U64, f"the length of {what}")
        if n > MAX_STRING_BYTES:
            raise self.fail(f"{what} has length {n}, over ggml's bound of {MAX_STRING_BYTES} bytes", at)
        self.need(n, f"{what} (length {n})")
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def name(self, what: str) -> str:
        """A key or tensor name: UTF-8 without NUL bytes (C readers would cut the name at one)."""
        at = self.pos
        raw = self.raw_string(what)
        try:
            text = str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start} of it)", at) from None
        if "\0" in text:
            raise self.fail(f"{what} {text!r} contains a NUL byte", at)
        return text

    def value_type(self, what: str) -> V:
        at = self.pos
        t = self.unpack(_U32, f"the value type of {what}")
        try:
            return V(t)
        except ValueError:
            raise self.fail(f"{what} has invalid GGUF value type {t} (known: 0..12)", at) from None


def _read_value(c: _Cursor, key: str, vtype: V, h: Header) -> Any:
    what = f"the value of key {key!r}"
    if vtype == V.STRING:
        return decode_text(c.raw_string(what))
    if vtype != V.ARRAY:
        v = c.unpack(_SCALARS[vtype], f"{what} ({vtype.name})")
        return bool(v) if vtype == V.BOOL else v
    at = c.pos
    etype = c.value_type(f"the items of array {key!r}")
    if etype == V.ARRAY:
        raise c.fail(f"key {key!r} is an array of arrays, which GGUF readers (ggml) reject", at)
    count_at = c.pos
    count = c.unpack(_U64, f"the item count of array {key!r}")
    if count > MAX_ARRAY_ITEMS:
        raise c.fail(f"array {key!r} claims {count} items, over ggml's bound of {MAX_ARRAY_ITEMS}", count_at)
    h.element_types[key] = etype
    if etype == V.STRING:
        c.need(8 * count, f"array {key!r} of {count} strings")
        start = c.pos
        buf, pos, end = c.buf, c.pos, c.end
        unpack = _U64.unpack_from
        lengths = array("I")  # each at most MAX_STRING_BYTES (2**30)
        keep = lengths.append
        for i in range(count):  # the hot loop of a vocabulary: kept to one unpack and two compares
            if pos + 8 > end:
                raise c.fail(f"string {i} of array {key!r} is cut off by the end of the file", pos)
            (n,) = unpack(buf, pos)
            if n > MAX_STRING_BYTES or pos + 8 + n > end:
                raise c.fail(f"string {i} of array {key!r} has length {n}, past the end of the file "
                             f"({end - pos - 8} bytes left)", pos)
            keep(n)
            pos += 8 + n
        c.pos = pos
        return LazyStrings(buf, start, count, lengths)
    dt = DTYPES[etype]
    c.need(count * dt.itemsize, f"array {key!r} of {count} {etype.name}")
    arr = np.frombuffer(c.buf, dtype=dt, count=count, offset=c.pos).copy()
    c.pos += count * dt.itemsize
    return arr != 0 if etype == V.BOOL else arr


def parse_header(buf: memoryview, path: str) -> Header:
    """Validate and decode everything before the tensor data; raise MalformedFile on the first fault."""
    c = _Cursor(buf, path)
    c.need(4, "the magic 'GGUF'")
    magic = bytes(buf[:4])
    if magic != MAGIC:
        raise c.fail(f"not a GGUF file: magic is {magic!r}, expected {MAGIC!r}", 0)
    c.pos = 4
    version = c.unpack(_U32, "the version")
    if version == 0 or version & 0xFFFF == 0:
        raise c.fail(f"bad GGUF version {version:#x}" + (" (a file of the other endianness?)" if version else ""), 4)
    if version == 1:
        raise c.fail("GGUF version 1 is no longer supported (ggml reads versions 2 and 3)", 4)
    if version > VERSION:
        raise c.fail(f"GGUF version {version} is newer than the {VERSION} this reader knows", 4)
    at = c.pos
    n_tensors = c.unpack(_I64, "the tensor count")
    if n_tensors < 0 or n_tensors * MIN_TENSOR_INFO_BYTES > c.end - c.pos:
        raise c.fail(f"tensor count {n_tensors} is negative or cannot fit in the {c.end - c.pos} bytes left", at)
    at = c.pos
    n_kv = c.unpack(_I64, "the metadata key count")
    if n_kv < 0 or n_kv * MIN_KV_BYTES > c.end - c.pos:
        raise c.fail(f"metadata key count {n_kv} is negative or cannot fit in the {c.end - c.pos} bytes left", at)
    h = Header(version, DEFAULT_ALIGNMENT, 0, c.end)
    key_at: dict[str, int] = {}

    for i in range(n_kv):
        at = c.pos
        key = c.name(f"key {i}")
        if not key:
            raise c.fail(f"key {i} is empty", at)
        if key in h.types:
            raise c.fail(f"duplicate key {key!r} (key {i})", at)
        key_at[key] = at
        vtype = c.value_type(f"key {key!r}")
        h.types[key] = vtype
        h.values[key] = _read_value(c, key, vtype, h)

    if ALIGNMENT_KEY in h.types:
        if h.types[ALIGNMENT_KEY] != V.UINT32:
            raise c.fail(f"key {ALIGNMENT_KEY!r} must be UINT32, is {h.types[ALIGNMENT_KEY].name}",
                         key_at[ALIGNMENT_KEY])
        h.alignment = a = h.values[ALIGNMENT_KEY]
        if a == 0 or a & (a - 1):
            raise c.fail(f"alignment {a} ({ALIGNMENT_KEY}) is not a power of two", key_at[ALIGNMENT_KEY])

    names: set[str] = set()
    infos: list[tuple[str, GGMLType, tuple[int, ...], int, int, int]] = []
    for i in range(n_tensors):
        at = c.pos
        name = c.name(f"the name of tensor {i}")
        if len(name.encode("utf-8")) > MAX_NAME:
            raise c.fail(f"tensor {i}'s name {name[:20]!r}... is over ggml's {MAX_NAME} bytes", at)
        if name in names:
            raise c.fail(f"duplicate tensor name {name!r} (tensor {i})", at)
        names.add(name)
        at = c.pos
        n_dims = c.unpack(_U32, f"n_dims of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dims; at most {MAX_DIMS}", at)
        ne = []
        for j in range(n_dims):
            at = c.pos
            n = c.unpack(_I64, f"ne[{j}] of tensor {name!r}")
            if n < 0:
                raise c.fail(f"tensor {name!r} has a negative extent ne[{j}] = {n}", at)
            ne.append(n)
        if math.prod(ne) > MAX_NE:
            raise c.fail(f"tensor {name!r} ne={ne} has {math.prod(ne)} elements, over the bound 2**62", at)
        at = c.pos
        code = c.unpack(_U32, f"the type of tensor {name!r}")
        try:
            t = as_type(code)
        except InvalidArgument:
            raise c.fail(f"tensor {name!r} has unknown ggml type {code}", at) from None
        tr = traits(t)
        if ne and ne[0] % tr.blck_size:
            raise c.fail(f"tensor {name!r} of type {tr.name} has ne[0] = {ne[0]}, not a multiple of its "
                         f"block size {tr.blck_size}", at)
        at = c.pos
        offset = c.unpack(_U64, f"the data offset of tensor {name!r}")
        full = tuple(ne) + (1,) * (MAX_DIMS - len(ne))
        infos.append((name, t, tuple(ne), offset, nbytes_of(t, full, contiguous_strides(t, full)), at))

    h.data_offset = pad(c.pos, h.alignment) if n_tensors else c.pos
    if h.data_offset > c.end:
        raise c.fail(f"the data section would start at byte {h.data_offset} (alignment {h.alignment}), "
                     f"past the end of the file ({c.end} bytes)")
    expected = 0
    for name, t, ne, offset, nbytes, at in infos:
        if offset != expected:
            why = "not aligned" if offset % h.alignment else "not where the previous tensor's padded data ends"
            raise c.fail(f"tensor {name!r} has data offset {offset}, expected {expected} ({why}: tensors are "
                         f"stored back to back in info order, each padded to {h.alignment} bytes)", at)
        start = h.data_offset + offset
        if nbytes > c.end - start:
            raise c.fail(f"tensor {name!r} ({traits(t).name}, ne={list(ne)}) has data at bytes "
                         f"[{start}, {start + nbytes}), past the end of the file ({c.end} bytes)", at)
        h.tensors.append(TensorInfo(name, t, ne, offset, nbytes, start))
        expected = offset + pad(nbytes, h.alignment)
    return h


class Metadata(Mapping[str, Any]):
    """A file's metadata in file order: ints, floats, bools and str as Python values, string
    arrays as ``list[str]`` (decoded on first access), numeric arrays as NumPy arrays of the
    stored dtype (BOOL arrays as ``bool``). :attr:`types` holds each key's GGUF value type and
    :attr:`element_types` each array's item type, so saving a Metadata writes the same types."""

    def __init__(self, values: dict[str, Any], types: dict[str, V], element_types: dict[str, V]) -> None:
        self._values = values
        self.types: Mapping[str, V] = MappingProxyType(types)
        self.element_types: Mapping[str, V] = MappingProxyType(element_types)

    def __getitem__(self, key: str) -> Any:
        v = self._values[key]
        if isinstance(v, LazyStrings):
            v = self._values[key] = v.decode()
        return v

    def __contains__(self, key: object) -> bool:  # without decoding (Mapping's would read the value)
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def count(self, key: str) -> int:
        """An array's item count (1 for a scalar), without decoding it."""
        v = self._values[key]
        return v.count if isinstance(v, LazyStrings) else len(v) if self.types[key] == V.ARRAY else 1

    def undecoded_strings(self, key: str) -> LazyStrings | None:
        """A string array not decoded yet (its place in the file), else None: a reader that keeps the
        texts in its own form (a tokenizer's table) then never holds a ``list[str]`` of them."""
        v = self._values.get(key)
        return v if isinstance(v, LazyStrings) else None

    def head(self, key: str, n: int) -> list[Any]:
        """An array's first ``n`` items, decoding only those."""
        v = self._values[key]
        return v.decode(n) if isinstance(v, LazyStrings) else list(v[:n])

    def __repr__(self) -> str:
        return f"Metadata({len(self)} keys)"
