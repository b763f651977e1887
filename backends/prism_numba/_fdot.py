"""Float32 dot products in one fixed order, as LLVM vector code (a numba intrinsic): the building block of
every F32/F16/BF16 MUL_MAT (``_jit_fast.mul_mat``) and of the float path of quantized ones
(``_jit_quant.q_mul_mat``).

Why an intrinsic: a float loop compiled with ``reassoc`` is vectorised in whatever order LLVM's cost
model picks for that loop (its vector width, how many accumulators it interleaves, the remainder loop),
and that pick differs between a loop of eight rows and one of a single row, or between the serial and
the thread-pool compilation of a kernel. A row's product then depended on how many rows its MUL_MAT had.
Here the order is written out: 16 float32 lanes, lane j accumulating the fused products of elements
k = j (mod 16) in order, the last partial vector zero-padded, then the lanes summed by halving
(8 + 8, 4 + 4, 2 + 2, 1 + 1). ``rows x cols`` products share each load, each with that same arithmetic,
so any kernel built from these gets the same bits for a product whatever else it computes.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16
_F32, _I64 = ir.FloatType(), ir.IntType(64)
_VEC = ir.VectorType(_F32, LANES)


def _row_ptr(context, b, aryty, ary, offset):
    """Pointer to the float32 element ``offset`` elements past the array's first element."""
    data = context.make_array(aryty)(context, b, ary).data
    return b.gep(data, [offset], inbounds=True)


def _vload(b, p):
    return b.load(b.bitcast(p, _VEC.as_pointer()), align=4)


def _fma(b, x, y, z):
    fn = b.module.declare_intrinsic(f"llvm.fma.v{LANES}f32", fnty=ir.FunctionType(_VEC, [_VEC, _VEC, _VEC]))
    return b.call(fn, [x, y, z])


def _hsum(b, v):
    n = LANES
    while n > 1:
        n //= 2
        lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n))))
        hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n, 2 * n))))
        v = b.fadd(lo, hi)
    return b.extract_element(v, ir.Constant(ir.IntType(32), 0))


def _lane_sums(b, xp, yp, n, rows, cols):
    """The rows x cols dot products of the n values at pointers xp[r] and yp[c], in the module's order."""
    m = rows * cols
    zero = ir.Constant(_VEC, [0.0] * LANES)
    acc = [cgutils.alloca_once_value(b, zero) for _ in range(m)]  # zeroed here, at every call of this
    full = b.and_(n, ir.Constant(_I64, -LANES))
    with cgutils.for_range_slice(b, ir.Constant(_I64, 0), full, ir.Constant(_I64, LANES), _I64) as (k, _):
        xv = [_vload(b, b.gep(p, [k], inbounds=True)) for p in xp]
        yv = [_vload(b, b.gep(p, [k], inbounds=True)) for p in yp]
        for r in range(rows):
            for c in range(cols):
                a = acc[r * cols + c]
                b.store(_fma(b, xv[r], yv[c], b.load(a)), a)
    # the last n % 16 values, zero-padded to a whole vector (copied to the stack: never read past n)
    with b.if_then(b.icmp_signed("<", full, n)):
        pads = [cgutils.alloca_once_value(b, zero) for _ in range(rows + cols)]
        for pad, p in zip(pads, xp + yp):
            dst = b.bitcast(pad, _F32.as_pointer())
            with cgutils.for_range_slice(b, full, n, ir.Constant(_I64, 1), _I64) as (k, _):
                b.store(b.load(b.gep(p, [k], inbounds=True)), b.gep(dst, [b.sub(k, full)], inbounds=True))
        xv = [b.load(pad) for pad in pads[:rows]]
        yv = [b.load(pad) for pad in pads[rows:]]
        for r in range(rows):
            for c in range(cols):
                a = acc[r * cols + c]
                b.store(_fma(b, xv[r], yv[c], b.load(a)), a)
    return [_hsum(b, b.load(a)) for a in acc]


def fdot(rows: int, cols: int):
    """An intrinsic f(x, xo, xs, y, yo, ys, n, block) -> ``rows * cols`` float32 (a tuple unless both are
    1; entry r * cols + c): the dot products of the n float32 values at element offsets xo + r * xs of
    array x with those at yo + c * ys of array y (offsets from each array's first element; the values
    of a row contiguous): per ``block`` values the order of the module docstring, the blocks' sums added
    in order to a total from 0 (a kernel that walks the blocks itself, adding each to a zeroed total,
    gets the same bits)."""
    @intrinsic
    def dot(typingctx, x, xo, xs, y, yo, ys, n, block):
        for t in (x, y):
            if not (isinstance(t, types.Array) and t.dtype == types.float32):
                return None
        m = rows * cols
        ret = types.float32 if m == 1 else types.UniTuple(types.float32, m)
        sig = ret(x, types.int64, types.int64, y, types.int64, types.int64, types.int64, types.int64)

        def codegen(context, b, signature, args):
            xty, _, _, yty, _, _, _, _ = signature.args
            x_, xo_, xs_, y_, yo_, ys_, n_, block_ = args
            xp = [_row_ptr(context, b, xty, x_, b.add(xo_, b.mul(xs_, ir.Constant(_I64, r)))) for r in range(rows)]
            yp = [_row_ptr(context, b, yty, y_, b.add(yo_, b.mul(ys_, ir.Constant(_I64, c)))) for c in range(cols)]
            total = [cgutils.alloca_once_value(b, ir.Constant(_F32, 0.0)) for _ in range(m)]
            with cgutils.for_range_slice(b, ir.Constant(_I64, 0), n_, block_, _I64) as (kb, _):
                left = b.sub(n_, kb)
                kl = b.select(b.icmp_signed("<", left, block_), left, block_)
                sums = _lane_sums(b, [b.gep(p, [kb], inbounds=True) for p in xp],
                                  [b.gep(p, [kb], inbounds=True) for p in yp], kl, rows, cols)
                for t, v in zip(total, sums):
                    b.store(b.fadd(b.load(t), v), t)
            out = [b.load(t) for t in total]
            return out[0] if m == 1 else context.make_tuple(b, signature.return_type, out)
        return sig, codegen
    return dot


#: the shapes the kernels use: one product, eight rows of a by one of b (GEMV), 4 x 4 (tiled GEMM)
dot1, dot8x1, dot4x4 = fdot(1, 1), fdot(8, 1), fdot(4, 4)
