/* Kernel template, included once by each csimd_path_<SFX>.c (one translation unit per ISA path) with
   SFX (name suffix), ATTR (function attributes), ISA_LEVEL (0 scalar, 1 avx2+fma+f16c, 2 avx512) and, where
   they apply, CSIMD_ARM_Q (arm64: 0 portable, 1 neon, 2 dotprod, 3 i8mm; csimd_neon.h, csimd_neon_quant.h),
   CSIMD_AVXVNNI (1: the AVX-VNNI copy) and CSIMD_QUANT_ONLY (the copy exports its quantized kernels only).
   Plain C with GCC vector extensions; the target attribute lets the compiler use the ISA's registers for
   these functions only. The kernels are static; the copy exports them through its tables (end of file). */
#include "csimd_common.h"
#ifndef CSIMD_ARM_Q
#define CSIMD_ARM_Q 0
#endif
#ifndef CSIMD_AVXVNNI
#define CSIMD_AVXVNNI 0
#endif
/* VB (vector bytes) and the GEMM micro-tile MR x NR follow from the level: the tile fills about half
   the vector registers (16 on AVX2, 32 on AVX-512 and NEON: 4x16 keeps the portable 4-row packing of b) */
#if ISA_LEVEL == 2
#define VB 64
#define MR 12
#define NR 32
#elif ISA_LEVEL == 1
#define VB 32
#define MR 6
#define NR 16
#else
#define VB 16
#define MR 4
#define NR (CSIMD_ARM_Q ? 16 : 8)
#endif
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)
#define VF CAT(vf, SFX)
#define VFU CAT(vfu, SFX)
#define VL (VB / 4)

typedef float VF __attribute__((vector_size(VB)));
typedef float VFU __attribute__((vector_size(VB), aligned(4), may_alias));
#define VI CAT(vi, SFX)
typedef int32_t VI __attribute__((vector_size(VB)));
#if CSIMD_ARM_Q
#include "csimd_neon.h"
#endif

/* exp(x) for x <= 0 (and -inf, NaN), as softmax needs it: Cephes' expf (about 1 ulp);
   results below FLT_MIN are flushed to 0 */
ATTR static inline VF FN(vexp_neg)(VF x) {
    const VI under = x < -87.33654f;
    const VF lim = (VF){0} + -87.33654f;
    const VF xc = (VF)(((VI)lim & under) | ((VI)x & ~under));
    const VF t = xc * 1.44269504088896341f;
    const VF n = (t + 12582912.0f) - 12582912.0f; /* round to nearest */
    const VF r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    VF p = (VF){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const VF y = p * (r * r) + r + 1.0f;
    const VI e = (__builtin_convertvector(n, VI) + 127) << 23;
    const VF res = y * (VF)e;
    return (VF)((VI)res & ~under);
}

ATTR static inline float FN(hsum)(VF v) {
    float s = 0.0f;
#pragma GCC unroll 16
    for (int j = 0; j < VL; j++) s += v[j];
    return s;
}

/* ------------------------------------------------------------ row conversions */
ATTR static void FN(row_to_f32)(float *restrict dst, const char *restrict src, int t, int64_t snb, int64_t n) {
    if (t == CSIMD_F32 && snb == 4) { memcpy(dst, src, (size_t)n * 4); return; }
    if (t == CSIMD_F16 && snb == 2) {
        const uint16_t *s = (const uint16_t *)src;
        int64_t i = 0;
#if ISA_LEVEL == 2
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#elif ISA_LEVEL == 1
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#elif CSIMD_ARM_Q
        i = FN(neon_f16_to_f32)(dst, s, n);
#endif
        for (; i < n; i++) dst[i] = f16_to_f32_sw(s[i]);
        return;
    }
    if (t == CSIMD_BF16 && snb == 2) {
        const uint16_t *s = (const uint16_t *)src;
        uint32_t *d = (uint32_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = load_f32(src + i * snb, t);
}

ATTR static void FN(row_from_f32)(char *restrict dst, int t, int64_t dnb, const float *restrict src, int64_t n) {
    if (t == CSIMD_F32 && dnb == 4) { memcpy(dst, src, (size_t)n * 4); return; }
    if (t == CSIMD_F16 && dnb == 2) {
        uint16_t *d = (uint16_t *)dst;
        int64_t i = 0;
#if ISA_LEVEL == 2
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#elif ISA_LEVEL == 1
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#elif CSIMD_ARM_Q
        i = FN(neon_f32_to_f16)(d, src, n);
#endif
        for (; i < n; i++) d[i] = f32_to_f16_sw(src[i]);
        return;
    }
    if (t == CSIMD_BF16 && dnb == 2) {
        uint16_t *d = (uint16_t *)dst;
        const uint32_t *s = (const uint32_t *)src;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = s[i];
            uint16_t q = (uint16_t)((u >> 16) | 64u);
            uint16_t r = (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
            d[i] = ((u & 0x7fffffffu) > 0x7f800000u) ? q : r;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) store_f32(dst + i * dnb, t, src[i]);
}

/* ------------------------------------------------------------ binary (ggml modulo broadcast) */
ATTR static inline float FN(bop)(int op, float x, float y) {
    switch (op) {
    case 0: return x + y;
    case 1: return x - y;
    case 2: return x * y;
    case 3: return x / y;
    default: { /* 4: SILU_BACK, x = grad, y = input */
        const float sg = 1.0f / (1.0f + expf(-y));
        return x * sg * (1.0f + y * (1.0f - sg));
    }
    }
}

#if ISA_LEVEL >= 1
/* large contiguous F32 add/sub/mul/div: non-temporal stores (no read-for-ownership of d) */
ATTR static int FN(binary_stream)(int op, float *d, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    if (op > 3) return 0;
    while (i < n && ((uintptr_t)(d + i) & 63)) { d[i] = FN(bop)(op, a[i], b[i]); i++; }
#if ISA_LEVEL == 2
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(a + i), y = _mm512_loadu_ps(b + i), r;
        switch (op) {
        case 0: r = _mm512_add_ps(x, y); break;
        case 1: r = _mm512_sub_ps(x, y); break;
        case 2: r = _mm512_mul_ps(x, y); break;
        default: r = _mm512_div_ps(x, y); break;
        }
        _mm512_stream_ps(d + i, r);
    }
#else
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i), r;
        switch (op) {
        case 0: r = _mm256_add_ps(x, y); break;
        case 1: r = _mm256_sub_ps(x, y); break;
        case 2: r = _mm256_mul_ps(x, y); break;
        default: r = _mm256_div_ps(x, y); break;
        }
        _mm256_stream_ps(d + i, r);
    }
#endif
    for (; i < n; i++) d[i] = FN(bop)(op, a[i], b[i]);
    _mm_sfence();
    return 1;
}
#endif

ATTR static void FN(binary_contig)(int op, float *d, const float *a, const float *b, int64_t n) {
    switch (op) {
    case 0: for (int64_t i = 0; i < n; i++) d[i] = a[i] + b[i]; break;
    case 1: for (int64_t i = 0; i < n; i++) d[i] = a[i] - b[i]; break;
    case 2: for (int64_t i = 0; i < n; i++) d[i] = a[i] * b[i]; break;
    case 3: for (int64_t i = 0; i < n; i++) d[i] = a[i] / b[i]; break;
    default: for (int64_t i = 0; i < n; i++) d[i] = FN(bop)(op, a[i], b[i]); break;
    }
}


/* items it0 .. it1 - 1 of binary (a row's chunk of CHUNK elements each) */
ATTR static void FN(binary_items)(int op, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d,
                                  int64_t it0, int64_t it1) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    const int64_t nch = (n0 + CHUNK - 1) / CHUNK;
    const int contig = a->nb[0] == 4 && b->nb[0] == 4 && d->nb[0] == 4;
    const int typed = a->type != CSIMD_F32 || b->type != CSIMD_F32 || d->type != CSIMD_F32;
    const int stream = (double)n0 * (double)nr >= (double)(1 << 22); /* far beyond the caches */
    (void)stream;
    for (int64_t it = it0; it < it1; it++) {
        int64_t ir = it / nch, c0 = (it % nch) * CHUNK, c1 = c0 + CHUNK < n0 ? c0 + CHUNK : n0;
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        float *dr = (float *)ELT(d, 0, i1, i2, i3);
        const char *ar = ELT(a, 0, i1, i2, i3);
        const char *br = ELT(b, 0, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        if (typed) {
            const int64_t bn = b->ne[0];
            for (int64_t i = c0; i < c1; i++) {
                const double x = load_f32(ar + i * a->nb[0], a->type), y = load_f32(br + (i % bn) * b->nb[0], b->type);
                double r;
                switch (op) {
                case 0: r = x + y; break;
                case 1: r = x - y; break;
                case 2: r = x * y; break;
                case 3: r = x / y; break;
                default: r = FN(bop)(op, (float)x, (float)y); break;
                }
                store_f64((char *)dr + i * d->nb[0], d->type, r);
            }
        } else if (contig && b->ne[0] == n0) {
#if ISA_LEVEL >= 1
            /* stream only when d overlaps neither source (not in place) */
            const char *d0 = (const char *)(dr + c0), *d1 = (const char *)(dr + c1);
            const int apart = (d1 <= ar + 4 * c0 || ar + 4 * c1 <= d0) && (d1 <= br + 4 * c0 || br + 4 * c1 <= d0);
            if (stream && apart &&
                FN(binary_stream)(op, dr + c0, (const float *)ar + c0, (const float *)br + c0, c1 - c0))
                continue;
#endif
            FN(binary_contig)(op, dr + c0, (const float *)ar + c0, (const float *)br + c0, c1 - c0);
        } else if (b->ne[0] == 1) {
            float y;
            memcpy(&y, br, 4);
            for (int64_t i = c0; i < c1; i++) {
                float x;
                memcpy(&x, ar + i * a->nb[0], 4);
                x = FN(bop)(op, x, y);
                memcpy((char *)dr + i * d->nb[0], &x, 4);
            }
        } else {
            const int64_t bn = b->ne[0];
            for (int64_t i = c0; i < c1; i++) {
                float x, y;
                memcpy(&x, ar + i * a->nb[0], 4);
                memcpy(&y, br + (i % bn) * b->nb[0], 4);
                x = FN(bop)(op, x, y);
                memcpy((char *)dr + i * d->nb[0], &x, 4);
            }
        }
    }
}

/* A team of one thread is no cheaper in libgomp than a team of several (a malloc, a free and a futex call per
   region, about 0.2 us: more than a 640-float row op itself, and a decode step makes ~400 such calls), so
   the kernels a decode step calls most run their items on the calling thread alone when nth is 1. */
ATTR static void FN(binary)(int op, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    const int64_t items = nrows_of(d) * ((d->ne[0] + CHUNK - 1) / CHUNK);
    if (nth <= 1) {
        FN(binary_items)(op, a, b, d, 0, items);
        return;
    }
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t it = 0; it < items; it++) FN(binary_items)(op, a, b, d, it, it + 1);
}

