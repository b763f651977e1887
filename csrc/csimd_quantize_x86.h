/* x86 vector copies of the row quantizers whose plain C the compiler leaves mostly scalar: Q4_0, Q5_0,
   Q4_1, Q5_1 (the first largest magnitude, the first smallest/largest value, the truncating conversions)
   and MXFP4 (the nearest of 16 values). Each writes the bytes of its plain-C twin in csimd_quant.h for
   every input (ties resolved to the first element, NaN never taken, out-of-range conversions as x86's
   cvttss2si): the same float operations, one per lane, without FMA. Compiled twice, for AVX2 and for
   AVX-512 (the same 256-bit code, EVEX-encoded with 32 registers: a block of 32 is four vectors), and
   called on those csimd paths (q_x86_blocks); the scalar path keeps the plain C. Included by
   csimd_quant.h. */
#ifndef PRISM_CSIMD_QUANTIZE_X86_H
#define PRISM_CSIMD_QUANTIZE_X86_H
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* always inlined into the two entry points below, each compiled for its ISA and with fp-contract=off: the
   AVX-512 target brings FMA, which would fuse a product and a sum that ggml rounds apart */
#define Q_X86 __attribute__((target("avx2"), optimize("fp-contract=off"), always_inline)) static inline

/* the horizontal max of m's lanes (NaN-free: the lanes come from maxima that skip NaN) */
Q_X86 float q_x86_hmax(__m256 m) {
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
    return _mm256_cvtss_f32(m);
}

Q_X86 float q_x86_hmin(__m256 m) {
    m = _mm256_min_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
    m = _mm256_min_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
    return _mm256_cvtss_f32(m);
}

/* the largest magnitude of 32 values (v: four vectors), NaN skipped: max_ps returns its second operand when
   the first is NaN */
Q_X86 float q_x86_absmax(const __m256 *v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m);
    return q_x86_hmax(m);
}

/* the first element of largest magnitude, as q_signed_absmax (0 when all are zero) */
Q_X86 float q_x86_signed_absmax(const __m256 *v, const float *x) {
    const float amax = q_x86_absmax(v);
    if (!(amax > 0.0f)) return 0.0f;
    const __m256 sign = _mm256_set1_ps(-0.0f), m = _mm256_set1_ps(amax);
    uint32_t hit = 0;
    for (int k = 0; k < 4; k++)
        hit |= (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v[k]), m, _CMP_EQ_OQ)) << (8 * k);
    return x[__builtin_ctz(hit)];
}

/* the first smallest (lo) and largest (hi) of 32 values, as q_min_max: the lanes' min/max (min_ps keeps its
   second operand on NaN and on equality), and where one is zero, whose sign the lane order could change,
   the block's first zero */
Q_X86 void q_x86_min_max(const __m256 *v, const float *x, float *lo, float *hi) {
    __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
    for (int k = 0; k < 4; k++) {
        mn = _mm256_min_ps(v[k], mn);
        mx = _mm256_max_ps(v[k], mx);
    }
    *lo = q_x86_hmin(mn);
    *hi = q_x86_hmax(mx);
    if (*lo == 0.0f || *hi == 0.0f)
        for (int j = 0; j < 32; j++)
            if (x[j] == 0.0f) {
                if (*lo == 0.0f) *lo = x[j];
                if (*hi == 0.0f) *hi = x[j];
                break;
            }
}

/* q_j = min(top, (int8_t)trunc(t_j)) for 32 values t (C's (int8_t) of a float on x86: the low byte of
   cvttss2si's int), low nibbles packed to qs (j and j + 16 share a byte), bit 4 of each to qh (NULL: none):
   q_pack_q4q5 */
Q_X86 void q_x86_pack(const __m256 *t, int top, uint8_t *qs, uint8_t *qh) {
    const __m256i lowbyte = _mm256_set1_epi32(0xFF);
    __m256i i[4];
    for (int k = 0; k < 4; k++) i[k] = _mm256_and_si256(_mm256_cvttps_epi32(t[k]), lowbyte);
    __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(i[0], i[1]), _mm256_packus_epi32(i[2], i[3]));
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* the packs' lane order */
    b = _mm256_min_epi8(b, _mm256_set1_epi8((char)top));
    const __m128i nib = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(_mm256_castsi256_si128(b), nib);
    const __m128i hi = _mm_and_si128(_mm256_extracti128_si256(b, 1), nib);
    _mm_storeu_si128((__m128i *)qs, _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
    if (qh) { /* bit 4 of each byte to its top, then one bit per byte */
        const uint32_t h = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(b, 3));
        memcpy(qh, &h, 4);
    }
}

