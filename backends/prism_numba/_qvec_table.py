"""LLVM vector code for the integer dot products of the code-book formats (IQ4_NL, IQ4_XS, MXFP4) with int8
activations: the numba intrinsics of :mod:`._jit_qdot_table`, built on :mod:`._qvec`'s.

Each weight is a 4-bit index into a 16-entry int8 code book (ggml's ``kvalues_iq4nl``, or for MXFP4 its e2m1
values doubled, ``kvalues_mxfp4``). A byte shuffle (``vpshufb``: each byte of the index vector picks a byte of
the code book, repeated in every 128-bit lane) turns 32 indices into 32 weight bytes at once; then the products
are those of the other formats (``_qvec._dpbusd``). What the code book holds depends on the ISA:

* MXFP4 (-12..12): the values plus 12, unsigned bytes 0..24, the offset ``-12 * (sum of four activations)`` in
  the lanes' start values as for Q4_0, on every ISA (AVX2's int16 pairs reach at most 2 * 24 * 128).
* IQ4_NL and IQ4_XS (-127..113): with VNNI the values plus 128 (1..241; ``vpdpbusd`` sums in int32), the offset
  ``-128 * (sum of four)``; on AVX2, whose ``vpmaddubsw`` adds pairs in int16 (255 * 128 * 2 would saturate), the
  signed values by the sign trick as ggml does, turned round: ``|x|`` times the weight with x's sign, exact for
  every activation byte (-128 included: ``|-128|`` is the unsigned byte 128) since no weight is -128.

The scales: IQ4_NL's fp16 per 32 values; MXFP4's E8M0 byte e, as ggml's ``GGML_E8M0_TO_FP32_HALF``, 2**(e - 128)
(half the format's 2**(e - 127), because the code book holds the e2m1 values doubled), exact in float32 for every
e (the two smallest subnormal); IQ4_XS's fp16 per 256 values times an integer 6-bit sub-block scale minus 32 per
32 values, applied to the integer lanes as Q6_K's are.
"""

from __future__ import annotations

from llvmlite import ir

from . import _qvec as V
from ._jit_quant import KVALUES_IQ4NL, KVALUES_MXFP4
from ._qvec import (
    F32,
    I8,
    I16,
    I32,
    I64,
    _concat,
    _const,
    _dpbusd,
    _f16,
    _halves,
    _load,
    _nibbles,
    _shuffle,
    _sign_trick,
    _x86,
    vec,
)

#: the signed code books (ggml-common.h), as ints
CODE_BOOKS = {"IQ4_NL": [int(v) for v in KVALUES_IQ4NL], "MXFP4": [int(v) for v in KVALUES_MXFP4]}
#: AVX2 takes IQ4_NL's signed weights by the sign trick (module docstring); VNNI the bias
SIGNED = V.MODE == "avx2"
#: what each code book's values are raised by to make unsigned bytes (subtracted back through the activations)
BIAS = {"IQ4_NL": 0 if SIGNED else 128, "MXFP4": 12}


def _lookup(b: ir.IRBuilder, idx, book: list[int]) -> ir.Value:
    """The code-book bytes at the indices idx (32 bytes, each 0..15)."""
    t32 = ir.Constant(vec(I8, 32), [v & 0xFF for v in book] * 2)  # vpshufb looks up within each 128-bit lane
    return _x86(b, "llvm.x86.avx2.pshuf.b", vec(I8, 32), t32, idx)


def _book(fmt: str) -> list[int]:
    """fmt's code book as the vector code uses it: raised by BIAS[fmt] (bytes; module docstring)."""
    return [v + BIAS[fmt] for v in CODE_BOOKS[fmt]]


def _block_weights(fmt: str, qoff: int):
    """unpack(context, b, wty, w, o): the 32 weight bytes of the block at byte o (indices from its 16 bytes at
    o + qoff: value j is byte j's low nibble, value 16 + j its high nibble)."""
    book = _book(fmt)

    def unpack(context, b, wty, w, o):
        lo, hi = _nibbles(b, _load(context, b, wty, w, b.add(o, ir.Constant(I64, qoff)), vec(I8, 16)))
        return _lookup(b, _concat(b, lo, hi), book)
    return unpack


def _e8m0_half(context, b, wty, w, o) -> ir.Value:
    """2**(e - 128) for the E8M0 byte e at byte o of w (ggml's GGML_E8M0_TO_FP32_HALF), exact in float32:
    the two smallest as subnormals, the others as exponent e - 1."""
    e = b.zext(_load(context, b, wty, w, o, I8), I32)
    sub = b.shl(ir.Constant(I32, 0x00200000), e)
    normal = b.shl(b.sub(e, ir.Constant(I32, 1)), ir.Constant(I32, 23))
    return b.bitcast(b.select(b.icmp_unsigned("<", e, ir.Constant(I32, 2)), sub, normal), F32)


