/* Entry points of the quantized kernels (declared in csimd.h), included at the end of csimd.c.
   The quantized kernels run the AVX-512 copy only where the CPU also has AVX512BW and VNNI; an
   AVX-512F-only CPU runs their AVX-VNNI or AVX2 copy. */

static int q_isa(void) {
    int isa = csimd_get_isa();
#if CSIMD_X86
    if (isa == CSIMD_ISA_AVX512 && !(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")))
        isa = isa_runs(CSIMD_ISA_AVXVNNI) ? CSIMD_ISA_AVXVNNI : CSIMD_ISA_AVX2;
#endif
    return isa;
}

/* the quantized kernels of the active path */
static const csimd_qkernels *qkernels(void) {
    switch (q_isa()) {
#if CSIMD_X86
    case CSIMD_ISA_AVX512: return &csimd_qkernels_avx512;
    case CSIMD_ISA_AVXVNNI: return &csimd_qkernels_avxvnni;
    case CSIMD_ISA_AVX2: return &csimd_qkernels_avx2;
#elif CSIMD_ARM64
    case CSIMD_ISA_I8MM: return &csimd_qkernels_i8mm;
    case CSIMD_ISA_DOTPROD: return &csimd_qkernels_dotprod;
    case CSIMD_ISA_NEON: return &csimd_qkernels_neon;
#endif
    default: return &csimd_qkernels_scalar;
    }
}
#define QCALL(fn, ...) qkernels()->fn(__VA_ARGS__);
#define QCALL_RC(rc, fn, ...) rc = qkernels()->fn(__VA_ARGS__);

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
        QCALL(q_dequant, t, s + b0 * bb, dst + b0 * be, (b1 - b0) * be)
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

/* nrows rows of n_per_row floats to block type t, a row at a time (csimd_quantize_rows.h) */
int csimd_q_quantize_rows(int t, int mode, const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                          const float *imatrix, int nth) {
    const int be = q_block_elems(t);
    if (!be || mode < Q_MODE_CPU || mode > Q_MODE_CHUNK || nrows < 0 || n_per_row <= 0 || n_per_row % be ||
        (nrows && (!src || !dst)) || (imatrix && mode != Q_MODE_CHUNK))
        return -1;
    const int avail = q_row_quantizer(t, mode);
    if (!avail) return -1;
    if (avail == 2 && !imatrix) return -2;
    const q_grid *g = NULL;
    if (q_is_grid_type(t) && nrows && !(g = q_grid_ready(t))) return -1;
    const int64_t rb = n_per_row / be * q_block_bytes(t);
    int failed = 0;
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(dynamic, 1) if (nth > 1 && nrows > 1) reduction(| : failed)
    for (int64_t r = 0; r < nrows; r++) {
        const float *x = src + r * n_per_row;
        uint8_t *y = (uint8_t *)dst + r * rb;
        failed |= (mode == Q_MODE_CHUNK ? q_quantize_row_chunk(t, x, y, n_per_row, imatrix, g)
                                        : q_quantize_row(t, mode, x, y, n_per_row, g)) != 0;
    }
    return failed ? -1 : 0;
}

int csimd_q_row_quantizer(int t, int mode) { return q_block_elems(t) ? q_row_quantizer(t, mode) : 0; }

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

/* t's block type when t is a quantized view (q_view_ok), else -1 */
static int q_view_type(const csimd_tensor *t) {
    const int qt = q_type_of(t);
    return qt >= 0 && q_view_ok(t, qt) ? qt : -1;
}

static inline int q_mode_ok(int mode) { return mode == 0 || mode == 1; } /* as csimd_q_quantize's */

/* t's block type when the kernels can quantize into t: a quantized view whose type has a quantizer,
   written in a valid mode; else -1 */
static int q_dest_type(const csimd_tensor *t, int mode) {
    const int qt = q_view_type(t);
    return qt >= 0 && q_has_quantizer(qt) && q_mode_ok(mode) ? qt : -1;
}

/* Scratch rows of a parallel loop over rows: one row of n floats (and 16 spare) per thread of nth, 64-byte
   aligned, allocated before the loop so that an op that cannot get them stops before writing anything;
   q_my_row gives the calling thread its own */
static inline int64_t q_row_stride(int64_t n) { return (n + 16 + 15) / 16 * 16; }
static float *q_scratch_rows(int nth, int64_t n) { return (float *)csimd_alloc((size_t)(nth * q_row_stride(n)) * 4); }
static inline float *q_my_row(float *rows, int64_t n) {
#ifdef _OPENMP
    return rows + omp_get_thread_num() * q_row_stride(n);
#else
    (void)n;
    return rows;
#endif
}

/* MUL_MAT with a quantized a (weights [K, M, a2, a3]) and an F32 b ([K, N, b2, b3], any strides):
   d (F32, contiguous rows) = b's rows, quantized to the activation type at, times a's rows */
int csimd_q_mul_mat(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int at, int nth) {
    const int qa = q_view_type(a);
    if (qa < 0 || !q_is_act_type(at) || !nonneg(b) || !nonneg(d) || b->type != CSIMD_F32 ||
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

/* MUL_MAT_ID with quantized experts w [K, M, E] and F32 b [K, nb1, n_tok]: d[:, e, t] (F32) =
   w[:, :, ids[e, t]] . b[:, e mod nb1, t], b's rows quantized to at */
int csimd_q_mul_mat_id(const csimd_tensor *w, const csimd_tensor *b, const csimd_tensor *ids, const csimd_tensor *d,
                       int at, int nth) {
    const int qw = q_view_type(w);
    if (qw < 0 || !q_is_act_type(at) || !nonneg(b) || !nonneg(ids) || !nonneg(d) ||
        ids->type != CSIMD_I32 || d->type != CSIMD_F32 || b->type != CSIMD_F32 || w->ne[3] != 1 || b->ne[3] != 1 ||
        w->ne[0] != b->ne[0] || w->ne[0] % q_block_elems(at) || b->ne[1] <= 0 || ids->ne[1] != b->ne[2] ||
        d->ne[0] != w->ne[1] || d->ne[1] != ids->ne[0] || d->ne[2] != ids->ne[1] || d->nb[0] != 4 || b->nb[0] % 4)
        return -1;
    for (int64_t t = 0; t < ids->ne[1]; t++)
        for (int64_t e = 0; e < ids->ne[0]; e++) {
            int32_t x;
            memcpy(&x, ELT(ids, e, t, 0, 0), 4);
            if (x < 0 || x >= w->ne[2]) return -1;
        }
    if (nelem(d) == 0) return 0;
    int rc = 0;
    nth = clamp_threads(nth);
    QCALL_RC(rc, q_mul_mat_id, qw, at, w, b, ids, d, nth)
    return rc;
}

/* one quantized row (ne0 elements, whole blocks) -> F32 */
static void q_row_dequant(int t, const char *src, float *dst, int64_t n) {
    QCALL(q_dequant, t, (const uint8_t *)src, dst, n)
}

/* GET_ROWS from a quantized a: d[:, i, j, k] (F32/F16/BF16) = a's row idx[i, j, k] of matrix (j, k), dequantized */
int csimd_q_get_rows(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth) {
    const int qt = q_view_type(a);
    if (qt < 0 || !is_float(d->type) || !get_rows_ok(a, idx, d)) return -1;
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    nth = clamp_threads(nth);
    float *rows = q_scratch_rows(nth, n0);
    if (!rows) return -2;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        float *tmp = q_my_row(rows, n0);
        int64_t i, j, k;
        unravel_row(d, ir, &i, &j, &k);
        int32_t r;
        memcpy(&r, ELT(idx, i, j, k, 0), 4);
        if (r < 0 || r >= a->ne[1]) continue; /* checked above; never read outside */
        q_row_dequant(qt, ELT(a, 0, r, j, k), tmp, n0);
        char *dr = ELT(d, 0, i, j, k);
        for (int64_t e = 0; e < n0; e++) store_f32(dr + e * d->nb[0], d->type, tmp[e]);
    }
    free(rows);
    return 0;
}

/* Quantizing refuses what the reference refuses: non-finite floats (ggml's quantizers turn them into
   position-dependent garbage) and a block whose stored scale would overflow (F16 inf: the whole block then
   dequantizes to inf or NaN). The kernels below that quantize check every value first and return
   Q_UNQUANTIZABLE, having written nothing; the Python wrapper has prism_core.quant name the row and block. */
#define Q_UNQUANTIZABLE (-3)

/* No block whose largest magnitude is at most this can overflow a scale: the largest field any quantizer
   stores is Q8_1's s = d * sum(q) <= 32 * amax; every other scale is at most about twice amax
   (prism_core.quant.SAFE_AMAX, the same bound) */
#define Q_SAFE_AMAX 1024.0f

static inline int q_nonfinite_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & 0x7f800000u) == 0x7f800000u; /* all exponent bits set: inf or NaN */
}

/* whether every element of the F32/F16/BF16 tensor a is finite */
static int q_all_finite(const csimd_tensor *a, int nth) {
    const int64_t n0 = a->ne[0], nr = nrows_of(a);
    int bad = 0;
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1 && nr > 1) reduction(| : bad)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(a, ir, &i1, &i2, &i3);
        const char *r = ELT(a, 0, i1, i2, i3);
        int b = 0;
        if (a->type == CSIMD_F32 && a->nb[0] == 4) {
            const float *f = (const float *)r;
            for (int64_t e = 0; e < n0; e++) b |= q_nonfinite_bits(f[e]);
        } else {
            for (int64_t e = 0; e < n0; e++) b |= q_nonfinite_bits(load_f32(r + e * a->nb[0], a->type));
        }
        bad |= b;
    }
    return !bad;
}

