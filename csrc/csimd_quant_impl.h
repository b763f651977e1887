/* Quantized kernels, part of the ISA template (included at the end of csimd_impl.h).

   Every block format decodes to one form: int8 values q, one float scale per 16 elements and, for
   the asymmetric formats, one float offset per 16 (value = scale*q + offset, the same float operations
   gguf.quants' dequantizers do, so dequantize() is exact). The product of a weight row with an
   activation row quantized to Q8_0/Q8_1/Q8_K is then sum over 4-element lanes of (int dot of the
   lane) * wscale * ascale + sum over groups of offset * ascale * (sum of the group's activations):
   one integer kernel for every format (AVX-512 VNNI, AVX2 maddubs/madd, scalar). The group sums
   paired with the offsets are those of the quantized activations, as ggml's (Q8_1's s, Q8_K's bsums):
   the scale part and the offset then see the same rounded activations, whose errors partly cancel
   (scale*q and the offset of Q4_K, say, are both larger than their sum). Weight rows are
   decoded once per tile of activation rows (QM_NC rows) and reused for all of them. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* csimd.c's quantizers: a copy of the template uses a few */
#include "csimd_quant.h"
#pragma GCC diagnostic pop

/* the AVX-512 copy needs BW and VNNI besides F (csimd_quant_api.h runs it only where the CPU has them) */
#if ISA_LEVEL == 2
#define QATTR __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#else
#define QATTR ATTR
#endif

#define QPAD 64 /* decoded rows are padded with zeros to a multiple of 64 elements */

#ifndef CSIMD_QUANT_ONCE
#define CSIMD_QUANT_ONCE
/* a decoded weight row (K padded to Kp): q[Kp] (biased by 128 on the VNNI path), scale per lane
   of 4, offset per group of 16 */
typedef struct {
    int8_t *q;
    float *ls;
    float *off;
    int has_off;
} q_wrow;

/* an activation row: q[Kp], scale per lane of 4, -128 * (sum of the lane) (VNNI's bias removed),
   scale * (sum of each group of 16) (the offsets' partner), and the integer sum of each group of 16
   (the fused K-quant kernels keep a super-block's scales in integers, as ggml's bsums) */
typedef struct {
    int8_t *q;
    float *ls;
    int32_t *nbias;
    float *gsum;
    int16_t *isum;
} q_arow;

static inline int64_t q_pad(int64_t k) { return (k + QPAD - 1) / QPAD * QPAD; }
static inline size_t q_arow_bytes(int64_t kp) {
    return (size_t)kp + (size_t)kp / 4 * 8 + (size_t)kp / 16 * 4 + (size_t)kp / 16 * 2;
}
static inline size_t q_wrow_bytes(int64_t kp) { return (size_t)kp + (size_t)kp + (size_t)kp / 16 * 4; }

static void q_arow_at(q_arow *r, char *base, int64_t kp) {
    r->ls = (float *)base;
    r->nbias = (int32_t *)(base + kp);
    r->gsum = (float *)(base + 2 * kp);
    r->q = (int8_t *)(base + 2 * kp + kp / 4);
    r->isum = (int16_t *)(base + 3 * kp + kp / 4);
}

static void q_wrow_at(q_wrow *r, char *base, int64_t kp) {
    r->ls = (float *)base;
    r->off = (float *)(base + kp);
    r->q = (int8_t *)(base + kp + kp / 4);
}
#endif

/* ------------------------------------------------------------ block decoders */
QATTR static void FN(q_dec_q4q5)(const uint8_t *b, int t, int8_t *q, float *sc, float *mn) {
    const int one = t == Q_Q4_1 || t == Q_Q5_1, five = t == Q_Q5_0 || t == Q_Q5_1;
    const float d = q_f16(b);
    const uint8_t *qs = b + 2 + 2 * one + 4 * five;
    uint32_t qh = 0;
    if (five) memcpy(&qh, b + 2 + 2 * one, 4);
    const int bias = one ? 0 : (five ? 16 : 8);
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 15) | (five ? (int)((qh >> j) & 1) << 4 : 0);
        const int hi = (qs[j] >> 4) | (five ? (int)((qh >> (j + 16)) & 1) << 4 : 0);
        q[j] = (int8_t)(lo - bias);
        q[j + 16] = (int8_t)(hi - bias);
    }
    sc[0] = sc[1] = d;
    if (one) mn[0] = mn[1] = q_f16(b + 2);
}

QATTR static void FN(q_dec_q8)(const uint8_t *b, int t, int8_t *q, float *sc) {
    if (t == Q_Q8_K) {
        float d;
        memcpy(&d, b, 4);
        memcpy(q, b + 4, 256);
        for (int g = 0; g < 16; g++) sc[g] = d;
        return;
    }
    sc[0] = sc[1] = q_f16(b);
    memcpy(q, b + (t == Q_Q8_1 ? 4 : 2), 32);
}

QATTR static void FN(q_dec_q2_k)(const uint8_t *b, int8_t *q, float *sc, float *mn) {
    const uint8_t *scales = b, *qs = b + 16;
    const float d = q_f16(b + 80), dmin = q_f16(b + 82);
    for (int g = 0; g < 16; g++) {
        sc[g] = d * (float)(scales[g] & 15);
        mn[g] = -(dmin * (float)(scales[g] >> 4));
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) q[128 * h + 32 * j + l] = (int8_t)((qs[32 * h + l] >> (2 * j)) & 3);
}

QATTR static void FN(q_dec_q3_k)(const uint8_t *b, int8_t *q, float *sc) {
    const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
    const float d = q_f16(b + 108);
    for (int i = 0; i < 16; i++) {
        const int low = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4), high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = d * (float)((low | (high << 4)) - 32);
    }
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int e = 128 * h + 32 * j + l, hb = (hm[l] >> (4 * h + j)) & 1;
                q[e] = (int8_t)(((qs[32 * h + l] >> (2 * j)) & 3) - (hb ? 0 : 4));
            }
}

QATTR static void FN(q_dec_q4q5_k)(const uint8_t *b, int five, int8_t *q, float *sc, float *mn) {
    const float d = q_f16(b), dmin = q_f16(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int j = 0; j < 8; j++) {
        int a, m;
        q_k_scale_min(s, j, &a, &m);
        sc[2 * j] = sc[2 * j + 1] = d * (float)a;
        mn[2 * j] = mn[2 * j + 1] = -(dmin * (float)m);
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
            if (five) {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            q[64 * c + l] = (int8_t)lo;
            q[64 * c + 32 + l] = (int8_t)hi;
        }
}

QATTR static void FN(q_dec_q6_k)(const uint8_t *b, int8_t *q, float *sc) {
    const float d = q_f16(b + 208);
    const int8_t *s = (const int8_t *)(b + 192);
    for (int g = 0; g < 16; g++) sc[g] = d * (float)s[g];
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        int8_t *o = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

QATTR static void FN(q_dec_nl)(const uint8_t *qs, const int8_t *kv, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = kv[qs[j] & 15];
        q[j + 16] = kv[qs[j] >> 4];
    }
}

QATTR static void FN(q_dec_iq4_xs)(const uint8_t *b, int8_t *q, float *sc) {
    const float d = q_f16(b);
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    for (int ib = 0; ib < 8; ib++) {
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
        sc[2 * ib] = sc[2 * ib + 1] = d * (float)(ls - 32);
        FN(q_dec_nl)(b + 8 + 16 * ib, kvalues_iq4nl, q + 32 * ib);
    }
}

QATTR static void FN(q_dec_tq)(const uint8_t *b, int t, int8_t *q, float *sc) {
    if (t == Q_TQ2_0) {
        for (int c = 0; c < 2; c++)
            for (int n = 0; n < 4; n++)
                for (int j = 0; j < 32; j++) q[128 * c + 32 * n + j] = (int8_t)(((b[32 * c + j] >> (2 * n)) & 3) - 1);
        const float d = q_f16(b + 64);
        for (int g = 0; g < 16; g++) sc[g] = d;
        return;
    }
    static const uint8_t pw[5] = {1, 3, 9, 27, 81};
    for (int n = 0; n < 5; n++) {
        for (int j = 0; j < 32; j++) q[32 * n + j] = (int8_t)((((uint8_t)(b[j] * pw[n])) * 3u >> 8) - 1);
        for (int j = 0; j < 16; j++) q[160 + 16 * n + j] = (int8_t)((((uint8_t)(b[32 + j] * pw[n])) * 3u >> 8) - 1);
    }
    for (int n = 0; n < 4; n++)
        for (int j = 0; j < 4; j++) q[240 + 4 * n + j] = (int8_t)((((uint8_t)(b[48 + j] * pw[n])) * 3u >> 8) - 1);
    const float d = q_f16(b + 52);
    for (int g = 0; g < 16; g++) sc[g] = d;
}

QATTR static void FN(q_dec_iq)(const uint8_t *b, int t, int8_t *q, float *sc) {
    if (t == Q_IQ1_M) { /* the fp16 scale is spread over the top nibbles of the four 16-bit scale words */
        uint16_t sw[4];
        memcpy(sw, b + 48, 8);
        const uint16_t dh = (uint16_t)((sw[0] >> 12) | ((sw[1] >> 8) & 0xf0) | ((sw[2] >> 4) & 0xf00) | (sw[3] & 0xf000));
        const float d = f16_to_f32_sw(dh);
        const uint8_t *qs = b, *qh = b + 32;
        for (int ib = 0; ib < 8; ib++) {
            for (int h = 0; h < 2; h++) {
                const int s = (sw[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7;
                sc[2 * ib + h] = d * (float)(2 * s + 1) * 0.125f; /* q holds 8 * (grid +- 1/8) */
            }
            for (int k = 0; k < 4; k++) {
                const int nib = (qh[2 * ib + k / 2] >> (4 * (k % 2))) & 15;
                const int8_t *g = iq1s_grid[qs[4 * ib + k] | ((nib & 7) << 8)];
                const int delta = nib & 8 ? -1 : 1;
                for (int j = 0; j < 8; j++) q[32 * ib + 8 * k + j] = (int8_t)(8 * g[j] + delta);
            }
        }
        return;
    }
    const float d = q_f16(b);
    const uint8_t *p = b + 2;
    switch (t) {
    case Q_IQ2_XXS:
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a0, a1;
            memcpy(&a0, p + 8 * ib, 4);
            memcpy(&a1, p + 8 * ib + 4, 4);
            sc[2 * ib] = sc[2 * ib + 1] = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
            for (int k = 0; k < 4; k++)
                q_grid8(q + 32 * ib + 8 * k, iq2xxs_grid[(a0 >> (8 * k)) & 255], ksigns_iq2xs[(a1 >> (7 * k)) & 127]);
        }
        break;
    case Q_IQ2_XS:
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t s = p[64 + ib];
            sc[2 * ib] = d * (0.5f + (float)(s & 15)) * 0.25f;
            sc[2 * ib + 1] = d * (0.5f + (float)(s >> 4)) * 0.25f;
            for (int k = 0; k < 4; k++) {
                uint16_t v;
                memcpy(&v, p + 8 * ib + 2 * k, 2);
                q_grid8(q + 32 * ib + 8 * k, iq2xs_grid[v & 511], ksigns_iq2xs[v >> 9]);
            }
        }
        break;
    case Q_IQ2_S: {
        const uint8_t *qs = p, *signs = p + 32, *qh = p + 64, *scales = p + 72;
        for (int ib = 0; ib < 8; ib++) {
            sc[2 * ib] = d * (0.5f + (float)(scales[ib] & 15)) * 0.25f;
            sc[2 * ib + 1] = d * (0.5f + (float)(scales[ib] >> 4)) * 0.25f;
            for (int k = 0; k < 4; k++) {
                const int i = 4 * ib + k;
                q_grid8(q + 8 * i, iq2s_grid[qs[i] | (((qh[ib] >> (2 * k)) & 3) << 8)], signs[i]);
            }
        }
        break;
    }
    case Q_IQ3_XXS: {
        const uint8_t *qs = p, *ss = p + 64;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a;
            memcpy(&a, ss + 4 * ib, 4);
            sc[2 * ib] = sc[2 * ib + 1] = d * (0.5f + (float)(a >> 28)) * 0.5f;
            for (int k = 0; k < 4; k++) {
                const unsigned s = ksigns_iq2xs[(a >> (7 * k)) & 127];
                q_grid4(q + 32 * ib + 8 * k, iq3xxs_grid[qs[8 * ib + 2 * k]], s);
                q_grid4(q + 32 * ib + 8 * k + 4, iq3xxs_grid[qs[8 * ib + 2 * k + 1]], s >> 4);
            }
        }
        break;
    }
    case Q_IQ3_S: {
        const uint8_t *qs = p, *qh = p + 64, *signs = p + 72, *scales = p + 104;
        for (int ib = 0; ib < 8; ib++) {
            sc[2 * ib] = sc[2 * ib + 1] = d * (float)(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 15));
            for (int r = 0; r < 8; r++) {
                const int i = 8 * ib + r;
                q_grid4(q + 4 * i, iq3s_grid[qs[i] | (((qh[i / 8] >> (i % 8)) & 1) << 8)], signs[i / 2] >> (4 * (i % 2)));
            }
        }
        break;
    }
    case Q_IQ1_S: {
        const uint8_t *qs = p;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t h;
            memcpy(&h, p + 32 + 2 * ib, 2);
            sc[2 * ib] = sc[2 * ib + 1] = d * (float)(2 * ((h >> 12) & 7) + 1) * 0.125f;
            const int delta = h & 0x8000 ? -1 : 1;
            for (int k = 0; k < 4; k++) {
                const int8_t *g = iq1s_grid[qs[4 * ib + k] | (((h >> (3 * k)) & 7) << 8)];
                for (int j = 0; j < 8; j++) q[32 * ib + 8 * k + j] = (int8_t)(8 * g[j] + delta);
            }
        }
        break;
    }
    default: break;
    }
}

