/* prism csimd: the entry points of csimd.h (argument checks, then the kernels of the path chosen at run
   time from the CPU's features), CPU detection, and what every copy of the kernel template shares. The
   copies are compiled one per translation unit (csimd_path_*.c: x86-64: scalar, AVX2+FMA+F16C, AVX-VNNI,
   AVX-512; arm64: portable, NEON, dotprod, i8mm) and reached through their tables (csimd_kernels.h); no
   -march flag is needed to build. */
#include "csimd_common.h"
#include "csimd_quant.h"   /* block formats, the quantizers of csimd_quant_api.h */
#include "csimd_scratch.h" /* per-thread scratch kept between calls */
#include <float.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

/* bytes of this machine's data cache at `level` (1, 2, 3), for the GEMM's blocking: Linux's sysfs
   (what lscpu shows; a VM's sysconf may report the host's L3), then sysconf, then a typical size */
static int64_t cache_bytes_probe(int level) {
    for (int i = 0; i < 8; i++) {
        char path[96], buf[32];
        int lv = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &lv) != 1) lv = 0;
        fclose(f);
        if (lv != level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!(f = fopen(path, "r"))) continue;
        const int ok = fscanf(f, "%31s", buf) == 1 && strcmp(buf, "Instruction") != 0;
        fclose(f);
        if (!ok) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r"))) continue;
        long v = 0;
        char unit = 0;
        const int n = fscanf(f, "%ld%c", &v, &unit);
        fclose(f);
        if (n >= 1 && v > 0) return (int64_t)v * (unit == 'K' ? 1024 : unit == 'M' ? 1048576 : 1);
    }
#ifdef _SC_LEVEL1_DCACHE_SIZE
    const long v = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
    if (v > 0) return v;
#endif
    return level == 1 ? 32768 : level == 2 ? 524288 : 8388608;
}

int64_t csimd_cache_bytes(int level) {
    static int64_t sizes[4]; /* probed once; a racing first call stores the same values */
    int64_t v = __atomic_load_n(&sizes[level], __ATOMIC_RELAXED);
    if (v == 0) {
        v = cache_bytes_probe(level);
        __atomic_store_n(&sizes[level], v, __ATOMIC_RELAXED);
    }
    return v;
}

#if CSIMD_ARM64
#include "csimd_neon_paths.h" /* which NEON paths the CPU runs */
#endif

const float *csimd_gelu_f16 = NULL, *csimd_gelu_quick_f16 = NULL;

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

int csimd_abi_version(void) { return CSIMD_ABI_VERSION; }

#if CSIMD_X86
#include <cpuid.h>
/* AVX-VNNI: CPUID leaf 7 subleaf 1, EAX bit 4 (the ymm state is enabled where AVX2 is reported) */
static int cpu_has_avxvnni(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 4) & 1;
}
#endif

/* whether this CPU runs path isa (CSIMD_ISA_* of csimd.h) */
static int isa_runs(int isa) {
#if CSIMD_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    switch (isa) {
    case CSIMD_ISA_SCALAR: return 1;
    case CSIMD_ISA_AVX2: return avx2;
    case CSIMD_ISA_AVXVNNI: return avx2 && cpu_has_avxvnni();
    case CSIMD_ISA_AVX512: return avx2 && __builtin_cpu_supports("avx512f");
    default: return 0;
    }
#elif CSIMD_ARM64
    return arm_isa_runs(isa);
#else
    return isa == CSIMD_ISA_SCALAR;
#endif
}

int csimd_cpu_isa(void) {
#if CSIMD_ARM64
    static const int best_first[] = {CSIMD_ISA_I8MM, CSIMD_ISA_DOTPROD, CSIMD_ISA_NEON};
#else
    static const int best_first[] = {CSIMD_ISA_AVX512, CSIMD_ISA_AVXVNNI, CSIMD_ISA_AVX2};
#endif
    for (size_t i = 0; i < sizeof best_first / sizeof *best_first; i++)
        if (isa_runs(best_first[i])) return best_first[i];
    return CSIMD_ISA_SCALAR;
}

int csimd_isa_runs(int isa) { return isa_runs(isa); }

int csimd_set_isa(int isa) {
    if (!isa_runs(isa)) return -1;
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

#include "csimd_threads.h" /* clamp_threads: the thread count under CPU contention */

/* the float kernels of the active path: AVX-VNNI runs the AVX2 ones, every NEON level the neon ones (their
   quantized kernels differ: csimd_quant_api.h) */
static const csimd_kernels *kernels(void) {
    switch (csimd_get_isa()) {
#if CSIMD_X86
    case CSIMD_ISA_AVX512: return &csimd_kernels_avx512;
    case CSIMD_ISA_AVX2:
    case CSIMD_ISA_AVXVNNI: return &csimd_kernels_avx2;
#elif CSIMD_ARM64
    case CSIMD_ISA_NEON:
    case CSIMD_ISA_DOTPROD:
    case CSIMD_ISA_I8MM: return &csimd_kernels_neon;
#endif
    default: return &csimd_kernels_scalar;
    }
}
#define CALL(fn, ...) kernels()->fn(__VA_ARGS__);
#define CALL_RC(rc, fn, ...) rc = kernels()->fn(__VA_ARGS__);

int csimd_binary(int op, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    if (op < 0 || op > 4 || !nonneg(a) || !nonneg(b) || !nonneg(d) || !same_ne(a, d) || !tiles(a, b)) return -1;
    nth = clamp_threads(nth);
    CALL(binary, op, a, b, d, nth)
    return 0;
}

int csimd_set_gelu_tables(const float *gelu, const float *gelu_quick) {
    if (!gelu || !gelu_quick) return -1;
    csimd_gelu_f16 = gelu;
    csimd_gelu_quick_f16 = gelu_quick;
    return 0;
}

static int gelu_ready(int op) {
    return (op != U_GELU || csimd_gelu_f16) && (op != U_GELU_QUICK || csimd_gelu_quick_f16);
}

int csimd_unary(int op, double p0, double p1, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || !same_ne(a, d) || !gelu_ready(op)) return -1;
    nth = clamp_threads(nth);
    CALL(unary, op, p0, p1, a, d, nth)
    return 0;
}