/* ------------------------------------------------------------ unary */

ATTR static inline float FN(sigm)(float x) { return 1.0f / (1.0f + expf(-x)); }

ATTR static inline double FN(uop)(int op, float x, double p0, double p1) {
    switch (op) {
    case U_ABS: return fabsf(x);
    case U_SGN: return x > 0 ? 1.0f : x < 0 ? -1.0f : 0.0f; /* ggml's: NaN and -0.0 give +0.0 */
    case U_NEG: return -x;
    case U_STEP: return x > 0 ? 1.0f : 0.0f;
    case U_TANH: return tanhf(x);
    case U_ELU: return x > 0 ? x : expm1f(x);
    case U_RELU: return x > 0 ? x : 0.0f;
    case U_SIGMOID: return FN(sigm)(x);
    case U_GELU: /* ggml's F16 table (csimd_set_gelu_tables) */
        return x <= -CSIMD_GELU_CLAMP ? 0.0 : x >= CSIMD_GELU_CLAMP ? (double)x : csimd_gelu_f16[f32_to_f16_sw(x)];
    case U_GELU_QUICK: return csimd_gelu_quick_f16[f32_to_f16_sw(x)];
    case U_SILU: return x / (1.0f + expf(-x));
    case U_HARDSWISH: return x * fminf(1.0f, fmaxf(0.0f, (x + 3.0f) / 6.0f));
    case U_HARDSIGMOID: return fminf(1.0f, fmaxf(0.0f, (x + 3.0f) / 6.0f)); /* NaN -> 0, as ggml */
    case U_EXP: return expf(x);
    case U_EXPM1: return expm1f(x);
    case U_SOFTPLUS: return x > 20.0f ? x : log1pf(expf(x));
    case U_GELU_ERF: return 0.5 * (double)x * (1.0 + erf((double)x * 0.70710678118654752440));
    case U_FLOOR: return floorf(x);
    case U_CEIL: return ceilf(x);
    case U_ROUND: return roundf(x);
    case U_TRUNC: return truncf(x);
    case U_SQR: return x * x;
    case U_SQRT: return sqrtf(x);
    case U_LOG: return logf(x);
    case U_SIN: return sinf(x);
    case U_COS: return cosf(x);
    case U_SCALE: {
        double t = (double)x * p0;
        __asm__("" : "+m"(t)); /* no fused multiply-add: round as the reference does */
        return p1 == 0.0 ? t : t + p1; /* ggml skips a zero bias: -0.0 * s keeps its sign */
    }
    case U_CLAMP: { double m = x < p1 ? (double)x : p1; return m > p0 ? m : p0; } /* ggml's MAX(MIN(x, max), min) */
    case U_LEAKY_RELU: return x > 0 ? (double)x : x < 0 ? 0.0 + x * p0 : 0.0; /* NaN, -0.0 -> +0.0 */
    default: return x;
    }
}

/* 1 / (1 + exp(-x)) from exp(-|x|) only (no overflow): sigmoid(|x|), or e sigmoid(|x|) for x < 0 */
ATTR static inline VF FN(vsigmoid)(VF x) {
    const VI neg = x < 0.0f;
    const VF ax = (VF)((VI)x & ((VI){0} + 0x7fffffff)); /* |x| */
    const VF e = FN(vexp_neg)(-ax);
    const VF r = 1.0f / (1.0f + e);
    return (VF)(((VI)(e * r) & neg) | ((VI)r & ~neg));
}

ATTR static void FN(unary_contig)(int op, double p0, double p1, float *d, const float *a, int64_t n) {
    const float f0 = (float)p0, f1 = (float)p1;
    const int exact = (double)f0 == p0 && (double)f1 == p1; /* float arithmetic rounds as the double form */
    if (op == U_SIGMOID || op == U_SILU) {
        int64_t i = 0;
        for (; i + VL <= n; i += VL) {
            const VF x = *(const VFU *)(a + i), sg = FN(vsigmoid)(x);
            *(VFU *)(d + i) = op == U_SILU ? x * sg : sg;
        }
        for (; i < n; i++) d[i] = (float)FN(uop)(op, a[i], p0, p1);
        return;
    }
    switch (op) {
    case U_STEP: for (int64_t i = 0; i < n; i++) d[i] = a[i] > 0 ? 1.0f : 0.0f; return;
    case U_SGN: for (int64_t i = 0; i < n; i++) d[i] = a[i] > 0 ? 1.0f : a[i] < 0 ? -1.0f : 0.0f; return;
    case U_HARDSIGMOID:
        for (int64_t i = 0; i < n; i++) d[i] = fminf(1.0f, fmaxf(0.0f, (a[i] + 3.0f) / 6.0f));
        return;
    case U_HARDSWISH:
        for (int64_t i = 0; i < n; i++) d[i] = a[i] * fminf(1.0f, fmaxf(0.0f, (a[i] + 3.0f) / 6.0f));
        return;
    case U_LEAKY_RELU:
        if (!exact) break;
        for (int64_t i = 0; i < n; i++) d[i] = a[i] > 0 ? a[i] : a[i] < 0 ? 0.0f + a[i] * f0 : 0.0f;
        return;
    case U_CLAMP:
        if (!exact) break;
        for (int64_t i = 0; i < n; i++) { const float m = a[i] < f1 ? a[i] : f1; d[i] = m > f0 ? m : f0; }
        return;
    default: break;
    }
    switch (op) {
    case U_NEG: for (int64_t i = 0; i < n; i++) d[i] = -a[i]; return;
    case U_ABS: for (int64_t i = 0; i < n; i++) d[i] = fabsf(a[i]); return;
    case U_SQR: for (int64_t i = 0; i < n; i++) d[i] = a[i] * a[i]; return;
    case U_SQRT: for (int64_t i = 0; i < n; i++) d[i] = sqrtf(a[i]); return;
    case U_RELU: for (int64_t i = 0; i < n; i++) d[i] = a[i] > 0 ? a[i] : 0.0f; return;
    case U_SCALE: {
        const double s = p0, b = p1;
        if (b == 0.0 && (double)(float)s == s) { const float sf = (float)s; for (int64_t i = 0; i < n; i++) d[i] = a[i] * sf; }
        else { for (int64_t i = 0; i < n; i++) d[i] = (float)((double)a[i] * s + b); }
        return;
    }
    default: for (int64_t i = 0; i < n; i++) d[i] = (float)FN(uop)(op, a[i], p0, p1); return;
    }
}

/* items it0 .. it1 - 1 of unary (a row's chunk of CHUNK elements each) */
ATTR static void FN(unary_items)(int op, double p0, double p1, const csimd_tensor *a, const csimd_tensor *d,
                                 int64_t it0, int64_t it1) {
    const int64_t n0 = d->ne[0];
    const int64_t nch = (n0 + CHUNK - 1) / CHUNK;
    const int contig = a->nb[0] == 4 && d->nb[0] == 4;
    const int typed = a->type != CSIMD_F32 || d->type != CSIMD_F32;
    for (int64_t it = it0; it < it1; it++) {
        int64_t ir = it / nch, c0 = (it % nch) * CHUNK, c1 = c0 + CHUNK < n0 ? c0 + CHUNK : n0;
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        char *dr = ELT(d, 0, i1, i2, i3);
        const char *ar = ELT(a, 0, i1, i2, i3);
        if (typed) {
            for (int64_t i = c0; i < c1; i++)
                store_f64(dr + i * d->nb[0], d->type, FN(uop)(op, load_f32(ar + i * a->nb[0], a->type), p0, p1));
        } else if (contig) {
            FN(unary_contig)(op, p0, p1, (float *)dr + c0, (const float *)ar + c0, c1 - c0);
        } else {
            for (int64_t i = c0; i < c1; i++) {
                float x;
                memcpy(&x, ar + i * a->nb[0], 4);
                x = (float)FN(uop)(op, x, p0, p1);
                memcpy(dr + i * d->nb[0], &x, 4);
            }
        }
    }
}

ATTR static void FN(unary)(int op, double p0, double p1, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t items = nrows_of(d) * ((d->ne[0] + CHUNK - 1) / CHUNK);
    if (nth <= 1) { /* on the calling thread alone: see binary */
        FN(unary_items)(op, p0, p1, a, d, 0, items);
        return;
    }
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t it = 0; it < items; it++) FN(unary_items)(op, p0, p1, a, d, it, it + 1);
}