/* whether quantizing the block x (t's block of floats, all finite) with mode stores a scale that overflows:
   a block above Q_SAFE_AMAX is quantized alone into scratch and dequantized (a non-finite value then tells),
   Q8_1's s (F16 at byte 2, which dequantizing does not read) checked apart */
static int q_block_overflows(int t, int mode, const float *x) {
    const int be = q_block_elems(t);
    float amax = 0.0f;
    for (int e = 0; e < be; e++) amax = fmaxf(amax, fabsf(x[e]));
    if (amax <= Q_SAFE_AMAX) return 0;
    uint8_t y[320];
    float back[256];
    if (q_quantize_row(t, mode, x, y, be, NULL)) return 0; /* no such quantizer: refused before this */
    q_row_dequant(t, (const char *)y, back, be);
    int bad = 0;
    for (int e = 0; e < be; e++) bad |= q_nonfinite_bits(back[e]);
    if (t == Q_Q8_1) bad |= (((uint16_t)y[3] << 8) & 0x7c00) == 0x7c00;
    return bad;
}

/* element L (row-major over ne) of t */
static inline char *q_elt_linear(const csimd_tensor *t, int64_t L) {
    const int64_t i0 = L % t->ne[0], i1 = (L / t->ne[0]) % t->ne[1], i2 = (L / (t->ne[0] * t->ne[1])) % t->ne[2];
    const int64_t i3 = L / (t->ne[0] * t->ne[1] * t->ne[2]);
    return ELT(t, i0, i1, i2, i3);
}

