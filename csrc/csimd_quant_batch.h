/* Batched decoding on AVX-512 VNNI: one pass over a weight row feeds up to QB_ROWS activation rows. Part of
   the ISA template (included by csimd_quant_impl.h on the AVX-512 path, after the fused matrix-vector kernels).

   A step of several sequences multiplies each weight matrix by a few activation rows (batched decoding:
   one per sequence). The weights are read straight from their blocks (as the fused matrix-vector kernels
   do), unpacked once per weight row and reused from registers for every activation row of the tile; each
   activation row has its own accumulators, and the operations of a row are the same, in the same order,
   whichever rows share the pass, so every result is bit for bit that of its row alone (and so the same
   for one row, which goes through these kernels too).

   Q4_0, Q5_0, Q8_0 (K a multiple of 128): groups of four 32-element blocks, laid out so that each 32-bit
   lane of a vector holds four values of one block only: weights X0 = the first 16 values of each of the
   four blocks (one per 128-bit lane: a nibble format's low nibbles), X1 = the last 16. The activation rows
   are laid out the same way once per product (qb_pack_acts). Two dpbusd then give, per lane, the integer
   dot of 8 values of one block (the format's offset taken back in the accumulator, as q_gemv_b32_r), and
   one conversion, one multiply (d_w * d_a, per block) and one multiply-add per 128 weights and activation
   row finish it: 5 operations, against 8 for two blocks per vector (8 lanes per block, each scaled). The
   lane integers are exact (at most 8 * 128 * 127 < 2^24), so the float part is the only rounding.

   Q4_K, Q6_K: the arithmetic of q_gemv_q4k_r / q_gemv_q6k_r per (weight row, activation row), the
   super-block's unpacking and scale shuffles done once per weight row for every activation row. */

#define QB_ROWS 8 /* activation rows per pass over a weight row: their accumulators stay in registers */

#ifndef CSIMD_QB_ONCE
#define CSIMD_QB_ONCE
/* bytes of one activation row in the interleaved layout: per 128 values A0 (64), A1 (64), the offset's
   correction per lane (16 int32) and the activation scale per lane (16 float) */
static inline size_t qb_act_bytes(int64_t K) { return (size_t)K / 128 * 256; }
/* Q4_0/Q5_0/Q8_0 with K a multiple of 128 go through qb_b32_row (the interleaved activation rows) */
static inline int qb_b32_fmt(int t, int64_t K) { return K % 128 == 0 && (t == Q_Q4_0 || t == Q_Q5_0 || t == Q_Q8_0); }
#endif

/* an activation row (q_arow, natural order) into the interleaved layout for weights of type t: per 128
   values, A0 = [a 0-15, 32-47, 64-79, 96-111] (the first halves of the four blocks), A1 the second halves,
   the correction of t's stored offset (128, 8, 16) per lane of A0 and A1 summed (-offset * sum of the 8
   activations), and the scale of each lane's block */
QATTR static void FN(qb_pack_act)(int t, const q_arow *a, int64_t K, uint8_t *dst) {
    const int nb_shift = t == Q_Q8_0 ? 0 : t == Q_Q4_0 ? 4 : 3; /* a->nbias is -128 * sum: -8 and -16 * sum */
    for (int64_t k = 0; k < K; k += 128, dst += 256) {
        const __m512i l0 = _mm512_loadu_si512((const void *)(a->q + k)), l1 = _mm512_loadu_si512((const void *)(a->q + k + 64));
        _mm512_storeu_si512((void *)dst, _mm512_shuffle_i64x2(l0, l1, 0x88));
        _mm512_storeu_si512((void *)(dst + 64), _mm512_shuffle_i64x2(l0, l1, 0xDD));
        const __m512i n0 = _mm512_loadu_si512((const void *)(a->nbias + k / 4));
        const __m512i n1 = _mm512_loadu_si512((const void *)(a->nbias + k / 4 + 16));
        const __m512i nb = _mm512_add_epi32(_mm512_shuffle_i64x2(n0, n1, 0x88), _mm512_shuffle_i64x2(n0, n1, 0xDD));
        _mm512_storeu_si512((void *)(dst + 128), _mm512_srai_epi32(nb, nb_shift));
        const __m512 s0 = _mm512_loadu_ps(a->ls + k / 4), s1 = _mm512_loadu_ps(a->ls + k / 4 + 16);
        _mm512_storeu_ps((void *)(dst + 192), _mm512_shuffle_f32x4(s0, s1, 0x88)); /* one scale per block */
    }
}

