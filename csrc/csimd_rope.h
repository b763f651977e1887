/* ROPE / ROPE_BACK, UPSCALE and IM2COL_BACK kernels. Included at the end of csimd_impl.h, so the
   template part below is compiled once per ISA path (SFX, ATTR, VB, VF, VFU, VI, VL, FN come from
   there); the part between CSIMD_ROPE_ONCE guards is plain C compiled once. */

#ifndef CSIMD_ROPE_ONCE
#define CSIMD_ROPE_ONCE

/* csimd_rope_tab, the per-pair tables of one ROPE call: csimd_kernels.h */

/* UPSCALE's source coordinate along one dim, in float32 as the reference: sf = ne_out / ne_in
   (or (ne_out-1)/(ne_in-1) with align_corners) */
static float upscale_sf(int64_t nout, int64_t nin, int align) {
    if (align && nout > 1 && nin > 1) return (float)(nout - 1) / (float)(nin - 1);
    return (float)nout / (float)nin;
}

static int64_t upscale_nearest(int64_t i, float sf, int64_t nin) {
    const int64_t j = (int64_t)floorf((float)i / sf);
    return j < nin - 1 ? j : nin - 1;
}

/* BILINEAR: neighbours lo, hi (clamped) and the weight of hi (clamped to [0, 1], from the clamped lo) */
static void upscale_lerp(int64_t i, float sf, float off, int64_t nin, int64_t *lo, int64_t *hi, double *w) {
    const float p = ((float)i + off) / sf - off;
    int64_t l = (int64_t)floorf(p), h = l + 1;
    l = l < 0 ? 0 : l > nin - 1 ? nin - 1 : l;
    h = h < 0 ? 0 : h > nin - 1 ? nin - 1 : h;
    float f = p - (float)l;
    f = f < 0.0f ? 0.0f : f > 1.0f ? 1.0f : f;
    *lo = l;
    *hi = h;
    *w = (double)f;
}
#endif /* CSIMD_ROPE_ONCE */

/* ------------------------------------------------------------ ROPE: the per-token cos/sin cache */
#define VD CAT(vd, SFX)
#define VQ CAT(vq, SFX)
#define VDL (VB / 8)
typedef double VD __attribute__((vector_size(VB)));
typedef uint64_t VQ __attribute__((vector_size(VB)));

/* sin and cos of |th| <= ROPE_SINCOS_MAX in double, VDL lanes at a time: th = j pi/2 + r with
   |r| <~ pi/4 (j*C1 is exact: C1 = pi/2 to 30 bits, |j| < 2^23; C2 = the next 53 bits), then the
   Taylor series of sin r (to r^15) and cos r (to r^16), whose next terms are below 1e-16 there;
   the quadrant j mod 4 swaps them and sets the signs. */
#ifndef ROPE_SINCOS_MAX
#define ROPE_SINCOS_MAX 4194304.0 /* 2^22 */
#endif
ATTR static inline void FN(vsincos)(VD th, VD *sn, VD *cs) {
    const VD magic = (VD){0} + 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
    const VD big = th * 0x1.45f306dc9c883p-1 + magic; /* 2/pi */
    const VD jd = big - magic;
    const VQ q = (VQ)big; /* the low mantissa bits of big hold j (two's complement) */
    const VD r = (th - jd * 0x1.921fb54p+0) - jd * 0x1.10b4611a62633p-30;
    const VD r2 = r * r;
    VD ps = (VD){0} - 1.0 / 1307674368000.0;
    ps = ps * r2 + 1.0 / 6227020800.0;
    ps = ps * r2 - 1.0 / 39916800.0;
    ps = ps * r2 + 1.0 / 362880.0;
    ps = ps * r2 - 1.0 / 5040.0;
    ps = ps * r2 + 1.0 / 120.0;
    ps = ps * r2 - 1.0 / 6.0;
    VD pc = (VD){0} + 1.0 / 20922789888000.0;
    pc = pc * r2 - 1.0 / 87178291200.0;
    pc = pc * r2 + 1.0 / 479001600.0;
    pc = pc * r2 - 1.0 / 3628800.0;
    pc = pc * r2 + 1.0 / 40320.0;
    pc = pc * r2 - 1.0 / 720.0;
    pc = pc * r2 + 1.0 / 24.0;
    const VQ sr = (VQ)(r + r * r2 * ps), cr = (VQ)((1.0 - 0.5 * r2) + (r2 * r2) * pc);
    const VQ swap = -(q & 1); /* odd quadrant: sin th = +-cos r, cos th = -+sin r */
    *sn = (VD)(((sr & ~swap) | (cr & swap)) ^ ((q & 2) << 62));
    *cs = (VD)(((cr & ~swap) | (sr & swap)) ^ (((q + 1) & 2) << 62));
}

