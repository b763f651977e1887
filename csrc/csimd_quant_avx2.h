/* AVX2 (and AVX-VNNI) fused matrix-vector kernels: part of the quantized template, included by
   csimd_quant_impl.h at ISA_LEVEL 1, once for the avx2 copy and once for the avxvnni one (CSIMD_AVXVNNI: only
   q_dp4 differs, and its lane sums are exact in both, so the two copies give the same bits).

   Every format of the list (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 against Q8_0/Q8_1 activations; Q2_K,
   Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS against Q8_K) is read straight from its blocks and unpacked in registers; the
   integer products are exact (maddubs pairs stay within int16: |w| <= 128 against |a| <= 127, or unsigned
   weights below 64), the float scaling is grouped per block or super-block, so a result may differ from the
   decoded path's (q_dot) in the last bits but never depends on the rows computed beside it. */

#ifndef CSIMD_QUANT_AVX2_TABLES /* data, not code: once for the AVX2 and AVX-VNNI copies */
#define CSIMD_QUANT_AVX2_TABLES
static const uint8_t q_k4_bcast[8][32] __attribute__((aligned(32))) = { /* all 16 lanes: int16 j of 8 */
#define Q_B2(j) 2 * (j), 2 * (j) + 1
#define Q_B16(j) Q_B2(j), Q_B2(j), Q_B2(j), Q_B2(j), Q_B2(j), Q_B2(j), Q_B2(j), Q_B2(j)
    {Q_B16(0), Q_B16(0)}, {Q_B16(1), Q_B16(1)}, {Q_B16(2), Q_B16(2)}, {Q_B16(3), Q_B16(3)},
    {Q_B16(4), Q_B16(4)}, {Q_B16(5), Q_B16(5)}, {Q_B16(6), Q_B16(6)}, {Q_B16(7), Q_B16(7)},
};
/* Q2_K's 16 scale bytes (in both lanes) to int16 lanes, zero-extended (index 0x80 gives a zero byte): table
   4h + j puts byte 8h + 2j in every int16 of the low lane and byte 8h + 2j + 1 in the high lane's */
#define Q_S2(g) (g), 0x80
#define Q_S16(g) Q_S2(g), Q_S2(g), Q_S2(g), Q_S2(g), Q_S2(g), Q_S2(g), Q_S2(g), Q_S2(g)
static const uint8_t q_k2_sel[8][32] __attribute__((aligned(32))) = {
    {Q_S16(0), Q_S16(1)}, {Q_S16(2), Q_S16(3)}, {Q_S16(4), Q_S16(5)}, {Q_S16(6), Q_S16(7)},
    {Q_S16(8), Q_S16(9)}, {Q_S16(10), Q_S16(11)}, {Q_S16(12), Q_S16(13)}, {Q_S16(14), Q_S16(15)},
};
#undef Q_S16
#undef Q_S2
static const uint8_t q_k6_pair[4][32] __attribute__((aligned(32))) = { /* low lane int16 2i, high lane 2i + 1 */
    {Q_B16(0), Q_B16(1)}, {Q_B16(2), Q_B16(3)}, {Q_B16(4), Q_B16(5)}, {Q_B16(6), Q_B16(7)},
#undef Q_B16
#undef Q_B2
};
/* pshufb tables, the same 16 entries in both 128-bit lanes: IQ4_NL's values, MXFP4's plus 16 (unsigned) */
#define Q_X2(...) {__VA_ARGS__, __VA_ARGS__}
static const int8_t q_iq4nl_x2[32] __attribute__((aligned(32))) =
    Q_X2(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
static const int8_t q_mxfp4_u16_x2[32] __attribute__((aligned(32))) =
    Q_X2(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4);
#undef Q_X2
#endif

QATTR static inline float FN(q_hsum256)(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}

QATTR static inline float FN(q_hsum128)(__m128 m) {
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

/* ------------------------------------------------------------ blocks of 32 (Q8_0 / Q8_1 activations) */
/* 16 bytes of nibbles as 32 values in element order: byte j's low nibble is element j, its high one j + 16 */
QATTR static inline __m256i FN(q_nib32)(const uint8_t *qs) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(15));
}

