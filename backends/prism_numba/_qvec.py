"""LLVM vector code for the integer dot products of block weights with int8 activations
(numba intrinsics, used by :mod:`._jit_qdot`).

Written as LLVM IR because numba's loops over 32 bytes do not become vector code: LLVM fully
unrolls a loop of constant trip count into scalar code, and it narrows int8 x int8 products to
16-bit multiplies rather than the multiply-add instructions (measured with ``inspect_asm()``:
no ``vpmaddwd``/``vpdpbusd``). Each intrinsic here does a fixed amount of work (a pair of 32-value
blocks, or a 256-value super-block) in 512-bit vectors and returns a scalar, so the numba loops
around it stay plain scalar loops.

The one instruction the code is built around is ``vpdpbusd`` (AVX-512 VNNI): 16 int32 lanes, each
adding the four products of unsigned bytes of its first operand and signed bytes of its second.
Weights become unsigned bytes (Q4: the nibble 0..15; Q5: 0..31; Q6_K: 0..63; Q8_0: the int8 plus
128), and the offset comes back through the lane's start value, ``-offset * (sum of those four
activations)``, precomputed once per activation row (``xc``). Which instructions compute it is
:mod:`.isa`'s choice: AVX-512 VNNI's ``vpdpbusd`` on 512 bits, AVX-VNNI's on two 256-bit halves,
AVX2's ``vpmaddubsw`` (pairs of products in int16) then ``vpmaddwd`` by ones (pairs of those in
int32, the same four-product lanes). Elsewhere ("portable") there is no integer path: the float path
runs, and only the fp16 conversions here serve it. All are exact: the products fit in int32, and AVX2's
int16 pairs do not saturate (at most 2 * 63 * 128 for the 6-bit values), except Q8_0's int8 + 128,
so on AVX2 Q8_0 takes ggml's sign trick instead (``|w|`` times the activation with w's sign, no offset:
``Q8_0_BIAS`` is 0 there).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import isa

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, HALF = ir.FloatType(), ir.HalfType()


def host_has_f16c() -> bool:
    """fp16 conversion instructions on the CPU numba compiles for (without them LLVM would call
    the compiler-runtime helpers __extendhfsf2/__truncsfhf2, which numba's JIT does not link)."""
    return bool(isa.target_features().get("f16c", False))


#: the integer path's vector ISA (isa.MODES); "portable": no integer path (the float path runs)
MODE = isa.chosen()
INT_PATH = MODE != "portable"
F16C = host_has_f16c()
#: what Q8_0's int8 weights are biased by to make them unsigned (0 on AVX2: the sign trick instead)
Q8_0_BIAS = 0 if MODE == "avx2" else 128


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _const(t: ir.Type, n: int, value: int) -> ir.Constant:
    return ir.Constant(vec(t, n), [value] * n)


def _shuffle(b: ir.IRBuilder, x, y, idx) -> ir.Value:
    return b.shuffle_vector(x, y, ir.Constant(vec(I32, len(idx)), list(idx)))


def _concat(b: ir.IRBuilder, x, y) -> ir.Value:
    return _shuffle(b, x, y, range(2 * x.type.count))


def _ptr(context, b: ir.IRBuilder, aryty, ary, index, t: ir.Type):
    """Pointer to t at element ``index`` of the array (its own element type)."""
    data = context.make_array(aryty)(context, b, ary).data
    return b.bitcast(b.gep(data, [index], inbounds=True), t.as_pointer())


def _load(context, b, aryty, ary, index, t: ir.Type):
    return b.load(_ptr(context, b, aryty, ary, index, t), align=1)


def _half_to_float(b: ir.IRBuilder, h) -> ir.Value:
    """The float32 value of fp16 bits h (i16): exact, with integer operations only (no F16C):
    the exponent and mantissa shifted into place and scaled by 2**112 (subnormals included),
    infinities and NaNs given the float32 exponent."""
    if F16C:
        return b.fpext(b.bitcast(h, HALF), F32)
    h = b.zext(h, I32)
    em = b.and_(h, ir.Constant(I32, 0x7FFF))
    shifted = b.shl(em, ir.Constant(I32, 13))
    scaled = b.bitcast(b.fmul(b.bitcast(shifted, F32), ir.Constant(F32, 2.0 ** 112)), I32)
    special = b.or_(shifted, ir.Constant(I32, 0x7F800000))
    bits = b.select(b.icmp_unsigned(">=", em, ir.Constant(I32, 0x7C00)), special, scaled)
    sign = b.shl(b.and_(h, ir.Constant(I32, 0x8000)), ir.Constant(I32, 16))
    return b.bitcast(b.or_(bits, sign), F32)


def _f16(context, b, aryty, ary, index):
    """The float32 value of the little-endian fp16 at byte ``index`` of a uint8 array."""
    return _half_to_float(b, _load(context, b, aryty, ary, index, I16))


def _x86(b: ir.IRBuilder, name: str, ret: ir.Type, *args) -> ir.Value:
    fn = b.module.declare_intrinsic(name, fnty=ir.FunctionType(ret, [a.type for a in args]))
    return b.call(fn, list(args))


def _halves(b: ir.IRBuilder, v) -> tuple:
    n = v.type.count // 2
    return _shuffle(b, v, v, range(n)), _shuffle(b, v, v, range(n, 2 * n))


def _dpbusd(b: ir.IRBuilder, acc, u, s) -> ir.Value:
    """acc (16 x i32) + the sums of four adjacent products u[i] * s[i] (64 unsigned, 64 signed bytes)."""
    v8, v16 = vec(I32, 8), vec(I32, 16)
    if MODE == "avx512vnni":
        return _x86(b, "llvm.x86.avx512.vpdpbusd.512", v16, acc, b.bitcast(u, v16), b.bitcast(s, v16))
    if MODE == "avxvnni":  # the 256-bit form, AVX-VNNI's (VEX) where the CPU lacks AVX-512 VL
        lanes = [_x86(b, "llvm.x86.avx512.vpdpbusd.256", v8, a, b.bitcast(x, v8), b.bitcast(y, v8))
                 for a, x, y in zip(_halves(b, acc), _halves(b, u), _halves(b, s))]
        return _concat(b, *lanes)
    if MODE == "avx2":
        ones = _const(I16, 16, 1)
        lanes = [_x86(b, "llvm.x86.avx2.pmadd.wd", v8, _x86(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), x, y), ones)
                 for x, y in zip(_halves(b, u), _halves(b, s))]
        return b.add(acc, _concat(b, *lanes))
    # portable code here would only ever run in its own tests (a generic CPU takes the float path), at the cost
    # of compiling the whole kernel for it
    raise NotImplementedError(f"numba's integer path has no {MODE!r} vector code: the float path runs there")