/* cos and sin (times mscale; sin also times sign, -1 for ROPE_BACK) of every pair of token j: the
   angle in double as the reference computes it, its cos/sin in double (vectorised; libm when some
   angle is beyond ROPE_SINCOS_MAX or not finite), rounded to float once. NORMAL mode stores them
   per element in the layout its rotation reads: c[2k] = c[2k+1] = cos, s[2k] = -sin, s[2k+1] = +sin.
   w: scratch of 3 * n_pairs + VDL doubles. */
ATTR static void FN(rope_cache)(const csimd_rope_tab *t, const csimd_tensor *pos, int64_t j, int64_t n_tok,
                                double *w, float *c, float *s) {
    const int64_t np_ = t->n_pairs;
    double pv[4] = {0.0, 0.0, 0.0, 0.0};
    for (int q = 0; q < t->streams; q++) {
        int32_t v;
        memcpy(&v, ELT(pos, q * n_tok + j, 0, 0, 0), 4);
        pv[q] = (double)v;
    }
    double *th = w, *cd = w + np_, *sd = w + 2 * np_;
    int big = 0;
    for (int64_t k = 0; k < np_; k++) {
        double tb = pv[t->which[k]] * t->inv_freq[k];
        if (t->ffac) tb = tb / t->ffac[k];
        double a = t->freq_scale * tb;
        if (t->ext_factor != 0.0) a = a * (1.0 - t->mix[k]) + tb * t->mix[k];
        th[k] = a;
        big |= !(fabs(a) <= ROPE_SINCOS_MAX);
    }
    if (big) {
        for (int64_t k = 0; k < np_; k++) { cd[k] = cos(th[k]); sd[k] = sin(th[k]); }
    } else {
        int64_t k = 0;
        VD sv, cv;
        for (; k + VDL <= np_; k += VDL) {
            VD x;
            memcpy(&x, th + k, sizeof x);
            FN(vsincos)(x, &sv, &cv);
            memcpy(cd + k, &cv, sizeof cv);
            memcpy(sd + k, &sv, sizeof sv);
        }
        if (k < np_) { /* the tail as one padded vector */
            double buf[VDL];
            for (int i = 0; i < VDL; i++) buf[i] = k + i < np_ ? th[k + i] : 0.0;
            VD x;
            memcpy(&x, buf, sizeof x);
            FN(vsincos)(x, &sv, &cv);
            double sb[VDL], cb[VDL];
            memcpy(sb, &sv, sizeof sv);
            memcpy(cb, &cv, sizeof cv);
            for (int i = 0; k + i < np_; i++) { cd[k + i] = cb[i]; sd[k + i] = sb[i]; }
        }
    }
    const double ms = t->mscale, mss = t->mscale * t->sign;
    if (t->mode == 0) {
        for (int64_t k = 0; k < np_; k++) {
            const float cs = (float)(cd[k] * ms), sn = (float)(sd[k] * mss);
            c[2 * k] = c[2 * k + 1] = cs;
            s[2 * k] = -sn;
            s[2 * k + 1] = sn;
        }
    } else {
        for (int64_t k = 0; k < np_; k++) {
            c[k] = (float)(cd[k] * ms);
            s[k] = (float)(sd[k] * mss);
        }
    }
}

/* ------------------------------------------------------------ ROPE: rotate one row (F32) */
/* NEOX, MROPE, IMROPE (half = n_pairs) and VISION (half = n_dims): pairs (x[k], x[k + half]).
   o may be x (in place): each step loads both halves before it stores. */
ATTR static void FN(rope_halves)(float *o, const float *x, const float *c, const float *s, int64_t half) {
    const float *x0 = x, *x1 = x + half;
    float *o0 = o, *o1 = o + half;
    int64_t k = 0;
    for (; k + VL <= half; k += VL) {
        const VF a0 = *(const VFU *)(x0 + k), a1 = *(const VFU *)(x1 + k);
        const VF cv = *(const VFU *)(c + k), sv = *(const VFU *)(s + k);
        *(VFU *)(o0 + k) = a0 * cv - a1 * sv;
        *(VFU *)(o1 + k) = a0 * sv + a1 * cv;
    }
    for (; k < half; k++) {
        const float a0 = x0[k], a1 = x1[k];
        o0[k] = a0 * c[k] - a1 * s[k];
        o1[k] = a0 * s[k] + a1 * c[k];
    }
}

/* NORMAL: neighbouring pairs (x[2k], x[2k+1]) over n = 2 * n_pairs elements:
   o = x * c + swap_pairs(x) * s with the cache layout of rope_cache */