/* 16 for each element whose fifth bit (bit j of qh at p, element j) is set */
QATTR static inline __m256i FN(q_fifth_bits)(const uint8_t *p) {
    uint32_t qh;
    memcpy(&qh, p, 4);
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                              _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                                0x0101010101010101LL, 0x0000000000000000LL));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, sel), sel), _mm256_set1_epi8(16));
}

/* How a format's block is multiplied: unsigned weights q + bias against the activations, the lanes started at
   -bias * (the sum of their 4 activations) (Q4_0 bias 8, Q5_0 16, MXFP4 16; Q4_1/Q5_1 none, their min pairs
   with the activation block's s), or signed weights by the sign trick, |w| times (a with w's sign) (Q8_0 and
   IQ4_NL, whose q + bias would not fit maddubs' int16 pairs). The start is a->nbias (-128 * sum) shifted. */
#define Q_B32_SIGNED(t) ((t) == Q_Q8_0 || (t) == Q_IQ4_NL)
#define Q_B32_NB_SHIFT(t) ((t) == Q_Q4_0 ? 4 : 3)

QATTR static inline __attribute__((always_inline)) __m256i FN(q_b32_weights)(const int t, const uint8_t *b) {
    switch (t) {
    case Q_Q4_0: return FN(q_nib32)(b + 2);
    case Q_Q4_1: return FN(q_nib32)(b + 4);
    case Q_Q5_0: return _mm256_or_si256(FN(q_nib32)(b + 6), FN(q_fifth_bits)(b + 2));
    case Q_Q5_1: return _mm256_or_si256(FN(q_nib32)(b + 8), FN(q_fifth_bits)(b + 4));
    case Q_MXFP4: return _mm256_shuffle_epi8(_mm256_load_si256((const __m256i *)q_mxfp4_u16_x2), FN(q_nib32)(b + 1));
    case Q_IQ4_NL: return _mm256_shuffle_epi8(_mm256_load_si256((const __m256i *)q_iq4nl_x2), FN(q_nib32)(b + 2));
    default: return _mm256_loadu_si256((const __m256i *)(b + 2)); /* Q8_0 */
    }
}

/* R (1..4) weight rows of a 32-block format t against one activation row: the activation loads shared, R
   independent chains of one float multiply-add per block (d_w * d_a per lane of 4), Q4_1/Q5_1's min times the
   activation block's s summed apart. pf: the bytes pf further on prefetched to L2 (the rows a few passes ahead). */
QATTR static inline __attribute__((always_inline)) void FN(q_gemv_b32_r)(const int t, const uint8_t *const *wr,
                                                                        const int R, int64_t K, const q_arow *a,
                                                                        float *out, const int64_t pf) {
    const int64_t bb = q_block_bytes(t);
    const int mins = t == Q_Q4_1 || t == Q_Q5_1, biased = !Q_B32_SIGNED(t) && !mins;
    __m256 acc[4];
    __m128 accm = _mm_setzero_ps(); /* lane r: row r's sum of min * s */
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        const __m256i av = _mm256_loadu_si256((const __m256i *)(a->q + k));
        const __m256 as = _mm256_loadu_ps(a->ls + k / 4);
        const __m256i start = biased ? _mm256_srai_epi32(_mm256_loadu_si256((const __m256i *)(a->nbias + k / 4)),
                                                         Q_B32_NB_SHIFT(t))
                                     : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + (k / 32) * bb;
            if (pf) _mm_prefetch((const char *)b + pf, _MM_HINT_T1);
            const __m256i wv = FN(q_b32_weights)(t, b);
            const __m256i p = Q_B32_SIGNED(t) ? FN(q_dp4)(start, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv))
                                              : FN(q_dp4)(start, wv, av);
            const float d = t == Q_MXFP4 ? q_e8m0_half(b[0]) : FN(q_h2f)(b);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(_mm256_set1_ps(d), as), acc[r]);
        }
        if (mins) { /* the R rows' fp16 mins converted at once */
            uint64_t hh = 0;
            for (int r = 0; r < R; r++) {
                uint16_t h;
                memcpy(&h, wr[r] + (k / 32) * bb + 2, 2);
                hh |= (uint64_t)h << (16 * r);
            }
            accm = _mm_fmadd_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)hh)), _mm_set1_ps(a->gsum[k / 16]), accm);
        }
    }
    float m4[4];
    _mm_storeu_ps(m4, accm);
    for (int r = 0; r < R; r++) out[r] = FN(q_hsum256)(acc[r]) + m4[r];
}

