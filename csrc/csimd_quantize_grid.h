/* The lattice quantizers IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M: ggml's quantize_iq*
   (ggml-quants.c of llama.cpp 0.3.36), byte for byte, with or without an importance matrix (IQ2_XXS, IQ2_XS
   and IQ1_S require one, as ggml_quantize_requires_imatrix says). Part of csimd_quant.h; plain C, compiled
   once; float expressions in ggml's order with no contraction (see csimd_quantize_k3iq4.h).

   Each format quantizes groups of 8 (IQ2, IQ1) or 4 (IQ3) magnitudes to points of a lattice grid
   (csimd_iq_tables.h). A candidate point off the grid is replaced by the best of its grid neighbours: for
   every point of the lattice box that is not on the grid, the grid points at the nwant smallest distinct
   squared distances, in (distance, index) order. Those lists and the point -> grid index map are what
   ggml_quantize_init builds; here q_grid_ready builds them once per grid on first use (in about 0.1-0.5 s,
   thread-safe), from the grid tables alone.

   Departures from ggml, where ggml's behaviour is undefined: IQ1_S/IQ1_M's fallback search over the whole
   grid (reached only when every neighbour's weighted error is NaN or infinite) reads x[j], where ggml reads
   past its 8-element array. Sorting a block by value (IQ1) is a stable insertion sort: ggml calls qsort,
   which glibc up to 2.36 (this machine's) implements as a stable merge sort, so ties come out the same. */
#ifndef PRISM_CSIMD_QUANTIZE_GRID_H
#define PRISM_CSIMD_QUANTIZE_GRID_H
#include <float.h>
#include <pthread.h>
#include <stdlib.h>

#define Q_EPS_IQ3_XXS 1e-8f
#define Q_EPS_IQ2_S 1e-8f
#define Q_EPS_IQ1_M 1e-7f
#define Q_EPS_IQ1_S 1e-12f
#define Q_IQ1_DELTA 0.125f

/* ---------------------------------------------------------------- grids, maps and neighbour lists */
enum { G_IQ2XXS, G_IQ2XS, G_IQ2S, G_IQ1S, G_IQ3XXS, G_IQ3S, G_COUNT };

typedef struct {
    int npoints;       /* grid points */
    int dim;           /* 8 (IQ2, IQ1) or 4 (IQ3) coordinates per point */
    int bits;          /* bits of a coordinate's level in a map index: 2 or 3 */
    int nwant;         /* distinct distances kept per neighbour list */
    int8_t *pos;       /* npoints x dim: 2*level + 1 per coordinate */
    int *map;          /* lattice index -> grid index, or -(offset + 1) into neighbours */
    uint16_t *neighbours; /* per off-grid index: a count, then that many grid indices */
} q_grid;

static q_grid q_grids[G_COUNT];
static pthread_once_t q_grid_once[G_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                              PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

/* the level (rank among the grid's distinct values, ascending) of a grid table value */
static int q_level_of(int v, const int *levels, int nlevels) {
    for (int i = 0; i < nlevels; i++)
        if (levels[i] == v) return i;
    return -1;
}

/* map index of a point given by levels (coordinate k at bits*k) */
static inline int q_point_index(const int8_t *levels, int dim, int bits) {
    int u = 0;
    for (int k = 0; k < dim; k++) u |= levels[k] << (bits * k);
    return u;
}

/* the neighbour list of lattice index u (levels from its bits): writes it to out (count first) when out is
   not NULL; returns its length without the count. d2 (npoints ints) is scratch. */
static int q_grid_neighbours(const q_grid *g, int u, int *d2, uint16_t *out) {
    int8_t p[8];
    const int mask = (1 << g->bits) - 1;
    for (int k = 0; k < g->dim; k++) p[k] = (int8_t)(2 * ((u >> (g->bits * k)) & mask) + 1);
    int hist_min[3] = {INT32_MAX, INT32_MAX, INT32_MAX}; /* the nwant smallest distinct distances */
    for (int j = 0; j < g->npoints; j++) {
        const int8_t *q = g->pos + (size_t)j * g->dim;
        int d = 0;
        for (int k = 0; k < g->dim; k++) d += (q[k] - p[k]) * (q[k] - p[k]);
        d2[j] = d;
        for (int s = 0; s < g->nwant; s++) { /* insert d among the distinct minima */
            if (d == hist_min[s]) break;
            if (d < hist_min[s]) {
                for (int t = g->nwant - 1; t > s; t--) hist_min[t] = hist_min[t - 1];
                hist_min[s] = d;
                break;
            }
        }
    }
    int n = 0;
    for (int s = 0; s < g->nwant && hist_min[s] != INT32_MAX; s++) /* (distance, index) order */
        for (int j = 0; j < g->npoints; j++)
            if (d2[j] == hist_min[s]) {
                if (out) out[1 + n] = (uint16_t)j;
                n++;
            }
    if (out) out[0] = (uint16_t)n;
    return n;
}

/* builds g from a grid table of npoints x dim values (signed: int8_t values, else uint8_t), each one of the
   nlevels values in levels (ascending); 0, or -1 when out of memory (g left empty) */
static int q_grid_build(q_grid *g, const void *table, int is_signed, const int *levels, int nlevels, int npoints,
                        int dim, int bits, int nwant) {
    g->npoints = npoints;
    g->dim = dim;
    g->bits = bits;
    g->nwant = nwant;
    const int kmap = bits == 2 ? 43692 : 4096; /* ggml's map sizes: every index of levels 0..2 (IQ2) */
    g->pos = (int8_t *)malloc((size_t)npoints * dim);
    g->map = (int *)malloc((size_t)kmap * sizeof(int));
    int *count = (int *)malloc((size_t)kmap * sizeof(int));
    if (!g->pos || !g->map || !count) goto fail;
    for (int i = 0; i < kmap; i++) g->map[i] = -1;
    for (int j = 0; j < npoints; j++) {
        int8_t lv[8];
        for (int k = 0; k < dim; k++) {
            const size_t at = (size_t)j * dim + k;
            const int v = is_signed ? (int)((const int8_t *)table)[at] : (int)((const uint8_t *)table)[at];
            const int l = q_level_of(v, levels, nlevels);
            if (l < 0) goto fail;
            lv[k] = (int8_t)l;
            g->pos[(size_t)j * dim + k] = (int8_t)(2 * l + 1);
        }
        g->map[q_point_index(lv, dim, bits)] = j;
    }
    int64_t total = 0;
    int failed = 0;
#pragma omp parallel reduction(+ : total) reduction(| : failed)
    {
        int *d2 = (int *)malloc((size_t)npoints * sizeof(int));
        if (!d2) failed = 1;
#pragma omp for schedule(dynamic, 64)
        for (int i = 0; i < kmap; i++) {
            count[i] = 0;
            if (g->map[i] >= 0 || !d2) continue;
            count[i] = 1 + q_grid_neighbours(g, i, d2, NULL);
            total += count[i];
        }
        free(d2);
    }
    if (failed) goto fail;
    g->neighbours = (uint16_t *)malloc((size_t)(total ? total : 1) * sizeof(uint16_t));
    if (!g->neighbours) goto fail;
    int64_t off = 0;
    for (int i = 0; i < kmap; i++) {
        if (g->map[i] >= 0) continue;
        const int64_t c = count[i];
        count[i] = (int)off; /* now the list's offset */
        g->map[i] = -(int)(off + 1);
        off += c;
    }
#pragma omp parallel reduction(| : failed)
    {
        int *d2 = (int *)malloc((size_t)npoints * sizeof(int));
        if (!d2) failed = 1;
#pragma omp for schedule(dynamic, 64)
        for (int i = 0; i < kmap; i++)
            if (d2 && g->map[i] < 0) q_grid_neighbours(g, i, d2, g->neighbours + count[i]);
        free(d2);
    }
    free(count);
    if (!failed) return 0;
    count = NULL;
fail:
    free(count);
    free(g->pos);
    free(g->map);
    free(g->neighbours);
    memset(g, 0, sizeof *g);
    return -1;
}

static const int q_levels_iq2[3] = {8, 25, 43}, q_levels_iq1[3] = {-1, 0, 1};
static const int q_levels_iq3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62}, q_levels_iq3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};

