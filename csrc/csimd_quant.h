/* Quantized block formats of the csimd kernels: ggml's type ids, block geometry, and the
   reference quantizers and activation quantizers (plain C, compiled once). The block layouts are
   ggml's (../shared/reference/ggml-semantics.md section 6, gguf.quants); the decoders and the
   integer dot products are part of the ISA template (csimd_quant_impl.h). */
#ifndef PRISM_CSIMD_QUANT_H
#define PRISM_CSIMD_QUANT_H
#include <float.h>
#include "csimd_common.h"
#include "csimd_iq_tables.h"

/* ggml's type ids (enum ggml_type; stable) */
enum {
    Q_Q4_0 = 2, Q_Q4_1 = 3, Q_Q5_0 = 6, Q_Q5_1 = 7, Q_Q8_0 = 8, Q_Q8_1 = 9, Q_Q2_K = 10, Q_Q3_K = 11, Q_Q4_K = 12,
    Q_Q5_K = 13, Q_Q6_K = 14, Q_Q8_K = 15, Q_IQ2_XXS = 16, Q_IQ2_XS = 17, Q_IQ3_XXS = 18, Q_IQ1_S = 19,
    Q_IQ4_NL = 20, Q_IQ3_S = 21, Q_IQ2_S = 22, Q_IQ4_XS = 23, Q_IQ1_M = 29, Q_TQ1_0 = 34, Q_TQ2_0 = 35,
    Q_MXFP4 = 39
};

/* elements and bytes of one block; 0 for a type that is not a block format here */
static inline int q_block_elems(int t) {
    switch (t) {
    case Q_Q4_0: case Q_Q4_1: case Q_Q5_0: case Q_Q5_1: case Q_Q8_0: case Q_Q8_1: case Q_IQ4_NL: case Q_MXFP4:
        return 32;
    case Q_Q2_K: case Q_Q3_K: case Q_Q4_K: case Q_Q5_K: case Q_Q6_K: case Q_Q8_K: case Q_IQ2_XXS: case Q_IQ2_XS:
    case Q_IQ3_XXS: case Q_IQ1_S: case Q_IQ3_S: case Q_IQ2_S: case Q_IQ4_XS: case Q_IQ1_M: case Q_TQ1_0:
    case Q_TQ2_0:
        return 256;
    default: return 0;
    }
}

static inline int q_block_bytes(int t) {
    switch (t) {
    case Q_Q4_0: return 18;
    case Q_Q4_1: return 20;
    case Q_Q5_0: return 22;
    case Q_Q5_1: return 24;
    case Q_Q8_0: return 34;
    case Q_Q8_1: return 36;
    case Q_Q2_K: return 84;
    case Q_Q3_K: return 110;
    case Q_Q4_K: return 144;
    case Q_Q5_K: return 176;
    case Q_Q6_K: return 210;
    case Q_Q8_K: return 292;
    case Q_IQ2_XXS: return 66;
    case Q_IQ2_XS: return 74;
    case Q_IQ3_XXS: return 98;
    case Q_IQ1_S: return 50;
    case Q_IQ4_NL: return 18;
    case Q_IQ3_S: return 110;
    case Q_IQ2_S: return 82;
    case Q_IQ4_XS: return 136;
    case Q_IQ1_M: return 56;
    case Q_TQ1_0: return 54;
    case Q_TQ2_0: return 66;
    case Q_MXFP4: return 17;
    default: return 0;
    }
}

/* the groups that carry an offset (y = scale*q + offset): asymmetric formats */
static inline int q_has_offset(int t) {
    return t == Q_Q4_1 || t == Q_Q5_1 || t == Q_Q2_K || t == Q_Q4_K || t == Q_Q5_K;
}

/* an activation type (vec_dot_type): Q8_0 and Q8_1 in blocks of 32, Q8_K of 256 */
static inline int q_is_act_type(int t) { return t == Q_Q8_0 || t == Q_Q8_1 || t == Q_Q8_K; }

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float q_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32_sw(h);
}

static inline void q_put_f16(uint8_t *p, float v) {
    const uint16_t h = f32_to_f16_sw(v);
    memcpy(p, &h, 2);
}