/* ------------------------------------------------------------ super-blocks of 256 (Q8_K activations)
   As ggml's x86 kernels, a super-block's sub-block scales stay in integers: maddubs of unsigned (or, IQ4_XS,
   sign-trick) weights and the activations gives int16 pairs, madd by the sub-block scales broadcast from a
   register (pshufb) sums them to int32, and one float multiply-add per super-block (Q6_K: per four, lane by
   lane) applies d_w * d_a. The mins
   of Q2_K/Q4_K/Q5_K pair with the activation's integer group sums (isum), as ggml's bsums. One row at a time:
   its blocks are one forward stream for the hardware prefetcher. */

/* The K-quants' dots stream: each 32 values unpacked, multiplied and summed at once, few registers live
   (unpacking a super-block first kept 16 vectors live, and they were spilled). The batched kernels
   (csimd_quant_batch_avx2.h) use the same unpacking per vector for several activation rows. */

/* Q4_K and Q5_K (five): sub-block j of 32 has a 6-bit scale and min (q_k4_scales_mins); unsigned values
   <= 31. The head: fp16 (d, dmin) in *dw, the 8 mins as int16 in *mins, the 8 scales as int16 in both lanes. */
QATTR static inline __attribute__((always_inline)) __m256i FN(q_k45_head)(const uint8_t *b, __m128i *mins,
                                                                         __m128 *dw) {
    int32_t dpair;
    memcpy(&dpair, b, 4);
    *dw = _mm_cvtph_ps(_mm_cvtsi32_si128(dpair));
    const __m256i sm = FN(q_k4_scales_mins)(b + 4);
    *mins = _mm256_extracti128_si256(sm, 1);
    return _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
}

/* sub-block 2c + hi's 32 values: the low (hi 0) or high nibbles of qs[32c ..], with Q5_K the fifth bits (bit
   2c + hi of qh[l] is element 64c + 32hi + l's) */
QATTR static inline __attribute__((always_inline)) __m256i FN(q_k45_w)(const int five, __m256i v, __m256i qh,
                                                                      const int c, const int hi) {
    __m256i w = _mm256_and_si256(hi ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
    if (five)
        w = _mm256_or_si256(w, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + hi), _mm256_set1_epi8(1)), 4));
    return w;
}

#define Q_K45_BB(five) ((five) ? 176 : 144)
#define Q_K45_QS(b, five) ((b) + ((five) ? 48 : 16))
#define Q_K45_QH(b, five) ((five) ? _mm256_loadu_si256((const __m256i *)((b) + 16)) : _mm256_setzero_si256())

/* the integer part of a super-block's dot: sum_j s_j * (sub-block j . aq), 8 int32 lanes (exact), streaming */
QATTR static inline __attribute__((always_inline)) __m256i FN(q_k45_dot)(const int five, const uint8_t *b, __m256i sc,
                                                                        const int8_t *aq) {
    const __m256i qh = Q_K45_QH(b, five);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(Q_K45_QS(b, five) + 32 * (j / 2)));
        const __m256i p = _mm256_maddubs_epi16(FN(q_k45_w)(five, v, qh, j / 2, j % 2),
                                               _mm256_loadu_si256((const __m256i *)(aq + 32 * j)));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)q_k4_bcast[j]))));
    }
    return sumi;
}

/* the activation's 8 sub-block sums (of 32) as int16, for the mins: isum holds sums of 16 */
QATTR static inline __m128i FN(q_k8_bsums)(const int16_t *isum) {
    const __m256i gs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)isum), _mm256_set1_epi16(1));
    return _mm_packs_epi32(_mm256_castsi256_si128(gs), _mm256_extracti128_si256(gs, 1));
}

