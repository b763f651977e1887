"""SentencePiece-style tokenization (``tokenizer.ggml.model = llama``), as llama.cpp's SPM session:
start from the text's characters, repeatedly merge the adjacent pair whose concatenation is the
highest-scoring vocabulary token (ties: the leftmost), and write any piece that is no token as
its bytes (``<0xNN>`` tokens).

llama.cpp runs one merge queue over the whole text. Here the text is cut first, before each
``▁`` whose left neighbour never precedes a ``▁`` inside any vocabulary token: no merged piece
can span such a cut, and merges on either side never interact, so the result is the same, while
the pieces repeat (words) and their results can be cached.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import InvalidArgument
from .merge_queue import merge
from .token_table import Lookups
from .vocab import Vocab

SPACE = "\u2581"


class SpmModel:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.token_to_id = vocab.token_to_id
        glue = vocab.tokens.chars_before(SPACE)  # characters a token holds right before a space mark
        if glue:
            cls = "".join(re.escape(c) for c in sorted(glue))
            self._cut = re.compile(f"(?<=[^{cls}])(?={SPACE})")
        else:
            self._cut = re.compile(f"(?={SPACE})")
        self._byte_ids = [self._byte_token(b) for b in range(256)]
        self._cache: dict[str, list[int]] = {}
        self._lookup = Lookups(vocab.token_to_id)
        # the queue's order: by score (float, as llama.cpp's), highest first; equal scores share a rank
        scores = vocab.scores.astype(np.float32)
        distinct = np.unique(scores)
        self._rank = (len(distinct) - 1 - np.searchsorted(distinct, scores)).tolist()
        self._span = vocab.tokens.max_nbytes + 1  # above any token's length in characters
        self.heap_ops = 0  # heap pushes and pops so far: the merge work, counted (tests check its growth)

    def _byte_token(self, b: int) -> int | None:
        ids = self.token_to_id
        i = ids.get(f"<0x{b:02X}>")
        if i is None and b < 0x80:
            i = ids.get(chr(b))
        return i

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for chunk in self._cut.split(text):
            if not chunk:
                continue
            ids = cache.get(chunk)
            if ids is None:
                ids = self._encode_chunk(chunk)
                if len(cache) < 1 << 18:
                    cache[chunk] = ids
            out.extend(ids)

    def _pair_rank(self, a: str, b: str) -> int | None:
        tid = self._lookup(a + b)
        return None if tid is None else self._rank[tid]

    def _encode_chunk(self, text: str) -> list[int]:
        pieces, ops = merge(text, self._pair_rank, self._span)
        self.heap_ops += ops
        lookup = self._lookup
        out: list[int] = []
        for p in pieces:
            tid = lookup(p)
            if tid is not None:
                out.append(tid)
            else:
                for b in p.encode("utf-8", errors="surrogateescape"):
                    bt = self._byte_ids[b]
                    if bt is None:
                        raise InvalidArgument(f"the vocabulary has no byte token <0x{b:02X}> for the byte fallback "
                                              f"of {p!r} (tokenizer.ggml.tokens)")
                    out.append(bt)
        return out