/* E8M0 exponent to float, halved (the MXFP4 values are stored doubled): 2^(e - 128) */
static inline float q_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ggml's nearest_int: x + 1.5*2^23 leaves round-half-even(x) in the low mantissa bits. Within
   |x| < 2^22 that is the rounded value; outside (a scale search's quotient of two tiny sums, say) ggml
   only asserts in debug builds and takes those bits as they are, and so does this */
static inline int q_nearest_int(float x) {
    const float v = x + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007FFFFF) - 0x00400000;
}

/* (int)roundf(x) as x86 computes it: half away from zero; infinities, NaN and values beyond int give INT_MIN
   (cvttss2si), as ggml's casts of roundf do (an all-subnormal block's 1/d is infinite). Written as truncation
   plus the sign where the dropped fraction is in [0.5, 1) (exact: x - trunc(x) loses nothing below 2^23, and
   above it x is whole) so that the loops calling it vectorise (roundf does not without -ffast-math) */
static inline int q_round_away(float x) {
    const int i = (int)x;
    const float f = x - (float)i;
    return i + ((f >= 0.5f) & (f < 1.0f)) - ((f <= -0.5f) & (f > -1.0f));
}

/* Q4_K / Q5_K: 6-bit scale and min of sub-block j (of 32) */
static inline void q_k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* 8 grid values with the sign bits of s applied */
static inline void q_grid8(int8_t *q, const uint8_t *g, unsigned s) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)((s >> j) & 1 ? -(int)g[j] : (int)g[j]);
}

static inline void q_grid4(int8_t *q, const uint8_t *g, unsigned s) {
    for (int j = 0; j < 4; j++) q[j] = (int8_t)((s >> j) & 1 ? -(int)g[j] : (int)g[j]);
}

/* ---------------------------------------------------------------- activation quantizers
   As ggml's CPU backend quantizes the second operand of a quantized dot product (its from_float):
   Q8_0/Q8_1 with d = amax/127, id = 127/amax and ties to even (the x86 path's _mm256_round_ps),
   Q8_1 also s = fp16(d * sum q) with the unrounded d; Q8_K as its reference (iscale = -127/max of the
   value with the largest magnitude, nearest_int, d = 1/iscale in float32, bsums of 16). ref = 1 gives
   the reference quantizers of Q8_0/Q8_1 instead (id = 1/d, roundf: ties away from zero). */
static void q_quant_q8_0(const float *x, uint8_t *y, int with_sum, int ref) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = ref ? (d != 0.0f ? 1.0f / d : 0.0f) : (amax != 0.0f ? 127.0f / amax : 0.0f);
    int8_t *qs = (int8_t *)(y + (with_sum ? 4 : 2));
    int sum = 0;
    if (ref) /* two loops, not a choice per element: each vectorises */
        for (int j = 0; j < 32; j++) {
            const int8_t q = (int8_t)q_round_away(x[j] * id);
            qs[j] = q;
            sum += q; /* the stored byte, as ggml sums them (a NaN's INT_MIN stores 0) */
        }
    else
        for (int j = 0; j < 32; j++) {
            const int8_t q = (int8_t)q_nearest_int(x[j] * id);
            qs[j] = q;
            sum += q;
        }
    q_put_f16(y, d);
    if (with_sum) q_put_f16(y + 2, d * (float)sum);
}

/* the element of largest magnitude (the first of equals; NaN never wins, as ggml's `>` scans) and that
   magnitude; the largest magnitude first, then the first element holding it: two passes that vectorise,
   where the one scan's branch does not */
static inline float q_signed_absmax(int n, const float *x, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        amax = ax > amax ? ax : amax;
    }
    if (amax > 0.0f)
        for (int i = 0; i < n; i++)
            if (fabsf(x[i]) == amax) { max = x[i]; break; }
    *amax_out = amax;
    return max;
}

/* the multiplier and stored scale of one Q8_0 or Q8_K activation block whose largest magnitude is amax,
   as q_quant_q8_0 (x86 path) and q_quant_q8_k choose them: the vector fills of csimd_quant_impl.h */
static inline void q_act_scale(int at, const float *xb, float amax, float *d, float *mul) {
    *d = *mul = 0.0f;
    if (at == Q_Q8_K) {
        if (amax != 0.0f) {
            int j = 0; /* the first value of the largest magnitude, with its sign */
            while (fabsf(xb[j]) != amax) j++;
            const float iscale = -127.0f / xb[j];
            *mul = iscale;
            *d = 1.0f / iscale;
        }
    } else {
        uint8_t h[2];
        q_put_f16(h, amax / 127.0f);
        *d = q_f16(h); /* the block stores d as fp16 */
        *mul = amax != 0.0f ? 127.0f / amax : 0.0f;
    }
}