/* one (weight row, activation row) pair's super-block: acc += sumi * d * dy (per lane), accm += mins * bsums
   * dmin * dy; the same operations wherever the pair is computed (q_gemv_q45k_row, the batched kernels) */
QATTR static inline __attribute__((always_inline)) void FN(q_k45_step)(__m256i sumi, __m128i mins, __m128i bs,
                                                                      __m128 dw, float dy, __m256 *acc,
                                                                      __m128 *accm) {
    const __m128 dd = _mm_mul_ps(dw, _mm_set1_ps(dy));
    *accm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, bs)), _mm_permute_ps(dd, 0x55), *accm);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(_mm_cvtss_f32(dd)), *acc);
}

/* one Q4_K or Q5_K weight row against one activation row (one row at a time: one sequential stream, measured
   faster than 4 rows per pass) */
QATTR static __attribute__((noinline)) float FN(q_gemv_q45k_row)(const int five, const uint8_t *w, int64_t nsb, const q_arow *a) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + Q_K45_BB(five) * ib;
        __m128i mins;
        __m128 dw;
        const __m256i sc = FN(q_k45_head)(b, &mins, &dw);
        FN(q_k45_step)(FN(q_k45_dot)(five, b, sc, a->q + 256 * ib), mins, FN(q_k8_bsums)(a->isum + 16 * ib), dw,
                       a->ls[64 * ib], &acc, &accm);
    }
    return FN(q_hsum256)(acc) - FN(q_hsum128)(accm);
}

/* Q6_K and Q3_K: 16 groups of 16 with signed 8-bit scales, stored as unsigned u = q + 2^shift (Q6_K 32, Q3_K 4):
   sum_g s_g * (sum u*a - 2^shift * isum_g), the 2^shift * isum part by one madd of the scales and the
   activation's group sums (not a second maddubs per vector). Vector 4h + i of a super-block: elements
   128h + 32i .. + 32, groups 8h + 2i (low lane) and 8h + 2i + 1 (high lane). The lanes of the integer sum hold
   parts that cancel across lanes; each is converted and scaled as ggml's kernels do (Q6_K's float operations are
   ggml's, bit for bit). */
#define Q_K16_BB(t) ((t) == Q_Q6_K ? 210 : 110)
#define Q_K16_SHIFT(t) ((t) == Q_Q6_K ? 5 : 2)
#define Q_K16_D(t) ((t) == Q_Q6_K ? 208 : 108) /* the fp16 d's offset */

/* Q3_K's 16 scales (6 bits, less 32) as int8: low 4 bits from bytes 0..7 (groups 0..7 the low nibbles, 8..15
   the high ones), the top 2 bits from bytes 8..11 (group i: bits 2 * (i / 4) of byte 8 + i % 4) */
QATTR static inline __m128i FN(q_k3_scales)(const uint8_t *s) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
    /* built in registers (a 16-byte load of four 4-byte stores would miss store forwarding) */
    const __m128i o = _mm_set_epi32((int)(((u[1] >> 4) & lo4) | (((u[2] >> 6) & hi2) << 4)),
                                    (int)(((u[0] >> 4) & lo4) | (((u[2] >> 4) & hi2) << 4)),
                                    (int)((u[1] & lo4) | (((u[2] >> 2) & hi2) << 4)),
                                    (int)((u[0] & lo4) | ((u[2] & hi2) << 4)));
    return _mm_sub_epi8(o, _mm_set1_epi8(32));
}

/* the start of a super-block's integer sum for values stored as q + 2^shift: -2^shift * sum_g s_g * isum_g (scv:
   the 16 group scales, isum: the activation's 16 group sums) */
QATTR static inline __m256i FN(q_k_offset_start)(__m256i scv, const int16_t *isum, int shift) {
    const __m256i t = _mm256_madd_epi16(scv, _mm256_loadu_si256((const __m256i *)isum));
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(t, shift));
}

