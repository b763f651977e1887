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
        ids, scores = self.token_to_id, self.scores
        n = len(text)
        pieces = list(text)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            cat = pieces[left] + pieces[right]
            tid = ids.get(cat)
            if tid is not None:
                heap.append((-scores[tid], left, right, len(cat)))

        for i in range(n - 1):
            push(i, i + 1)
        heapq.heapify(heap)

        def push_heap(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            cat = pieces[left] + pieces[right]
            tid = ids.get(cat)
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, len(cat)))

        while heap:
            _, left, right, size = heapq.heappop(heap)
            lp, rp = pieces[left], pieces[right]
            if not lp or not rp or len(lp) + len(rp) != size:
                continue
            pieces[left] = lp + rp
            pieces[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push_heap(prv[left], left)
            push_heap(left, nxt[left])

        out: list[int] = []
        i = 0
        while i != -1:
            p = pieces[i]
            tid = ids.get(p)
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
