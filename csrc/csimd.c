/* prism csimd: the kernels compiled three times (scalar, AVX2+FMA+F16C, AVX-512) and
   chosen at run time from the CPU's features; no -march flag is needed to build. */
#include "csimd_common.h"

#if defined(__x86_64__) || defined(__i386__)
#define CSIMD_X86 1
#include <immintrin.h>
#else
#define CSIMD_X86 0
#endif

/* portable path: 16-byte GCC vectors (SSE2 on x86-64, NEON elsewhere, or scalar code) */
#define SFX scalar
#define ATTR
#define VB 16
#define MR 4
#define NR 8
#define ISA_LEVEL 0
#include "csimd_impl.h"
#undef SFX
#undef ATTR
#undef VB
#undef MR
#undef NR
#undef ISA_LEVEL

#if CSIMD_X86
#define SFX avx2
#define ATTR __attribute__((target("avx2,fma,f16c")))
#define VB 32
#define MR 6
#define NR 16
#define ISA_LEVEL 1
#include "csimd_impl.h"
#undef SFX
#undef ATTR
#undef VB
#undef MR
#undef NR
#undef ISA_LEVEL

#define SFX avx512
#define ATTR __attribute__((target("avx512f,avx2,fma,f16c")))
#define VB 64
#define MR 12
#define NR 32
#define ISA_LEVEL 2
#include "csimd_impl.h"
#undef SFX
#undef ATTR
#undef VB
#undef MR
#undef NR
#undef ISA_LEVEL
#endif

static int g_isa = -1;

/* Defensive shape checks: the Python side validated every view against its buffer and the
   builders validated the shapes; these keep a kernel from indexing past a view even if a
   caller passes inconsistent descriptors. */
static int same_ne(const csimd_tensor *x, const csimd_tensor *y) {
    return x->ne[0] == y->ne[0] && x->ne[1] == y->ne[1] && x->ne[2] == y->ne[2] && x->ne[3] == y->ne[3];
}

static int nonneg(const csimd_tensor *t) {
    for (int k = 0; k < 4; k++)
        if (t->ne[k] < 0 || t->nb[k] < 0) return 0;
    return t->data != NULL;
}

static int64_t nelem(const csimd_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

/* b repeats into a by modulo (every extent of b divides a's, none is 0) */
static int tiles(const csimd_tensor *a, const csimd_tensor *b) {
    for (int k = 0; k < 4; k++)
        if (b->ne[k] <= 0 || a->ne[k] % b->ne[k]) return 0;
    return 1;
}

/* a's matrices serve b's in blocks (mul_mat / out_prod) */
static int blocks(const csimd_tensor *a, const csimd_tensor *b) {
    return a->ne[2] > 0 && a->ne[3] > 0 && b->ne[2] % a->ne[2] == 0 && b->ne[3] % a->ne[3] == 0;
}

int csimd_cpu_isa(void) {
#if CSIMD_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return 1;
#endif
    return 0;
}

int csimd_set_isa(int isa) {
    if (isa < 0 || isa > csimd_cpu_isa()) return -1;
    g_isa = isa;
    return 0;
}

int csimd_get_isa(void) {
    if (g_isa < 0) g_isa = csimd_cpu_isa();
    return g_isa;
}

int csimd_has_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int csimd_max_threads(void) {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

static int clamp_threads(int nth) {
#ifdef _OPENMP
    return nth < 1 ? 1 : nth;
#else
    (void)nth;
    return 1;
#endif
}

#if CSIMD_X86
#define CALL(fn, ...)                                                      \
    switch (csimd_get_isa()) {                                             \
    case 2: fn##_avx512(__VA_ARGS__); break;                               \
    case 1: fn##_avx2(__VA_ARGS__); break;                                 \
    default: fn##_scalar(__VA_ARGS__); break;                              \
    }
#define CALL_RC(rc, fn, ...)                                               \
    switch (csimd_get_isa()) {                                             \
    case 2: rc = fn##_avx512(__VA_ARGS__); break;                          \
    case 1: rc = fn##_avx2(__VA_ARGS__); break;                            \
    default: rc = fn##_scalar(__VA_ARGS__); break;                         \
    }
#else
#define CALL(fn, ...) fn##_scalar(__VA_ARGS__);
#define CALL_RC(rc, fn, ...) rc = fn##_scalar(__VA_ARGS__);
#endif

int csimd_binary(int op, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    if (op < 0 || op > 4 || !nonneg(a) || !nonneg(b) || !nonneg(d) || !same_ne(a, d) || !tiles(a, b)) return -1;
    nth = clamp_threads(nth);
    CALL(binary, op, a, b, d, nth)
    return 0;
}

int csimd_unary(int op, double p0, double p1, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || !same_ne(a, d)) return -1;
    nth = clamp_threads(nth);
    CALL(unary, op, p0, p1, a, d, nth)
    return 0;
}

int csimd_mul_mat(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    int rc = 0;
    if (!nonneg(a) || !nonneg(b) || !nonneg(d) || !blocks(a, b) || d->nb[0] != 4 || d->nb[1] % 4) return -1;
    if (b->ne[0] != a->ne[0] || d->ne[0] != a->ne[1] || d->ne[1] != b->ne[1] || d->ne[2] != b->ne[2] ||
        d->ne[3] != b->ne[3] || b->type != CSIMD_F32 || d->type != CSIMD_F32)
        return -1;
    nth = clamp_threads(nth);
    CALL_RC(rc, mul_mat, a, b, d, nth)
    return rc;
}

int csimd_soft_max(const csimd_tensor *a, const csimd_tensor *mask, const csimd_tensor *sinks, const csimd_tensor *d,
                   const float *slopes, float scale, int nth) {
    if (sinks && (sinks->type != CSIMD_F32 || sinks->ne[0] < a->ne[2])) return -1;
    if (!nonneg(a) || !nonneg(d) || !same_ne(a, d) || a->type != CSIMD_F32 || d->type != CSIMD_F32) return -1;
    if (mask && (!nonneg(mask) || mask->ne[0] < a->ne[0] || mask->ne[1] <= 0 || mask->ne[2] <= 0 || mask->ne[3] <= 0))
        return -1;
    nth = clamp_threads(nth);
    CALL(soft_max, a, mask, sinks, d, slopes, scale, nth)
    return 0;
}

int csimd_norm(int rms, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (rms < 0 || rms > 2 || !nonneg(a) || !nonneg(d) || !same_ne(a, d)) return -1;
    nth = clamp_threads(nth);
    CALL(norm, rms, eps, a, d, nth)
    return 0;
}

int csimd_cpy(const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || nelem(a) != nelem(d)) return -1;
    if ((a->type == CSIMD_I32) != (d->type == CSIMD_I32)) return -1;
    nth = clamp_threads(nth);
    CALL(cpy, a, d, nth)
    return 0;
}

