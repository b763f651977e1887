"""The integer path of the quantized matrix-vector product (this module imports numba).

As ggml's CPU backend does: each activation row is quantized once to the weight's vec_dot type
(Q8_0 for Q4_0, Q5_0 and Q8_0 weights and Q8_1 for Q4_1 and Q5_1, with the x86 rounding of
prism_core.quant's ``quantize_activations``; Q8_K for the K-quants, the reference quantizer), then every weight
block is dotted with it in integer arithmetic (the vector code of :mod:`._qvec`) and scaled once
per block (per super-block for the K-quants, whose sub-block scales are integers). An activation
row holding a NaN or an infinity is not quantized: its dot products take the float path
(``decode_row``), so non-finite values propagate as in the float product. README.md, "Block
types", says when this path is taken and what it measured.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from prism_core.types import GGMLType, traits

from . import _jit_qdot_table as QT
from . import _qvec as V
from ._jit_quant import Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, _i8, decode_row
from ._jit_qwalk import AHEAD, block_walk, by_format, chunk_pick, row_run, superblock_rows
from ._qvec_low_k import low_k_superblocks

# Only the kernel is cached, under a key that holds the vector ISA (isa.py: PRISM_NUMBA_ISA may pick
# another than the last process did, and numba keys its cache by source and CPU, not by what the
# intrinsics generated); its helpers are compiled with it (numba would load a helper's cached code
# of another ISA).
_OPTS = dict(cache=False, fastmath=False, error_model="numpy", nogil=True)

# The weight formats with an integer path (ggml type ids), with what the vector code subtracts from
# their unsigned weight bytes (see _qvec); tables of that and of a block's bytes (the core's type
# traits), indexed by the type id.
_INT_PATH = ((Q8_0, V.Q8_0_BIAS), (Q4_0, 8), (Q5_0, 16), (Q4_1, 0), (Q5_1, 0), (Q4_K, 0), (Q6_K, 32), (Q5_K, 0),
             (Q2_K, 0), (Q3_K, 4)) + QT.INT_PATH
INT_FORMATS = frozenset(fmt for fmt, _ in _INT_PATH)
_OFFSETS = np.zeros(max(INT_FORMATS) + 1, np.int64)
_BLOCK_BYTES = np.zeros(max(INT_FORMATS) + 1, np.int64)
# values per entry of the activation scales xd: 32 (Q8_0: d), 16 (Q8_1: d and the block sum s), 256 (Q8_K)
_PER_SCALE = np.zeros(max(INT_FORMATS) + 1, np.int64)
for _fmt, _off in _INT_PATH:
    _OFFSETS[_fmt], _BLOCK_BYTES[_fmt] = _off, traits(GGMLType(_fmt)).type_size
    _vt = traits(GGMLType(_fmt)).vec_dot_type
    _PER_SCALE[_fmt] = 256 if _vt == GGMLType.Q8_K else 16 if _vt == GGMLType.Q8_1 else 32


@njit(inline="always", **_OPTS)
def _offset(fmt):
    return _OFFSETS[fmt]


@njit(inline="always", **_OPTS)
def _block_bytes(fmt):
    return _BLOCK_BYTES[fmt]


@njit(inline="always", **_OPTS)
def _per_scale(fmt):
    return _PER_SCALE[fmt]


@njit(inline="always", **_OPTS)
def _k_quant(fmt):
    return _PER_SCALE[fmt] == 256


@njit(inline="always", **_OPTS)
def _per_sum(fmt):
    """Values per activation sum in xb: 16 for Q2_K (its mins are per 16 values), else 32."""
    return 16 if fmt == Q2_K else 32


# ------------------------------------------------------------------ activations
@njit(inline="always", **_OPTS)
def _nearest_int(v):
    """ggml's nearest_int: the bits of v + 1.5 * 2**23 (ties to even), defined for every float
    (an infinite or NaN v gives what ggml's gives; the result is then truncated to int8 as there)."""
    return (np.int64(V.f32_bits(v + np.float32(12582912.0))) & 0x007FFFFF) - 0x00400000


@njit(**_OPTS)
def quantize_row(fmt, x, xq, xc, xd, xb, xo):
    """Quantize the float32 row x to the activations of fmt's dot product: int8 values at
    xq[xo:], per block (32 values, or 256 for the K-quants) the scale at xd[xo // block] (Q8_1: the
    scale and the block sum at xd[xo // 16:][2 * block:]), per four values -offset(fmt) times their
    sum at xc[xo // 4], per 32 values (16 for Q2_K) their sum at xb[xo // 32] (xb[xo // 16]).
    False (and nothing written) when x holds a NaN or an infinity.

    Q8_0 as ggml-cpu's x86 quantize_row_q8_0: d = amax / 127 rounded to fp16, the values
    x * (127 / amax) rounded half to even (an infinite multiplier, from subnormal data, gives
    -128 as the AVX conversion does). Q8_1 as its quantize_row_q8_1: the same, and s = fp16 of
    float32(the int32 sum of the converted values, before they saturate to int8) * amax / 127.
    Q8_K as quantize_row_q8_K_ref: the signed value of largest magnitude (the first one) m,
    iscale = -127 / m, min(127, nearest_int(iscale * x)) kept in an int8, d = 1 / iscale."""
    nk = x.shape[0]
    for j in range(nk):
        if not np.isfinite(x[j]):
            return False
    if _k_quant(fmt):
        for ib in range(nk // 256):
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(256):
                v = x[ib * 256 + j]
                if abs(v) > amax:
                    amax = abs(v)
                    mx = v
            if amax == 0:
                xd[xo // 256 + ib] = 0.0
                for j in range(256):
                    xq[xo + ib * 256 + j] = 0
                continue
            iscale = np.float32(-127.0) / mx
            for j in range(256):
                xq[xo + ib * 256 + j] = min(127, _nearest_int(iscale * x[ib * 256 + j]))
            xd[xo // 256 + ib] = np.float32(1.0) / iscale
    else:
        q81 = _per_scale(fmt) == 16
        for ib in range(nk // 32):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(x[ib * 32 + j]))
            d = amax / np.float32(127.0)
            mul = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            lanes = np.int64(0)
            for j in range(32):
                v = np.rint(x[ib * 32 + j] * mul)
                lane = np.int64(v) if abs(v) < 2.0 ** 31 else np.int64(-(2 ** 31))
                lanes += lane
                xq[xo + ib * 32 + j] = max(-128, min(127, lane))
            if q81:
                lanes = ((lanes + 2 ** 31) & 0xFFFFFFFF) - 2 ** 31  # the int32 sum wraps
                xd[xo // 16 + 2 * ib] = V.f16_round(d)
                xd[xo // 16 + 2 * ib + 1] = V.f16_round(np.float32(lanes) * d)
            else:
                xd[xo // 32 + ib] = V.f16_round(d)
    off = _offset(fmt)
    for t in range(nk // 4):
        p = xo + 4 * t
        xc[xo // 4 + t] = -off * (np.int32(xq[p]) + np.int32(xq[p + 1]) + np.int32(xq[p + 2]) + np.int32(xq[p + 3]))
    per = _per_sum(fmt)
    for t in range(nk // per):
        s = np.int32(0)
        for j in range(per):
            s += np.int32(xq[xo + per * t + j])
        xb[xo // per + t] = s
    return True


# ------------------------------------------------------------------ weight rows
# (Weight bytes are addressed as byte offsets from a's first element, so that a group of rows
# is one offset and a stride, whatever a's strides.)
ROWS = 4  # weight rows per pass over an activation row (each activation load serves all four)
COLS = 4  # activation rows per unpacking of a weight block (block_dot)


_LEGACY = (("Q8_0", Q8_0), ("Q4_0", Q4_0), ("Q5_0", Q5_0), ("Q4_1", Q4_1), ("Q5_1", Q5_1))


def _legacy_chunks(rows: int, cols: int) -> dict:
    """{ggml type id: (its chunk of eight blocks, of two)} of the vector code of _qvec, for rows x cols."""
    return {fid: (V.legacy_chunk(f, 4, rows, cols), V.legacy_chunk(f, 1, rows, cols)) for f, fid in _LEGACY}


def _legacy_walk(rows: int, cols: int, chunks: dict):
    """_jit_qwalk.block_walk of Q8_0, Q4_0, Q5_0, Q4_1 and Q5_1 (the vector code of _qvec; the same float32
    operations for every (rows, cols))."""
    (q8_8, q8_2), (q4_8, q4_2), (q5_8, q5_2), (q41_8, q41_2), (q51_8, q51_2) = (chunks[f] for _, f in _LEGACY)

    @njit(inline="always", **_OPTS)
    def pick(fmt, eight, a, o, ws, xq, xc, xd, xi, nk):
        if fmt == Q8_0:
            return q8_8(a, o, ws, xq, xc, xd, xi, nk) if eight else q8_2(a, o, ws, xq, xc, xd, xi, nk)
        if fmt == Q4_0:
            return q4_8(a, o, ws, xq, xc, xd, xi, nk) if eight else q4_2(a, o, ws, xq, xc, xd, xi, nk)
        if fmt == Q5_0:
            return q5_8(a, o, ws, xq, xc, xd, xi, nk) if eight else q5_2(a, o, ws, xq, xc, xd, xi, nk)
        if fmt == Q4_1:
            return q41_8(a, o, ws, xq, xc, xd, xi, nk) if eight else q41_2(a, o, ws, xq, xc, xd, xi, nk)
        return q51_8(a, o, ws, xq, xc, xd, xi, nk) if eight else q51_2(a, o, ws, xq, xc, xd, xi, nk)
    return block_walk(rows, cols, pick, _legacy_tail, _block_bytes)


@njit(**_OPTS)
def _legacy_tail(fmt, a, o, xq, xd, xo):
    """One 32-value block (the odd last one of a row), in scalar code: the same integer sum (and for
    Q4_1/Q5_1 the min times the activations' block sum)."""
    s = np.int64(0)
    qh = np.int64(0)
    five = fmt == Q5_0 or fmt == Q5_1
    q0 = 8 if fmt == Q5_1 else 6 if fmt == Q5_0 else 4 if fmt == Q4_1 else 2
    if five:
        for i in range(4):
            qh |= V.byte_at(a, o + q0 - 4 + i) << (8 * i)
    off = _offset(fmt)
    for j in range(16):
        if fmt == Q8_0:
            w0 = _i8(V.byte_at(a, o + 2 + j))
            w1 = _i8(V.byte_at(a, o + 18 + j))
        else:
            v = V.byte_at(a, o + q0 + j)
            w0 = (v & 0xF) - off
            w1 = (v >> 4) - off
            if five:
                w0 += ((qh >> j) & 1) << 4
                w1 += ((qh >> (j + 16)) & 1) << 4
        s += w0 * np.int64(xq[xo + j]) + w1 * np.int64(xq[xo + 16 + j])
    if fmt == Q4_1 or fmt == Q5_1:
        return V.half_at(a, o) * xd[xo // 16] * np.float32(s) + V.half_at(a, o + 2) * xd[xo // 16 + 1]
    return V.half_at(a, o) * xd[xo // 32] * np.float32(s)


_Q4_K, _Q4_KB = V.q4_k_superblocks(1), V.q4_k_superblocks(COLS)
_Q5_K, _Q5_KB = V.q4_k_superblocks(1, "Q5_K"), V.q4_k_superblocks(COLS, "Q5_K")
_Q6_K, _Q6_KB = V.q6_k_superblocks(1), V.q6_k_superblocks(COLS)
_Q2_K, _Q2_KB = low_k_superblocks("Q2_K", 1), low_k_superblocks("Q2_K", COLS)
_Q3_K, _Q3_KB = low_k_superblocks("Q3_K", 1), low_k_superblocks("Q3_K", COLS)
_C41, _C44 = _legacy_chunks(ROWS, 1), _legacy_chunks(ROWS, COLS)
_walk_block = _legacy_walk(ROWS, COLS, _C44)


# Every product below, whichever function computes it (ROWS weight rows by COLS activation rows here, ROWS or
# one weight row by one activation row in a run further on), is the same sequence of float32 operations: per
# chunk of blocks the vector code's value (the same for any rows and cols, _qvec), added to the row's sum in
# block order; so a product does not depend on the batch of activation rows it is computed in
# (tests/test_numba_batch_invariance.py).
@njit(**_OPTS)
def _k_quant_dots(fmt, a, w, xq, xc, xd, xb, xo, nk, acc):
    """acc[0:COLS] = the products of the K-quant weight row at byte w of a with the COLS activation rows at
    xo + c * nk, super-block by super-block, each weight super-block unpacked once."""
    bs = _block_bytes(fmt)
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for ib in range(nk // 256):
        o = w + ib * bs
        xi = xo + 256 * ib
        if fmt == Q4_K:
            t0, t1, t2, t3 = _Q4_KB(a, o, xq, xb, xd, xi, nk)
        elif fmt == Q5_K:
            t0, t1, t2, t3 = _Q5_KB(a, o, xq, xb, xd, xi, nk)
        elif fmt == Q2_K:
            t0, t1, t2, t3 = _Q2_KB(a, o, xq, xc, xb, xd, xi, nk)
        elif fmt == Q3_K:
            t0, t1, t2, t3 = _Q3_KB(a, o, xq, xc, xb, xd, xi, nk)
        else:
            i0, i1, i2, i3 = _Q6_KB(a, o, xq, xc, xi, nk)
            h = V.half_at(a, o + 208)
            t0 = xd[xi // 256] * h * np.float32(i0)
            t1 = xd[(xi + nk) // 256] * h * np.float32(i1)
            t2 = xd[(xi + 2 * nk) // 256] * h * np.float32(i2)
            t3 = xd[(xi + 3 * nk) // 256] * h * np.float32(i3)
        s0 += t0
        s1 += t1
        s2 += t2
        s3 += t3
    acc[0], acc[1], acc[2], acc[3] = s0, s1, s2, s3


_table_block = QT.block_dot(ROWS, COLS)


@njit(**_OPTS)
def block_dot(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc):
    """The ROWS x COLS products of the weight rows at bytes wo + r * ws of a with the activation rows at
    xo + c * nk, into acc[r * COLS + c]: each weight block is unpacked once for the COLS activation rows,
    the arithmetic of each product that of a run of one activation row (row_run_of)."""
    if QT.is_table(fmt):
        _table_block(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc)
    elif _k_quant(fmt):
        for r in range(ROWS - 1, -1, -1):  # the last row first: acc[r * COLS:] is written after acc[0:4] is read
            _k_quant_dots(fmt, a, wo + r * ws, xq, xc, xd, xb, xo, nk, acc)
            for c in range(COLS):
                acc[r * COLS + c] = acc[c]
    else:
        _walk_block(fmt, a, wo, ws, xq, xc, xd, xb, xo, nk, acc)


# ------------------------------------------------------------------ one activation row
# A run (_jit_qwalk.row_run) computes one activation row's products with all of a task's weight rows in one call,
# the format's walk inlined: the same arithmetic per product as block_dot.
@njit(inline="always", **_OPTS)
def _q4_k_one(a, o, xq, xc, xb, xd, xi, nk):
    return _Q4_K(a, o, xq, xb, xd, xi, nk)


@njit(inline="always", **_OPTS)
def _q5_k_one(a, o, xq, xc, xb, xd, xi, nk):
    return _Q5_K(a, o, xq, xb, xd, xi, nk)


@njit(inline="always", **_OPTS)
def _q6_k_one(a, o, xq, xc, xb, xd, xi, nk):
    return xd[xi // 256] * V.half_at(a, o + 208) * np.float32(_Q6_K(a, o, xq, xc, xi, nk))


def _k_quant_run(fmt: int, one):
    return row_run(superblock_rows(one, ROWS, traits(GGMLType(fmt)).type_size, AHEAD), ROWS)


def _legacy_run(fmt: int):
    return row_run(block_walk(ROWS, 1, chunk_pick(*_C41[fmt]), _legacy_tail, _block_bytes, inline=True,
                              ahead=AHEAD), ROWS)


_RUNS = {fmt: _legacy_run(fmt) for _, fmt in _LEGACY}
_RUNS.update({Q4_K: _k_quant_run(Q4_K, _q4_k_one), Q5_K: _k_quant_run(Q5_K, _q5_k_one),
              Q6_K: _k_quant_run(Q6_K, _q6_k_one), Q2_K: _k_quant_run(Q2_K, _Q2_K),
              Q3_K: _k_quant_run(Q3_K, _Q3_K)})
_RUNS.update(QT.runs(ROWS))
#: run(fmt, a, wo, ws, g, xq, xc, xd, xb, xo, nk, acc, orow, m): _jit_qwalk.row_run of fmt
row_run_of = by_format(_RUNS)


# Without an integer path (portable) this kernel is never compiled (kernels_quant.int_path) and has no vector
# code to compile (_qvec._dpbusd refuses).
ROWS_PER_TASK = 128
Q_BLOCK = 64  # activation rows served per pass over a task's weight rows (with them, in L2)
PREFETCH = 4096  # bytes: weights are prefetched this far ahead of the rows being read


@njit(**_OPTS)
def _float_rows(fmt, a, k3, k2, m, g, y, orow):
    """orow[m:m+g]: the float path's products of weight rows m.. with y, for an activation row holding a
    NaN or an infinity (not quantized: non-finite values propagate as in the float product)."""
    nk = y.shape[0]
    tmp = np.empty(nk, np.float32)
    for i in range(g):
        decode_row(fmt, a[k3, k2, m + i], tmp)
        s = np.float32(0.0)
        for k in range(nk):
            s += tmp[k] * y[k]
        orow[m + i] = s


@njit(**_OPTS)
def _task(fmt, a, b, o, k3, k2, m0, m_end, xq, xc, xd, xb, finite):
    """Weight rows m0..m_end of matrix a[k3, k2] against every b row broadcast onto it: ROWS weight rows by
    COLS activation rows at a time where both are whole (block_dot), every other product by a run of its
    activation row over the rows (row_run_of: ROWS rows, then one, at a time), every product with the same
    arithmetic (a function of its own: the serial and the thread-pool compilations of the kernel then run the
    same code). Activation rows are taken into blocks of COLS in order, a row holding a NaN or an infinity
    breaking a block (the same blocks for every pass of ROWS weight rows)."""
    n2, nn = o.shape[1], o.shape[2]
    nk = b.shape[3]
    r3 = o.shape[0] // a.shape[0]
    r2 = n2 // a.shape[1]
    ws = a.strides[2]
    w0 = k3 * a.strides[0] + k2 * a.strides[1]
    m_blocks = m0 + (m_end - m0) // ROWS * ROWS  # rows m_blocks..m_end have no whole pass of ROWS
    acc = np.empty(ROWS * COLS, np.float32)
    for i3 in range(k3 * r3, (k3 + 1) * r3):
        for i2 in range(k2 * r2, (k2 + 1) * r2):
            out = o[i3, i2]
            base = (i3 * n2 + i2) * nn
            for q0 in range(0, nn, Q_BLOCK):
                q1 = min(nn, q0 + Q_BLOCK)
                # the blocks, a pass of ROWS weight rows over the activation rows (none with fewer than COLS
                # of them: no pass, nor its prefetching)
                for m in range(m0, m_blocks if q1 - q0 >= COLS else m0, ROWS):
                    wo = w0 + m * ws
                    if q0 == 0:
                        for p in range(wo + PREFETCH, wo + PREFETCH + ROWS * ws, 64):
                            V.prefetch(a, p)
                    q = q0
                    while q < q1:
                        if _in_block(finite, base + q, q, q1):
                            block_dot(fmt, a, wo, ws, xq, xc, xd, xb, (base + q) * nk, nk, acc)
                            for r in range(ROWS):
                                for c in range(COLS):
                                    out[q + c, m + r] = acc[r * COLS + c]
                            q += COLS
                        else:
                            q += 1
                q = q0
                while q < q1:  # the rest: rows m_blocks.. of the blocks' activation rows, every row of the others
                    t = base + q
                    block = m_blocks > m0 and _in_block(finite, t, q, q1)
                    first = m_blocks if block else m0
                    for c in range(COLS if block else 1):
                        if not finite[t + c]:
                            _float_rows(fmt, a, k3, k2, first, m_end - first, b[i3, i2, q + c], out[q + c])
                        elif m_end > first:
                            row_run_of(fmt, a, w0 + first * ws, ws, m_end - first, xq, xc, xd, xb, (t + c) * nk,
                                       nk, acc, out[q + c], first)
                    q += COLS if block else 1


@njit(inline="always", **_OPTS)
def _in_block(finite, t, q, q1):
    """Whether activation rows q..q+COLS (at t..t+COLS) form a block: whole before q1, and finite."""
    if q + COLS > q1:
        return False
    for c in range(COLS):
        if not finite[t + c]:
            return False
    return True


def _kernel(mode: str):
    @njit(parallel=True, **dict(_OPTS, cache=True))
    def q_mul_mat_int(fmt, a, b, o):
        """o[i3, i2, n, m] = the integer-path dot product of weight row a[i3 // r3, i2 // r2, m] with
        activation row b[i3, i2, n] (quantized once, before the products); a task owns up to
        ROWS_PER_TASK rows of one a matrix and serves every b row broadcast onto it."""
        if mode == "":  # never: mode (the vector ISA) is read so that it joins the closure, the cache key
            return
        n3, n2, nn, nm = o.shape
        a3, a2 = a.shape[0], a.shape[1]
        nk = b.shape[3]
        nr = n3 * n2 * nn
        xq = np.empty(nr * nk, np.int8)
        xc = np.empty(nr * nk // 4, np.int32)
        xd = np.empty(nr * (nk // _per_scale(fmt)), np.float32)
        xb = np.empty(nr * (nk // _per_sum(fmt)), np.int32)
        finite = np.empty(nr, np.bool_)
        for t in prange(nr):
            q = t % nn
            u = t // nn
            finite[t] = quantize_row(fmt, b[u // n2, u % n2, q], xq, xc, xd, xb, t * nk)
        tm = (nm + ROWS_PER_TASK - 1) // ROWS_PER_TASK
        for task in prange(a3 * a2 * tm):
            jm = task % tm
            u = task // tm
            _task(fmt, a, b, o, u // a2, u % a2, jm * ROWS_PER_TASK, min(nm, (jm + 1) * ROWS_PER_TASK),
                  xq, xc, xd, xb, finite)
    return q_mul_mat_int


q_mul_mat_int = _kernel(V.MODE)

KERNELS = {f.py_func.__name__: f for f in (q_mul_mat_int,)}
