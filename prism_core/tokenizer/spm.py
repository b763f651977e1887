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

import heapq
import re
from array import array

import numpy as np

from ..errors import InvalidArgument
from .token_table import Lookups
from .vocab import Vocab

SPACE = "\u2581"


class SpmModel:
    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.token_to_id = vocab.token_to_id
        self.scores = array("f", vocab.scores.astype(np.float32).tobytes())  # float, as llama.cpp's scores
        glue = vocab.tokens.chars_before(SPACE)  # characters a token holds right before a space mark
        if glue:
            cls = "".join(re.escape(c) for c in sorted(glue))
            self._cut = re.compile(f"(?<=[^{cls}])(?={SPACE})")
        else:
            self._cut = re.compile(f"(?={SPACE})")
        self._byte_ids = [self._byte_token(b) for b in range(256)]
        self._cache: dict[str, list[int]] = {}
        self._lookup = Lookups(vocab.token_to_id)
        # the queue's order: by score, highest first (equal float scores share a rank), as llama.cpp's
        distinct = np.unique(vocab.scores.astype(np.float32))
        self._rank = (len(distinct) - 1 - np.searchsorted(distinct, vocab.scores.astype(np.float32))).tolist()
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

    def _encode_chunk(self, text: str) -> list[int]:
        # One merge queue over the chunk, as llama.cpp's: candidate pairs ordered by score, then
        # leftmost. Each merge queues at most two pairs, so a chunk of n characters costs at most 3n
        # heap operations: O(n log n) however long the text runs without a cut. An entry is one int,
        # (score rank, left, size) packed, which the heap compares far faster than a tuple; size (the
        # pair's length) tells a stale entry: any merge touching either side changes it.
        lookup, rank = self._lookup, self._rank
        n = len(text)
        width, span = n, self._span
        pieces = list(text)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            tid = lookup(text[i:i + 2])
            if tid is not None:
                heap.append((rank[tid] * width + i) * span + 2)
        heapq.heapify(heap)
        ops = len(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            key, size = divmod(pop(heap), span)
            left = key % width
            ops += 1
            right = nxt[left]
            lp = pieces[left]
            if not lp or right < 0 or len(lp) + len(pieces[right]) != size:
                continue  # stale: one side was merged since this pair was queued
            cat = pieces[left] = lp + pieces[right]
            pieces[right] = ""
            after = nxt[left] = nxt[right]
            if after >= 0:
                prv[after] = left
                tid = lookup(cat + pieces[after])
                if tid is not None:
                    push(heap, (rank[tid] * width + left) * span + size + len(pieces[after]))
                    ops += 1
            before = prv[left]
            if before >= 0:
                tid = lookup(pieces[before] + cat)
                if tid is not None:
                    push(heap, (rank[tid] * width + before) * span + size + len(pieces[before]))
                    ops += 1
        self.heap_ops += ops

        out: list[int] = []
        i = 0
        while i != -1:
            p = pieces[i]
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
            i = nxt[i]
        return out