/* what mul_mat and out_prod share: float operands, an F32 result with contiguous rows, b's batch */
static int gemm_operands(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d) {
    return nonneg(a) && nonneg(b) && nonneg(d) && blocks(a, b) && d->nb[0] == 4 && d->nb[1] % 4 == 0 &&
           d->ne[2] == b->ne[2] && d->ne[3] == b->ne[3] && is_float(a->type) && is_float(b->type) &&
           d->type == CSIMD_F32;
}

int csimd_mul_mat(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    int rc = 0;
    if (!gemm_operands(a, b, d) || b->ne[0] != a->ne[0] || d->ne[0] != a->ne[1] || d->ne[1] != b->ne[1]) return -1;
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
    if (a->type == CSIMD_I64 || d->type == CSIMD_I64) return -1; /* float <-> I32 converts as the reference */
    nth = clamp_threads(nth);
    CALL(cpy, a, d, nth)
    return 0;
}

/* GET_ROWS's operands (either kernel): d[:, i, j, k] takes row idx[i, j, k] of a's matrix (j, k), every
   index within a's rows */
static int get_rows_ok(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d) {
    return nonneg(idx) && nonneg(d) && idx->type == CSIMD_I32 && d->ne[0] == a->ne[0] && idx->ne[0] >= d->ne[1] &&
           idx->ne[1] >= d->ne[2] && idx->ne[2] >= d->ne[3] && a->ne[2] >= d->ne[2] && a->ne[3] >= d->ne[3] &&
           rows_in_range(idx, d, a->ne[1]);
}

int csimd_get_rows(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || (a->type == CSIMD_I32) != (d->type == CSIMD_I32) || a->type == CSIMD_I64 ||
        !get_rows_ok(a, idx, d))
        return -1;
    nth = clamp_threads(nth);
    CALL(get_rows, a, idx, d, nth)
    return 0;
}

/* g: the upstream gradient (one F32 value) of the backward form; NULL for the loss itself */
/* b: F32 label rows of a's shape, or I32 class indices [a.ne1, a.ne2, a.ne3] (an index outside [0, a.ne0): -3) */
int csimd_cross_entropy(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, const csimd_tensor *g,
                        int back, int nth) {
    const int ids = b->type == CSIMD_I32;
    if (ids && (b->ne[0] != a->ne[1] || b->ne[1] != a->ne[2] || b->ne[2] != a->ne[3] || b->ne[3] != 1)) return -1;
    if (!nonneg(a) || !nonneg(b) || !nonneg(d) || (!ids && !same_ne(a, b)) || (back ? !same_ne(a, d) : nelem(d) < 1))
        return -1;
    if (ids)
        for (int64_t i3 = 0; i3 < b->ne[2]; i3++)
            for (int64_t i2 = 0; i2 < b->ne[1]; i2++)
                for (int64_t i1 = 0; i1 < b->ne[0]; i1++) {
                    const int64_t k = load_index(ELT(b, i1, i2, i3, 0), b->type);
                    if (k < 0 || k >= a->ne[0]) return -3;
                }
    if (back && (!g || !nonneg(g) || g->type != CSIMD_F32 || nelem(g) < 1)) return -1;
    float gv = 1.0f;
    if (back) memcpy(&gv, g->data, 4);
    nth = clamp_threads(nth);
    CALL(cross_entropy, a, b, d, gv, back, nth)
    return 0;
}

/* p: the optimizer's F32 parameter vector (AdamW 7 values, SGD 2), read at call time */
int csimd_opt_step(int adamw, const csimd_tensor *p, const csimd_tensor *a, const csimd_tensor *g,
                   const csimd_tensor *m, const csimd_tensor *v, const csimd_tensor *d, int nth) {
    const int count = adamw ? 7 : 2;
    if (!nonneg(a) || !nonneg(g) || !nonneg(m) || !nonneg(v) || !nonneg(d) || !same_ne(a, d) || !same_ne(g, d) ||
        !same_ne(m, d) || !same_ne(v, d))
        return -1;
    if (!nonneg(p) || p->type != CSIMD_F32 || p->ne[0] < count) return -1;
    float pv[7];
    for (int i = 0; i < count; i++) memcpy(&pv[i], p->data + i * p->nb[0], 4);
    nth = clamp_threads(nth);
    CALL(opt_step, adamw, pv, a, g, m, v, d, nth)
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
    if (!gemm_operands(a, b, d) || b->ne[1] != a->ne[1] || d->ne[0] != a->ne[0] || d->ne[1] != b->ne[0]) return -1;
    nth = clamp_threads(nth);
    CALL_RC(rc, out_prod, a, b, d, nth)
    return rc;
}

