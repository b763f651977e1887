/* Batched decoding on AVX2 and AVX-VNNI: one pass over a weight row feeds up to Q2B_ROWS activation rows. Part
   of the quantized template, included by csimd_quant_impl.h at ISA_LEVEL 1 after csimd_quant_avx2.h, whose
   unpacking and per-pair arithmetic it reuses.

   A step of several sequences (or a short prompt) multiplies each weight matrix by a few activation rows; a
   longer prompt's tiles come here too, 8 rows at a time (q_gemm_item), faster than decoding weight rows. The
   matrix-vector kernels (q_gemv_k) would unpack every weight block again for each activation row; here a
   block is unpacked once (nibbles, fifth bits, K-quant scales shuffled to their lanes) and used from registers
   for every activation row of the tile. Each (weight row, activation row) pair gets exactly the operations
   q_gemv_k gives it, in the same order, with its own accumulators (the integer parts exact, the float ones
   the same IEEE operations lane for lane), so every result is bit for bit that of its row alone. One
   activation row goes through q_gemv_k (passes of 4 weight rows sharing the activation's loads). */

#define Q2B_ROWS 8 /* activation rows per pass over a weight row: their accumulators stay in registers (or L1) */
#define Q2B_HAS(t) ((t) == Q_Q4_0 || (t) == Q_Q5_0 || (t) == Q_Q8_0 || (t) == Q_Q4_K || (t) == Q_Q6_K)

/* Q4_0, Q5_0, Q8_0: q_gemv_b32_r's operations for one weight row against N activation rows */
QATTR static inline __attribute__((always_inline)) void FN(q2b_b32_row)(const int t, const uint8_t *w, int64_t K,
                                                                       const q_arow *const *a, const int N,
                                                                       float *const *out, int64_t col, int64_t pf) {
    const int64_t bb = q_block_bytes(t);
    __m256 acc[Q2B_ROWS];
    for (int j = 0; j < N; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        const uint8_t *b = w + (k / 32) * bb;
        if (pf) _mm_prefetch((const char *)b + pf, _MM_HINT_T1);
        /* Q4_0/Q5_0's unsigned q + bias made signed once per block, then every format by the sign trick: two
           instructions a row where the bias would cost a load and a shift (the lane sums are the same integers) */
        __m256i wv = FN(q_b32_weights)(t, b);
        if (!Q_B32_SIGNED(t)) wv = _mm256_sub_epi8(wv, _mm256_set1_epi8(t == Q_Q4_0 ? 8 : 16));
        const __m256i wu = _mm256_sign_epi8(wv, wv);
        const __m256 dv = _mm256_set1_ps(FN(q_h2f)(b));
#pragma GCC unroll 8
        for (int j = 0; j < Q2B_ROWS; j++) {
            if (j >= N) break;
            const __m256i av = _mm256_loadu_si256((const __m256i *)(a[j]->q + k));
            const __m256i p = FN(q_dp4)(_mm256_setzero_si256(), wu, _mm256_sign_epi8(av, wv));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv, _mm256_loadu_ps(a[j]->ls + k / 4)), acc[j]);
        }
    }
    for (int j = 0; j < N; j++) out[j][col] = FN(q_hsum256)(acc[j]) + 0.0f; /* + q_gemv_b32_r's (zero) min part */
}

/* Q4_K: q_gemv_q45k_row's operations for one weight row against N activation rows; each vector of values and its
   scales made once, then multiplied into every row's integer sum (the same exact sums as q_k45_dot's) */
QATTR static inline __attribute__((always_inline)) void FN(q2b_q4k_row)(const uint8_t *w, int64_t nsb,
                                                                       const q_arow *const *a, const int N,
                                                                       float *const *out, int64_t col, int64_t pf) {
    __m256 acc[Q2B_ROWS];
    __m128 accm[Q2B_ROWS];
    for (int j = 0; j < N; j++) {
        acc[j] = _mm256_setzero_ps();
        accm[j] = _mm_setzero_ps();
    }
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + 144 * ib;
        if (pf)
            for (int l = 0; l < 144; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
        __m128i mins;
        __m128 dw;
        const __m256i sc = FN(q_k45_head)(b, &mins, &dw);
        __m256i sumi[Q2B_ROWS];
        for (int j = 0; j < N; j++) sumi[j] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) {
            const __m256i wv = FN(q_k45_w)(0, _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (v / 2))),
                                           _mm256_setzero_si256(), v / 2, v % 2);
            const __m256i sv = _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)q_k4_bcast[v]));