def _sign_trick(b: ir.IRBuilder, w, x) -> tuple:
    """(|w| as unsigned bytes, x with w's sign: 0 where w is 0) for 64 signed bytes w and x, so that
    u * s pairs stay within int16 (|w| <= 128, |x| <= 127: at most 2 * 128 * 127)."""
    neg = b.icmp_signed("<", w, _const(I8, 64, 0))
    u = b.select(neg, b.neg(w), w)  # -(-128) wraps to 0x80: 128 as an unsigned byte
    signed = [_x86(b, "llvm.x86.avx2.psign.b", vec(I8, 32), xh, wh) for xh, wh in zip(_halves(b, x), _halves(b, w))]
    return u, _concat(b, *signed)


def _hsum(b: ir.IRBuilder, v) -> ir.Value:
    """The sum of a vector's lanes, halves added in a fixed order."""
    add = b.fadd if isinstance(v.type.element, ir.FloatType) else b.add
    n = v.type.count
    while n > 1:
        n //= 2
        v = add(_shuffle(b, v, v, range(n)), _shuffle(b, v, v, range(n, 2 * n)))
    return b.extract_element(v, ir.Constant(I32, 0))


def _fma(b: ir.IRBuilder, x, y, z) -> ir.Value:
    t = x.type
    fn = b.module.declare_intrinsic(f"llvm.fma.v{t.count}f32", fnty=ir.FunctionType(t, [t, t, t]))
    return b.call(fn, [x, y, z])