/* ------------------------------------------------------------ copies and conversions */
ATTR static void FN(cpy)(const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    const int same_shape = a->ne[0] == d->ne[0] && a->ne[1] == d->ne[1] && a->ne[2] == d->ne[2] && a->ne[3] == d->ne[3];
    const int same_type = a->type == d->type;
    const int64_t ts = type_size(d->type);
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        float *tmp = (float *)csimd_alloc((size_t)(n0 ? n0 : 1) * 4);
#pragma omp for schedule(static)
        for (int64_t ir = 0; ir < nr; ir++) {
            int64_t i1, i2, i3;
            unravel_row(d, ir, &i1, &i2, &i3);
            char *dr = ELT(d, 0, i1, i2, i3);
            if (same_shape) {
                const char *ar = ELT(a, 0, i1, i2, i3);
                if (same_type) {
                    if (a->nb[0] == ts && d->nb[0] == ts) memcpy(dr, ar, (size_t)(n0 * ts));
                    else for (int64_t i = 0; i < n0; i++) memcpy(dr + i * d->nb[0], ar + i * a->nb[0], (size_t)ts);
                } else if (tmp) {
                    FN(row_to_f32)(tmp, ar, a->type, a->nb[0], n0);
                    FN(row_from_f32)(dr, d->type, d->nb[0], tmp, n0);
                }
            } else {
                /* logical row-major order: unravel the flat index of this row's start in a */
                int64_t f = ((i3 * d->ne[2] + i2) * d->ne[1] + i1) * n0;
                int64_t s0 = f % a->ne[0], s1 = (f / a->ne[0]) % a->ne[1];
                int64_t s2 = (f / (a->ne[0] * a->ne[1])) % a->ne[2], s3 = f / (a->ne[0] * a->ne[1] * a->ne[2]);
                for (int64_t i = 0; i < n0; i++) {
                    const char *p = ELT(a, s0, s1, s2, s3);
                    if (same_type) memcpy(dr + i * d->nb[0], p, (size_t)ts);
                    else store_f32(dr + i * d->nb[0], d->type, load_f32(p, a->type));
                    if (++s0 == a->ne[0]) { s0 = 0; if (++s1 == a->ne[1]) { s1 = 0; if (++s2 == a->ne[2]) { s2 = 0; ++s3; } } }
                }
            }
        }
        free(tmp);
    }
}

/* ------------------------------------------------------------ rows: softmax, norms */
ATTR static float FN(row_max)(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

ATTR static void FN(soft_max)(const csimd_tensor *a, const csimd_tensor *mask, const csimd_tensor *sinks,
                              const csimd_tensor *d,
                              const float *slopes, float scale, int nth) {
    const int64_t n0 = a->ne[0], nr = nrows_of(a);
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        float *x = (float *)csimd_alloc((size_t)(2 * n0 + 16) * 4);
        float *m = x + n0 + 8;
#pragma omp for schedule(static)
        for (int64_t ir = 0; ir < nr; ir++) {
            if (!x) continue;
            int64_t i1, i2, i3;
            unravel_row(a, ir, &i1, &i2, &i3);
            FN(row_to_f32)(x, ELT(a, 0, i1, i2, i3), CSIMD_F32, a->nb[0], n0);
            if (scale != 1.0f) for (int64_t i = 0; i < n0; i++) x[i] *= scale;
            if (mask) {
                const char *mr = ELT(mask, 0, i1 % mask->ne[1], i2 % mask->ne[2], i3 % mask->ne[3]);
                FN(row_to_f32)(m, mr, mask->type, mask->nb[0], n0);
                const float slope = slopes[i2];
                for (int64_t i = 0; i < n0; i++) x[i] += slope * m[i];
            }
            float mx = FN(row_max)(x, n0), sk = 0.0f;
            if (sinks) {
                memcpy(&sk, ELT(sinks, i2, 0, 0, 0), 4);
                mx = sk > mx ? sk : mx;
            }
            double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int64_t i = 0;
            for (; i + VL <= n0; i += VL) {
                VFU *p = (VFU *)(x + i);
                *p = FN(vexp_neg)(*p - mx);
            }
            for (; i < n0; i++) x[i] = expf(x[i] - mx);
            for (i = 0; i + 8 <= n0; i += 8)
                for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j];
            double sum = 0;
            for (; i < n0; i++) sum += x[i];
            for (int j = 0; j < 8; j++) sum += acc[j];
            if (sinks) sum += exp((double)sk - (double)mx);
            const float inv = (float)(1.0 / sum);
            for (i = 0; i < n0; i++) x[i] *= inv;
            FN(row_from_f32)(ELT(d, 0, i1, i2, i3), CSIMD_F32, d->nb[0], x, n0);
        }
        free(x);
    }
}

/* rows r0 .. r1 - 1 of norm; x: a row's scratch (n0 + 16 floats) */
ATTR static void FN(norm_rows)(int rms, float eps, const csimd_tensor *a, const csimd_tensor *d, float *x, int64_t r0,
                               int64_t r1) {
    const int64_t n0 = a->ne[0];
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        unravel_row(a, ir, &i1, &i2, &i3);
        const char *ar = ELT(a, 0, i1, i2, i3);
        const float *xs = (const float *)ar;
        if (a->nb[0] != 4) { FN(row_to_f32)(x, ar, CSIMD_F32, a->nb[0], n0); xs = x; }
        double mean = 0;
        int64_t i;
        if (!rms) {
            double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t = 0;
            for (i = 0; i + 8 <= n0; i += 8)
                for (int j = 0; j < 8; j++) s[j] += (double)xs[i + j];
            for (; i < n0; i++) t += xs[i];
            for (int j = 0; j < 8; j++) t += s[j];
            mean = t / (double)n0;
        }
        double q[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ss = 0;
        for (i = 0; i + 8 <= n0; i += 8)
            for (int j = 0; j < 8; j++) { double c = (double)xs[i + j] - mean; q[j] += c * c; }
        for (; i < n0; i++) { double c = (double)xs[i] - mean; ss += c * c; }
        for (int j = 0; j < 8; j++) ss += q[j];
        double sc;
        if (rms == 2) { /* L2_NORM: x / max(|x|, eps) */
            const double nrm = sqrt(ss);
            sc = 1.0 / (nrm > (double)eps ? nrm : (double)eps);
        } else {
            sc = 1.0 / sqrt(ss / (double)n0 + (double)eps);
        }
        char *dr = ELT(d, 0, i1, i2, i3);
        if (d->nb[0] == 4 && xs != x) {
            float *o = (float *)dr;
            if (rms == 1) { const float f = (float)sc; for (i = 0; i < n0; i++) o[i] = xs[i] * f; }
            else for (i = 0; i < n0; i++) o[i] = (float)(((double)xs[i] - mean) * sc);
        } else {
            if (xs != x) memcpy(x, xs, (size_t)n0 * 4);
            for (i = 0; i < n0; i++) x[i] = (float)(((double)x[i] - mean) * sc);
            FN(row_from_f32)(dr, CSIMD_F32, d->nb[0], x, n0);
        }
    }
}

ATTR static void FN(norm)(int rms, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t n0 = a->ne[0], nr = nrows_of(a);
    if (nth <= 1) { /* on the calling thread alone: see binary */
        float *x = (float *)csimd_alloc((size_t)(n0 + 16) * 4);
        if (x) FN(norm_rows)(rms, eps, a, d, x, 0, nr);
        free(x);
        return;
    }
#pragma omp parallel num_threads(nth)
    {
        float *x = (float *)csimd_alloc((size_t)(n0 + 16) * 4);
#pragma omp for schedule(static)
        for (int64_t ir = 0; ir < nr; ir++)
            if (x) FN(norm_rows)(rms, eps, a, d, x, ir, ir + 1);
        free(x);
    }
}

/* ------------------------------------------------------------ get_rows */
ATTR static void FN(get_rows)(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        float *tmp = (float *)csimd_alloc((size_t)(n0 + 16) * 4);
#pragma omp for schedule(static)
        for (int64_t ir = 0; ir < nr; ir++) {
            if (!tmp) continue;
            int64_t i, j, k;
            unravel_row(d, ir, &i, &j, &k);
            int32_t r;
            memcpy(&r, ELT(idx, i, j, k, 0), 4);
            if (r < 0 || r >= a->ne[1]) continue; /* csimd_get_rows checked; never read outside */
            if (a->type == CSIMD_I32) { /* integer rows are copied exactly */
                for (int64_t e = 0; e < n0; e++) memcpy(ELT(d, e, i, j, k), ELT(a, e, r, j, k), 4);
                continue;
            }
            FN(row_to_f32)(tmp, ELT(a, 0, r, j, k), a->type, a->nb[0], n0);
            FN(row_from_f32)(ELT(d, 0, i, j, k), d->type, d->nb[0], tmp, n0);
        }
        free(tmp);
    }
}

/* ------------------------------------------------------------ cross entropy */
/* one row of the loss (returns sum y log softmax(x)) or of its gradient (out = (softmax(x) - y) gscale) */
/* max + ln sum exp(x - max): x - it <= 0 is the row's log-softmax */
ATTR static float FN(row_lse)(const float *x, int64_t n) {
    const float mx = FN(row_max)(x, n);
    VF acc = (VF){0};
    int64_t i = 0;
    for (; i + VL <= n; i += VL) acc += FN(vexp_neg)(*(const VFU *)(x + i) - mx);
    double s = FN(hsum)(acc);
    for (; i < n; i++) s += exp((double)x[i] - mx);
    return (float)((double)mx + log(s));
}

ATTR static double FN(ce_row)(const float *x, const float *y, float *out, int64_t n, int back, float gscale) {
    const float sh = FN(row_lse)(x, n);
    VF acc;
    int64_t i;
    if (back) {
        for (i = 0; i + VL <= n; i += VL)
            *(VFU *)(out + i) = (FN(vexp_neg)(*(const VFU *)(x + i) - sh) - *(const VFU *)(y + i)) * gscale;
        for (; i < n; i++) out[i] = (float)((exp((double)x[i] - sh) - y[i]) * gscale);
        return 0;
    }
    acc = (VF){0};
    for (i = 0; i + VL <= n; i += VL) acc += *(const VFU *)(y + i) * (*(const VFU *)(x + i) - sh);
    double l = FN(hsum)(acc);
    for (; i < n; i++) l += (double)y[i] * ((double)x[i] - sh);
    return l;
}

/* the row's loss term (or, back, its gradient) for one class index k: a one-hot label row's sparse form */
ATTR static double FN(ce_row_id)(const float *x, int64_t k, float *out, int64_t n, int back, float gscale) {
    const float sh = FN(row_lse)(x, n);
    int64_t i;
    if (!back) return (double)x[k] - sh;
    for (i = 0; i + VL <= n; i += VL) *(VFU *)(out + i) = FN(vexp_neg)(*(const VFU *)(x + i) - sh) * gscale;
    for (; i < n; i++) out[i] = (float)(exp((double)x[i] - sh) * gscale);
    out[k] = (float)((exp((double)x[k] - sh) - 1.0) * gscale);
    return 0;
}