/* nb blocks of Q4_0 (nbits 4) / Q5_0 (5), as q_quant_q4q5_0 */
Q_X86 void q_x86_q4q5_0(const float *x, uint8_t *y, int64_t nb, int nbits) {
    const float half = nbits == 4 ? 8.0f : 16.0f;
    const int top = nbits == 4 ? 15 : 31, bb = nbits == 4 ? 18 : 22;
    for (int64_t ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *yb = y + bb * ib;
        __m256 v[4], t[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(xb + 8 * k);
        const float d = q_x86_signed_absmax(v, xb) / -half, id = d != 0.0f ? 1.0f / d : 0.0f;
        q_put_f16(yb, d);
        const __m256 vid = _mm256_set1_ps(id), off = _mm256_set1_ps(half + 0.5f);
        for (int k = 0; k < 4; k++) t[k] = _mm256_add_ps(_mm256_mul_ps(v[k], vid), off);
        q_x86_pack(t, top, yb + (nbits == 4 ? 2 : 6), nbits == 5 ? yb + 2 : NULL);
    }
}

/* nb blocks of Q4_1 (nbits 4) / Q5_1 (5), as q_quant_q4q5_1 */
Q_X86 void q_x86_q4q5_1(const float *x, uint8_t *y, int64_t nb, int nbits) {
    const float top = nbits == 4 ? 15.0f : 31.0f;
    const int bb = nbits == 4 ? 20 : 24;
    for (int64_t ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *yb = y + bb * ib;
        __m256 v[4], t[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(xb + 8 * k);
        float lo, hi;
        q_x86_min_max(v, xb, &lo, &hi);
        const float d = (hi - lo) / top, id = d != 0.0f ? 1.0f / d : 0.0f;
        q_put_f16(yb, d);
        q_put_f16(yb + 2, lo);
        const __m256 vid = _mm256_set1_ps(id), vlo = _mm256_set1_ps(lo), h = _mm256_set1_ps(0.5f);
        for (int k = 0; k < 4; k++) t[k] = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v[k], vlo), vid), h);
        q_x86_pack(t, (int)top, yb + (nbits == 4 ? 4 : 8), nbits == 5 ? yb + 4 : NULL);
    }
}

/* nb blocks of MXFP4, as q_quant_mxfp4: the 16 candidates tried on 8 values at a time, the first of equal
   errors kept (a strict <); the indices (0..15) packed as nibbles */
Q_X86 void q_x86_mxfp4(const float *x, uint8_t *y, int64_t nb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t ib = 0; ib < nb; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *yb = y + 17 * ib;
        __m256 v[4], best[4], err[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(xb + 8 * k);
        const uint8_t e = q_mxfp4_exponent(q_x86_absmax(v));
        const float d = q_e8m0_half(e);
        yb[0] = e;
        const __m256 k0 = _mm256_set1_ps((float)kvalues_mxfp4[0] * d);
        for (int k = 0; k < 4; k++) {
            best[k] = _mm256_setzero_ps();
            err[k] = _mm256_andnot_ps(sign, _mm256_sub_ps(k0, v[k]));
        }
        for (int i = 1; i < 16; i++) {
            const __m256 kd = _mm256_set1_ps((float)kvalues_mxfp4[i] * d), vi = _mm256_set1_ps((float)i);
            for (int k = 0; k < 4; k++) {
                const __m256 e2 = _mm256_andnot_ps(sign, _mm256_sub_ps(kd, v[k]));
                const __m256 lt = _mm256_cmp_ps(e2, err[k], _CMP_LT_OQ);
                err[k] = _mm256_blendv_ps(err[k], e2, lt);
                best[k] = _mm256_blendv_ps(best[k], vi, lt);
            }
        }
        q_x86_pack(best, 15, yb + 1, NULL);
    }
}

/* The lattice searches' neighbour scan for points of 8 coordinates (IQ2_XXS, IQ2_XS, IQ2_S): of the nb[0]
   grid points listed in nb[1..], the one of least sum over i of (w_i*(scale*p_i - x_i))*(scale*p_i - x_i),
   summed in order i = 0..7 as q_best_neighbour does, one neighbour per lane (eight at a time, the
   coordinates gathered from pos, 8 per point); the first of equal sums wins (a strict < per lane, then the
   first listed among the lanes holding the least). Returns its position in nb (1..nb[0]), 0 when none is
   below FLT_MAX (every sum NaN or infinite) */
