"""The merge queue of SPM and BPE, as llama.cpp's tokenizer sessions run it.

Start from a chunk's characters and repeatedly merge the adjacent pair of best rank (SPM: the
highest-scoring token, BPE: the lowest merge rank; ties: the leftmost) until no pair has one. Each
merge queues at most two new pairs and a stale entry is skipped when popped, so n characters cost at
most 6n heap operations: O(n log n) however long a text runs without a cut. An entry is one int packing
(rank, left, size), which the heap compares far faster than a tuple; size, the pair's length, tells a
stale entry, since any merge touching either side of it changes that length.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


def merge(text: str, rank_of: Callable[[str, str], int | None], span: int) -> tuple[list[str], int]:
    """The pieces ``text`` merges into, in order, and the heap operations it took. ``rank_of(a, b)``:
    the rank of merging pieces a and b (lower first), None when they do not merge; ``span``: more than
    any merged piece's length."""
    n = len(text)
    if n < 2:
        return [text] if text else [], 0
    width = n
    pieces = list(text)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        r = rank_of(text[i], text[i + 1])
        if r is not None:
            heap.append((r * width + i) * span + 2)
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
            r = rank_of(cat, pieces[after])
            if r is not None:
                push(heap, (r * width + left) * span + size + len(pieces[after]))
                ops += 1
        before = prv[left]
        if before >= 0:
            r = rank_of(pieces[before], cat)
            if r is not None:
                push(heap, (r * width + before) * span + size + len(pieces[before]))
                ops += 1
    return [p for p in pieces if p], ops