ATTR static void FN(cross_entropy)(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, float g,
                                   int back, int nth) {
    const int64_t n0 = a->ne[0], nr = nrows_of(a), nblk = (nr + SUM_ROWS - 1) / SUM_ROWS;
    const double gscale = (double)g / (double)nr;
    double *part = back ? NULL : (double *)malloc((size_t)(nblk ? nblk : 1) * 8), total = 0;
    if (!back && !part) nth = 1; /* the blocks summed in order as they come: the same bits */
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        float *x = (float *)csimd_alloc((size_t)(3 * n0 + 32) * 4);
        float *y = x + n0 + 8, *o = y + n0 + 8;
#pragma omp for schedule(static)
        for (int64_t ib = 0; ib < nblk; ib++) {
            if (!x) continue;
            double s = 0;
            for (int64_t ir = ib * SUM_ROWS; ir < nr && ir < (ib + 1) * SUM_ROWS; ir++) {
                int64_t i1, i2, i3;
                unravel_row(a, ir, &i1, &i2, &i3);
                FN(row_to_f32)(x, ELT(a, 0, i1, i2, i3), CSIMD_F32, a->nb[0], n0);
                if (b->type == CSIMD_I32) { /* one class index per row, checked by csimd_cross_entropy */
                    s += FN(ce_row_id)(x, load_index(ELT(b, i1, i2, i3, 0), b->type), o, n0, back, (float)gscale);
                } else {
                    FN(row_to_f32)(y, ELT(b, 0, i1, i2, i3), CSIMD_F32, b->nb[0], n0);
                    s += FN(ce_row)(x, y, o, n0, back, (float)gscale);
                }
                if (back) FN(row_from_f32)(ELT(d, 0, i1, i2, i3), CSIMD_F32, d->nb[0], o, n0);
            }
            if (part) part[ib] = s;
            else total += s;
        }
        free(x);
    }
    if (!back) {
        if (part)
            for (int64_t ib = 0; ib < nblk; ib++) total += part[ib];
        float v = (float)(-total / (double)nr);
        memcpy(d->data, &v, 4);
    }
    free(part);
}

/* ------------------------------------------------------------ optimizer steps (elementwise, in place)
   In float32 as ggml: AdamW m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
   w = w (1 - alpha wd) - alpha (m b1h) / (sqrt(v b2h) + eps); SGD w = w (1 - alpha wd) - alpha g.
   p: alpha, beta1, beta2, eps, wd, beta1h, beta2h (SGD: alpha, wd). */
ATTR static void FN(adamw_contig)(const float *p, float *w, const float *a, const float *g, float *m, float *v,
                                  int64_t n) {
    const float alpha = p[0], b1 = p[1], b2 = p[2], eps = p[3], keep = 1.0f - p[0] * p[4], b1h = p[5], b2h = p[6];
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        const VF gv = *(const VFU *)(g + i);
        const VF mv = *(VFU *)(m + i) * b1 + gv * (1.0f - b1);
        const VF vv = *(VFU *)(v + i) * b2 + gv * gv * (1.0f - b2);
        VF den = vv * b2h;
#pragma GCC unroll 16
        for (int j = 0; j < VL; j++) den[j] = sqrtf(den[j]);
        *(VFU *)(m + i) = mv;
        *(VFU *)(v + i) = vv;
        *(VFU *)(w + i) = *(const VFU *)(a + i) * keep - alpha * (mv * b1h) / (den + eps);
    }
    for (; i < n; i++) {
        const float gi = g[i], mi = m[i] * b1 + gi * (1.0f - b1), vi = v[i] * b2 + gi * gi * (1.0f - b2);
        m[i] = mi;
        v[i] = vi;
        w[i] = a[i] * keep - alpha * (mi * b1h) / (sqrtf(vi * b2h) + eps);
    }
}

ATTR static void FN(opt_step)(int adamw, const float *p, const csimd_tensor *a, const csimd_tensor *g,
                              const csimd_tensor *m, const csimd_tensor *v, const csimd_tensor *d, int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    const int contig = a->nb[0] == 4 && g->nb[0] == 4 && m->nb[0] == 4 && v->nb[0] == 4 && d->nb[0] == 4;
    const float keep = 1.0f - p[0] * (adamw ? p[4] : p[1]);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        if (adamw && contig) {
            FN(adamw_contig)(p, (float *)ELT(d, 0, i1, i2, i3), (const float *)ELT(a, 0, i1, i2, i3),
                             (const float *)ELT(g, 0, i1, i2, i3), (float *)ELT(m, 0, i1, i2, i3),
                             (float *)ELT(v, 0, i1, i2, i3), n0);
            continue;
        }
        if (contig) {
            float *w = (float *)ELT(d, 0, i1, i2, i3);
            const float *x = (const float *)ELT(a, 0, i1, i2, i3), *gr = (const float *)ELT(g, 0, i1, i2, i3);
            for (int64_t i = 0; i < n0; i++) w[i] = x[i] * keep - p[0] * gr[i];
            continue;
        }
        for (int64_t i = 0; i < n0; i++) {
            float x, gr, out;
            memcpy(&x, ELT(a, i, i1, i2, i3), 4);
            memcpy(&gr, ELT(g, i, i1, i2, i3), 4);
            if (adamw) {
                float mv, vv;
                memcpy(&mv, ELT(m, i, i1, i2, i3), 4);
                memcpy(&vv, ELT(v, i, i1, i2, i3), 4);
                mv = mv * p[1] + gr * (1.0f - p[1]);
                vv = vv * p[2] + gr * gr * (1.0f - p[2]);
                memcpy(ELT(m, i, i1, i2, i3), &mv, 4);
                memcpy(ELT(v, i, i1, i2, i3), &vv, 4);
                out = x * keep - p[0] * (mv * p[5]) / (sqrtf(vv * p[6]) + p[3]);
            } else {
                out = x * keep - p[0] * gr;
            }
            memcpy(ELT(d, i, i1, i2, i3), &out, 4);
        }
    }
}

/* ------------------------------------------------------------ mul_mat: packed, cache-blocked GEMM
   C (N x M, row stride ldc floats) = B (N x K) * A^T, A is M x K; both read through byte strides.
   A^T is packed in panels of NR columns ([k][NR]), B in panels of MR rows ([k][MR]). */
#define KC 256 /* K block of the small-N kernel below */

#if ISA_LEVEL >= 1
/* VL rows of VL floats (rows from nv on read as zeros) written transposed: column l of the block
   goes to dst + l * ldd, its first ns values. Packing F32 rows this way costs a few shuffles per
   vector instead of one scalar store per element. */
ATTR static inline void FN(transpose_block)(float *restrict dst, int64_t ldd, const float *const *rows, int nv,
                                            int ns) {
#if ISA_LEVEL == 2
    __m512 r[16], t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = i < nv ? _mm512_loadu_ps(rows[i]) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512d a0 = _mm512_castps_pd(t[4 * i]), a1 = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d a2 = _mm512_castps_pd(t[4 * i + 2]), a3 = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    const __mmask16 mk = (__mmask16)((1u << ns) - 1u);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* a 4 x 4 transpose of 128-bit lanes */
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        _mm512_mask_storeu_ps(dst + (0 + c) * ldd, mk, _mm512_shuffle_f32x4(v0, v2, 0x88));
        _mm512_mask_storeu_ps(dst + (4 + c) * ldd, mk, _mm512_shuffle_f32x4(v0, v2, 0xDD));
        _mm512_mask_storeu_ps(dst + (8 + c) * ldd, mk, _mm512_shuffle_f32x4(v1, v3, 0x88));
        _mm512_mask_storeu_ps(dst + (12 + c) * ldd, mk, _mm512_shuffle_f32x4(v1, v3, 0xDD));
    }
#else
    __m256 r[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r[i] = i < nv ? _mm256_loadu_ps(rows[i]) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        const __m256d a0 = _mm256_castps_pd(t[4 * i]), a1 = _mm256_castps_pd(t[4 * i + 1]);
        const __m256d a2 = _mm256_castps_pd(t[4 * i + 2]), a3 = _mm256_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm256_castpd_ps(_mm256_unpacklo_pd(a0, a2));
        u[4 * i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a0, a2));
        u[4 * i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(a1, a3));
        u[4 * i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(a1, a3));
    }
    const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(ns), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        _mm256_maskstore_ps(dst + c * ldd, mk, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
        _mm256_maskstore_ps(dst + (4 + c) * ldd, mk, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
    }
#endif
}
#endif

ATTR static void FN(pack_a)(float *restrict dst, const char *a, int at, int64_t snm, int64_t snk,
                            int64_t m0, int64_t mn, int64_t k0, int64_t kc) {
    /* panel of NR columns m0..m0+NR (zero past mn) */
    if (at == CSIMD_F32 && snk == 4) {
        int64_t kv = 0;
#if ISA_LEVEL >= 1
        /* VL k at a time: NR / VL transposed blocks of VL rows */
        for (; kv + VL <= kc; kv += VL)
            for (int64_t j0 = 0; j0 < NR; j0 += VL) {
                const float *rows[VL];
                const int nv = mn - j0 < 0 ? 0 : mn - j0 > VL ? VL : (int)(mn - j0);
                for (int i = 0; i < nv; i++) rows[i] = (const float *)(a + (m0 + j0 + i) * snm + (k0 + kv) * snk);
                FN(transpose_block)(dst + kv * NR + j0, NR, rows, nv, VL);
            }
#endif
        /* blocks of 16 k: the 16 destination rows stay in L1 while the NR sources stream */
        for (int64_t kb = kv; kb < kc; kb += 16) {
            const int64_t ke = kc - kb < 16 ? kc - kb : 16;
            for (int64_t j = 0; j < NR; j++) {
                if (j < mn) {
                    const float *r = (const float *)(a + (m0 + j) * snm + (k0 + kb) * snk);
                    for (int64_t k = 0; k < ke; k++) dst[(kb + k) * NR + j] = r[k];
                } else {
                    for (int64_t k = 0; k < ke; k++) dst[(kb + k) * NR + j] = 0.0f;
                }
            }
        }
        return;
    }
    if (at == CSIMD_F32 && snm == 4) {
        /* transposed (OUT_PROD's a): each k holds the panel's NR values side by side */
        for (int64_t k = 0; k < kc; k++) {
            const float *r = (const float *)(a + (k0 + k) * snk + m0 * snm);
            float *o = dst + k * NR;
            int64_t j = 0;
            for (; j < mn; j++) o[j] = r[j];
            for (; j < NR; j++) o[j] = 0.0f;
        }
        return;
    }
    for (int64_t j = 0; j < NR; j++) {
        if (j < mn) {
            const char *row = a + (m0 + j) * snm + k0 * snk;
            for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = load_f32(row + k * snk, at);
        } else {
            for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = 0.0f;
        }
    }
}