static void q_quant_q8_k(const float *x, uint8_t *y) {
    float amax;
    const float max = q_signed_absmax(256, x, &amax);
    int8_t *qs = (int8_t *)(y + 4);
    int16_t bs[16];
    if (amax == 0.0f) {
        memset(y, 0, 292);
        return;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; j++) {
        const int v = q_nearest_int(iscale * x[j]);
        qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int j = 0; j < 16; j++) s += qs[16 * g + j];
        bs[g] = (int16_t)s;
    }
    const float d = 1.0f / iscale;
    memcpy(y, &d, 4);
    memcpy(y + 260, bs, 32);
}

/* ---------------------------------------------------------------- reference quantizers (no importance matrix) */
/* the smallest and the largest value (NaN never taken, as ggml's comparisons) */
static inline void q_min_max(const float *x, int n, float *mn, float *mx) {
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *mn = lo;
    *mx = hi;
}

/* 32 values of 4 or 5 bits into a legacy block: low nibbles (element j and j + 16 share a byte) at qs, the
   fifth bits at qh (NULL for 4 bits); apart from the rounding loop so that it vectorises */
static inline void q_pack_q4q5(const int *q, uint8_t *qs, uint8_t *qh) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
    if (!qh) return;
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    memcpy(qh, &h, 4);
}

/* Q4_0 (nbits 4) and Q5_0 (nbits 5): d = max/-2^(nbits-1), q = min(2^nbits - 1, trunc(x/d + 2^(nbits-1) + 0.5)) */
static inline void q_quant_q4q5_0(const float *x, uint8_t *y, int nbits) {
    float amax;
    const float max = q_signed_absmax(32, x, &amax);
    const float half = nbits == 4 ? 8.0f : 16.0f, top = nbits == 4 ? 15.0f : 31.0f;
    const float d = max / -half, id = d != 0.0f ? 1.0f / d : 0.0f;
    q_put_f16(y, d);
    int q[32];
    for (int j = 0; j < 32; j++) {
        const int a = (int)(int8_t)(x[j] * id + (half + 0.5f)); /* ggml adds 8.5f (16.5f) at once */
        q[j] = a < (int)top ? a : (int)top;
    }
    q_pack_q4q5(q, y + (nbits == 4 ? 2 : 6), nbits == 5 ? y + 2 : NULL);
}

/* Q4_1 / Q5_1: d = (max - min)/(2^nbits - 1), m = min, q = min(top, trunc((x - min)/d + 0.5)) */
static inline void q_quant_q4q5_1(const float *x, uint8_t *y, int nbits) {
    float lo, hi;
    q_min_max(x, 32, &lo, &hi);
    const float top = nbits == 4 ? 15.0f : 31.0f;
    const float d = (hi - lo) / top, id = d != 0.0f ? 1.0f / d : 0.0f;
    q_put_f16(y, d);
    q_put_f16(y + 2, lo);
    int q[32];
    for (int j = 0; j < 32; j++) {
        const int a = (int)(int8_t)((x[j] - lo) * id + 0.5f);
        q[j] = a < (int)top ? a : (int)top;
    }
    q_pack_q4q5(q, y + (nbits == 4 ? 4 : 8), nbits == 5 ? y + 4 : NULL);
}

/* MXFP4's shared exponent of a block whose largest magnitude is amax: (uint8_t)(floor(log2f(amax)) - 2 + 127),
   0 for amax = 0. Where amax is normal and its mantissa is away from both ends, floor(log2f) is the exponent
   field less 127 whatever log2f's last-bit rounding; near a power of two (log2f may round up to the next
   integer) and for subnormals, log2f itself */
static inline uint8_t q_mxfp4_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    uint32_t bits;
    memcpy(&bits, &amax, 4);
    const uint32_t field = bits >> 23, mant = bits & 0x7FFFFF;
    if (field >= 1 && field <= 254 && mant >= 0x100 && mant < 0x7FFF00) return (uint8_t)(int)((int)field - 127 + 125);
    return (uint8_t)(int)(floorf(log2f(amax)) - 2.0f + 127.0f);
}