/* ggml's neighbour counts (nwant): 2 for IQ2_XXS, IQ2_XS and IQ3_XXS, 1 for IQ2_S, 3 for IQ1 and IQ3_S */
static void q_grid_init_iq2xxs(void) { q_grid_build(&q_grids[G_IQ2XXS], iq2xxs_grid, 0, q_levels_iq2, 3, 256, 8, 2, 2); }
static void q_grid_init_iq2xs(void) { q_grid_build(&q_grids[G_IQ2XS], iq2xs_grid, 0, q_levels_iq2, 3, 512, 8, 2, 2); }
static void q_grid_init_iq2s(void) { q_grid_build(&q_grids[G_IQ2S], iq2s_grid, 0, q_levels_iq2, 3, 1024, 8, 2, 1); }
static void q_grid_init_iq1s(void) { q_grid_build(&q_grids[G_IQ1S], iq1s_grid, 1, q_levels_iq1, 3, 2048, 8, 2, 3); }
static void q_grid_init_iq3xxs(void) {
    q_grid_build(&q_grids[G_IQ3XXS], iq3xxs_grid, 0, q_levels_iq3xxs, 8, 256, 4, 3, 2);
}
static void q_grid_init_iq3s(void) { q_grid_build(&q_grids[G_IQ3S], iq3s_grid, 0, q_levels_iq3s, 8, 512, 4, 3, 3); }

/* the grid of format t, built on first use; NULL when t has none or its tables could not be allocated */
static const q_grid *q_grid_ready(int t) {
    static void (*const init[G_COUNT])(void) = {q_grid_init_iq2xxs, q_grid_init_iq2xs, q_grid_init_iq2s,
                                                q_grid_init_iq1s, q_grid_init_iq3xxs, q_grid_init_iq3s};
    const int gi = t == Q_IQ2_XXS ? G_IQ2XXS : t == Q_IQ2_XS ? G_IQ2XS : t == Q_IQ2_S ? G_IQ2S
                 : t == Q_IQ1_S || t == Q_IQ1_M ? G_IQ1S : t == Q_IQ3_XXS ? G_IQ3XXS : t == Q_IQ3_S ? G_IQ3S : -1;
    if (gi < 0) return NULL;
    pthread_once(&q_grid_once[gi], init[gi]);
    return q_grids[gi].map ? &q_grids[gi] : NULL;
}

static inline const uint16_t *q_neighbours_of(const q_grid *g, int u) { return g->neighbours - g->map[u] - 1; }

/* q_best_neighbour's scan for points of 4 coordinates (IQ3_XXS, IQ3_S), four neighbours at a time, one per
   lane (q_f4), each lane summing its (w_i*(scale*p_i - x_i))*(scale*p_i - x_i) in order i = 0..3; the first
   of equal sums wins (a strict < per lane, then the first listed among the lanes holding the least).
   Returns its position in nb (1..nb[0]), 0 when none is below FLT_MAX (every sum NaN or infinite) */