#: _qvec.legacy_chunk's codecs of the 32-value code-book formats (block bytes, unpack, scale, sign)
CODECS = {"IQ4_NL": (18, _block_weights("IQ4_NL", 2), _f16, "x" if SIGNED else ""),
          "MXFP4": (17, _block_weights("MXFP4", 1), _e8m0_half, "")}


def chunk(fmt: str, pairs: int, rows: int, cols: int = 1):
    """_qvec.legacy_chunk for IQ4_NL or MXFP4: rows x cols products over 2 * pairs blocks."""
    return V.legacy_chunk(fmt, pairs, rows, cols, CODECS[fmt])


def _iq4_xs_scales(context, b, wty, w, wo) -> ir.Value:
    """The eight sub-block scales of the IQ4_XS super-block at byte wo, minus 32 (8 x i32): sub-block s has
    the nibble s % 2 of scales_l[s // 2] (bytes 4..7) low and bits 2s, 2s + 1 of scales_h (bytes 2..3) high."""
    sh = b.zext(_load(context, b, wty, w, b.add(wo, ir.Constant(I64, 2)), I16), I32)
    sh = b.insert_element(ir.Constant(vec(I32, 8), [0] * 8), sh, ir.Constant(I32, 0))
    sh = _shuffle(b, sh, sh, [0] * 8)
    high = b.shl(b.and_(b.lshr(sh, ir.Constant(vec(I32, 8), [2 * s for s in range(8)])), _const(I32, 8, 3)),
                 _const(I32, 8, 4))
    sl = b.zext(_load(context, b, wty, w, b.add(wo, ir.Constant(I64, 4)), vec(I8, 4)), vec(I32, 4))
    sl = _shuffle(b, sl, sl, [s // 2 for s in range(8)])
    low = b.and_(b.lshr(sl, ir.Constant(vec(I32, 8), [4 * (s % 2) for s in range(8)])), _const(I32, 8, 0xF))
    return b.sub(b.or_(low, high), _const(I32, 8, 32))


def _scaled_lanes(b: ir.IRBuilder, u, s, sc16) -> ir.Value:
    """AVX2: 16 int32 lanes, lane l = sum over its four values i of sc16[i // 2] * u_i * s_i (64 unsigned bytes
    u, 64 signed bytes s whose int16 pair sums do not saturate, 32 int16 scales): vpmaddubsw, then vpmaddwd by
    the scales rather than by ones (ggml's IQ4_XS), which saves a 32-bit multiply per eight lanes."""
    v8, v16 = vec(I32, 8), vec(I16, 16)
    return _concat(b, *(_x86(b, "llvm.x86.avx2.pmadd.wd", v8, _x86(b, "llvm.x86.avx2.pmadd.ub.sw", v16, x, y), k)
                        for x, y, k in zip(_halves(b, u), _halves(b, s), _halves(b, sc16))))


def iq4_xs_superblocks(cols: int):
    """An intrinsic f(w, wo, xq, xc, xo, xs) -> ``cols`` int32 (a tuple when cols > 1): sum_s (ls_s - 32) *
    sum_(i in sub-block s) q_i x_i for the IQ4_XS super-block at byte wo of w and the Q8_K activations
    xq[xo + c * xs:][:256] (xc[. // 4:]: -BIAS times each four activations' sum), the indices and scales
    unpacked once for every column (integer sums: exact in any order)."""
    book = _book("IQ4_NL")

    def lanes(context, b, wty, qty, cty, w_, wo_, xq_, xc_, xi0):
        sc = _iq4_xs_scales(context, b, wty, w_, wo_)
        acc = [ir.Constant(vec(I32, 16), [0] * 16)] * cols
        for j in range(4):  # 64 values: sub-blocks 2j and 2j + 1, 16 index bytes each
            q = _load(context, b, wty, w_, b.add(wo_, ir.Constant(I64, 8 + 32 * j)), vec(I8, 32))
            lo, hi = (_halves(b, n) for n in _nibbles(b, q))
            u = _concat(b, _lookup(b, _concat(b, lo[0], hi[0]), book), _lookup(b, _concat(b, lo[1], hi[1]), book))
            scj = _shuffle(b, sc, sc, [2 * j] * 8 + [2 * j + 1] * 8)
            scj16 = b.trunc(_shuffle(b, sc, sc, [2 * j] * 16 + [2 * j + 1] * 16), vec(I16, 32))
            for c in range(cols):
                xi = b.add(xi0[c], ir.Constant(I64, 64 * j))
                s = _load(context, b, qty, xq_, xi, vec(I8, 64))
                if SIGNED:  # |x| times the weights with x's sign (no offset), scaled by vpmaddwd
                    acc[c] = b.add(acc[c], _scaled_lanes(b, *_sign_trick(b, s, u), scj16))
                    continue
                cc = _load(context, b, cty, xc_, b.lshr(xi, ir.Constant(I64, 2)), vec(I32, 16))
                acc[c] = b.add(acc[c], b.mul(_dpbusd(b, cc, u, s), scj))
        return acc
    return V.int_superblocks(cols, lanes)
