"""The walk over weight rows of 32-value blocks that the integer path's formats share (:mod:`._jit_qdot`'s Q4_0,
Q5_0, Q8_0; :mod:`._jit_qdot_table`'s IQ4_NL, MXFP4): chunks of eight blocks, then of two (vector code), then the
odd last block in scalar code, added in that order, so that every (rows, cols) form does the same float32
operations per product."""

from __future__ import annotations

import numpy as np
from numba import njit

_OPTS = dict(cache=False, fastmath=False, error_model="numpy", nogil=True)  # compiled with _jit_qdot's kernel


def block_walk(rows: int, cols: int, pick, tail, block_bytes):
    """A function walk(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc) -> acc[r * cols + c] (zeroed first) = the
    products of the ``rows`` weight rows at bytes wo + r * ws of a with the ``cols`` activation rows at
    xo + c * nk. pick(fmt, eight, a, o, ws, xq, xc, xd, xi, nk): the rows * cols sums of fmt's vector code over
    eight blocks (eight true) or two from byte o and activation xi; tail(fmt, a, o, xq, xd, xo): one block in
    scalar code; block_bytes(fmt): a block's bytes."""
    n = rows * cols

    @njit(**_OPTS)
    def walk(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc):
        bs = block_bytes(fmt)
        for i in range(n):
            acc[i] = np.float32(0.0)
        nb = nk // 32
        ib = 0
        while ib + 2 <= nb:
            eight = ib + 8 <= nb
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