/* MXFP4: e = floor(log2 amax) - 2 + 127 (0 for amax = 0); each x the nearest of the 16 values (first wins) */
static void q_quant_mxfp4(const float *x, uint8_t *y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const uint8_t e = q_mxfp4_exponent(amax);
    const float d = q_e8m0_half(e);
    y[0] = e;
    for (int j = 0; j < 16; j++) {
        int best[2] = {0, 0};
        for (int h = 0; h < 2; h++) {
            const float v = x[j + 16 * h];
            float err = fabsf((float)kvalues_mxfp4[0] * d - v);
            for (int i = 1; i < 16; i++) {
                const float e2 = fabsf((float)kvalues_mxfp4[i] * d - v);
                if (e2 < err) { err = e2; best[h] = i; }
            }
        }
        y[1 + j] = (uint8_t)(best[0] | (best[1] << 4));
    }
}

/* TQ2_0 / TQ1_0: d = amax, q = roundf(x/d) + 1 in {0, 1, 2} */
static void q_ternary(const float *x, uint8_t *q, float *d) {
    float amax = 0.0f;
    for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
    for (int j = 0; j < 256; j++) q[j] = (uint8_t)(q_round_away(x[j] * id) + 1);
    *d = amax;
}

static void q_quant_tq2_0(const float *x, uint8_t *y) {
    uint8_t q[256];
    float d;
    q_ternary(x, q, &d);
    for (int c = 0; c < 2; c++)
        for (int j = 0; j < 32; j++) {
            uint8_t b = 0;
            for (int n = 0; n < 4; n++) b |= (uint8_t)(q[128 * c + 32 * n + j] << (2 * n));
            y[32 * c + j] = b;
        }
    q_put_f16(y + 64, d);
}

static void q_quant_tq1_0(const float *x, uint8_t *y) {
    static const int pw[5] = {81, 27, 9, 3, 1};
    uint8_t q[256];
    float d;
    q_ternary(x, q, &d);
    uint16_t v[52];
    for (int j = 0; j < 32; j++) { /* 5 trits of elements j + 32n */
        int s = 0;
        for (int n = 0; n < 5; n++) s += q[32 * n + j] * pw[n];
        v[j] = (uint16_t)s;
    }
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int n = 0; n < 5; n++) s += q[160 + 16 * n + j] * pw[n];
        v[32 + j] = (uint16_t)s;
    }
    for (int j = 0; j < 4; j++) {
        int s = 0;
        for (int n = 0; n < 4; n++) s += q[240 + 4 * n + j] * pw[n];
        v[48 + j] = (uint16_t)s;
    }
    /* a trit string of value s (< 243) stored as ceil(s * 256 / 243): the digits come back with x*3 >> 8 */
    for (int j = 0; j < 52; j++) y[j] = (uint8_t)(((uint32_t)v[j] * 256u + 242u) / 243u);
    q_put_f16(y + 52, d);
}

/* ggml's make_qx_quants with rmse_type 1: L[i] in 0..2*nmax-1, returns the scale; 18 further scales tried
   around -nmax/max. qw: the importance weights, NULL for ggml's default x^2. Float operations in ggml's order. */
#define Q_GROUP_MAX_EPS 1e-15f
/* *max = the group's element of largest magnitude; a group whose magnitude is below Q_GROUP_MAX_EPS gets
   all-zero quants and returns 1 (its scale is 0) */
static inline int q_group_is_empty(int n, const float *x, int8_t *L, float *max) {
    float amax;
    *max = q_signed_absmax(n, x, &amax);
    if (amax >= Q_GROUP_MAX_EPS) return 0;
    for (int i = 0; i < n; i++) L[i] = 0;
    return 1;
}
/* The search runs its 19 scales side by side: ggml adds sum(w x l) and sum(w l^2) element by element in
   order for one scale after another, a chain of dependent additions that is most of its time; here every
   scale keeps its own two sums, each added in ggml's order, in the lanes of vectors (q_f4: GNU vectors, SSE2
   or NEON without target flags), so the additions of different scales overlap and each sum is bit for bit
   ggml's. Lane 0 is the unshifted scale, lanes 1..18 is = -9..-1, 1..9 in ggml's order, lane 19 padding
   (scale 0, never chosen). With finite x, |iscale * x| <= nmax + 1, and l is rounded as a float by adding
   and subtracting 1.5 * 2^23 and clamped as a float: exact below 2^22, where nearest_int is
   round-half-even. A group holding inf or NaN (the second-level searches over scales that overflowed) takes
   nearest_int's bits, one lane at a time. */