/* whether the F32/F16/BF16 tensor a (row-major, its element count a multiple of qt's block) can be quantized
   to qt block after block in that order: every value finite, and no block's scale overflowing */
static int q_quantizable(const csimd_tensor *a, int qt, int mode, int nth) {
    if (!q_all_finite(a, nth)) return 0;
    const int be = q_block_elems(qt);
    const int64_t nb = nelem(a) / be;
    const int in_rows = a->type == CSIMD_F32 && a->nb[0] == 4 && a->ne[0] % be == 0;
    int bad = 0;
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1 && nb > 1) reduction(| : bad)
    for (int64_t ib = 0; ib < nb; ib++) {
        float x[256];
        const float *blk = x;
        if (in_rows) { /* a block inside one contiguous F32 row */
            const int64_t L = ib * be;
            blk = (const float *)q_elt_linear(a, L);
        } else {
            for (int e = 0; e < be; e++) x[e] = load_f32(q_elt_linear(a, ib * be + e), a->type);
        }
        bad |= q_block_overflows(qt, mode, blk);
    }
    return !bad;
}

/* CPY/DUP/CONT with a quantized side, elements in row-major order as ggml: quantized -> F32/F16/BF16
   dequantizes, F32/F16/BF16 -> quantized quantizes each destination row (mode: as csimd_q_quantize;
   Q_UNQUANTIZABLE, nothing written, when a is not all finite or a block's scale would overflow), the same
   quantized type copies the blocks (in row-major order, rows of any whole-block length) */