__attribute__((optimize("fp-contract=off"))) static int q_nearest4(const int8_t *pos, const uint16_t *nb,
                                                                  const float *x, const float *w, float scale) {
    const int n = nb[0];
    q_f4 best = {FLT_MAX, FLT_MAX, FLT_MAX, FLT_MAX};
    q_i4 at = {0, 0, 0, 0};
    for (int j0 = 1; j0 <= n; j0 += 4) {
        int32_t p[4];
        for (int l = 0; l < 4; l++) memcpy(&p[l], pos + 4 * (size_t)nb[j0 + l <= n ? j0 + l : j0], 4);
        const q_i4 pts = {p[0], p[1], p[2], p[3]}; /* built in registers: a store then a wider load stalls */
        q_f4 d2 = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int i = 0; i < 4; i++) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            const q_i4 c = (pts << (8 * i)) >> 24; /* coordinate i, sign-extended */
#else
            const q_i4 c = (pts << (24 - 8 * i)) >> 24;
#endif
            const q_f4 diff = scale * __builtin_convertvector(c, q_f4) - x[i];
            d2 += w[i] * diff * diff;
        }
        const q_i4 j = {j0, j0 + 1, j0 + 2, j0 + 3};
        const q_i4 lt = (d2 < best) & (j <= n);
        best = q_f4_select(lt, d2, best);
        at = (lt & j) | (~lt & at);
    }
    float b[4];
    int32_t js[4];
    memcpy(b, &best, sizeof b);
    memcpy(js, &at, sizeof js);
    float m = b[0];
    for (int l = 1; l < 4; l++) m = b[l] < m ? b[l] : m;
    if (!(m < FLT_MAX)) return 0;
    int first = n + 1;
    for (int l = 0; l < 4; l++)
        if (b[l] == m && js[l] < first) first = js[l];
    return first;
}

/* the neighbour of least weighted squared error sum w*(scale*q - x)^2 (q the point's 2*level+1 values;
   the first of equals); its levels into L; returns its grid index */
__attribute__((optimize("fp-contract=off"))) static int q_best_neighbour(const q_grid *g, const uint16_t *nb,
                                                                        const float *x, const float *w, float scale,
                                                                        int8_t *L) {
    float best = FLT_MAX;
    int gi = -1;
    /* the same search, vectorised */
    const int at = g->dim == 8 ? q_x86_neighbour8(g->pos, nb, x, w, scale) : q_nearest4(g->pos, nb, x, w, scale);
    if (at >= 0) gi = at ? nb[at] : -1;
    else for (int j = 1; j <= nb[0]; j++) {
        const int8_t *p = g->pos + (size_t)nb[j] * g->dim;
        float d2 = 0.0f;
        for (int i = 0; i < g->dim; i++) {
            const float diff = scale * (float)p[i] - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) {
            best = d2;
            gi = nb[j];
        }
    }
    if (gi < 0) gi = nb[1]; /* every error NaN: ggml asserts; the first neighbour keeps the output defined */
    const int8_t *p = g->pos + (size_t)gi * g->dim;
    for (int i = 0; i < g->dim; i++) L[i] = (int8_t)((p[i] - 1) / 2);
    return gi;
}

/* the levels of grid point gi */
static inline void q_grid_levels(const q_grid *g, int gi, int8_t *L) {
    const int8_t *p = g->pos + (size_t)gi * g->dim;
    for (int i = 0; i < g->dim; i++) L[i] = (int8_t)((p[i] - 1) / 2);
}

/* magnitudes of 8 values and their sign bits; with parity (IQ2_XXS, IQ2_XS, IQ3_XXS, whose 7 stored sign
   bits imply the 8th) an odd count of negatives flips the sign of the value of least w*x^2 */
