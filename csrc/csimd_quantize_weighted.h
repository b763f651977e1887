/* The quantizers llama-quantize runs when it has an importance matrix: ggml_quantize_chunk's paths with
   quant_weights for Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q5_K (Q6_K and IQ4_XS take the weights in their reference
   functions, csimd_quant.h and csimd_quantize_k3iq4.h), and IQ4_NL's chunk path (15 candidate scales with or
   without weights, where the reference tries none). Byte for byte as ggml-quants.c of llama.cpp 0.3.36 (the
   golden data of tests/data/quant_chunk_golden.npz come from that build); part of csimd_quant.h, plain C,
   compiled once.

   As in csimd_quantize_k3iq4.h, every float expression is evaluated in ggml's order, one rounding at a time
   (fp-contract=off: ggml-base is built without FMA contraction), and quants are rounded with ggml's
   nearest_int. Integer quants that ggml keeps in uint8_t (make_qp_quants' L) keep that wrap-around. */
#ifndef PRISM_CSIMD_QUANTIZE_WEIGHTED_H
#define PRISM_CSIMD_QUANTIZE_WEIGHTED_H

/* ---------------------------------------------------------------- shared searches */
/* ggml's make_qp_quants: non-negative x (group scales or mins) to L in 0..nmax against one scale,
   weighted by qw: the rounding against nmax/max, the best of 8 further scales by weighted squared error,
   then up to five passes moving one L at a time to the least-squares position of the others, kept when
   the fit improves. Returns the least-squares scale (0 for a group whose max is below Q_GROUP_MAX_EPS). */