ATTR static void FN(pack_b)(float *restrict dst, const char *b, int bt, int64_t snn, int64_t snk,
                            int64_t n0, int64_t nn, int64_t k0, int64_t kc) {
    if (bt == CSIMD_F32 && snn == 4 && snk != 4) {
        /* transposed (OUT_PROD's b): each k holds the panel's MR values side by side */
        for (int64_t k = 0; k < kc; k++) {
            const float *r = (const float *)(b + (k0 + k) * snk + n0 * snn);
            float *o = dst + k * MR;
            int64_t i = 0;
            for (; i < nn; i++) o[i] = r[i];
            for (; i < MR; i++) o[i] = 0.0f;
        }
        return;
    }
#if ISA_LEVEL >= 1
    if (bt == CSIMD_F32 && snk == 4 && MR <= VL) {
        /* VL k at a time: one transposed block of the sliver's MR rows, then the scalar tail */
        int64_t kv = 0;
        const float *rows[VL];
        for (int64_t i = 0; i < nn; i++) rows[i] = (const float *)(b + (n0 + i) * snn + k0 * snk);
        for (; kv + VL <= kc; kv += VL) {
            FN(transpose_block)(dst + kv * MR, MR, rows, (int)nn, MR);
            for (int64_t i = 0; i < nn; i++) rows[i] += VL;
        }
        for (int64_t i = 0; i < MR; i++)
            for (int64_t k = kv; k < kc; k++) dst[k * MR + i] = i < nn ? rows[i][k - kv] : 0.0f;
        return;
    }
#endif
    for (int64_t i = 0; i < MR; i++) {
        if (i < nn) {
            const char *row = b + (n0 + i) * snn + k0 * snk;
            if (bt == CSIMD_F32 && snk == 4) {
                const float *r = (const float *)row;
                for (int64_t k = 0; k < kc; k++) dst[k * MR + i] = r[k];
            } else {
                for (int64_t k = 0; k < kc; k++) dst[k * MR + i] = load_f32(row + k * snk, bt);
            }
        } else {
            for (int64_t k = 0; k < kc; k++) dst[k * MR + i] = 0.0f;
        }
    }
}

#define NV (NR / VL)
/* C tile element (r, j) at C[r * ldc + j * cs]: cs = 1, or the result written transposed (cs = ldc of
   the real result, ldc = 1) when the operands were swapped */
ATTR static void FN(micro)(int64_t kc, const float *restrict Ap, const float *restrict Bp, float *C, int64_t ldc,
                           int64_t cs, int first, int64_t mr, int64_t nr) {
    VF c[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = (VF){0};
    for (int64_t k = 0; k < kc; k++) {
        VF av[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) av[v] = *(const VF *)(Ap + k * NR + v * VL);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            const float bb = Bp[k * MR + r];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] += av[v] * bb;
        }
    }
    if (mr == MR && nr == NR && cs == 1) {
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                VFU *p = (VFU *)(C + r * ldc + v * VL);
                if (first) *p = c[r][v]; else *p += c[r][v];
            }
    } else {
        float t[MR][NR] __attribute__((aligned(64)));
        for (int r = 0; r < MR; r++)
            for (int v = 0; v < NV; v++) *(VF *)(&t[r][v * VL]) = c[r][v];
        for (int64_t r = 0; r < mr; r++)
            for (int64_t j = 0; j < nr; j++) {
                if (first) C[r * ldc + j * cs] = t[r][j]; else C[r * ldc + j * cs] += t[r][j];
            }
    }
}

/* cache blocking for this path's micro-tile from the machine's caches: B's sliver (MR x KC) and
   A's panel (KC x NR) together take about 2/3 of L1; a thread's packed A block (KC x NC) about half
   of its L2; each of the two shared packed B blocks (NB x KC) an eighth of L3 (other cores and
   processes share it). K is cut into equal blocks, so the last one is not a sliver. */
ATTR static void FN(gemm_blocking)(int64_t K, int64_t *kc, int64_t *nc, int64_t *nb) {
    int64_t k = csimd_cache_bytes(1) * 2 / 3 / ((NR + MR) * 4) / 16 * 16;
    k = k < 64 ? 64 : k > 1024 ? 1024 : k;
    const int64_t nkb = K > 0 ? (K + k - 1) / k : 1;
    k = (K + nkb - 1) / nkb;
    *kc = k < 1 ? 1 : k;
    const int64_t n = csimd_cache_bytes(2) / 2 / (*kc * 4) / NR * NR;
    *nc = n < NR ? NR : n > 4096 ? 4096 : n;
    const int64_t r = csimd_cache_bytes(3) / 8 / (*kc * 4) / MR * MR;
    *nb = r < 8 * MR ? 8 * MR : r > 65536 / MR * MR ? 65536 / MR * MR : r;
}

/* C (N x M) = B A^T. Each thread owns a fixed range of A's NR-column panels, so of C's columns (no
   two threads write one element, and each sum runs over K in the same order whatever the thread
   count). For each block of KC of K and NB rows of B, the threads pack that block of B together
   (slivers split between them) into one of two shared buffers and meet at a single barrier (two
   buffers: the next block goes into the one every thread had finished with before this barrier).
   Each thread then packs its columns of A, NC at a time, into its own buffer (L2) and runs the
   micro-kernel with B's sliver in L1 against each of its A panels. */
ATTR static int FN(gemm)(const char *a, int at, int64_t anm, int64_t ank, const char *b, int bt, int64_t bnn,
                         int64_t bnk, float *C, int64_t ldc, int64_t cs, int64_t M, int64_t N, int64_t K, int nth) {
    if (K == 0) {
        for (int64_t n = 0; n < N; n++) for (int64_t m = 0; m < M; m++) C[n * ldc + m * cs] = 0.0f;
        return 0;
    }
    int64_t KCB, NCB, NBB;
    FN(gemm_blocking)(K, &KCB, &NCB, &NBB);
    if (nth < 1) nth = 1;
    const int64_t panels = (M + NR - 1) / NR;
    if (nth > panels) nth = (int)panels;
    const int64_t per = (panels + nth - 1) / nth * NR; /* columns of the busiest thread */
    const int64_t njb = (per + NCB - 1) / NCB;         /* its columns in equal blocks, as K */
    NCB = ((per + njb - 1) / njb + NR - 1) / NR * NR;
    const int64_t nbb = (N + NBB - 1) / NBB;
    NBB = ((N + nbb - 1) / nbb + MR - 1) / MR * MR;
    /* sizes in whole cache lines: A's buffers after B's stay aligned for the vector loads */
    const size_t bsz = ((size_t)NBB * KCB + 15) / 16 * 16, asz = ((size_t)NCB * KCB + 15) / 16 * 16;
    float *Bpack = (float *)csimd_alloc((2 * bsz + (size_t)nth * asz) * 4);
    if (!Bpack) return -2;
    float *Apacks = Bpack + 2 * bsz;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int tid = 0, nt = 1;
#endif
        float *Ap = Apacks + (size_t)tid * asz;
        const int64_t c0 = panels * tid / nt * NR, c1m = panels * (tid + 1) / nt * NR, c1 = c1m < M ? c1m : M;
        int64_t step = 0;
        for (int64_t pc = 0; pc < K; pc += KCB) {
            const int64_t kc = K - pc < KCB ? K - pc : KCB;
            for (int64_t ic = 0; ic < N; ic += NBB, step++) {
                const int64_t mc = N - ic < NBB ? N - ic : NBB, pb = (mc + MR - 1) / MR;
                float *Bb = Bpack + (step & 1) * bsz;
                for (int64_t q = pb * tid / nt; q < pb * (tid + 1) / nt; q++) {
                    const int64_t n0 = ic + q * MR, nn = N - n0 < MR ? N - n0 : MR;
                    FN(pack_b)(Bb + q * kc * MR, b, bt, bnn, bnk, n0, nn, pc, kc);
                }
#pragma omp barrier
                for (int64_t jc = c0; jc < c1; jc += NCB) {
                    const int64_t nc = c1 - jc < NCB ? c1 - jc : NCB, pa = (nc + NR - 1) / NR;
                    for (int64_t p = 0; p < pa; p++) {
                        const int64_t m0 = jc + p * NR, mn = M - m0 < NR ? M - m0 : NR;
                        FN(pack_a)(Ap + p * kc * NR, a, at, anm, ank, m0, mn, pc, kc);
                    }
                    for (int64_t q = 0; q < pb; q++) {
                        const int64_t n0 = ic + q * MR, nn = N - n0 < MR ? N - n0 : MR;
                        for (int64_t p = 0; p < pa; p++) {
                            const int64_t m0 = jc + p * NR, mn = M - m0 < NR ? M - m0 : NR;
                            FN(micro)(kc, Ap + p * kc * NR, Bb + q * kc * MR, C + n0 * ldc + m0 * cs, ldc, cs,
                                      pc == 0, nn, mn);
                        }
                    }
                }
            }
        }
    }
    free(Bpack);
    return 0;
}

/* small N (a few dozen rows of b): b packed once, whole, then the threads split M in panels of NR
   columns, each packing its own panels of A; a single barrier, so the result does not depend on
   how fast sleeping OpenMP workers wake up */