int csimd_get_rows(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(idx) || !nonneg(d) || idx->type != CSIMD_I32 || d->ne[0] != a->ne[0] ||
        idx->ne[0] < d->ne[1] || idx->ne[1] < d->ne[2] || idx->ne[2] < d->ne[3] || a->ne[2] < d->ne[2] ||
        a->ne[3] < d->ne[3])
        return -1;
    nth = clamp_threads(nth);
    CALL(get_rows, a, idx, d, nth)
    return 0;
}

int csimd_cross_entropy(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, float g, int back,
                        int nth) {
    if (!nonneg(a) || !nonneg(b) || !nonneg(d) || !same_ne(a, b) || (back ? !same_ne(a, d) : nelem(d) < 1)) return -1;
    nth = clamp_threads(nth);
    CALL(cross_entropy, a, b, d, g, back, nth)
    return 0;
}

int csimd_opt_step(int adamw, const float *p, const csimd_tensor *a, const csimd_tensor *g, const csimd_tensor *m,
                   const csimd_tensor *v, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(g) || !nonneg(m) || !nonneg(v) || !nonneg(d) || !same_ne(a, d) || !same_ne(g, d) ||
        !same_ne(m, d) || !same_ne(v, d))
        return -1;
    nth = clamp_threads(nth);
    CALL(opt_step, adamw, p, a, g, m, v, d, nth)
    return 0;
}

int csimd_repeat(const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (a->type != d->type || !nonneg(a) || !nonneg(d) || !tiles(d, a)) return -1;
    nth = clamp_threads(nth);
    CALL(repeat, a, d, nth)
    return 0;
}

int csimd_reduce(int op, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (op < 0 || op > 2 || !nonneg(a) || !nonneg(d)) return -1;
    if (op > 0 && (d->ne[1] != a->ne[1] || d->ne[2] != a->ne[2] || d->ne[3] != a->ne[3] || d->ne[0] < 1)) return -1;
    if (op == 0 && nelem(d) < 1) return -1;
    nth = clamp_threads(nth);
    CALL(reduce, op, a, d, nth)
    return 0;
}

int csimd_repeat_back(const csimd_tensor *a, const csimd_tensor *d) {
    int rc = 0;
    if (!nonneg(a) || !nonneg(d) || !tiles(a, d)) return -1;
    CALL_RC(rc, repeat_back, a, d)
    return rc;
}

int csimd_rows_back(int op, float p, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    if (op < 0 || op > 1 || !nonneg(a) || !nonneg(b) || !nonneg(d) || !same_ne(a, b) || !same_ne(a, d)) return -1;
    nth = clamp_threads(nth);
    CALL(rows_back, op, p, a, b, d, nth)
    return 0;
}