def _nibbles(b: ir.IRBuilder, q) -> tuple:
    """(low nibbles, high nibbles) of a byte vector."""
    n = q.type.count
    return b.and_(q, _const(I8, n, 0xF)), b.lshr(q, _const(I8, n, 4))


# ------------------------------------------------------------------ 32-value blocks
#: (block bytes, offset of the quants) of the 32-value formats with an integer path
LEGACY_LAYOUT = {"Q4_0": (18, 2), "Q5_0": (22, 6), "Q8_0": (34, 2), "Q4_1": (20, 4), "Q5_1": (24, 8)}
#: the formats whose blocks add a min m (fp16 at byte 2): paired with Q8_1 activations, whose block sum s
#: (fp16 of d times the sum of the 32 int8 values) carries it, m * s per block
WITH_MIN = ("Q4_1", "Q5_1")


def _block_u8(fmt: str, context, b, wty, w, o):
    """Block at byte o of w as 32 unsigned bytes, values 0..15 (Q4_0, Q4_1), 0..31 (Q5_0, Q5_1), int8 + 128
    (Q8_0)."""
    bs, q0 = LEGACY_LAYOUT[fmt]
    if fmt == "Q8_0":
        q = _load(context, b, wty, w, b.add(o, ir.Constant(I64, q0)), vec(I8, 32))
        return q if Q8_0_BIAS == 0 else b.xor(q, _const(I8, 32, 0x80))
    lo, hi = _nibbles(b, _load(context, b, wty, w, b.add(o, ir.Constant(I64, q0)), vec(I8, 16)))
    u = _concat(b, lo, hi)  # value j is the low nibble of byte j, value 16 + j its high nibble
    if fmt in ("Q5_0", "Q5_1"):  # bit j of the 32-bit qh just before the quants is value j's fifth bit
        bits = b.bitcast(_load(context, b, wty, w, b.add(o, ir.Constant(I64, q0 - 4)), I32), vec(I1, 32))
        u = b.or_(u, b.select(bits, _const(I8, 32, 16), _const(I8, 32, 0)))
    return u


def legacy_codec(fmt: str) -> tuple:
    """legacy_chunk's view of a 32-value format of this module: (block bytes, unpack(context, b, wty, w, o) ->
    the block's 32 weight bytes, scale(context, b, wty, w, o) -> its float32 scale, sign): sign "" when the
    bytes are unsigned with the offset in the activations' lane terms, "w" when they are int8 taken by the sign
    trick as |w| times x with w's sign, "x" as |x| times w with x's sign (exact where w is never -128)."""
    def unpack(context, b, wty, w, o):
        return _block_u8(fmt, context, b, wty, w, o)
    return LEGACY_LAYOUT[fmt][0], unpack, _f16, "w" if fmt == "Q8_0" and Q8_0_BIAS == 0 else ""