int csimd_q_cpy(const csimd_tensor *a, const csimd_tensor *d, int mode, int nth) {
    const int qa = q_type_of(a), qd = q_type_of(d);
    /* each side F32/F16/BF16 or a quantized view; a quantized d of another type than a's is quantized into */
    const int a_ok = qa >= 0 ? q_view_type(a) >= 0 : is_float(a->type);
    const int d_ok = qd < 0 ? is_float(d->type) : qd == qa ? q_view_type(d) >= 0 : qa < 0 && q_dest_type(d, mode) >= 0;
    if (!nonneg(a) || !nonneg(d) || nelem(a) != nelem(d) || (qa < 0 && qd < 0) || !q_mode_ok(mode) || !a_ok || !d_ok)
        return -1;
    const csimd_tensor *rows = qd >= 0 ? d : a; /* the quantized side sets the rows */
    const int64_t n0 = rows->ne[0], nr = nrows_of(rows);
    nth = clamp_threads(nth);
    if (qd >= 0 && qa < 0 && !q_quantizable(a, qd, mode, nth)) return Q_UNQUANTIZABLE;
    float *scratch = q_scratch_rows(nth, n0);
    if (!scratch) return -2;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        float *tmp = q_my_row(scratch, n0);
        int64_t i1, i2, i3;
        unravel_row(rows, ir, &i1, &i2, &i3);
        if (qa >= 0 && qd >= 0) { /* the blocks in row-major order (a CONT may change the row length) */
            const int64_t be = q_block_elems(qa), bb = q_block_bytes(qa), bd = n0 / be, ba = a->ne[0] / be;
            for (int64_t jb = 0; jb < bd; jb++) {
                const int64_t L = ir * bd + jb, ra = L / ba;
                int64_t j1, j2, j3;
                unravel_row(a, ra, &j1, &j2, &j3);
                memcpy(ELT(d, 0, i1, i2, i3) + jb * bb, ELT(a, 0, j1, j2, j3) + (L % ba) * bb, (size_t)bb);
            }
        } else if (qa >= 0) {
            if (d->type == CSIMD_F32 && d->nb[0] == 4 && d->ne[0] == n0) { /* row for row */
                int64_t j1, j2, j3;
                unravel_row(d, ir, &j1, &j2, &j3);
                q_row_dequant(qa, ELT(a, 0, i1, i2, i3), (float *)ELT(d, 0, j1, j2, j3), n0);
                continue;
            }
            q_row_dequant(qa, ELT(a, 0, i1, i2, i3), tmp, n0);
            for (int64_t e = 0; e < n0; e++) store_f32(q_elt_linear(d, ir * n0 + e), d->type, tmp[e]);
        } else {
            if (a->ne[0] == n0) { /* row for row */
                int64_t j1, j2, j3;
                unravel_row(a, ir, &j1, &j2, &j3);
                const char *ar = ELT(a, 0, j1, j2, j3);
                for (int64_t e = 0; e < n0; e++) tmp[e] = load_f32(ar + e * a->nb[0], a->type);
            } else {
                for (int64_t e = 0; e < n0; e++) tmp[e] = load_f32(q_elt_linear(a, ir * n0 + e), a->type);
            }
            q_quantize_row(qd, mode, tmp, (uint8_t *)ELT(d, 0, i1, i2, i3), n0, NULL);
        }
    }
    free(scratch);
    return 0;
}