/* the 16 scales of a Q6_K or Q3_K super-block as int16 */
QATTR static inline __attribute__((always_inline)) __m256i FN(q_k16_scv)(const int t, const uint8_t *b) {
    return _mm256_cvtepi8_epi16(t == Q_Q6_K ? _mm_loadu_si128((const __m128i *)(b + 192)) : FN(q_k3_scales)(b + 96));
}

/* the loads of half h of a super-block: Q6_K ql (x0, x1) and qh (x2); Q3_K qs (x0) and hmask (x2) */
#define Q_K16_LOADS(t, b, h, x0, x1, x2)                                                                          \
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)((b) + ((t) == Q_Q6_K ? 64 * (h) : 32 + 32 * (h))));    \
    const __m256i x1 = (t) == Q_Q6_K ? _mm256_loadu_si256((const __m256i *)((b) + 64 * (h) + 32)) : x0;           \
    const __m256i x2 = _mm256_loadu_si256((const __m256i *)((b) + ((t) == Q_Q6_K ? 128 + 32 * (h) : 0)))

/* vector 4h + i's u from its half's loads. Q6_K: the 4 low bits from ql, the 2 high ones (bits 2i of qh) moved
   to bits 4-5; Q3_K: bits 2i of qs, and bit 4h + i of hmask moved to bit 2 (u - 4 is the value). One 16-bit
   shift each (what crosses a byte is masked). */
QATTR static inline __attribute__((always_inline)) __m256i FN(q_k16_u)(const int t, __m256i x0, __m256i x1,
                                                                      __m256i x2, const int h, const int i) {
    if (t == Q_Q6_K) {
        const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), l = i % 2 ? x1 : x0;
        const __m256i lo = _mm256_and_si256(i < 2 ? l : _mm256_srli_epi16(l, 4), m4);
        const __m256i hb = i == 0 ? _mm256_slli_epi16(x2, 4) : i == 1 ? _mm256_slli_epi16(x2, 2)
                         : i == 2 ? x2 : _mm256_srli_epi16(x2, 2);
        return _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
    }
    const int bit = 4 * h + i;
    const __m256i hb = bit >= 2 ? _mm256_srli_epi16(x2, bit - 2) : _mm256_slli_epi16(x2, 2 - bit);
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x0, 2 * i), _mm256_set1_epi8(3)),
                           _mm256_and_si256(hb, _mm256_set1_epi8(4)));
}

/* the scales of vector i of half sc (the 8 group scales of a half in both lanes): its two groups' in every
   int16 lane of the low and high 128 bits */
#define Q_K16_S(sc, i) _mm256_shuffle_epi8((sc), _mm256_load_si256((const __m256i *)q_k6_pair[i]))
#define Q_K16_HALF(scv, h) _mm256_broadcastsi128_si256((h) ? _mm256_extracti128_si256((scv), 1) : _mm256_castsi256_si128(scv))

/* a super-block's integer dot with the activation's (aq, its group sums isum), streaming */
QATTR static inline __attribute__((always_inline)) __m256i FN(q_k16_dot)(const int t, const uint8_t *b,
                                                                        const int8_t *aq, const int16_t *isum) {
    const __m256i scv = FN(q_k16_scv)(t, b);
    __m256i sumi = FN(q_k_offset_start)(scv, isum, Q_K16_SHIFT(t));
    for (int h = 0; h < 2; h++) {
        const __m256i sc = Q_K16_HALF(scv, h);
        Q_K16_LOADS(t, b, h, x0, x1, x2);
        for (int i = 0; i < 4; i++) {
            const __m256i p = _mm256_maddubs_epi16(FN(q_k16_u)(t, x0, x1, x2, h, i),
                                                   _mm256_loadu_si256((const __m256i *)(aq + 128 * h + 32 * i)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, Q_K16_S(sc, i)));
        }
    }
    return sumi;
}