def legacy_chunk(fmt: str, pairs: int, rows: int, cols: int = 1, codec: tuple | None = None):
    """An intrinsic f(w, wo, ws, xq, xc, xd, xo, xs) -> a tuple of ``rows * cols`` float32 (entry r * cols + c): the
    dot products of ``rows`` weight rows (at bytes wo, wo + ws, ... of w, uint8), 2 * pairs blocks of format fmt
    each, with ``cols`` int8 activation rows xq[xo + c * xs:] (whole blocks; per block the fp16-rounded scale in
    xd[. // 32], per four values the offset term in xc[. // 4]; for Q4_1/Q5_1, Q8_1 activations: per block the scale
    and the block sum s, in xd[. // 16:][:2], and the weight block's min m adds m * s). Each weight block is
    unpacked once for every activation row and each activation load serves every weight row; per (row, column) the
    arithmetic is that of rows = cols = 1 (d_w * d_x times the exact integer sum, fused into float32 lanes in block
    order, one horizontal sum), so a product does not depend on which other rows share the call. codec: the
    format's legacy_codec (by default this module's), the way other modules' 32-value formats share this code
    (_qvec_table)."""
    bs, unpack, scale, sign = codec or legacy_codec(fmt)

    @intrinsic
    def chunk(typingctx, w, wo, ws, xq, xc, xd, xo, xs):
        n = rows * cols
        sig = types.UniTuple(types.float32, n)(w, types.int64, types.int64, xq, xc, xd, types.int64, types.int64)

        def codegen(context, b, signature, args):
            wty, _, _, qty, cty, dty, _, _ = signature.args
            w_, wo_, ws_, xq_, xc_, xd_, xo_, xs_ = args
            acc = [ir.Constant(vec(F32, 16), [0.0] * 16)] * n
            with_min = fmt in WITH_MIN
            macc = [ir.Constant(vec(F32, 2), [0.0, 0.0])] * n  # the m * s terms, one lane per block of a pair
            for p in range(pairs):
                s, c, dx, sx = [], [], [], []
                for j in range(cols):
                    xi = b.add(b.add(xo_, b.mul(xs_, ir.Constant(I64, j))), ir.Constant(I64, 64 * p))
                    s.append(_load(context, b, qty, xq_, xi, vec(I8, 64)))
                    c.append(_load(context, b, cty, xc_, b.lshr(xi, ir.Constant(I64, 2)), vec(I32, 16)) if not sign
                             else ir.Constant(vec(I32, 16), [0] * 16))  # no offset: the sign trick
                    if with_min:  # (d0, s0, d1, s1)
                        ds = _load(context, b, dty, xd_, b.lshr(xi, ir.Constant(I64, 4)), vec(F32, 4))
                        dx.append(_shuffle(b, ds, ds, [0, 2]))
                        sx.append(_shuffle(b, ds, ds, [1, 3]))
                    else:
                        dx.append(_load(context, b, dty, xd_, b.lshr(xi, ir.Constant(I64, 5)), vec(F32, 2)))
                for r in range(rows):
                    o0 = b.add(b.add(wo_, b.mul(ws_, ir.Constant(I64, r))), ir.Constant(I64, 2 * p * bs))
                    o1 = b.add(o0, ir.Constant(I64, bs))
                    u0 = _concat(b, unpack(context, b, wty, w_, o0), unpack(context, b, wty, w_, o1))
                    dw = ir.Constant(vec(F32, 2), [0.0, 0.0])
                    mw = ir.Constant(vec(F32, 2), [0.0, 0.0])
                    for i, oi in enumerate((o0, o1)):
                        dw = b.insert_element(dw, scale(context, b, wty, w_, oi), ir.Constant(I32, i))
                        if with_min:
                            m = _f16(context, b, wty, w_, b.add(oi, ir.Constant(I64, 2)))
                            mw = b.insert_element(mw, m, ir.Constant(I32, i))
                    for j in range(cols):
                        u, su = u0, s[j]
                        if sign == "w":  # u holds the signed weights
                            u, su = _sign_trick(b, u0, s[j])
                        elif sign == "x":
                            u, su = _sign_trick(b, s[j], u0)  # (|x|, w with x's sign)
                        lanes = b.sitofp(_dpbusd(b, c[j], u, su), vec(F32, 16))
                        d = b.fmul(dw, dx[j])
                        acc[r * cols + j] = _fma(b, lanes, _shuffle(b, d, d, [0] * 8 + [1] * 8), acc[r * cols + j])
                        if with_min:
                            macc[r * cols + j] = _fma(b, mw, sx[j], macc[r * cols + j])
            sums = [_hsum(b, a) for a in acc]
            if with_min:
                sums = [b.fadd(x, _hsum(b, m)) for x, m in zip(sums, macc)]
            return context.make_tuple(b, signature.return_type, sums)
        return sig, codegen
    return chunk