__attribute__((optimize("fp-contract=off"))) static uint8_t q_signs8(const float *x, const float *w, float *xval,
                                                                    int parity) {
    int nflip = 0;
    uint8_t s = 0;
    for (int i = 0; i < 8; i++) {
        if (x[i] >= 0) xval[i] = x[i];
        else {
            xval[i] = -x[i];
            nflip++;
            s |= (uint8_t)(1u << i);
        }
    }
    if (parity && nflip % 2) {
        int imin = 0;
        float min = w[0] * x[0] * x[0];
        for (int i = 1; i < 8; i++) {
            const float ax = w[i] * x[i] * x[i];
            if (ax < min) {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= (uint8_t)(1u << imin);
    }
    return parity ? (uint8_t)(s & 127) : s;
}

/* A group of n values (n / 8 sign bytes) ahead of a grid search: its weights w (qw against sigma2 as
   q_weights_sigma, or w0 + x^2 where qw is NULL), their square roots waux, the magnitudes xval with their
   sign bytes (parity: as q_signs8); returns the largest magnitude */
__attribute__((optimize("fp-contract=off"))) static float q_grid_group(int n, const float *xb, const float *qw,
                                                                      float sigma2, float w0, int parity, float *w,
                                                                      float *waux, float *xval, uint8_t *signs) {
    if (qw) q_weights_sigma(n, xb, qw, sigma2, w);
    else
        for (int i = 0; i < n; i++) w[i] = w0 + xb[i] * xb[i];
    for (int i = 0; i < n; i++) waux[i] = sqrtf(w[i]);
    for (int k = 0; k < n / 8; k++) signs[k] = q_signs8(xb + 8 * k, w + 8 * k, xval + 8 * k, parity);
    float max = xval[0];
    for (int i = 1; i < n; i++) max = max > xval[i] ? max : xval[i];
    return max;
}

/* sum w*x*q and sum w*q*q over n values with q = 2*L + 1 */
__attribute__((optimize("fp-contract=off"))) static inline void q_odd_sums(int n, const float *w, const float *x,
                                                                          const int8_t *L, float *sqx, float *sq2) {
    float a = 0.0f, b = 0.0f;
    for (int i = 0; i < n; i++) {
        const float q = (float)(2 * L[i] + 1);
        a += w[i] * x[i] * q;
        b += w[i] * q * q;
    }
    *sqx = a;
    *sq2 = b;
}

/* the levels of n magnitudes against 1/id: nearest_int(0.5*(id*x - 1)) clamped to 0..kmax-1 */
__attribute__((optimize("fp-contract=off"))) static inline void q_odd_levels(int n, float id, const float *x, int kmax,
                                                                            int8_t *L) {
    for (int i = 0; i < n; i++) {
        const int l = q_nearest_int(0.5f * (id * x[i] - 1));
        L[i] = (int8_t)(l < 0 ? 0 : l > kmax - 1 ? kmax - 1 : l);
    }
}

/* one group of g->dim levels to a grid index: as is when on the grid, else its best neighbour (L updated);
   *on set accordingly */
static inline int q_to_grid(const q_grid *g, const float *x, const float *w, float scale, int8_t *L, int *on) {
    const int u = q_point_index(L, g->dim, g->bits);
    if (g->map[u] >= 0) {
        if (on) *on = 1;
        return g->map[u];
    }
    if (on) *on = 0;
    return q_best_neighbour(g, q_neighbours_of(g, u), x, w, scale, L);
}

/* the 4-bit block scale of a group: nearest_int(0.5*(id*scale - 1)) clamped to 0..top */
__attribute__((optimize("fp-contract=off"))) static inline int q_odd_scale(float id, float scale, int top) {
    const int l = q_nearest_int(0.5f * (id * scale - 1));
    return l < 0 ? 0 : l > top ? top : l;
}

/* ---------------------------------------------------------------- IQ2_XXS, IQ2_XS, IQ2_S (one super-block) */
/* the shared scale search of IQ2_XS/IQ2_S/IQ3 over groups of n = ng * g->dim magnitudes: for 2*nstep + 1
   scales (kmax2 + is*step)/max, levels rounded and put on the grid, the best least-squares fit kept; then
   the groups that were off the grid (all of them with requant_all) redone against the winning scale.
   Returns the scale; L holds the levels. */
__attribute__((optimize("fp-contract=off"))) static float q_grid_search(const q_grid *g, int n, const float *xval,
                                                                       const float *w, const float *waux, int kmax,
                                                                       int nstep, float step, float max,
                                                                       int on_init, int requant_all, int8_t *L) {
    int8_t Laux[32];
    int on[8], on_aux[8];
    const int ng = n / g->dim;
    float best = 0.0f, scale = max / (float)(2 * kmax - 1);
    for (int k = 0; k < ng; k++) on[k] = on_init;
    for (int is = -nstep; is <= nstep; is++) {
        const float id = ((float)(2 * kmax - 1) + (float)is * step) / max, this_scale = 1 / id;
        for (int k = 0; k < ng; k++) {
            int8_t *Lk = Laux + g->dim * k;
            q_odd_levels(g->dim, id, xval + g->dim * k, kmax, Lk);
            q_to_grid(g, xval + g->dim * k, waux + g->dim * k, this_scale, Lk, &on_aux[k]);
        }
        float sumqx, sumq2;
        q_odd_sums(n, w, xval, Laux, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, (size_t)n);
            for (int k = 0; k < ng; k++) on[k] = on_aux[k];
        }
    }
    int off = 0;
    for (int k = 0; k < ng; k++) off += !on[k];
    if (off > 0 && scale > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < ng; k++) {
            if (on[k] && !requant_all) continue;
            int8_t *Lk = L + g->dim * k;
            q_odd_levels(g->dim, id, xval + g->dim * k, kmax, Lk);
            const int gi = q_to_grid(g, xval + g->dim * k, waux + g->dim * k, scale, Lk, NULL);
            q_grid_levels(g, gi, Lk);
        }
        float sumqx, sumq2;
        q_odd_sums(n, w, xval, L, &sumqx, &sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

/* IQ2_XXS (qw required): groups of 32 = 4 x 8 with parity signs; a first scale by make_qp_quants (nmax 4),
   13 scales around it, the winner's off-grid groups redone; 4-bit block scales against max/31 */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq2_xxs(const q_grid *g, const float *x, uint8_t *y,
                                                                        const float *qw) {
    const int kmax = 3;
    float scales[8], w[32], xval[32], waux[32];
    int8_t L[32], Laux[32];
    uint8_t signs[4];
    uint32_t q2[16];
    memset(q2, 0, sizeof q2);
    q_put_f16(y, 0.0f);
    float max_scale = 0.0f;
    const float sigma2 = q_sum_sq(256, x) / 256;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        const float max = q_grid_group(32, xb, qw + 32 * ib, sigma2, 0.0f, 1, w, waux, xval, signs);
        if (max < Q_GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float scale = q_make_qp_quants(32, kmax + 1, xval, (uint8_t *)L, w);
        const float eff_max = scale * (float)kmax;
        if (eff_max <= 0) {
            scales[ib] = 0;
            continue;
        }
        float best = 0.0f;
        for (int is = -6; is <= 6; is++) {
            const float id = ((float)(2 * kmax - 1) + (float)is * 0.1f) / eff_max, this_scale = 1 / id;
            for (int k = 0; k < 4; k++) {
                q_odd_levels(8, id, xval + 8 * k, kmax, Laux + 8 * k);
                q_to_grid(g, xval + 8 * k, waux + 8 * k, this_scale, Laux + 8 * k, NULL);
            }
            float sumqx, sumq2;
            q_odd_sums(32, w, xval, Laux, &sumqx, &sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                memcpy(L, Laux, 32);
            }
        }
        if (scale > 0) {
            const float id = 1 / scale;
            for (int k = 0; k < 4; k++) {
                q_odd_levels(8, id, xval + 8 * k, kmax, L + 8 * k);
                q_grid_levels(g, q_to_grid(g, xval + 8 * k, waux + 8 * k, scale, L + 8 * k, NULL), L + 8 * k);
            }
            float sumqx, sumq2;
            q_odd_sums(32, w, xval, L, &sumqx, &sumq2);
            if (sumq2 > 0) scale = sumqx / sumq2;
        }
        if (scale < 0) { /* ggml: "should never happen"; the signs flip with the scale */
            scale = -scale;
            for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(~signs[k] & 127);
        }
        for (int k = 0; k < 4; k++) {
            const int gi = g->map[q_point_index(L + 8 * k, 8, 2)];
            q2[2 * ib] |= (uint32_t)(gi < 0 ? 0 : gi) << (8 * k);
            q2[2 * ib + 1] |= (uint32_t)signs[k] << (7 * k);
        }
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        memset(y + 2, 0, 64);
        return;
    }
    const float d = max_scale / 31;
    q_put_f16(y, d);
    const float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) q2[2 * ib + 1] |= (uint32_t)q_odd_scale(id, scales[ib], 15) << 28;
    memcpy(y + 2, q2, 64);
}

/* IQ2_XS (qw required) and IQ2_S (qw optional): groups of 16 = 2 x 8, 19 scales (kmax2 + 0.1*is)/max.
   IQ2_XS stores 9-bit grid indices with 7 parity sign bits in uint16s; IQ2_S 10-bit indices (low bytes
   in qs, high bits in qh) and 8 sign bits, d scaled by 0.9875. */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq2_xs_s(const q_grid *g, const float *x, uint8_t *y,
                                                                         const float *qw, int is_s) {
    const int kmax = 3;
    float scales[16], w[16], xval[16], waux[16];
    int8_t L[16];
    uint8_t signs[2];
    uint16_t q2[32];
    memset(q2, 0, sizeof q2);
    memset(y, 0, is_s ? 82 : 74);
    float max_scale = 0.0f;
    const float sumx2 = q_sum_sq(256, x), sigma2 = is_s ? 2 * sumx2 / 256 : sumx2 / 256;
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = x + 16 * ib;
        const float max =
            q_grid_group(16, xb, qw ? qw + 16 * ib : NULL, sigma2, 0.25f * sigma2, !is_s, w, waux, xval, signs);
        memset(L, 0, 16);
        if (max < (is_s ? Q_EPS_IQ2_S : Q_GROUP_MAX_EPS)) {
            scales[ib] = 0;
            continue;
        }
        float scale = q_grid_search(g, 16, xval, w, waux, kmax, 9, 0.1f, max, 1, 0, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 2; k++) signs[k] = (uint8_t)(is_s ? ~signs[k] : ~signs[k] & 127);
        }
        for (int k = 0; k < 2; k++) {
            int gi = g->map[q_point_index(L + 8 * k, 8, 2)];
            gi = gi < 0 ? 0 : gi;
            if (is_s) {
                const int i8 = 2 * ib + k;
                y[2 + i8] = (uint8_t)(gi & 255);
                y[66 + i8 / 4] |= (uint8_t)((gi >> 8) << (2 * (i8 % 4)));
                y[2 + 32 + i8] = signs[k];
            } else {
                q2[2 * ib + k] = (uint16_t)(gi | (signs[k] << 9));
            }
        }
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return; /* the block stays zero */
    const float d = max_scale / 31;
    q_put_f16(y, is_s ? d * 0.9875f : d);
    const float id = 1 / d;
    uint8_t *sc = y + (is_s ? 74 : 66);
    for (int ib = 0; ib < 16; ib++) {
        const int l = q_odd_scale(id, scales[ib], 15);
        if (ib % 2 == 0) sc[ib / 2] = (uint8_t)l;
        else sc[ib / 2] |= (uint8_t)(l << 4);
    }
    if (!is_s) memcpy(y + 2, q2, 64);
}

/* ---------------------------------------------------------------- IQ3_XXS, IQ3_S (one super-block) */
/* IQ3_XXS: groups of 32 = 8 x 4 magnitudes, 4 x 7 parity sign bits, 31 scales (15 + 0.2*is)/max, the
   off-grid groups of the winner redone; 8-bit grid indices, the signs and a 4-bit scale per group in a
   uint32; d scaled by 1.0125. qw optional (x^2 without). */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq3_xxs(const q_grid *g, const float *x, uint8_t *y,
                                                                        const float *qw) {
    const int kmax = 8;
    float scales[8], w[32], xval[32], waux[32];
    int8_t L[32];
    uint8_t signs[4], q3[96];
    uint32_t sas[8];
    memset(q3, 0, sizeof q3);
    memset(sas, 0, sizeof sas);
    q_put_f16(y, 0.0f);
    float max_scale = 0.0f;
    const float sigma2 = 2 * q_sum_sq(256, x) / 256;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        const float max = q_grid_group(32, xb, qw ? qw + 32 * ib : NULL, sigma2, 0.0f, 1, w, waux, xval, signs);
        memset(L, 0, 32);
        if (max < Q_EPS_IQ3_XXS) {
            scales[ib] = 0;
            continue;
        }
        float scale = q_grid_search(g, 32, xval, w, waux, kmax, 15, 0.2f, max, 1, 0, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(~signs[k] & 127);
        }
        for (int k = 0; k < 8; k++) {
            const int gi = g->map[q_point_index(L + 4 * k, 4, 3)];
            q3[8 * ib + k] = (uint8_t)(gi < 0 ? 0 : gi);
        }
        sas[ib] = (uint32_t)signs[0] | ((uint32_t)signs[1] << 7) | ((uint32_t)signs[2] << 14) |
                  ((uint32_t)signs[3] << 21);
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) {
        memset(y + 2, 0, 96);
        return;
    }
    const float d = max_scale / 31;
    q_put_f16(y, d * 1.0125f);
    const float id = 1 / d;
    for (int ib = 0; ib < 8; ib++) sas[ib] |= (uint32_t)q_odd_scale(id, scales[ib], 15) << 28;
    memcpy(q3 + 64, sas, 32);
    memcpy(y + 2, q3, 96);
}