typedef float q_f4 __attribute__((vector_size(16)));
typedef int32_t q_i4 __attribute__((vector_size(16)));
#define Q_QX_VECS 5
#define Q_QX_LANES (4 * Q_QX_VECS)

static inline q_f4 q_f4_select(q_i4 m, q_f4 a, q_f4 b) { return (q_f4)((m & (q_i4)a) | (~m & (q_i4)b)); }

/* the lanes' sums over finite x (w: the weights, wx = w * x) */
__attribute__((optimize("fp-contract=off"))) static inline void q_qx_sums_finite(int n, int nmax, const float *x,
                                                                                const float *w, const float *wx,
                                                                                const q_f4 *iscale, q_f4 *slx,
                                                                                q_f4 *sl2) {
    const float magic = 12582912.0f, lo = (float)-nmax, hi = (float)(nmax - 1);
    const q_f4 vlo = {lo, lo, lo, lo}, vhi = {hi, hi, hi, hi};
    for (int i = 0; i < n; i++)
        for (int v = 0; v < Q_QX_VECS; v++) {
            q_f4 l = (iscale[v] * x[i] + magic) - magic;
            l = q_f4_select(l < vlo, vlo, l);
            l = q_f4_select(l > vhi, vhi, l);
            slx[v] += wx[i] * l;
            sl2[v] += w[i] * l * l;
        }
}

/* the same over any x, l by nearest_int's bits */
__attribute__((optimize("fp-contract=off"))) static void q_qx_sums_bits(int n, int nmax, const float *x,
                                                                       const float *w, const float *wx,
                                                                       const float *iscale, float *slx, float *sl2) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < Q_QX_LANES; c++) {
            const int v = q_nearest_int(iscale[c] * x[i]);
            const float l = (float)(v < -nmax ? -nmax : v > nmax - 1 ? nmax - 1 : v);
            slx[c] += wx[i] * l;
            sl2[c] += w[i] * l * l;
        }
}

/* n <= 32 */
__attribute__((optimize("fp-contract=off"))) static float q_make_qx_quants_rmse1(int n, int nmax, const float *x,
                                                                                 const float *qw, int8_t *L) {
    float max;
    if (q_group_is_empty(n, x, L, &max)) return 0.0f;
    float iscale[Q_QX_LANES] = {0}, sumlx[Q_QX_LANES] = {0}, suml2[Q_QX_LANES] = {0}, w[32], wx[32];
    iscale[0] = -(float)nmax / max;
    for (int c = 1; c < 19; c++) {
        const int is = c <= 9 ? c - 10 : c - 9;
        iscale[c] = -((float)nmax + 0.1f * (float)is) / max;
    }
    int finite = 1;
    for (int i = 0; i < n; i++) {
        w[i] = qw ? qw[i] : x[i] * x[i];
        wx[i] = w[i] * x[i];
        finite &= fabsf(x[i]) <= FLT_MAX;
    }
    if (finite) {
        q_f4 vis[Q_QX_VECS], vlx[Q_QX_VECS] = {0}, vl2[Q_QX_VECS] = {0};
        memcpy(vis, iscale, sizeof vis);
        q_qx_sums_finite(n, nmax, x, w, wx, vis, vlx, vl2);
        memcpy(sumlx, vlx, sizeof sumlx);
        memcpy(suml2, vl2, sizeof suml2);
    } else {
        q_qx_sums_bits(n, nmax, x, w, wx, iscale, sumlx, suml2);
    }
    float scale = suml2[0] != 0.0f ? sumlx[0] / suml2[0] : 0.0f, best = scale * sumlx[0];
    int chosen = 0;
    for (int c = 1; c < 19; c++)
        if (suml2[c] > 0.0f && sumlx[c] * sumlx[c] > best * suml2[c]) {
            scale = sumlx[c] / suml2[c];
            best = scale * sumlx[c];
            chosen = c;
        }
    for (int i = 0; i < n; i++) {
        const int l = q_nearest_int(iscale[chosen] * x[i]);
        L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
    }
    return scale;
}

