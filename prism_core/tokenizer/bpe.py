"""Byte-pair encoding (``tokenizer.ggml.model = gpt2`` and ``gemma4``), as llama.cpp's BPE session:
pre-tokenize into words, map each word's bytes to GPT-2's printable characters (not for gemma4,
whose tokens are raw UTF-8 with ``▁`` for spaces), merge the adjacent pair of lowest merge rank
(ties: the leftmost) until none is left, and look the pieces up (a piece that is no token falls
back to its single bytes' tokens, silently dropping those the vocabulary lacks, as llama.cpp).
The merge queue (:mod:`.merge_queue`) keeps each word linear-logarithmic, and a cache makes repeated
words one lookup."""

from __future__ import annotations

from .merge_queue import merge
from .pretokenize import make_splitter
from .token_table import Lookups
from .vocab import Vocab


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_LATIN1_TO_GPT2 = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    return word.encode("utf-8", errors="surrogateescape").decode("latin-1").translate(_LATIN1_TO_GPT2)


class BpeModel:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.split = make_splitter(vocab.pre)
        self.ranks = vocab.merges
        self.token_to_id = vocab.token_to_id
        self._cache: dict[str, list[int]] = {}
        self._newline_runs_whole = vocab.pre == "gemma4"
        self._lookup = Lookups(vocab.token_to_id)
        # above any merged piece's length: merge "a b" joins pieces of len("a b") - 1 characters
        self._span = max((len(m) for m in self.ranks), default=1) + 1
        self.heap_ops = 0  # heap pushes and pops so far: the merge work, counted (tests check its growth)

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        encode_bytes = self.vocab.byte_encode
        for word in self.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(byte_encode(word) if encode_bytes else word)
                if len(cache) < 1 << 18:
                    cache[word] = ids
            out.extend(ids)

    def _encode_word(self, word: str) -> list[int]:
        ids = self.token_to_id
        v = self.vocab
        if (v.ignore_merges or (self._newline_runs_whole and not word.strip("\n"))) and word in ids:
            return [ids[word]]
        return self._ids(self._merge(word))

    def _pair_rank(self, a: str, b: str) -> int | None:
        return self.ranks.get(f"{a} {b}")

    def _merge(self, word: str) -> list[str]:
        pieces, ops = merge(word, self._pair_rank, self._span)
        self.heap_ops += ops
        return pieces

    def _ids(self, pieces: list[str]) -> list[int]:
        lookup = self._lookup
        out = []
        for p in pieces:
            tid = lookup(p)
            if tid is not None:
                out.append(tid)
                continue
            for b in p.encode("utf-8", errors="surrogateescape"):
                key = chr(b) if b < 0x80 else bytes([b]).decode("utf-8", errors="surrogateescape")
                if not self.vocab.byte_encode:
                    key = f"<0x{b:02X}>"
                tid = lookup(key)
                if tid is not None:
                    out.append(tid)
        return out