ATTR static void FN(rope_pairs)(float *o, const float *x, const float *c, const float *s, int64_t n) {
    VI swap;
    for (int i = 0; i < VL; i++) swap[i] = i ^ 1;
    int64_t k = 0;
    for (; k + VL <= n; k += VL) {
        const VF xv = *(const VFU *)(x + k);
        const VF xs = __builtin_shuffle(xv, swap);
        *(VFU *)(o + k) = xv * *(const VFU *)(c + k) + xs * *(const VFU *)(s + k);
    }
    for (; k + 1 < n; k += 2) {
        const float a0 = x[k], a1 = x[k + 1];
        o[k] = a0 * c[k] + a1 * s[k];
        o[k + 1] = a1 * c[k + 1] + a0 * s[k + 1];
    }
}

ATTR static void FN(rope_row)(const csimd_rope_tab *t, float *o, const float *x, const float *c, const float *s) {
    const int64_t b = t->n_offs;
    if (t->mode == 0) FN(rope_pairs)(o + b, x + b, c, s, 2 * t->n_pairs);
    else FN(rope_halves)(o + b, x + b, c, s, t->n_pairs);
}

/* ROPE / ROPE_BACK (t->sign): the cos/sin cache of every token (dim 2) first, computed once and
   shared by its heads (dim 1) and batches (dim 3); then each row rotated with it. F32 rows with
   unit strides are rotated in place of the result; other rows go through a float row buffer.
   Elements outside [n_offs, n_offs + 2 n_pairs) are copied. */
ATTR static int FN(rope)(const csimd_rope_tab *t, const csimd_tensor *a, const csimd_tensor *pos,
                         const csimd_tensor *d, int nth) {
    const int64_t ne0 = a->ne[0], n_tok = a->ne[2], nr = nrows_of(a);
    const int64_t clen = t->mode == 0 ? 2 * t->n_pairs : t->n_pairs; /* floats per cos (and per sin) array */
    const int64_t stride = (2 * clen + 15) & ~(int64_t)15;
    const int64_t r0 = t->n_offs, r1 = t->n_offs + 2 * t->n_pairs;
    const int direct = a->type == CSIMD_F32 && d->type == CSIMD_F32 && a->nb[0] == 4 && d->nb[0] == 4;
    float *cache = (float *)csimd_alloc((size_t)(n_tok * stride) * 4);
    int failed = 0;
    if (!cache) return -2;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
        float *tmp = direct ? NULL : (float *)csimd_alloc((size_t)(ne0 + 16) * 4);
        double *w = (double *)csimd_alloc((size_t)(3 * t->n_pairs + VDL) * sizeof(double));
        if ((!direct && !tmp) || !w) failed = 1;
#pragma omp for schedule(static)
        for (int64_t j = 0; j < n_tok; j++)
            if (w) FN(rope_cache)(t, pos, j, n_tok, w, cache + j * stride, cache + j * stride + clen);
#pragma omp for schedule(static)
        for (int64_t ir = 0; ir < nr; ir++) {
            if ((!direct && !tmp) || !w) continue;
            int64_t i1, i2, i3;
            unravel_row(a, ir, &i1, &i2, &i3);
            const float *c = cache + i2 * stride, *s = c + clen;
            const char *ar = ELT(a, 0, i1, i2, i3);
            char *dr = ELT(d, 0, i1, i2, i3);
            if (direct) {
                const float *x = (const float *)ar;
                float *o = (float *)dr;
                if (o != x) {
                    memcpy(o, x, (size_t)r0 * 4);
                    memcpy(o + r1, x + r1, (size_t)(ne0 - r1) * 4);
                }
                FN(rope_row)(t, o, x, c, s);
            } else {
                FN(row_to_f32)(tmp, ar, a->type, a->nb[0], ne0);
                FN(rope_row)(t, tmp, tmp, c, s);
                FN(row_from_f32)(dr, d->type, d->nb[0], tmp, ne0);
            }
        }
        free(tmp);
        free(w);
    }
    free(cache);
    return failed ? -2 : 0;
}

/* ------------------------------------------------------------ UPSCALE (F32, any strides of a)
   NEAREST in every dim, or BILINEAR in dims 0, 1 (nearest in dims 2, 3); weights in double */