# ------------------------------------------------------------------ K-quant super-blocks (256 values)
def _k4_scales_mins(b: ir.IRBuilder, s):
    """Q4_K/Q5_K: the eight 6-bit sub-block scales and mins (8 x i8 each) from the 12 scale bytes
    (the first 12 of the 16 bytes s): sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales) and
    4..7 (mins); 4..7 in the nibbles of bytes 8..11 with their top 2 bits in those of bytes 0..7."""
    first = ir.Constant(vec(I1, 8), [1] * 4 + [0] * 4)
    six, low4, two = _const(I8, 8, 63), _const(I8, 8, 0xF), _const(I8, 8, 6)
    top = [b.shl(b.lshr(_shuffle(b, s, s, [0] * 4 + list(range(i, i + 4))), two), _const(I8, 8, 4)) for i in (0, 4)]
    a = _shuffle(b, s, s, [0, 1, 2, 3, 8, 9, 10, 11])
    sc = b.select(first, b.and_(a, six), b.or_(b.and_(a, low4), top[0]))
    a = _shuffle(b, s, s, [4, 5, 6, 7, 8, 9, 10, 11])
    mn = b.select(first, b.and_(a, six), b.or_(b.lshr(a, _const(I8, 8, 4)), top[1]))
    return sc, mn


def q4_k_superblocks(cols: int, fmt: str = "Q4_K"):
    """An intrinsic f(w, wo, xq, xb, xd, xo, xs) -> ``cols`` float32 (a tuple when cols > 1): the dot products of
    the Q4_K (or Q5_K: a fifth bit per value from its 32 qh bytes) super-block at byte wo of w with the Q8_K
    activations xq[xo + c * xs:][:256] (scale xd[. // 256], sums per 32 values xb[. // 32:]): dx * d * sum_j scale_j
    * (the integer sum of sub-block j) - dx * dmin * sum_j min_j * xb_j. The weight nibbles and scales are unpacked
    once for every column; per column the arithmetic is that of cols = 1."""
    @intrinsic
    def superblock(typingctx, w, wo, xq, xb, xd, xo, xs):
        ret = types.float32 if cols == 1 else types.UniTuple(types.float32, cols)
        sig = ret(w, types.int64, xq, xb, xd, types.int64, types.int64)

        def codegen(context, b, signature, args):
            wty, _, qty, bty, dty, _, _ = signature.args
            w_, wo_, xq_, xb_, xd_, xo_, xs_ = args
            sc, mn = _k4_scales_mins(b, _load(context, b, wty, w_, b.add(wo_, ir.Constant(I64, 4)), vec(I8, 16)))
            sc = b.zext(sc, vec(I32, 8))
            mn = b.zext(mn, vec(I32, 8))
            xi = [b.add(xo_, b.mul(xs_, ir.Constant(I64, c))) for c in range(cols)]
            acc = [ir.Constant(vec(I32, 16), [0] * 16)] * cols
            qs = 16 if fmt == "Q4_K" else 48
            if fmt == "Q5_K":  # bit 2j of qh byte l: value 64j + l's fifth bit, bit 2j + 1: value 64j + 32 + l's
                qh = _load(context, b, wty, w_, b.add(wo_, ir.Constant(I64, 16)), vec(I8, 32))
            for j in range(4):  # 32 bytes: low nibbles sub-block 2j, high nibbles sub-block 2j + 1
                lo, hi = _nibbles(b, _load(context, b, wty, w_, b.add(wo_, ir.Constant(I64, qs + 32 * j)), vec(I8, 32)))
                if fmt == "Q5_K":
                    lo, hi = (b.or_(v, b.shl(b.and_(b.lshr(qh, _const(I8, 32, 2 * j + i)), _const(I8, 32, 1)),
                                             _const(I8, 32, 4))) for i, v in enumerate((lo, hi)))
                u = _concat(b, lo, hi)
                scj = _shuffle(b, sc, sc, [2 * j] * 8 + [2 * j + 1] * 8)
                for c in range(cols):
                    s = _load(context, b, qty, xq_, b.add(xi[c], ir.Constant(I64, 64 * j)), vec(I8, 64))
                    lanes = _dpbusd(b, ir.Constant(vec(I32, 16), [0] * 16), u, s)
                    acc[c] = b.add(acc[c], b.mul(lanes, scj))
            dw = _f16(context, b, wty, w_, wo_)
            dmw = _f16(context, b, wty, w_, b.add(wo_, ir.Constant(I64, 2)))
            out = []
            for c in range(cols):
                sums = _load(context, b, bty, xb_, b.lshr(xi[c], ir.Constant(I64, 5)), vec(I32, 8))
                mins = _hsum(b, b.mul(mn, sums))
                dx = b.load(_ptr(context, b, dty, xd_, b.lshr(xi[c], ir.Constant(I64, 8)), F32), align=4)
                d, dmin = b.fmul(dx, dw), b.fmul(dx, dmw)
                out.append(b.fsub(b.fmul(d, b.sitofp(_hsum(b, acc[c]), F32)), b.fmul(dmin, b.sitofp(mins, F32))))
            return out[0] if cols == 1 else context.make_tuple(b, signature.return_type, out)
        return sig, codegen
    return superblock