/* Q_PF_T0: a K-quant row kernel's prefetch, pf bytes ahead (the rows a few passes on), of the bb bytes of its
   super-block at b, to L1 (measured on Zen 4, a C loop against ggml's vec_dot, Q6_K 1 x 2048 x 32768 from
   memory: 0.93x ggml against 0.6x without, 0.7x with the prefetches to L2; 1 x 2048 x 2048 about 1% slower) */
#define Q_PF_T0(b, bb, pf)                                                                                      \
    if (pf)                                                                                                     \
        for (int l_ = 0; l_ < (bb); l_ += 64) _mm_prefetch((const char *)(b) + (pf) + l_, _MM_HINT_T0)

/* Q2_K: 2-bit unsigned values, per group of 16 a 4-bit scale and a 4-bit min (value = d*sc*q - dmin*m); the
   groups of 32 values (128h + 32j + l: bits 2j of qs[32h + l]) are 8h + 2j (low lane) and 8h + 2j + 1. Every
   product is taken 16 times (exact in integers; the power of two leaves the float operations' bits as they
   would be without it, short of overflow or subnormals, and the result is divided by 16 at the end): each
   field is masked in place (q, 4q,
   16q; the top one shifted once to 16q) and multiplied by 16, 4 or 1 times its scale, picked by pshufb
   straight from the scale bytes, the mins 16 times from the high nibbles in place. The maddubs pairs stay
   below 2 * 48 * 128 and the madd sums below 2^20. */
QATTR static __attribute__((noinline)) float FN(q_gemv_q2k_row)(const uint8_t *w, int64_t nsb, const q_arow *a,
                                                               const int64_t pf) {
    const __m256i m3 = _mm256_set1_epi8(3), m12 = _mm256_set1_epi8(12), m48 = _mm256_set1_epi8(48);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + 84 * ib;
        const int8_t *aq = a->q + 256 * ib;
        Q_PF_T0(b, 84, pf);
        int32_t dpair;
        memcpy(&dpair, b + 80, 4); /* d and dmin, converted together: dy * (d, dmin) in lanes 0 and 1 */
        const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dpair)), _mm_set1_ps(a->ls[64 * ib]));
        const __m128i s8 = _mm_loadu_si128((const __m128i *)b);
        const __m256i sc = _mm256_and_si256(_mm256_broadcastsi128_si256(s8), _mm256_set1_epi8(15));
        const __m256i sc4 = _mm256_slli_epi16(sc, 2), sc16 = _mm256_slli_epi16(sc, 4); /* <= 240: no carry */
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8((char)0xF0)));
        const __m256i mg = _mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)(a->isum + 16 * ib)));
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mg), _mm256_broadcastss_ps(_mm_movehdup_ps(dd)), acc);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h));
            const __m256i u[4] = {_mm256_and_si256(v, m3), _mm256_and_si256(v, m12), _mm256_and_si256(v, m48),
                                  _mm256_and_si256(_mm256_srli_epi16(v, 2), m48)};
            const __m256i s[4] = {sc16, sc4, sc, sc};
            for (int j = 0; j < 4; j++) {
                const __m256i p = _mm256_maddubs_epi16(u[j], _mm256_loadu_si256((const __m256i *)(aq + 128 * h + 32 * j)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(s[j], _mm256_load_si256((const __m256i *)q_k2_sel[4 * h + j]))));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_broadcastss_ps(dd), acc);
    }
    return FN(q_hsum256)(acc) * 0.0625f;
}

/* the lane sums of four int32 vectors, in lanes 0..3 (exact) */
QATTR static inline __m128i FN(q_hsum4_epi32)(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

/* The float part of a Q6_K row's dot, four super-blocks at a time: lane q of acc takes super-block 4i + q's
   exact integer sum s4 times its d_w * d_a (hh: the four fp16 d_w, dy: the four d_a; zeros past the row's
   end); the row's result is the lane sum at the end (q_hsum128). Wherever a (weight row, activation row) pair
   is computed (q_gemv_q6k_rows, the batched kernel), these operations in this order. */
QATTR static inline __m128 FN(q_k16_fold4)(__m128i s4, uint64_t hh, __m128 dy, __m128 acc) {
    const __m128 d = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)hh)), dy);
    return _mm_fmadd_ps(_mm_cvtepi32_ps(s4), d, acc);
}

