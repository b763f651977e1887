/* Shared helpers of the csimd kernels: type conversions and indexing. Plain C. */
#ifndef PRISM_CSIMD_COMMON_H
#define PRISM_CSIMD_COMMON_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "csimd.h"
#include "csimd_kernels.h" /* what csimd.c and the copies of the template share */

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define CSIMD_X86 1
#include <immintrin.h>
#else
#define CSIMD_X86 0
#endif
#if defined(__aarch64__)
#define CSIMD_ARM64 1
#else
#define CSIMD_ARM64 0
#endif

#define ELT(t, i0, i1, i2, i3) \
    ((t)->data + (i0) * (t)->nb[0] + (i1) * (t)->nb[1] + (i2) * (t)->nb[2] + (i3) * (t)->nb[3])

static inline int is_float(int t) { return t == CSIMD_F32 || t == CSIMD_F16 || t == CSIMD_BF16; }
static inline int type_size(int t) { return (t == CSIMD_F16 || t == CSIMD_BF16) ? 2 : t == CSIMD_I64 ? 8 : 4; }

/* f16 <-> f32, round to nearest even (F. Giesen's float_to_half_fast3_rtne); exact */
static inline uint16_t f32_to_f16_sw(float ff) {
    const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
    const uint32_t denorm_magic_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t f;
    memcpy(&f, &ff, 4);
    uint32_t sign = f & 0x80000000u;
    f ^= sign;
    uint16_t o;
    if (f >= f16max) {
        o = (f > f32infty) ? (uint16_t)(0x7e00 | ((f >> 13) & 0x3ff)) : 0x7c00;
    } else if (f < (113u << 23)) {
        float fv, dm;
        memcpy(&fv, &f, 4);
        memcpy(&dm, &denorm_magic_u, 4);
        volatile float sum = fv + dm; /* rounds to nearest even in the FPU */
        float s = sum;
        uint32_t r;
        memcpy(&r, &s, 4);
        o = (uint16_t)(r - denorm_magic_u);
    } else {
        uint32_t mant_odd = (f >> 13) & 1u;
        f += ((uint32_t)(15 - 127) << 23) + 0xfffu;
        f += mant_odd;
        o = (uint16_t)(f >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* csimd_gelu_f16 (csimd_kernels.h): */
#define CSIMD_GELU_CLAMP 10.0f /* the tanh GELU's table covers -10 < x < 10: below 0, above x itself */

static inline float f16_to_f32_sw(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, r;
    if (e == 0) {
        float f = (float)mant * (1.0f / 16777216.0f);
        memcpy(&r, &f, 4);
        r |= sign;
    } else if (e == 31) {
        r = sign | 0x7f800000u | (mant << 13);
    } else {
        r = sign | ((e + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &r, 4);
    return f;
}

/* bf16 as ggml: round to nearest even, NaN kept quiet */
static inline uint16_t f32_to_bf16(float ff) {
    uint32_t u;
    memcpy(&u, &ff, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float load_f32(const char *p, int t) {
    switch (t) {
    case CSIMD_F16: { uint16_t h; memcpy(&h, p, 2); return f16_to_f32_sw(h); }
    case CSIMD_BF16: { uint16_t h; memcpy(&h, p, 2); return bf16_to_f32(h); }
    case CSIMD_I32: { int32_t i; memcpy(&i, p, 4); return (float)i; }
    default: { float f; memcpy(&f, p, 4); return f; }
    }
}

static inline void store_f32(char *p, int t, float v) {
    switch (t) {
    case CSIMD_F16: { uint16_t h = f32_to_f16_sw(v); memcpy(p, &h, 2); break; }
    case CSIMD_BF16: { uint16_t h = f32_to_bf16(v); memcpy(p, &h, 2); break; }
    case CSIMD_I32: { /* truncation toward zero; NaN and out-of-range give INT32_MIN, as x86 NumPy */
        const int32_t i = (v >= -2147483648.0f && v < 2147483648.0f) ? (int32_t)v : INT32_MIN;
        memcpy(p, &i, 4);
        break;
    }
    default: memcpy(p, &v, 4); break;
    }
}

/* a row index stored as I32 or I64 */
static inline int64_t load_index(const char *p, int t) {
    if (t == CSIMD_I64) { int64_t i; memcpy(&i, p, 8); return i; }
    int32_t i;
    memcpy(&i, p, 4);
    return i;
}

/* GET_ROWS: every index it reads (idx[i, j, k] for each row (i, j, k) of d) lies in [0, n). Checked before
   any row is written, so that a refused call leaves d as it was and a prepared call needs no Python check. */
static inline int rows_in_range(const csimd_tensor *idx, const csimd_tensor *d, int64_t n) {
    for (int64_t k = 0; k < d->ne[3]; k++)
        for (int64_t j = 0; j < d->ne[2]; j++)
            for (int64_t i = 0; i < d->ne[1]; i++) {
                int32_t r;
                memcpy(&r, ELT(idx, i, j, k, 0), 4);
                if (r < 0 || r >= n) return 0;
            }
    return 1;
}

/* double -> float rounded to odd: a following round to nearest even into f16 is then exact */
static inline float f64_to_f32_odd(double d) {
    float f = (float)d;
    if ((double)f == d || f != f) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(d)) u -= 1; /* truncate toward zero */
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

/* a double result stored as the reference stores it: F16 rounded once from the double,
   F32 and BF16 through float32 (as prism_core.types.from_f32 does) */
static inline void store_f64(char *p, int t, double v) {
    if (t == CSIMD_F16) {
        uint16_t h = f32_to_f16_sw(f64_to_f32_odd(v));
        memcpy(p, &h, 2);
    } else {
        store_f32(p, t, (float)v);
    }
}

/* rows per partial sum of a whole-tensor sum (SUM, CROSS_ENTROPY_LOSS): the partial sums of these fixed
   blocks are added in order, so the result is the same at any thread count (csimd_threads.h) */
#define SUM_ROWS 64
static inline int64_t nrows_of(const csimd_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

static inline void unravel_row(const csimd_tensor *t, int64_t ir, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = ir % t->ne[1];
    *i2 = (ir / t->ne[1]) % t->ne[2];
    *i3 = ir / (t->ne[1] * t->ne[2]);
}

static void *csimd_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

/* unary op codes (mirrored in prism_csimd/kernels.py) */
enum {
    U_ABS, U_SGN, U_NEG, U_STEP, U_TANH, U_ELU, U_RELU, U_SIGMOID, U_GELU, U_GELU_QUICK, U_SILU,
    U_HARDSWISH, U_HARDSIGMOID, U_EXP, U_EXPM1, U_SOFTPLUS, U_GELU_ERF, U_FLOOR, U_CEIL, U_ROUND,
    U_TRUNC, U_SQR, U_SQRT, U_LOG, U_SIN, U_COS, U_SCALE, U_CLAMP, U_LEAKY_RELU
};

#define CHUNK 16384 /* elements of a row handed to one thread at a time */
#endif