/* the scales of four blocks at b (block bytes bb), each repeated over its block's four lanes */
QATTR static inline __m512 FN(qb_scales4)(const uint8_t *b, const int64_t bb) {
    const uint64_t hh = (uint64_t)FN(q_f16_bits)(b) | (uint64_t)FN(q_f16_bits)(b + bb) << 16 |
                        (uint64_t)FN(q_f16_bits)(b + 2 * bb) << 32 | (uint64_t)FN(q_f16_bits)(b + 3 * bb) << 48;
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)hh))));
}

/* four blocks at b as unsigned bytes (value + the format's offset): x0 their first 16 values, x1 the last 16 */
QATTR static inline __attribute__((always_inline)) void FN(qb_unpack4)(const int t, const uint8_t *b, const int64_t bb,
                                                                      __m512i *x0, __m512i *x1) {
    if (t == Q_Q8_0) {
        const __m512i z01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2))),
                                               _mm256_loadu_si256((const __m256i *)(b + bb + 2)), 1);
        const __m512i z23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2 * bb + 2))),
                                               _mm256_loadu_si256((const __m256i *)(b + 3 * bb + 2)), 1);
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        *x0 = _mm512_xor_si512(_mm512_shuffle_i64x2(z01, z23, 0x88), flip);
        *x1 = _mm512_xor_si512(_mm512_shuffle_i64x2(z01, z23, 0xDD), flip);
        return;
    }
    const int qo = t == Q_Q5_0 ? 6 : 2;
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b + qo)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + bb + qo)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + 2 * bb + qo)), 2);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + 3 * bb + qo)), 3);
    const __m512i m4 = _mm512_set1_epi8(15);
    *x0 = _mm512_and_si512(v, m4);
    *x1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (t == Q_Q5_0) { /* bit j of a block's qh is its value j's fifth bit: low halves to x0, high to x1 */
        uint32_t h[4];
        for (int i = 0; i < 4; i++) memcpy(&h[i], b + i * bb + 2, 4);
        const uint64_t lo = (uint64_t)(h[0] & 0xFFFFu) | (uint64_t)(h[1] & 0xFFFFu) << 16 |
                            (uint64_t)(h[2] & 0xFFFFu) << 32 | (uint64_t)(h[3] & 0xFFFFu) << 48;
        const uint64_t hi = (uint64_t)(h[0] >> 16) | (uint64_t)(h[1] >> 16) << 16 | (uint64_t)(h[2] >> 16) << 32 |
                            (uint64_t)(h[3] >> 16) << 48;
        const __m512i sixteen = _mm512_set1_epi8(16);
        *x0 = _mm512_mask_add_epi8(*x0, (__mmask64)lo, *x0, sixteen);
        *x1 = _mm512_mask_add_epi8(*x1, (__mmask64)hi, *x1, sixteen);
    }
}

/* out[j][col] = w . (activation row j) for N (1..QB_ROWS) interleaved activation rows ag[j], one weight
   row w of K (a multiple of 128) values of type t; pf: the bytes ahead to prefetch (0: none) */
QATTR static inline __attribute__((always_inline)) void FN(qb_b32_row)(const int t, const uint8_t *w, int64_t K,
                                                                      const uint8_t *const *ag, const int N,
                                                                      float *const *out, int64_t col, int64_t pf) {
    const int64_t bb = q_block_bytes(t);
    __m512 acc[QB_ROWS];
    for (int j = 0; j < N; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < K / 128; g++) {
        const uint8_t *b = w + 4 * g * bb;
        if (pf)
            for (int64_t l = 0; l < 4 * bb; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
        __m512i x0, x1;
        FN(qb_unpack4)(t, b, bb, &x0, &x1);
        const __m512 wd = FN(qb_scales4)(b, bb);
#pragma GCC unroll 8
        for (int j = 0; j < QB_ROWS; j++) {
            if (j >= N) break;
            const uint8_t *p = ag[j] + 256 * g;
            __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)(p + 128)), x0, _mm512_loadu_si512((const void *)p));
            s = _mm512_dpbusd_epi32(s, x1, _mm512_loadu_si512((const void *)(p + 64)));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wd, _mm512_loadu_ps((const void *)(p + 192))), acc[j]);
        }
    }
    for (int j = 0; j < N; j++) out[j][col] = FN(q_hsum512)(acc[j]);
}

/* one activation row against R (1..4) weight rows, qb_b32_row's operations per weight row (so the same
   results), interleaved: the activation loads shared and R independent chains (a single row's product,
   whose weights mostly come from memory, is faster so than one weight row at a time) */