/* Q6_K as ggml's quantize_row_q6_K_ref (qw NULL) or quantize_q6_K with importance weights qw (the block's
   256; the group search takes them as they are): per group of 16 the search above, 8-bit group scales
   relative to the largest, then each value requantized against its rounded scale */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q6_k(const float *x, uint8_t *y, const float *qw) {
    int8_t L[256];
    float scales[16], max_scale = 0.0f, max_abs_scale = 0.0f;
    for (int ib = 0; ib < 16; ib++) {
        const float scale = q_make_qx_quants_rmse1(16, 32, x + 16 * ib, qw ? qw + 16 * ib : NULL, L + 16 * ib);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) { max_abs_scale = abs_scale; max_scale = scale; }
    }
    memset(y, 0, 210);
    if (max_abs_scale < Q_GROUP_MAX_EPS) return; /* all zero, d = 0 */
    const float iscale = -128.0f / max_scale;
    q_put_f16(y + 208, 1.0f / iscale);
    int8_t *sc = (int8_t *)(y + 192);
    for (int ib = 0; ib < 16; ib++) {
        const int v = q_nearest_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(v < 127 ? v : 127);
    }
    const float dh = q_f16(y + 208);
    for (int j = 0; j < 16; j++) {
        const float d = dh * (float)sc[j];
        if (d == 0.0f) continue;
        for (int ii = 0; ii < 16; ii++) {
            int l = q_nearest_int(x[16 * j + ii] / d);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            L[16 * j + ii] = (int8_t)(l + 32);
        }
    }
    for (int h = 0; h < 2; h++) {
        uint8_t *ql = y + 64 * h, *qh = y + 128 + 32 * h;
        const int8_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; l++) {
            const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
            ql[l] = (uint8_t)((q1 & 15) | ((q3 & 15) << 4));
            ql[l + 32] = (uint8_t)((q2 & 15) | ((q4 & 15) << 4));
            qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

/* ggml's make_qkx2_quants (asymmetric, weighted): L[i] in 0..nmax, returns the scale and *the_min (the
   positive offset); nstep + 1 further scales tried, the min carried over from each winner as ggml does */
__attribute__((optimize("fp-contract=off"))) static float q_make_qkx2_quants(int n, int nmax, const float *x,
                                                                            const float *weights, uint8_t *L,
                                                                            float *the_min, float rmin, float rdelta,
                                                                            int nstep, int use_mad) {
    float min = x[0], max = x[0], sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = q_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    /* the nstep + 1 further scales four at a time, one per lane (each lane's sums and error in ggml's order,
       nearest_int by its bits, so any input gives ggml's values); ggml's search carries the min of each
       winner into the scales after it, so a winner that moves the min ends the pass and the next one
       starts at the scale after it */
    int is0 = 0;
    while (is0 <= nstep) {
        float isc[4];
        for (int c = 0; c < 4; c++) isc[c] = (rmin + rdelta * (float)(is0 + c) + (float)nmax) / (max - min);
        const q_f4 viscale = {isc[0], isc[1], isc[2], isc[3]};
        const q_i4 zero = {0, 0, 0, 0}, top = {nmax, nmax, nmax, nmax};
        q_f4 lf[32], sum_l = {0}, sum_l2 = {0}, sum_xl = {0}, cur_error = {0};
        for (int i = 0; i < n; i++) {
            const q_f4 v = viscale * (x[i] - min) + 12582912.0f;
            q_i4 l = ((q_i4)v & 0x007FFFFF) - 0x00400000;
            l &= ~(l < zero);
            const q_i4 over = l > top;
            l = (over & top) | (~over & l);
            lf[i] = __builtin_convertvector(l, q_f4);
            const float w = weights[i];
            sum_l += w * lf[i];
            sum_l2 += w * lf[i] * lf[i];
            sum_xl += w * lf[i] * x[i];
        }
        const q_f4 D = sum_w * sum_l2 - sum_l * sum_l;
        q_f4 this_scale = (sum_w * sum_xl - sum_x * sum_l) / D, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        const q_i4 pos = this_min > 0.0f;
        this_scale = q_f4_select(pos, sum_xl / sum_l2, this_scale);
        this_min = q_f4_select(pos, (q_f4){0.0f, 0.0f, 0.0f, 0.0f}, this_min);
        for (int i = 0; i < n; i++) {
            q_f4 diff = this_scale * lf[i] + this_min - x[i];
            diff = use_mad ? (q_f4)((q_i4)diff & 0x7FFFFFFF) : diff * diff;
            cur_error += weights[i] * diff;
        }
        int next = is0 + 4;
        for (int c = 0; c < 4 && is0 + c <= nstep; c++) {
            if (!(D[c] > 0) || !(cur_error[c] < best_error)) continue;
            for (int i = 0; i < n; i++) L[i] = (uint8_t)lf[i][c];
            best_error = cur_error[c];
            scale = this_scale[c];
            const float moved = this_min[c];
            if (memcmp(&moved, &min, sizeof min) != 0) {
                min = moved;
                next = is0 + c + 1;
                break;
            }
        }
        is0 = next;
    }
    *the_min = -min;
    return scale;
}

/* What Q4_K and Q5_K quantizers share once each group's 6-bit scale and min codes ls[j], lm[j] are chosen:
   the codes packed into y's 12 scale bytes, the super-block scale d and min dmin stored as F16, then every
   value requantized against its group's stored (F16-rounded) scale and min (a group whose scale is 0 keeps
   its first-pass levels in L) and packed (Q5_K's fifth bits
   into qh) */
__attribute__((optimize("fp-contract=off"))) static void q_k45_store(const float *x, uint8_t *y, uint8_t *L, const uint8_t *ls,
                                                                     const uint8_t *lm, float d_block, float m_block,
                                                                     int five) {
    const int nmax = five ? 31 : 15;
    uint8_t *sc = y + 4;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    q_put_f16(y, d_block);
    q_put_f16(y + 2, m_block);
    const float dh = q_f16(y), dminh = q_f16(y + 2);
    for (int j = 0; j < 8; j++) {
        int s, m;
        q_k_scale_min(sc, j, &s, &m);
        const float d = dh * (float)s;
        if (!d) continue;
        const float dm = dminh * (float)m;
        for (int i = 0; i < 32; i++) {
            const int l = q_nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
    if (!five) {
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[16 + 32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + l + 32] << 4));
        return;
    }
    uint8_t *qh = y + 16, *ql = y + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 32; j++) {
            int l1 = L[64 * c + j], l2 = L[64 * c + j + 32];
            if (l1 > 15) { l1 -= 16; qh[j] |= (uint8_t)(1u << (2 * c)); }
            if (l2 > 15) { l2 -= 16; qh[j] |= (uint8_t)(2u << (2 * c)); }
            ql[32 * c + j] = (uint8_t)(l1 | (l2 << 4));
        }
}