/* IQ3_S: groups of 32 = 8 x 4 magnitudes with 8 plain sign bits each, 19 scales (15 + 0.2*is)/max, every
   group of the winner redone when any was off the grid; 9-bit grid indices (qs + qh), d scaled by 1.033.
   ggml advances its qs and signs pointers only past groups it quantizes: after an all-zero group (max 0)
   the later groups' indices and signs sit one group earlier, and so they do here. */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq3_s(const q_grid *g, const float *x, uint8_t *y,
                                                                      const float *qw) {
    const int kmax = 8;
    float scales[8], w[32], xval[32], waux[32];
    int8_t L[32];
    uint8_t signs[4];
    memset(y, 0, 110);
    uint8_t *qs = y + 2, *qh = y + 66, *sg = y + 74, *sc = y + 106;
    float max_scale = 0.0f;
    const float sigma2 = 2 * q_sum_sq(256, x) / 256;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + 32 * ib;
        const float max = q_grid_group(32, xb, qw ? qw + 32 * ib : NULL, sigma2, 0.0f, 0, w, waux, xval, signs);
        memset(L, 0, 32);
        if (!max) {
            scales[ib] = 0;
            continue;
        }
        float scale = q_grid_search(g, 32, xval, w, waux, kmax, 9, 0.2f, max, 0, 1, L);
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++) signs[k] = (uint8_t)~signs[k];
        }
        for (int k = 0; k < 8; k++) {
            int gi = g->map[q_point_index(L + 4 * k, 4, 3)];
            gi = gi < 0 ? 0 : gi;
            qs[k] = (uint8_t)(gi & 255);
            qh[(ib * 8 + k) / 8] |= (uint8_t)((gi >> 8) << ((ib * 8 + k) % 8));
        }
        qs += 8;
        for (int k = 0; k < 4; k++) sg[k] = signs[k];
        sg += 4;
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    const float d = max_scale / 31;
    q_put_f16(y, d * 1.033f);
    const float id = 1 / d;
    for (int ib = 0; ib < 8; ib += 2)
        sc[ib / 2] = (uint8_t)(q_odd_scale(id, scales[ib], 15) | (q_odd_scale(id, scales[ib + 1], 15) << 4));
}