ATTR static int FN(gemm_small_n)(const char *a, int at, int64_t anm, int64_t ank, const char *b, int bt, int64_t bnn,
                                 int64_t bnk, float *C, int64_t ldc, int64_t cs, int64_t M, int64_t N, int64_t K,
                                 int nth) {
    const int64_t pb = (N + MR - 1) / MR, pa = (M + NR - 1) / NR;
    float *Bpack = (float *)csimd_alloc((size_t)pb * (size_t)K * MR * 4);
    if (!Bpack) return -2;
    int failed = 0;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < pb; q++) {
            const int64_t n0 = q * MR, nn = N - n0 < MR ? N - n0 : MR;
            FN(pack_b)(Bpack + q * K * MR, b, bt, bnn, bnk, n0, nn, 0, K);
        }
        float *Ap = (float *)csimd_alloc((size_t)KC * NR * 4);
        if (!Ap) failed = 1;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pa; p++) {
            if (!Ap) continue;
            const int64_t m0 = p * NR, mn = M - m0 < NR ? M - m0 : NR;
            for (int64_t pc = 0; pc < K; pc += KC) {
                const int64_t kc = K - pc < KC ? K - pc : KC;
                FN(pack_a)(Ap, a, at, anm, ank, m0, mn, pc, kc);
                for (int64_t q = 0; q < pb; q++) {
                    const int64_t n0 = q * MR, nn = N - n0 < MR ? N - n0 : MR;
                    FN(micro)(kc, Ap, Bpack + q * K * MR + pc * MR, C + n0 * ldc + m0 * cs, ldc, cs, pc == 0, nn,
                              mn);
                }
            }
        }
        free(Ap);
    }
    free(Bpack);
    return failed ? -2 : 0;
}

/* few rows of b (N small): dot products straight from memory, no packing; parallel over M */
ATTR static float FN(dot)(const float *restrict x, const float *restrict y, int64_t n) {
    VF acc[4] = {{0}, {0}, {0}, {0}};
    int64_t i = 0;
    for (; i + 4 * VL <= n; i += 4 * VL)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[j] += *(const VFU *)(x + i + j * VL) * *(const VFU *)(y + i + j * VL);
    for (; i + VL <= n; i += VL) acc[0] += *(const VFU *)(x + i) * *(const VFU *)(y + i);
    VF t = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    double s = 0;
    for (int j = 0; j < VL; j++) s += t[j];
    for (; i < n; i++) s += (double)x[i] * y[i];
    return (float)s;
}

/* GR rows of a against one row of b: a streamed once per row of b, b shared from registers/L1 */
#ifndef GR
#define GR 8
#endif
#ifndef GU
#define GU 2
#endif
ATTR static void FN(gemvr)(const char *a, int64_t anm, const float *restrict y, float *out, int64_t K) {
    const float *restrict r[GR];
    VF c[GR][GU];
#pragma GCC unroll 16
    for (int j = 0; j < GR; j++) {
        r[j] = (const float *)(a + j * anm);
#pragma GCC unroll 4
        for (int u = 0; u < GU; u++) c[j][u] = (VF){0};
    }
    int64_t i = 0;
    for (; i + GU * VL <= K; i += GU * VL) {
        VF yv[GU];
#pragma GCC unroll 4
        for (int u = 0; u < GU; u++) yv[u] = *(const VFU *)(y + i + u * VL);
#pragma GCC unroll 16
        for (int j = 0; j < GR; j++)
#pragma GCC unroll 4
            for (int u = 0; u < GU; u++) c[j][u] += *(const VFU *)(r[j] + i + u * VL) * yv[u];
    }
    for (; i + VL <= K; i += VL) {
        const VF y0 = *(const VFU *)(y + i);
#pragma GCC unroll 16
        for (int j = 0; j < GR; j++) c[j][0] += *(const VFU *)(r[j] + i) * y0;
    }
#pragma GCC unroll 16
    for (int j = 0; j < GR; j++) {
        VF t = c[j][0];
#pragma GCC unroll 4
        for (int u = 1; u < GU; u++) t += c[j][u];
        float sj = FN(hsum)(t);
        for (int64_t q = i; q < K; q++) sj += r[j][q] * y[q];
        out[j] = sj;
    }
}

ATTR static void FN(gemv)(const char *a, int64_t anm, const char *b, int64_t bnn, float *C, int64_t ldc, int64_t M,
                          int64_t N, int64_t K, int nth) {
    (void)nth;
    const int64_t mb = M / GR;
    /* rows of a split evenly over the threads in blocks of GR; a is read once per row of b */
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t q = 0; q < mb; q++) {
        const int64_t m = q * GR;
        for (int64_t n = 0; n < N; n++) {
            float o[GR];
            FN(gemvr)(a + m * anm, anm, (const float *)(b + n * bnn), o, K);
            for (int j = 0; j < GR; j++) C[n * ldc + m + j] = o[j];
        }
    }
    for (int64_t m = mb * GR; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            C[n * ldc + m] = FN(dot)((const float *)(a + m * anm), (const float *)(b + n * bnn), K);
}
#undef GR
#undef GU

/* A few F32 rows of b against F16 rows of a (an F16 KV cache times the queries or the attention
   weights of one token): each row of a widened once (F16C) and dotted; no packed panels, whose
   micro-tiles would be mostly padding at this width */
ATTR static int FN(gemv_h)(const char *a, int64_t anm, const char *b, int64_t bnn, float *C, int64_t ldc, int64_t M,
                           int64_t N, int64_t K, int nth) {
    int failed = 0;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
        float *row = (float *)csimd_alloc((size_t)(K + 16) * 4);
        failed |= !row;
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            if (!row) continue;
            FN(row_to_f32)(row, a + m * anm, CSIMD_F16, 2, K);
            for (int64_t n = 0; n < N; n++) C[n * ldc + m] = FN(dot)(row, (const float *)(b + n * bnn), K);
        }
        free(row);
    }
    return failed ? -2 : 0;
}

/* C[n * ldc + m] = sum_k B[n][k] A[m][k] for one matrix pair (mul_mat and out_prod): the kernel
   that suits the shape. A small M against a larger N swaps the operands and writes the result
   transposed, so the narrow side is the one packed whole and the micro-tile is not mostly padding. */
ATTR static int FN(gemm_any)(const char *a, int at, int64_t anm, int64_t ank, const char *b, int bt, int64_t bnn,
                             int64_t bnk, float *C, int64_t ldc, int64_t M, int64_t N, int64_t K, int nth) {
    if (N <= 4 && at == CSIMD_F32 && bt == CSIMD_F32 && ank == 4 && bnk == 4) {
        FN(gemv)(a, anm, b, bnn, C, ldc, M, N, K, nth);
        return 0;
    }
    if (N <= 4 && at == CSIMD_F16 && bt == CSIMD_F32 && ank == 2 && bnk == 4)
        return FN(gemv_h)(a, anm, b, bnn, C, ldc, M, N, K, nth);
    if (K > 0 && M < NR && N > M && M * K <= ((int64_t)1 << 24))
        return FN(gemm_small_n)(b, bt, bnn, bnk, a, at, anm, ank, C, 1, ldc, N, M, K, nth);
    if (N <= 64 && K > 0 && K * ((N + MR - 1) / MR * MR) <= ((int64_t)1 << 24))
        return FN(gemm_small_n)(a, at, anm, ank, b, bt, bnn, bnk, C, ldc, 1, M, N, K, nth);
    return FN(gemm)(a, at, anm, ank, b, bt, bnn, bnk, C, ldc, 1, M, N, K, nth);
}

/* every matrix pair of d = b * a^T, a's blocks broadcast over b's dims 2, 3 (ggml): rows of a at
   stride `ar` with elements at `ak` (and likewise `br`, `bk` for b), K the summed extent */
ATTR static int FN(gemm_blocks)(const csimd_tensor *a, int64_t ar, int64_t ak, const csimd_tensor *b, int64_t br,
                                int64_t bk, const csimd_tensor *d, int64_t M, int64_t N, int64_t K, int nth) {
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    if ((double)M * (double)N * (double)K < 65536.0 * 4) nth = 1;
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < d->ne[2]; i2++) {
            const char *ap = a->data + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3];
            const char *bp = b->data + i2 * b->nb[2] + i3 * b->nb[3];
            float *dp = (float *)(d->data + i2 * d->nb[2] + i3 * d->nb[3]);
            const int rc = FN(gemm_any)(ap, a->type, ar, ak, bp, b->type, br, bk, dp, d->nb[1] / 4, M, N, K, nth);
            if (rc) return rc;
        }
    return 0;
}

ATTR static int FN(mul_mat)(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    if ((a->type == CSIMD_F16 || a->type == CSIMD_BF16) && b->type == CSIMD_F32) {
        /* ggml's CPU converts b to an F16/BF16 a's type (its vec_dot_type) before the products */
        const int64_t K = b->ne[0], nr = b->ne[1] * b->ne[2] * b->ne[3];
        csimd_tensor r = *b; /* b's values rounded to a's type, held as F32 (contiguous rows) */
        r.nb[0] = 4; r.nb[1] = 4 * K; r.nb[2] = r.nb[1] * b->ne[1]; r.nb[3] = r.nb[2] * b->ne[2];
        r.data = (char *)csimd_alloc((size_t)(nr * K * 4 + 64));
        uint16_t *half = (uint16_t *)csimd_alloc((size_t)(K + 16) * 2);
        if (!r.data || !half) { free(r.data); free(half); return -2; }
        for (int64_t ir = 0; ir < nr; ir++) {
            int64_t i1, i2, i3;
            unravel_row(b, ir, &i1, &i2, &i3);
            float *dst = (float *)(r.data + ir * r.nb[1]);
            FN(row_to_f32)(dst, ELT(b, 0, i1, i2, i3), CSIMD_F32, b->nb[0], K);
            FN(row_from_f32)((char *)half, a->type, 2, dst, K);
            FN(row_to_f32)(dst, (const char *)half, a->type, 2, K);
        }
        free(half);
        const int rc = FN(gemm_blocks)(a, a->nb[1], a->nb[0], &r, r.nb[1], r.nb[0], d, a->ne[1], b->ne[1], a->ne[0], nth);
        free(r.data);
        return rc;
    }
    return FN(gemm_blocks)(a, a->nb[1], a->nb[0], b, b->nb[1], b->nb[0], d, a->ne[1], b->ne[1], a->ne[0], nth);
}