__attribute__((optimize("fp-contract=off"))) static float q_make_qp_quants(int n, int nmax, const float *x,
                                                                          uint8_t *L, const float *qw) {
    float max = 0.0f;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < Q_GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)q_nearest_int(iscale * x[i]);
    const float scale0 = 1 / iscale;
    float best_mse = 0.0f;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale0 * (float)L[i];
        best_mse += qw[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max, scale_is = 1 / iscale_is;
        float mse = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = q_nearest_int(iscale_is * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_is * (float)l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = q_nearest_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        sumlx += qw[i] * x[i] * (float)l;
        suml2 += qw[i] * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = qw[i];
            float slx = sumlx - w * x[i] * (float)L[i], sl2 = suml2 - w * (float)L[i] * (float)L[i];
            if (!(slx > 0 && sl2 > 0)) continue;
            int l = q_nearest_int(x[i] * sl2 / slx);
            l = l < nmax ? l : nmax;
            if (l == L[i]) continue;
            slx += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (uint8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* ggml's make_qkx3_quants with weights (the only way the importance paths call it): make_qkx2_quants'
   search over 37 scales from (nmax - 0.9)/(max - min) in steps of 0.05, squared errors */
static inline float q_make_qkx3_quants(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min) {
    return q_make_qkx2_quants(n, nmax, x, w, L, the_min, -0.9f, 0.05f, 36, 0);
}

/* the sum of squares of n values, in order */
__attribute__((optimize("fp-contract=off"))) static inline float q_sum_sq(int n, const float *x) {
    float s = 0.0f;
    for (int j = 0; j < n; j++) s += x[j] * x[j];
    return s;
}

/* ---------------------------------------------------------------- Q4_0, Q5_0, Q4_1, Q5_1 (a whole row) */
/* quantize_q4_0/q5_0 with weights: each block of 32 by make_qx_quants (rmse 1) against weights
   qw * sqrt(sigma2 + x^2), sigma2 = the row's mean square; nbits 4 or 5 */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q4q5_0_rows_w(const float *x, uint8_t *y, int64_t n,
                                                                              const float *qw, int nbits) {
    const float sigma2 = q_sum_sq((int)n, x) / (float)n;
    const int bb = nbits == 4 ? 18 : 22;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        float w[32];
        int8_t L[32];
        const float *xb = x + 32 * ib;
        uint8_t *yb = y + bb * ib;
        q_weights_sigma(32, xb, qw + 32 * ib, sigma2, w);
        q_put_f16(yb, q_make_qx_quants_rmse1(32, nbits == 4 ? 8 : 16, xb, w, L));
        uint8_t *qs = yb + (nbits == 4 ? 2 : 6);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            qs[j] = (uint8_t)((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
            qh |= (uint32_t)((L[j] >> 4) & 1) << j;
            qh |= (uint32_t)((L[j + 16] >> 4) & 1) << (j + 16);
        }
        if (nbits == 5) memcpy(yb + 2, &qh, 4);
    }
}

/* quantize_q4_1/q5_1 with weights: make_qkx3_quants per block of 32, d and m = -min as fp16 */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q4q5_1_rows_w(const float *x, uint8_t *y, int64_t n,
                                                                              const float *qw, int nbits) {
    const float sigma2 = q_sum_sq((int)n, x) / (float)n;
    const int bb = nbits == 4 ? 20 : 24;
    for (int64_t ib = 0; ib < n / 32; ib++) {
        float w[32], the_min;
        uint8_t L[32];
        const float *xb = x + 32 * ib;
        uint8_t *yb = y + bb * ib;
        q_weights_sigma(32, xb, qw + 32 * ib, sigma2, w);
        const float d = q_make_qkx3_quants(32, nbits == 4 ? 15 : 31, xb, w, L, &the_min);
        q_put_f16(yb, d);
        q_put_f16(yb + 2, -the_min);
        uint8_t *qs = yb + (nbits == 4 ? 4 : 8);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            qs[j] = (uint8_t)((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
            qh |= (uint32_t)((L[j] >> 4) & 1) << j;
            qh |= (uint32_t)((L[j + 16] >> 4) & 1) << (j + 16);
        }
        if (nbits == 5) memcpy(yb + 4, &qh, 4);
    }
}

/* ---------------------------------------------------------------- Q2_K .. Q5_K (one super-block) */
/* quantize_row_q2_K_impl: 16 groups of 16, make_qkx3_quants against weights qw * sqrt(sigma2 + x^2)
   (sigma2 = the block's mean square), 4-bit scales and mins by make_qp_quants weighted by each group's
   total weight, then every value requantized against its stored scale and min */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q2_k_w(const float *x, uint8_t *y, const float *qw) {
    uint8_t L[256], Ls[16], Lm[16];
    float scales[16], mins[16], sw[16], w[16];
    const float sigma2 = q_sum_sq(256, x) / 256;
    for (int j = 0; j < 16; j++) {
        q_weights_sigma(16, x + 16 * j, qw + 16 * j, sigma2, w);
        float s = 0.0f;
        for (int l = 0; l < 16; l++) s += w[l];
        sw[j] = s;
        scales[j] = q_make_qkx3_quants(16, 3, x + 16 * j, w, L + 16 * j, &mins[j]);
    }
    const float dm0 = q_make_qp_quants(16, 15, scales, Ls, sw), mm0 = q_make_qp_quants(16, 15, mins, Lm, sw);
    q_put_f16(y + 80, dm0);
    q_put_f16(y + 82, mm0);
    for (int j = 0; j < 16; j++) y[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    q_q2k_requant_pack(x, y, L);
}

/* quantize_row_q3_K_impl: 16 groups of 16 by make_qx_quants (rmse 1) against weights qw * sqrt(sigma2 +
   x^2) (sigma2 = 2/256 of the block's sum of squares), the 16 group scales themselves by make_qx_quants
   (nmax 32) weighted by the groups' total weights, then every value requantized */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q3_k_w(const float *x, uint8_t *y, const float *qw) {
    int8_t L[256], Ls[16];
    float scales[16], sw[16], w[16];
    const float sigma2 = 2 * q_sum_sq(256, x) / 256;
    for (int j = 0; j < 16; j++) {
        q_weights_sigma(16, x + 16 * j, qw + 16 * j, sigma2, w);
        float s = 0.0f;
        for (int l = 0; l < 16; l++) s += w[l];
        sw[j] = s;
        scales[j] = q_make_qx_quants_rmse1(16, 4, x + 16 * j, w, L + 16 * j);
    }
    memset(y + 96, 0, 12);
    const float d_block = q_make_qx_quants_rmse1(16, 32, scales, sw, Ls);
    for (int j = 0; j < 16; j++) q_q3k_put_scale(y + 96, j, Ls[j]);
    q_put_f16(y + 108, d_block);
    q_q3k_requant_pack(x, y, L);
}

/* quantize_row_q4_K_impl (five = 0) and q5_K_impl (five = 1): 8 groups of 32 by make_qkx3_quants against
   weights qw * sqrt(sigma2 + x^2) (sigma2 = 2/256 of the block's sum of squares), 6-bit scales and mins
   by make_qp_quants weighted by the groups' total weights (Q5_K clamps them to 63, Q4_K keeps ggml's
   uint8_t as is), then every value requantized against its stored scale and min */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q4q5_k_w(const float *x, uint8_t *y, const float *qw,
                                                                         int five) {
    const int nmax = five ? 31 : 15;
    uint8_t L[256], Ls[8], Lm[8];
    float scales[8], mins[8], sw[8], w[32];
    const float sigma2 = 2 * q_sum_sq(256, x) / 256;
    for (int j = 0; j < 8; j++) {
        q_weights_sigma(32, x + 32 * j, qw + 32 * j, sigma2, w);
        float s = 0.0f;
        for (int l = 0; l < 32; l++) s += w[l];
        sw[j] = s;
        scales[j] = q_make_qkx3_quants(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j]);
    }
    const float d_block = q_make_qp_quants(8, 63, scales, Ls, sw), m_block = q_make_qp_quants(8, 63, mins, Lm, sw);
    if (five)
        for (int j = 0; j < 8; j++) {
            Ls[j] = Ls[j] < 63 ? Ls[j] : 63;
            Lm[j] = Lm[j] < 63 ? Lm[j] : 63;
        }
    q_k45_store(x, y, L, Ls, Lm, d_block, m_block, five);
}

/* ---------------------------------------------------------------- IQ4_NL's chunk path (one block of 32) */
/* quantize_iq4_nl: the per-32 search with 15 candidate scales (ntry 7; the reference tries none), weights
   qw * sqrt(sigma2 + x^2) with sigma2 = 2/32 of the block's sum of squares (qw NULL: x^2), d = fp16 of the
   scale, and every index found again against the unrounded scale, so an all-zero block (scale 0) gets the
   index nearest 0 in every position */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq4_nl_chunk(const float *x, uint8_t *y,
                                                                             const float *qw) {
    uint8_t L[32];
    float w[32];
    int zero;
    if (qw) {
        float sigma2 = q_sum_sq(32, x);
        sigma2 *= 2.0f / 32;
        q_weights_sigma(32, x, qw, sigma2, w);
    }
    const float d = q_iq4_search(x, qw ? w : NULL, 7, L, &zero);
    q_put_f16(y, d);
    const float id = d != 0.0f ? 1 / d : 0.0f;
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)q_iq4_index(id * x[j]);
    q_iq4_pack(L, y + 2);
}
#endif