/* one block of type t: q[elems], sc[elems/16], mn[elems/16] (offset formats only) */
QATTR static void FN(q_decode)(int t, const uint8_t *b, int8_t *q, float *sc, float *mn) {
    switch (t) {
    case Q_Q4_0: case Q_Q4_1: case Q_Q5_0: case Q_Q5_1: FN(q_dec_q4q5)(b, t, q, sc, mn); break;
    case Q_Q8_0: case Q_Q8_1: case Q_Q8_K: FN(q_dec_q8)(b, t, q, sc); break;
    case Q_Q2_K: FN(q_dec_q2_k)(b, q, sc, mn); break;
    case Q_Q3_K: FN(q_dec_q3_k)(b, q, sc); break;
    case Q_Q4_K: FN(q_dec_q4q5_k)(b, 0, q, sc, mn); break;
    case Q_Q5_K: FN(q_dec_q4q5_k)(b, 1, q, sc, mn); break;
    case Q_Q6_K: FN(q_dec_q6_k)(b, q, sc); break;
    case Q_IQ4_NL: sc[0] = sc[1] = q_f16(b); FN(q_dec_nl)(b + 2, kvalues_iq4nl, q); break;
    case Q_MXFP4: sc[0] = sc[1] = q_e8m0_half(b[0]); FN(q_dec_nl)(b + 1, kvalues_mxfp4, q); break;
    case Q_IQ4_XS: FN(q_dec_iq4_xs)(b, q, sc); break;
    case Q_TQ1_0: case Q_TQ2_0: FN(q_dec_tq)(b, t, q, sc); break;
    default: FN(q_dec_iq)(b, t, q, sc); break;
    }
}

/* n elements (a multiple of the block) of type t -> F32: scale*q (+ offset), each rounded as gguf.quants
   rounds it (no fused multiply-add) */
QATTR __attribute__((optimize("fp-contract=off"))) static void FN(q_dequant_row)(int t, const uint8_t *src, float *dst,
                                                                              int64_t n) {
    const int be = q_block_elems(t), bb = q_block_bytes(t), off = q_has_offset(t);
    int8_t q[256];
    float sc[16], mn[16];
    for (int64_t ib = 0; ib < n / be; ib++) {
        FN(q_decode)(t, src + ib * bb, q, sc, mn);
        float *y = dst + ib * be;
        for (int g = 0; g < be / 16; g++) {
            const float s = sc[g];
            if (off) {
                const float m = mn[g];
                for (int j = 0; j < 16; j++) {
                    const float p = s * (float)q[16 * g + j];
                    y[16 * g + j] = p + m;
                }
            } else {
                for (int j = 0; j < 16; j++) y[16 * g + j] = s * (float)q[16 * g + j];
            }
        }
    }
}

/* ------------------------------------------------------------ decoded rows */
#if ISA_LEVEL == 2
#define Q_VNNI 1 /* the AVX-512 path runs only where the CPU has VNNI (csimd_quant_api.h) */
#else
#define Q_VNNI 0
#endif
#define QBIAS_PAD (Q_VNNI ? 0x80 : 0) /* a zero weight as stored */

/* Vectorised decoders of the formats the benchmarks and the Gemma 3 models use (Q4_0, Q5_0, Q8_0,
   Q4_K, Q6_K): whole rows with 32-byte vector operations, the VNNI bias folded in. Results are the
   same int8 values and scales as q_decode's. */
#define QV CAT(qv, SFX)
#define QVF CAT(qvf, SFX)
typedef uint8_t QV __attribute__((vector_size(32)));
typedef float QVF __attribute__((vector_size(32)));
#define QBIAS (Q_VNNI ? 128 : 0)

#define QV16 CAT(qv16, SFX)
typedef uint8_t QV16 __attribute__((vector_size(16)));
#define QV_LOAD(v, p) memcpy(&(v), (p), sizeof(v))
#define QV_STORE(p, v) memcpy((p), &(v), sizeof(v))

/* fp16 -> f32 of a block's scale: F16C where the path has it (the software conversion is exact too) */
QATTR static inline float FN(q_h2f)(const uint8_t *p) {
#if ISA_LEVEL >= 1
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
#elif CSIMD_ARM_Q
    return FN(neon_h2f)(p);
#else
    return q_f16(p);
#endif
}

QATTR static inline void FN(qv_scale8)(float *ls, float d) { /* 8 lanes of 4 elements: one 32-element sub-block */
    const QVF v = (QVF){0} + d;
    memcpy(ls, &v, 32);
}

/* a 32-element block from 16 bytes of nibbles (element j: low nibble of byte j, j + 16: high), the
   fifth bits of qh (bit j: element j) when five, plus the bias */
QATTR static inline void FN(qv_nibbles)(int8_t *q, const uint8_t *qs, int five, uint32_t qh, uint8_t bias) {
    QV16 v, lo, hi;
    QV_LOAD(v, qs);
    lo = (v & 15) + bias;
    hi = (v >> 4) + bias;
    if (five) {
        const QV16 sel = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const QV16 idx = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
        QV16 bytes = {0};
        bytes[0] = (uint8_t)qh;
        bytes[1] = (uint8_t)(qh >> 8);
        bytes[2] = (uint8_t)(qh >> 16);
        bytes[3] = (uint8_t)(qh >> 24);
        const QV16 b0 = __builtin_shuffle(bytes, idx), b1 = __builtin_shuffle(bytes, idx + 2);
        lo += (QV16)((b0 & sel) != 0) & 16;
        hi += (QV16)((b1 & sel) != 0) & 16;
    }
    QV_STORE(q, lo);
    QV_STORE(q + 16, hi);
}

QATTR static int FN(q_wrow_fill_fast)(int t, const uint8_t *src, int64_t K, q_wrow *w) {
    switch (t) {
    case Q_Q4_0: case Q_Q5_0: case Q_Q8_0: {
        const int bb = q_block_bytes(t);
        for (int64_t ib = 0; ib < K / 32; ib++) {
            const uint8_t *b = src + ib * bb;
            if (t == Q_Q8_0) {
                QV q;
                QV_LOAD(q, b + 2);
                q += (uint8_t)QBIAS;
                QV_STORE(w->q + 32 * ib, q);
            } else if (t == Q_Q4_0) {
                FN(qv_nibbles)(w->q + 32 * ib, b + 2, 0, 0, (uint8_t)(QBIAS - 8));
            } else {
                uint32_t qh;
                memcpy(&qh, b + 2, 4);
                FN(qv_nibbles)(w->q + 32 * ib, b + 6, 1, qh, (uint8_t)(QBIAS - 16));
            }
            FN(qv_scale8)(w->ls + 8 * ib, FN(q_h2f)(b));
        }
        w->has_off = 0;
        return 1;
    }
    case Q_Q4_K:
        for (int64_t ib = 0; ib < K / 256; ib++) {
            const uint8_t *b = src + ib * 144;
            const float d = FN(q_h2f)(b), dmin = FN(q_h2f)(b + 2);
            for (int c = 0; c < 4; c++) {
                QV v, lo, hi;
                QV_LOAD(v, b + 16 + 32 * c);
                lo = (v & 15) + (uint8_t)QBIAS;
                hi = (v >> 4) + (uint8_t)QBIAS;
                QV_STORE(w->q + 256 * ib + 64 * c, lo);
                QV_STORE(w->q + 256 * ib + 64 * c + 32, hi);
            }
            for (int j = 0; j < 8; j++) {
                int sc, m;
                q_k_scale_min(b + 4, j, &sc, &m);
                FN(qv_scale8)(w->ls + 64 * ib + 8 * j, d * (float)sc);
                w->off[16 * ib + 2 * j] = w->off[16 * ib + 2 * j + 1] = -(dmin * (float)m);
            }
        }
        w->has_off = 1;
        return 1;
    case Q_Q6_K:
        for (int64_t ib = 0; ib < K / 256; ib++) {
            const uint8_t *b = src + ib * 210;
            const float d = FN(q_h2f)(b + 208);
            const int8_t *s = (const int8_t *)(b + 192);
            for (int h = 0; h < 2; h++) {
                QV l0, l1, hh, e0, e1, e2, e3;
                QV_LOAD(l0, b + 64 * h);
                QV_LOAD(l1, b + 64 * h + 32);
                QV_LOAD(hh, b + 128 + 32 * h);
                int8_t *o = w->q + 256 * ib + 128 * h;
                const uint8_t bias = (uint8_t)(QBIAS - 32);
                e0 = ((l0 & 15) | ((hh & 3) << 4)) + bias;
                e1 = ((l1 & 15) | (((hh >> 2) & 3) << 4)) + bias;
                e2 = ((l0 >> 4) | (((hh >> 4) & 3) << 4)) + bias;
                e3 = ((l1 >> 4) | (((hh >> 6) & 3) << 4)) + bias;
                QV_STORE(o, e0);
                QV_STORE(o + 32, e1);
                QV_STORE(o + 64, e2);
                QV_STORE(o + 96, e3);
            }
            for (int g = 0; g < 16; g++) {
                float *ls = w->ls + 64 * ib + 4 * g;
                ls[0] = ls[1] = ls[2] = ls[3] = d * (float)s[g];
            }
        }
        w->has_off = 0;
        return 1;
    default: return 0;
    }
}
#undef QBIAS

