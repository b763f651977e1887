/* NEON integer dot products of the quantized kernels (arm64), part of the template: included by
   csimd_quant_impl.h after q_dot_offsets when CSIMD_ARM_Q >= 1.
   * neon (CSIMD_ARM_Q 1): smull/smull2 of 16 signed bytes, pairs added (16 bits: at most 2 * 128 * 127,
     activations lie in [-127, 127]), then pairs of pairs widened (saddlp): one int32 per lane of 4
   * dotprod (2): sdot (vdotq_s32), the lane sums of 4 in one instruction
   * i8mm (3): smmla (vmmlaq_s32) on two weight rows and two activation rows at once: a 2x2 block of
     8-element dot products per instruction, so one pass over K computes four results. The decoded
     rows' scales are constant over each group of 16 (one weight scale, one activation scale), so the
     integer sums run per 16 and are scaled once, exact in int32 as per-4 sums are. */

/* the four lane sums (elements 4l..4l+3) of w * a for 16 signed bytes each */
QATTR static inline int32x4_t FN(neon_dp16)(int8x16_t w, int8x16_t a) {
#if CSIMD_ARM_Q >= 2
    return vdotq_s32(vdupq_n_s32(0), w, a);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(a)), hi = vmull_high_s8(w, a);
    return vpaddlq_s16(vpaddq_s16(lo, hi));
#endif
}

/* out[r] = w[r] . a without the offsets, R (1..4) decoded weight rows against one activation row: per group
   of 16 the exact integer sum, times the group's weight scale times its activation scale, added in K order
   into one float per row (fused). These are the float steps of each result of neon_q_dot_mm's smmla tiles,
   so a row gets the same bits alone, paired with another activation row or not (batch invariance). */
QATTR static void FN(neon_q_dot)(const q_wrow *w, int R, const q_arow *a, int64_t kp, float *out) {
    float acc[4] = {0, 0, 0, 0};
    for (int64_t k = 0; k < kp; k += 16) {
        const int8x16_t av = vld1q_s8(a->q + k);
        const float as = a->ls[k / 4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const int32_t s = vaddvq_s32(FN(neon_dp16)(vld1q_s8(w[r].q + k), av));
            acc[r] = fmaf((float)s, w[r].ls[k / 4] * as, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}

#if CSIMD_ARM_Q >= 3
/* o0[r], o1[r] = w[r] . a0, w[r] . a1 (offsets included) for R (1..4) weight rows and two activation
   rows; pairs of weight rows through smmla, an odd last row through neon_q_dot */
QATTR static void FN(neon_q_dot_mm)(const q_wrow *w, int R, const q_arow *a0, const q_arow *a1, int64_t kp,
                                     float *o0, float *o1) {
    int r = 0;
    for (; r + 2 <= R; r += 2) {
        const q_wrow *w0 = &w[r], *w1 = &w[r + 1];
        float32x4_t acc = vdupq_n_f32(0); /* [w0.a0, w0.a1, w1.a0, w1.a1] */
        for (int64_t k = 0; k < kp; k += 16) {
            const int8x16_t x0 = vld1q_s8(w0->q + k), x1 = vld1q_s8(w1->q + k);
            const int8x16_t y0 = vld1q_s8(a0->q + k), y1 = vld1q_s8(a1->q + k);
            /* smmla's operands: two rows of 8 bytes each (the low and high halves of the 16) */
            const int8x16_t wl = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(x0), vreinterpretq_s64_s8(x1)));
            const int8x16_t wh = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(x0), vreinterpretq_s64_s8(x1)));
            const int8x16_t al = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(y0), vreinterpretq_s64_s8(y1)));
            const int8x16_t ah = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(y0), vreinterpretq_s64_s8(y1)));
            const int32x4_t s = vmmlaq_s32(vmmlaq_s32(vdupq_n_s32(0), wl, al), wh, ah);
            const float ws0 = w0->ls[k / 4], ws1 = w1->ls[k / 4], as0 = a0->ls[k / 4], as1 = a1->ls[k / 4];
            const float32x4_t sc = {ws0 * as0, ws0 * as1, ws1 * as0, ws1 * as1};
            acc = vfmaq_f32(acc, vcvtq_f32_s32(s), sc);
        }
        o0[r] = vgetq_lane_f32(acc, 0);
        o1[r] = vgetq_lane_f32(acc, 1);
        o0[r + 1] = vgetq_lane_f32(acc, 2);
        o1[r + 1] = vgetq_lane_f32(acc, 3);
    }
    if (r < R) {
        FN(neon_q_dot)(w + r, 1, a0, kp, o0 + r);
        FN(neon_q_dot)(w + r, 1, a1, kp, o1 + r);
    }
    FN(q_dot_offsets)(w, R, a0, kp, o0);
    FN(q_dot_offsets)(w, R, a1, kp, o1);
}
#endif