/* ------------------------------------------------------------ repeat, reductions, backward rows */
ATTR static void FN(repeat)(const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d), ts = type_size(d->type), an = a->ne[0];
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        char *dr = ELT(d, 0, i1, i2, i3);
        const char *ar = ELT(a, 0, i1 % a->ne[1], i2 % a->ne[2], i3 % a->ne[3]);
        if (ts == 4 && d->nb[0] == 4 && a->nb[0] == 4) {
            uint32_t *o = (uint32_t *)dr;
            const uint32_t *s = (const uint32_t *)ar;
            for (int64_t i = 0; i < n0; i++) o[i] = s[i % an];
        } else {
            for (int64_t i = 0; i < n0; i++) memcpy(dr + i * d->nb[0], ar + (i % an) * a->nb[0], (size_t)ts);
        }
    }
}

ATTR static double FN(row_sum)(const float *x, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j];
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

/* op 0: SUM (all elements), 1: SUM_ROWS, 2: MEAN (per row) */
ATTR static void FN(reduce)(int op, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t n0 = a->ne[0], nr = nrows_of(a), nblk = (nr + SUM_ROWS - 1) / SUM_ROWS;
    double *part = op == 0 ? (double *)malloc((size_t)(nblk ? nblk : 1) * 8) : NULL, total = 0;
    if (op == 0 && !part) nth = 1; /* the blocks summed in order as they come: the same bits */
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        float *x = (float *)csimd_alloc((size_t)(n0 + 16) * 4);
#pragma omp for schedule(static)
        for (int64_t ib = 0; ib < nblk; ib++) {
            if (!x) continue;
            double blk = 0;
            for (int64_t ir = ib * SUM_ROWS; ir < nr && ir < (ib + 1) * SUM_ROWS; ir++) {
                int64_t i1, i2, i3;
                unravel_row(a, ir, &i1, &i2, &i3);
                FN(row_to_f32)(x, ELT(a, 0, i1, i2, i3), a->type, a->nb[0], n0);
                const double s = FN(row_sum)(x, n0);
                if (op == 0) blk += s;
                else store_f32(ELT(d, 0, i1, i2, i3), d->type, (float)(op == 2 ? s / (double)n0 : s));
            }
            if (part) part[ib] = blk;
            else total += blk;
        }
        free(x);
    }
    if (op == 0) {
        if (part)
            for (int64_t ib = 0; ib < nblk; ib++) total += part[ib];
        store_f32(d->data, d->type, (float)total);
    }
    free(part);
}

ATTR static int FN(repeat_back)(const csimd_tensor *a, const csimd_tensor *d) {
    const int64_t dn = d->ne[0] * d->ne[1] * d->ne[2] * d->ne[3], n0 = a->ne[0], nr = nrows_of(a);
    double *acc = (double *)calloc((size_t)(dn ? dn : 1), sizeof(double));
    if (!acc) return -2;
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(a, ir, &i1, &i2, &i3);
        const char *ar = ELT(a, 0, i1, i2, i3);
        double *o = acc + (((i3 % d->ne[3]) * d->ne[2] + (i2 % d->ne[2])) * d->ne[1] + (i1 % d->ne[1])) * d->ne[0];
        if (a->type == CSIMD_F32 && a->nb[0] == 4 && d->ne[0] == n0) { /* whole rows add up */
            const float *x = (const float *)ar;
            for (int64_t i = 0; i < n0; i++) o[i] += x[i];
        } else {
            for (int64_t i = 0; i < n0; i++) o[i % d->ne[0]] += load_f32(ar + i * a->nb[0], a->type);
        }
    }
    for (int64_t ir = 0; ir < nrows_of(d); ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        char *dr = ELT(d, 0, i1, i2, i3);
        for (int64_t i = 0; i < d->ne[0]; i++) store_f32(dr + i * d->nb[0], d->type, (float)acc[ir * d->ne[0] + i]);
    }
    free(acc);
    return 0;
}

/* op 0: SOFT_MAX_BACK (a = dy, b = y, p = scale); 1: RMS_NORM_BACK (a = dz, b = x, p = eps) */
ATTR static void FN(rows_back)(int op, float p, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d,
                               int nth) {
    const int64_t n0 = a->ne[0], nr = nrows_of(a);
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        float *x = (float *)csimd_alloc((size_t)(2 * n0 + 16) * 4);
        float *y = x + n0 + 8;
#pragma omp for schedule(static)
        for (int64_t ir = 0; ir < nr; ir++) {
            if (!x) continue;
            int64_t i1, i2, i3;
            unravel_row(a, ir, &i1, &i2, &i3);
            FN(row_to_f32)(x, ELT(a, 0, i1, i2, i3), CSIMD_F32, a->nb[0], n0);
            FN(row_to_f32)(y, ELT(b, 0, i1, i2, i3), CSIMD_F32, b->nb[0], n0);
            if (op == 0) {
                double dot = 0;
                for (int64_t i = 0; i < n0; i++) dot += (double)x[i] * y[i];
                for (int64_t i = 0; i < n0; i++) x[i] = (float)((double)p * y[i] * ((double)x[i] - dot));
            } else {
                double sxx = 0, sxd = 0;
                for (int64_t i = 0; i < n0; i++) { sxx += (double)y[i] * y[i]; sxd += (double)y[i] * x[i]; }
                const double rrms = 1.0 / sqrt(sxx / (double)n0 + (double)p), f = sxd / (sxx + (double)n0 * p);
                for (int64_t i = 0; i < n0; i++) x[i] = (float)(((double)x[i] - (double)y[i] * f) * rrms);
            }
            FN(row_from_f32)(ELT(d, 0, i1, i2, i3), CSIMD_F32, d->nb[0], x, n0);
        }
        free(x);
    }
}

ATTR static void FN(diag_mask)(int inf, int64_t n_past, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    const float fill = inf ? -INFINITY : 0.0f;
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        char *dr = ELT(d, 0, i1, i2, i3);
        const char *ar = ELT(a, 0, i1, i2, i3);
        for (int64_t i = 0; i < n0; i++) {
            float v;
            memcpy(&v, ar + i * a->nb[0], 4);
            if (i > n_past + i1) v = fill;
            memcpy(dr + i * d->nb[0], &v, 4);
        }
    }
}

ATTR static void FN(get_rows_back)(const csimd_tensor *g, const csimd_tensor *idx, const csimd_tensor *d) {
    for (int64_t r = 0; r < d->ne[1]; r++)
        for (int64_t i = 0; i < d->ne[0]; i++) store_f32(ELT(d, i, r, 0, 0), d->type, 0.0f);
    for (int64_t j = 0; j < g->ne[1]; j++) {
        int32_t r;
        memcpy(&r, ELT(idx, j, 0, 0, 0), 4);
        if (r < 0 || r >= d->ne[1]) continue;
        for (int64_t i = 0; i < d->ne[0]; i++) {
            char *p = ELT(d, i, r, 0, 0);
            store_f32(p, d->type, load_f32(p, d->type) + load_f32(ELT(g, i, j, 0, 0), g->type));
        }
    }
}

ATTR static int FN(out_prod)(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    /* out[j][i] = sum_t b[t][j] a[t][i]: the GEMM with N = b.ne0, M = a.ne0, K = a.ne1, both read transposed */
    return FN(gemm_blocks)(a, a->nb[0], a->nb[1], b, b->nb[0], b->nb[1], d, a->ne[0], b->ne[0], a->ne[1], nth);
}

#if ISA_LEVEL >= 1
/* GEGLU over contiguous F32: the tanh GELU read from ggml's F16 table (csimd_set_gelu_tables) for VL values
   at once, F16C rounding the indices and a gather reading the table, then times the gate. The float product
   is the double form's (two floats multiply exactly in double, then one rounding). Returns the count done. */
ATTR static int64_t FN(geglu_f32)(float *d, const float *x, const float *g, int64_t n) {
    const float *tab = csimd_gelu_f16;
    int64_t i = 0;
#if ISA_LEVEL == 2
    const __m512 lo = _mm512_set1_ps(-CSIMD_GELU_CLAMP), hi = _mm512_set1_ps(CSIMD_GELU_CLAMP);
    for (; i + 16 <= n; i += 16) {
        const __m512 xv = _mm512_loadu_ps(x + i);
        const __m512i ix = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(xv, _MM_FROUND_TO_NEAREST_INT));
        const __mmask16 big = _mm512_cmp_ps_mask(xv, hi, _CMP_GE_OQ);
        const __m512 t = _mm512_mask_mov_ps(_mm512_i32gather_ps(ix, tab, 4), big, xv);
        const __m512 r = _mm512_mul_ps(t, _mm512_loadu_ps(g + i));
        _mm512_storeu_ps(d + i, _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(xv, lo, _CMP_LE_OQ), r));
    }
#else
    const __m256 lo = _mm256_set1_ps(-CSIMD_GELU_CLAMP), hi = _mm256_set1_ps(CSIMD_GELU_CLAMP);
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256i ix = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(xv, _MM_FROUND_TO_NEAREST_INT));
        const __m256 t = _mm256_blendv_ps(_mm256_i32gather_ps(tab, ix, 4), xv, _mm256_cmp_ps(xv, hi, _CMP_GE_OQ));
        const __m256 r = _mm256_mul_ps(t, _mm256_loadu_ps(g + i));
        _mm256_storeu_ps(d + i, _mm256_andnot_ps(_mm256_cmp_ps(xv, lo, _CMP_LE_OQ), r));
    }
#endif
    return i;
}
#endif

/* ------------------------------------------------------------ gated linear units
   act: a unary op code (RELU, GELU, SILU, GELU_ERF, GELU_QUICK) or -1 for SWIGLU_OAI.
   b NULL: each row of a is split into halves x | g (swapped: g | x). */
