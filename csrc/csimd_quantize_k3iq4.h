/* Reference quantizers of Q3_K, IQ4_NL and IQ4_XS (no importance matrix), byte for byte as ggml's
   quantize_row_q3_K_ref, quantize_row_iq4_nl_ref and quantize_row_iq4_xs_ref (ggml-quants.c, ggml
   commit d99724f2, the one tests/data/quant_golden.npz was written with). Part of csimd_quant.h
   (included there before q_quantize_block, which dispatches to them); plain C, compiled once.

   ggml's results hang on the exact float32 expressions: every product and sum below is evaluated
   in ggml's order, one rounding at a time (fp-contract=off: ggml-base is built without FMA
   contraction on x86-64, and these functions may be inlined into callers compiled with FMA), and
   quants are rounded with ggml's nearest_int (q_nearest_int). */
#ifndef PRISM_CSIMD_QUANTIZE_K3IQ4_H
#define PRISM_CSIMD_QUANTIZE_K3IQ4_H

/* ---------------------------------------------------------------- Q3_K */
/* ggml's make_q3_quants with do_rmse (weights x^2): L[i] = l + nmax for l in -nmax..nmax-1, starting
   from the plain rounding against -nmax/max, then up to five passes that move one quant at a time to
   where the others' least-squares scale puts it, kept when the weighted fit improves. Returns the
   least-squares scale (0 for a group whose largest magnitude is below Q_GROUP_MAX_EPS). */
__attribute__((optimize("fp-contract=off"))) static float q_make_q3_quants_rmse(int n, int nmax, const float *x,
                                                                               int8_t *L) {
    float max;
    if (q_group_is_empty(n, x, L, &max)) return 0.0f;
    const float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = q_nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0)) continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            int l = q_nearest_int(x[i] * sl2 / slx);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            if (l == L[i]) continue;
            slx += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break; /* a pass without a move leaves the same state for the next one */
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* the signed 6-bit scale of group j (of 16) as stored: low nibbles in bytes 0..7, the top two bits
   of group j in byte 8 + j%4 at bit 2*(j/4) */