#pragma GCC unroll 8
            for (int j = 0; j < Q2B_ROWS; j++) {
                if (j >= N) break;
                const __m256i p = _mm256_maddubs_epi16(wv, _mm256_loadu_si256((const __m256i *)(a[j]->q + 256 * ib + 32 * v)));
                sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(p, sv));
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < Q2B_ROWS; j++) {
            if (j >= N) break;
            FN(q_k45_step)(sumi[j], mins, FN(q_k8_bsums)(a[j]->isum + 16 * ib), dw, a[j]->ls[64 * ib], &acc[j], &accm[j]);
        }
    }
    for (int j = 0; j < N; j++) out[j][col] = FN(q_hsum256)(acc[j]) - FN(q_hsum128)(accm[j]);
}

/* Q6_K: q_gemv_q6k_rows' operations for one weight row against N activation rows (each vector made once, as
   above): four activation rows' exact super-block sums reduced together (lane r: row 4g + r), multiplied and
   added into the accumulator of super-block slot ib % 4 (there lane ib % 4 of a row's accumulator), the four
   slots summed at the end as q_hsum128 sums its lanes, (s0 + s2) + (s1 + s3). The slots rotate through four
   registers (the current one first), so that slot q sits at (q - nsb) mod 4 at the end: the pairs of the sum
   are then (r0 + r2) and (r1 + r3), whatever nsb (float addition commutes). */
QATTR static inline __attribute__((always_inline)) void FN(q2b_q6k_row)(const uint8_t *w, int64_t nsb,
                                                                       const q_arow *const *a, const int N,
                                                                       float *const *out, int64_t col, int64_t pf) {
    __m128 acc[Q2B_ROWS / 4][4];
    for (int g = 0; g < Q2B_ROWS / 4; g++)
        for (int q = 0; q < 4; q++) acc[g][q] = _mm_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const uint8_t *b = w + 210 * ib;
        if (pf)
            for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
        const __m256i scv = FN(q_k16_scv)(Q_Q6_K, b);
        __m256i sumi[Q2B_ROWS];
#pragma GCC unroll 8
        for (int j = 0; j < Q2B_ROWS; j++) {
            if (j >= N) break;
            sumi[j] = FN(q_k_offset_start)(scv, a[j]->isum + 16 * ib, Q_K16_SHIFT(Q_Q6_K));
        }
        for (int h = 0; h < 2; h++) {
            const __m256i sc = Q_K16_HALF(scv, h);
            Q_K16_LOADS(Q_Q6_K, b, h, x0, x1, x2);
            for (int i = 0; i < 4; i++) {
                const __m256i u = FN(q_k16_u)(Q_Q6_K, x0, x1, x2, h, i), sv = Q_K16_S(sc, i);
#pragma GCC unroll 8
                for (int j = 0; j < Q2B_ROWS; j++) {
                    if (j >= N) break;
                    const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(a[j]->q + 256 * ib + 128 * h + 32 * i)));
                    sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(p, sv));
                }
            }
        }
        const __m128 dw = _mm_set1_ps(FN(q_h2f)(b + 208));
#pragma GCC unroll 2
        for (int g = 0; g < Q2B_ROWS / 4; g++) {
            if (4 * g >= N) break;
            float dy[4];
            for (int i = 0; i < 4; i++) {
                dy[i] = 4 * g + i < N ? a[4 * g + i]->ls[64 * ib] : 0.0f;
                if (4 * g + i >= N) sumi[4 * g + i] = _mm256_setzero_si256();
            }
            const __m128i s4 = FN(q_hsum4_epi32)(sumi[4 * g], sumi[4 * g + 1], sumi[4 * g + 2], sumi[4 * g + 3]);
            const __m128 cur = _mm_fmadd_ps(_mm_cvtepi32_ps(s4), _mm_mul_ps(dw, _mm_loadu_ps(dy)), acc[g][0]);
            acc[g][0] = acc[g][1];
            acc[g][1] = acc[g][2];
            acc[g][2] = acc[g][3];
            acc[g][3] = cur;
        }
    }
    float o[Q2B_ROWS];
    for (int g = 0; g < Q2B_ROWS / 4; g++)
        _mm_storeu_ps(o + 4 * g, _mm_add_ps(_mm_add_ps(acc[g][0], acc[g][2]), _mm_add_ps(acc[g][1], acc[g][3])));
    for (int j = 0; j < N; j++) out[j][col] = o[j];
}