/* the d_a of super-blocks i0 .. i0 + n - 1 (n <= 4) of an activation row in lanes 0..n-1, zeros beside */
QATTR static inline __m128 FN(q_k16_dy4)(const q_arow *a, int64_t i0, int n) {
    const float *ls = a->ls + 64 * i0;
    if (n == 4) return _mm_setr_ps(ls[0], ls[64], ls[128], ls[192]);
    return _mm_setr_ps(ls[0], n > 1 ? ls[64] : 0.0f, n > 2 ? ls[128] : 0.0f, 0.0f);
}

/* Q6_K, R weight rows one after another (one forward stream; measured faster than passes of 4 interleaved
   rows): each super-block's integer sum reduced to one exact integer (its lanes hold parts that cancel, so
   identity weights give the activations back exactly), four super-blocks' at once (pairs reduced as they
   come), then one float multiply-add for the four. */
QATTR static __attribute__((noinline)) void FN(q_gemv_q6k_rows)(const uint8_t *const *wr, int R, int64_t nsb,
                                                               const q_arow *a, float *out, const int64_t pf) {
    for (int r = 0; r < R; r++) {
        const uint8_t *w = wr[r];
        __m128 acc = _mm_setzero_ps();
        for (int64_t i0 = 0; i0 < nsb; i0 += 4) {
            const int n = nsb - i0 < 4 ? (int)(nsb - i0) : 4;
            uint64_t hh = 0;
            __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                if (q >= n) break;
                const uint8_t *b = w + 210 * (i0 + q);
                Q_PF_T0(b, 210, pf);
                uint16_t h;
                memcpy(&h, b + 208, 2);
                hh |= (uint64_t)h << (16 * q);
                s[q] = FN(q_k16_dot)(Q_Q6_K, b, a->q + 256 * (i0 + q), a->isum + 16 * (i0 + q));
                if (q % 2) s[q - 1] = _mm256_hadd_epi32(s[q - 1], s[q]); /* = q_hsum4_epi32's first step */
            }
            if (n % 2) s[n - 1] = _mm256_hadd_epi32(s[n - 1], _mm256_setzero_si256());
            const __m256i c = _mm256_hadd_epi32(s[0], s[2]);
            const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
            acc = FN(q_k16_fold4)(s4, hh, FN(q_k16_dy4)(a, i0, n), acc);
        }
        out[r] = FN(q_hsum128)(acc);
    }
}

/* Q3_K, one row at a time: per super-block the integer sum's 8 lanes converted and scaled by one float
   multiply-add, as ggml's kernels do (its values' bias, 4, keeps the cancelling parts of the lanes small;
   measured on Zen 4, 1 x 2048 x 2048: 1.15x faster than one exact reduction per super-block) */
QATTR static __attribute__((noinline)) float FN(q_gemv_q3k_row)(const uint8_t *w, int64_t nsb, const q_arow *a,
                                                               const int64_t pf) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + 110 * ib;
        Q_PF_T0(b, 110, pf);
        const __m256i sumi = FN(q_k16_dot)(Q_Q3_K, b, a->q + 256 * ib, a->isum + 16 * ib);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(a->ls[64 * ib] * FN(q_h2f)(b + 108)), acc);
    }
    return FN(q_hsum256)(acc);
}

/* IQ4_XS's 8 scales (6 bits, less 32) as int16 in both lanes: low nibbles of bytes 4..7 (sub-block 2i the low
   nibble of byte i, 2i + 1 the high one), top 2 bits from the 16-bit word at 2 (bits 2ib) */
