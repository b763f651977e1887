"""Fast paths: kernels typed with layout ``C`` for contiguous arrays (unit strides known, so
LLVM vectorises the inner loops), and MUL_MAT (cache-blocked, register-tiled).

Registered with ``Kernel(c_layout=True)``: a C-contiguous argument is typed as layout C,
anything else as layout A (so strided views still work, at the strided speed).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from ._jit import _OPTS, unary_value

# MUL_MAT sums in float32 in any order (within its op's error bound): reassociation lets
# LLVM vectorise the dot products; no other fast-math assumption (NaN/inf are kept).
_MM_OPTS = dict(_OPTS, fastmath={"reassoc", "contract"})

# ------------------------------------------------------------------ elementwise, flat
@njit(parallel=True, **_OPTS)
def binary_flat(a, b, o, op):
    """F32 o = a op b on flat contiguous arrays; b is as long as a, or one row repeated
    (len(a) a multiple of len(b)). op: 0 ADD, 1 SUB, 2 MUL, 3 DIV. float32 arithmetic is
    exact here: the float64-then-round result of the reference is the same number.
    (Loops index with the prange variable or row views only: indices LLVM can prove
    non-negative, so the loops vectorise.)"""
    n = o.shape[0]
    nb = b.shape[0]
    if nb == n:
        if op == 0:
            for i in prange(n):
                o[i] = a[i] + b[i]
        elif op == 1:
            for i in prange(n):
                o[i] = a[i] - b[i]
        elif op == 2:
            for i in prange(n):
                o[i] = a[i] * b[i]
        else:
            for i in prange(n):
                o[i] = a[i] / b[i]
    else:
        nr = n // nb
        a2 = a.reshape(nr, nb)
        o2 = o.reshape(nr, nb)
        for r in prange(nr):
            ar = a2[r]
            orow = o2[r]
            if op == 0:
                for j in range(nb):
                    orow[j] = ar[j] + b[j]
            elif op == 1:
                for j in range(nb):
                    orow[j] = ar[j] - b[j]
            elif op == 2:
                for j in range(nb):
                    orow[j] = ar[j] * b[j]
            else:
                for j in range(nb):
                    orow[j] = ar[j] / b[j]


@njit(parallel=True, **_OPTS)
def unary_flat(x, o, op, p0, p1, p2, p3):
    """F32 o = op(x) on flat contiguous arrays (codes: kernels.UNARY_CODES), float64 inside."""
    for i in prange(o.shape[0]):
        o[i] = unary_value(op, np.float64(x[i]), p0, p1, p2, p3)


# ------------------------------------------------------------------ rows, contiguous
@intrinsic
def _f64_from_bits(typingctx, x):
    """The float64 with IEEE bits x (int64)."""
    if x == types.int64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.DoubleType())
        return types.float64(types.int64), codegen
    return None


@njit(inline="always", **_OPTS)
def exp_v(x):
    """exp(x) in float64 without a libm call, so loops over it vectorise: Cody-Waite reduction
    to |r| <= ln2/2 and a degree-12 Taylor polynomial (relative error < 1e-14). x is clamped to
    [-708, 709] (results below 1e-307 are not subnormal; softmax never needs more); NaN stays NaN."""
    t = -708.0 if x < -708.0 else x
    t = 709.0 if t > 709.0 else t
    n = np.floor(t * 1.4426950408889634 + 0.5)
    r = t - n * 6.93147180369123816490e-01 - n * 1.90821492927058770002e-10
    p = 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    ni = np.int64(n) if n == n else np.int64(0)
    return p * _f64_from_bits((ni + 1023) << 52)


@njit(parallel=True, **_OPTS)
def rows_fast(x, o, op, p0):
    """F32 per-row ops on contiguous (rows, n0) arrays, float64 sums (4 partial sums):
    0 RMS_NORM (p0 = eps), 1 NORM (p0 = eps), 2 SOFT_MAX without mask or sinks (p0 = scale)."""
    nr, n0 = x.shape
    n4 = n0 - n0 % 4
    for r in prange(nr):
        xr = x[r]
        orow = o[r]
        if op == 0 or op == 1:
            mean = 0.0
            if op == 1:
                s0 = s1 = s2 = s3 = 0.0
                for i in range(0, n4, 4):
                    s0 += np.float64(xr[i])
                    s1 += np.float64(xr[i + 1])
                    s2 += np.float64(xr[i + 2])
                    s3 += np.float64(xr[i + 3])
                for i in range(n4, n0):
                    s0 += np.float64(xr[i])
                mean = ((s0 + s1) + (s2 + s3)) / n0
            s0 = s1 = s2 = s3 = 0.0
            for i in range(0, n4, 4):
                c0 = np.float64(xr[i]) - mean
                c1 = np.float64(xr[i + 1]) - mean
                c2 = np.float64(xr[i + 2]) - mean
                c3 = np.float64(xr[i + 3]) - mean
                s0 += c0 * c0
                s1 += c1 * c1
                s2 += c2 * c2
                s3 += c3 * c3
            for i in range(n4, n0):
                c0 = np.float64(xr[i]) - mean
                s0 += c0 * c0
            den = np.sqrt(((s0 + s1) + (s2 + s3)) / n0 + p0)
            for i in range(n0):
                orow[i] = (np.float64(xr[i]) - mean) / den
        else:
            mx = -np.inf
            for i in range(n0):
                v = np.float64(xr[i]) * p0
                if v > mx or v != v:
                    mx = v
            e = np.empty(n0, np.float64)
            for i in range(n0):
                e[i] = exp_v(np.float64(xr[i]) * p0 - mx)
            s0 = s1 = s2 = s3 = 0.0
            for i in range(0, n4, 4):
                s0 += e[i]
                s1 += e[i + 1]
                s2 += e[i + 2]
                s3 += e[i + 3]
            for i in range(n4, n0):
                s0 += e[i]
            den = (s0 + s1) + (s2 + s3)
            for i in range(n0):
                orow[i] = e[i] / den


# ------------------------------------------------------------------ matrices
def ld32(a, lut, i3, i2, i1, i0):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(ld32)
def _ld32(a, lut, i3, i2, i1, i0):
    if a.dtype == types.uint16:
        def impl(a, lut, i3, i2, i1, i0):
            return lut[a[i3, i2, i1, i0]]
    else:
        def impl(a, lut, i3, i2, i1, i0):
            return np.float32(a[i3, i2, i1, i0])
    return impl


TILE_M = 64  # rows of a per task (multiple of 4)
TILE_N = 64  # rows of b per task (multiple of 4)
BLOCK_K = 256
GEMV_ROWS = 16  # rows of a per task when b has fewer than 4 rows


@njit(parallel=True, **_MM_OPTS)
def mul_mat(a, la, b, o):
    """o[i3, i2, n, m] = sum_k a[i3 // r3, i2 // r2, m, k] * b[i3, i2, n, k], float32 sums
    (a may be F16/BF16 bits: converted while packed).

    b with fewer than 4 rows: dot products straight from memory (GEMV; memory bound).
    Otherwise tiles of TILE_M rows of a by TILE_N rows of b run in parallel; k is walked in
    blocks of BLOCK_K with both panels packed into contiguous float32 buffers (rows padded
    to a multiple of 4 with zeros) and a 4 x 4 register tile of dot products, vectorised
    along k."""
    n3, n2, nn, nm = o.shape
    a3, a2 = a.shape[0], a.shape[1]
    nk = a.shape[3]
    r3 = n3 // a3
    r2 = n2 // a2
    if nn < 4:
        tm = (nm + GEMV_ROWS - 1) // GEMV_ROWS
        for task in prange(n3 * n2 * tm):
            jm = task % tm
            t = task // tm
            i2 = t % n2
            i3 = t // n2
            k3 = i3 // r3
            k2 = i2 // r2
            m = jm * GEMV_ROWS
            me = min(m + GEMV_ROWS, nm)
            while m + 4 <= me:  # four rows of a share each load of b
                for q in range(nn):
                    s0 = s1 = s2 = s3 = np.float32(0.0)
                    for k in range(nk):
                        y = b[i3, i2, q, k]
                        s0 += ld32(a, la, k3, k2, m, k) * y
                        s1 += ld32(a, la, k3, k2, m + 1, k) * y
                        s2 += ld32(a, la, k3, k2, m + 2, k) * y
                        s3 += ld32(a, la, k3, k2, m + 3, k) * y
                    o[i3, i2, q, m] = s0
                    o[i3, i2, q, m + 1] = s1
                    o[i3, i2, q, m + 2] = s2
                    o[i3, i2, q, m + 3] = s3
                m += 4
            while m < me:
                for q in range(nn):
                    s0 = np.float32(0.0)
                    for k in range(nk):
                        s0 += ld32(a, la, k3, k2, m, k) * b[i3, i2, q, k]
                    o[i3, i2, q, m] = s0
                m += 1
        return
    tm = (nm + TILE_M - 1) // TILE_M
    tn = (nn + TILE_N - 1) // TILE_N
    for task in prange(n3 * n2 * tm * tn):
        jn = task % tn
        t = task // tn
        jm = t % tm
        t = t // tm
        i2 = t % n2
        i3 = t // n2
        k3 = i3 // r3
        k2 = i2 // r2
        m0 = jm * TILE_M
        w = min(m0 + TILE_M, nm) - m0
        q0 = jn * TILE_N
        qn = min(q0 + TILE_N, nn) - q0
        pa = np.zeros((TILE_M, BLOCK_K), np.float32)
        pb = np.zeros((TILE_N, BLOCK_K), np.float32)
        acc = np.zeros((TILE_N, TILE_M), np.float32)
        for kb in range(0, nk, BLOCK_K):
            kl = min(kb + BLOCK_K, nk) - kb
            for mm in range(w):
                for k in range(kl):
                    pa[mm, k] = ld32(a, la, k3, k2, m0 + mm, kb + k)
            for qq in range(qn):
                for k in range(kl):
                    pb[qq, k] = b[i3, i2, q0 + qq, kb + k]
            for qq in range(0, qn, 4):
                for mm in range(0, w, 4):
                    s00 = s01 = s02 = s03 = np.float32(0.0)
                    s10 = s11 = s12 = s13 = np.float32(0.0)
                    s20 = s21 = s22 = s23 = np.float32(0.0)
                    s30 = s31 = s32 = s33 = np.float32(0.0)
                    for k in range(kl):
                        x0 = pa[mm, k]
                        x1 = pa[mm + 1, k]
                        x2 = pa[mm + 2, k]
                        x3 = pa[mm + 3, k]
                        y = pb[qq, k]
                        s00 += x0 * y
                        s01 += x1 * y
                        s02 += x2 * y
                        s03 += x3 * y
                        y = pb[qq + 1, k]
                        s10 += x0 * y
                        s11 += x1 * y
                        s12 += x2 * y
                        s13 += x3 * y
                        y = pb[qq + 2, k]
                        s20 += x0 * y
                        s21 += x1 * y
                        s22 += x2 * y
                        s23 += x3 * y
                        y = pb[qq + 3, k]
                        s30 += x0 * y
                        s31 += x1 * y
                        s32 += x2 * y
                        s33 += x3 * y
                    acc[qq, mm] += s00
                    acc[qq, mm + 1] += s01
                    acc[qq, mm + 2] += s02
                    acc[qq, mm + 3] += s03
                    acc[qq + 1, mm] += s10
                    acc[qq + 1, mm + 1] += s11
                    acc[qq + 1, mm + 2] += s12
                    acc[qq + 1, mm + 3] += s13
                    acc[qq + 2, mm] += s20
                    acc[qq + 2, mm + 1] += s21
                    acc[qq + 2, mm + 2] += s22
                    acc[qq + 2, mm + 3] += s23
                    acc[qq + 3, mm] += s30
                    acc[qq + 3, mm + 1] += s31
                    acc[qq + 3, mm + 2] += s32
                    acc[qq + 3, mm + 3] += s33
        for qq in range(qn):
            for mm in range(w):
                o[i3, i2, q0 + qq, m0 + mm] = acc[qq, mm]


KERNELS = {f.py_func.__name__: f for f in (binary_flat, unary_flat, rows_fast, mul_mat)}