/* a weight row (K elements of type t) into its decoded form; the padding is zero */
QATTR static void FN(q_wrow_fill)(int t, const uint8_t *src, int64_t K, int64_t kp, q_wrow *w) {
    if (FN(q_wrow_fill_fast)(t, src, K, w)) {
        memset(w->q + K, QBIAS_PAD, (size_t)(kp - K));
        for (int64_t l = K / 4; l < kp / 4; l++) w->ls[l] = 0.0f;
        if (w->has_off)
            for (int64_t g = K / 16; g < kp / 16; g++) w->off[g] = 0.0f;
        return;
    }
    const int be = q_block_elems(t), bb = q_block_bytes(t), ng = be / 16;
    float sc[16], mn[16];
    w->has_off = q_has_offset(t);
    for (int64_t ib = 0; ib < K / be; ib++) {
        FN(q_decode)(t, src + ib * bb, w->q + ib * be, sc, mn);
        for (int g = 0; g < ng; g++) {
            float *ls = w->ls + (ib * be + 16 * g) / 4;
            ls[0] = ls[1] = ls[2] = ls[3] = sc[g];
            if (w->has_off) w->off[ib * ng + g] = mn[g];
        }
    }
    memset(w->q + K, 0, (size_t)(kp - K));
    for (int64_t l = K / 4; l < kp / 4; l++) w->ls[l] = 0.0f;
    if (w->has_off)
        for (int64_t g = K / 16; g < kp / 16; g++) w->off[g] = 0.0f;
#if Q_VNNI
    for (int64_t i = 0; i < kp; i++) w->q[i] = (int8_t)((uint8_t)w->q[i] ^ 0x80u); /* u8 = q + 128 */
#endif
}

/* dequantize (as q_dequant_row, the same floats): Q4_0, Q8_0 and Q4_K straight from their blocks, Q5_0 and
   Q6_K through the vectorised decoders (256 elements at a time to int8 and lane scales, then converted) */
QATTR __attribute__((optimize("fp-contract=off"))) static void FN(q_dequant)(int t, const uint8_t *src, float *dst,
                                                                          int64_t n) {
    if (t == Q_Q8_0) { /* straight: scale times the bytes */
        for (int64_t ib = 0; ib < n / 32; ib++) {
            const uint8_t *b = src + 34 * ib;
            const float d = FN(q_h2f)(b);
            const int8_t *qs = (const int8_t *)(b + 2);
            for (int j = 0; j < 32; j++) dst[32 * ib + j] = d * (float)qs[j];
        }
        return;
    }
    if (t == Q_Q4_0) {
        for (int64_t ib = 0; ib < n / 32; ib++) {
            const uint8_t *b = src + 18 * ib;
            const float d = FN(q_h2f)(b);
            float *y = dst + 32 * ib;
            uint8_t qs[16]; /* a local copy: stores through y may not alias it, so the loops vectorise */
            memcpy(qs, b + 2, 16);
            for (int j = 0; j < 16; j++) y[j] = d * (float)((qs[j] & 15) - 8);
            for (int j = 0; j < 16; j++) y[j + 16] = d * (float)((qs[j] >> 4) - 8);
        }
        return;
    }
    if (t == Q_Q4_K) { /* straight: each sub-block of 32 its scale and offset */
        for (int64_t ib = 0; ib < n / 256; ib++) {
            const uint8_t *b = src + 144 * ib;
            const float d = FN(q_h2f)(b), dmin = FN(q_h2f)(b + 2);
            for (int c = 0; c < 4; c++) {
                int s0, m0, s1, m1;
                q_k_scale_min(b + 4, 2 * c, &s0, &m0);
                q_k_scale_min(b + 4, 2 * c + 1, &s1, &m1);
                const float d0 = d * (float)s0, o0 = -(dmin * (float)m0), d1 = d * (float)s1, o1 = -(dmin * (float)m1);
                const uint8_t *qs = b + 16 + 32 * c;
                float *y = dst + 256 * ib + 64 * c;
                for (int l = 0; l < 32; l++) {
                    const float p0 = d0 * (float)(qs[l] & 15), p1 = d1 * (float)(qs[l] >> 4);
                    y[l] = p0 + o0;
                    y[l + 32] = p1 + o1;
                }
            }
        }
        return;
    }
    if (t != Q_Q5_0 && t != Q_Q6_K) {
        FN(q_dequant_row)(t, src, dst, n);
        return;
    }
    const int64_t be = q_block_elems(t), bb = q_block_bytes(t), per = 256 / be;
    int8_t q[256] __attribute__((aligned(64)));
    float ls[64] __attribute__((aligned(64))), off[16];
    q_wrow w = {q, ls, off, 0};
    for (int64_t c = 0; c < n / 256; c++) {
        FN(q_wrow_fill_fast)(t, src + c * per * bb, 256, &w);
        float *y = dst + 256 * c;
        for (int g = 0; g < 16; g++) { /* one scale (and offset) per group of 16 */
            const float sg = ls[4 * g], og = w.has_off ? off[g] : 0.0f;
            float *yg = y + 16 * g;
            const int8_t *qg = q + 16 * g;
            for (int j = 0; j < 16; j++) yg[j] = sg * (float)(int8_t)((uint8_t)qg[j] ^ (uint8_t)QBIAS_PAD);
            if (w.has_off)
                for (int j = 0; j < 16; j++) yg[j] = yg[j] + og;
        }
    }
    const int64_t done = n / 256 * 256;
    if (done < n) FN(q_dequant_row)(t, src + done / be * bb, dst + done, n - done);
}

/* an activation row's sums from its q and lane scales: -128 * each lane's sum (nbias), each group's
   sum (isum) and that times its scale (gsum) */
QATTR static void FN(q_arow_sums)(q_arow *a, int64_t kp) {
#if ISA_LEVEL == 2
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t l = 0; l < kp / 4; l += 16) { /* 64 values: 16 lanes, 4 groups (one per 128-bit lane) */
        const __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512((const void *)(a->q + 4 * l)));
        _mm512_storeu_si512((void *)(a->nbias + l), _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s4, 7)));
        __m512i t = _mm512_add_epi32(s4, _mm512_shuffle_epi32(s4, (_MM_PERM_ENUM)0x4E));
        t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, (_MM_PERM_ENUM)0xB1));
        int32_t gs[16];
        _mm512_storeu_si512((void *)gs, t);
        for (int g = 0; g < 4; g++) {
            a->isum[l / 4 + g] = (int16_t)gs[4 * g];
            a->gsum[l / 4 + g] = a->ls[l + 4 * g] * (float)gs[4 * g];
        }
    }
#elif ISA_LEVEL == 1
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t l = 0; l < kp / 4; l += 8) { /* 32 values: 8 lanes, 2 groups (one per 128-bit lane) */
        const __m256i s4 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(ones8, _mm256_loadu_si256((const __m256i *)(a->q + 4 * l))), ones16);
        _mm256_storeu_si256((__m256i *)(a->nbias + l), _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, 7)));
        __m256i t = _mm256_add_epi32(s4, _mm256_shuffle_epi32(s4, 0x4E));
        t = _mm256_add_epi32(t, _mm256_shuffle_epi32(t, 0xB1));
        int32_t gs[8];
        _mm256_storeu_si256((__m256i *)gs, t);
        for (int g = 0; g < 2; g++) {
            a->isum[l / 4 + g] = (int16_t)gs[4 * g];
            a->gsum[l / 4 + g] = a->ls[l + 4 * g] * (float)gs[4 * g];
        }
    }
#else
    for (int64_t l = 0; l < kp / 4; l++) {
        const int8_t *x = a->q + 4 * l;
        a->nbias[l] = -128 * ((int32_t)x[0] + x[1] + x[2] + x[3]);
    }
    for (int64_t g = 0; g < kp / 16; g++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++) s += a->q[16 * g + j];
        a->gsum[g] = a->ls[4 * g] * (float)s;
        a->isum[g] = (int16_t)s;
    }
#endif
}

/* an activation row already in an activation format (Q8_0/Q8_1/Q8_K blocks) into its decoded form */
QATTR static void FN(q_arow_fill_blocks)(int at, const uint8_t *src, int64_t K, int64_t kp, q_arow *a) {
    const int be = q_block_elems(at), bb = q_block_bytes(at);
    float sc[16], mn[16];
    for (int64_t ib = 0; ib < K / be; ib++) {
        FN(q_decode)(at, src + ib * bb, a->q + ib * be, sc, mn);
        for (int g = 0; g < be / 16; g++) {
            float *ls = a->ls + (ib * be + 16 * g) / 4;
            ls[0] = ls[1] = ls[2] = ls[3] = sc[g];
        }
    }
    memset(a->q + K, 0, (size_t)(kp - K));
    for (int64_t l = K / 4; l < kp / 4; l++) a->ls[l] = 0.0f;
    FN(q_arow_sums)(a, kp);
    if (at == Q_Q8_1) /* ggml pairs Q4_1/Q5_1's per-block min with the block's stored F16 s = d * sum, not the
                         sum of the decoded values: the whole block's s on its first group of 16 (both groups
                         of a 32-block share the weight's offset) */
        for (int64_t ib = 0; ib < K / 32; ib++) {
            a->gsum[2 * ib] = FN(q_h2f)(src + ib * bb + 2);
            a->gsum[2 * ib + 1] = 0.0f;
        }
}

