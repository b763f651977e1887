"""The integer path of the code-book formats IQ4_NL, IQ4_XS and MXFP4 (this module imports numba): the weight-row
walks that :mod:`._jit_qdot` calls for them (its activations: Q8_0 for IQ4_NL and MXFP4, Q8_K for IQ4_XS, as
ggml's ``vec_dot_type``), on the vector code of :mod:`._qvec_table`. The arithmetic is ggml's
(``ggml_vec_dot_iq4_nl_q8_0``, ``ggml_vec_dot_mxfp4_q8_0``, ``ggml_vec_dot_iq4_xs_q8_K``): per 32-value block the
exact integer sum of code-book values times activations, scaled by the weight's scale times the activations'
(MXFP4: 2**(e - 128), the code book holding e2m1 values doubled); IQ4_XS's per super-block, its integer
sub-block scales applied to the integer sums. As for the other formats, each product is the same float32
operations whichever of the 1 x 1, rows x 1 and rows x cols forms computes it (batch invariance).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from . import _qvec as V
from . import _qvec_table as T
from ._jit_quant import E8M0_HALF, IQ4_NL, IQ4_XS, MXFP4
from ._jit_qwalk import AHEAD, block_walk, chunk_pick, row_run, superblock_rows

_OPTS = dict(cache=False, fastmath=False, error_model="numpy", nogil=True)  # as _jit_qdot's (compiled with it)

#: (ggml type id, what the vector code's weight bytes are raised by: the activations' lane offset)
INT_PATH = ((IQ4_NL, T.BIAS["IQ4_NL"]), (IQ4_XS, T.BIAS["IQ4_NL"]), (MXFP4, T.BIAS["MXFP4"]))
_IQ4NL_BOOK = np.array(T.CODE_BOOKS["IQ4_NL"], np.int64)
_MXFP4_BOOK = np.array(T.CODE_BOOKS["MXFP4"], np.int64)
_IQ4_XS_BYTES = 136


@njit(inline="always", **_OPTS)
def is_table(fmt):
    return fmt == IQ4_NL or fmt == IQ4_XS or fmt == MXFP4


@njit(**_OPTS)
def _block_tail(fmt, a, o, xq, xd, xo):
    """One 32-value IQ4_NL or MXFP4 block (the odd last one of a row) in scalar code: the same integer sum,
    scaled as _qvec.legacy_chunk scales a block (the weight's scale times the activations', then the sum)."""
    s = np.int64(0)
    book = _IQ4NL_BOOK if fmt == IQ4_NL else _MXFP4_BOOK
    q = o + 2 if fmt == IQ4_NL else o + 1
    for j in range(16):
        v = V.byte_at(a, q + j)
        s += book[v & 0xF] * np.int64(xq[xo + j]) + book[v >> 4] * np.int64(xq[xo + 16 + j])
    scale = V.half_at(a, o) if fmt == IQ4_NL else E8M0_HALF[V.byte_at(a, o)]
    return scale * xd[xo // 32] * np.float32(s)


@njit(inline="always", **_OPTS)
def _block_bytes(fmt):
    return 18 if fmt == IQ4_NL else 17


@functools.cache
def _chunks(rows: int, cols: int) -> tuple:
    """(IQ4_NL's chunk of eight blocks, of two, MXFP4's of eight, of two) for rows x cols."""
    return tuple(T.chunk(f, p, rows, cols) for f in ("IQ4_NL", "MXFP4") for p in (4, 1))


def _walk(rows: int, cols: int, chunks: tuple):
    """_jit_qwalk.block_walk of IQ4_NL and MXFP4."""
    nl8, nl2, mx8, mx2 = chunks

    @njit(inline="always", **_OPTS)
    def pick(fmt, eight, a, o, ws, xq, xc, xd, xi, nk):
        if fmt == IQ4_NL:
            return nl8(a, o, ws, xq, xc, xd, xi, nk) if eight else nl2(a, o, ws, xq, xc, xd, xi, nk)
        return mx8(a, o, ws, xq, xc, xd, xi, nk) if eight else mx2(a, o, ws, xq, xc, xd, xi, nk)
    return block_walk(rows, cols, pick, _block_tail, _block_bytes)


_XS_1, _XS_4 = T.iq4_xs_superblocks(1), T.iq4_xs_superblocks(4)


@njit(**_OPTS)
def _iq4_xs_dots(a, w, xq, xc, xd, xo, nk, acc):
    """acc[0:4] = the products of the IQ4_XS weight row at byte w of a with the 4 activation rows at xo + c * nk:
    per super-block the weight's d times the activations' d times the exact integer sum."""
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for ib in range(nk // 256):
        o = w + ib * _IQ4_XS_BYTES
        xi = xo + 256 * ib
        h = V.half_at(a, o)
        i0, i1, i2, i3 = _XS_4(a, o, xq, xc, xi, nk)
        s0 += xd[xi // 256] * h * np.float32(i0)
        s1 += xd[(xi + nk) // 256] * h * np.float32(i1)
        s2 += xd[(xi + 2 * nk) // 256] * h * np.float32(i2)
        s3 += xd[(xi + 3 * nk) // 256] * h * np.float32(i3)
    acc[0], acc[1], acc[2], acc[3] = s0, s1, s2, s3


def block_dot(rows: int, cols: int):
    """block_dot of these formats with _jit_qdot's signature and meaning, for its ROWS weight rows and COLS (4)
    activation rows per call (one activation row's products are runs(rows)'s)."""
    assert cols == 4, "the IQ4_XS form takes four activation rows"
    walk_block = _walk(rows, cols, _chunks(rows, cols))

    @njit(**_OPTS)
    def block(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc):
        if fmt == IQ4_XS:
            for r in range(rows - 1, -1, -1):  # the last row first: acc[r * cols:] is written after acc[0:4] is read
                _iq4_xs_dots(a, wo + r * ws, xq, xc, xd, xo, nk, acc)
                for c in range(cols):
                    acc[r * cols + c] = acc[c]
        else:
            walk_block(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc)
    return block


@njit(inline="always", **_OPTS)
def _iq4_xs_one(a, o, xq, xc, xb, xd, xi, nk):
    return xd[xi // 256] * V.half_at(a, o) * np.float32(_XS_1(a, o, xq, xc, xi, nk))


def runs(rows: int) -> dict:
    """{ggml type id: _jit_qwalk.row_run of it} for these formats, ``rows`` weight rows a pass (the arithmetic of
    block_dot's products)."""
    out = {IQ4_XS: row_run(superblock_rows(_iq4_xs_one, rows, _IQ4_XS_BYTES, AHEAD), rows)}
    for fmt, i in ((IQ4_NL, 0), (MXFP4, 2)):
        out[fmt] = row_run(block_walk(rows, 1, chunk_pick(*_chunks(rows, 1)[i:i + 2]), _block_tail, _block_bytes,
                                      inline=True, ahead=AHEAD), rows)
    return out