/* the N-row kernels with N a constant, so their row loops unroll and the accumulators stay in registers */
#define Q2B_BY_ROWS(call)                                                                                       \
    switch (N) {                                                                                                \
    case 8: call(8); break;                                                                                     \
    case 7: call(7); break;                                                                                     \
    case 6: call(6); break;                                                                                     \
    case 5: call(5); break;                                                                                     \
    case 4: call(4); break;                                                                                     \
    case 3: call(3); break;                                                                                     \
    default: call(2); break;                                                                                    \
    }

/* the weight rows wr[0..R) (the result's columns col..col+R) against the activation rows j0..j1 of a direct
   tile of q_gemm_item (2..QM_DIRECT rows): out[j][col + r]. 0: one row, or a type not handled here. */
QATTR static int FN(q2b_tile)(int t, const uint8_t *const *wr, int R, int64_t K, const char *acts, int64_t kp,
                              const int64_t *arow, float *const *out, int64_t j0, int64_t j1, int64_t col,
                              int64_t pf) {
    const int64_t n = j1 - j0;
    if (n < 2 || !Q2B_HAS(t)) return 0;
    q_arow ar[QM_DIRECT];
    const q_arow *ap[QM_DIRECT];
    for (int64_t j = 0; j < n; j++) {
        q_arow_at(&ar[j], (char *)acts + q_arow_bytes(kp) * (size_t)arow[j0 + j], kp);
        ap[j] = &ar[j];
    }
    for (int64_t j = 0; j < n;) {
        /* passes of Q2B_ROWS, none of one row: 9 rows as 7 + 2 */
        const int64_t rem = n - j;
        const int N = (int)(rem <= Q2B_ROWS ? rem : rem == Q2B_ROWS + 1 ? Q2B_ROWS - 1 : Q2B_ROWS);
        const q_arow *const *aj = ap + j;
        float *const *o = out + j0 + j;
        for (int r = 0; r < R; r++) {
            const uint8_t *w = wr[r];
            const int64_t c = col + r;
#define Q2B_Q8(n_) FN(q2b_b32_row)(Q_Q8_0, w, K, aj, n_, o, c, pf)
#define Q2B_Q5(n_) FN(q2b_b32_row)(Q_Q5_0, w, K, aj, n_, o, c, pf)
#define Q2B_Q4(n_) FN(q2b_b32_row)(Q_Q4_0, w, K, aj, n_, o, c, pf)
#define Q2B_Q4K(n_) FN(q2b_q4k_row)(w, K / 256, aj, n_, o, c, pf)
#define Q2B_Q6K(n_) FN(q2b_q6k_row)(w, K / 256, aj, n_, o, c, pf)
            switch (t) {
            case Q_Q8_0: Q2B_BY_ROWS(Q2B_Q8) break;
            case Q_Q5_0: Q2B_BY_ROWS(Q2B_Q5) break;
            case Q_Q4_0: Q2B_BY_ROWS(Q2B_Q4) break;
            case Q_Q4_K: Q2B_BY_ROWS(Q2B_Q4K) break;
            default: Q2B_BY_ROWS(Q2B_Q6K) break;
            }
#undef Q2B_Q8
#undef Q2B_Q5
#undef Q2B_Q4
#undef Q2B_Q4K
#undef Q2B_Q6K
        }
        j += N;
    }
    return 1;
}
#undef Q2B_BY_ROWS
#undef Q_B32_SIGNED
#undef Q_B32_NB_SHIFT
#undef Q_K16_BB
#undef Q_K16_SHIFT
#undef Q_K16_D
#undef Q_K16_LOADS
#undef Q_K16_S
#undef Q_K16_HALF
#undef Q_K45_BB
#undef Q_K45_QS
#undef Q_K45_QH

/* weight rows this many rows ahead are prefetched (to L2), as the AVX-512 batch's QB_PF_ROWS */
#define Q2B_PF_ROWS 12
