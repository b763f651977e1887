"""LLVM vector code for the integer dot products of Q2_K and Q3_K super-blocks with Q8_K activations
(numba intrinsics, used by :mod:`._jit_qdot`; the building blocks and the vector ISA are :mod:`._qvec`'s).

Both formats have 16 sub-blocks of 16 values, so, as Q6_K, each lane of the products (four values) is
multiplied by its sub-block's integer scale. Q2_K's values are 0..3 with a min per sub-block: the mins come
back as ``dmin * sum_j min_j * (sum of sub-block j's activations)``, from per-16 activation sums (``xb``).
Q3_K's values are 2 low bits and a high bit, the value ``low + 4 * high - 4``: the unsigned ``low + 4 * high``
(0..7) goes to the products and the 4 comes back through the lanes' start values (``xc``: -4 times each four
activations' sum), then the signed 6-bit scale multiplies the lane; on AVX2, ggml's sign trick instead (the
value's magnitude times the activation with its sign: Q8_K's values are within +-127) and the scales applied
in ``vpmaddwd``, no 32-bit multiply. All integer sums are exact; per
super-block one horizontal sum and ggml's float32 scaling.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import _qvec as V
from ._qvec import F32, I8, I16, I32, I64, _concat, _const, _dpbusd, _f16, _hsum, _load, _ptr, _shuffle, vec

_ZERO16 = ir.Constant(vec(I32, 16), [0] * 16)


def _two_bits(b: ir.IRBuilder, q) -> list:
    """The four 2-bit fields of 32 bytes q: field j (bits 2j, 2j + 1) of byte l is value 32j + l of 128."""
    return [b.and_(b.lshr(q, _const(I8, 32, 2 * j)), _const(I8, 32, 3)) for j in range(4)]


def _q3_k_scales(b: ir.IRBuilder, s) -> ir.Value:
    """Q3_K's 16 signed scales (16 x i8, each 6-bit value - 32) from its 12 scale bytes (the last 12 of the
    16 bytes s, loaded from 4 bytes before them so as not to read past the block): scale k has its low
    4 bits in the nibbles of bytes 0..7 (the low nibbles for k < 8, the high for 8..15, byte k % 8) and
    its top 2 bits in bits 2 * (k // 4) of byte 8 + k % 4."""
    s32 = b.zext(_shuffle(b, s, s, list(range(4, 16)) + [0] * 4), vec(I32, 16))
    low = _shuffle(b, s32, s32, list(range(8)) * 2)
    low = b.and_(b.lshr(low, ir.Constant(vec(I32, 16), [0] * 8 + [4] * 8)), _const(I32, 16, 0xF))
    top = _shuffle(b, s32, s32, [8, 9, 10, 11] * 4)
    top = b.and_(b.lshr(top, ir.Constant(vec(I32, 16), [2 * (k // 4) for k in range(16)])), _const(I32, 16, 3))
    return b.trunc(b.sub(b.or_(low, b.shl(top, _const(I32, 16, 4))), _const(I32, 16, 32)), vec(I8, 16))


def _lane_scales(b: ir.IRBuilder, sc, first: int) -> ir.Value:
    """16 x i32: the scales sc[first:first + 4] (16 x i8, signed), each for four lanes (16 values)."""
    return b.sext(_shuffle(b, sc, sc, [first + i // 4 for i in range(16)]), vec(I32, 16))


def _scaled_dot(b: ir.IRBuilder, u, s, sc, first: int) -> ir.Value:
    """16 int32 lanes: lane i is scale sc[first + i // 4] (sc: 16 x i8, signed) times the sum of the four products
    u * s of lane i (64 unsigned and 64 signed bytes). On AVX2 the int16 pair sums of ``vpmaddubsw`` are multiplied
    by the scales in ``vpmaddwd`` (no 32-bit multiply; the pairs do not saturate: |u| <= 7 here); elsewhere the
    lanes of ``_dpbusd`` are."""
    if V.MODE != "avx2":
        return b.mul(_dpbusd(b, _ZERO16, u, s), _lane_scales(b, sc, first))
    sc16 = b.sext(_shuffle(b, sc, sc, [first + i // 8 for i in range(32)]), vec(I16, 32))
    halves = zip(V._halves(b, u), V._halves(b, s))
    pairs = [V._x86(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), x, y) for x, y in halves]
    lanes = [V._x86(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), p, c) for p, c in zip(pairs, V._halves(b, sc16))]
    return _concat(b, *lanes)


def low_k_superblocks(fmt: str, cols: int):
    """An intrinsic f(w, wo, xq, xc, xb, xd, xo, xs) -> ``cols`` float32 (a tuple when cols > 1): the dot
    products of the Q2_K or Q3_K super-block at byte wo of w with the Q8_K activations xq[xo + c * xs:][:256]
    (scale xd[. // 256]; Q3_K: the offset terms xc[. // 4:]; Q2_K: the sums of 16 values xb[. // 16:]).
    Q2_K: dx * d * sum_j scale_j * (sub-block j's integer sum) - dx * dmin * sum_j min_j * xb_j; Q3_K:
    dx * d * sum_j scale_j * (sub-block j's integer sum). The weights are unpacked once for every column;
    per column the arithmetic is that of cols = 1."""
    assert fmt in ("Q2_K", "Q3_K")

    @intrinsic
    def superblock(typingctx, w, wo, xq, xc, xb, xd, xo, xs):
        ret = types.float32 if cols == 1 else types.UniTuple(types.float32, cols)
        sig = ret(w, types.int64, xq, xc, xb, xd, types.int64, types.int64)

        def codegen(context, b, signature, args):
            wty, _, qty, cty, bty, dty, _, _ = signature.args
            w_, wo_, xq_, xc_, xb_, xd_, xo_, xs_ = args

            def at(off: int):
                return b.add(wo_, ir.Constant(I64, off))
            if fmt == "Q2_K":  # scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
                sb = _load(context, b, wty, w_, wo_, vec(I8, 16))
                sc = b.and_(sb, _const(I8, 16, 0xF))
                mn = b.zext(b.lshr(sb, _const(I8, 16, 4)), vec(I32, 16))
                qs, dw_at = 16, 80
            else:  # hmask[32], qs[64], scales[12], d
                sc = _q3_k_scales(b, _load(context, b, wty, w_, at(92), vec(I8, 16)))
                hm = _load(context, b, wty, w_, wo_, vec(I8, 32))
                qs, dw_at = 32, 108
            xi0 = [b.add(xo_, b.mul(xs_, ir.Constant(I64, c))) for c in range(cols)]
            acc = [_ZERO16] * cols
            for n in range(2):  # 128 values from 32 bytes of qs
                v = _two_bits(b, _load(context, b, wty, w_, at(qs + 32 * n), vec(I8, 32)))
                if fmt == "Q3_K":  # hmask bit 4n + j of byte l: the high bit of value 128n + 32j + l
                    v = [b.or_(f, b.shl(b.and_(b.lshr(hm, _const(I8, 32, 4 * n + j)), _const(I8, 32, 1)),
                                        _const(I8, 32, 2))) for j, f in enumerate(v)]
                for g in range(2):  # values 128n + 64g + [0, 64): sub-blocks 8n + 4g + [0, 4), four lanes each
                    u = _concat(b, v[2 * g], v[2 * g + 1])
                    first = 8 * n + 4 * g
                    for c in range(cols):
                        xi = b.add(xi0[c], ir.Constant(I64, 128 * n + 64 * g))
                        s = _load(context, b, qty, xq_, xi, vec(I8, 64))
                        if fmt == "Q2_K":
                            acc[c] = b.add(acc[c], _scaled_dot(b, u, s, sc, first))
                        elif V.MODE == "avx2":  # the signed values by the sign trick: no offset
                            su, ss = V._sign_trick(b, b.sub(u, _const(I8, 64, 4)), s)
                            acc[c] = b.add(acc[c], _scaled_dot(b, su, ss, sc, first))
                        else:
                            start = _load(context, b, cty, xc_, b.lshr(xi, ir.Constant(I64, 2)), vec(I32, 16))
                            acc[c] = b.add(acc[c], b.mul(_dpbusd(b, start, u, s), _lane_scales(b, sc, first)))
            dw = _f16(context, b, wty, w_, at(dw_at))
            out = []
            for c in range(cols):
                dx = b.load(_ptr(context, b, dty, xd_, b.lshr(xi0[c], ir.Constant(I64, 8)), F32), align=4)
                d = b.fmul(dx, dw)
                r = b.fmul(d, b.sitofp(_hsum(b, acc[c]), F32))
                if fmt == "Q2_K":
                    sums = _load(context, b, bty, xb_, b.lshr(xi0[c], ir.Constant(I64, 4)), vec(I32, 16))
                    mins = _hsum(b, b.mul(mn, sums))
                    dmin = b.fmul(dx, _f16(context, b, wty, w_, at(dw_at + 2)))
                    r = b.fsub(r, b.fmul(dmin, b.sitofp(mins, F32)))
                out.append(r)
            return out[0] if cols == 1 else context.make_tuple(b, signature.return_type, out)
        return sig, codegen
    return superblock