int csimd_glu(int act, int swapped, double alpha, double limit, const csimd_tensor *a, const csimd_tensor *b,
              const csimd_tensor *d, int nth) {
    if (act >= 0 && act != U_RELU && act != U_GELU && act != U_SILU && act != U_GELU_ERF && act != U_GELU_QUICK) return -1;
    if (!nonneg(a) || !nonneg(d) || (b && !nonneg(b)) || !gelu_ready(act)) return -1;
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

/* ARGSORT of each row (F32 -> I32): a stable merge sort; DESC sorts the negated values, so a
   NaN goes last in both orders and equal values keep their index order, as the reference */
static int argsort_lt(float x, float y) { return x < y || (x == x && y != y); }

int csimd_argsort(int descending, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || !same_ne(a, d) || a->type != CSIMD_F32 || d->type != CSIMD_I32 ||
        a->ne[0] > INT32_MAX)
        return -1;
    const int64_t n0 = a->ne[0], nr = a->ne[1] * a->ne[2] * a->ne[3];
    if (n0 == 0 || nr == 0) return 0;
    int failed = 0;
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
        float *v = (float *)malloc((size_t)n0 * 2 * sizeof(float));
        int32_t *ix = (int32_t *)malloc((size_t)n0 * 2 * sizeof(int32_t));
        if (!v || !ix) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < nr; r++) {
            if (!v || !ix) continue;
            const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
            float *vs = v, *vt = v + n0;
            int32_t *is = ix, *it = ix + n0;
            for (int64_t i = 0; i < n0; i++) {
                float x;
                memcpy(&x, ELT(a, i, i1, i2, i3), 4);
                vs[i] = descending ? -x : x;
                is[i] = (int32_t)i;
            }
            for (int64_t w = 1; w < n0; w *= 2) {
                for (int64_t lo = 0; lo < n0; lo += 2 * w) {
                    const int64_t mid = lo + w < n0 ? lo + w : n0, hi = lo + 2 * w < n0 ? lo + 2 * w : n0;
                    int64_t p = lo, q = mid, o = lo;
                    while (p < mid && q < hi) {
                        if (argsort_lt(vs[q], vs[p])) { vt[o] = vs[q]; it[o++] = is[q++]; }
                        else { vt[o] = vs[p]; it[o++] = is[p++]; }
                    }
                    while (p < mid) { vt[o] = vs[p]; it[o++] = is[p++]; }
                    while (q < hi) { vt[o] = vs[q]; it[o++] = is[q++]; }
                }
                float *tv = vs; vs = vt; vt = tv;
                int32_t *ti = is; is = it; it = ti;
            }
            for (int64_t i = 0; i < n0; i++) memcpy(ELT(d, i, i1, i2, i3), &is[i], 4);
        }
        free(v);
        free(ix);
    }
    return failed ? -2 : 0;
}

/* SET_ROWS's operands (either kernel): b's rows [n0, m, nj, nk] to rows c[i, j mod C1, k mod C2] of d, every
   index within d's rows */
static int set_rows_ok(const csimd_tensor *b, const csimd_tensor *c, const csimd_tensor *d) {
    if (!nonneg(b) || !nonneg(c) || (c->type != CSIMD_I32 && c->type != CSIMD_I64) || b->ne[0] != d->ne[0] ||
        b->ne[2] != d->ne[2] || b->ne[3] != d->ne[3] || c->ne[0] != b->ne[1] || c->ne[3] != 1 || c->ne[1] <= 0 ||
        c->ne[2] <= 0)
        return 0;
    for (int64_t k = 0; k < c->ne[2]; k++)
        for (int64_t j = 0; j < c->ne[1]; j++)
            for (int64_t i = 0; i < b->ne[1]; i++) {
                const int64_t r = load_index(ELT(c, i, j, k, 0), c->type);
                if (r < 0 || r >= d->ne[1]) return 0;
            }
    return 1;
}

/* SET_ROWS: d[:, c[i, j mod C1, k mod C2], j, k] = b[:, i, j, k] converted to d's type (d is the
   destination's memory; the other rows are left as they are). Indices are checked first. */
int csimd_set_rows(const csimd_tensor *b, const csimd_tensor *c, const csimd_tensor *d, int nth) {
    if (!nonneg(d) || d->type == CSIMD_I32 || b->type == CSIMD_I32 || !set_rows_ok(b, c, d)) return -1;
    const int64_t m = b->ne[1], n0 = b->ne[0], nj = d->ne[2], nk = d->ne[3];
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t jk = 0; jk < nj * nk; jk++) {
        const int64_t j = jk % nj, k = jk / nj;
        for (int64_t i = 0; i < m; i++) {
            const int64_t r = load_index(ELT(c, i, j % c->ne[1], k % c->ne[2], 0), c->type);
            if (b->type == d->type && b->nb[0] == type_size(b->type) && d->nb[0] == type_size(d->type)) {
                memmove(ELT(d, 0, r, j, k), ELT(b, 0, i, j, k), (size_t)n0 * type_size(d->type));
            } else if (b->type == CSIMD_F32 && b->nb[0] == 4) { /* a KV cache's F16 rows: F16C (AVX paths) */
                CALL(row_from_f32, ELT(d, 0, r, j, k), d->type, d->nb[0], (const float *)ELT(b, 0, i, j, k), n0)
            } else {
                for (int64_t e = 0; e < n0; e++) store_f32(ELT(d, e, r, j, k), d->type, load_f32(ELT(b, e, i, j, k), b->type));
            }
        }
    }
    return 0;
}

