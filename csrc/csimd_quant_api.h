/* Entry points of the quantized kernels (declared in csimd.h), included at the end of csimd.c.
   The quantized kernels run the AVX-512 copy only where the CPU also has AVX512BW and VNNI; an
   AVX-512F-only CPU runs their AVX2 copy. */

static int q_isa(void) {
    int isa = csimd_get_isa();
#if CSIMD_X86
    if (isa == 2 && !(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))) isa = 1;
#endif
    return isa;
}

#if CSIMD_X86
#define QCALL_RC(rc, fn, ...)                                              \
    switch (q_isa()) {                                                     \
    case 2: rc = fn##_avx512(__VA_ARGS__); break;                          \
    case 1: rc = fn##_avx2(__VA_ARGS__); break;                            \
    default: rc = fn##_scalar(__VA_ARGS__); break;                         \
    }
#define QCALL(fn, ...)                                                     \
    switch (q_isa()) {                                                     \
    case 2: fn##_avx512(__VA_ARGS__); break;                               \
    case 1: fn##_avx2(__VA_ARGS__); break;                                 \
    default: fn##_scalar(__VA_ARGS__); break;                              \
    }
#else
#define QCALL_RC(rc, fn, ...) rc = fn##_scalar(__VA_ARGS__);
#define QCALL(fn, ...) fn##_scalar(__VA_ARGS__);
#endif

int csimd_q_isa(void) { return q_isa(); }

int csimd_q_info(int t, int *block_elems, int *block_bytes, int *has_quantizer) {
    if (!q_block_elems(t)) return -1;
    *block_elems = q_block_elems(t);
    *block_bytes = q_block_bytes(t);
    *has_quantizer = q_has_quantizer(t);
    return 0;
}

int csimd_q_dequantize(int t, const void *src, float *dst, int64_t n, int nth) {
    const int be = q_block_elems(t);
    if (!be || n < 0 || n % be || (n && (!src || !dst))) return -1;
    const int64_t nb = n / be, per = (CHUNK + be - 1) / be, chunks = (nb + per - 1) / per;
    const uint8_t *s = (const uint8_t *)src;
    const int bb = q_block_bytes(t);
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t b0 = c * per, b1 = b0 + per < nb ? b0 + per : nb;
        QCALL(q_dequant_row, t, s + b0 * bb, dst + b0 * be, (b1 - b0) * be)
    }
    return 0;
}

/* mode 0: as ggml's CPU backend converts F32 to t (its from_float), 1: ggml's reference quantizer */
int csimd_q_quantize(int t, int mode, const float *src, void *dst, int64_t n, int nth) {
    const int be = q_block_elems(t);
    if (!be || !q_has_quantizer(t) || mode < 0 || mode > 1 || n < 0 || n % be || (n && (!src || !dst))) return -1;
    const int64_t nb = n / be;
    const int bb = q_block_bytes(t);
    uint8_t *d = (uint8_t *)dst;
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t b = 0; b < nb; b++) q_quantize_block(t, mode, src + b * be, d + b * bb);
    return 0;
}

/* rows dot products of K elements: w rows of type wt, a rows already in the activation type at */
int csimd_q_vec_dot(int wt, const void *w, int at, const void *a, int64_t K, int64_t rows, float *out) {
    const int bw = q_block_elems(wt), ba = q_block_elems(at);
    if (!bw || !q_is_act_type(at) || K < 0 || rows < 0 || K % bw || K % ba || (rows && (!w || !a || !out))) return -1;
    int rc = 0;
    QCALL_RC(rc, q_vec_dot, wt, (const uint8_t *)w, at, (const uint8_t *)a, K, rows, out)
    return rc;
}

static inline int q_type_of(const csimd_tensor *t) {
    return t->type >= CSIMD_QBASE && q_block_elems(t->type - CSIMD_QBASE) ? t->type - CSIMD_QBASE : -1;
}

/* a quantized view: whole blocks, rows of contiguous blocks (nb[0] = the block's bytes) */
static int q_view_ok(const csimd_tensor *t, int qt) {
    return nonneg(t) && t->ne[0] % q_block_elems(qt) == 0 && t->nb[0] == q_block_bytes(qt);
}

/* MUL_MAT with a quantized a (weights [K, M, a2, a3]) and an F32 b ([K, N, b2, b3], any strides):
   d (F32, contiguous rows) = b's rows, quantized to the activation type at, times a's rows */
int csimd_q_mul_mat(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int at, int nth) {
    const int qa = q_type_of(a);
    if (qa < 0 || !q_is_act_type(at) || !q_view_ok(a, qa) || !nonneg(b) || !nonneg(d) || b->type != CSIMD_F32 ||
        d->type != CSIMD_F32 || !blocks(a, b) || b->ne[0] != a->ne[0] || a->ne[0] % q_block_elems(at) ||
        d->ne[0] != a->ne[1] || d->ne[1] != b->ne[1] || d->ne[2] != b->ne[2] || d->ne[3] != b->ne[3] ||
        d->nb[0] != 4 || d->nb[1] % 4 || b->nb[0] % 4)
        return -1;
    if (nelem(d) == 0) return 0;
    if (a->ne[0] == 0) { /* an empty sum */
        for (int64_t i3 = 0; i3 < d->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < d->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < d->ne[1]; i1++) memset(ELT(d, 0, i1, i2, i3), 0, (size_t)d->ne[0] * 4);
        return 0;
    }
    int rc = 0;
    nth = clamp_threads(nth);
    QCALL_RC(rc, q_mul_mat, qa, at, a, b, d, nth)
    return rc;
}
