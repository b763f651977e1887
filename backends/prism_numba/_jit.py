"""The compiled Numba kernels (this module imports numba; import it only when numba is present).

Every kernel works on the strided 4-dim host views directly, in NumPy order
(ne3, ne2, ne1, ne0): a ``prange`` over the flattened row index (i3, i2, i1) and an
inner loop over i0. F16 and BF16 tensors are passed as their uint16 bits with a
65536-entry float32 lookup table for loads (exact) and are stored with
round-to-nearest-even conversions that match NumPy / ggml bit for bit. Values are
computed in float64 and rounded once to the output type, as the reference does
(MUL_MAT and OUT_PROD alone accumulate in float32, within their ops' error bound).

Each kernel is compiled on first use for the exact argument types it meets, with
every array typed as layout ``A`` (so contiguous and strided inputs share one
compiled version), and cached on disk (``cache=True``).
"""

from __future__ import annotations

import math
import os
import threading
import types as pytypes
import zlib
from contextlib import contextmanager

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.errors import NumbaError
from numba.extending import intrinsic, overload

from prism_core.errors import Unsupported
from prism_core.ops.gelu_tables import GELU_CLAMP, gelu_f16_table, gelu_quick_f16_table

_OPTS = dict(cache=True, fastmath=False, error_model="numpy", nogil=True)

# Lookup tables: the float32 value of every 16-bit pattern.
F16_LUT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
BF16_LUT = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
NO_LUT = np.zeros(1, np.float32)  # passed for float32 arrays (never read)
# ggml's CPU GELU and quick GELU: tables indexed by the F16 bits of the input (prism_core.ops.gelu_tables)
GELU_F16 = np.array(gelu_f16_table())
GELU_QUICK_F16 = np.array(gelu_quick_f16_table())
DUMMY = np.zeros((1, 1, 1, 1), np.float32)  # an absent optional source
DUMMY16 = np.zeros((1, 1, 1, 1), np.uint16)  # an absent optional F16 source

# store kinds for uint16 outputs (the ``kind`` argument; kernels.kind())
OUT_F16, OUT_BF16 = 1, 2


# ------------------------------------------------------------------ conversions
@intrinsic
def _bits64(typingctx, x):
    """The IEEE bits of a float64, as uint64."""
    if x == types.float64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return types.uint64(types.float64), codegen
    return None


@intrinsic
def _bits32(typingctx, x):
    """The IEEE bits of a float32, as uint32."""
    if x == types.float32:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))
        return types.uint32(types.float32), codegen
    return None


@njit(**_OPTS)
def f2h(v):
    """float64 -> float16 bits, round to nearest even: NumPy's npy_doublebits_to_halfbits."""
    d = _bits64(np.float64(v))
    h_sgn = (d >> 48) & 0x8000
    d_exp = d & 0x7FF0000000000000
    if d_exp >= 0x40F0000000000000:  # overflow, inf or NaN
        if d_exp == 0x7FF0000000000000:
            d_sig = d & 0x000FFFFFFFFFFFFF
            if d_sig != 0:
                ret = 0x7C00 + (d_sig >> 42)
                if ret == 0x7C00:
                    ret += 1
                return np.uint16(h_sgn + ret)
        return np.uint16(h_sgn + 0x7C00)
    if d_exp <= 0x3F00000000000000:  # subnormal half or signed zero
        if d_exp < 0x3E60000000000000:
            return np.uint16(h_sgn)
        e = d_exp >> 52
        d_sig = 0x0010000000000000 + (d & 0x000FFFFFFFFFFFFF)
        d_sig <<= e - 998
        if (d_sig & 0x003FFFFFFFFFFFFF) != 0x0010000000000000:
            d_sig += 0x0010000000000000
        return np.uint16(h_sgn + (d_sig >> 53))
    h_exp = (d_exp - 0x3F00000000000000) >> 42
    d_sig = d & 0x000FFFFFFFFFFFFF
    if (d_sig & 0x000007FFFFFFFFFF) != 0x0000020000000000:
        d_sig += 0x0000020000000000
    return np.uint16((h_sgn + h_exp + (d_sig >> 42)) & 0xFFFF)