int csimd_diag_mask(int inf, int64_t n_past, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || !same_ne(a, d)) return -1;
    nth = clamp_threads(nth);
    CALL(diag_mask, inf, n_past, a, d, nth)
    return 0;
}

int csimd_get_rows_back(const csimd_tensor *g, const csimd_tensor *idx, const csimd_tensor *d) {
    if (!nonneg(g) || !nonneg(idx) || !nonneg(d) || idx->type != CSIMD_I32 || g->ne[0] < d->ne[0] ||
        idx->ne[0] < g->ne[1])
        return -1;
    CALL(get_rows_back, g, idx, d)
    return 0;
}

int csimd_out_prod(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    int rc = 0;
    if (!nonneg(a) || !nonneg(b) || !nonneg(d) || !blocks(a, b) || d->nb[0] != 4 || d->nb[1] % 4) return -1;
    if (b->ne[1] != a->ne[1] || d->ne[0] != a->ne[0] || d->ne[1] != b->ne[0] || d->ne[2] != b->ne[2] ||
        d->ne[3] != b->ne[3] || b->type != CSIMD_F32 || d->type != CSIMD_F32)
        return -1;
    nth = clamp_threads(nth);
    CALL_RC(rc, out_prod, a, b, d, nth)
    return rc;
}

int csimd_glu(int act, int swapped, double alpha, double limit, const csimd_tensor *a, const csimd_tensor *b,
              const csimd_tensor *d, int nth) {
    if (act >= 0 && act != U_RELU && act != U_GELU && act != U_SILU && act != U_GELU_ERF && act != U_GELU_QUICK) return -1;
    if (!nonneg(a) || !nonneg(d) || (b && !nonneg(b))) return -1;
    if (!b && (a->ne[0] < 2 * d->ne[0] || a->ne[1] != d->ne[1] || a->ne[2] != d->ne[2] || a->ne[3] != d->ne[3]))
        return -1;
    if (b && (!same_ne(a, d) || !same_ne(b, d))) return -1;
    nth = clamp_threads(nth);
    CALL(glu, act, swapped, alpha, limit, a, b, d, nth)
    return 0;
}

int csimd_index_map(int mode, const int64_t *p, int circular, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (mode < 0 || mode > 2 || a->type != CSIMD_F32 || d->type != CSIMD_F32) return -1;
    for (int k = 0; k < 4; k++)
        if (a->ne[k] <= 0) return -1;
    if (!nonneg(a) || !nonneg(d)) return -1;
    if (mode == 1 && (d->ne[1] != a->ne[1] || d->ne[2] != a->ne[2] || d->ne[3] != a->ne[3])) return -1;
    if (mode == 2 && (d->ne[0] != a->ne[0] || d->ne[2] != a->ne[2] || d->ne[3] != a->ne[3])) return -1;
    nth = clamp_threads(nth);
    CALL(index_map, mode, p, circular, a, d, nth)
    return 0;
}

int csimd_arange(double start, double step, const csimd_tensor *d) {
    if (d->type != CSIMD_F32 || !nonneg(d)) return -1;
    CALL(arange, start, step, d)
    return 0;
}

int csimd_argmax(const csimd_tensor *a, const csimd_tensor *d) {
    if (!nonneg(a) || !nonneg(d) || a->type != CSIMD_F32 || d->type != CSIMD_I32 || a->ne[0] <= 0 ||
        d->ne[0] < a->ne[1])
        return -1;
    CALL(argmax, a, d)
    return 0;
}

int csimd_xielu(double an, double ap, double beta, double eps, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || !same_ne(a, d)) return -1;
    nth = clamp_threads(nth);
    CALL(xielu, an, ap, beta, eps, a, d, nth)
    return 0;
}

int csimd_timestep_embedding(double max_period, const csimd_tensor *t, const csimd_tensor *d, int nth) {
    if (!nonneg(t) || !nonneg(d) || t->type != CSIMD_F32 || d->type != CSIMD_F32 || t->ne[0] < d->ne[1] ||
        max_period <= 0)
        return -1;
    nth = clamp_threads(nth);
    CALL(timestep_embedding, max_period, t, d, nth)
    return 0;
}

int csimd_group_norm(int64_t n_groups, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || !same_ne(a, d) || n_groups < 1 || a->type != CSIMD_F32 || d->type != CSIMD_F32)
        return -1;
    for (int k = 0; k < 4; k++)
        if (a->ne[k] <= 0) return -1;
    nth = clamp_threads(nth);
    CALL(group_norm, n_groups, eps, a, d, nth)
    return 0;
}