static inline int q_q3k_scale(const uint8_t *s, int j) {
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    return (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

/* stores l (0..63: the signed scale + 32) as group j's scale, the inverse of q_q3k_scale (sc zeroed first) */
static inline void q_q3k_put_scale(uint8_t *sc, int j, int l) {
    if (j < 8) sc[j] = (uint8_t)(l & 0xF);
    else sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
    sc[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

/* Q3_K's last step: every value requantized against its group's stored scale (a group of scale 0 keeps its
   first quants, L as level + 4), the high bits into hmask and the 2-bit low parts packed into qs */
__attribute__((optimize("fp-contract=off"))) static void q_q3k_requant_pack(const float *x, uint8_t *y, int8_t *L) {
    uint8_t *hmask = y, *qs = y + 32;
    const uint8_t *sc = y + 96;
    const float dh = q_f16(y + 108);
    for (int j = 0; j < 16; j++) {
        const float d = dh * (float)q_q3k_scale(sc, j);
        if (d == 0.0f) continue;
        for (int i = 0; i < 16; i++) {
            int l = q_nearest_int(x[16 * j + i] / d);
            l = l < -4 ? -4 : l > 3 ? 3 : l;
            L[16 * j + i] = (int8_t)(l + 4);
        }
    }
    memset(hmask, 0, 32);
    for (int j = 0; j < 256; j++)
        if (L[j] > 3) {
            hmask[j % 32] |= (uint8_t)(1u << (j / 32));
            L[j] = (int8_t)(L[j] - 4);
        }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int8_t *Lh = L + 128 * h;
            qs[32 * h + l] = (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
        }
}

/* Q3_K: 16 groups of 16 searched as above, 6-bit group scales relative to the one of largest magnitude
   (d = 1/iscale, iscale = -32/that scale), then every value requantized against its stored scale.
   Block: hmask[32] (bit k of byte l: the high bit of element 32k + l), qs[64] (2-bit low parts),
   scales[12], d (fp16). */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q3_k(const float *x, uint8_t *y) {
    int8_t L[256];
    float scales[16], max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < 16; j++) {
        scales[j] = q_make_q3_quants_rmse(16, 4, x + 16 * j, L + 16 * j);
        const float a = fabsf(scales[j]);
        if (a > amax) { amax = a; max_scale = scales[j]; }
    }
    uint8_t *sc = y + 96;
    memset(sc, 0, 12);
    if (max_scale != 0.0f) {
        const float iscale = -32.0f / max_scale;
        for (int j = 0; j < 16; j++) {
            int l = (int8_t)q_nearest_int(iscale * scales[j]); /* ggml keeps it in an int8_t */
            l = (l < -32 ? -32 : l > 31 ? 31 : l) + 32;
            q_q3k_put_scale(sc, j, l);
        }
        q_put_f16(y + 108, 1.0f / iscale);
    } else {
        q_put_f16(y + 108, 0.0f);
    }
    q_q3k_requant_pack(x, y, L);
}

/* ---------------------------------------------------------------- IQ4_NL, IQ4_XS */
/* ggml's best_index_int8 over kvalues_iq4nl: the nearest entry, a tie going to the upper one, anything
   at or past an end to that end. ggml bisects to the entries lo < hi with v[lo] <= x < v[hi]; hi is
   also 1 + the count of inner entries <= x, which counts without a chain of dependent steps (twice as
   fast). A NaN falls through every one of ggml's comparisons to the last entry. */
static inline int q_iq4_index(float x) {
    const int8_t *v = kvalues_iq4nl;
    if (x <= (float)v[0]) return 0;
    if (x >= (float)v[15] || x != x) return 15;
    int hi = 1;
    for (int k = 1; k < 15; k++) hi += x >= (float)v[k];
    return x - (float)v[hi - 1] < (float)v[hi] - x ? hi - 1 : hi;
}

/* the per-32 search of ggml's quantize_row_iq4_nl_impl with weights qw (NULL: ggml's default x^2):
   indices against the scale max/values[0] (its sign flipped when ntry > 0), the least-squares scale of
   those, then 2*ntry + 1 candidate scales (itry + values[0])/max, the best fit kept. Returns the scale;
   *zero is set for a group whose largest magnitude is below Q_GROUP_MAX_EPS (L then untouched). */
__attribute__((optimize("fp-contract=off"))) static float q_iq4_search(const float *x, const float *qw, int ntry,
                                                                      uint8_t *L, int *zero) {
    float amax, w[32];
    const float max = q_signed_absmax(32, x, &amax);
    for (int j = 0; j < 32; j++) w[j] = qw ? qw[j] : x[j] * x[j];
    *zero = amax < Q_GROUP_MAX_EPS;
    if (*zero) return 0.0f;
    const float v0 = (float)kvalues_iq4nl[0];
    float d = ntry > 0 ? -max / v0 : max / v0, id = 1.0f / d, sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; j++) {
        const int l = q_iq4_index(id * x[j]);
        L[j] = (uint8_t)l;
        const float q = (float)kvalues_iq4nl[l];
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; itry++) {
        id = (float)(itry + kvalues_iq4nl[0]) / max;
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float q = (float)kvalues_iq4nl[q_iq4_index(id * x[j])];
            sumqx += w[j] * q * x[j];
            sumq2 += w[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* indices of 32 elements into 16 bytes: byte j holds element j (low nibble) and j + 16 (high) */
static inline void q_iq4_pack(const uint8_t *L, uint8_t *q) {
    for (int j = 0; j < 16; j++) q[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

/* IQ4_NL: one block of 32, the search without candidate scales (ntry -1), d = fp16 of its scale. ggml
   leaves an all-zero block's indices as its scratch buffer held them (d is 0, so they decode to 0): a
   block on its own gets the index nearest 0 here; whole rows (q_quantize_row, csimd_quantize_rows.h)
   repeat the previous block's, as ggml does. */
static void q_quant_iq4_nl(const float *x, uint8_t *y) {
    uint8_t L[32];
    int zero;
    const float d = q_iq4_search(x, NULL, -1, L, &zero);
    if (zero) memset(L, q_iq4_index(0.0f), sizeof L);
    q_put_f16(y, d);
    q_iq4_pack(L, y + 2);
}

/* ggml's importance weights of a group of n: qw[j] * sqrt(sigma2 + x[j]^2), sigma2 a second moment of the
   enclosing block or row (each quantizer chooses which) */
__attribute__((optimize("fp-contract=off"))) static inline void q_weights_sigma(int n, const float *x,
                                                                               const float *qw, float sigma2,
                                                                               float *w) {
    for (int j = 0; j < n; j++) w[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
}

/* IQ4_XS: 8 groups of 32 searched with 15 candidate scales (ntry 7), signed 6-bit group scales against
   d = -(the scale of largest magnitude)/32 (float32 d, not its fp16), then every group's indices found
   again against its d*l. Block: d (fp16), scales_h (2 high bits of group j at bit 2j), scales_l[4]
   (low nibbles, two groups a byte), qs[128]. qw: the block's 256 importance weights (quantize_iq4_xs with
   an importance matrix; weights qw * sqrt(sigma2 + x^2), sigma2 = 2/256 of the block's sum of squares),
   NULL for ggml's reference. */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq4_xs(const float *x, uint8_t *y, const float *qw) {
    uint8_t L[32];
    float scales[8], max_scale = 0.0f, amax = 0.0f, sigma2 = 0.0f, w[32];
    if (qw) {
        for (int j = 0; j < 256; j++) sigma2 += x[j] * x[j];
        sigma2 *= 2.0f / 256;
    }
    for (int ib = 0; ib < 8; ib++) {
        int zero;
        if (qw) q_weights_sigma(32, x + 32 * ib, qw + 32 * ib, sigma2, w);
        scales[ib] = q_iq4_search(x + 32 * ib, qw ? w : NULL, 7, L, &zero);
        const float a = fabsf(scales[ib]);
        if (a > amax) { amax = a; max_scale = scales[ib]; }
    }
    const float d = -max_scale / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    q_put_f16(y, d);
    uint16_t scales_h = 0;
    uint8_t *scales_l = y + 4;
    for (int ib = 0; ib < 8; ib++) {
        int l = q_nearest_int(id * scales[ib]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        const float dl = d * (float)l, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)q_iq4_index(idl * x[32 * ib + j]);
        q_iq4_pack(L, y + 8 + 16 * ib);
        l += 32;
        if (ib % 2 == 0) scales_l[ib / 2] = (uint8_t)(l & 0xF);
        else scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
        scales_h |= (uint16_t)((l >> 4) << (2 * ib));
    }
    memcpy(y + 2, &scales_h, 2);
}
#endif