Q_X86 int q_x86_nearest8(const int8_t *pos, const uint16_t *nb, const float *x, const float *w, float scale) {
    const int n = nb[0];
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 best = _mm256_set1_ps(FLT_MAX);
    __m256i at = _mm256_setzero_si256();
    uint16_t tail[8];
    for (int j0 = 1; j0 <= n; j0 += 8) {
        const uint16_t *ids = nb + j0;
        if (j0 + 8 > n + 1) { /* the last few: pad with the first of them, masked below */
            for (int l = 0; l < 8; l++) tail[l] = nb[j0 + (j0 + l <= n ? l : 0)];
            ids = tail;
        }
        const __m256i off = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)ids)), 3);
        const __m256i p03 = _mm256_i32gather_epi32((const int *)pos, off, 1);
        const __m256i p47 = _mm256_i32gather_epi32((const int *)(pos + 4), off, 1);
        __m256 d2 = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++) {
            const __m256i src = i < 4 ? p03 : p47;
            const __m256i b = _mm256_srai_epi32(_mm256_sllv_epi32(src, _mm256_set1_epi32(24 - 8 * (i & 3))), 24);
            const __m256 diff = _mm256_sub_ps(_mm256_mul_ps(vs, _mm256_cvtepi32_ps(b)), _mm256_set1_ps(x[i]));
            d2 = _mm256_add_ps(d2, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(w[i]), diff), diff));
        }
        const __m256i j = _mm256_add_epi32(_mm256_set1_epi32(j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n + 1), j));
        const __m256 lt = _mm256_and_ps(_mm256_cmp_ps(d2, best, _CMP_LT_OQ), valid);
        best = _mm256_blendv_ps(best, d2, lt);
        at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at), _mm256_castsi256_ps(j), lt));
    }
    const float m = q_x86_hmin(best);
    if (!(m < FLT_MAX)) return 0;
    unsigned hit = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(best, _mm256_set1_ps(m), _CMP_EQ_OQ));
    int32_t js[8];
    _mm256_storeu_si256((__m256i *)js, at);
    int first = n + 1;
    for (; hit; hit &= hit - 1) {
        const int l = __builtin_ctz(hit);
        first = js[l] < first ? js[l] : first;
    }
    return first;
}

/* nb blocks of t from x to y when this path has a vector copy of t's quantizer: 1 done, 0 not */
#define Q_X86_BLOCKS(SFX, TARGET)                                                                           \
    __attribute__((target(TARGET), optimize("fp-contract=off"))) static int q_x86_blocks_##SFX(int t, const float *x,  \
                                                                                             uint8_t *y, int64_t nb) { \
        switch (t) {                                                                                       \
        case Q_Q4_0: q_x86_q4q5_0(x, y, nb, 4); return 1;                                                  \
        case Q_Q5_0: q_x86_q4q5_0(x, y, nb, 5); return 1;                                                  \
        case Q_Q4_1: q_x86_q4q5_1(x, y, nb, 4); return 1;                                                  \
        case Q_Q5_1: q_x86_q4q5_1(x, y, nb, 5); return 1;                                                  \
        case Q_MXFP4: q_x86_mxfp4(x, y, nb); return 1;                                                     \
        default: return 0;                                                                                 \
        }                                                                                                  \
    }
Q_X86_BLOCKS(avx2, "avx2")
Q_X86_BLOCKS(avx512, "avx2,avx512f,avx512bw,avx512vl")
#undef Q_X86_BLOCKS

#define Q_X86_NEAREST8(SFX, TARGET)                                                                           \
    __attribute__((target(TARGET), optimize("fp-contract=off"))) static int q_x86_nearest8_##SFX(              \
        const int8_t *pos, const uint16_t *nb, const float *x, const float *w, float scale) {                 \
        return q_x86_nearest8(pos, nb, x, w, scale);                                                          \
    }
Q_X86_NEAREST8(avx2, "avx2")
Q_X86_NEAREST8(avx512, "avx2,avx512f,avx512bw,avx512vl")
#undef Q_X86_NEAREST8
#undef Q_X86

/* the vector copy for the active csimd path (the AVX-512 one where the CPU has BW and VL too): 1 when it
   wrote the nb blocks, 0 when t has none there (the caller runs the plain C) */
static int q_x86_blocks(int t, const float *x, uint8_t *y, int64_t nb) {
    switch (csimd_get_isa()) {
    case CSIMD_ISA_AVX512:
        if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
            return q_x86_blocks_avx512(t, x, y, nb);
        return q_x86_blocks_avx2(t, x, y, nb);
    case CSIMD_ISA_AVX2: case CSIMD_ISA_AVXVNNI: return q_x86_blocks_avx2(t, x, y, nb);
    default: return 0;
    }
}

/* q_x86_nearest8 on the active path: its answer, or -1 where the path has no vector copy */
static int q_x86_neighbour8(const int8_t *pos, const uint16_t *nb, const float *x, const float *w, float scale) {
    switch (csimd_get_isa()) {
    case CSIMD_ISA_AVX512:
        if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
            return q_x86_nearest8_avx512(pos, nb, x, w, scale);
        return q_x86_nearest8_avx2(pos, nb, x, w, scale);
    case CSIMD_ISA_AVX2: case CSIMD_ISA_AVXVNNI: return q_x86_nearest8_avx2(pos, nb, x, w, scale);
    default: return -1;
    }
}
#else
static int q_x86_blocks(int t, const float *x, uint8_t *y, int64_t nb) {
    (void)t, (void)x, (void)y, (void)nb;
    return 0;
}
static int q_x86_neighbour8(const int8_t *pos, const uint16_t *nb, const float *x, const float *w, float scale) {
    (void)pos, (void)nb, (void)x, (void)w, (void)scale;
    return -1;
}
#endif
#endif