#if ISA_LEVEL == 2
/* Q8_K / Q8_0 quantization of an F32 row straight into its decoded form, 16 values a vector: the same
   bytes and scales as q_quant_q8_k / q_quant_q8_0 (the products rounded to float, then to the nearest
   integer, ties to even, as nearbyintf in the default rounding mode). A block holding a NaN or an
   infinity goes through the scalar quantizer (C's conversion of those to int is not the vector one's). */
QATTR static void FN(q_arow_fill_fast)(int at, const float *x, int64_t K, int64_t kp, q_arow *a) {
    const int be = q_block_elems(at);
    uint8_t tmp[292]; /* one Q8_K block */
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (int64_t ib = 0; ib < K / be; ib++) {
        const float *xb = x + ib * be;
        int8_t *q = a->q + ib * be;
        float *ls = a->ls + ib * be / 4;
        __m512 mx = _mm512_setzero_ps();
        __mmask16 finite = 0xFFFF;
        for (int j = 0; j < be; j += 16) {
            const __m512 ax = _mm512_abs_ps(_mm512_loadu_ps(xb + j));
            finite &= _mm512_cmp_ps_mask(ax, inf, _CMP_LT_OQ);
            mx = _mm512_max_ps(ax, mx);
        }
        if (finite != 0xFFFF) { /* the scalar quantizer, then decoded as q_arow_fill_blocks does */
            float sc[16], mn[16];
            q_quantize_block(at, 0, xb, tmp);
            FN(q_decode)(at, tmp, q, sc, mn);
            for (int g = 0; g < be / 16; g++) ls[4 * g] = ls[4 * g + 1] = ls[4 * g + 2] = ls[4 * g + 3] = sc[g];
            continue;
        }
        float d, mul;
        q_act_scale(at, xb, _mm512_reduce_max_ps(mx), &d, &mul);
        const __m512 vm = _mm512_set1_ps(mul);
        for (int j = 0; j < be; j += 16) {
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(vm, _mm512_loadu_ps(xb + j)));
            if (at == Q_Q8_K) v = _mm512_min_epi32(v, _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtepi32_epi8(v));
        }
        for (int l = 0; l < be / 4; l += 8) _mm256_storeu_ps(ls + l, _mm256_set1_ps(d));
    }
    memset(a->q + K, 0, (size_t)(kp - K));
    for (int64_t l = K / 4; l < kp / 4; l++) a->ls[l] = 0.0f;
    FN(q_arow_sums)(a, kp);
}
#endif

#if ISA_LEVEL == 1
/* the same on AVX2, 8 values a vector (the int8 values taken as the low bytes of the 32-bit results, as
   AVX-512's truncating vpmovdb and C's int8_t conversion do) */
QATTR static void FN(q_arow_fill_fast)(int at, const float *x, int64_t K, int64_t kp, q_arow *a) {
    const int be = q_block_elems(at);
    uint8_t tmp[292]; /* one Q8_K block */
    const __m256 inf = _mm256_set1_ps(INFINITY), sign = _mm256_set1_ps(-0.0f);
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                               0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i gather = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    for (int64_t ib = 0; ib < K / be; ib++) {
        const float *xb = x + ib * be;
        int8_t *q = a->q + ib * be;
        float *ls = a->ls + ib * be / 4;
        __m256 mx = _mm256_setzero_ps();
        int finite = 0xFF;
        for (int j = 0; j < be; j += 8) {
            const __m256 ax = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j));
            finite &= _mm256_movemask_ps(_mm256_cmp_ps(ax, inf, _CMP_LT_OQ));
            mx = _mm256_max_ps(ax, mx);
        }
        if (finite != 0xFF) {
            float sc[16], mn[16];
            q_quantize_block(at, 0, xb, tmp);
            FN(q_decode)(at, tmp, q, sc, mn);
            for (int g = 0; g < be / 16; g++) ls[4 * g] = ls[4 * g + 1] = ls[4 * g + 2] = ls[4 * g + 3] = sc[g];
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float d, mul;
        q_act_scale(at, xb, _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))), &d, &mul);
        const __m256 vm = _mm256_set1_ps(mul);
        for (int j = 0; j < be; j += 8) {
            __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(vm, _mm256_loadu_ps(xb + j)));
            if (at == Q_Q8_K) v = _mm256_min_epi32(v, _mm256_set1_epi32(127));
            v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, low_bytes), gather);
            _mm_storel_epi64((__m128i *)(q + j), _mm256_castsi256_si128(v));
        }
        for (int l = 0; l < be / 4; l += 8) _mm256_storeu_ps(ls + l, _mm256_set1_ps(d));
    }
    memset(a->q + K, 0, (size_t)(kp - K));
    for (int64_t l = K / 4; l < kp / 4; l++) a->ls[l] = 0.0f;
    FN(q_arow_sums)(a, kp);
}
#endif

/* an F32 row quantized to the activation type `at` as ggml's CPU backend does, then decoded; tmp holds
   the row's blocks (unused on the AVX-512 and AVX2 paths of Q8_0 and Q8_K) */
QATTR static void FN(q_arow_fill_f32)(int at, const float *x, int64_t K, int64_t kp, q_arow *a, uint8_t *tmp) {
#if ISA_LEVEL >= 1
    if (at == Q_Q8_K || at == Q_Q8_0) {
        FN(q_arow_fill_fast)(at, x, K, kp, a);
        return;
    }
#endif
    const int be = q_block_elems(at), bb = q_block_bytes(at);
    for (int64_t ib = 0; ib < K / be; ib++) q_quantize_block(at, 0, x + ib * be, tmp + ib * bb);
    FN(q_arow_fill_blocks)(at, tmp, K, kp, a);
}

/* ------------------------------------------------------------ integer dot products */
/* a fused matrix-vector kernel fn called with R (1..4) a constant, so its row loops unroll */
#define Q_GEMV_ROWS(fn, t, wr, R, K, a, out, pf)       \
    switch (R) {                                        \
    case 4: FN(fn)(t, wr, 4, K, a, out, pf); break;     \
    case 3: FN(fn)(t, wr, 3, K, a, out, pf); break;     \
    case 2: FN(fn)(t, wr, 2, K, a, out, pf); break;     \
    default: FN(fn)(t, wr, 1, K, a, out, pf); break;    \
    }

/* the cases of a switch over the 32-value formats, each calling fn with its type a constant */
#define Q_GEMV_B32_CASES(fn, wr, R, K, a, out, pf)                                                           \
    case Q_Q4_0: Q_GEMV_ROWS(fn, Q_Q4_0, wr, R, K, a, out, pf) return 1;                                     \
    case Q_Q4_1: Q_GEMV_ROWS(fn, Q_Q4_1, wr, R, K, a, out, pf) return 1;                                     \
    case Q_Q5_0: Q_GEMV_ROWS(fn, Q_Q5_0, wr, R, K, a, out, pf) return 1;                                     \
    case Q_Q5_1: Q_GEMV_ROWS(fn, Q_Q5_1, wr, R, K, a, out, pf) return 1;                                     \
    case Q_Q8_0: Q_GEMV_ROWS(fn, Q_Q8_0, wr, R, K, a, out, pf) return 1;                                     \
    case Q_IQ4_NL: Q_GEMV_ROWS(fn, Q_IQ4_NL, wr, R, K, a, out, pf) return 1;                                 \
    case Q_MXFP4: Q_GEMV_ROWS(fn, Q_MXFP4, wr, R, K, a, out, pf) return 1;

#if ISA_LEVEL == 1
/* acc + the sums of each four adjacent products u * s (unsigned u, signed s bytes), for inputs whose pair
   sums fit int16 (maddubs saturates there; callers pass |w| and a with w's sign, or small unsigned
   weights): AVX-VNNI's vpdpbusd in one instruction (exact in int32), else maddubs then madd by ones */
QATTR static inline __m256i FN(q_dp4)(__m256i acc, __m256i u, __m256i s) {
#if CSIMD_AVXVNNI
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
#endif

/* out[r] += the offsets' part of w[r] . a: vectors of groups (kp / 16 is a multiple of 4) */
QATTR static void FN(q_dot_offsets)(const q_wrow *w, int R, const q_arow *a, int64_t kp, float *out) {
    for (int r = 0; r < R; r++) {
        if (!w[r].has_off) continue;
        VF s = (VF){0};
        int64_t g = 0;
        for (; g + VL <= kp / 16; g += VL) s += *(const VFU *)(w[r].off + g) * *(const VFU *)(a->gsum + g);
        float t = FN(hsum)(s);
        for (; g < kp / 16; g++) t += w[r].off[g] * a->gsum[g];
        out[r] += t;
    }
}

#if CSIMD_ARM_Q
QATTR static void FN(neon_q_dot)(const q_wrow *w, int R, const q_arow *a, int64_t kp, float *out);
#endif

/* out[r] = w[r] . a for R (1..4) decoded weight rows against one activation row */
QATTR static void FN(q_dot)(const q_wrow *w, int R, const q_arow *a, int64_t kp, float *out) {
#if ISA_LEVEL == 2
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = 0; k < kp; k += 64) {
        const __m512i av = _mm512_loadu_si512((const void *)(a->q + k));
        const __m512i nb = _mm512_loadu_si512((const void *)(a->nbias + k / 4));
        const __m512 as = _mm512_loadu_ps(a->ls + k / 4);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const __m512i s = _mm512_dpbusd_epi32(nb, _mm512_loadu_si512((const void *)(w[r].q + k)), av);
            const __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(w[r].ls + k / 4), as);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
#elif ISA_LEVEL == 1
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t k = 0; k < kp; k += 32) {
        const __m256i av = _mm256_loadu_si256((const __m256i *)(a->q + k));
        const __m256 as = _mm256_loadu_ps(a->ls + k / 4);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w[r].q + k));
            /* |w| * (a with w's sign): unsigned x signed pairs, at most 2 * 128 * 127 (no saturation) */
            const __m256i s = FN(q_dp4)(_mm256_setzero_si256(), _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
            const __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(w[r].ls + k / 4), as);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
        const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
        out[r] = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
    }
#elif CSIMD_ARM_Q
    FN(neon_q_dot)(w, R, a, kp, out);