/* ---------------------------------------------------------------- IQ1_S, IQ1_M (one super-block) */
typedef struct {
    float v;
    int i;
} q_val_index;

/* ascending by value, equal values in their original order */
static void q_sort_stable(q_val_index *a, int n) {
    for (int i = 1; i < n; i++) {
        const q_val_index key = a[i];
        int j = i - 1;
        while (j >= 0 && a[j].v > key.v) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = key;
    }
}

/* the neighbour of least sum w*(scale*xg[level] - x)^2 for IQ1's three values xg; the whole grid when no
   neighbour's error is below FLT_MAX (see the header comment); levels into L; returns the grid index */
__attribute__((optimize("fp-contract=off"))) static int q_iq1_neighbour(const q_grid *g, const uint16_t *nb,
                                                                       const float *x, const float *w, float scale,
                                                                       const float *xg, int8_t *L) {
    float best = FLT_MAX;
    int gi = -1;
    for (int j = 1; j <= nb[0]; j++) {
        const int8_t *p = g->pos + (size_t)nb[j] * 8;
        float d2 = 0.0f;
        for (int i = 0; i < 8; i++) {
            const float diff = scale * xg[(p[i] - 1) / 2] - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) {
            best = d2;
            gi = nb[j];
        }
    }
    for (int j = 0; gi < 0 && j < g->npoints; j++) { /* ggml's fallback, reading x[i] within bounds */
        const int8_t *p = g->pos + (size_t)j * 8;
        float d2 = 0.0f;
        for (int i = 0; i < 8; i++) {
            const float diff = scale * xg[(p[i] - 1) / 2] - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) {
            best = d2;
            gi = j;
        }
    }
    if (gi < 0) gi = nb[1];
    q_grid_levels(g, gi, L);
    return gi;
}

/* a block's values with their positions, sorted ascending (ties in position order) */
__attribute__((optimize("fp-contract=off"))) static void q_iq1_sorted(int n, const float *xb, q_val_index *s) {
    for (int j = 0; j < n; j++) {
        s[j].v = xb[j];
        s[j].i = j;
    }
    q_sort_stable(s, n);
}

/* IQ1_S/IQ1_M, a group's levels from the winning split of the sorted values s (below b1: 0, below b2: 1,
   else 2), turned over with the scale when it came out negative (*scale then made positive; returns 1) */
static int q_iq1_levels(int bs, const q_val_index *s, int b1, int b2, float *scale, int8_t *L) {
    for (int j = 0; j < bs; j++) L[s[j].i] = (int8_t)(j < b1 ? 0 : j < b2 ? 1 : 2);
    if (*scale >= 0) return 0;
    for (int j = 0; j < bs; j++) L[j] = (int8_t)(2 - L[j]);
    *scale = -*scale;
    return 1;
}

/* IQ1_S/IQ1_M: each 8 of a group's nk * 8 levels put on the grid (index[k]; one off the grid moves to its best
   neighbour against the values xxs[k] stand for), and the scale refitted to the grid points when any was off */