QATTR static inline __attribute__((always_inline)) void FN(qb_b32_rows1)(const int t, const uint8_t *const *wr,
                                                                        const int R, int64_t K, const uint8_t *ag,
                                                                        float *out, int64_t pf) {
    const int64_t bb = q_block_bytes(t);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < K / 128; g++) {
        const uint8_t *p = ag + 256 * g;
        const __m512i a0 = _mm512_loadu_si512((const void *)p), a1 = _mm512_loadu_si512((const void *)(p + 64));
        const __m512i nb = _mm512_loadu_si512((const void *)(p + 128));
        const __m512 ad = _mm512_loadu_ps((const void *)(p + 192));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + 4 * g * bb;
            if (pf)
                for (int64_t l = 0; l < 4 * bb; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
            __m512i x0, x1;
            FN(qb_unpack4)(t, b, bb, &x0, &x1);
            const __m512 wd = FN(qb_scales4)(b, bb);
            __m512i s = _mm512_dpbusd_epi32(nb, x0, a0);
            s = _mm512_dpbusd_epi32(s, x1, a1);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wd, ad), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = FN(q_hsum512)(acc[r]);
}

/* Q4_K: q_gemv_q4k_r's operations for one weight row against N activation rows */
QATTR static inline __attribute__((always_inline)) void FN(qb_q4k_row)(const uint8_t *w, int64_t nsb,
                                                                      const q_arow *const *a, const int N,
                                                                      float *const *out, int64_t col, int64_t pf) {
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i hshift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i ix0 = _mm512_load_si512((const void *)q_k4_scale_idx[0]);
    const __m512i ix1 = _mm512_load_si512((const void *)q_k4_scale_idx[1]);
    __m512 acc[QB_ROWS];
    __m128 accm[QB_ROWS];
    for (int j = 0; j < N; j++) {
        acc[j] = _mm512_setzero_ps();
        accm[j] = _mm_setzero_ps();
    }
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + 144 * ib;
        if (pf)
            for (int l = 0; l < 144; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
        int32_t dpair;
        memcpy(&dpair, b, 4);
        const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128(dpair)); /* d, dmin */
        const __m256i sm = FN(q_k4_scales_mins)(b + 4);
        const __m512i sm5 = _mm512_castsi256_si512(sm);
        const __m512i sc0 = _mm512_permutexvar_epi16(ix0, sm5), sc1 = _mm512_permutexvar_epi16(ix1, sm5);
        const __m128i mins = _mm256_extracti128_si256(sm, 1);
        __m512i wq[4];
        for (int c = 0; c < 4; c++)
            wq[c] = _mm512_and_si512(
                _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c))), hshift),
                m4);
#pragma GCC unroll 8
        for (int j = 0; j < QB_ROWS; j++) {
            if (j >= N) break;
            const int8_t *aq = a[j]->q + 256 * ib;
            const __m128 dd = _mm_mul_ps(dw, _mm_set1_ps(a[j]->ls[64 * ib])); /* d*dy, dmin*dy */
            const __m256i gs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a[j]->isum + 16 * ib)),
                                                 _mm256_set1_epi16(1));
            const __m128i bs = _mm_packs_epi32(_mm256_castsi256_si128(gs), _mm256_extracti128_si256(gs, 1));
            const __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[0], _mm512_loadu_si512((const void *)aq));
            const __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[1], _mm512_loadu_si512((const void *)(aq + 64)));
            const __m512i p2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[2], _mm512_loadu_si512((const void *)(aq + 128)));
            const __m512i p3 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[3], _mm512_loadu_si512((const void *)(aq + 192)));
            __m512i sumi = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p0, p1), sc0);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(p2, p3), sc1);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_broadcastss_ps(dd), acc[j]);
            accm[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_madd_epi16(mins, bs)), _mm_permute_ps(dd, 0x55), accm[j]);
        }
    }
    for (int j = 0; j < N; j++) {
        __m128 m = _mm_add_ps(accm[j], _mm_movehl_ps(accm[j], accm[j]));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[j][col] = FN(q_hsum512)(acc[j]) - _mm_cvtss_f32(m);
    }
}