/* Q4_K (five = 0) and Q5_K (five = 1) as ggml's quantize_row_q4_K_ref / q5_K_ref */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q4q5_k(const float *x, uint8_t *y, int five) {
    const int nmax = five ? 31 : 15;
    uint8_t L[256];
    float weights[32], mins[8], scales[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = q_make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], five ? -0.5f : -1.0f, 0.1f,
                                       five ? 15 : 20, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        const uint8_t s = (uint8_t)q_nearest_int(inv_scale * scales[j]), m = (uint8_t)q_nearest_int(inv_min * mins[j]);
        ls[j] = s < 63 ? s : 63; /* clamped after the cast to uint8_t, as ggml */
        lm[j] = m < 63 ? m : 63;
    }
    q_k45_store(x, y, L, ls, lm, max_scale / 63.f, max_min / 63.f, five);
}

/* Q2_K's last step: every value requantized against its group's stored scale and min (4-bit pairs in
   y[0..15], d and dmin at y + 80 and y + 82; a group of scale 0 keeps its first quants), the 2-bit quants
   packed four to a byte into qs (y + 16) */
__attribute__((optimize("fp-contract=off"))) static void q_q2k_requant_pack(const float *x, uint8_t *y, uint8_t *L) {
    const float dh = q_f16(y + 80), dminh = q_f16(y + 82);
    for (int j = 0; j < 16; j++) {
        const float d = dh * (float)(y[j] & 0xF);
        if (!d) continue;
        const float m = dminh * (float)(y[j] >> 4);
        for (int i = 0; i < 16; i++) {
            const int l = q_nearest_int((x[16 * j + i] + m) / d);
            L[16 * j + i] = (uint8_t)(l < 0 ? 0 : l > 3 ? 3 : l);
        }
    }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *Lh = L + 128 * h;
            y[16 + 32 * h + l] = (uint8_t)(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
        }
}