def int_superblocks(cols: int, lanes):
    """An intrinsic f(w, wo, xq, xc, xo, xs) -> ``cols`` int32 (a tuple when cols > 1): the super-block at
    byte wo of w against the activation rows at xq[xo + c * xs:] (xc their -bias sums), each column's
    int32 lanes from ``lanes(context, builder, wty, qty, cty, w, wo, xq, xc, xi0)`` (xi0: each column's
    first activation index) summed horizontally."""
    @intrinsic
    def superblock(typingctx, w, wo, xq, xc, xo, xs):
        ret = types.int32 if cols == 1 else types.UniTuple(types.int32, cols)
        sig = ret(w, types.int64, xq, xc, types.int64, types.int64)

        def codegen(context, b, signature, args):
            wty, _, qty, cty, _, _ = signature.args
            w_, wo_, xq_, xc_, xo_, xs_ = args
            xi0 = [b.add(xo_, b.mul(xs_, ir.Constant(I64, c))) for c in range(cols)]
            out = [_hsum(b, a) for a in lanes(context, b, wty, qty, cty, w_, wo_, xq_, xc_, xi0)]
            return out[0] if cols == 1 else context.make_tuple(b, signature.return_type, out)
        return sig, codegen
    return superblock


def q6_k_superblocks(cols: int):
    """An intrinsic f(w, wo, xq, xc, xo, xs) -> ``cols`` int32 (a tuple when cols > 1):
    sum_i scale_(i // 16) * (q_i - 32) * x_i for the Q6_K super-block at byte wo of w and the
    activations xq[xo + c * xs:][:256] (xc[. // 4:]: -32 times each four activations' sum), the
    6-bit values and scales unpacked once for every column (integer sums: exact in any order)."""
    def lanes(context, b, wty, qty, cty, w_, wo_, xq_, xc_, xi0):
        sc = b.sext(_load(context, b, wty, w_, b.add(wo_, ir.Constant(I64, 192)), vec(I8, 16)), vec(I32, 16))
        acc = [ir.Constant(vec(I32, 16), [0] * 16)] * cols
        three = _const(I8, 64, 3)
        for h in range(2):  # 128 values: ql[64h:64h+64], qh[32h:32h+32]
            ql = _load(context, b, wty, w_, b.add(wo_, ir.Constant(I64, 64 * h)), vec(I8, 64))
            qh = _load(context, b, wty, w_, b.add(wo_, ir.Constant(I64, 128 + 32 * h)), vec(I8, 32))
            sh = [b.lshr(qh, _const(I8, 32, k)) for k in (0, 2, 4, 6)]
            lo, hi = _nibbles(b, ql)
            for g, nib in enumerate((lo, hi)):  # values 128h + 64g + [0, 64): two bit pairs of qh
                high = b.shl(b.and_(_concat(b, sh[2 * g], sh[2 * g + 1]), three), _const(I8, 64, 4))
                u = b.or_(nib, high)
                first = 8 * h + 4 * g  # 16 values (four lanes) per scale
                scg = _shuffle(b, sc, sc, [first + i // 4 for i in range(16)])
                for c in range(cols):
                    xi = b.add(xi0[c], ir.Constant(I64, 128 * h + 64 * g))
                    s = _load(context, b, qty, xq_, xi, vec(I8, 64))
                    cc = _load(context, b, cty, xc_, b.lshr(xi, ir.Constant(I64, 2)), vec(I32, 16))
                    acc[c] = b.add(acc[c], b.mul(_dpbusd(b, cc, u, s), scg))
        return acc
    return int_superblocks(cols, lanes)


@intrinsic
def f16_round(typingctx, x):
    """float32 x rounded to the nearest fp16 (ties to even; overflow gives inf), as float32."""
    sig = types.float32(types.float32)

    def codegen(context, b, signature, args):
        x = args[0]
        if F16C:
            return b.fpext(b.fptrunc(x, HALF), F32)
        # Integer operations only: below 2**-14 (fp16 subnormals) the quantum is 2**-24, rounded
        # by adding and removing 2**23; above, the 13 bits dropped are rounded to even in the
        # bits, and what rounds past 65504 (the largest fp16) becomes inf.
        bits = b.bitcast(x, I32)
        sign = b.and_(bits, ir.Constant(I32, -0x80000000))
        mag = b.and_(bits, ir.Constant(I32, 0x7FFFFFFF))
        absx = b.bitcast(mag, F32)
        big = ir.Constant(F32, 2.0 ** 23)
        sub = b.fmul(b.fsub(b.fadd(b.fmul(absx, ir.Constant(F32, 2.0 ** 24)), big), big), ir.Constant(F32, 2.0 ** -24))
        lsb = b.and_(b.lshr(mag, ir.Constant(I32, 13)), ir.Constant(I32, 1))
        rounded = b.and_(b.add(b.add(mag, ir.Constant(I32, 0xFFF)), lsb), ir.Constant(I32, ~0x1FFF))
        rounded = b.select(b.icmp_unsigned(">", rounded, ir.Constant(I32, 0x477FE000)), ir.Constant(I32, 0x7F800000),
                           rounded)
        rounded = b.select(b.icmp_unsigned(">=", mag, ir.Constant(I32, 0x7F800000)), mag, rounded)  # inf, NaN
        mag = b.select(b.icmp_unsigned("<", mag, ir.Constant(I32, 0x38800000)), b.bitcast(sub, I32), rounded)
        return b.bitcast(b.or_(mag, sign), F32)
    return sig, codegen


@intrinsic
def byte_at(typingctx, w, o):
    """The byte at byte offset o of uint8 array w (any shape: offsets from its first element)."""
    sig = types.int64(w, types.int64)

    def codegen(context, b, signature, args):
        return b.zext(_load(context, b, signature.args[0], args[0], args[1], I8), I64)
    return sig, codegen


@intrinsic
def prefetch(typingctx, w, o):
    """Hint that the cache line at byte offset o of array w will be read soon (never faults)."""
    sig = types.void(w, types.int64)

    def codegen(context, b, signature, args):
        p = _ptr(context, b, signature.args[0], args[0], args[1], I8)
        fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        fn = b.module.declare_intrinsic("llvm.prefetch", fnty=fnty)
        b.call(fn, [p, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])  # read, keep, data
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def f32_bits(typingctx, x):
    """The IEEE bits of float32 x as an int32."""
    sig = types.int32(types.float32)

    def codegen(context, b, signature, args):
        return b.bitcast(args[0], I32)
    return sig, codegen


@intrinsic
def half_at(typingctx, w, o):
    """The float32 value of the little-endian fp16 at byte offset o of uint8 array w."""
    sig = types.float32(w, types.int64)

    def codegen(context, b, signature, args):
        return _f16(context, b, signature.args[0], args[0], args[1])
    return sig, codegen