/* Q6_K: q_gemv_q6k_r's operations for one weight row against N activation rows */
QATTR static inline __attribute__((always_inline)) void FN(qb_q6k_row)(const uint8_t *w, int64_t nsb,
                                                                      const q_arow *const *a, const int N,
                                                                      float *const *out, int64_t col, int64_t pf) {
    const __m512i m0f = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i ix0 = _mm512_load_si512((const void *)q_k6_scale_idx[0]);
    const __m512i ix1 = _mm512_load_si512((const void *)q_k6_scale_idx[1]);
    __m512 acc[QB_ROWS];
    for (int j = 0; j < N; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + 210 * ib;
        if (pf)
            for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
        const __m512i sc5 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192))));
        const __m512i sc0 = _mm512_permutexvar_epi16(ix0, sc5), sc1 = _mm512_permutexvar_epi16(ix1, sc5);
        const float dw = FN(q_h2f)(b + 208);
        __m512i u[4];
        for (int h = 0; h < 2; h++) {
            const __m512i l = _mm512_loadu_si512((const void *)(b + 64 * h));
            const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
            u[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m0f), _mm512_sllv_epi16(hb, sh_lo), m30, 0xF8);
            u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m0f),
                                                     _mm512_srlv_epi16(hb, sh_hi), m30, 0xF8);
        }
#pragma GCC unroll 8
        for (int j = 0; j < QB_ROWS; j++) {
            if (j >= N) break;
            const int8_t *aq = a[j]->q + 256 * ib;
            const int32_t *nbias = a[j]->nbias + 64 * ib;
            __m512i p[4];
            for (int c = 0; c < 4; c++) /* the stored values are q + 32: dpbusd from -32 * (the sums of 4) */
                p[c] = _mm512_dpbusd_epi32(_mm512_srai_epi32(_mm512_loadu_si512((const void *)(nbias + 16 * c)), 2), u[c],
                                           _mm512_loadu_si512((const void *)(aq + 64 * c)));
            __m512i sumi = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p[0], p[1]), sc0);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(p[2], p[3]), sc1);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(a[j]->ls[64 * ib] * dw), acc[j]);
        }
    }
    for (int j = 0; j < N; j++) out[j][col] = FN(q_hsum512)(acc[j]);
}

/* the N-row kernels with N a constant, so their row loops unroll and the accumulators stay in registers */
#define QB_BY_ROWS(call)                                                                                        \
    switch (N) {                                                                                                \
    case 8: call(8); break;                                                                                     \
    case 7: call(7); break;                                                                                     \
    case 6: call(6); break;                                                                                     \
    case 5: call(5); break;                                                                                     \
    case 4: call(4); break;                                                                                     \
    case 3: call(3); break;                                                                                     \
    case 2: call(2); break;                                                                                     \
    default: call(1); break;                                                                                    \
    }

/* weight rows wr[0..R) (the result's columns col..col+R) against activation rows [0, n): out[j][col + r].
   ag: the rows in the interleaved layout (Q4_0/Q5_0/Q8_0, qb_b32_fmt), a: as decoded (Q4_K, Q6_K). pf: the
   bytes ahead of each weight row to prefetch (0: none). 0: the type or K is not handled here. */
QATTR static int FN(qb_rows)(int t, const uint8_t *const *wr, int R, int64_t K, const uint8_t *const *ag,
                             const q_arow *const *a, int64_t n, float *const *out, int64_t col, int64_t pf) {
    const int b32 = qb_b32_fmt(t, K);
    if (!b32 && (K % 256 || (t != Q_Q4_K && t != Q_Q6_K))) return 0;
    if (b32 && n == 1) { /* one activation row: the weight rows interleaved */
        float o[4];
#define QB_R1(T, R_) FN(qb_b32_rows1)(T, wr, R_, K, ag[0], o, pf)
#define QB_R1_T(T)                                                                                              \
        switch (R) {                                                                                            \
        case 4: QB_R1(T, 4); break;                                                                             \
        case 3: QB_R1(T, 3); break;                                                                             \
        case 2: QB_R1(T, 2); break;                                                                             \
        default: QB_R1(T, 1); break;                                                                            \
        }
        if (t == Q_Q8_0) QB_R1_T(Q_Q8_0)
        else if (t == Q_Q5_0) QB_R1_T(Q_Q5_0)
        else QB_R1_T(Q_Q4_0)
#undef QB_R1_T
#undef QB_R1
        for (int r = 0; r < R; r++) out[0][col + r] = o[r];
        return 1;
    }
    for (int64_t j = 0; j < n; j += QB_ROWS) {
        const int N = (int)(n - j < QB_ROWS ? n - j : QB_ROWS);
        for (int r = 0; r < R; r++) {
            const uint8_t *w = wr[r];
            float *const *o = out + j;
            const int64_t c = col + r;
#define QB_Q8(n_) FN(qb_b32_row)(Q_Q8_0, w, K, ag + j, n_, o, c, pf)
#define QB_Q5(n_) FN(qb_b32_row)(Q_Q5_0, w, K, ag + j, n_, o, c, pf)
#define QB_Q4(n_) FN(qb_b32_row)(Q_Q4_0, w, K, ag + j, n_, o, c, pf)
#define QB_Q4K(n_) FN(qb_q4k_row)(w, K / 256, a + j, n_, o, c, pf)
#define QB_Q6K(n_) FN(qb_q6k_row)(w, K / 256, a + j, n_, o, c, pf)
            switch (t) {
            case Q_Q8_0: QB_BY_ROWS(QB_Q8) break;
            case Q_Q5_0: QB_BY_ROWS(QB_Q5) break;
            case Q_Q4_0: QB_BY_ROWS(QB_Q4) break;
            case Q_Q4_K: QB_BY_ROWS(QB_Q4K) break;
            default: QB_BY_ROWS(QB_Q6K) break;
            }
#undef QB_Q8
#undef QB_Q5
#undef QB_Q4
#undef QB_Q4K
#undef QB_Q6K
        }
    }
    return 1;
}
#undef QB_BY_ROWS