#else
    for (int r = 0; r < R; r++) {
        float acc[4] = {0, 0, 0, 0};
        const int8_t *wq = w[r].q, *aq = a->q;
        for (int64_t l = 0; l < kp / 4; l++) {
            const int32_t s = (int32_t)wq[4 * l] * aq[4 * l] + (int32_t)wq[4 * l + 1] * aq[4 * l + 1] +
                              (int32_t)wq[4 * l + 2] * aq[4 * l + 2] + (int32_t)wq[4 * l + 3] * aq[4 * l + 3];
            acc[l & 3] += (float)s * (w[r].ls[l] * a->ls[l]);
        }
        out[r] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
#endif
    FN(q_dot_offsets)(w, R, a, kp, out);
}
#if CSIMD_ARM_Q
#include "csimd_neon_quant.h"
#endif

/* ------------------------------------------------------------ fused matrix-vector dot products
   For a few activation rows per weight tile (matrix-vector products), decoding into the row buffer
   costs more than the dot itself: Q4_0, Q5_0, Q8_0, Q4_K and Q6_K rows (AVX-512), every format of
   csimd_quant_avx2.h (AVX2) are then read straight from their blocks and unpacked in registers (the same integer products; the float scaling is grouped per block or
   super-block, so results may differ from the decoded path's in the last bits). 0: not handled here (the
   caller decodes). */

/* the 8 scales and 8 mins of a Q4_K super-block (12 bytes of 6-bit fields) as 16 int16: scales, then mins */
#if ISA_LEVEL >= 1
QATTR static inline __m256i FN(q_k4_scales_mins)(const uint8_t *s) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t sl = u[0] & 0x3f3f3f3fu, ml = u[1] & 0x3f3f3f3fu;
    const uint32_t sh = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
    const uint32_t mh = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
    return _mm256_cvtepu8_epi16(_mm_set_epi32((int)mh, (int)ml, (int)sh, (int)sl));
}
#endif


#if ISA_LEVEL == 2
/* Q4_K and Q6_K rows against one Q8_K activation row on AVX-512 VNNI, R (1..4) weight rows per pass
   so the activation loads are shared. As ggml's x86 kernels, a super-block's sub-block scales stay in
   integers: per 64 weights one dpbusd (unsigned weights times signed activations, 4 products per
   32-bit lane, which fits 16 bits: Q4_K 4 * 15 * 128, Q6_K 4 * 32 * 128), two such results packed and
   multiplied by their sub-block scales with dpwssd, and one float multiply-add per super-block with
   d_w * d_a. The Q4_K mins pair with the activations' group sums in integers too; Q6_K's offset of 32
   is taken back in dpbusd's accumulator (-32 * the sum of each 4 activations), so every lane holds its
   own part of the product (no large lanes cancelling in float). */
static const int16_t q_k4_scale_idx[2][32] __attribute__((aligned(64))) = {
    /* packs(p[2c], p[2c+1]) lane i: chunk 2c + (i%8 >= 4), sub-block 2 * chunk + (i/8 >= 2) */
    {0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3},
    {4, 4, 4, 4, 6, 6, 6, 6, 4, 4, 4, 4, 6, 6, 6, 6, 5, 5, 5, 5, 7, 7, 7, 7, 5, 5, 5, 5, 7, 7, 7, 7},
};
static const int16_t q_k6_scale_idx[2][32] __attribute__((aligned(64))) = {
    /* packs(p[2c], p[2c+1]) lane i: group 4 * (chunk 2c + (i%8 >= 4)) + i/8 */
    {0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},
    {8, 8, 8, 8, 12, 12, 12, 12, 9, 9, 9, 9, 13, 13, 13, 13, 10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15},
};

QATTR static inline float FN(q_hsum512)(__m512 v) { return _mm512_reduce_add_ps(v); }

/* five: Q5_K, whose fifth bits (bit 2c of qh[l]: element 64c + l, bit 2c + 1: 64c + 32 + l) are rotated to bit 4
   (32-bit rotates: what comes from a neighbouring byte is masked off) */
static const int32_t q_k5_rot[4][16] __attribute__((aligned(64))) = {
    {4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 3, 3}, {2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1},
    {0, 0, 0, 0, 0, 0, 0, 0, 31, 31, 31, 31, 31, 31, 31, 31}, {30, 30, 30, 30, 30, 30, 30, 30, 29, 29, 29, 29, 29, 29, 29, 29},
};

QATTR static inline __attribute__((always_inline)) void FN(q_gemv_q4k_r)(const int five, const uint8_t *const *wr,
                                                                        const int R, int64_t nsb, const q_arow *a,
                                                                        float *out, const int64_t pf) {
    const int64_t bb = five ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(15), m10 = _mm512_set1_epi8(16);
    const __m512i hshift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i ix0 = _mm512_load_si512((const void *)q_k4_scale_idx[0]);
    const __m512i ix1 = _mm512_load_si512((const void *)q_k4_scale_idx[1]);
    __m512 acc[4];
    __m128 accm[4];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm512_setzero_ps();
        accm[r] = _mm_setzero_ps();
    }
    for (int64_t ib = 0; ib < nsb; ib++) {
        const int8_t *aq = a->q + 256 * ib;
        const __m512i a0 = _mm512_loadu_si512((const void *)aq), a1 = _mm512_loadu_si512((const void *)(aq + 64));
        const __m512i a2 = _mm512_loadu_si512((const void *)(aq + 128)), a3 = _mm512_loadu_si512((const void *)(aq + 192));
        const float dy = a->ls[64 * ib];
        /* sums of the 8 sub-blocks of 32 (int16: at most 32 * 128) */
        const __m256i gs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a->isum + 16 * ib)),
                                             _mm256_set1_epi16(1));
        const __m128i bs = _mm_packs_epi32(_mm256_castsi256_si128(gs), _mm256_extracti128_si256(gs, 1));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + bb * ib, *qs = b + (five ? 48 : 16);
            if (pf)
                for (int l = 0; l < bb; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
            int32_t dpair;
            memcpy(&dpair, b, 4);
            const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dpair)), _mm_set1_ps(dy)); /* d*dy, dmin*dy */
            const __m256i sm = FN(q_k4_scales_mins)(b + 4);
            const __m512i sm5 = _mm512_castsi256_si512(sm);
            __m512i w[4], p[4];
            for (int c = 0; c < 4; c++)
                w[c] = _mm512_and_si512(
                    _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * c))),
                                      hshift), m4);
            if (five) { /* |4 q a| <= 4 * 31 * 128: still 16 bits */
                const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
                for (int c = 0; c < 4; c++)
                    w[c] = _mm512_ternarylogic_epi32(
                        w[c], _mm512_rolv_epi32(qh, _mm512_load_si512((const void *)q_k5_rot[c])), m10, 0xF8);
            }
            p[0] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], a0);
            p[1] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], a1);
            p[2] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[2], a2);
            p[3] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[3], a3);
            __m512i sumi = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p[0], p[1]),
                                               _mm512_permutexvar_epi16(ix0, sm5));
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(p[2], p[3]), _mm512_permutexvar_epi16(ix1, sm5));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_broadcastss_ps(dd), acc[r]);
            const __m128i mb = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bs);
            accm[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(mb), _mm_permute_ps(dd, 0x55), accm[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        __m128 m = _mm_add_ps(accm[r], _mm_movehl_ps(accm[r], accm[r]));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[r] = FN(q_hsum512)(acc[r]) - _mm_cvtss_f32(m);
    }
}

QATTR static inline __attribute__((always_inline)) void FN(q_gemv_q6k_r)(const uint8_t *const *wr, const int R,
                                                                        int64_t nsb, const q_arow *a, float *out,
                                                                        const int64_t pf) {
    const __m512i m0f = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i ix0 = _mm512_load_si512((const void *)q_k6_scale_idx[0]);
    const __m512i ix1 = _mm512_load_si512((const void *)q_k6_scale_idx[1]);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nsb; ib++) {
        const int8_t *aq = a->q + 256 * ib;
        const __m512i a0 = _mm512_loadu_si512((const void *)aq), a1 = _mm512_loadu_si512((const void *)(aq + 64));
        const __m512i a2 = _mm512_loadu_si512((const void *)(aq + 128)), a3 = _mm512_loadu_si512((const void *)(aq + 192));
        const float dy = a->ls[64 * ib];
        __m512i nb[4]; /* the stored values are q + 32: dpbusd starts from -32 * (the sum of each 4 activations) */
        for (int c = 0; c < 4; c++)
            nb[c] = _mm512_srai_epi32(_mm512_loadu_si512((const void *)(a->nbias + 64 * ib + 16 * c)), 2);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + 210 * ib;
            if (pf)
                for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T1);
            const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
            const __m512i sc5 = _mm512_castsi256_si512(sc);
            __m512i u[4];
            for (int h = 0; h < 2; h++) { /* elements 128h + [0, 64) and 128h + [64, 128) */
                const __m512i l = _mm512_loadu_si512((const void *)(b + 64 * h));
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
                u[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m0f), _mm512_sllv_epi16(hb, sh_lo), m30, 0xF8);
                u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m0f),
                                                         _mm512_srlv_epi16(hb, sh_hi), m30, 0xF8);
            }
            /* |4 q a| <= 4 * 32 * 128: 16 bits */
            const __m512i p0 = _mm512_dpbusd_epi32(nb[0], u[0], a0);
            const __m512i p1 = _mm512_dpbusd_epi32(nb[1], u[1], a1);
            const __m512i p2 = _mm512_dpbusd_epi32(nb[2], u[2], a2);
            const __m512i p3 = _mm512_dpbusd_epi32(nb[3], u[3], a3);
            __m512i sumi = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p0, p1),
                                               _mm512_permutexvar_epi16(ix0, sc5));
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(p2, p3), _mm512_permutexvar_epi16(ix1, sc5));
            const float d = dy * FN(q_h2f)(b + 208);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = FN(q_hsum512)(acc[r]);
}

#include "csimd_quant_avx512.h" /* the 256-bit kernels of every format, the 512-bit Q2_K, Q3_K, IQ4_XS */

/* The 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) against one Q8_0/Q8_1 activation
   row on AVX-512 VNNI, R (1..4) weight rows per pass. 64 weights (two blocks) per vector as unsigned bytes (the
   format's offset added: 8 (Q4_0), 16 (Q5_0; MXFP4's doubled values from a pshufb table), 128 (Q8_0; IQ4_NL's
   table values); Q4_1/Q5_1's nibbles have none), the offset taken back in dpbusd's accumulator (-offset * the
   sum of each 4 activations), then one float multiply-add per vector with each block's d_w * d_a; Q4_1/Q5_1's
   min times the Q8_1 block's s summed apart. The four scales of 128 weights are converted at once. */