/* SET_ROWS into a quantized d: d[:, c[i, j mod C1, k mod C2], j, k] = b[:, i, j, k] quantized (mode: as
   csimd_q_quantize); the other rows are left as they are. Indices are checked first, then that b can be
   quantized (Q_UNQUANTIZABLE otherwise, nothing written). */
int csimd_q_set_rows(const csimd_tensor *b, const csimd_tensor *c, const csimd_tensor *d, int mode, int nth) {
    const int qd = q_dest_type(d, mode);
    if (qd < 0 || !is_float(b->type) || !set_rows_ok(b, c, d)) return -1;
    const int64_t m = b->ne[1], n0 = b->ne[0], nj = d->ne[2], nk = d->ne[3];
    nth = clamp_threads(nth);
    if (!q_quantizable(b, qd, mode, nth)) return Q_UNQUANTIZABLE;
    float *rows = q_scratch_rows(nth, n0);
    if (!rows) return -2;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t jk = 0; jk < nj * nk; jk++) {
        float *tmp = q_my_row(rows, n0);
        const int64_t j = jk % nj, k = jk / nj;
        for (int64_t i = 0; i < m; i++) { /* in index order: a repeated index keeps the last row, as the reference */
            const int64_t r = load_index(ELT(c, i, j % c->ne[1], k % c->ne[2], 0), c->type);
            for (int64_t e = 0; e < n0; e++) tmp[e] = load_f32(ELT(b, e, i, j, k), b->type);
            q_quantize_row(qd, mode, tmp, (uint8_t *)ELT(d, 0, r, j, k), n0, NULL);
        }
    }
    free(rows);
    return 0;
}

/* a quantized a dequantized whole into a contiguous F32 copy (*t describes it; free t->data) */
static int q_dequant_tensor(const csimd_tensor *a, int qt, csimd_tensor *t, int nth) {
    const int64_t n0 = a->ne[0], nr = nrows_of(a);
    float *buf = (float *)csimd_alloc((size_t)(n0 * nr) * 4 + 64);
    if (!buf) return -2;
    nth = clamp_threads(nth);
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1 && nr > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(a, ir, &i1, &i2, &i3);
        q_row_dequant(qt, ELT(a, 0, i1, i2, i3), buf + ir * n0, n0);
    }
    t->data = (char *)buf;
    t->type = CSIMD_F32;
    for (int k = 0; k < 4; k++) t->ne[k] = a->ne[k];
    t->nb[0] = 4;
    t->nb[1] = 4 * n0;
    t->nb[2] = t->nb[1] * a->ne[1];
    t->nb[3] = t->nb[2] * a->ne[2];
    return 0;
}

/* OUT_PROD with a quantized a: a dequantized, then the F32 kernel. A large matrix (the gradient through a
   vocabulary-sized output head: 262144 rows) is dequantized Q_OUT_PROD_CHUNK values at a time, the rows of
   one chunk summed over in one product and the chunks' products added up in d, so no F32 copy of the
   whole matrix is ever held */
#define Q_OUT_PROD_CHUNK ((int64_t)1 << 22)
int csimd_q_out_prod(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    const int qt = q_view_type(a);
    if (qt < 0) return -1;
    const int64_t n0 = a->ne[0], rows = a->ne[1], step = Q_OUT_PROD_CHUNK / n0 > 0 ? Q_OUT_PROD_CHUNK / n0 : 1;
    const int64_t nd = d->ne[0] * d->ne[1] * d->ne[2] * d->ne[3];
    const int flat = a->ne[2] == 1 && a->ne[3] == 1 && b->ne[2] == 1 && b->ne[3] == 1 && d->nb[0] == 4 &&
                     d->nb[1] == 4 * d->ne[0];
    csimd_tensor t;
    int rc;
    if (!flat || rows <= step) {
        rc = q_dequant_tensor(a, qt, &t, nth);
        if (rc) return rc;
        rc = csimd_out_prod(&t, b, d, nth);
        free(t.data);
        return rc;
    }
    float *part = (float *)csimd_alloc((size_t)nd * 4 + 64), *out = (float *)d->data;
    if (!part) return -2;
    nth = clamp_threads(nth);
    for (int64_t t0 = 0; t0 < rows; t0 += step) {
        csimd_tensor ac = *a, bc = *b, dc = *d;
        ac.ne[1] = bc.ne[1] = rows - t0 < step ? rows - t0 : step;
        ac.data = a->data + t0 * a->nb[1];
        bc.data = b->data + t0 * b->nb[1];
        if (t0) dc.data = (char *)part;
        rc = q_dequant_tensor(&ac, qt, &t, nth);
        if (!rc) {
            rc = csimd_out_prod(&t, &bc, &dc, nth);
            free(t.data);
        }
        if (rc) break;
        if (t0) {
            (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1 && nd > 65536)
            for (int64_t i = 0; i < nd; i++) out[i] += part[i];
        }
    }
    free(part);
    return rc;
}

