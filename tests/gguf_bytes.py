"""A byte-level GGUF builder for tests: writes exactly the fields it is given (valid or not)
and records where each one starts, so a test can name the offset an error must report.
Independent of Prism's writer (struct only), following the layout of ggml-semantics.md §7."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_CODES = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
          U64: "<Q", I64: "<q", F64: "<d"}


class Raw(bytes):
    """Value bytes written as they are (a malformed value, a bogus length)."""


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def val(t: int, v) -> bytes:
    """The encoding of a value of type t (arrays: v = (item type, items))."""
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(val(et, x) for x in items)
    return struct.pack(_CODES[t], v)


@dataclass
class Built:
    data: bytes
    at: dict[str, int] = field(default_factory=dict)  # field name -> byte offset

    def with_u64(self, name: str, value: int, skip: int = 0) -> Built:
        """A copy with the 8 bytes at field ``name`` (+ ``skip``) set to ``value``."""
        data = bytearray(self.data)
        at = self.at[name] + skip
        data[at:at + 8] = struct.pack("<Q", value % (1 << 64))
        return Built(bytes(data), self.at)


def build(kvs=(), tensors=(), *, version=3, alignment=32, n_tensors=None, n_kv=None,
          magic=b"GGUF", data_pad=True) -> Built:
    """kvs: (key, type, value), a Raw value written as is;
    tensors: (name, ne, ggml type, offset or None for the natural one, data bytes)."""
    at: dict[str, int] = {}
    out = bytearray(magic)
    at["version"] = len(out)
    out += struct.pack("<I", version)
    at["n_tensors"] = len(out)
    out += struct.pack("<q", len(tensors) if n_tensors is None else n_tensors)
    at["n_kv"] = len(out)
    out += struct.pack("<q", len(kvs) if n_kv is None else n_kv)
    for key, t, v in kvs:
        at[f"kv:{key!s}"] = len(out)
        out += s(key)
        at[f"type:{key!s}"] = len(out)
        out += struct.pack("<I", t)
        at[f"value:{key!s}"] = len(out)
        out += v if isinstance(v, Raw) else val(t, v)
    offset = 0
    for name, ne, gt, off, blob in tensors:
        at[f"tensor:{name!s}"] = len(out)
        out += s(name)
        at[f"ndims:{name!s}"] = len(out)
        out += struct.pack("<I", len(ne))
        for j, n in enumerate(ne):
            at[f"ne{j}:{name!s}"] = len(out)
            out += struct.pack("<Q", n % (1 << 64))
        at[f"ggmltype:{name!s}"] = len(out)
        out += struct.pack("<I", gt)
        at[f"offset:{name!s}"] = len(out)
        out += struct.pack("<Q", offset if off is None else off)
        offset += (len(blob) + alignment - 1) // alignment * alignment
    if tensors and data_pad:
        out += bytes(-len(out) % alignment)
    at["data"] = len(out)
    for i, (_, _, _, _, blob) in enumerate(tensors):
        out += blob
        if i + 1 < len(tensors):
            out += bytes(-len(blob) % alignment)
    return Built(bytes(out), at)
