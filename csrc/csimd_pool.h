/* POOL_1D/POOL_2D and IM2COL, part of the kernel template (included by csimd_impl.h once per ISA).
   Both gather taps from input rows at ox*s0 + k*d - p: each input row they need is converted to F32
   once into a padded buffer (position = x + p, the padding holding the value a missing tap stands
   for), so the tap loops run on plain floats with no bounds checks or per-element type switches, and
   a stride-1 window is a vector loop over the output positions. */

/* buf[0, pw) = row (x = pos - pad) of t at (., i1, i2, i3) converted to F32; fill outside [0, n) */
ATTR static void FN(padded_row)(float *buf, int64_t pw, int64_t pad, int64_t n, const csimd_tensor *t,
                                const char *row, float fill) {
    const int64_t lo = pad < pw ? pad : pw, hi = pad + n < pw ? pad + n : pw;
    for (int64_t i = 0; i < lo; i++) buf[i] = fill;
    if (hi > lo) FN(row_to_f32)(buf + lo, row, t->type, t->nb[0], hi - lo);
    for (int64_t i = hi > lo ? hi : lo; i < pw; i++) buf[i] = fill;
}

/* ggml's running max, std::max(v, m) = v < m ? m : v: a NaN tap replaces m, the next tap replaces the
   NaN. ggml skips a missing (padding) tap, so padding holds a NaN of a payload no arithmetic makes
   (POOL_PAD_BITS), which the max leaves out: no real value could stand for "no tap" after a NaN. */
#ifndef POOL_PAD_BITS
#define POOL_PAD_BITS ((int32_t)0x7fe0dead)
#endif
ATTR static inline float FN(max_tap)(float m, float v) {
    int32_t bits;
    memcpy(&bits, &v, 4);
    return bits == POOL_PAD_BITS || v < m ? m : v;
}

ATTR static int FN(pool)(int dims2, int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0,
                         int64_t p1, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t W = a->ne[0], H = a->ne[1], OW = d->ne[0], OH = d->ne[1];
    const int64_t nr = OH * d->ne[2] * d->ne[3], pw = (OW - 1) * s0 + k0;
    const int32_t pad_bits = POOL_PAD_BITS;
    float pad_nan;
    memcpy(&pad_nan, &pad_bits, 4);
    const float fill = op_max ? pad_nan : 0.0f; /* a missing tap: no effect on the max or the sum */
    int failed = 0;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
        float *row = (float *)csimd_alloc((size_t)(pw + OW + 2 * VL) * 4), *mx = row ? row + pw + VL : NULL;
        double *sum = (double *)csimd_alloc((size_t)(OW + 1) * 8);
        if (!row || !sum) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < nr; r++) {
            if (!row || !sum) continue;
            const int64_t oy = r % OH, i2 = (r / OH) % d->ne[2], i3 = r / (OH * d->ne[2]);
            for (int64_t ox = 0; ox < OW; ox++) { mx[ox] = -FLT_MAX; sum[ox] = 0.0; }
            for (int64_t ky = 0; ky < k1; ky++) {
                const int64_t y = dims2 ? oy * s1 + ky - p1 : oy;
                if (y < 0 || y >= H) continue;
                FN(padded_row)(row, pw, p0, W, a, ELT(a, 0, y, i2, i3), fill);
                for (int64_t kx = 0; kx < k0; kx++) { /* taps in row-major order, as the reference sums */
                    const float *src = row + kx;
                    if (!op_max) {
                        for (int64_t ox = 0; ox < OW; ox++) sum[ox] += src[ox * s0];
                        continue;
                    }
                    int64_t ox = 0;
                    if (s0 == 1)
                        for (; ox + VL <= OW; ox += VL) {
                            const VF m = *(const VFU *)(mx + ox), v = *(const VFU *)(src + ox);
                            const VI take = ~(v < m) & ((VI)v != POOL_PAD_BITS);
                            *(VFU *)(mx + ox) = (VF)(((VI)v & take) | ((VI)m & ~take));
                        }
                    for (; ox < OW; ox++) mx[ox] = FN(max_tap)(mx[ox], src[ox * s0]);
                }
            }
            if (!op_max)
                for (int64_t ox = 0; ox < OW; ox++) {
                    double cnt = (double)(k0 * k1); /* 2D: padding counted */
                    if (!dims2) { /* 1D: the taps inside the row */
                        const int64_t lo = p0 - ox * s0 > 0 ? p0 - ox * s0 : 0;
                        const int64_t hi = W + p0 - ox * s0 < k0 ? W + p0 - ox * s0 : k0;
                        cnt = (double)(hi > lo ? hi - lo : 0);
                    }
                    mx[ox] = (float)(sum[ox] / cnt);
                }
            FN(row_from_f32)(ELT(d, 0, oy, i2, i3), CSIMD_F32, d->nb[0], mx, OW);
        }
        free(row);
        free(sum);
    }
    return failed ? -2 : 0;
}

/* IM2COL: 2D d[ic*KH*KW + kh*KW + kw, ox, oy, n] = b[ox*s0 + kw*d0 - p0, oy*s1 + kh*d1 - p1, ic, n];
   1D (KH = 1) d[ic*KW + kw, ox, n, 0] = b[ox*s0 + kw*d0 - p0, ic, n, 0]; taps outside b read 0.
   Per output row (n, oy): the IC*KH input rows it reads, padded; per ox, one F32 row of
   IC*KH*KW columns, written with one (vectorised) conversion. */
ATTR static int FN(im2col)(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1,
                           int64_t KH, int64_t KW, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    const int64_t IW = b->ne[0], IH = is2d ? b->ne[1] : 1, IC = is2d ? b->ne[2] : b->ne[1];
    const int64_t N = is2d ? b->ne[3] : b->ne[2], OW = d->ne[1], OH = is2d ? d->ne[2] : 1;
    const int64_t CK = IC * KH * KW, pw = (OW - 1) * s0 + (KW - 1) * d0 + 1;
    int failed = 0;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
        float *rows = (float *)csimd_alloc((size_t)(IC * KH * pw + CK + VL) * 4), *out = rows ? rows + IC * KH * pw : 0;
        if (!rows) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N * OH; r++) {
            if (!rows) continue;
            const int64_t oy = r % OH, n = r / OH;
            for (int64_t ic = 0; ic < IC; ic++)
                for (int64_t kh = 0; kh < KH; kh++) {
                    const int64_t y = oy * s1 + kh * d1 - p1;
                    float *rb = rows + (ic * KH + kh) * pw;
                    if (y < 0 || y >= IH) {
                        for (int64_t i = 0; i < pw; i++) rb[i] = 0.0f;
                        continue;
                    }
                    FN(padded_row)(rb, pw, p0, IW, b, is2d ? ELT(b, 0, y, ic, n) : ELT(b, 0, ic, n, 0), 0.0f);
                }
            for (int64_t ox = 0; ox < OW; ox++) {
                for (int64_t q = 0; q < IC * KH; q++) {
                    const float *src = rows + q * pw + ox * s0;
                    float *o = out + q * KW;
                    if (d0 == 1) memcpy(o, src, (size_t)KW * 4);
                    else for (int64_t kw = 0; kw < KW; kw++) o[kw] = src[kw * d0];
                }
                FN(row_from_f32)(is2d ? ELT(d, 0, ox, oy, n) : ELT(d, 0, ox, n, 0), d->type, d->nb[0], out, CK);
            }
        }
        free(rows);
    }
    return failed ? -2 : 0;
}