/* ADD with a quantized a, as ggml: each row of a dequantized, b (F32/F16/BF16, modulo broadcast) added in
   float, the row stored into d: quantized again (d of a's type; mode as csimd_q_quantize; Q_UNQUANTIZABLE
   when a sum is not finite or a block's scale would overflow, nothing written) or as F32 */
int csimd_q_add(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int mode, int nth) {
    const int qa = q_view_type(a), qd = q_type_of(d);
    if (qa < 0 || !nonneg(b) || !nonneg(d) || !same_ne(a, d) || !tiles(a, b) || !is_float(b->type) || !q_mode_ok(mode))
        return -1;
    if (qd >= 0 ? qd != qa || q_dest_type(d, mode) < 0 : d->type != CSIMD_F32) return -1;
    const int64_t n0 = a->ne[0], nr = nrows_of(a);
    const int be = q_block_elems(qa), bb = q_block_bytes(qa);
    /* a quantized d gets its rows through a scratch copy, written out once every sum is known finite */
    const int64_t rb = n0 / be * bb;
    uint8_t *scratch = qd >= 0 ? (uint8_t *)csimd_alloc((size_t)(rb * nr) + 64) : NULL;
    nth = clamp_threads(nth);
    float *rows = q_scratch_rows(nth, n0);
    if ((qd >= 0 && !scratch) || !rows) {
        free(scratch);
        free(rows);
        return -2;
    }
    int nonfinite = 0;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1) reduction(| : nonfinite)
    for (int64_t ir = 0; ir < nr; ir++) {
        float *tmp = q_my_row(rows, n0);
        int64_t i1, i2, i3;
        unravel_row(a, ir, &i1, &i2, &i3);
        q_row_dequant(qa, ELT(a, 0, i1, i2, i3), tmp, n0);
        const char *br = ELT(b, 0, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        for (int64_t e = 0; e < n0; e++) tmp[e] += load_f32(br + (e % b->ne[0]) * b->nb[0], b->type);
        char *dr = ELT(d, 0, i1, i2, i3);
        if (qd >= 0) {
            int bad = 0;
            for (int64_t e = 0; e < n0; e++) bad |= q_nonfinite_bits(tmp[e]);
            for (int64_t e = 0; e < n0 && !bad; e += be) bad |= q_block_overflows(qd, mode, tmp + e);
            nonfinite |= bad;
            if (bad) continue;
            q_quantize_row(qd, mode, tmp, scratch + ir * rb, n0, NULL);
        } else {
            for (int64_t e = 0; e < n0; e++) memcpy(dr + e * d->nb[0], &tmp[e], 4);
        }
    }
    free(rows);
    if (qd >= 0 && !nonfinite) {
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1 && nr > 1)
        for (int64_t ir = 0; ir < nr; ir++) {
            int64_t i1, i2, i3;
            unravel_row(d, ir, &i1, &i2, &i3);
            memcpy(ELT(d, 0, i1, i2, i3), scratch + ir * rb, (size_t)rb);
        }
    }
    free(scratch);
    return nonfinite ? Q_UNQUANTIZABLE : 0;
}