@njit(**_OPTS)
def f2bf(v):
    """float64 -> bfloat16 bits as ggml: round to float32, then to nearest even; NaN kept quiet."""
    u = np.uint64(_bits32(np.float32(v)))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(((u >> 16) | 64) & 0xFFFF)
    return np.uint16(((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF)


def ld(a, lut, i3, i2, i1, i0):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(ld)
def _ld(a, lut, i3, i2, i1, i0):
    if a.dtype == types.uint16:
        def impl(a, lut, i3, i2, i1, i0):
            return np.float64(lut[a[i3, i2, i1, i0]])
    else:
        def impl(a, lut, i3, i2, i1, i0):
            return np.float64(a[i3, i2, i1, i0])
    return impl


def st(o, kind, i3, i2, i1, i0, v):  # pragma: no cover
    raise NotImplementedError


@overload(st)
def _st(o, kind, i3, i2, i1, i0, v):
    if o.dtype == types.uint16:
        def impl(o, kind, i3, i2, i1, i0, v):
            if kind == 2:
                o[i3, i2, i1, i0] = f2bf(v)
            else:
                o[i3, i2, i1, i0] = f2h(v)
    elif o.dtype == types.int32 and isinstance(v, types.Float):
        # truncation toward zero; NaN and out-of-range give INT32_MIN, as the reference (NumPy on x86)
        # (a plain cast of those is undefined in LLVM)
        def impl(o, kind, i3, i2, i1, i0, v):
            if v >= -2147483648.0 and v < 2147483648.0:
                o[i3, i2, i1, i0] = np.int32(v)
            else:
                o[i3, i2, i1, i0] = np.int32(-2147483648)
    else:
        def impl(o, kind, i3, i2, i1, i0, v):
            o[i3, i2, i1, i0] = v
    return impl


# ------------------------------------------------------------------ elementwise
@njit(inline="always", **_OPTS)
def row_index(r, n1, n2):
    """(i3, i2, i1) of the r-th row of a tensor with n1 rows per matrix and n2 matrices per batch (ggml's row
    order: the loops over rows run flat, so one prange spreads every row over the threads)."""
    t = r // n1
    return t // n2, t % n2, r % n1


@njit(**_OPTS)
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@njit(**_OPTS)
def _clip01(x):
    """fminf(1, fmaxf(0, x)) as ggml's HARDSIGMOID: NaN gives 0."""
    x = x if x > 0.0 else 0.0
    return x if x < 1.0 else 1.0


@njit(inline="always", **_OPTS)
def unary_value(op, x, p0, p1, p2, p3):
    """One element of a unary op (codes: see kernels.UNARY_CODES)."""
    if op == 0:  # ABS
        return abs(x)
    if op == 1:  # SGN
        return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)  # ggml: NaN and -0.0 give +0.0
    if op == 2:  # NEG
        return -x
    if op == 3:  # STEP
        return 1.0 if x > 0 else 0.0
    if op == 4:  # TANH
        return np.tanh(x)
    if op == 5:  # ELU
        return x if x > 0 else np.expm1(x)
    if op == 6:  # RELU
        return x if x > 0 else 0.0  # ggml: NaN and -0.0 give +0.0
    if op == 7:  # SIGMOID
        return _sigmoid(x)
    if op == 8:  # GELU (tanh approximation): ggml's F16 table within (-10, 10)
        if x <= -GELU_CLAMP:
            return 0.0
        if x >= GELU_CLAMP:
            return x
        return np.float64(GELU_F16[f2h(x)])
    if op == 9:  # GELU_QUICK: ggml's F16 table
        return np.float64(GELU_QUICK_F16[f2h(x)])
    if op == 10:  # SILU
        return x * _sigmoid(x)
    if op == 11:  # HARDSWISH
        return x * _clip01((x + 3.0) / 6.0)
    if op == 12:  # HARDSIGMOID
        return _clip01((x + 3.0) / 6.0)
    if op == 13:  # EXP
        return np.exp(x)
    if op == 14:  # EXPM1
        return np.expm1(x)
    if op == 15:  # SOFTPLUS
        return x if x > 20.0 else np.log1p(np.exp(x))
    if op == 16:  # GELU_ERF
        return 0.5 * x * (1.0 + math.erf(x / 1.4142135623730951))
    if op == 17:  # FLOOR
        return np.floor(x)
    if op == 18:  # CEIL
        return np.ceil(x)
    if op == 19:  # ROUND, half away from zero
        r = np.floor(abs(x) + 0.5)
        return r if x > 0 else (-r if x < 0 else x)
    if op == 20:  # TRUNC
        return np.trunc(x)
    if op == 21:  # SQR
        return x * x
    if op == 22:  # SQRT
        return np.sqrt(x)
    if op == 23:  # LOG
        return np.log(x)
    if op == 24:  # SIN
        return np.sin(x)
    if op == 25:  # COS
        return np.cos(x)
    if op == 26:  # SCALE: x * s + b; ggml skips a zero bias, so -0.0 * s keeps its sign
        return x * p0 if p1 == 0.0 else x * p0 + p1
    if op == 27:  # CLAMP: ggml's MAX(MIN(x, max), min), NaN giving max
        m = x if x < p1 else p1
        return m if m > p0 else p0
    if op == 28:  # LEAKY_RELU: NaN and -0.0 give +0.0, as ggml
        return x if x > 0 else (0.0 + p0 * x if x < 0 else 0.0)
    if op == 29:  # XIELU: p0 = an, p1 = ap, p2 = beta, p3 = eps
        if x > 0:
            return p1 * x * x + p2 * x
        return (np.expm1(min(x, p3)) - x) * p0 + p2 * x
    return np.nan


@njit(parallel=True, **_OPTS)
def unary(x, lx, o, kind, op, p0, p1, p2, p3):
    n3, n2, n1, n0 = o.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        for i0 in range(n0):
            st(o, kind, i3, i2, i1, i0, unary_value(op, ld(x, lx, i3, i2, i1, i0), p0, p1, p2, p3))


@njit(parallel=True, **_OPTS)
def binary(a, la, b, lb, o, kind, op, p0, p1):
    """ADD SUB MUL DIV (b broadcast by modulo), SILU_BACK (a = grad, b = x), SGD (p0 = alpha, p1 = wd)."""
    n3, n2, n1, n0 = o.shape
    m3, m2, m1, m0 = b.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        j3 = i3 % m3
        j2 = i2 % m2
        j1 = i1 % m1
        for i0 in range(n0):
            x = ld(a, la, i3, i2, i1, i0)
            y = ld(b, lb, j3, j2, j1, i0 if m0 == n0 else i0 % m0)
            if op == 0:
                v = x + y
            elif op == 1:
                v = x - y
            elif op == 2:
                v = x * y
            elif op == 3:
                v = x / y
            elif op == 4:
                s = _sigmoid(y)
                v = x * s * (1.0 + y * (1.0 - s))
            else:
                v = x * (1.0 - p0 * p1) - p0 * y
            st(o, kind, i3, i2, i1, i0, v)


@njit(parallel=True, **_OPTS)
def adamw(a, g, m, v, o, alpha, beta1, beta2, eps, wd, beta1h, beta2h):
    n3, n2, n1, n0 = o.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        for i0 in range(n0):
            gi = np.float64(g[i3, i2, i1, i0])
            mi = beta1 * np.float64(m[i3, i2, i1, i0]) + (1.0 - beta1) * gi
            vi = beta2 * np.float64(v[i3, i2, i1, i0]) + (1.0 - beta2) * gi * gi
            w = np.float64(a[i3, i2, i1, i0]) * (1.0 - alpha * wd) - alpha * (mi * beta1h) / (
                np.sqrt(vi * beta2h) + eps)
            m[i3, i2, i1, i0] = mi
            v[i3, i2, i1, i0] = vi
            o[i3, i2, i1, i0] = w


@njit(parallel=True, **_OPTS)
def cpy(s, ls, o, kind, raw, tile):
    """tile 0: o's elements in row-major order := s's in row-major order (shapes may differ);
    tile 1: o := s tiled by modulo indexing (REPEAT; with equal shapes, an element-wise copy).
    raw: same element type, copied bit for bit."""
    n3, n2, n1, n0 = o.shape
    m3, m2, m1, m0 = s.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        j3 = i3 % m3
        j2 = i2 % m2
        j1 = i1 % m1
        for i0 in range(n0):
            j0 = i0 if m0 == n0 else i0 % m0
            if not tile:
                f = r * n0 + i0
                j0 = f % m0
                f //= m0
                j1 = f % m1
                f //= m1
                j2 = f % m2
                j3 = f // m2
            if raw:
                o[i3, i2, i1, i0] = s[j3, j2, j1, j0]
            else:
                st(o, kind, i3, i2, i1, i0, ld(s, ls, j3, j2, j1, j0))


@njit(parallel=True, **_OPTS)
def repeat_back(x, lx, o, kind):
    """o[j] = sum of x over the tiles of o's shape (tile index outer: x index = tile * size + j)."""
    s3, s2, s1, s0 = o.shape
    t3 = x.shape[0] // s3
    t2 = x.shape[1] // s2
    t1 = x.shape[2] // s1
    t0 = x.shape[3] // s0
    for r in prange(s3 * s2 * s1):
        j3, j2, j1 = row_index(r, s1, s2)
        for j0 in range(s0):
            acc = 0.0
            for k3 in range(t3):
                for k2 in range(t2):
                    for k1 in range(t1):
                        for k0 in range(t0):
                            acc += ld(x, lx, k3 * s3 + j3, k2 * s2 + j2, k1 * s1 + j1, k0 * s0 + j0)
            st(o, kind, j3, j2, j1, j0, acc)


@njit(parallel=True, **_OPTS)
def get_rows_back(g, lg, idx, o):
    """o (zeros of c's shape) with row idx[i] += g[:, i]; float64 sums in index order."""
    nr, n0 = o.shape[2], o.shape[3]
    ni = idx.shape[3]
    for r in prange(nr):
        acc = np.zeros(n0, np.float64)
        for i in range(ni):
            if idx[0, 0, 0, i] == r:
                for i0 in range(n0):
                    acc[i0] += ld(g, lg, 0, 0, i, i0)
        for i0 in range(n0):
            o[0, 0, r, i0] = acc[i0]


@njit(parallel=True, **_OPTS)
def reduce_all(x, lx, y, ly, o, kind, mode):
    """o[0] := mode 0: the sum of x; mode 1: the number of elements where x == y."""
    n3, n2, n1, n0 = x.shape
    nr = n3 * n2 * n1
    part = np.zeros(nr, np.float64)
    for r in prange(nr):
        i3, i2, i1 = row_index(r, n1, n2)
        acc = 0.0
        if mode == 0:
            for i0 in range(n0):
                acc += ld(x, lx, i3, i2, i1, i0)
        else:
            for i0 in range(n0):
                if ld(x, lx, i3, i2, i1, i0) == ld(y, ly, i3, i2, i1, i0):
                    acc += 1.0
        part[r] = acc
    total = 0.0
    for r in range(nr):
        total += part[r]
    st(o, kind, 0, 0, 0, 0, total)


@njit(parallel=True, **_OPTS)
def argmax(x, o):
    """o[0, 0, 0, i1] = index of row i1's maximum by ggml's loop (max = MAX(max, v); if max == v,
    take the index): the last one on ties; a NaN resets the running max to the next element."""
    n1, n0 = x.shape[2], x.shape[3]
    for i1 in prange(n1):
        best = 0
        mx = -np.inf
        for i0 in range(n0):
            v = x[0, 0, i1, i0]
            mx = mx if mx > v else v
            if mx == v:
                best = i0
        o[0, 0, 0, i1] = best


@njit(parallel=True, **_OPTS)
def get_rows(a, la, idx, o):
    n3, n2, n1, n0 = o.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        row = idx[0, i3, i2, i1]
        for i0 in range(n0):
            o[i3, i2, i1, i0] = ld(a, la, i3, i2, row, i0)


# ------------------------------------------------------------------ row ops
@njit(parallel=True, **_OPTS)
def rows(x, lx, y, ly, o, kind, op, p0):
    """Per-row ops over x (and y): 0 SUM_ROWS, 1 MEAN, 2 NORM, 3 RMS_NORM, 4 RMS_NORM_BACK
    (x = dz, y = x), 5 SOFT_MAX_BACK (x = dy, y = y, p0 = scale), 6 DIAG_MASK_INF,
    7 DIAG_MASK_ZERO (p0 = n_past), 8 L2_NORM. p0 is eps for the norms."""
    n3, n2, n1 = x.shape[0], x.shape[1], x.shape[2]
    n0 = x.shape[3]
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        if op == 0 or op == 1:
            acc = 0.0
            for i0 in range(n0):
                acc += ld(x, lx, i3, i2, i1, i0)
            if op == 1:
                acc = acc / n0
            st(o, kind, i3, i2, i1, 0, acc)
        elif op == 2:
            mean = 0.0
            for i0 in range(n0):
                mean += ld(x, lx, i3, i2, i1, i0)
            mean = mean / n0
            var = 0.0
            for i0 in range(n0):
                c = ld(x, lx, i3, i2, i1, i0) - mean
                var += c * c
            den = np.sqrt(var / n0 + p0)
            for i0 in range(n0):
                st(o, kind, i3, i2, i1, i0, (ld(x, lx, i3, i2, i1, i0) - mean) / den)
        elif op == 3:
            ss = 0.0
            for i0 in range(n0):
                c = ld(x, lx, i3, i2, i1, i0)
                ss += c * c
            den = np.sqrt(ss / n0 + p0)
            for i0 in range(n0):
                st(o, kind, i3, i2, i1, i0, ld(x, lx, i3, i2, i1, i0) / den)
        elif op == 4:
            sxx = 0.0
            sxdz = 0.0
            for i0 in range(n0):
                dz = ld(x, lx, i3, i2, i1, i0)
                xv = ld(y, ly, i3, i2, i1, i0)
                sxx += xv * xv
                sxdz += xv * dz
            rrms = 1.0 / np.sqrt(sxx / n0 + p0)
            c = sxdz / (sxx + n0 * p0)
            for i0 in range(n0):
                dz = ld(x, lx, i3, i2, i1, i0)
                xv = ld(y, ly, i3, i2, i1, i0)
                st(o, kind, i3, i2, i1, i0, (dz - xv * c) * rrms)
        elif op == 5:
            dot = 0.0
            for i0 in range(n0):
                dot += ld(y, ly, i3, i2, i1, i0) * ld(x, lx, i3, i2, i1, i0)
            for i0 in range(n0):
                dy = ld(x, lx, i3, i2, i1, i0)
                yv = ld(y, ly, i3, i2, i1, i0)
                st(o, kind, i3, i2, i1, i0, p0 * yv * (dy - dot))
        elif op == 8:
            ss = 0.0
            for i0 in range(n0):
                c = ld(x, lx, i3, i2, i1, i0)
                ss += c * c
            den = np.sqrt(ss)
            den = den if den > p0 else p0  # fmaxf(norm, eps), as ggml: a NaN norm gives eps
            for i0 in range(n0):
                st(o, kind, i3, i2, i1, i0, ld(x, lx, i3, i2, i1, i0) / den)
        else:
            fill = -np.inf if op == 6 else 0.0
            for i0 in range(n0):
                if i0 > p0 + i1:
                    st(o, kind, i3, i2, i1, i0, fill)
                else:
                    st(o, kind, i3, i2, i1, i0, ld(x, lx, i3, i2, i1, i0))


@njit(parallel=True, **_OPTS)
def soft_max(x, mask, lm, sinks, o, slopes, scale, has_mask, has_sinks):
    n3, n2, n1, n0 = o.shape
    m3, m2 = mask.shape[0], mask.shape[1]
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        slope = slopes[i2]
        j3 = i3 % m3
        j2 = i2 % m2
        mx = -np.inf
        for i0 in range(n0):
            v = np.float64(np.float32(np.float64(x[i3, i2, i1, i0]) * scale))  # float32, as ggml
            if has_mask:
                v = np.float64(np.float32(v + slope * ld(mask, lm, j3, j2, i1, i0)))
            if v > mx:
                mx = v
        sk = 0.0
        if has_sinks:
            sk = np.float64(sinks[0, 0, 0, i2])
            if sk > mx:
                mx = sk
        e = np.empty(n0, np.float64)  # the row's exponentials, so each is computed once
        den = 0.0
        for i0 in range(n0):
            v = np.float64(np.float32(np.float64(x[i3, i2, i1, i0]) * scale))  # float32, as ggml
            if has_mask:
                v = np.float64(np.float32(v + slope * ld(mask, lm, j3, j2, i1, i0)))
            e[i0] = np.exp(v - mx)
            den += e[i0]
        if has_sinks:
            den += np.exp(sk - mx)
        for i0 in range(n0):
            o[i3, i2, i1, i0] = e[i0] / den


@njit(**_OPTS)
def _row_max_lse(a, i3, i2, i1):
    """(max, ln sum exp(x - max)) of row (i3, i2, i1) of a, in float64."""
    n0 = a.shape[3]
    mx = -np.inf
    for i0 in range(n0):
        v = np.float64(a[i3, i2, i1, i0])
        if v > mx:
            mx = v
    se = 0.0
    for i0 in range(n0):
        se += np.exp(np.float64(a[i3, i2, i1, i0]) - mx)
    return mx, np.log(se)


@njit(parallel=True, **_OPTS)
def cross_entropy(a, b, o, g, mode):
    """mode 0: o[0] = -(1/nrows) sum b * log_softmax(a); mode 1: o = (softmax(a) - b) * g / nrows."""
    n3, n2, n1, n0 = a.shape
    nr = n3 * n2 * n1
    part = np.zeros(nr, np.float64)
    for r in prange(nr):
        i3, i2, i1 = row_index(r, n1, n2)
        mx, lse = _row_max_lse(a, i3, i2, i1)
        if mode == 0:
            acc = 0.0
            for i0 in range(n0):
                acc += np.float64(b[i3, i2, i1, i0]) * (np.float64(a[i3, i2, i1, i0]) - mx - lse)
            part[r] = acc
        else:
            for i0 in range(n0):
                p = np.exp(np.float64(a[i3, i2, i1, i0]) - mx - lse)
                o[i3, i2, i1, i0] = (p - np.float64(b[i3, i2, i1, i0])) * g / nr
    if mode == 0:
        total = 0.0
        for r in range(nr):
            total += part[r]
        o[0, 0, 0, 0] = -total / nr


@njit(parallel=True, **_OPTS)
def cross_entropy_ids(a, ids, o, g, mode):
    """cross_entropy with one class index per row (ids[i3, i2, i1]); the indices are checked by the caller."""
    n3, n2, n1, n0 = a.shape
    nr = n3 * n2 * n1
    part = np.zeros(nr, np.float64)
    for r in prange(nr):
        i3, i2, i1 = row_index(r, n1, n2)
        mx, lse = _row_max_lse(a, i3, i2, i1)
        k = ids[i3, i2, i1]
        if mode == 0:
            part[r] = np.float64(a[i3, i2, i1, k]) - mx - lse
        else:
            for i0 in range(n0):
                p = np.exp(np.float64(a[i3, i2, i1, i0]) - mx - lse)
                o[i3, i2, i1, i0] = (p - (1.0 if i0 == k else 0.0)) * g / nr
    if mode == 0:
        total = 0.0
        for r in range(nr):
            total += part[r]
        o[0, 0, 0, 0] = -total / nr


@njit(parallel=True, **_OPTS)
def group_norm(x, o, n_groups, eps):
    """(x - mean) / sqrt(var + eps) over groups of ceil(ne2 / n_groups) channels (dim 2), per i3."""
    n3, nc, n1, n0 = x.shape
    per = (nc + n_groups - 1) // n_groups
    ng = (nc + per - 1) // per
    for task in prange(n3 * ng):
        i3 = task // ng
        c0 = (task % ng) * per
        c1 = min(c0 + per, nc)
        cnt = (c1 - c0) * n1 * n0
        mean = 0.0
        for i2 in range(c0, c1):
            for i1 in range(n1):
                for i0 in range(n0):
                    mean += np.float64(x[i3, i2, i1, i0])
        mean = mean / cnt
        var = 0.0
        for i2 in range(c0, c1):
            for i1 in range(n1):
                for i0 in range(n0):
                    c = np.float64(x[i3, i2, i1, i0]) - mean
                    var += c * c
        den = np.sqrt(var / cnt + eps)
        for i2 in range(c0, c1):
            for i1 in range(n1):
                for i0 in range(n0):
                    o[i3, i2, i1, i0] = (np.float64(x[i3, i2, i1, i0]) - mean) / den


@njit(parallel=True, **_OPTS)
def glu(a, la, b, lb, o, kind, op, split, swapped, alpha, limit):
    """Gated linear units: o = act(x) * g with x, g the halves of a's rows (split; swapped
    exchanges them) or x = a, g = b. op is the unary code of act; -1 is SWIGLU_OAI."""
    n3, n2, n1, n0 = o.shape
    ox = n0 if (split and swapped) else 0
    og = 0 if not split else (0 if swapped else n0)
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        for i0 in range(n0):
            x = ld(a, la, i3, i2, i1, i0 + ox)
            if split:
                g = ld(a, la, i3, i2, i1, i0 + og)
            else:
                g = ld(b, lb, i3, i2, i1, i0)
            if op < 0:
                xc = limit if limit < x else x  # std::min(x, limit): NaN stays NaN
                gc = -limit if g < -limit else (limit if limit < g else g)  # std::clamp
                v = xc * _sigmoid(alpha * xc) * (gc + 1.0)
            elif op == 8 and x <= -GELU_CLAMP:  # GEGLU: ggml gives 0 whatever g is
                v = 0.0
            else:
                v = unary_value(op, x, 0.0, 0.0, 0.0, 0.0) * g
            st(o, kind, i3, i2, i1, i0, v)


@njit(parallel=True, **_OPTS)
def concat(a, b, o, ax):
    """o = a followed by b along NumPy axis ax (same element type: copied bit for bit)."""
    n3, n2, n1, n0 = o.shape
    na = a.shape[ax]
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        for i0 in range(n0):
            if ax == 0:
                k = i3
            elif ax == 1:
                k = i2
            elif ax == 2:
                k = i1
            else:
                k = i0
            if k < na:
                o[i3, i2, i1, i0] = a[i3, i2, i1, i0]
            elif ax == 0:
                o[i3, i2, i1, i0] = b[i3 - na, i2, i1, i0]
            elif ax == 1:
                o[i3, i2, i1, i0] = b[i3, i2 - na, i1, i0]
            elif ax == 2:
                o[i3, i2, i1, i0] = b[i3, i2, i1 - na, i0]
            else:
                o[i3, i2, i1, i0] = b[i3, i2, i1, i0 - na]


@njit(parallel=True, **_OPTS)
def index_map(x, o, mode, l3, l2, l1, l0, circular):
    """Each element of o is an element of x or zero. mode 0 PAD (left pads l3..l0; circular:
    periodic wrap, else zeros), 1 PAD_REFLECT_1D (l0 = p0), 2 DIAG (o[.., i1, i0] = x[.., 0, i0]
    where i0 == i1, else 0)."""
    n3, n2, n1, n0 = o.shape
    m3, m2, m1, m0 = x.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        if mode == 2:
            for i0 in range(n0):
                o[i3, i2, i1, i0] = x[i3, i2, 0, i0] if i0 == i1 else 0.0
        else:
            j3 = i3 - l3
            j2 = i2 - l2
            j1 = i1 - l1
            if circular:
                j3 %= m3
                j2 %= m2
                j1 %= m1
            inside = 0 <= j3 < m3 and 0 <= j2 < m2 and 0 <= j1 < m1
            for i0 in range(n0):
                j0 = i0 - l0
                if mode == 1:
                    if j0 < 0:
                        j0 = -j0
                    if j0 >= m0:
                        j0 = 2 * (m0 - 1) - j0
                elif circular:
                    j0 %= m0
                if inside and 0 <= j0 < m0:
                    o[i3, i2, i1, i0] = x[j3, j2, j1, j0]
                else:
                    o[i3, i2, i1, i0] = 0.0


@njit(parallel=True, **_OPTS)
def argsort(x, o, desc):
    """o[.., i0] = the indices that sort each row ascending (desc: descending); stable."""
    n3, n2, n1, n0 = x.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        row = np.empty(n0, np.float64)
        for i0 in range(n0):
            v = np.float64(x[i3, i2, i1, i0])
            row[i0] = -v if desc else v
        idx = np.argsort(row, kind="mergesort")
        for i0 in range(n0):
            o[i3, i2, i1, i0] = idx[i0]


@njit(parallel=True, **_OPTS)
def generate(t, o, mode, p0, p1):
    """mode 0 ARANGE: o[0, 0, 0, i] = p0 + i * p1 (t unused); mode 1 TIMESTEP_EMBEDDING
    (p0 = max_period): o[0, 0, i, j] = cos(t_i f_j), o[0, 0, i, j + half] = sin(t_i f_j),
    f_j = exp(-ln(max_period) j / half), an odd dim's last column 0."""
    if mode == 0:
        n0 = o.shape[3]
        for i in prange(n0):
            o[0, 0, 0, i] = p0 + i * p1
    else:
        nr, dim = o.shape[2], o.shape[3]
        half = dim // 2
        lmp = np.log(p0)
        for i in prange(nr):
            tv = np.float64(t[0, 0, 0, i])
            for j in range(half):
                f = np.exp(-lmp * j / half)
                o[0, 0, i, j] = np.cos(tv * f)
                o[0, 0, i, j + half] = np.sin(tv * f)
            if dim % 2:
                o[0, 0, i, dim - 1] = 0.0


# ------------------------------------------------------------------ dispatch
def _numba_type(x, c_layout: bool = False):
    if isinstance(x, np.ndarray):
        if not (x.flags.writeable and x.flags.aligned):
            # one compiled version per dtype combination: a read-only or unaligned variant would
            # make later calls with ordinary arrays ambiguous
            raise Unsupported("the numba kernels take writable, aligned arrays only")
        return types.Array(numba.from_dtype(x.dtype), x.ndim, "C" if c_layout and x.flags.c_contiguous else "A")
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("pass ints, not bools, to the kernels")
    if isinstance(x, int):
        return types.int64
    if isinstance(x, float):
        return types.float64
    raise TypeError(f"unexpected kernel argument {type(x).__name__}")


_LOCK = threading.Lock()  # compiling
_RUN = threading.Lock()  # launching parallel kernels: numba's threading layers are not all thread-safe


def _serial_dispatcher(dispatcher):
    """The same kernel compiled without ``parallel`` (its ``prange`` loops run as ``range`` on
    the calling thread): no thread-pool launch, which costs more than a small node's work.
    A copy of the Python function under another qualified name, so that the on-disk cache
    (keyed by name, not by compile options) keeps the two compilations apart."""
    f = dispatcher.py_func
    g = pytypes.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial", f.__defaults__, f.__closure__)
    g.__qualname__ = f.__qualname__ + "_serial"
    g.__module__, g.__doc__ = f.__module__, f.__doc__
    opts = {k: v for k, v in dispatcher.targetoptions.items() if k not in ("parallel", "nopython")}
    return njit(cache=True, **opts)(g)


@contextmanager
def _compiling_across_processes(dispatcher, sig: tuple):
    """Hold a lock file in the kernel's on-disk cache folder, one per kernel and signature, while it compiles:
    a second process (a test worker, a subprocess, another program) that needs the same compilation waits,
    then numba's compile() finds it in the cache and loads it instead of compiling it again (with a cold
    cache, two processes otherwise both spend the compile's CPU). Where there is no cache folder, or it
    cannot be written, or the system has no fcntl, compiles without the lock."""
    try:
        import fcntl
        folder = dispatcher._cache.cache_path
        os.makedirs(folder, exist_ok=True)
        name = f"{dispatcher.py_func.__qualname__}-{zlib.crc32(repr(sig).encode()):08x}.lock"
        f = open(os.path.join(folder, name), "a")
    except (ImportError, AttributeError, OSError):
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes
        yield


class Kernel:
    """A dispatcher compiled once per argument-type signature, every array typed as
    layout ``A``: contiguous arrays convert to it, so they never trigger a second
    compilation. ``serial()`` is the same kernel compiled without the thread pool."""

    def __init__(self, dispatcher, c_layout: bool = False, parallel: bool = True) -> None:
        self.dispatcher = dispatcher  # compilation is disabled after the first explicit compile
        self.c_layout = c_layout  # C-contiguous arrays typed as layout C (unit strides known: vectorisable)
        self.parallel = parallel  # launches go through numba's thread pool (serialised by _RUN)
        self.compiled: set[tuple] = set()
        self.entry: dict[tuple, object] = {}  # cheap argument key -> the compiled entry point
        self._serial: Kernel | None = None

    def serial(self) -> Kernel:
        """This kernel compiled without ``parallel`` (created, and compiled per signature, on first use)."""
        if self._serial is None:
            with _LOCK:
                if self._serial is None:
                    self._serial = (Kernel(_serial_dispatcher(self.dispatcher), self.c_layout, parallel=False)
                                    if self.parallel else self)
        return self._serial

    def entry_point(self, args: tuple):
        """The compiled function for these arguments (compiled on first use); call it with them.
        Dispatch is on a cheap key (dtype, ndim, usable, contiguous) instead of numba's own
        typing of every argument: small nodes are dominated by this per-call cost."""
        c = self.c_layout
        key = tuple((x.dtype.char, x.ndim, x.flags.writeable and x.flags.aligned, c and x.flags.c_contiguous)
                    if isinstance(x, np.ndarray) else type(x) for x in args)
        entry = self.entry.get(key)
        if entry is None:
            entry = self.entry[key] = self._entry_point(tuple(_numba_type(x, c) for x in args))
        return entry

    def __call__(self, *args):
        entry = self.entry_point(args)
        if not self.parallel:
            return entry(*args)
        with _RUN:
            return entry(*args)

    def _entry_point(self, sig: tuple):
        if sig not in self.compiled:
            with _LOCK:
                if sig not in self.compiled:
                    self.dispatcher.disable_compile(False)
                    try:
                        with _compiling_across_processes(self.dispatcher, sig):
                            self.dispatcher.compile(sig)
                    except NumbaError as e:  # a type combination the kernel cannot take: fall back openly
                        name = self.dispatcher.py_func.__name__
                        raise Unsupported(f"numba kernel {name!r} cannot be compiled for {sig}: "
                                          f"{str(e).splitlines()[0]}") from e
                    finally:
                        if self.dispatcher.signatures:  # numba refuses to disable with none compiled
                            self.dispatcher.disable_compile(True)
                    self.compiled.add(sig)
        return self.dispatcher.overloads[sig].entry_point


# general kernels also typed as layout C for C-contiguous arguments (a second compilation,
# vectorised): those whose nodes are contiguous in practice (the optimizer step)
C_LAYOUT = frozenset({"adamw"})

KERNELS = {name: Kernel(f, c_layout=name in C_LAYOUT) for name, f in (
    ("unary", unary), ("binary", binary), ("adamw", adamw), ("cpy", cpy), ("get_rows", get_rows),
    ("rows", rows), ("soft_max", soft_max), ("cross_entropy", cross_entropy),
    ("cross_entropy_ids", cross_entropy_ids),
    ("repeat_back", repeat_back), ("get_rows_back", get_rows_back),
    ("reduce_all", reduce_all), ("argmax", argmax), ("group_norm", group_norm), ("glu", glu),
    ("concat", concat), ("index_map", index_map), ("argsort", argsort), ("generate", generate))}


def register_all() -> dict:
    """KERNELS with the kernels of the other _jit_* modules: called by kernels._jit(), not at import, because
    those modules import this one (importing one of them first must not meet a half-initialized module)."""
    if "q_mul_mat" in KERNELS:
        return KERNELS
    from ._jit_ext import KERNELS as ext
    from ._jit_fast import KERNELS as fast
    from ._jit_qdot import KERNELS as qdot
    from ._jit_quant import KERNELS as quant
    KERNELS.update({name: Kernel(f) for name, f in ext.items()})
    KERNELS.update({name: Kernel(f, c_layout=True) for name, f in fast.items()})
    KERNELS.update({name: Kernel(f, c_layout=True) for name, f in quant.items()})
    KERNELS.update({name: Kernel(f) for name, f in qdot.items()})  # one compilation (layout A) serves all
    return KERNELS