/* MUL_MAT_ID: d[:, e, t] = as[:, :, ids[e, t]] x b[:, e mod b.ne[1], t] (each token through its
   chosen experts); dot products accumulated in double */
int csimd_mul_mat_id(const csimd_tensor *w, const csimd_tensor *b, const csimd_tensor *ids, const csimd_tensor *d,
                     int nth) {
    if (!nonneg(w) || !nonneg(b) || !nonneg(ids) || !nonneg(d) || ids->type != CSIMD_I32 || d->type != CSIMD_F32 ||
        w->type == CSIMD_I32 || b->type == CSIMD_I32 || w->ne[3] != 1 || b->ne[3] != 1 || w->ne[0] != b->ne[0] ||
        b->ne[1] <= 0 || ids->ne[1] != b->ne[2] || d->ne[0] != w->ne[1] || d->ne[1] != ids->ne[0] ||
        d->ne[2] != ids->ne[1])
        return -1;
    const int64_t K = w->ne[0], M = w->ne[1], n_used = ids->ne[0], n_tok = ids->ne[1], nb1 = b->ne[1];
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t e = 0; e < n_used; e++) {
            int32_t x;
            memcpy(&x, ELT(ids, e, t, 0, 0), 4);
            if (x < 0 || x >= w->ne[2]) return -1;
        }
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t et = 0; et < n_used * n_tok; et++) {
        const int64_t e = et % n_used, t = et / n_used;
        int32_t x;
        memcpy(&x, ELT(ids, e, t, 0, 0), 4);
        for (int64_t m = 0; m < M; m++) {
            double s = 0.0;
            if (w->type == CSIMD_F32 && b->type == CSIMD_F32 && w->nb[0] == 4 && b->nb[0] == 4) {
                const float *wr = (const float *)ELT(w, 0, m, x, 0), *br = (const float *)ELT(b, 0, e % nb1, t, 0);
                for (int64_t k = 0; k < K; k++) s += (double)wr[k] * br[k];
            } else {
                /* an F16/BF16 weight takes b rounded to its type (ggml's CPU: its vec_dot_type) */
                const int wt = w->type, round_b = (wt == CSIMD_F16 || wt == CSIMD_BF16) && b->type == CSIMD_F32;
                for (int64_t k = 0; k < K; k++) {
                    float bv = load_f32(ELT(b, k, e % nb1, t, 0), b->type);
                    if (round_b) bv = wt == CSIMD_F16 ? f16_to_f32_sw(f32_to_f16_sw(bv)) : bf16_to_f32(f32_to_bf16(bv));
                    s += (double)load_f32(ELT(w, k, m, x, 0), wt) * bv;
                }
            }
            const float v = (float)s;
            memcpy(ELT(d, m, e, t, 0), &v, 4);
        }
    }
    return 0;
}

/* COUNT_EQUAL: the number of equal elements of two I32 tensors of one shape, as an I64 scalar */
int csimd_count_equal(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(b) || !nonneg(d) || !same_ne(a, b) || a->type != CSIMD_I32 || b->type != CSIMD_I32 ||
        d->type != CSIMD_I64)
        return -1;
    const int64_t n0 = a->ne[0], nr = a->ne[1] * a->ne[2] * a->ne[3];
    int64_t total = 0;
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1) reduction(+ : total)
    for (int64_t r = 0; r < nr; r++) {
        const int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
        int64_t cnt = 0;
        for (int64_t i = 0; i < n0; i++) {
            int32_t x, y;
            memcpy(&x, ELT(a, i, i1, i2, i3), 4);
            memcpy(&y, ELT(b, i, i1, i2, i3), 4);
            cnt += x == y;
        }
        total += cnt;
    }
    memcpy(d->data, &total, 8);
    return 0;
}

/* POOL_1D (k1 = s1 = 1, p1 = 0, every row of a on its own; AVG: the mean of the taps inside a) and
   POOL_2D (planes of ne0 x ne1; AVG: the sum over k0*k1, padding counted). MAX starts from -FLT_MAX
   and lets a NaN through; sums in double, taps in row-major order, as the reference */
int csimd_pool(int dims2, int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
               const csimd_tensor *a, const csimd_tensor *d, int nth) {
    if (!nonneg(a) || !nonneg(d) || d->type != CSIMD_F32 || (a->type != CSIMD_F32 && a->type != CSIMD_F16) ||
        k0 < 1 || k1 < 1 || s0 < 1 || s1 < 1 || p0 < 0 || p1 < 0 || d->ne[2] != a->ne[2] || d->ne[3] != a->ne[3])
        return -1;
    if (!dims2 && (k1 != 1 || s1 != 1 || p1 != 0 || d->ne[1] != a->ne[1])) return -1;
    int rc = 0;
    nth = clamp_threads(nth);
    CALL_RC(rc, pool, dims2, op_max, k0, k1, s0, s1, p0, p1, a, d, nth)
    return rc;
}

/* IM2COL: 2D d[ic*KH*KW + kh*KW + kw, ox, oy, n] = b[ox*s0 + kw*d0 - p0, oy*s1 + kh*d1 - p1, ic, n];
   1D (KH = 1) d[ic*KW + kw, ox, n, 0] = b[ox*s0 + kw*d0 - p0, ic, n, 0]; taps outside b read 0 */