QATTR static inline __m256i FN(q_iq4xs_scales)(const uint8_t *b) {
    uint32_t l32;
    uint16_t h16;
    memcpy(&l32, b + 4, 4);
    memcpy(&h16, b + 2, 2);
    uint64_t lo = l32, hi = h16; /* spread: field i into byte i */
    lo = (lo | lo << 16) & 0x0000FFFF0000FFFFull;
    lo = (lo | lo << 8) & 0x00FF00FF00FF00FFull;
    lo = (lo | lo << 4) & 0x0F0F0F0F0F0F0F0Full;
    hi = (hi | hi << 24) & 0x000000FF000000FFull;
    hi = (hi | hi << 12) & 0x000F000F000F000Full;
    hi = (hi | hi << 6) & 0x0303030303030303ull;
    const __m128i s8 = _mm_sub_epi8(_mm_cvtsi64_si128((long long)(lo | hi << 4)), _mm_set1_epi8(32));
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8));
}

/* IQ4_XS: per sub-block of 32 the IQ4_NL values (pshufb), |w| times (a with w's sign) in int16 pairs, madd
   by the sub-block's scale */
QATTR static __attribute__((noinline)) float FN(q_gemv_iq4xs_row)(const uint8_t *w, int64_t nsb, const q_arow *a) {
    const __m256i kv = _mm256_load_si256((const __m256i *)q_iq4nl_x2);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + 136 * ib;
        const int8_t *aq = a->q + 256 * ib;
        const __m256i sc = FN(q_iq4xs_scales)(b);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i wv = _mm256_shuffle_epi8(kv, FN(q_nib32)(b + 8 + 16 * j));
            const __m256i av = _mm256_loadu_si256((const __m256i *)(aq + 32 * j));
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)q_k4_bcast[j]))));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(a->ls[64 * ib] * FN(q_h2f)(b)), acc);
    }
    return FN(q_hsum256)(acc);
}

/* out[r] = wr[r] . a for R (1..4) weight rows of K elements of type t; 0: a format without a kernel here */
QATTR static int FN(q_gemv_k)(int t, const uint8_t *const *wr, int R, int64_t K, const q_arow *a, float *out,
                              int64_t pf) {
    switch (t) {
    case Q_Q4_0: Q_GEMV_ROWS(q_gemv_b32_r, Q_Q4_0, wr, R, K, a, out, pf) return 1;
    case Q_Q4_1: Q_GEMV_ROWS(q_gemv_b32_r, Q_Q4_1, wr, R, K, a, out, pf) return 1;
    case Q_Q5_0: Q_GEMV_ROWS(q_gemv_b32_r, Q_Q5_0, wr, R, K, a, out, pf) return 1;
    case Q_Q5_1: Q_GEMV_ROWS(q_gemv_b32_r, Q_Q5_1, wr, R, K, a, out, pf) return 1;
    case Q_Q8_0: Q_GEMV_ROWS(q_gemv_b32_r, Q_Q8_0, wr, R, K, a, out, pf) return 1;
    case Q_IQ4_NL: Q_GEMV_ROWS(q_gemv_b32_r, Q_IQ4_NL, wr, R, K, a, out, pf) return 1;
    case Q_MXFP4: Q_GEMV_ROWS(q_gemv_b32_r, Q_MXFP4, wr, R, K, a, out, pf) return 1;
    case Q_Q6_K: FN(q_gemv_q6k_rows)(wr, R, K / 256, a, out, pf); return 1;
    case Q_Q2_K: case Q_Q3_K: case Q_Q4_K: case Q_Q5_K: case Q_IQ4_XS: break;
    default: return 0;
    }
    const int64_t nsb = K / 256;
    for (int r = 0; r < R; r++) {
        switch (t) {
        case Q_Q2_K: out[r] = FN(q_gemv_q2k_row)(wr[r], nsb, a, pf); break;
        case Q_Q3_K: out[r] = FN(q_gemv_q3k_row)(wr[r], nsb, a, pf); break;
        case Q_Q4_K: out[r] = FN(q_gemv_q45k_row)(0, wr[r], nsb, a); break;
        case Q_Q5_K: out[r] = FN(q_gemv_q45k_row)(1, wr[r], nsb, a); break;
        default: out[r] = FN(q_gemv_iq4xs_row)(wr[r], nsb, a); break;
        }
    }
    return 1;
}
/* Q_B32_SIGNED, Q_B32_NB_SHIFT and Q_K16_*: undefined after csimd_quant_batch_avx2.h, which uses them too */