#define Q_W32_QS(t) ((t) == Q_Q5_1 ? 8 : (t) == Q_Q5_0 ? 6 : (t) == Q_Q4_1 ? 4 : (t) == Q_MXFP4 ? 1 : 2) /* nibbles */
#define Q_W32_MINS(t) ((t) == Q_Q4_1 || (t) == Q_Q5_1)
/* a->nbias is -128 * sum: -8 and -16 * sum by these shifts; -1: no offset */
#define Q_W32_NB_SHIFT(t) ((t) == Q_Q8_0 || (t) == Q_IQ4_NL ? 0 : (t) == Q_Q4_0 ? 4 : Q_W32_MINS(t) ? -1 : 3)
QATTR static inline __attribute__((always_inline)) __m512i FN(q_pair_u8)(const int t, const uint8_t *b0,
                                                                        const uint8_t *b1) {
    if (t == Q_Q8_0)
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                                                   _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1),
                                _mm512_set1_epi8((char)0x80));
    const int qo = Q_W32_QS(t);
    /* [b0's bytes, b0's, b1's, b1's]: low nibbles in 128-bit lanes 0 and 2 (elements 0..15), high in 1 and 3 */
    const __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(b0 + qo))),
                                                  (__mmask16)0xFF00, _mm_loadu_si128((const __m128i *)(b1 + qo)));
    const __m512i nib_shift = _mm512_broadcast_i64x4(_mm256_set_m128i(_mm_set1_epi16(4), _mm_setzero_si128()));
    const __m512i u = _mm512_and_si512(_mm512_srlv_epi16(v, nib_shift), _mm512_set1_epi8(15));
    if (t == Q_IQ4_NL) return _mm512_shuffle_epi8(_mm512_load_si512((const void *)q_iq4nl_u128_x4), u);
    if (t == Q_MXFP4) return _mm512_shuffle_epi8(_mm512_load_si512((const void *)q_mxfp4_u16_x4), u);
    if (t != Q_Q5_0 && t != Q_Q5_1) return u;
    uint32_t h0, h1; /* bit j of qh is element j's fifth bit */
    memcpy(&h0, b0 + qo - 4, 4);
    memcpy(&h1, b1 + qo - 4, 4);
    return _mm512_mask_add_epi8(u, (__mmask64)(h0 | (uint64_t)h1 << 32), u, _mm512_set1_epi8(16));
}

QATTR static inline uint16_t FN(q_f16_bits)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* the four blocks at b + pf (the rows a few passes ahead) prefetched to L2 */
QATTR static inline void FN(q_b32_prefetch)(const int t, const uint8_t *b, const int64_t pf) {
    _mm_prefetch((const char *)b + pf, _MM_HINT_T1);
    _mm_prefetch((const char *)b + pf + 64, _MM_HINT_T1);
    if (t == Q_Q8_0) _mm_prefetch((const char *)b + pf + 128, _MM_HINT_T1);
}

/* the scales of the n (2 or 4) 32-value blocks at b (block bytes bb) in lanes 0..n-1 (fp16 at byte 0, MXFP4's
   E8M0 halved) */
QATTR static inline __attribute__((always_inline)) __m512 FN(q_b32_scales)(const int t, const uint8_t *b,
                                                                          const int64_t bb, const int n) {
    if (t == Q_MXFP4) { /* q_e8m0_half of each: the float 2^(e - 128), subnormal for e < 2 */
        const uint32_t ee = (uint32_t)b[0] | (uint32_t)b[bb] << 8 | (n > 2 ? (uint32_t)b[2 * bb] << 16 | (uint32_t)b[3 * bb] << 24 : 0);
        const __m128i e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)ee));
        const __m128i bits = _mm_mask_blend_epi32(_mm_cmplt_epu32_mask(e, _mm_set1_epi32(2)),
                                                  _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23),
                                                  _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e));
        return _mm512_castps128_ps512(_mm_castsi128_ps(bits));
    }
    uint64_t hh = (uint64_t)FN(q_f16_bits)(b) | (uint64_t)FN(q_f16_bits)(b + bb) << 16;
    if (n > 2) hh |= (uint64_t)FN(q_f16_bits)(b + 2 * bb) << 32 | (uint64_t)FN(q_f16_bits)(b + 3 * bb) << 48;
    return _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)hh)));
}

/* Q4_1/Q5_1: the scale and min of the n (2 or 4) blocks at b (adjacent fp16s), [d0, m0, d1, m1, ...], zeros past n */
QATTR static inline __m256 FN(q_b32_dmins)(const uint8_t *b, const int64_t bb, const int n) {
    uint32_t p[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; i++) memcpy(&p[i], b + i * bb, 4);
    return _mm256_cvtph_ps(_mm_set_epi32((int)p[3], (int)p[2], (int)p[1], (int)p[0]));
}

QATTR static inline __attribute__((always_inline)) void FN(q_gemv_b32_r)(const int t, const uint8_t *const *wr,
                                                                        const int R, int64_t K, const q_arow *a,
                                                                        float *out, const int64_t pf) {
    const int64_t bb = q_block_bytes(t);
    const int nb_shift = Q_W32_NB_SHIFT(t);
    const int st = Q_W32_MINS(t) ? 2 : 1; /* block i's scale in lane st * i of wd (Q4_1/Q5_1: d and min in pairs) */
    const __m512i blk0 = _mm512_set_epi32(st, st, st, st, st, st, st, st, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i blk1 = _mm512_set_epi32(3 * st, 3 * st, 3 * st, 3 * st, 3 * st, 3 * st, 3 * st, 3 * st,
                                          2 * st, 2 * st, 2 * st, 2 * st, 2 * st, 2 * st, 2 * st, 2 * st);
    __m512 acc[4];
    __m256 accm[4]; /* Q4_1/Q5_1: min * s per block */
    for (int r = 0; r < R; r++) {
        acc[r] = _mm512_setzero_ps();
        accm[r] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 128 <= K; k += 128) {
        const __m512i a0 = _mm512_loadu_si512((const void *)(a->q + k));
        const __m512i a1 = _mm512_loadu_si512((const void *)(a->q + k + 64));
        const __m512i n0 = nb_shift < 0 ? _mm512_setzero_si512()
                                        : _mm512_srai_epi32(_mm512_loadu_si512((const void *)(a->nbias + k / 4)), nb_shift);
        const __m512i n1 = nb_shift < 0 ? _mm512_setzero_si512()
                                        : _mm512_srai_epi32(_mm512_loadu_si512((const void *)(a->nbias + k / 4 + 16)), nb_shift);
        const __m512 s0 = _mm512_loadu_ps(a->ls + k / 4), s1 = _mm512_loadu_ps(a->ls + k / 4 + 16);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + (k / 32) * bb;
            if (pf) FN(q_b32_prefetch)(t, b, pf);
            __m512 wd;
            if (Q_W32_MINS(t)) { /* the mins times the blocks' s (gsum's first group of each block; 0 the second) */
                const __m256 dm = FN(q_b32_dmins)(b, bb, 4);
                wd = _mm512_castps256_ps512(dm);
                accm[r] = _mm256_mask3_fmadd_ps(dm, _mm256_moveldup_ps(_mm256_loadu_ps(a->gsum + k / 16)), accm[r], 0xAA);
            } else {
                wd = FN(q_b32_scales)(t, b, bb, 4);
            }
            const __m512i p0 = _mm512_dpbusd_epi32(n0, FN(q_pair_u8)(t, b, b + bb), a0);
            const __m512i p1 = _mm512_dpbusd_epi32(n1, FN(q_pair_u8)(t, b + 2 * bb, b + 3 * bb), a1);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(_mm512_permutexvar_ps(blk0, wd), s0), acc[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(_mm512_permutexvar_ps(blk1, wd), s1), acc[r]);
        }
    }
    if (k < K) { /* 64 left */
        const __m512i a0 = _mm512_loadu_si512((const void *)(a->q + k));
        const __m512i n0 = nb_shift < 0 ? _mm512_setzero_si512()
                                        : _mm512_srai_epi32(_mm512_loadu_si512((const void *)(a->nbias + k / 4)), nb_shift);
        const __m512 s0 = _mm512_loadu_ps(a->ls + k / 4);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            if (r >= R) break;
            const uint8_t *b = wr[r] + (k / 32) * bb;
            __m512 wd;
            if (Q_W32_MINS(t)) { /* gsum's 4 groups of these 2 blocks, the lanes past them 0 */
                const __m256 dm = FN(q_b32_dmins)(b, bb, 2);
                wd = _mm512_castps256_ps512(dm);
                accm[r] = _mm256_mask3_fmadd_ps(dm, _mm256_moveldup_ps(_mm256_zextps128_ps256(_mm_loadu_ps(a->gsum + k / 16))),
                                                accm[r], 0xAA);
            } else {
                wd = FN(q_b32_scales)(t, b, bb, 2);
            }
            const __m512i p0 = _mm512_dpbusd_epi32(n0, FN(q_pair_u8)(t, b, b + bb), a0);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(_mm512_permutexvar_ps(blk0, wd), s0), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = FN(q_hsum512)(acc[r]) + (Q_W32_MINS(t) ? q_hsum256_avx512y(accm[r]) : 0.0f);
}

/* out[r] = wr[r] . a for R (1..4) rows of K elements (the 32-value formats: K a multiple of 64 here, else
   csimd_quant_avx512.h's 256-bit kernels; the K-quants and IQ4_XS); 0: not handled here */
QATTR static int FN(q_gemv_k)(int t, const uint8_t *const *wr, int R, int64_t K, const q_arow *a, float *out,
                              int64_t pf) {
    const int64_t nsb = K / 256;
    if (K % 64 == 0) {
        switch (t) {
        Q_GEMV_B32_CASES(q_gemv_b32_r, wr, R, K, a, out, pf)
        default: break;
        }
    }
/* a kernel fn(args..., R, ...) called with R (1..4) a constant, so its row loops unroll */
#define Q_BY_R(call)                                                                                            \
    switch (R) {                                                                                                \
    case 4: call(4); return 1;                                                                                  \
    case 3: call(3); return 1;                                                                                  \
    case 2: call(2); return 1;                                                                                  \
    default: call(1); return 1;                                                                                 \
    }
#define Q_Q4K(R_) FN(q_gemv_q4k_r)(0, wr, R_, nsb, a, out, pf)
#define Q_Q5K(R_) FN(q_gemv_q4k_r)(1, wr, R_, nsb, a, out, pf)
#define Q_Q6K(R_) FN(q_gemv_q6k_r)(wr, R_, nsb, a, out, pf)
#define Q_Q2K(R_) FN(q_gemv_k2k3_r)(Q_Q2_K, wr, R_, nsb, a, out, pf)
#define Q_Q3K(R_) FN(q_gemv_k2k3_r)(Q_Q3_K, wr, R_, nsb, a, out, pf)
#define Q_XS(R_) FN(q_gemv_iq4xs_r)(wr, R_, nsb, a, out, pf)
    switch (t) {
    case Q_Q2_K: Q_BY_R(Q_Q2K)
    case Q_Q3_K: Q_BY_R(Q_Q3K)
    case Q_Q4_K: Q_BY_R(Q_Q4K)
    case Q_Q5_K: Q_BY_R(Q_Q5K)
    case Q_Q6_K: Q_BY_R(Q_Q6K)
    case Q_IQ4_XS: Q_BY_R(Q_XS)
    default: break;
    }
#undef Q_Q4K
#undef Q_Q5K
#undef Q_Q6K
#undef Q_Q2K
#undef Q_Q3K
#undef Q_XS
#undef Q_BY_R
    return q_gemv_k_avx512y(t, wr, R, K, a, out, pf); /* 32-value blocks with K % 64 == 32 */
}
#undef Q_W32_QS
#undef Q_W32_MINS
#undef Q_W32_NB_SHIFT
#endif

#if ISA_LEVEL == 1
#include "csimd_quant_avx2.h" /* every format of the list, 32-blocks 4 rows a pass, the K-quants row by row */
#endif

QATTR static int FN(q_dot_direct)(int t, const uint8_t *const *wr, int R, int64_t K, const q_arow *a, float *out) {
#if ISA_LEVEL >= 1
    return FN(q_gemv_k)(t, wr, R, K, a, out, 0);
#else
    (void)t; (void)wr; (void)R; (void)K; (void)a; (void)out;
    return 0;
#endif
}

/* weight rows per call of the fused kernels: the VNNI ones share their activation loads over 4. Four
   interleaved rows are four short streams, which the hardware prefetchers follow poorly when the weights
   come from memory (measured: Q6_K 1x2048x32768 at 0.45x ggml against 1.2x row by row), so these calls
   prefetch (to L2) the rows three passes ahead (then 1.5x). */
#define Q_DIRECT_ROWS(t) (ISA_LEVEL >= 1 ? 4 : 1) /* q_gemv_k takes 4 rows of any format it has */
#ifndef QM_DIRECT
/* activation rows per tile up to which weights are read straight from their blocks, each row a pass over the
   same weight rows (then in L1): measured on Gemma 3 270M, 2 threads, AVX-512 VNNI, against decoding them
   first: the 640 x 262144 Q8_0 head 11.5/21/41/77 ms for 2/4/8/16 rows against 23/38/73/118, the Q4_K, Q5_0
   and Q6_K layers 1.4-3x faster too (batched decoding: a few rows per step). */
#define QM_DIRECT 16
#endif

#define QM_NC 64 /* activation rows per tile: each weight row is decoded once per tile */

#if ISA_LEVEL == 2
#include "csimd_quant_batch.h" /* batched decoding: several activation rows per pass over each weight row */
#elif ISA_LEVEL == 1
#include "csimd_quant_batch_avx2.h" /* the same on AVX2 and AVX-VNNI */
#endif

/* ------------------------------------------------------------ mul_mat, mul_mat_id */
/* every row of b ([K, ne1, ne2, ne3] F32, any strides) quantized to `at` and decoded, row r = (n, i2, i3)
   in order, into acts (q_arow_bytes(kp) each); 0 or -2 (out of memory) */
/* scratch of one thread of q_quant_acts: a gathered row (strided b) and the row's blocks (the scalar quantizers) */
QATTR static int FN(q_act_scratch)(int at, const csimd_tensor *b, float **xrow, uint8_t **tmp) {
    const int64_t K = b->ne[0];
    *xrow = b->nb[0] != 4 ? (float *)csimd_alloc((size_t)K * 4 + 64) : NULL;
    const int fast = ISA_LEVEL >= 1 && (at == Q_Q8_K || at == Q_Q8_0); /* q_arow_fill_fast: no row of blocks */
    *tmp = fast ? NULL : (uint8_t *)csimd_alloc((size_t)(K / 32) * 37 + 320);
    return (b->nb[0] == 4 || *xrow) && (*tmp || fast);
}

QATTR static void FN(q_quant_act_row)(int at, const csimd_tensor *b, int64_t kp, char *acts, int64_t r, float *xrow,
                                      uint8_t *tmp) {
    const int64_t K = b->ne[0], N = b->ne[1], B2 = b->ne[2];
    const char *src = ELT(b, 0, r % N, (r / N) % B2, r / (N * B2));
    const float *x = (const float *)src;
    if (b->nb[0] != 4) {
        for (int64_t k = 0; k < K; k++) memcpy(xrow + k, src + k * b->nb[0], 4);
        x = xrow;
    }
    q_arow ar;
    q_arow_at(&ar, acts + q_arow_bytes(kp) * (size_t)r, kp);
    FN(q_arow_fill_f32)(at, x, K, kp, &ar, tmp);
}

/* every row of b ([K, ne1, ne2, ne3] F32, any strides) quantized to `at` and decoded, row r = (n, i2, i3)
   in order, into acts (q_arow_bytes(kp) each); 0 or -2 (out of memory). One thread or one row: no
   OpenMP region (entering one costs about as much as quantizing a row of 2048). */
QATTR static int FN(q_quant_acts)(int at, const csimd_tensor *b, int64_t kp, char *acts, int nth) {
    const int64_t nrows = b->ne[1] * b->ne[2] * b->ne[3];
    int failed = 0;
    if (nth <= 1 || nrows <= 1) {
        float *xrow;
        uint8_t *tmp;
        if (FN(q_act_scratch)(at, b, &xrow, &tmp))
            for (int64_t r = 0; r < nrows; r++) FN(q_quant_act_row)(at, b, kp, acts, r, xrow, tmp);
        else
            failed = 1;
        free(xrow);
        free(tmp);
        return failed ? -2 : 0;
    }
#pragma omp parallel num_threads(nth) reduction(| : failed)
    {
        float *xrow;
        uint8_t *tmp;
        const int ok = FN(q_act_scratch)(at, b, &xrow, &tmp);
        if (!ok) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < nrows; r++)
            if (ok) FN(q_quant_act_row)(at, b, kp, acts, r, xrow, tmp);
        free(xrow);
        free(tmp);
    }
    return failed ? -2 : 0;
}