int csimd_im2col(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t KH,
                 int64_t KW, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    if (!nonneg(b) || !nonneg(d) || b->type == CSIMD_I32 || b->type == CSIMD_I64 ||
        (d->type != CSIMD_F32 && d->type != CSIMD_F16) || KH < 1 || KW < 1 || s0 < 0 || s1 < 0 || d0 < 0 ||
        d1 < 0 || p0 < 0 || p1 < 0)
        return -1;
    if (!is2d) { KH = 1; s1 = 1; p1 = 0; d1 = 1; }
    const int64_t IW = b->ne[0], IH = is2d ? b->ne[1] : 1, IC = is2d ? b->ne[2] : b->ne[1];
    const int64_t N = is2d ? b->ne[3] : b->ne[2], OW = d->ne[1], OH = is2d ? d->ne[2] : 1;
    if (d->ne[0] != IC * KH * KW || (is2d ? d->ne[3] : d->ne[2]) != N || (!is2d && (b->ne[3] != 1 || d->ne[3] != 1)))
        return -1;
    nth = clamp_threads(nth);
    const int64_t pw = (OW - 1) * s0 + (KW - 1) * d0 + 1;
    if ((double)IC * (double)KH * (double)pw * 4.0 <= (double)(64 << 20)) { /* padded input rows per thread */
        int rc = 0;
        CALL_RC(rc, im2col, is2d, s0, s1, p0, p1, d0, d1, KH, KW, b, d, nth)
        return rc;
    }
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t r = 0; r < N * OH * OW; r++) {
        const int64_t ox = r % OW, oy = (r / OW) % OH, n = r / (OW * OH);
        for (int64_t ic = 0; ic < IC; ic++)
            for (int64_t kh = 0; kh < KH; kh++) {
                const int64_t y = oy * s1 + kh * d1 - p1;
                for (int64_t kw = 0; kw < KW; kw++) {
                    const int64_t x = ox * s0 + kw * d0 - p0, col = (ic * KH + kh) * KW + kw;
                    float v = 0.0f;
                    if (x >= 0 && x < IW && y >= 0 && y < IH)
                        v = is2d ? load_f32(ELT(b, x, y, ic, n), b->type) : load_f32(ELT(b, x, ic, n, 0), b->type);
                    store_f32(is2d ? ELT(d, col, ox, oy, n) : ELT(d, col, ox, n, 0), d->type, v);
                }
            }
    }
    return 0;
}

/* POOL_2D_BACK: d (F32, x's extents) = the adjoint of POOL_2D at x; MAX sends each grad to the first
   strictly greatest tap of its window (none when no tap beats -FLT_MAX), AVG spreads grad/(k0*k1) over
   the taps inside x; sums per plane in double, in the reference's order */
int csimd_pool_2d_back(int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
                       const csimd_tensor *g, const csimd_tensor *x, const csimd_tensor *d, int nth) {
    if (!nonneg(g) || !nonneg(x) || !nonneg(d) || !same_ne(x, d) || d->type != CSIMD_F32 ||
        (g->type != CSIMD_F32 && g->type != CSIMD_F16) || (x->type != CSIMD_F32 && x->type != CSIMD_F16) ||
        k0 < 1 || k1 < 1 || s0 < 1 || s1 < 1 || p0 < 0 || p1 < 0 || g->ne[2] != x->ne[2] || g->ne[3] != x->ne[3])
        return -1;
    const int64_t W = x->ne[0], H = x->ne[1], OW = g->ne[0], OH = g->ne[1], np_ = x->ne[2] * x->ne[3];
    int failed = 0;
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
        double *acc = (double *)malloc((size_t)(W * H > 0 ? W * H : 1) * sizeof(double));
        if (!acc) failed = 1;
#pragma omp for schedule(static)
        for (int64_t pl = 0; pl < np_; pl++) {
            if (!acc) continue;
            const int64_t i2 = pl % x->ne[2], i3 = pl / x->ne[2];
            for (int64_t i = 0; i < W * H; i++) acc[i] = 0.0;
            if (op_max) {
                for (int64_t oy = 0; oy < OH; oy++)
                    for (int64_t ox = 0; ox < OW; ox++) {
                        float best = -FLT_MAX;
                        int64_t where = -1;
                        for (int64_t ky = 0; ky < k1; ky++) {
                            const int64_t y = oy * s1 + ky - p1;
                            if (y < 0 || y >= H) continue;
                            for (int64_t kx = 0; kx < k0; kx++) {
                                const int64_t xx = ox * s0 + kx - p0;
                                if (xx < 0 || xx >= W) continue;
                                const float v = load_f32(ELT(x, xx, y, i2, i3), x->type);
                                if (v > best) { best = v; where = y * W + xx; }
                            }
                        }
                        if (where >= 0) acc[where] += (double)load_f32(ELT(g, ox, oy, i2, i3), g->type);
                    }
            } else {
                for (int64_t ky = 0; ky < k1; ky++)
                    for (int64_t kx = 0; kx < k0; kx++)
                        for (int64_t oy = 0; oy < OH; oy++) {
                            const int64_t y = oy * s1 + ky - p1;
                            if (y < 0 || y >= H) continue;
                            for (int64_t ox = 0; ox < OW; ox++) {
                                const int64_t xx = ox * s0 + kx - p0;
                                if (xx < 0 || xx >= W) continue;
                                acc[y * W + xx] +=
                                    (double)load_f32(ELT(g, ox, oy, i2, i3), g->type) / (double)(k0 * k1);
                            }
                        }
            }
            for (int64_t y = 0; y < H; y++)
                for (int64_t xx = 0; xx < W; xx++) {
                    const float o = (float)acc[y * W + xx];
                    memcpy(ELT(d, xx, y, i2, i3), &o, 4);
                }
        }
        free(acc);
    }
    return failed ? -2 : 0;
}