/* rows r0 .. r1 - 1 of glu */
ATTR static void FN(glu_rows)(int act, int swapped, double alpha, double limit, const csimd_tensor *a,
                              const csimd_tensor *b, const csimd_tensor *d, int64_t r0, int64_t r1) {
    const int64_t n0 = d->ne[0];
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        const char *xr = ELT(a, 0, i1, i2, i3), *gr;
        int gt;
        int64_t gnb;
        if (b) {
            gr = ELT(b, 0, i1, i2, i3); gt = b->type; gnb = b->nb[0];
        } else {
            gr = xr + n0 * a->nb[0]; gt = a->type; gnb = a->nb[0];
            if (swapped) { const char *t = xr; xr = gr; gr = t; }
        }
        char *dr = ELT(d, 0, i1, i2, i3);
        int64_t i0 = 0;
#if ISA_LEVEL >= 1
        if (act == U_GELU && a->type == CSIMD_F32 && gt == CSIMD_F32 && d->type == CSIMD_F32 && a->nb[0] == 4 &&
            gnb == 4 && d->nb[0] == 4)
            i0 = FN(geglu_f32)((float *)dr, (const float *)xr, (const float *)gr, n0);
#endif
        for (int64_t i = i0; i < n0; i++) {
            const float x = load_f32(xr + i * a->nb[0], a->type);
            const double g = load_f32(gr + i * gnb, gt);
            double r;
            if (act < 0) {
                const double xc = limit < x ? limit : (double)x; /* std::min(x, limit): NaN stays NaN */
                const double gc = g < -limit ? -limit : g > limit ? limit : g;
                r = xc / (1.0 + exp(-alpha * xc)) * (gc + 1.0);
            } else if (act == U_GELU && x <= -CSIMD_GELU_CLAMP) {
                r = 0.0; /* GEGLU below the table: ggml gives 0 whatever g is */
            } else {
                r = FN(uop)(act, x, 0.0, 0.0) * g;
            }
            store_f64(dr + i * d->nb[0], d->type, r);
        }
    }
}

ATTR static void FN(glu)(int act, int swapped, double alpha, double limit, const csimd_tensor *a,
                         const csimd_tensor *b, const csimd_tensor *d, int nth) {
    const int64_t nr = nrows_of(d);
    if (nth <= 1) { /* on the calling thread alone: see binary */
        FN(glu_rows)(act, swapped, alpha, limit, a, b, d, 0, nr);
        return;
    }
#pragma omp parallel for num_threads(nth) schedule(static)
    for (int64_t ir = 0; ir < nr; ir++) FN(glu_rows)(act, swapped, alpha, limit, a, b, d, ir, ir + 1);
}

/* ------------------------------------------------------------ index maps (F32): 0 PAD (p = lp0..lp3, circular),
   1 PAD_REFLECT_1D (p[0] = p0), 2 DIAG */
ATTR static void FN(index_map)(int mode, const int64_t *p, int circular, const csimd_tensor *a, const csimd_tensor *d,
                               int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        char *dr = ELT(d, 0, i1, i2, i3);
        for (int64_t i0 = 0; i0 < n0; i0++) {
            int64_t j[4] = {i0, i1, i2, i3};
            int inside = 1;
            if (mode == 0) {
                for (int k = 0; k < 4; k++) {
                    j[k] -= p[k];
                    if (circular) j[k] = ((j[k] % a->ne[k]) + a->ne[k]) % a->ne[k];
                    else if (j[k] < 0 || j[k] >= a->ne[k]) inside = 0;
                }
            } else if (mode == 1) {
                j[0] -= p[0];
                if (j[0] < 0) j[0] = -j[0];
                if (j[0] >= a->ne[0]) j[0] = 2 * (a->ne[0] - 1) - j[0];
                if (j[0] < 0 || j[0] >= a->ne[0]) inside = 0;
            } else {
                inside = i0 == i1;
                j[1] = 0;
            }
            float v = 0.0f;
            if (inside) memcpy(&v, ELT(a, j[0], j[1], j[2], j[3]), 4);
            memcpy(dr + i0 * d->nb[0], &v, 4);
        }
    }
}

ATTR static void FN(arange)(double start, double step, const csimd_tensor *d) {
    for (int64_t i = 0; i < d->ne[0]; i++) {
        double t = (double)i * step;
        __asm__("" : "+m"(t)); /* no fused multiply-add: round as the reference does */
        float v = (float)(start + t);
        memcpy(ELT(d, i, 0, 0, 0), &v, 4);
    }
}

/* ARGMAX of each row of a matrix, ggml's loop: max = MAX(max, v); if (max == v) idx = i. Ties go to
   the last index; a NaN makes max NaN without taking the index, and the next element then takes both */
ATTR static void FN(argmax)(const csimd_tensor *a, const csimd_tensor *d) {
    for (int64_t r = 0; r < a->ne[1]; r++) {
        int64_t best = 0;
        float mx = -INFINITY;
        for (int64_t i = 0; i < a->ne[0]; i++) {
            float v;
            memcpy(&v, ELT(a, i, r, 0, 0), 4);
            mx = mx > v ? mx : v;
            if (mx == v) best = i;
        }
        int32_t o = (int32_t)best;
        memcpy(ELT(d, r, 0, 0, 0), &o, 4);
    }
}

/* ------------------------------------------------------------ XIELU, timestep embedding, group norm */
ATTR static void FN(xielu)(double an, double ap, double beta, double eps, const csimd_tensor *a,
                           const csimd_tensor *d, int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        const char *ar = ELT(a, 0, i1, i2, i3);
        char *dr = ELT(d, 0, i1, i2, i3);
        for (int64_t i = 0; i < n0; i++) {
            const double x = load_f32(ar + i * a->nb[0], a->type);
            double r;
            if (x > 0) r = ap * x * x + beta * x;
            else r = (expm1(x < eps ? x : eps) - x) * an + beta * x;
            store_f64(dr + i * d->nb[0], d->type, r);
        }
    }
}

ATTR static void FN(timestep_embedding)(double max_period, const csimd_tensor *t, const csimd_tensor *d, int nth) {
    const int64_t dim = d->ne[0], half = dim / 2, n = d->ne[1];
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t i = 0; i < n; i++) {
        float tv;
        memcpy(&tv, ELT(t, i, 0, 0, 0), 4);
        char *dr = ELT(d, 0, i, 0, 0);
        for (int64_t j = 0; j < half; j++) {
            const double arg = (double)tv * exp(-log(max_period) * (double)j / (double)half);
            float c = (float)cos(arg), s = (float)sin(arg);
            memcpy(dr + j * d->nb[0], &c, 4);
            memcpy(dr + (half + j) * d->nb[0], &s, 4);
        }
        if (dim % 2) { float z = 0.0f; memcpy(dr + (dim - 1) * d->nb[0], &z, 4); }
    }
}

ATTR static void FN(group_norm)(int64_t n_groups, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t C = a->ne[2], per = (C + n_groups - 1) / n_groups, ng = (C + per - 1) / per;
    const int64_t items = a->ne[3] * ng;
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(dynamic, 1) if (nth > 1)
    for (int64_t it = 0; it < items; it++) {
        const int64_t i3 = it / ng, c0 = (it % ng) * per, c1 = c0 + per < C ? c0 + per : C;
        double s = 0, q = 0;
        int64_t cnt = 0;
        for (int64_t c = c0; c < c1; c++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    float v;
                    memcpy(&v, ELT(a, i0, i1, c, i3), 4);
                    s += v;
                    cnt++;
                }
        const double mean = cnt ? s / (double)cnt : 0.0;
        for (int64_t c = c0; c < c1; c++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    float v;
                    memcpy(&v, ELT(a, i0, i1, c, i3), 4);
                    q += ((double)v - mean) * ((double)v - mean);
                }
        const double sc = 1.0 / sqrt(q / (double)cnt + (double)eps);
        for (int64_t c = c0; c < c1; c++)
            for (int64_t i1 = 0; i1 < a->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    float v;
                    memcpy(&v, ELT(a, i0, i1, c, i3), 4);
                    v = (float)(((double)v - mean) * sc);
                    memcpy(ELT(d, i0, i1, c, i3), &v, 4);
                }
    }
}
#include "csimd_attn.h" /* FLASH_ATTN_EXT, CONV_2D, CONV_TRANSPOSE_1D */
#include "csimd_rope.h" /* ROPE, ROPE_BACK, UPSCALE, IM2COL_BACK */
#include "csimd_pool.h" /* POOL_1D, POOL_2D, IM2COL */
#include "csimd_quant_impl.h" /* quantized block formats: decoders, integer dot products, mul_mat */

/* ------------------------------------------------------------ the copy's entry points (csimd_kernels.h) */
#if !defined(CSIMD_QUANT_ONLY)
CSIMD_HIDDEN const csimd_kernels FN(csimd_kernels) = {
    .binary = FN(binary), .unary = FN(unary), .mul_mat = FN(mul_mat), .soft_max = FN(soft_max), .norm = FN(norm),
    .cpy = FN(cpy), .get_rows = FN(get_rows), .cross_entropy = FN(cross_entropy), .opt_step = FN(opt_step),
    .repeat = FN(repeat), .reduce = FN(reduce), .repeat_back = FN(repeat_back), .rows_back = FN(rows_back),
    .diag_mask = FN(diag_mask), .get_rows_back = FN(get_rows_back), .out_prod = FN(out_prod), .glu = FN(glu),
    .index_map = FN(index_map), .arange = FN(arange), .argmax = FN(argmax), .xielu = FN(xielu),
    .timestep_embedding = FN(timestep_embedding), .group_norm = FN(group_norm), .row_from_f32 = FN(row_from_f32),
    .pool = FN(pool), .im2col = FN(im2col), .flash_attn = FN(flash_attn), .conv_2d = FN(conv_2d),
    .conv_transpose_1d = FN(conv_transpose_1d), .rope = FN(rope), .upscale = FN(upscale),
    .im2col_back = FN(im2col_back),
};
#endif
CSIMD_HIDDEN const csimd_qkernels FN(csimd_qkernels) = {
    .q_dequant = FN(q_dequant), .q_mul_mat = FN(q_mul_mat), .q_mul_mat_id = FN(q_mul_mat_id),
    .q_vec_dot = FN(q_vec_dot),
};