/* Weights streamed from a file mapping sit on 4 KiB pages, and this core drops a software prefetch whose page is
   not in the TLB: the prefetches that keep the matrix-vector kernels fed then stop at every page until a demand
   load reaches it (measured: Gemma 3's 262144 x 640 Q8_0 head from its GGUF mapping, one thread, AVX2 path, 10.4
   ms against 7.2 ms from anonymous huge pages). One byte of each page Q_TLB_AHEAD bytes ahead of a pass of
   weight rows is read (a demand load, which walks the page tables), so the prefetches that follow find its
   page: 7.2 ms from the mapping too. Only bytes before the matrix's last row are touched (always inside it). */
#define Q_TLB_AHEAD 16384
QATTR static inline void FN(q_touch_ahead)(const char *w, int64_t m, int64_t R, int64_t M, int64_t wnb1) {
    const char *lim = w + (M - 1) * wnb1;
    for (int64_t off = 0; off < R * wnb1; off += 4096) {
        const char *p = w + m * wnb1 + Q_TLB_AHEAD + off;
        if (p >= lim) break;
        (void)*(const volatile char *)p;
    }
}

/* one item of q_gemm_groups: tile it / tiles_m of activation rows against weight rows [m0, m1) of its group;
   *wbuf (4 decoded weight rows) allocated when first needed; actg: the rows of the direct tiles in
   qb_pack_act's layout, or NULL. 0 or -2 (out of memory). */
QATTR static int FN(q_gemm_item)(int qa, int64_t K, int64_t M, int64_t wnb1, const char *const *gw, const int64_t *goff,
                                 const int64_t *arow, float *const *out, const char *acts, const char *actg, int64_t kp,
                                 const int64_t *tile, int64_t tiles_m, int64_t mi, int64_t it, char **wbuf) {
    const size_t ab = q_arow_bytes(kp), wb = q_wrow_bytes(kp);
    const int64_t tm = it % tiles_m, ti = it / tiles_m, g = tile[2 * ti], j0 = tile[2 * ti + 1];
    const int64_t j1 = j0 + QM_NC < goff[g + 1] ? j0 + QM_NC : goff[g + 1];
    const int64_t m0 = tm * mi, m1 = m0 + mi < M ? m0 + mi : M;
    q_wrow w[4];
    (void)actg;
#if ISA_LEVEL == 1
    if (j1 - j0 > QM_DIRECT && Q2B_HAS(qa)) {
        /* a prompt's tile: the batched kernels too, Q2B_ROWS activation rows at a time (they stay in L1) against
           every weight row of the item (from L2), the last 9..16 rows in one call; measured on Gemma 3 270M's
           shapes, 512 rows, one thread (Zen 4 on its AVX2 path), against decoding each weight row first: Q4_K
           1.75x, Q6_K 1.64x, Q8_0 1.18x, Q5_0 1.07x, Q4_0 1.14x faster. Rows then get the bits they get alone. */
        for (int64_t j = j0; j < j1;) {
            const int64_t je = j1 - j <= QM_DIRECT ? j1 : j + Q2B_ROWS;
            for (int64_t m = m0; m < m1; m += 4) {
                const int R = (int)(m1 - m < 4 ? m1 - m : 4);
                if (j == j0) FN(q_touch_ahead)(gw[g], m, R, M, wnb1); /* the weights' first pass, from memory */
                const uint8_t *wr[4];
                for (int r = 0; r < R; r++) wr[r] = (const uint8_t *)(gw[g] + (m + r) * wnb1);
                FN(q2b_tile)(qa, wr, R, K, acts, kp, arow, out, j, je, m, 0);
            }
            j = je;
        }
        return 0;
    }
#endif
    for (int64_t m = m0; m < m1; m += 4) {
        const int R = (int)(m1 - m < 4 ? m1 - m : 4);
        FN(q_touch_ahead)(gw[g], m, R, M, wnb1);
        if (j1 - j0 <= QM_DIRECT) {
            const uint8_t *wr[4];
            for (int r = 0; r < R; r++) wr[r] = (const uint8_t *)(gw[g] + (m + r) * wnb1);
#if ISA_LEVEL == 2 /* every row of the tile in one pass over each weight row (csimd_quant_batch.h) */
            if (FN(qb_tile)(qa, wr, R, K, actg, acts, kp, arow, out, j0, j1, m, m + R + QB_PF_ROWS <= M ? QB_PF_ROWS * wnb1 : 0))
                continue;
#elif ISA_LEVEL == 1
            if (FN(q2b_tile)(qa, wr, R, K, acts, kp, arow, out, j0, j1, m, m + R + Q2B_PF_ROWS <= M ? Q2B_PF_ROWS * wnb1 : 0))
                continue;
#endif
            int done = 1;
            int64_t j = j0;
            for (; j < j1 && done; j++) {
                q_arow ar;
                q_arow_at(&ar, (char *)acts + ab * (size_t)arow[j], kp);
                float o[4];
#if ISA_LEVEL >= 1
                if (Q_DIRECT_ROWS(qa) > 1) /* prefetched: the rows 3 passes ahead, if the matrix has them */
                    done = FN(q_gemv_k)(qa, wr, R, K, &ar, o, m + 4 * R <= M ? 3 * R * wnb1 : 0) ||
                           FN(q_dot_direct)(qa, wr, R, K, &ar, o);
                else
#endif
                    for (int r = 0; r < R && done; r++) done = FN(q_dot_direct)(qa, wr + r, 1, K, &ar, o + r);
                for (int r = 0; r < R && done; r++) out[j][m + r] = o[r];
            }
            if (done) continue;
        }
        if (!*wbuf && !(*wbuf = (char *)csimd_alloc(wb * 4))) return -2; /* decoded rows: on first need */
        for (int r = 0; r < R; r++) {
            q_wrow_at(&w[r], *wbuf + wb * (size_t)r, kp);
            FN(q_wrow_fill)(qa, (const uint8_t *)(gw[g] + (m + r) * wnb1), K, kp, &w[r]);
        }
        int64_t j = j0;
#if CSIMD_ARM_Q >= 3
        for (; j + 2 <= j1; j += 2) { /* i8mm: two activation rows per pass (smmla's 2x2 blocks) */
            q_arow a0, a1;
            q_arow_at(&a0, (char *)acts + ab * (size_t)arow[j], kp);
            q_arow_at(&a1, (char *)acts + ab * (size_t)arow[j + 1], kp);
            float o0[4], o1[4];
            FN(neon_q_dot_mm)(w, R, &a0, &a1, kp, o0, o1);
            for (int r = 0; r < R; r++) {
                out[j][m + r] = o0[r];
                out[j + 1][m + r] = o1[r];
            }
        }
#endif
        for (; j < j1; j++) {
            q_arow ar;
            q_arow_at(&ar, (char *)acts + ab * (size_t)arow[j], kp);
            float o[4];
            FN(q_dot)(w, R, &ar, kp, o);
            for (int r = 0; r < R; r++) out[j][m + r] = o[r];
        }
    }
    return 0;
}

