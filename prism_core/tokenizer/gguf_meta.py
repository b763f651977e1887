"""A GGUF file's key-value metadata, read directly (the header only; tensors are never touched).

Stand-in until ``prism_core.gguf.load`` is merged: the ``gguf`` package's reader builds a numpy
view per string and takes tens of seconds on a 256k-token vocabulary, this takes well under one.
Gives the mapping shape the loader's ``f.meta`` has: strings as str, string arrays as lists of
str, numeric arrays as numpy arrays, scalars as Python numbers and bools.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

import numpy as np

from ..errors import InvalidArgument

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise InvalidArgument(f"GGUF file {self.path!r} ends inside its metadata (at byte {self.pos}, "
                                  f"{n} more needed)")
        view = memoryview(self.buf)[self.pos:self.pos + n]
        self.pos += n
        return view

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="surrogateescape")


def _value(c: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALARS:
        return c.unpack(_SCALARS[vtype])
    if vtype == _STRING:
        return c.string()
    if vtype == _ARRAY:
        etype, n = c.unpack("<I"), c.unpack("<Q")
        if etype in _SCALARS:
            dtype = np.dtype(_SCALARS[etype].replace("?", "u1"))
            arr = np.frombuffer(c.take(n * dtype.itemsize), dtype=dtype).copy()
            return arr.astype(bool) if etype == 7 else arr
        if etype == _STRING:
            return [c.string() for _ in range(n)]
        return [_value(c, etype, key) for _ in range(n)]
    raise InvalidArgument(f"GGUF file {c.path!r}: key {key!r} has unknown value type {vtype}")


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = os.fspath(path)
    try:
        f = open(p, "rb")
    except FileNotFoundError:
        raise InvalidArgument(f"GGUF file {p!r} does not exist") from None
    with f:
        try:
            buf: mmap.mmap | bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            buf = b""
        c = _Cursor(buf, p)
        if bytes(c.take(4)) != b"GGUF":
            raise InvalidArgument(f"{p!r} is not a GGUF file (no GGUF magic)")
        version = c.unpack("<I")
        if version not in (2, 3):
            raise InvalidArgument(f"GGUF file {p!r} has version {version}; versions 2 and 3 are read")
        c.unpack("<Q")  # tensor count: tensors are not read here
        n_kv = c.unpack("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            meta[key] = _value(c, c.unpack("<I"), key)
        return meta
