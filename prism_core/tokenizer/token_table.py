"""A vocabulary's token texts in one UTF-8 buffer, with a hash index from text to id.

Gemma 3's 262,144 tokens as a ``list[str]`` and a ``dict[str, int]`` hold about 50 MB of Python
objects; here they take about 5 MB (the bytes, and per token a 4-byte offset, hash and id),
and a GGUF vocabulary is read straight from the file's string array without decoding it. Texts are
decoded on access (GGUF strings that are not UTF-8 come back with surrogates, as
:func:`prism_core.gguf.format.decode_text` gives them).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

import numpy as np


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _hash32(b: bytes) -> int:
    """32 bits of the text's hash: collisions only cost a byte comparison, and the index half the memory."""
    return hash(b) & 0xFFFFFFFF


_OFFSET_CODES = {"I": np.uint32, "q": np.int64}
_CHUNK = 8192  # strings per step of reading a GGUF array


def _offsets(total: int) -> array:
    return array("I" if total < 1 << 32 else "q", [0])


class TokenTable(Sequence[str]):
    """Token ``i``'s text is ``data[starts[i]:starts[i + 1]]``; :attr:`index` maps text to id."""

    def __init__(self, data: bytes, starts: array) -> None:
        if starts.typecode not in _OFFSET_CODES or len(starts) < 1 or starts[0] != 0 or starts[-1] != len(data):
            raise ValueError("TokenTable: starts must be an array('I' or 'q') from 0 to len(data)")
        self._data, self._starts = data, starts
        n = len(starts) - 1
        hashes = np.fromiter((_hash32(data[starts[i]:starts[i + 1]]) for i in range(n)), np.uint32, n)
        order = np.argsort(hashes, kind="stable")  # equal hashes keep id order: the last match is the last id
        self._hashes = array("I", hashes[order].tobytes())
        self._order = array("i", order.astype(np.int32).tobytes())
        self.index = TokenIndex(self)

    @classmethod
    def from_strings(cls, texts: Iterable[str]) -> TokenTable:
        parts = [_utf8(t) for t in texts]
        starts = _offsets(sum(len(p) for p in parts))
        total = 0
        for p in parts:
            total += len(p)
            starts.append(total)
        return cls(b"".join(parts), starts)

    @classmethod
    def from_gguf_strings(cls, buf: memoryview | bytes, start: int, lengths: array) -> TokenTable:
        """GGUF strings (u64 length, then the bytes) from ``start`` of ``buf``, with their ``lengths``
        as the reader found and bounds-checked them: one copy of the texts, without the length prefixes
        and without building a str per token."""
        lens = np.frombuffer(lengths, _OFFSET_CODES[lengths.typecode])
        parts, pos = [], start
        for lo in range(0, len(lens), _CHUNK):  # chunk by chunk: no temporary spans the whole array
            n = lens[lo:lo + _CHUNK].astype(np.int64)
            span = int(n.sum()) + 8 * len(n)
            keep = np.ones(span, bool)
            prefixes = np.cumsum(n + 8) - n - 8
            for k in range(8):
                keep[prefixes + k] = False
            parts.append(np.frombuffer(buf, np.uint8, span, pos)[keep].tobytes())
            pos += span
        data = b"".join(parts)
        del parts
        starts = _offsets(len(data))
        starts.frombytes(np.cumsum(lens, dtype=_OFFSET_CODES[starts.typecode]).tobytes())
        return cls(data, starts)

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        s = self._starts
        if i < 0:
            i += len(s) - 1
        if not 0 <= i < len(s) - 1:
            raise IndexError(f"token id {i} is outside the vocabulary of {len(s) - 1}")
        return str(self._data[s[i]:s[i + 1]], "utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        data, s = self._data, self._starts
        for i in range(len(s) - 1):
            yield str(data[s[i]:s[i + 1]], "utf-8", "surrogateescape")

    def nbytes(self, i: int) -> int:
        """UTF-8 length of token ``i``."""
        return self._starts[i + 1] - self._starts[i]

    @property
    def max_nbytes(self) -> int:
        return int(np.diff(self._offset_array()).max(initial=0))

    def empty_ids(self) -> list[int]:
        return np.flatnonzero(np.diff(self._offset_array()) == 0).tolist()

    def _offset_array(self) -> np.ndarray:
        return np.frombuffer(self._starts, _OFFSET_CODES[self._starts.typecode]).astype(np.int64)

    def ids_of(self, text: str) -> list[int]:
        """Every id whose text is ``text``, in increasing order."""
        b = _utf8(text)
        h = _hash32(b)
        hashes, order, data, s = self._hashes, self._order, self._data, self._starts
        out = []
        k = bisect_left(hashes, h)
        while k < len(hashes) and hashes[k] == h:
            i = order[k]
            if s[i + 1] - s[i] == len(b) and data[s[i]:s[i + 1]] == b:
                out.append(i)
            k += 1
        return out

    def chars_before(self, mark: str) -> set[str]:
        """The characters (other than NUL) that directly precede ``mark`` inside some token."""
        data, s = self._data, self._starts
        out = set()
        for m in re.finditer(re.escape(_utf8(mark)), data):
            p = m.start()
            first = s[bisect_right(s, p) - 1]
            if p > first:
                out.add(str(data[first:p], "utf-8", "surrogateescape")[-1])
        out.discard("\0")
        return out


class TokenIndex(Mapping[str, int]):
    """Text -> id over a :class:`TokenTable`; a text held by several tokens maps to the last of them
    (as llama.cpp's token map, filled in id order)."""

    def __init__(self, table: TokenTable) -> None:
        self._table = table

    def __getitem__(self, text: str) -> int:
        if not isinstance(text, str):
            raise KeyError(text)
        ids = self._table.ids_of(text)
        if not ids:
            raise KeyError(text)
        return ids[-1]

    def get(self, text: str, default: int | None = None) -> int | None:
        ids = self._table.ids_of(text) if isinstance(text, str) else None
        return ids[-1] if ids else default

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and bool(self._table.ids_of(text))

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for t in self._table:
            if t not in seen:
                seen.add(t)
                yield t

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Lookups:
    """Text -> id (or None) over a token index, remembering up to ``limit`` answers. The merge loops
    ask about the same few thousand candidate pieces again and again on a long text, and each
    :class:`TokenIndex` lookup costs a UTF-8 encoding, a hash and a bisect; a dict hit is a fraction
    of that. Bounded, so an adversarial text costs memory no more than the limit."""

    def __init__(self, index: Mapping[str, int], limit: int = 1 << 16) -> None:
        self.index = index
        self.limit = limit
        self.known: dict[str, int | None] = {}

    def __call__(self, text: str) -> int | None:
        known = self.known
        try:
            return known[text]
        except KeyError:
            pass
        tid = self.index.get(text)
        if len(known) < self.limit:
            known[text] = tid
        return tid