/* FLASH_ATTN_EXT: q [D, NQ, H, B], k [D, NKV, Hk, B], v [Dv, NKV, Hv, B] (Hk, Hv divide H), mask
   [>= NKV, >= NQ, m2, m3] or NULL; sinks: F32, one value per head in logical order, or NULL (read at
   call time); slopes: H floats, sized by the caller; d [Dv, H, NQ, B] F32 */
static int is_float_type(int t) { return t == CSIMD_F32 || t == CSIMD_F16 || t == CSIMD_BF16; }

int csimd_flash_attn_ext(const csimd_tensor *q, const csimd_tensor *k, const csimd_tensor *v, const csimd_tensor *mask,
                         const csimd_tensor *sinks, const float *slopes, float scale, float softcap,
                         const csimd_tensor *d, int nth) {
    int rc = 0;
    if (!nonneg(q) || !nonneg(k) || !nonneg(v) || !nonneg(d) || (mask && !nonneg(mask)) || !slopes) return -1;
    if (!is_float_type(q->type) || !is_float_type(k->type) || !is_float_type(v->type) || d->type != CSIMD_F32 ||
        (mask && mask->type != CSIMD_F32 && mask->type != CSIMD_F16))
        return -1;
    for (int i = 0; i < 4; i++)
        if (q->ne[i] <= 0 || k->ne[i] <= 0 || v->ne[i] <= 0) return -1;
    if (k->ne[0] != q->ne[0] || v->ne[1] != k->ne[1] || q->ne[2] % k->ne[2] || q->ne[2] % v->ne[2] ||
        k->ne[3] != q->ne[3] || v->ne[3] != q->ne[3] || d->ne[0] != v->ne[0] || d->ne[1] != q->ne[2] ||
        d->ne[2] != q->ne[1] || d->ne[3] != q->ne[3])
        return -1;
    if (mask && (mask->ne[0] < k->ne[1] || mask->ne[1] < q->ne[1] || mask->ne[2] <= 0 || mask->ne[3] <= 0)) return -1;
    if (sinks && (!nonneg(sinks) || sinks->type != CSIMD_F32 || sinks->ne[0] <= 0 || sinks->ne[1] <= 0 ||
                  sinks->ne[2] <= 0 || sinks->ne[3] <= 0 || nelem(sinks) < q->ne[2]))
        return -1;
    nth = clamp_threads(nth);
    CALL_RC(rc, flash_attn, q, k, v, mask, sinks, slopes, scale, softcap, d, nth)
    return rc;
}

/* CONV_2D: a [KW, KH, IC, OC], b [W, H, IC, N] -> d [OW, OH, OC, N] of b's type (F32/F16); every
   column an output position reads must lie inside b's row or its padding */
int csimd_conv_2d(int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, const csimd_tensor *a,
                  const csimd_tensor *b, const csimd_tensor *d, int nth) {
    int rc = 0;
    if (!nonneg(a) || !nonneg(b) || !nonneg(d) || !is_float_type(a->type) ||
        (b->type != CSIMD_F32 && b->type != CSIMD_F16) || d->type != b->type)
        return -1;
    if (s0 < 1 || s1 < 1 || d0 < 1 || d1 < 1 || p0 < 0 || p1 < 0) return -1;
    for (int i = 0; i < 4; i++)
        if (a->ne[i] <= 0 || b->ne[i] <= 0 || d->ne[i] <= 0) return -1;
    if (a->ne[2] != b->ne[2] || d->ne[2] != a->ne[3] || d->ne[3] != b->ne[3]) return -1;
    nth = clamp_threads(nth);
    CALL_RC(rc, conv_2d, s0, s1, p0, p1, d0, d1, a, b, d, nth)
    return rc;
}

/* CONV_TRANSPOSE_1D: a [K, OC, IC], b [L, IC] -> d [(L-1)*s0 + K, OC] F32 */
int csimd_conv_transpose_1d(int64_t s0, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    int rc = 0;
    if (!nonneg(a) || !nonneg(b) || !nonneg(d) || !is_float_type(a->type) || !is_float_type(b->type) ||
        d->type != CSIMD_F32 || s0 < 1)
        return -1;
    for (int i = 0; i < 4; i++)
        if (a->ne[i] <= 0 || b->ne[i] <= 0 || d->ne[i] <= 0) return -1;
    if (a->ne[3] != 1 || b->ne[2] != 1 || b->ne[3] != 1 || d->ne[2] != 1 || d->ne[3] != 1 || a->ne[2] != b->ne[1] ||
        d->ne[1] != a->ne[1] || d->ne[0] != (b->ne[0] - 1) * s0 + a->ne[0])
        return -1;
    nth = clamp_threads(nth);
    CALL_RC(rc, conv_transpose_1d, s0, a, b, d, nth)
    return rc;
}