__attribute__((optimize("fp-contract=off"))) static void q_iq1_snap(const q_grid *g, int nk, const float *xb,
                                                                   const float *w, const float *const *xxs, int8_t *L,
                                                                   uint16_t *index, float *scale) {
    int all_on = 1;
    for (int k = 0; k < nk; k++) {
        const int u = q_point_index(L + 8 * k, 8, 2);
        int gi = g->map[u];
        if (gi < 0) {
            all_on = 0;
            gi = q_iq1_neighbour(g, q_neighbours_of(g, u), xb + 8 * k, w + 8 * k, *scale, xxs[k], L + 8 * k);
        }
        index[k] = (uint16_t)gi;
    }
    if (all_on) return;
    float sqx = 0, sq2 = 0;
    for (int k = 0; k < nk; k++) {
        const int8_t *p = g->pos + (size_t)index[k] * 8;
        for (int j = 0; j < 8; j++) {
            const float ww = w[8 * k + j], q = xxs[k][(p[j] - 1) / 2];
            sqx += ww * q * xb[8 * k + j];
            sq2 += ww * q * q;
        }
    }
    if (sqx > 0 && sq2 > 0) *scale = sqx / sq2;
}

/* IQ1_S (qw required): blocks of 32, values -1, 0, 1 shifted by +-1/8 (one shift per block), exact
   search over the two cut points of the sorted values, groups of 8 put on the 2048-point grid; 3-bit block
   scales, d = max/15 scaled by 1.125 */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq1_s(const q_grid *g, const float *x, uint8_t *y,
                                                                      const float *qw) {
    const int bs = 32;
    const float x_p[3] = {-1 + Q_IQ1_DELTA, Q_IQ1_DELTA, 1 + Q_IQ1_DELTA};
    const float x_m[3] = {-1 - Q_IQ1_DELTA, -Q_IQ1_DELTA, 1 - Q_IQ1_DELTA};
    float scales[8], w[32], sumx[33], sumw[33];
    int8_t L[32], shifts[8];
    uint16_t index[4], qh[8];
    q_val_index s[32];
    memset(y, 0, 50);
    memset(qh, 0, sizeof qh);
    uint8_t *qs = y + 2;
    float max_scale = 0.0f;
    const float sigma2 = 2 * q_sum_sq(256, x) / 256;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + bs * ib;
        q_weights_sigma(bs, xb, qw + bs * ib, sigma2, w);
        float max = fabsf(xb[0]);
        for (int i = 1; i < bs; i++) max = max > fabsf(xb[i]) ? max : fabsf(xb[i]);
        if (max < Q_EPS_IQ1_S) {
            scales[ib] = 0;
            shifts[ib] = 1;
            continue;
        }
        q_iq1_sorted(bs, xb, s);
        sumx[0] = sumw[0] = 0;
        for (int j = 0; j < bs; j++) {
            const int i = s[j].i;
            sumx[j + 1] = sumx[j] + w[i] * xb[i];
            sumw[j + 1] = sumw[j] + w[i];
        }
        float best = -FLT_MAX, scale = max;
        int b1 = -1, b2 = -1, shift = 0;
        for (int i1 = 0; i1 <= bs; i1++)
            for (int i2 = i1; i2 <= bs; i2++) {
                const float a = sumx[i1] - sumx[0], b = sumx[i2] - sumx[i1], c = sumx[bs] - sumx[i2];
                const float wa = sumw[i1] - sumw[0], wb = sumw[i2] - sumw[i1], wc = sumw[bs] - sumw[i2];
                float sqx = a * x_p[0] + b * x_p[1] + c * x_p[2];
                float sq2 = wa * x_p[0] * x_p[0] + wb * x_p[1] * x_p[1] + wc * x_p[2] * x_p[2];
                if (sq2 > 0 && sqx * sqx > best * sq2) {
                    scale = sqx / sq2;
                    best = scale * sqx;
                    b1 = i1;
                    b2 = i2;
                    shift = 1;
                }
                sqx = a * x_m[0] + b * x_m[1] + c * x_m[2];
                sq2 = wa * x_m[0] * x_m[0] + wb * x_m[1] * x_m[1] + wc * x_m[2] * x_m[2];
                if (sq2 > 0 && sqx * sqx > best * sq2) {
                    scale = sqx / sq2;
                    best = scale * sqx;
                    b1 = i1;
                    b2 = i2;
                    shift = -1;
                }
            }
        if (b1 < 0 || b2 < 0 || shift == 0) {
            scales[ib] = 0;
            shifts[ib] = 1;
            continue;
        }
        if (q_iq1_levels(bs, s, b1, b2, &scale, L)) shift = -shift;
        const float *xx = shift == 1 ? x_p : x_m;
        const float *xxs[4] = {xx, xx, xx, xx};
        q_iq1_snap(g, bs / 8, xb, w, xxs, L, index, &scale);
        uint16_t h = 0;
        for (int k = 0; k < bs / 8; k++) {
            qs[(bs / 8) * ib + k] = (uint8_t)(index[k] & 255);
            h |= (uint16_t)((index[k] >> 8) << (3 * k));
        }
        qh[ib] = h;
        scales[ib] = scale;
        shifts[ib] = (int8_t)shift;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale) {
        const float d = max_scale / 15;
        q_put_f16(y, d * 1.125f);
        const float id = 1 / d;
        for (int ib = 0; ib < 8; ib++) {
            int l = q_odd_scale(id, scales[ib], 7);
            if (shifts[ib] == -1) l |= 8;
            qh[ib] |= (uint16_t)(l << 12);
        }
    }
    memcpy(y + 34, qh, 16);
}

/* IQ1_M (qw optional): blocks of 16 in two halves of 8, each half with its own shift of the values; the
   cut-point search scores the four shift combinations at once from per-half partial sums; 3-bit block
   scales, and d refitted over the whole super-block, scaled by 1.1125, stored in the scales' top nibbles */