/* weight rows read this many rows ahead are prefetched (to L2): one row at a time is one sequential stream,
   which the hardware prefetchers follow; the hint covers the start of each next row */
#define QB_PF_ROWS 12

/* one tile of q_gemm_item (activation rows j0..j1, at most QM_DIRECT) against weight rows wr[0..R), the
   result's columns col..: 0 when the type or K is not handled here */
QATTR static int FN(qb_tile)(int t, const uint8_t *const *wr, int R, int64_t K, const char *actg, const char *acts,
                             int64_t kp, const int64_t *arow, float *const *out, int64_t j0, int64_t j1, int64_t col,
                             int64_t pf) {
    const uint8_t *ag[QM_DIRECT];
    q_arow ar[QM_DIRECT];
    const q_arow *ap[QM_DIRECT];
    const int64_t n = j1 - j0;
    if (qb_b32_fmt(t, K)) {
        if (!actg) return 0;
        for (int64_t j = 0; j < n; j++) ag[j] = (const uint8_t *)actg + qb_act_bytes(K) * (size_t)(j0 + j);
    } else if ((t == Q_Q4_K || t == Q_Q6_K) && n > 1) { /* one row: q_gemv_k's passes of 4 weight rows, the
                                                           same operations per row (and faster alone) */
        for (int64_t j = 0; j < n; j++) {
            q_arow_at(&ar[j], (char *)acts + q_arow_bytes(kp) * (size_t)arow[j0 + j], kp);
            ap[j] = &ar[j];
        }
    } else {
        return 0;
    }
    return FN(qb_rows)(t, wr, R, K, ag, ap, n, out + j0, col, pf);
}

/* the activation rows of q_gemm_groups' direct tiles (at most QM_DIRECT rows) in qb_pack_act's layout, row j
   (of the groups' order) at qb_act_bytes(K) * j; NULL when no tile needs them (or out of memory: *oom set) */
QATTR static char *FN(qb_pack_acts)(int t, int64_t K, const int64_t *tile, int64_t ntiles, const int64_t *goff,
                                    const int64_t *arow, const char *acts, int64_t kp, int *oom) {
    if (!qb_b32_fmt(t, K)) return NULL;
    int any = 0;
    for (int64_t ti = 0; ti < ntiles && !any; ti++) {
        const int64_t g = tile[2 * ti], j0 = tile[2 * ti + 1];
        any = (goff[g + 1] < j0 + QM_NC ? goff[g + 1] : j0 + QM_NC) - j0 <= QM_DIRECT;
    }
    if (!any) return NULL;
    const int64_t rows = goff[tile[2 * (ntiles - 1)] + 1];
    char *actg = (char *)csimd_alloc(qb_act_bytes(K) * (size_t)rows + 64);
    if (!actg) {
        *oom = 1;
        return NULL;
    }
    for (int64_t ti = 0; ti < ntiles; ti++) {
        const int64_t g = tile[2 * ti], j0 = tile[2 * ti + 1];
        const int64_t j1 = goff[g + 1] < j0 + QM_NC ? goff[g + 1] : j0 + QM_NC;
        if (j1 - j0 > QM_DIRECT) continue;
        for (int64_t j = j0; j < j1; j++) {
            q_arow a;
            q_arow_at(&a, (char *)acts + q_arow_bytes(kp) * (size_t)arow[j], kp);
            FN(qb_pack_act)(t, &a, K, (uint8_t *)actg + qb_act_bytes(K) * (size_t)j);
        }
    }
    return actg;
}