/* ROPE's per-pair tables that depend on the op's parameters only (inverse frequency, position stream,
   YaRN ramp mix), as the reference computes them, in double. A model calls ROPE with a few parameter
   sets only (Gemma 3: two, 36 calls a decode step), and the tables cost n_pairs pow() calls (3-4 us of a
   5-8 us call at 128 pairs): the first ROPE_TABS sets met are kept, shared by every thread (published
   whole before the count that makes them visible; never changed or freed), the others built per call. */
typedef struct {
    int mode;
    int64_t n_dims, sections[4];
    double freq_base, ext_factor, corr_low, corr_high;
} rope_key;

typedef struct {
    rope_key key;
    double *inv_freq, *mix; /* n_pairs each */
    int *which;
} rope_tabs;

#define ROPE_TABS 16
static rope_tabs g_rope_tabs[ROPE_TABS];
static int g_rope_ntabs; /* published with release stores; read with acquire loads */
static pthread_mutex_t g_rope_lock = PTHREAD_MUTEX_INITIALIZER;

static int rope_key_eq(const rope_key *a, const rope_key *b) {
    return a->mode == b->mode && a->n_dims == b->n_dims && !memcmp(a->sections, b->sections, sizeof a->sections) &&
           !memcmp(&a->freq_base, &b->freq_base, sizeof(double)) &&
           !memcmp(&a->ext_factor, &b->ext_factor, sizeof(double)) &&
           !memcmp(&a->corr_low, &b->corr_low, sizeof(double)) && !memcmp(&a->corr_high, &b->corr_high, sizeof(double));
}

/* fills inv_freq, mix and which (n_pairs each) for the parameters of k */
static void rope_build(const rope_key *k, int64_t n_pairs, double *inv_freq, double *mix, int *which) {
    const int mode = k->mode, multi = mode == 8 || mode == 24 || mode == 40;
    const int64_t s0 = k->sections[0], s1 = k->sections[1], s2 = k->sections[2], ssum = s0 + s1 + s2 + k->sections[3];
    const double span = k->corr_high - k->corr_low > 0.001 ? k->corr_high - k->corr_low : 0.001;
    for (int64_t i = 0; i < n_pairs; i++) {
        int w = 0;
        double e = (double)i; /* the exponent's pair index: VISION restarts it in each section */
        if (multi) {
            const int64_t sect = i % ssum;
            if (mode == 40) w = (sect % 3 == 1 && sect < 3 * s1) ? 1 : (sect % 3 == 2 && sect < 3 * s2) ? 2
                              : (sect % 3 == 0 && sect < 3 * s0) ? 0 : 3;
            else w = sect < s0 ? 0 : sect < s0 + s1 ? 1 : sect < s0 + s1 + s2 ? 2 : 3;
            if (mode == 24) {
                const int64_t start[4] = {0, s0, s0 + s1, s0 + s1 + s2};
                e = (double)(sect - start[w]);
            }
        }
        which[i] = w;
        inv_freq[i] = pow(k->freq_base, -2.0 * e / (double)k->n_dims);
        double ramp = ((double)i - k->corr_low) / span;
        ramp = 1.0 - (ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp);
        mix[i] = ramp * k->ext_factor;
    }
}

/* the kept tables of k (n_pairs follows from k), or NULL when they are not kept and ROPE_TABS are */
static const rope_tabs *rope_tables(const rope_key *k, int64_t n_pairs) {
    int n = __atomic_load_n(&g_rope_ntabs, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++)
        if (rope_key_eq(&g_rope_tabs[i].key, k)) return &g_rope_tabs[i];
    const rope_tabs *found = NULL;
    pthread_mutex_lock(&g_rope_lock);
    n = __atomic_load_n(&g_rope_ntabs, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && !found; i++)
        if (rope_key_eq(&g_rope_tabs[i].key, k)) found = &g_rope_tabs[i];
    if (!found && n < ROPE_TABS) {
        rope_tabs *t = &g_rope_tabs[n];
        double *d = (double *)malloc((size_t)n_pairs * 2 * sizeof(double));
        int *w = (int *)malloc((size_t)n_pairs * sizeof(int));
        if (d && w) {
            rope_build(k, n_pairs, d, d + n_pairs, w);
            t->key = *k;
            t->inv_freq = d;
            t->mix = d + n_pairs;
            t->which = w;
            __atomic_store_n(&g_rope_ntabs, n + 1, __ATOMIC_RELEASE);
            found = t;
        } else {
            free(d);
            free(w);
        }
    }
    pthread_mutex_unlock(&g_rope_lock);
    return found;
}

/* ROPE / ROPE_BACK (back = 1: the inverse rotation). The per-pair tables (inverse frequency, position
   stream, YaRN ramp mix: rope_tables; freq factors read per call, they are a tensor's values) as the
   reference computes them, in double; the kernel then computes each token's cos/sin cache once and
   rotates every row with it. corr_low/high: YaRN's correction range of pair indices
   (prism_core.semantics.rope_yarn_corr_dims), used when ext_factor != 0. */
