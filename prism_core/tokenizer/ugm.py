"""Unigram tokenization (``tokenizer.ggml.model = t5``), as llama.cpp's UGM session: normalise with
the vocabulary's precompiled character map (SentencePiece's XOR-compressed double array of
replacement strings), escape and merge spaces, then pick by Viterbi the segmentation of highest
total score (user-defined tokens score 0; a codepoint no token covers is the unknown token at the
lowest normal score minus 10, and runs of unknowns fuse). All offsets are UTF-8 bytes, as there.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument
from .spm import SPACE
from .vocab import ATTR_NORMAL, ATTR_UNUSED, ATTR_USER_DEFINED, Vocab

_KEY = "tokenizer.ggml.precompiled_charsmap"
_ESCAPED = SPACE.encode()
_MISSING = object()


def _utf8_len(b: int) -> int:
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[b >> 4]


class _CharsMap:
    def __init__(self, blob: bytes) -> None:
        if len(blob) < 4:
            raise InvalidArgument(f"{_KEY} has {len(blob)} bytes: too small for its 4-byte header")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob) or size % 4:
            raise InvalidArgument(f"{_KEY}: its double array of {size} bytes does not fit in {len(blob)} bytes")
        self.array = np.frombuffer(blob[4:4 + size], dtype="<u4").tolist()
        self.replacements = blob[4 + size:]

    def _node(self, i: int) -> int:
        if i >= len(self.array):
            raise InvalidArgument(f"{_KEY}: index {i} out of its double array ({len(self.array)} entries)")
        return self.array[i]

    def _base(self, i: int) -> int:
        n = self._node(i)
        return (n >> 10) << ((n & (1 << 9)) >> 6)

    def longest(self, text: bytes, start: int) -> tuple[int, bytes]:
        """(length of the longest prefix of text[start:] with a replacement, the replacement) or (0, b"")."""
        best_len, best_at = 0, 0
        node = self._base(0)
        for p in range(start, len(text)):
            c = text[p]
            if c == 0:
                break
            node ^= c
            packed = self._node(node)
            if packed & ((1 << 31) | 0xFF) != c:
                break
            leaf = (packed >> 8) & 1
            node ^= self._base(node)
            if leaf:
                best_len, best_at = p - start + 1, self._node(node) & ((1 << 31) - 1)
        if not best_len:
            return 0, b""
        end = self.replacements.find(b"\0", best_at)
        if best_at >= len(self.replacements) or end < 0:
            raise InvalidArgument(f"{_KEY}: replacement at {best_at} is out of bounds or not terminated")
        return best_len, self.replacements[best_at:end]


class UgmModel:
    def __init__(self, vocab: Vocab, charsmap: bytes | None) -> None:
        self.vocab = vocab
        self.charsmap = _CharsMap(charsmap) if charsmap else None
        normal = [float(s) for s, a in zip(vocab.scores, vocab.attrs) if a & ATTR_NORMAL]
        lowest = np.float32(min(normal)) if normal else np.float32(np.finfo(np.float32).max)
        self.unknown_score = float(lowest - np.float32(10.0))  # float arithmetic, as llama.cpp
        self._prefixes: dict[bytes, object] | None = None
        self._user_prefixes: set[bytes] = set()
        for t, a in zip(vocab.tokens, vocab.attrs):
            if a & ATTR_USER_DEFINED:
                raw = t.encode("utf-8", errors="surrogateescape")
                self._user_prefixes.update(raw[:k] for k in range(1, len(raw) + 1))

    def _token_prefixes(self) -> dict[bytes, object]:
        """Every prefix of every matchable token -> its id if it is one (later ids win), else _MISSING.
        Built on first use (a few hundred thousand entries for a large vocabulary)."""
        if self._prefixes is None:
            d: dict[bytes, object] = {}
            for i, (t, a) in enumerate(zip(self.vocab.tokens, self.vocab.attrs)):
                if a & (ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED):
                    raw = t.encode("utf-8", errors="surrogateescape")
                    for k in range(1, len(raw)):
                        d.setdefault(raw[:k], _MISSING)
                    d[raw] = i
            self._prefixes = d
        return self._prefixes

    def normalize(self, text: bytes) -> bytes:
        v = self.vocab
        space = _ESCAPED if v.escape_whitespaces else b" "
        prepend = v.add_space_prefix and not v.treat_whitespace_as_suffix
        append = v.add_space_prefix and v.treat_whitespace_as_suffix
        merge = v.remove_extra_whitespaces
        out = bytearray()
        prepended = in_word = False
        pos, n = 0, len(text)
        while pos < n:
            chunk, used = self._normalize_prefix(text, pos)
            for c in chunk:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (prepend and not prepended) or merge:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not merge:
                        out += space
            pos += used
        if append:
            out += space
        return bytes(out)

    def _normalize_prefix(self, text: bytes, pos: int) -> tuple[bytes, int]:
        # a prefix of a user-defined token passes unchanged (llama.cpp walks its trie as far as it matches)
        k = 0
        while pos + k < len(text) and text[pos:pos + k + 1] in self._user_prefixes:
            k += 1
        if k:
            return text[pos:pos + k], k
        if self.charsmap is not None:
            length, repl = self.charsmap.longest(text, pos)
            if length:
                return repl, length
        n = min(_utf8_len(text[pos]), len(text) - pos)
        return text[pos:pos + n], n

    def encode(self, text: str, out: list[int]) -> None:
        s = self.normalize(text.encode("utf-8", errors="surrogateescape"))
        n = len(s)
        if not n:
            return
        v = self.vocab
        unk = v.unk
        if unk is None:
            raise InvalidArgument("a UGM vocabulary needs tokenizer.ggml.unknown_token_id")
        prefixes, scores, attrs = self._token_prefixes(), v.scores, v.attrs
        best_id = [unk] * (n + 1)
        best_from = [0] * (n + 1)
        best_score = [-np.finfo(np.float64).max] * (n + 1)
        best_score[0] = 0.0
        pos = 0
        while pos < n:
            units = min(_utf8_len(s[pos]), n - pos)
            here = best_score[pos]
            whole = False
            end = pos + 1
            while end <= n:
                tid = prefixes.get(s[pos:end], None)
                if tid is None:
                    break
                if tid is not _MISSING:
                    if end - pos == units:
                        whole = True
                    score = here + (0.0 if attrs[tid] & ATTR_USER_DEFINED else float(scores[tid]))
                    if score > best_score[end]:
                        best_id[end], best_from[end], best_score[end] = tid, pos, score
                end += 1
            if not whole:
                score = here + self.unknown_score
                if score > best_score[pos + units]:
                    best_id[pos + units], best_from[pos + units], best_score[pos + units] = unk, pos, score
            pos += units
        ids: list[int] = []
        at, prev_unknown = n, False
        while True:
            tid = best_id[at]
            is_unknown = tid == unk
            if not (prev_unknown and is_unknown):
                ids.append(tid)
            if best_from[at] == 0:
                break
            prev_unknown = is_unknown
            at = best_from[at]
        ids.reverse()
        out.extend(ids)
