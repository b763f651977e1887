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
    scaled product), the per-row arithmetic of _jit_qdot's block_dot; with each super-block, the same bytes of the row
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


def row_run(walk, rows: int):
    """A function run(fmt, a, wo, ws, g, xq, xc, xd, xb, xo, nk, acc, orow, m): orow[m + r] for r < g = the
    products of the g weight rows at bytes wo + r * ws of a (rows m.. of their matrix) with the one activation
    row at xo, ``rows`` at a time by walk (into acc[0:rows], prefetching the rows PASSES_AHEAD passes ahead),
    inlined, so that one call serves a task's rows (a call per row, with the arrays passed and
    reference-counted, cost as much as the vector code at 2048 values a row). Only one format's code is in the
    loop, and one walk: the last g % rows rows are taken in the pass over the ``rows`` rows that ends with them
    (the rows before them read again, their products the same bits), or where the matrix has fewer rows one
    at a time, as a pass over the same row ``rows`` times (stride 0). Every product has the arithmetic of a
    walk of one row: a second, one-row walk per format would cost compile time and gain nothing at run time."""
    @njit(**_OPTS)
    def run(fmt, a, wo, ws, g, xq, xc, xd, xb, xo, nk, acc, orow, m):
        r = 0
        while r < g:
            if r + rows <= g:
                first, stride, new = r, ws, rows
            elif m + g >= rows:
                first, stride, new = g - rows, ws, g - r
            else:
                first, stride, new = r, 0, 1
            walk(fmt, a, wo + first * ws, stride, xq, xc, xd, xb, xo, nk, acc)
            for i in range(new):
                orow[m + r + i] = acc[r + i - first]
            r += new
    return run


def by_format(table: dict):
    """A function f(fmt, *args) = table[fmt](fmt, *args) (fmt: a ggml type id among the table's keys; the last
    one for any other): the choice of format made once, outside the functions' loops.

    One function whose branches call every table entry, written out for the table (not a chain of functions
    that each choose among one entry and the rest): numba optimizes each function's module again with all the
    code it calls linked in, so a chain of n functions optimized each entry's code up to n times (a chain
    over _jit_qdot's 13 formats cost 20 s of compile CPU, this one function a fraction of that)."""
    names = {f"fn{i}": fn for i, fn in enumerate(table.values())}
    branches = "".join(f"    if fmt == {int(fmt)}:\n        return fn{i}(fmt, *args)\n"
                       for i, fmt in enumerate(list(table)[:-1]))
    source = f"def pick(fmt, *args):\n{branches}    return fn{len(table) - 1}(fmt, *args)\n"
    exec(compile(source, f"<by_format of {len(table)} formats>", "exec"), names)
    return njit(**_OPTS)(names["pick"])
