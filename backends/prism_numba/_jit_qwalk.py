"""The walks over weight rows that the integer path's formats share: the walk over rows of 32-value blocks
(:mod:`._jit_qdot`'s Q4_0, Q5_0, Q8_0, Q4_1, Q5_1; :mod:`._jit_qdot_table`'s IQ4_NL, MXFP4): chunks of eight blocks,
then of two (vector code), then the odd last block in scalar code, added in that order, so that every (rows, cols)
form does the same float32 operations per product; and the run of one activation row over many weight rows."""

from __future__ import annotations

import numpy as np
from numba import njit

from . import _qvec as V

_OPTS = dict(cache=False, fastmath=False, error_model="numpy", nogil=True)  # compiled with _jit_qdot's kernel

#: a run's walks prefetch the weight rows this many passes of four rows ahead (AHEAD rows), a few lines with
#: each chunk of blocks: four
#: interleaved rows are short streams that the hardware prefetchers follow poorly from memory (csimd's
#: kernels prefetch three passes ahead for the same reason)
PASSES_AHEAD = 3
AHEAD = 4 * PASSES_AHEAD


def block_walk(rows: int, cols: int, pick, tail, block_bytes, inline: bool = False, ahead: int = 0):
    """A function walk(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc) -> acc[r * cols + c] (zeroed first) = the
    products of the ``rows`` weight rows at bytes wo + r * ws of a with the ``cols`` activation rows at
    xo + c * nk. pick(fmt, eight, a, o, ws, xq, xc, xd, xi, nk): the rows * cols sums of fmt's vector code over
    eight blocks (eight true) or two from byte o and activation xi; tail(fmt, a, o, xq, xd, xo): one block in
    scalar code; block_bytes(fmt): a block's bytes. inline: the walk is inlined where it is called (a run's
    walk of one format: no call per row). ahead: with each chunk, the same bytes of the rows this many rows
    further on are prefetched (a run's: spread over the walk, not in one burst per pass)."""
    n = rows * cols

    @njit(inline="always" if inline else "never", **_OPTS)
    def walk(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc):
        bs = block_bytes(fmt)
        for i in range(n):
            acc[i] = np.float32(0.0)
        nb = nk // 32
        ib = 0
        while ib + 2 <= nb:
            eight = ib + 8 <= nb
            if ahead:
                for r in range(rows):
                    p0 = wo + (r + ahead) * ws + ib * bs
                    for p in range(p0, p0 + (8 if eight else 2) * bs, 64):
                        V.prefetch(a, p)
            t = pick(fmt, eight, a, wo + ib * bs, ws, xq, xc, xd, xo + 32 * ib, nk)
            for i in range(n):
                acc[i] += t[i]
            ib += 8 if eight else 2
        if ib < nb:
            o = wo + ib * bs
            for r in range(rows):
                for c in range(cols):
                    acc[r * cols + c] += tail(fmt, a, o + r * ws, xq, xd, xo + c * nk + 32 * ib)
    return walk


def chunk_pick(eight_chunk, two_chunk):
    """block_walk's pick for one format, from its chunks of eight and of two blocks (_qvec.legacy_chunk's
    signature)."""
    @njit(inline="always", **_OPTS)
    def pick(fmt, eight, a, o, ws, xq, xc, xd, xi, nk):
        return eight_chunk(a, o, ws, xq, xc, xd, xi, nk) if eight else two_chunk(a, o, ws, xq, xc, xd, xi, nk)
    return pick


def superblock_rows(one, rows: int, block_bytes: int, ahead: int):
    """An inlined walk(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc) -> acc[r] = the products of the ``rows``
    weight rows at bytes wo + r * ws of a, super-blocks of block_bytes bytes, with the activation row at xo:
    per row the float32 sum, in super-block order, of one(a, o, xq, xc, xb, xd, xi, nk) (a super-block's
    scaled product), the arithmetic of _jit_qdot's row_dot; with each super-block, the same bytes of the row
    ``ahead`` rows further on prefetched."""
    @njit(inline="always", **_OPTS)
    def walk(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc):
        for r in range(rows):
            w = wo + r * ws
            s = np.float32(0.0)
            for ib in range(nk // 256):
                for p in range(w + ahead * ws + ib * block_bytes, w + ahead * ws + (ib + 1) * block_bytes, 64):
                    V.prefetch(a, p)
                s += one(a, w + ib * block_bytes, xq, xc, xb, xd, xo + 256 * ib, nk)
            acc[r] = s
    return walk


def row_run(walk_rows, walk_row, rows: int):
    """A function run(fmt, a, wo, ws, g, xq, xc, xd, xb, xo, nk, acc, orow, m): orow[m + r] for r < g = the
    products of the g weight rows at bytes wo + r * ws of a with the one activation row at xo, ``rows`` at a
    time by walk_rows (into acc[0:rows]) and the last g % rows by walk_row (into acc[0]), as _jit_qdot's _task
    groups them (both prefetching the rows PASSES_AHEAD passes ahead); both inlined, so that one call serves a
    task's rows (a call per row, with the arrays
    passed and reference-counted, cost as much as the vector code at 2048 values a row). Only one format's
    code is in the loop."""
    @njit(**_OPTS)
    def run(fmt, a, wo, ws, g, xq, xc, xd, xb, xo, nk, acc, orow, m):
        r = 0
        while r < g:
            o = wo + r * ws
            if r + rows <= g:
                walk_rows(fmt, a, o, ws, xq, xc, xd, xb, xo, nk, acc)
                for i in range(rows):
                    orow[m + r + i] = acc[i]
                r += rows
            else:
                walk_row(fmt, a, o, ws, xq, xc, xd, xb, xo, nk, acc)
                orow[m + r] = acc[0]
                r += 1
    return run


def by_format(table: dict):
    """A function f(fmt, *args) = table[fmt](fmt, *args) (fmt: a ggml type id among the table's keys; the last
    one for any other): the choice of format made once, outside the functions' loops."""
    (fmt0, fn0), rest = next(iter(table.items())), dict(list(table.items())[1:])
    if not rest:
        @njit(**_OPTS)
        def last(fmt, *args):
            return fn0(fmt, *args)
        return last
    other = by_format(rest)

    @njit(**_OPTS)
    def pick(fmt, *args):
        if fmt == fmt0:
            return fn0(fmt, *args)
        return other(fmt, *args)
    return pick
