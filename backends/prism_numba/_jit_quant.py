"""Compiled kernels of the block (quantized) types: decoders of ggml's block layouts, and the
products, gathers and copies built on them (this module imports numba).

A block-type tensor reaches these kernels as its ``raw()`` view, uint8 of shape
(ne3, ne2, ne1, row bytes). ``decode_row`` turns one row of blocks into float32 values with the
arithmetic of ggml's ``dequantize_row_*`` (and gguf.quants): every product and difference in
float32, in the same order, so its output is bit for bit theirs; it is compiled without fast-math
flags for that reason, and called (not inlined) by the kernels, once per weight row.

The products take the *float path*: a tile of weight rows is decoded once into a float32 buffer
that stays in the L1/L2 cache, then dotted with every activation row that needs it (eight weight
rows share each load of the activation row; float32 sums, reassociated so that they vectorise).
README.md says why this beats quantizing the activations to int8 here.

Format codes are ggml's type ids. The IQ1/IQ2/IQ3 formats have no decoder here (their lattice
grids are not ported to this backend): the wrappers dequantize them with prism_core.quant.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._fdot import dot1
from ._jit import row_index
from ._jit_fast import add_row_dots, contiguous_row

_OPTS = dict(cache=True, fastmath=False, error_model="numpy", nogil=True)

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4 = 20, 23, 34, 35, 39
#: the formats decode_row knows (ggml type ids)
DECODED = frozenset({Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
                     IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4})

# Data tables from ggml (ggml-common.h): the IQ4_NL and MXFP4 code books.
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
# MXFP4's E8M0 scale halved (ggml's GGML_E8M0_TO_FP32_HALF): 2**(e - 128) for every byte e,
# exact in float32 (the two smallest are subnormal)
E8M0_HALF = np.ldexp(np.float32(1.0), np.arange(256) - 128).astype(np.float32)
F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
POW3 = np.array([1, 3, 9, 27, 81, 243], np.int64)


@njit(inline="always", **_OPTS)
def _f16(r, o):
    """The float32 value of the little-endian fp16 at byte o of r."""
    return F16_LUT[np.int64(r[o]) | (np.int64(r[o + 1]) << 8)]


@njit(inline="always", **_OPTS)
def _u32(r, o):
    return np.int64(r[o]) | (np.int64(r[o + 1]) << 8) | (np.int64(r[o + 2]) << 16) | (np.int64(r[o + 3]) << 24)


@njit(inline="always", **_OPTS)
def _i8(v):
    """A byte read as int8 (branch-free, so that the loops around it vectorise)."""
    return (np.int64(v) ^ 128) - 128


@njit(inline="always", **_OPTS)
def _k4_scale_min(r, s, j):
    """Q4_K/Q5_K: the 6-bit scale and min of sub-block j from the 12 scale bytes at s."""
    if j < 4:
        return np.int64(r[s + j]) & 63, np.int64(r[s + j + 4]) & 63
    hi = np.int64(r[s + j + 4])
    return (hi & 0xF) | ((np.int64(r[s + j - 4]) >> 6) << 4), (hi >> 4) | ((np.int64(r[s + j]) >> 6) << 4)


@njit(inline="always", **_OPTS)
def _q3_scale(r, s, i):
    """Q3_K: sub-block i's 6-bit scale (low 4 bits from bytes 0..7, high 2 bits from bytes 8..11)."""
    k = i % 4
    hi2 = (np.int64(r[s + 8 + k]) >> (2 * (i // 4))) & 3
    lo = np.int64(r[s + (i % 8)])
    lo4 = (lo & 0xF) if i < 8 else (lo >> 4)
    return (lo4 | (hi2 << 4)) - 32


@njit(inline="always", **_OPTS)
def _nibble_codes(r, q, book, d, y, yo, w):
    """y[yo + j] = d * book[low nibble of r[q + j]], y[yo + j + 16] = d * book[its high nibble], j < w:
    the 4-bit code-book formats (IQ4_NL, IQ4_XS, MXFP4)."""
    for j in range(w):
        v = np.int64(r[q + j])
        y[yo + j] = d * book[v & 0xF]
        y[yo + j + 16] = d * book[v >> 4]


# The min of the formats that have none: adding -0.0 leaves every float32 as it is (-0.0 too), so one
# loop serves Q4_0/Q5_0 (x * d) and Q4_1/Q5_1 (x * d + m); inlined with the constant, LLVM drops the add.
NO_MIN = np.float32(-0.0)


@njit(inline="always", **_OPTS)
def _q45_block(r, q, qh, off, d, m, y, yo, w):
    """Q4_0/Q4_1/Q5_0/Q5_1, one block of 32: y[yo + j] = (x_j - off) * d + m with x_j the low nibble of byte
    q + j, y[yo + j + 16] the same with its high nibble (j < w); the Q5 formats' fifth bits come from qh
    (bit j and bit j + 16), the Q4 formats pass qh = 0."""
    for j in range(w):
        v = np.int64(r[q + j])
        x0 = (v & 0xF) | (((qh >> j) << 4) & 0x10)
        x1 = (v >> 4) | ((qh >> (j + 12)) & 0x10)
        y[yo + j] = np.float32(x0 - off) * d + m
        y[yo + j + 16] = np.float32(x1 - off) * d + m


@njit(**_OPTS)
def decode_row(fmt, r, y):
    """y[:] = the float32 values of the blocks in byte row r (ggml's dequantize_row_* order)."""
    n = y.shape[0]
    # The inner loops run to these instead of the literals 16 and 32 (n is a whole number of
    # blocks, so they are equal): with a constant trip count LLVM fully unrolls a short loop into
    # scalar code before the loop vectoriser sees it (measured: Q8_0 decodes 3.5x faster so).
    w16 = min(16, n)
    w32 = min(32, n)
    if fmt == Q8_0 or fmt == Q8_1:
        bs = 34 if fmt == Q8_0 else 36
        q0 = 2 if fmt == Q8_0 else 4
        for ib in range(n // 32):
            o = ib * bs
            d = _f16(r, o)
            for j in range(w32):
                y[ib * 32 + j] = np.float32(_i8(r[o + q0 + j])) * d
    elif fmt == Q4_0:
        for ib in range(n // 32):
            o = ib * 18
            _q45_block(r, o + 2, 0, 8, _f16(r, o), NO_MIN, y, ib * 32, w16)
    elif fmt == IQ4_NL:
        for ib in range(n // 32):
            o = ib * 18
            _nibble_codes(r, o + 2, KVALUES_IQ4NL, _f16(r, o), y, ib * 32, w16)
    elif fmt == Q4_1:
        for ib in range(n // 32):
            o = ib * 20
            _q45_block(r, o + 4, 0, 0, _f16(r, o), _f16(r, o + 2), y, ib * 32, w16)
    elif fmt == Q5_0:
        for ib in range(n // 32):
            o = ib * 22
            _q45_block(r, o + 6, _u32(r, o + 2), 16, _f16(r, o), NO_MIN, y, ib * 32, w16)
    elif fmt == Q5_1:
        for ib in range(n // 32):
            o = ib * 24
            _q45_block(r, o + 8, _u32(r, o + 4), 0, _f16(r, o), _f16(r, o + 2), y, ib * 32, w16)
    elif fmt == MXFP4:
        for ib in range(n // 32):
            o = ib * 17
            _nibble_codes(r, o + 1, KVALUES_MXFP4, E8M0_HALF[r[o]], y, ib * 32, w16)
    elif fmt == Q8_K:
        for ib in range(n // 256):
            o = ib * 292
            d = np.array([r[o], r[o + 1], r[o + 2], r[o + 3]], np.uint8).view(np.float32)[0]
            for j in range(256):
                y[ib * 256 + j] = d * np.float32(_i8(r[o + 4 + j]))
    elif fmt == Q2_K:
        for ib in range(n // 256):
            o = ib * 84
            d = _f16(r, o + 80)
            dmin = _f16(r, o + 82)
            yo = ib * 256
            for half in range(2):
                q = o + 16 + 32 * half
                for j in range(4):
                    for g in range(2):
                        sc = np.int64(r[o + half * 8 + j * 2 + g])
                        dl = d * np.float32(sc & 0xF)
                        ml = dmin * np.float32(sc >> 4)
                        yb = yo + half * 128 + j * 32 + g * 16
                        for lo in range(w16):
                            y[yb + lo] = dl * np.float32((np.int64(r[q + g * 16 + lo]) >> (2 * j)) & 3) - ml
    elif fmt == Q3_K:
        for ib in range(n // 256):
            o = ib * 110
            d = _f16(r, o + 108)
            yo = ib * 256
            for half in range(2):
                q = o + 32 + 32 * half
                for j in range(4):
                    bit = 1 << (half * 4 + j)
                    for g in range(2):
                        dl = d * np.float32(_q3_scale(r, o + 96, half * 8 + j * 2 + g))
                        yb = yo + half * 128 + j * 32 + g * 16
                        for lo in range(w16):
                            lq = g * 16 + lo
                            qv = ((np.int64(r[q + lq]) >> (2 * j)) & 3) - (0 if np.int64(r[o + lq]) & bit else 4)
                            y[yb + lo] = dl * np.float32(qv)
    elif fmt == Q4_K or fmt == Q5_K:
        bs = 144 if fmt == Q4_K else 176
        qs0 = 16 if fmt == Q4_K else 48
        for ib in range(n // 256):
            o = ib * bs
            d = _f16(r, o)
            dmin = _f16(r, o + 2)
            for j in range(4):
                sc1, m1 = _k4_scale_min(r, o + 4, 2 * j)
                sc2, m2 = _k4_scale_min(r, o + 4, 2 * j + 1)
                d1 = d * np.float32(sc1)
                mm1 = dmin * np.float32(m1)
                d2 = d * np.float32(sc2)
                mm2 = dmin * np.float32(m2)
                yo = ib * 256 + j * 64
                q = o + qs0 + 32 * j
                for lo in range(32):
                    v = np.int64(r[q + lo])
                    lo4 = v & 0xF
                    hi4 = v >> 4
                    if fmt == Q5_K:
                        h = np.int64(r[o + 16 + lo])
                        lo4 += 16 if h & (1 << (2 * j)) else 0
                        hi4 += 16 if h & (2 << (2 * j)) else 0
                    y[yo + lo] = d1 * np.float32(lo4) - mm1
                    y[yo + 32 + lo] = d2 * np.float32(hi4) - mm2
    elif fmt == Q6_K:
        for ib in range(n // 256):
            o = ib * 210
            d = _f16(r, o + 208)
            for half in range(2):
                ql = o + 64 * half
                qh = o + 128 + 32 * half
                sc = o + 192 + 8 * half
                for s in range(2):  # 16 positions share each of the four scales
                    d0 = d * np.float32(_i8(r[sc + s]))
                    d1 = d * np.float32(_i8(r[sc + s + 2]))
                    d2 = d * np.float32(_i8(r[sc + s + 4]))
                    d3 = d * np.float32(_i8(r[sc + s + 6]))
                    yo = ib * 256 + 128 * half + 16 * s
                    for lo in range(16 * s, 16 * s + 16):
                        a = np.int64(r[ql + lo])
                        b = np.int64(r[ql + lo + 32])
                        h = np.int64(r[qh + lo])
                        y[yo - 16 * s + lo] = d0 * np.float32(((a & 0xF) | ((h & 3) << 4)) - 32)
                        y[yo - 16 * s + lo + 32] = d1 * np.float32(((b & 0xF) | (((h >> 2) & 3) << 4)) - 32)
                        y[yo - 16 * s + lo + 64] = d2 * np.float32(((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                        y[yo - 16 * s + lo + 96] = d3 * np.float32(((b >> 4) | (((h >> 6) & 3) << 4)) - 32)
    elif fmt == IQ4_XS:
        for ib in range(n // 256):
            o = ib * 136
            d = _f16(r, o)
            sh = np.int64(r[o + 2]) | (np.int64(r[o + 3]) << 8)
            for s in range(8):
                ls = ((np.int64(r[o + 4 + s // 2]) >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4)
                _nibble_codes(r, o + 8 + 16 * s, KVALUES_IQ4NL, d * np.float32(ls - 32), y, ib * 256 + 32 * s, w16)
    elif fmt == TQ2_0:
        for ib in range(n // 256):
            o = ib * 66
            d = _f16(r, o + 64)
            yo = ib * 256
            for j in range(0, 64, 32):
                for lsh in range(4):
                    yb = yo + j * 4 + lsh * 32
                    for m in range(w32):
                        y[yb + m] = np.float32(((np.int64(r[o + j + m]) >> (2 * lsh)) & 3) - 1) * d
    elif fmt == TQ1_0:
        for ib in range(n // 256):
            o = ib * 54
            d = _f16(r, o + 52)
            yo = ib * 256
            for p in range(5):  # qs[0:32]: five base-3 digits per byte
                yb = yo + 32 * p
                for m in range(w32):
                    q = (np.int64(r[o + m]) * POW3[p]) & 0xFF
                    y[yb + m] = np.float32(((q * 3) >> 8) - 1) * d
            for p in range(5):  # qs[32:48]
                yb = yo + 160 + 16 * p
                for m in range(w16):
                    q = (np.int64(r[o + 32 + m]) * POW3[p]) & 0xFF
                    y[yb + m] = np.float32(((q * 3) >> 8) - 1) * d
            for p in range(4):  # qh[0:4]: four digits per byte
                for m in range(4):
                    q = (np.int64(r[o + 48 + m]) * POW3[p]) & 0xFF
                    y[yo + 240 + 4 * p + m] = np.float32(((q * 3) >> 8) - 1) * d


@njit(parallel=True, **_OPTS)
def q_dequant(fmt, a, o):
    """o[i3, i2, i1, :] = the values of block row a[i3, i2, i1] (same row counts)."""
    n3, n2, n1 = o.shape[0], o.shape[1], o.shape[2]
    for t in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(t, n1, n2)
        decode_row(fmt, a[i3, i2, i1], o[i3, i2, i1])


@njit(parallel=True, **_OPTS)
def q_get_rows(fmt, a, idx, o):
    """o[i3, i2, i1, :] = the values of a[i3, i2, idx[0, i3, i2, i1]]."""
    n3, n2, n1 = o.shape[0], o.shape[1], o.shape[2]
    for t in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(t, n1, n2)
        decode_row(fmt, a[i3, i2, idx[0, i3, i2, i1]], o[i3, i2, i1])


GROUP = 8  # weight rows decoded together; each load of an activation row serves all of them
GROUPS_PER_TASK = 4


@njit(parallel=True, **_OPTS)
def q_mul_mat(fmt, a, b, o):
    """o[i3, i2, n, m] = sum_k value(a[i3 // r3, i2 // r2, m])[k] * b[i3, i2, n, k], float32 sums.

    A task owns up to GROUP * GROUPS_PER_TASK rows of one a matrix: it decodes GROUP rows at a
    time into a float32 tile and dots the tile with every b row of every b matrix broadcast onto
    that a matrix, so each weight block is decoded once per product."""
    n3, n2, nn, nm = o.shape
    a3, a2 = a.shape[0], a.shape[1]
    nk = b.shape[3]
    r3 = n3 // a3
    r2 = n2 // a2
    rows = GROUP * GROUPS_PER_TASK
    tm = (nm + rows - 1) // rows
    for task in prange(a3 * a2 * tm):
        k3, k2, jm = row_index(task, tm, a2)
        tile = np.empty((GROUP, nk), np.float32)
        ybuf = np.empty(nk, np.float32)
        acc = np.empty(GROUP, np.float32)
        m_end = min(nm, (jm + 1) * rows)
        for m0 in range(jm * rows, m_end, GROUP):
            g = min(GROUP, m_end - m0)
            for gi in range(g):
                decode_row(fmt, a[k3, k2, m0 + gi], tile[gi])
            for i3 in range(k3 * r3, (k3 + 1) * r3):
                for i2 in range(k2 * r2, (k2 + 1) * r2):
                    for q in range(nn):
                        y = contiguous_row(b[i3, i2, q], ybuf)
                        orow = o[i3, i2, q]
                        acc[:] = 0.0  # one pass over k (no blocks: the lanes summed once per product)
                        add_row_dots(tile, 0, nk, g, y, 0, nk, nk, acc)
                        for gi in range(g):
                            orow[m0 + gi] = acc[gi]


@njit(parallel=True, **_OPTS)
def q_mul_mat_id(fmt, w, b, ids, o):
    """o[0, t, e, m] = sum_k value(w[0, ids[0, 0, t, e], m])[k] * b[0, t, e % n_b, k], float32 sums;
    one task per (token, slot), the expert's rows decoded one at a time."""
    nt, nu, nm = o.shape[1], o.shape[2], o.shape[3]
    nbb = b.shape[2]
    nk = b.shape[3]
    for r in prange(nt * nu):
        e = r % nu
        t = r // nu
        ex = ids[0, 0, t, e]
        y = contiguous_row(b[0, t, e % nbb], np.empty(nk, np.float32))
        x = np.empty(nk, np.float32)
        for m in range(nm):
            decode_row(fmt, w[0, ex, m], x)
            o[0, t, e, m] = np.float32(0.0) + dot1(x, 0, 0, y, 0, 0, nk, nk)  # as q_mul_mat's products


KERNELS = {f.py_func.__name__: f for f in (q_dequant, q_get_rows, q_mul_mat, q_mul_mat_id)}