__attribute__((optimize("fp-contract=off"))) static void q_quant_iq1_m(const q_grid *g, const float *x, uint8_t *y,
                                                                      const float *qw) {
    const int bs = 16;
    const float x_p[3] = {-1 + Q_IQ1_DELTA, Q_IQ1_DELTA, 1 + Q_IQ1_DELTA};
    const float x_m[3] = {-1 - Q_IQ1_DELTA, -Q_IQ1_DELTA, 1 - Q_IQ1_DELTA};
    static const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    float scales[16], w[16];
    int8_t L[16], shifts[16];
    uint16_t index[2];
    q_val_index s[16];
    memset(y, 0, 56);
    uint8_t *qs = y, *qh = y + 32;
    float max_scale = 0.0f;
    const float sigma2 = 2 * q_sum_sq(256, x) / 256;
    for (int ib = 0; ib < 16; ib++) {
        const float *xb = x + bs * ib;
        if (qw) q_weights_sigma(bs, xb, qw + bs * ib, sigma2, w);
        else
            for (int i = 0; i < bs; i++) w[i] = xb[i] * xb[i];
        float max = fabsf(xb[0]);
        for (int i = 1; i < bs; i++) max = max > fabsf(xb[i]) ? max : fabsf(xb[i]);
        if (max < Q_EPS_IQ1_M) {
            scales[ib] = 0;
            shifts[ib] = 0;
            continue;
        }
        q_iq1_sorted(bs, xb, s);
        float best = -FLT_MAX, scale = max, px[2][17], pw[2][17], sqx[4], sq2[4];
        int b1 = -1, b2 = -1, bk = -1;
        px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0;
        for (int j = 0; j < bs; j++) {
            const int i = s[j].i, h = i < bs / 2 ? 0 : 1;
            px[h][j + 1] = px[h][j] + w[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + w[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        const float txs[2] = {px[0][bs], px[1][bs]}, tws[2] = {pw[0][bs], pw[1][bs]};
        const float p2 = x_p[2], m2 = x_m[2];
        const float cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1], cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
        const float cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1], cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
        for (int i1 = 0; i1 <= bs; i1++)
            for (int i2 = i1; i2 <= bs; i2++) {
                float qxp[2], qxm[2], q2p[2], q2m[2];
                for (int h = 0; h < 2; h++) {
                    const float sx = px[h][i1] + px[h][i2];
                    qxp[h] = txs[h] * p2 - sx;
                    qxm[h] = txs[h] * m2 - sx;
                    q2p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                sqx[0] = qxp[0] + qxp[1];
                sqx[1] = qxp[0] + qxm[1];
                sqx[2] = qxm[0] + qxp[1];
                sqx[3] = qxm[0] + qxm[1];
                sq2[0] = q2p[0] + q2p[1];
                sq2[1] = q2p[0] + q2m[1];
                sq2[2] = q2m[0] + q2p[1];
                sq2[3] = q2m[0] + q2m[1];
                for (int k = 0; k < 4; k++)
                    if (sq2[k] > 0 && sqx[k] * sqx[k] > best * sq2[k]) {
                        scale = sqx[k] / sq2[k];
                        best = scale * sqx[k];
                        b1 = i1;
                        b2 = i2;
                        bk = k;
                    }
            }
        if (b1 < 0 || b2 < 0 || bk < 0) {
            scales[ib] = 0;
            shifts[ib] = 0;
            continue;
        }
        if (q_iq1_levels(bs, s, b1, b2, &scale, L)) bk = 3 - bk; /* 0 <-> 3, 1 <-> 2 */
        const float *xxs[2] = {bk < 2 ? x_p : x_m, bk % 2 == 0 ? x_p : x_m};
        q_iq1_snap(g, 2, xb, w, xxs, L, index, &scale);
        qs[2 * ib] = (uint8_t)(index[0] & 255);
        qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
        qh[ib] = (uint8_t)((index[0] >> 8) | ((index[1] >> 8) << 4));
        scales[ib] = scale;
        shifts[ib] = (int8_t)bk;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (!max_scale) return;
    uint16_t sc[4] = {0, 0, 0, 0};
    float d = max_scale / 15;
    const float id = 1 / d;
    float fqx = 0, fq2 = 0;
    for (int ib = 0; ib < 16; ib++) {
        const int l = q_odd_scale(id, scales[ib], 7);
        sc[ib / 4] |= (uint16_t)(l << (3 * (ib % 4)));
        qh[ib] |= masks[shifts[ib]];
        const float *xb = x + bs * ib;
        if (qw) q_weights_sigma(bs, xb, qw + bs * ib, sigma2, w);
        else
            for (int i = 0; i < bs; i++) w[i] = xb[i] * xb[i];
        for (int k = 0; k < 2; k++) {
            const float *xx = (k == 0 ? shifts[ib] < 2 : shifts[ib] % 2 == 0) ? x_p : x_m;
            const int8_t *p = g->pos + (size_t)(qs[2 * ib + k] + ((qh[ib] << (8 - 4 * k)) & 0x700)) * 8;
            for (int j = 0; j < 8; j++) {
                const float ww = w[8 * k + j], q = xx[(p[j] - 1) / 2] * (float)(2 * l + 1);
                fqx += ww * q * xb[8 * k + j];
                fq2 += ww * q * q;
            }
        }
    }
    if (fq2 > 0) d = fqx / fq2;
    uint8_t hb[2];
    q_put_f16(hb, d * 1.1125f);
    uint16_t s16;
    memcpy(&s16, hb, 2);
    sc[0] |= (uint16_t)((s16 & 0x000f) << 12);
    sc[1] |= (uint16_t)((s16 & 0x00f0) << 8);
    sc[2] |= (uint16_t)((s16 & 0x0f00) << 4);
    sc[3] |= (uint16_t)(s16 & 0xf000);
    memcpy(y + 48, sc, 8);
}
#endif
