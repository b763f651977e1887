/* AVX-512 VNNI fused matrix-vector kernels of the formats csimd_quant_impl.h's own AVX-512 kernels leave out
   (Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4). Part of the quantized template, included by
   csimd_quant_impl.h at ISA_LEVEL 2 after its q_gemv_k, which hands these formats to q_gemv_k_avx512y.

   The 256-bit kernels of csimd_quant_avx2.h are compiled here a second time, with the AVX-512 copy's target
   (QATTR: VEX or EVEX encodings as the compiler likes, 32 vector registers) and q_dp4 as AVX512-VNNI's
   vpdpbusd on ymm (the AVX-VNNI copy's instruction, EVEX-encoded): the same integer sums (exact), the same
   float operations, so a row's result is that of the AVX-VNNI copy bit for bit and never depends on the
   rows computed beside it. Their names take the suffix avx512y (SFX is swapped around the include), so
   they sit beside the 512-bit kernels of the same names. */

#if ISA_LEVEL != 2
#error "csimd_quant_avx512.h belongs to the AVX-512 copy of the template"
#endif

/* what csimd_quant_avx2.h calls from the template, under the swapped suffix */
QATTR static inline __m256i q_dp4_avx512y(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
QATTR static inline float q_h2f_avx512y(const uint8_t *p) { return FN(q_h2f)(p); }
QATTR static inline __m256i q_k4_scales_mins_avx512y(const uint8_t *s) { return FN(q_k4_scales_mins)(s); }

#undef SFX
#define SFX avx512y
#include "csimd_quant_avx2.h"
#undef SFX
#define SFX avx512

static const int8_t q_iq4nl_u128_x4[64] __attribute__((aligned(64))) = { /* IQ4_NL's values + 128, 4 lanes */
#define Q_U128 1, 24, 45, 63, 79, 93, 106, 118, (int8_t)129, (int8_t)141, (int8_t)153, (int8_t)166, (int8_t)181, \
               (int8_t)197, (int8_t)217, (int8_t)241
    Q_U128, Q_U128, Q_U128, Q_U128,
#undef Q_U128
};
static const int8_t q_mxfp4_u16_x4[64] __attribute__((aligned(64))) = { /* MXFP4's doubled values + 16, 4 lanes */
#define Q_U16 16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4
    Q_U16, Q_U16, Q_U16, Q_U16,
#undef Q_U16
};

/* Q2_K, Q3_K and IQ4_XS rows against one Q8_K activation row, R (1..4) weight rows per pass sharing the
   activation loads, 64 weights a vector as unsigned bytes u, each chunk c of 64 (elements 64c..64c+63) one
   vpdpbusd with the activations: lane i then holds the exact integer dot of 4 values of group 4c + i/4.
   Q2_K (u = q, 0..3) and Q3_K (u = q + 4, 0..7, the 4 taken back in the accumulator: -4 * the sum of each 4
   activations) keep their 16 group scales in integers as q_gemv_q6k_r does (two results packed to 16 bits,
   vpdpwssd by the scales; Q2_K's mins against the activation's integer group sums); IQ4_XS's table values
   + 128 (the 128 taken back: a->nbias) give lanes up to 4 * 127 * 128, past 16 bits, so each lane is
   multiplied by its sub-block's scale in 32 bits (at most 8.4e6 summed over a super-block: exact, and exact
   as float). One float multiply-add per super-block with d_w * d_a, as the 256-bit kernels. */
static const int32_t q_k3_hrot[4][16] __attribute__((aligned(64))) = {
    /* Q3_K's high bit of element 128h + 32j + l is bit 4h + j of hmask[l]: chunk c (h = c / 2, j = 2 (c % 2) and
       one more in the upper half) rotated to bit 2 (32-bit rotates, what crosses a byte masked off) */
    {2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0, 31, 31, 31, 31, 31, 31, 31, 31},
    {30, 30, 30, 30, 30, 30, 30, 30, 29, 29, 29, 29, 29, 29, 29, 29}, {28, 28, 28, 28, 28, 28, 28, 28, 27, 27, 27, 27, 27, 27, 27, 27},
};

QATTR static inline __attribute__((always_inline)) void FN(q_gemv_k2k3_r)(const int t, const uint8_t *const *wr,
                                                                         const int R, int64_t nsb, const q_arow *a,
                                                                         float *out, const int64_t pf) {
    const int three = t == Q_Q3_K;
    const int64_t bb = three ? 110 : 84;
    const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4);
    /* the 2 low bits of chunk c: bits 2j of qs[32 (c / 2) + l], j = 2 (c % 2) (lower 32 values), + 1 (upper) */
    const __m512i sh0 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh1 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    const __m512i ix0 = _mm512_load_si512((const void *)q_k6_scale_idx[0]);
    const __m512i ix1 = _mm512_load_si512((const void *)q_k6_scale_idx[1]);
    __m512 acc[4];
    __m256 accm[4];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm512_setzero_ps();
        accm[r] = _mm256_setzero_ps();
    }
    for (int64_t ib = 0; ib < nsb; ib++) {
        const int8_t *aq = a->q + 256 * ib;
        __m512i av[4], nb[4];
        for (int c = 0; c < 4; c++) {
            av[c] = _mm512_loadu_si512((const void *)(aq + 64 * c));
            /* Q3_K: dpbusd from -4 * (the sum of each 4 activations) */
            nb[c] = three ? _mm512_srai_epi32(_mm512_loadu_si512((const void *)(a->nbias + 64 * ib + 16 * c)), 5)
                          : _mm512_setzero_si512();
        }
        const __m256i isum = _mm256_loadu_si256((const __m256i *)(a->isum + 16 * ib));
        const float dy = a->ls[64 * ib];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + bb * ib, *qs = b + (three ? 32 : 16);
            if (pf)
                for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
            __m256i scv;
            if (three) {
                scv = _mm256_cvtepi8_epi16(q_k3_scales_avx512y(b + 96));
            } else {
                const __m128i s8 = _mm_loadu_si128((const __m128i *)b);
                scv = _mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8(15)));
                const __m256i mnv = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(15)));
                accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mnv, isum)),
                                          _mm256_set1_ps(dy * FN(q_h2f)(b + 82)), accm[r]);
            }
            const __m512i sc5 = _mm512_castsi256_si512(scv);
            const __m512i hm = three ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b)) : _mm512_setzero_si512();
            __m512i p[4];
            for (int h = 0; h < 2; h++) {
                const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
                for (int i = 0; i < 2; i++) {
                    const int c = 2 * h + i;
                    __m512i u = _mm512_and_si512(_mm512_srlv_epi16(v, i ? sh1 : sh0), m3);
                    if (three)
                        u = _mm512_ternarylogic_epi32(u, _mm512_rolv_epi32(hm, _mm512_load_si512((const void *)q_k3_hrot[c])),
                                                      m4, 0xF8);
                    p[c] = _mm512_dpbusd_epi32(nb[c], u, av[c]); /* |4 q a| <= 4 * 4 * 128 */
                }
            }
            __m512i sumi = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p[0], p[1]),
                                               _mm512_permutexvar_epi16(ix0, sc5));
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(p[2], p[3]), _mm512_permutexvar_epi16(ix1, sc5));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(dy * FN(q_h2f)(b + (three ? 108 : 80))),
                                     acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = FN(q_hsum512)(acc[r]) - (three ? 0.0f : q_hsum256_avx512y(accm[r]));
}