ATTR static int FN(upscale)(int bilinear, int align, const csimd_tensor *a, const csimd_tensor *d, int nth) {
    const int64_t n0 = d->ne[0], nr = nrows_of(d);
    const float off = (bilinear && align) ? 0.0f : 0.5f;
    float sf[4];
    for (int k = 0; k < 4; k++) sf[k] = upscale_sf(d->ne[k], a->ne[k], bilinear && k < 2 && align);
    int64_t *x0 = (int64_t *)csimd_alloc((size_t)n0 * 2 * sizeof(int64_t));
    double *dx = (double *)csimd_alloc((size_t)n0 * sizeof(double));
    if (!x0 || !dx) {
        free(x0);
        free(dx);
        return -2;
    }
    int64_t *x1 = x0 + n0;
    for (int64_t i = 0; i < n0; i++) {
        if (bilinear) upscale_lerp(i, sf[0], off, a->ne[0], &x0[i], &x1[i], &dx[i]);
        else { x0[i] = x1[i] = upscale_nearest(i, sf[0], a->ne[0]); dx[i] = 0.0; }
    }
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t ir = 0; ir < nr; ir++) {
        int64_t i1, i2, i3;
        unravel_row(d, ir, &i1, &i2, &i3);
        const int64_t j2 = upscale_nearest(i2, sf[2], a->ne[2]), j3 = upscale_nearest(i3, sf[3], a->ne[3]);
        char *dr = ELT(d, 0, i1, i2, i3);
        if (!bilinear) {
            const char *ar = ELT(a, 0, upscale_nearest(i1, sf[1], a->ne[1]), j2, j3);
            for (int64_t i = 0; i < n0; i++) memcpy(dr + i * d->nb[0], ar + x0[i] * a->nb[0], 4);
            continue;
        }
        int64_t y0, y1;
        double wy;
        upscale_lerp(i1, sf[1], off, a->ne[1], &y0, &y1, &wy);
        const char *r0 = ELT(a, 0, y0, j2, j3), *r1 = ELT(a, 0, y1, j2, j3);
        for (int64_t i = 0; i < n0; i++) {
            float v00, v01, v10, v11; /* v<y><x> */
            memcpy(&v00, r0 + x0[i] * a->nb[0], 4);
            memcpy(&v01, r0 + x1[i] * a->nb[0], 4);
            memcpy(&v10, r1 + x0[i] * a->nb[0], 4);
            memcpy(&v11, r1 + x1[i] * a->nb[0], 4);
            const double lo = (double)v00 * (1.0 - wy) + (double)v10 * wy;
            const double hi = (double)v01 * (1.0 - wy) + (double)v11 * wy;
            const float o = (float)(lo * (1.0 - dx[i]) + hi * dx[i]);
            memcpy(dr + i * d->nb[0], &o, 4);
        }
    }
    free(x0);
    free(dx);
    return 0;
}

/* ------------------------------------------------------------ IM2COL_BACK (result F32)
   Gather form of the adjoint: each input element (x, y, ic, n) sums, in double and in tap order
   (kh, kw), the grad entries (col = (ic*KH + kh)*KW + kw, ox, oy, n) with ox*s0 + kw*d0 - p0 = x and
   oy*s1 + kh*d1 - p1 = y. 1D is the same with KH = OH = IH = 1 (grad [IC*K, OL, N], result [L, IC, N]). */
ATTR static void FN(im2col_back)(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1,
                                 int64_t KH, int64_t KW, const csimd_tensor *g, const csimd_tensor *d, int nth) {
    const int64_t IW = d->ne[0], IH = is2d ? d->ne[1] : 1, IC = is2d ? d->ne[2] : d->ne[1];
    const int64_t N = is2d ? d->ne[3] : d->ne[2], OW = g->ne[1], OH = is2d ? g->ne[2] : 1;
    (void)nth;
#pragma omp parallel for num_threads(nth) schedule(static) if (nth > 1)
    for (int64_t r = 0; r < N * IC * IH; r++) {
        const int64_t y = r % IH, ic = (r / IH) % IC, n = r / (IH * IC);
        for (int64_t x = 0; x < IW; x++) {
            double sum = 0.0;
            for (int64_t kh = 0; kh < KH; kh++) {
                const int64_t ty = y + p1 - kh * d1;
                if (ty < 0 || ty % s1) continue;
                const int64_t oy = ty / s1;
                if (oy >= OH) continue;
                for (int64_t kw = 0; kw < KW; kw++) {
                    const int64_t tx = x + p0 - kw * d0;
                    if (tx < 0 || tx % s0) continue;
                    const int64_t ox = tx / s0;
                    if (ox >= OW) continue;
                    const int64_t col = (ic * KH + kh) * KW + kw;
                    sum += load_f32(is2d ? ELT(g, col, ox, oy, n) : ELT(g, col, ox, n, 0), g->type);
                }
            }
            const float o = (float)sum;
            memcpy(is2d ? ELT(d, x, y, ic, n) : ELT(d, x, ic, n, 0), &o, 4);
        }
    }
}

#undef VD
#undef VQ
#undef VDL
