"""GGUF's layout constants and value types, shared by the reader and the writer.

The numbering is the format's (gguf-py's :class:`gguf.GGUFValueType`, which tests/test_gguf.py
checks it against; its members compare and hash equal to these); the bounds are ggml's reader's
(src/gguf.cpp): strings and arrays of at most 2**30 items. Declared here rather than imported:
importing ``gguf`` loads its whole package (5 MB resident, 0.1 s) for four constants.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


def is_value_type(x: object) -> bool:
    """Prism's GGUFValueType or gguf-py's (the same numbers: callers may pass either)."""
    return isinstance(x, GGUFValueType) or (type(x).__name__ == "GGUFValueType"
                                            and type(x).__module__.split(".")[0] == "gguf")


MAGIC = b"GGUF"
VERSION = 3
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
MAX_STRING_BYTES = 1 << 30
MAX_ARRAY_ITEMS = 1 << 30
MAX_KEY_BYTES = 65535

V = GGUFValueType
# Fixed-size value types: their little-endian NumPy dtype (BOOL is one byte, nonzero = true).
DTYPES: dict[GGUFValueType, np.dtype] = {
    V.UINT8: np.dtype("<u1"), V.INT8: np.dtype("<i1"), V.UINT16: np.dtype("<u2"), V.INT16: np.dtype("<i2"),
    V.UINT32: np.dtype("<u4"), V.INT32: np.dtype("<i4"), V.FLOAT32: np.dtype("<f4"), V.BOOL: np.dtype("<u1"),
    V.UINT64: np.dtype("<u8"), V.INT64: np.dtype("<i8"), V.FLOAT64: np.dtype("<f8"),
}
STRUCT_CODES: dict[GGUFValueType, str] = {
    V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
    V.FLOAT32: "<f", V.BOOL: "<B", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d",
}
INT_TYPES = frozenset({V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64})
FLOAT_TYPES = frozenset({V.FLOAT32, V.FLOAT64})

# The least bytes one item of each kind can take, to refuse counts that cannot fit in what is left.
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a one-byte key, value type, a one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length (empty name), n_dims = 0, type, offset


def pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def decode_text(raw: bytes | memoryview) -> str:
    """GGUF strings as str; bytes that are not UTF-8 survive as surrogates, so saving the
    value again writes the very same bytes."""
    return str(raw, "utf-8", "surrogateescape")


def encode_text(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")