int csimd_rope(int back, int mode, int64_t n_dims, int64_t n_offs, const int64_t *sections, double freq_base,
               double freq_scale, double ext_factor, double attn_factor, double corr_low, double corr_high,
               const csimd_tensor *a, const csimd_tensor *pos, const csimd_tensor *ff, const csimd_tensor *d, int nth) {
    const int multi = mode == 8 || mode == 24 || mode == 40;
    if (mode != 0 && mode != 2 && !multi) return -1;
    if (!nonneg(a) || !nonneg(d) || !nonneg(pos) || !same_ne(a, d) || a->type != d->type ||
        (a->type != CSIMD_F32 && a->type != CSIMD_F16) || pos->type != CSIMD_I32 || (ff && !nonneg(ff)) ||
        (ff && ff->type != CSIMD_F32) || !sections || n_dims <= 0 || n_dims % 2 || n_offs < 0 || n_offs % 2 ||
        !(freq_base > 0) || !(freq_scale > 0))
        return -1;
    for (int k = 0; k < 4; k++)
        if (a->ne[k] <= 0 || sections[k] < 0) return -1;
    const int64_t n_pairs = mode == 24 ? n_dims : n_dims / 2, streams = multi ? 4 : 1;
    const int64_t ssum = sections[0] + sections[1] + sections[2] + sections[3];
    if ((mode == 24 && n_offs != 0) || n_offs + 2 * n_pairs > a->ne[0] || pos->ne[0] < streams * a->ne[2] ||
        (multi && ssum <= 0) || (ff && nelem(ff) < n_pairs))
        return -1;
    rope_key key = {mode, n_dims, {0, 0, 0, 0}, freq_base, ext_factor, corr_low, corr_high};
    if (multi) memcpy(key.sections, sections, sizeof key.sections); /* the other modes ignore them */
    csimd_rope_tab t;
    t.mode = mode;
    t.streams = (int)streams;
    t.n_pairs = n_pairs;
    t.n_offs = n_offs;
    t.freq_scale = freq_scale;
    t.ext_factor = ext_factor;
    t.mscale = ext_factor != 0.0 ? attn_factor * (1.0 + 0.1 * log(1.0 / freq_scale)) : attn_factor;
    t.sign = back ? -1.0 : 1.0;
    const rope_tabs *kept = rope_tables(&key, n_pairs);
    /* per call: the freq factors, and the tables when they are not kept */
    double *own = (double *)malloc((size_t)n_pairs * ((kept ? 0 : 2) + (ff ? 1 : 0)) * sizeof(double) + 8);
    int *own_which = kept ? NULL : (int *)malloc((size_t)n_pairs * sizeof(int));
    if (!own || (!kept && !own_which)) {
        free(own);
        free(own_which);
        return -2;
    }
    if (kept) {
        t.inv_freq = kept->inv_freq;
        t.mix = kept->mix;
        t.which = kept->which;
    } else {
        t.inv_freq = own;
        t.mix = own + n_pairs;
        t.which = own_which;
        rope_build(&key, n_pairs, t.inv_freq, t.mix, t.which);
    }
    t.ffac = ff ? own + (kept ? 0 : 2 * n_pairs) : NULL;
    for (int64_t k = 0; ff && k < n_pairs; k++) { /* element k of ff in logical (row-major) order */
        const int64_t i0 = k % ff->ne[0], i1 = (k / ff->ne[0]) % ff->ne[1];
        const int64_t i2 = (k / (ff->ne[0] * ff->ne[1])) % ff->ne[2], i3 = k / (ff->ne[0] * ff->ne[1] * ff->ne[2]);
        float v;
        memcpy(&v, ELT(ff, i0, i1, i2, i3), 4);
        t.ffac[k] = (double)v;
    }
    int rc = 0;
    nth = clamp_threads(nth);
    CALL_RC(rc, rope, &t, a, pos, d, nth)
    free(own);
    free(own_which);
    return rc;
}

/* UPSCALE (F32 -> F32): NEAREST, or BILINEAR in dims 0, 1 with or without align_corners */
int csimd_upscale(int bilinear, int align_corners, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    int rc = 0;
    if (!nonneg(a) || !nonneg(d) || a->type != CSIMD_F32 || d->type != CSIMD_F32 || (align_corners && !bilinear))
        return -1;
    for (int k = 0; k < 4; k++)
        if (a->ne[k] <= 0 || d->ne[k] <= 0) return -1;
    nth = clamp_threads(nth);
    CALL_RC(rc, upscale, bilinear, align_corners, a, d, nth)
    return rc;
}

/* IM2COL_BACK: d (F32, the input's extents) = the adjoint of IM2COL applied to g (IM2COL's extents) */
int csimd_im2col_back(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t KH,
                      int64_t KW, const csimd_tensor *g, const csimd_tensor *d, int nth) {
    if (!nonneg(g) || !nonneg(d) || d->type != CSIMD_F32 || g->type == CSIMD_I32 || g->type == CSIMD_I64 ||
        KH < 1 || KW < 1 || s0 < 1 || p0 < 0 || d0 < 0)
        return -1;
    if (!is2d) { KH = 1; s1 = 1; p1 = 0; d1 = 1; }
    if (s1 < 1 || p1 < 0 || d1 < 0) return -1;
    const int64_t IC = is2d ? d->ne[2] : d->ne[1], N = is2d ? d->ne[3] : d->ne[2];
    if (g->ne[0] != IC * KH * KW || (is2d ? g->ne[3] : g->ne[2]) != N ||
        (!is2d && (g->ne[3] != 1 || d->ne[3] != 1)))
        return -1;
    nth = clamp_threads(nth);
    CALL(im2col_back, is2d, s0, s1, p0, p1, d0, d1, KH, KW, g, d, nth)
    return 0;
}

#include "csimd_quant_api.h" /* the quantized kernels' entry points */