/* IQ4_XS: the four 128-bit lanes of chunk c are the 16 low nibbles, the 16 high ones of sub-block 2c, then those
   of 2c + 1 (bytes 8 + 32c ..: [b0, b0, b1, b1] shifted by 0, 4, 0, 4) */
static const int32_t q_xs_scale_idx[4][16] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5}, {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
};

QATTR static inline __attribute__((always_inline)) void FN(q_gemv_iq4xs_r)(const uint8_t *const *wr, const int R,
                                                                          int64_t nsb, const q_arow *a, float *out,
                                                                          const int64_t pf) {
    const __m512i m4 = _mm512_set1_epi8(15), kv = _mm512_load_si512((const void *)q_iq4nl_u128_x4);
    const __m512i nib_shift = _mm512_broadcast_i64x4(_mm256_set_m128i(_mm_set1_epi16(4), _mm_setzero_si128()));
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const int8_t *aq = a->q + 256 * ib;
        __m512i av[4], nb[4];
        for (int c = 0; c < 4; c++) {
            av[c] = _mm512_loadu_si512((const void *)(aq + 64 * c));
            nb[c] = _mm512_loadu_si512((const void *)(a->nbias + 64 * ib + 16 * c));
        }
        const float dy = a->ls[64 * ib];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + 136 * ib;
            if (pf)
                for (int l = 0; l < 136; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
            const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(q_iq4xs_scales_avx512y(b))));
            __m512i sumi = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                const __m512i v = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                                           _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 8 + 32 * c))));
                const __m512i u = _mm512_shuffle_epi8(kv, _mm512_and_si512(_mm512_srlv_epi16(v, nib_shift), m4));
                const __m512i p = _mm512_dpbusd_epi32(nb[c], u, av[c]);
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(p, _mm512_permutexvar_epi32(
                                                                        _mm512_load_si512((const void *)q_xs_scale_idx[c]), sc)));
            }
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(dy * FN(q_h2f)(b)), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = FN(q_hsum512)(acc[r]);
}
