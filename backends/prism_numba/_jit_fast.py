"""Fast paths: kernels typed with layout ``C`` for contiguous arrays (unit strides known, so
LLVM vectorises the inner loops), and MUL_MAT (cache-blocked, register-tiled).

Registered with ``Kernel(c_layout=True)``: a C-contiguous argument is typed as layout C,
anything else as layout A (so strided views still work, at the strided speed).
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from ._fdot import dot1, dot4x4, dot8x1
from ._jit import _OPTS, row_index, unary_value


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


# ------------------------------------------------------------------ elementwise, streaming
# A result far larger than the caches is written with non-temporal (streaming) stores: they
# skip reading each destination line into the cache before overwriting it, a third of the
# memory traffic of o = a op b. LLVM keeps the hint only on aligned vector stores, so these
# intrinsics write one 64-byte line per call (16 float32; two or four stores on AVX2/SSE).
STREAM_VEC = 16
STREAM_BLOCK = 4096  # lines (256 KiB of result) per parallel task, fenced after each
_X86 = platform.machine().lower() in ("x86_64", "amd64", "x86", "i386", "i686")


def _stream_op(opname):
    @intrinsic
    def line_op(typingctx, a, b, o, i):
        """o[i:i+16] = a[i:i+16] op b[i:i+16] (flat C-contiguous float32; &o[i] 64-byte aligned),
        the result stored non-temporally."""
        if not all(isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and t.dtype == types.float32
                   for t in (a, b, o)):
            return None

        def codegen(context, builder, signature, args):
            vt = ir.VectorType(ir.FloatType(), STREAM_VEC)
            ptrs = []
            for ty, val in zip(signature.args[:3], args[:3]):
                data = context.make_array(ty)(context, builder, val).data
                ptrs.append(builder.bitcast(builder.gep(data, [args[3]], inbounds=True), vt.as_pointer()))
            r = getattr(builder, opname)(builder.load(ptrs[0], align=4), builder.load(ptrs[1], align=4))
            store = builder.store(r, ptrs[2], align=64)
            store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
            return context.get_dummy_value()
        return types.void(a, b, o, types.intp), codegen
    return line_op


_line_add, _line_sub, _line_mul, _line_div = (_stream_op(op) for op in ("fadd", "fsub", "fmul", "fdiv"))


@intrinsic
def _store_fence(typingctx):
    """Order this thread's streaming stores before what follows (x86 sfence)."""
    def codegen(context, builder, signature, args):
        if _X86:
            fn = builder.module.declare_intrinsic("llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@njit(inline="always", **_OPTS)
def _scalar_op(op, x, y):
    if op == 0:
        return x + y
    if op == 1:
        return x - y
    if op == 2:
        return x * y
    return x / y


@njit(parallel=True, **_OPTS)
def binary_stream(a, b, o, op):
    """binary_flat for a, b and o of equal lengths far larger than the caches: blocks of
    STREAM_BLOCK lines in parallel, each whole 64-byte line of o written with a streaming store
    (the elements before the first line boundary and after the last whole line: ordinary stores).
    Same float32 arithmetic as binary_flat, so the same results."""
    n = o.shape[0]
    head = ((64 - o.ctypes.data % 64) % 64) // 4  # o is float32-aligned (checked by supports())
    if head > n:
        head = n
    nv = (n - head) // STREAM_VEC  # whole lines
    nblk = (nv + STREAM_BLOCK - 1) // STREAM_BLOCK  # numba's prange gives each thread a contiguous range
    for blk in prange(nblk):
        v0 = blk * STREAM_BLOCK
        v1 = min(v0 + STREAM_BLOCK, nv)
        if op == 0:
            for v in range(v0, v1):
                _line_add(a, b, o, head + v * STREAM_VEC)
        elif op == 1:
            for v in range(v0, v1):
                _line_sub(a, b, o, head + v * STREAM_VEC)
        elif op == 2:
            for v in range(v0, v1):
                _line_mul(a, b, o, head + v * STREAM_VEC)
        else:
            for v in range(v0, v1):
                _line_div(a, b, o, head + v * STREAM_VEC)
        _store_fence()
    for i in range(head):
        o[i] = _scalar_op(op, a[i], b[i])
    for i in range(head + nv * STREAM_VEC, n):
        o[i] = _scalar_op(op, a[i], b[i])


@njit(parallel=True, **_OPTS)
def unary_flat(x, o, op, p0, p1, p2, p3):
    """F32 o = op(x) on flat contiguous arrays (codes: kernels.UNARY_CODES), float64 inside.
    The ops without a library call get a loop each with the op code a constant, so that the
    code's branches fold away and the loop vectorises. (GELU and GELU_QUICK read ggml's F16
    tables inside unary_value: a change there needs this module's cache rebuilt too.)"""
    n = o.shape[0]
    if op == 0:
        for i in prange(n):
            o[i] = unary_value(0, np.float64(x[i]), p0, p1, p2, p3)
    elif op == 2:
        for i in prange(n):
            o[i] = unary_value(2, np.float64(x[i]), p0, p1, p2, p3)
    elif op == 3:
        for i in prange(n):
            o[i] = unary_value(3, np.float64(x[i]), p0, p1, p2, p3)
    elif op == 6:
        for i in prange(n):
            o[i] = unary_value(6, np.float64(x[i]), p0, p1, p2, p3)
    elif op == 21:
        for i in prange(n):
            o[i] = unary_value(21, np.float64(x[i]), p0, p1, p2, p3)
    elif op == 26:
        for i in prange(n):
            o[i] = unary_value(26, np.float64(x[i]), p0, p1, p2, p3)
    elif op == 27:
        for i in prange(n):
            o[i] = unary_value(27, np.float64(x[i]), p0, p1, p2, p3)
    elif op == 28:
        for i in prange(n):
            o[i] = unary_value(28, np.float64(x[i]), p0, p1, p2, p3)
    else:
        for i in prange(n):
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
                v = np.float64(np.float32(np.float64(xr[i]) * p0))  # scaled in float32, as ggml
                if v > mx or v != v:
                    mx = v
            e = np.empty(n0, np.float64)
            for i in range(n0):
                e[i] = exp_v(np.float64(np.float32(np.float64(xr[i]) * p0)) - mx)
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


# ------------------------------------------------------------------ transposition
TRANSPOSE_TILE = 32


@njit(parallel=True, **_OPTS)
def transpose(s, o):
    """o[i3, i2, j, i] = s[i3, i2, i, j], bit for bit, in TRANSPOSE_TILE x TRANSPOSE_TILE tiles
    (a tile's rows of s stay in the first-level cache while its columns are read)."""
    n3, n2, nj, ni = o.shape
    tj = (nj + TRANSPOSE_TILE - 1) // TRANSPOSE_TILE
    for task in prange(n3 * n2 * tj):
        i3, i2, jt = row_index(task, tj, n2)
        j0 = jt * TRANSPOSE_TILE
        j1 = min(j0 + TRANSPOSE_TILE, nj)
        for i0 in range(0, ni, TRANSPOSE_TILE):
            i1 = min(i0 + TRANSPOSE_TILE, ni)
            for j in range(j0, j1):
                orow = o[i3, i2, j]
                for i in range(i0, i1):
                    orow[i] = s[i3, i2, i, j]


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


def cv32(v, lut):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(cv32)
def _cv32(v, lut):
    """An element of a as float32: F16/BF16 bits through the lookup table, F32 as is."""
    if v == types.uint16:
        def impl(v, lut):
            return lut[v]
    else:
        def impl(v, lut):
            return np.float32(v)
    return impl


@njit(**_OPTS)
def add_row_dots(x, xo, xs, g, y, yo, n, block, acc):
    """acc[i] += the dot product of the n float32 values at element offset xo + i * xs of x with those at
    yo of y (per ``block`` values, _fdot's order), for i < g <= 8: eight rows in one vector pass (each load
    of y serving all), fewer one by one; the same bits either way."""
    if g == 8:
        t = dot8x1(x, xo, xs, y, yo, 0, n, block)
        for i in range(8):
            acc[i] += t[i]
    else:
        for i in range(g):
            acc[i] += dot1(x, xo + i * xs, 0, y, yo, 0, n, block)


@njit(**_OPTS)
def contiguous_row(y, buf):
    """y (a float32 row) itself when its values are contiguous, else a copy of it in buf."""
    if y.strides[0] == 4:
        return y
    for k in range(y.shape[0]):
        buf[k] = y[k]
    return buf


@njit(inline="always", **_OPTS)
def _packed_rows(a, la, k3, k2, m, g, kb, kl, buf):
    for i in range(g):
        for k in range(kl):
            buf[0, 0, i, k] = ld32(a, la, k3, k2, m + i, kb + k)
    return buf, 0, buf.shape[3]


def f32_rows(a):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(f32_rows)
def _f32_rows(a):
    """Whether a's rows are float32 values read in place (contiguous along k): a GEMV's direct pass."""
    if a.dtype != types.float32:
        return lambda a: False
    return lambda a: a.strides[3] == 4


def direct_row_dots(a, k3, k2, m, g, y, acc):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(direct_row_dots)
def _direct_row_dots(a, k3, k2, m, g, y, acc):
    """add_row_dots of rows m..m+g of matrix a[k3, k2] read in place (where f32_rows(a)), in one pass over
    k with the blocks of BLOCK_K walked inside it; nothing for F16/BF16 bits (never called for them)."""
    if a.dtype != types.float32:
        return lambda a, k3, k2, m, g, y, acc: None

    def impl(a, k3, k2, m, g, y, acc):
        xo = (k3 * a.strides[0] + k2 * a.strides[1] + m * a.strides[2]) // 4
        add_row_dots(a, xo, a.strides[2] // 4, g, y, 0, a.shape[3], BLOCK_K, acc)
    return impl


def a_rows(a, la, k3, k2, m, g, kb, kl, buf):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(a_rows)
def _a_rows(a, la, k3, k2, m, g, kb, kl, buf):
    """(array, element offset, row stride) of rows m..m+g, values kb..kb+kl, of matrix a[k3, k2] as float32
    for add_row_dots: F32 rows with contiguous values in place, anything else (F16/BF16 bits through la,
    strided values) copied into buf (1 x 1 x 8 x BLOCK_K)."""
    if a.dtype != types.float32:
        return _packed_rows.py_func

    def impl(a, la, k3, k2, m, g, kb, kl, buf):
        if a.strides[3] == 4:
            return a, (k3 * a.strides[0] + k2 * a.strides[1] + m * a.strides[2]) // 4 + kb, a.strides[2] // 4
        return _packed_rows(a, la, k3, k2, m, g, kb, kl, buf)
    return impl


TILE_M = 64  # rows of a per task (multiple of 4)
TILE_N = 64  # rows of b per task (multiple of 4)
BLOCK_K = 512  # measured: 10-25% faster than 256 on the benchmark shapes; panels of 128 KiB stay in L2
GEMV_ROWS = 64  # at most this many rows of a per task when b has fewer than 4 rows


# Every product of MUL_MAT is the same float32 arithmetic whichever branch computes it: per block of
# BLOCK_K values, _fdot's fixed-order dot product, added to a total that starts at 0 in block order. So a
# row of the result does not depend on how many rows b has (GEMV or tiles), where it sits in its tile or
# which compilation (serial or thread pool) runs (tests/test_numba_batch_invariance.py).
@njit(parallel=True, **_OPTS)
def mul_mat(a, la, b, o):
    """o[i3, i2, n, m] = sum_k a[i3 // r3, i2 // r2, m, k] * b[i3, i2, n, k], float32 sums
    (a may be F16/BF16 bits: converted while packed).

    b with fewer than 4 rows: dot products straight from memory (GEMV; memory bound), eight
    rows of a at a time along row views (unit stride when a is contiguous), 8 to GEMV_ROWS rows per task.
    Otherwise tiles of TILE_M rows of a by TILE_N rows of b run in parallel; k is walked in
    blocks of BLOCK_K with both panels packed into contiguous float32 buffers and 4 x 4 dot products
    per vector pass."""
    n3, n2, nn, nm = o.shape
    a3, a2 = a.shape[0], a.shape[1]
    nk = a.shape[3]
    r3 = n3 // a3
    r2 = n2 // a2
    if nn < 4:
        rows = min(GEMV_ROWS, max(8, nm // 64 // 8 * 8))  # at least 64 tasks while rows allow
        tm = (nm + rows - 1) // rows
        for task in prange(n3 * n2 * tm):
            jm = task % tm
            t = task // tm
            i2 = t % n2
            i3 = t // n2
            k3 = i3 // r3
            k2 = i2 // r2
            m = jm * rows
            me = min(m + rows, nm)
            buf = np.empty((1, 1, 8, BLOCK_K), np.float32)
            ybuf = np.empty(nk, np.float32)
            acc = np.empty(8, np.float32)
            direct = f32_rows(a)
            for q in range(nn):
                y = contiguous_row(b[i3, i2, q], ybuf)
                orow = o[i3, i2, q]
                mm = m
                while mm < me:
                    g = 8 if mm + 8 <= me else 1  # eight rows of a share each load of b
                    acc[:] = 0.0
                    if direct:  # one pass, the blocks of BLOCK_K walked inside it
                        direct_row_dots(a, k3, k2, mm, g, y, acc)
                    else:
                        for kb in range(0, nk, BLOCK_K):
                            kl = min(kb + BLOCK_K, nk) - kb
                            x, xo, xs = a_rows(a, la, k3, k2, mm, g, kb, kl, buf)
                            add_row_dots(x, xo, xs, g, y, kb, kl, BLOCK_K, acc)
                    for i in range(g):
                        orow[mm + i] = acc[i]
                    mm += g
        return
    tm = (nm + TILE_M - 1) // TILE_M
    tn = (nn + TILE_N - 1) // TILE_N
    # pack along the axis that is contiguous in memory (k for row-major operands)
    a_rows_major = a.strides[3] == a.itemsize or a.strides[2] > a.strides[3]
    b_rows_major = b.strides[3] == b.itemsize or b.strides[2] > b.strides[3]
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
            if a_rows_major:
                for mm in range(w):
                    for k in range(kl):
                        pa[mm, k] = ld32(a, la, k3, k2, m0 + mm, kb + k)
            else:  # a transposed in memory (OUT_PROD): read along its contiguous axis
                for k in range(kl):
                    for mm in range(w):
                        pa[mm, k] = ld32(a, la, k3, k2, m0 + mm, kb + k)
            if b_rows_major:
                for qq in range(qn):
                    for k in range(kl):
                        pb[qq, k] = b[i3, i2, q0 + qq, kb + k]
            else:
                for k in range(kl):
                    for qq in range(qn):
                        pb[qq, k] = b[i3, i2, q0 + qq, kb + k]
            for qq in range(0, qn, 4):
                for mm in range(0, w, 4):  # rows past w and qn are padding: computed, never stored
                    s = dot4x4(pa, mm * BLOCK_K, BLOCK_K, pb, qq * BLOCK_K, BLOCK_K, kl, BLOCK_K)
                    for r in range(4):
                        for c in range(4):
                            acc[qq + c, mm + r] += s[4 * r + c]
        for qq in range(qn):
            for mm in range(w):
                o[i3, i2, q0 + qq, m0 + mm] = acc[qq, mm]


KERNELS = {f.py_func.__name__: f for f in (binary_flat, binary_stream, unary_flat, rows_fast, transpose,
                                          mul_mat)}