/* Q2_K as ggml's quantize_row_q2_K_ref: 16 groups of 16, make_qkx2_quants with |x| weights and absolute
   errors, 4-bit scales and mins relative to the largest */
__attribute__((optimize("fp-contract=off"))) static void q_quant_q2_k(const float *x, uint8_t *y) {
    uint8_t L[256], *sc = y;
    float weights[16], mins[16], scales[16], max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = q_make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, 1);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    memset(y, 0, 84);
    if (max_scale > 0) {
        const float iscale = 15.f / max_scale;
        for (int j = 0; j < 16; j++) sc[j] = (uint8_t)q_nearest_int(iscale * scales[j]);
        q_put_f16(y + 80, max_scale / 15.f);
    }
    if (max_min > 0) {
        const float iscale = 15.f / max_min;
        /* through unsigned: a NaN's nearest int is negative, and shifting it left is undefined */
        for (int j = 0; j < 16; j++) sc[j] |= (uint8_t)((unsigned)q_nearest_int(iscale * mins[j]) << 4);
        q_put_f16(y + 82, max_min / 15.f);
    }
    q_q2k_requant_pack(x, y, L);
}

#include "csimd_quantize_k3iq4.h" /* Q3_K, IQ4_NL, IQ4_XS */

/* one block of F32 -> type t; mode 0: as ggml's CPU backend (Q8_0/Q8_1 ties to even), 1: the reference.
   Returns 0, or -1 for a type without a quantizer here. */
/* GCC's function multi-versioning: an AVX2 copy of the block quantizers beside the baseline one, picked once
   by the loader from the CPU (the same operations: "avx2" brings no FMA, so nothing is contracted and the
   bytes are the baseline's; only the vector width differs) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define Q_ROW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define Q_ROW_CLONES
#endif

Q_ROW_CLONES static int q_quantize_block(int t, int mode, const float *x, uint8_t *y) {
    switch (t) {
    case Q_Q4_0: q_quant_q4q5_0(x, y, 4); return 0;
    case Q_Q5_0: q_quant_q4q5_0(x, y, 5); return 0;
    case Q_Q4_1: q_quant_q4q5_1(x, y, 4); return 0;
    case Q_Q5_1: q_quant_q4q5_1(x, y, 5); return 0;
    case Q_Q8_0: q_quant_q8_0(x, y, 0, mode); return 0;
    case Q_Q8_1: q_quant_q8_0(x, y, 1, mode); return 0;
    case Q_Q8_K: q_quant_q8_k(x, y); return 0;
    case Q_MXFP4: q_quant_mxfp4(x, y); return 0;
    case Q_TQ1_0: q_quant_tq1_0(x, y); return 0;
    case Q_TQ2_0: q_quant_tq2_0(x, y); return 0;
    case Q_Q6_K: q_quant_q6_k(x, y, NULL); return 0;
    case Q_Q2_K: q_quant_q2_k(x, y); return 0;
    case Q_Q4_K: q_quant_q4q5_k(x, y, 0); return 0;
    case Q_Q5_K: q_quant_q4q5_k(x, y, 1); return 0;
    case Q_Q3_K: q_quant_q3_k(x, y); return 0;
    case Q_IQ4_NL: q_quant_iq4_nl(x, y); return 0;
    case Q_IQ4_XS: q_quant_iq4_xs(x, y, NULL); return 0;
    default: return -1;
    }
}

static inline int q_has_quantizer(int t) {
    return t == Q_Q4_0 || t == Q_Q5_0 || t == Q_Q4_1 || t == Q_Q5_1 || t == Q_Q8_0 || t == Q_Q8_1 || t == Q_Q8_K ||
           t == Q_MXFP4 || t == Q_TQ1_0 || t == Q_TQ2_0 || t == Q_Q2_K || t == Q_Q4_K || t == Q_Q5_K || t == Q_Q6_K ||
           t == Q_Q3_K || t == Q_IQ4_NL || t == Q_IQ4_XS;
}

#include "csimd_quantize_x86.h" /* vector copies of Q4_0, Q5_0, Q4_1, Q5_1, MXFP4 for the AVX2/AVX-512 paths */
#include "csimd_quantize_rows.h" /* whole rows: the references, ggml_quantize_chunk (importance weights, IQ grids) */
#endif