/* Groups of activation rows against one weight matrix each (mul_mat: one group per batch matrix,
   mul_mat_id: one per expert). Group g: weight rows at gw[g] + m * wnb1 (m < M), activation rows
   arow[goff[g] .. goff[g+1]) of acts, results out[j][m]. Threads take (group, tile of QM_NC activation
   rows, range of weight rows) items; each weight row is decoded once per item. */
QATTR static int FN(q_gemm_groups)(int qa, int64_t K, int64_t M, int64_t wnb1, int64_t ngroups, const char *const *gw,
                                   const int64_t *goff, const int64_t *arow, float *const *out, const char *acts,
                                   int64_t kp, int nth) {
    int64_t ntiles = 0;
    for (int64_t g = 0; g < ngroups; g++) ntiles += (goff[g + 1] - goff[g] + QM_NC - 1) / QM_NC;
    if (ntiles == 0) return 0;
    int64_t tile_small[2 * 16]; /* (group, first row) of each tile; the heap for many */
    int64_t *tile = ntiles <= 16 ? tile_small : (int64_t *)malloc((size_t)ntiles * 2 * sizeof(int64_t));
    if (!tile) return -2;
    int64_t nt = 0;
    for (int64_t g = 0; g < ngroups; g++)
        for (int64_t j = goff[g]; j < goff[g + 1]; j += QM_NC) {
            tile[2 * nt] = g;
            tile[2 * nt + 1] = j;
            nt++;
        }
    int64_t mi = M * ntiles / (8 * (int64_t)nth);
    mi = mi < 4 ? 4 : mi > 256 ? 256 : (mi + 3) / 4 * 4;
    if (mi > M) mi = (M + 3) / 4 * 4;
    const int64_t tiles_m = (M + mi - 1) / mi, items = ntiles * tiles_m;
    int failed = 0;
    char *actg = NULL;
#if ISA_LEVEL == 2
    actg = FN(qb_pack_acts)(qa, K, tile, ntiles, goff, arow, acts, kp, &failed);
#endif
    if (failed) { /* out of memory */
    } else if (nth <= 1 || items <= 1) { /* no OpenMP region */
        char *wbuf = NULL;
        for (int64_t it = 0; it < items && !failed; it++)
            failed = FN(q_gemm_item)(qa, K, M, wnb1, gw, goff, arow, out, acts, actg, kp, tile, tiles_m, mi, it,
                                     &wbuf) != 0;
        free(wbuf);
    } else {
#pragma omp parallel num_threads(nth) reduction(| : failed)
        {
            char *wbuf = NULL;
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < items; it++)
                if (!failed)
                    failed = FN(q_gemm_item)(qa, K, M, wnb1, gw, goff, arow, out, acts, actg, kp, tile, tiles_m, mi,
                                             it, &wbuf) != 0;
            free(wbuf);
        }
    }
    free(actg);
    if (tile != tile_small) free(tile);
    return failed ? -2 : 0;
}

/* d[m, n, i2, i3] = a[:, m, i2/r2, i3/r3] . b[:, n, i2, i3]; a quantized (type qa), b F32 rows quantized to `at` */
QATTR static int FN(q_mul_mat)(int qa, int at, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d,
                               int nth) {
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1], B2 = b->ne[2], B3 = b->ne[3];
    const int64_t r2 = B2 / a->ne[2], r3 = B3 / a->ne[3], kp = q_pad(K), nrows = N * B2 * B3, ng = B2 * B3;
    /* one allocation: the decoded activation rows, then the group and row tables (8-byte entries) */
    const size_t actb = q_arow_bytes(kp) * (size_t)nrows;
    char *acts = (char *)csimd_alloc(actb + (size_t)(2 * ng + 1 + 2 * nrows) * 8);
    const char **gw = acts ? (const char **)(void *)(acts + actb) : NULL;
    int64_t *goff = acts ? (int64_t *)(void *)(gw + ng) : NULL, *arow = acts ? goff + ng + 1 : NULL;
    float **out = acts ? (float **)(void *)(arow + nrows) : NULL;
    int rc = -2;
    if (acts) {
        for (int64_t g = 0; g < ng; g++) {
            const int64_t i2 = g % B2, i3 = g / B2;
            gw[g] = a->data + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3];
            goff[g] = g * N;
            for (int64_t n = 0; n < N; n++) {
                arow[g * N + n] = g * N + n;
                out[g * N + n] = (float *)ELT(d, 0, n, i2, i3);
            }
        }
        goff[ng] = nrows;
        rc = FN(q_quant_acts)(at, b, kp, acts, nth);
        if (rc == 0) rc = FN(q_gemm_groups)(qa, K, M, a->nb[1], ng, gw, goff, arow, out, acts, kp, nth);
    }
    free(acts);
    return rc;
}

/* MUL_MAT_ID: d[:, e, t] = w[:, :, ids[e, t]] . b[:, e mod b.ne[1], t]; ids validated by the caller. The
   (slot, token) pairs are grouped by expert, so each expert's rows are decoded once per tile of its tokens. */
QATTR static int FN(q_mul_mat_id)(int qa, int at, const csimd_tensor *w, const csimd_tensor *b, const csimd_tensor *ids,
                                  const csimd_tensor *d, int nth) {
    const int64_t K = w->ne[0], M = w->ne[1], E = w->ne[2], n_used = ids->ne[0], n_tok = ids->ne[1], nb1 = b->ne[1];
    const int64_t kp = q_pad(K), npairs = n_used * n_tok;
    char *acts = (char *)csimd_alloc(q_arow_bytes(kp) * (size_t)(nb1 * n_tok));
    const char **gw = (const char **)malloc((size_t)E * sizeof(char *));
    int64_t *goff = (int64_t *)calloc((size_t)(E + 1), sizeof(int64_t)), *arow = (int64_t *)malloc((size_t)npairs * 8);
    int64_t *fill = (int64_t *)malloc((size_t)(E + 1) * sizeof(int64_t));
    float **out = (float **)malloc((size_t)npairs * sizeof(float *));
    int rc = -2;
    if (acts && gw && goff && arow && out && fill) {
        for (int64_t p = 0; p < npairs; p++) {
            int32_t x;
            memcpy(&x, ELT(ids, p % n_used, p / n_used, 0, 0), 4);
            goff[x + 1]++;
        }
        for (int64_t x = 0; x < E; x++) {
            goff[x + 1] += goff[x];
            gw[x] = w->data + x * w->nb[2];
        }
        memcpy(fill, goff, (size_t)(E + 1) * sizeof(int64_t));
        for (int64_t p = 0; p < npairs; p++) {
            const int64_t e = p % n_used, t = p / n_used;
            int32_t x;
            memcpy(&x, ELT(ids, e, t, 0, 0), 4);
            const int64_t j = fill[x]++;
            arow[j] = t * nb1 + e % nb1;
            out[j] = (float *)ELT(d, 0, e, t, 0);
        }
        rc = FN(q_quant_acts)(at, b, kp, acts, nth);
        if (rc == 0) rc = FN(q_gemm_groups)(qa, K, M, w->nb[1], E, gw, goff, arow, out, acts, kp, nth);
    }
    free(acts);
    free(gw);
    free(goff);
    free(arow);
    free(fill);
    free(out);
    return rc;
}

/* raw dot products for tests: out[i] = w row i . a row i, both already in block form (a in `at`) */
QATTR static int FN(q_vec_dot)(int qw, const uint8_t *w, int at, const uint8_t *a, int64_t K, int64_t rows, float *out) {
    const int64_t kp = q_pad(K);
    char *buf = (char *)csimd_alloc(q_wrow_bytes(kp) + q_arow_bytes(kp));
    if (!buf) return -2;
    q_wrow wr;
    q_arow ar;
    q_wrow_at(&wr, buf, kp);
    q_arow_at(&ar, buf + q_wrow_bytes(kp), kp);
    const int64_t wrb = K / q_block_elems(qw) * q_block_bytes(qw), arb = K / q_block_elems(at) * q_block_bytes(at);
    for (int64_t i = 0; i < rows; i++) {
        FN(q_wrow_fill)(qw, w + i * wrb, K, kp, &wr);
        FN(q_arow_fill_blocks)(at, a + i * arb, K, kp, &ar);
        FN(q_dot)(&wr, 1, &ar, kp, out + i);
    }
    free(buf);
    return 0;
}
#undef Q_VNNI
#undef QBIAS_PAD
#undef QM_DIRECT
#undef Q_TLB_AHEAD
#undef Q_DIRECT_ROWS
#undef Q_GEMV_ROWS
#undef Q_GEMV_B32_CASES
#undef QV
#undef QVF
#undef QV16
#undef QV_LOAD
#undef QV_STORE
#undef QATTR
