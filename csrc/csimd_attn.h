/* Kernel template (part of csimd_impl.h, included at its end, so compiled once per ISA path with
   its SFX/ATTR/VB/VL/VF/FN): FLASH_ATTN_EXT, CONV_2D, CONV_TRANSPOSE_1D.

   Scratch rows are padded to a multiple of 16 floats (64 bytes) and carved from 64-byte aligned
   blocks, so whole VF vectors load aligned on every path; the padding lanes are zero. */
#define XA_PAD(n) (((n) + 15) & ~(int64_t)15)

/* ------------------------------------------------------------ FLASH_ATTN_EXT
   A work item is a block of VL query rows, one row per vector lane, of one batch and one group of
   query heads that share their K and V heads (GQA; a group is one head when K and V are grouped
   differently): the group's rows run query-major, head-minor, so a one-token decode step fills one
   lane per head of the group and reads and converts each K/V row once for all of them. Q is
   transposed once ([D][VL]) so that the scores of a key for all the block's rows are one vector,
   Q.k = sum over d of Q[d] * k[d] (a vector times a broadcast scalar: no horizontal sums). The keys
   are walked in chunks of XA_KB positions; each chunk's K and V rows are converted to F32 once for the
   block. Per lane an online softmax keeps the running maximum M, the running sum L of exp(s - M) and
   the row's accumulator of exp(s - M) * v, rescaled by exp(M_old - M_new) when the maximum grows.
   Masked positions (-inf) give exp(-inf) = 0; groups of XA_KU keys that the mask hides from every row
   of the block are not computed, and a chunk hidden whole is skipped (a causal mask skips about half
   the work). */
#define XA_KB 64
#define XA_KU 8
#define XA_FEW_BLOCKS 8   /* below this many blocks of rows, the keys are split too */
#define XA_SEG_KEYS 128
#define XA_MAX_SEGS 16
#define XA_PRE_BYTES ((size_t)64 << 20) /* the most K/V converted ahead of the blocks */

ATTR static inline VF FN(xa_max)(VF a, VF b) {
    const VI gt = a > b;
    return (VF)(((VI)a & gt) | ((VI)b & ~gt));
}

/* out[u] = the scores (unscaled) of key rows kr + u*ks, u < XA_KU, against the VL rows of Qt ([D][VL]) */
ATTR static inline void FN(xa_qk)(const float *restrict Qt, const float *restrict kr, int64_t ks, int64_t D,
                                  VF *restrict out) {
    VF c[XA_KU];
#pragma GCC unroll 8
    for (int u = 0; u < XA_KU; u++) c[u] = (VF){0};
    for (int64_t e = 0; e < D; e++) {
        const VF x = *(const VF *)(Qt + e * VL);
#pragma GCC unroll 8
        for (int u = 0; u < XA_KU; u++) c[u] += x * kr[u * ks + e];
    }
#pragma GCC unroll 8
    for (int u = 0; u < XA_KU; u++) out[u] = c[u];
}

/* a0 += sum_j P[j][l0] * V_j and a1 += sum_j P[j][l1] * V_j over the rows V_j = V + j * vs (dvp floats,
   a multiple of 16), j < nk; P is [j][VL]: accumulators in registers, 4 vectors of the row at a time,
   each V load used by both rows */
ATTR static void FN(xa_pv)(float *restrict a0, float *restrict a1, const float *restrict P, int l0, int l1,
                           const float *restrict V, int64_t vs, int64_t nk, int64_t dvp) {
    int64_t e = 0;
    for (; e + 4 * VL <= dvp; e += 4 * VL) {
        VF c0[4], c1[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            c0[u] = *(const VF *)(a0 + e + u * VL);
            c1[u] = *(const VF *)(a1 + e + u * VL);
        }
        for (int64_t j = 0; j < nk; j++) {
            const float w0 = P[j * VL + l0], w1 = P[j * VL + l1];
            const float *vr = V + j * vs + e;
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                const VF y = *(const VF *)(vr + u * VL);
                c0[u] += w0 * y;
                c1[u] += w1 * y;
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            *(VF *)(a0 + e + u * VL) = c0[u];
            *(VF *)(a1 + e + u * VL) = c1[u];
        }
    }
    for (; e < dvp; e += VL) {
        VF c0 = *(const VF *)(a0 + e), c1 = *(const VF *)(a1 + e);
        for (int64_t j = 0; j < nk; j++) {
            const VF y = *(const VF *)(V + j * vs + e);
            c0 += P[j * VL + l0] * y;
            c1 += P[j * VL + l1] * y;
        }
        *(VF *)(a0 + e) = c0;
        *(VF *)(a1 + e) = c1;
    }
}

/* each lane's query position and head: rows r0 .. r0 + VL - 1 of head group hg (G heads), query-major */
ATTR static inline void FN(xa_lanes)(int64_t r0, int64_t G, int64_t hg, int64_t *IQ, int64_t *HQ) {
    for (int64_t l = 0; l < VL; l++) {
        IQ[l] = (r0 + l) / G;
        HQ[l] = hg * G + (r0 + l) % G;
    }
}

/* the output rows of one block from its accumulators A (VL rows of dvp), maxima M and sums L: a sink joins
   the softmax's denominator; out = accumulator / sum (0 for a row that saw nothing) */
ATTR static void FN(xa_finish)(float *restrict A, const float *M, const float *L, const int64_t *IQ,
                               const int64_t *HQ, int64_t nq, int64_t dvp, int64_t Dv, const csimd_tensor *sinks,
                               const csimd_tensor *d, int64_t b, float *restrict T) {
    for (int l = 0; l < nq; l++) {
        float *a = A + l * dvp;
        float m = M[l], sl = L[l];
        const int64_t h = HQ[l];
        if (sinks) {
            const int64_t s0 = sinks->ne[0], s1 = sinks->ne[1], s2 = sinks->ne[2];
            float sk;
            memcpy(&sk, ELT(sinks, h % s0, (h / s0) % s1, (h / (s0 * s1)) % s2, h / (s0 * s1 * s2)), 4);
            if (sk > m) {
                const float ms = m > -INFINITY ? expf(m - sk) : 0.0f;
                sl *= ms;
                for (int64_t e = 0; e < Dv; e++) a[e] *= ms;
                m = sk;
            }
            sl += expf(sk - m);
        }
        const float inv = sl > 0.0f ? 1.0f / sl : 0.0f;
        for (int64_t e = 0; e < Dv; e++) T[e] = sl > 0.0f ? a[e] * inv : 0.0f;
        FN(row_from_f32)(ELT(d, 0, h, IQ[l], b), CSIMD_F32, d->nb[0], T, Dv);
    }
}

/* q [D, NQ, H, B], k [D, NKV, Hk, B], v [Dv, NKV, Hv, B] (F32/F16/BF16), mask [>= NKV, >= NQ, m2, m3]
   (F16/F32, broadcast over heads and batches by modulo) or NULL, sinks (F32, >= H values, head h at
   logical index h) or NULL, slopes (H floats); d [Dv, H, NQ, B] F32. K/V heads serve q heads in
   blocks (GQA). */
ATTR static int FN(flash_attn)(const csimd_tensor *q, const csimd_tensor *k, const csimd_tensor *v,
                               const csimd_tensor *mask, const csimd_tensor *sinks, const float *slopes, float scale,
                               float softcap, const csimd_tensor *d, int nth) {
    const int64_t D = q->ne[0], NQ = q->ne[1], H = q->ne[2], B = q->ne[3];
    const int64_t NKV = k->ne[1], Dv = v->ne[0], rk = H / k->ne[2], rv = H / v->ne[2];
    const int64_t G = rk == rv ? rk : 1, NG = H / G, NROW = NQ * G; /* heads per group, groups, rows of one */
    const int64_t dp = XA_PAD(D), dvp = XA_PAD(Dv), nqb = (NROW + VL - 1) / VL, items = B * NG * nqb;
    /* per thread: Q transposed, K and V chunks, bias then scores then probabilities [j][VL],
       accumulators (VL rows), a row of conversions */
    const int64_t nq_f = D * VL, nk_f = XA_KB * dp, nv_f = XA_KB * dvp, ns_f = XA_KB * VL, na_f = VL * dvp,
                  nt_f = XA_PAD(D > Dv ? (D > XA_KB ? D : XA_KB) : (Dv > XA_KB ? Dv : XA_KB));
    const int64_t total = XA_PAD(nq_f) + nk_f + nv_f + ns_f + na_f + nt_f;
    const VF ninf = (VF){0} - INFINITY;
    /* few blocks (a decode step: one per K/V head): the keys split into segments of XA_SEG_KEYS, whose
       partial softmax states are merged at the end, so that threads share the work. The split depends
       on the shapes only, never on the thread count: every count gives the same bits. */
    int64_t nseg = items >= XA_FEW_BLOCKS ? 1 : (NKV + XA_SEG_KEYS - 1) / XA_SEG_KEYS;
    nseg = nseg < XA_MAX_SEGS ? nseg : XA_MAX_SEGS;
    const int64_t seg = nseg > 1 ? ((NKV + nseg - 1) / nseg + XA_KB - 1) / XA_KB * XA_KB : NKV;
    nseg = nseg > 1 ? (NKV + seg - 1) / seg : 1;
    const int64_t part_f = 2 * VL + na_f; /* per (block, segment): its maxima, sums and accumulators */
    float *part = NULL;
    if (nseg > 1 && !(part = (float *)csimd_alloc((size_t)(items * nseg * part_f) * 4))) return -2;
    /* several blocks of rows per K/V head (a prompt): every K and V row converted to F32 once, before the
       blocks, instead of once per block and chunk (on AVX2, with 8 rows a block, the per-block conversion
       took about a quarter of the time); F32 rows, one block per head (a decode step) or more than
       XA_PRE_BYTES of them keep the per-chunk conversion. The same values either way. */
    const int64_t NHK = k->ne[2], NHV = v->ne[2];
    const size_t pre_f = (size_t)(NHK * NKV * dp + NHV * NKV * dvp) * (size_t)B;
    float *pre = NULL;
    if (nseg == 1 && nqb >= 2 && (k->type != CSIMD_F32 || v->type != CSIMD_F32) && pre_f * 4 <= XA_PRE_BYTES &&
        !(pre = (float *)csimd_alloc(pre_f * 4))) {
        free(part);
        return -2;
    }
    float *Kall = pre, *Vall = pre ? pre + (size_t)(NHK * NKV * dp) * (size_t)B : NULL;
    int failed = 0;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
        if (pre) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < (NHK + NHV) * B * NKV; r++) { /* K's rows (head-major per batch), then V's */
                const int64_t j = r % NKV, isv = r / NKV >= NHK * B, hb = r / NKV - (isv ? NHK * B : 0);
                const int64_t nh = isv ? NHV : NHK, h = hb % nh, bb = hb / nh, n = isv ? Dv : D;
                const int64_t np = isv ? dvp : dp;
                const csimd_tensor *t = isv ? v : k;
                float *o = (isv ? Vall : Kall) + (hb * NKV + j) * np; /* hb = bb * nh + h */
                FN(row_to_f32)(o, ELT(t, 0, j, h, bb), t->type, t->nb[0], n);
                for (int64_t e = n; e < np; e++) o[e] = 0.0f;
            }
        }
        float *buf = (float *)csimd_scratch(SCRATCH_FLASH_ATTN, (size_t)total * 4); /* kept for the next call */
        if (!buf) failed = 1;
        float *Qt = buf, *Kc = buf ? Qt + XA_PAD(nq_f) : NULL, *Vc = buf ? Kc + nk_f : NULL;
        float *S = buf ? Vc + nv_f : NULL, *A = buf ? S + ns_f : NULL, *T = buf ? A + na_f : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < items * nseg; w++) {
            if (!buf) continue;
            const int64_t it = w / nseg, ja = w % nseg * seg, jb = ja + seg < NKV ? ja + seg : NKV;
            const int64_t qb = it % nqb, hg = (it / nqb) % NG, b = it / (nqb * NG);
            const int64_t r0 = qb * VL, nq = NROW - r0 < VL ? NROW - r0 : VL;
            const int64_t hk = hg * G / rk, hv = hg * G / rv;
            int64_t IQ[VL], HQ[VL];
            FN(xa_lanes)(r0, G, hg, IQ, HQ);
            for (int64_t e = 0; e < D; e++) *(VF *)(Qt + e * VL) = (VF){0}; /* the lanes past the rows: 0 */
            for (int64_t l = 0; l < nq; l++) {
                FN(row_to_f32)(T, ELT(q, 0, IQ[l], HQ[l], b), q->type, q->nb[0], D);
                for (int64_t e = 0; e < D; e++) Qt[e * VL + l] = T[e];
            }
            VF fill; /* a key's bias before the mask: 0 for the block's rows, -inf for the lanes past them */
            for (int l = 0; l < VL; l++) fill[l] = l < nq && !mask ? 0.0f : -INFINITY;
            memset(A, 0, (size_t)na_f * 4);
            VF M = ninf, L = (VF){0};
            for (int64_t j0 = ja; j0 < jb; j0 += XA_KB) {
                const int64_t nk = jb - j0 < XA_KB ? jb - j0 : XA_KB;
                /* 1. the bias of each (key, row): slope * mask, 0 without a mask, -inf past the rows or keys */
                for (int64_t j = 0; j < XA_KB; j++) *(VF *)(S + j * VL) = j < nk ? fill : ninf;
                for (int64_t l = 0; mask && l < nq; l++) {
                    FN(row_to_f32)(T, ELT(mask, j0, IQ[l], HQ[l] % mask->ne[2], b % mask->ne[3]), mask->type,
                                   mask->nb[0], nk);
                    const float slope = slopes[HQ[l]];
                    for (int64_t j = 0; j < nk; j++) S[j * VL + l] = slope * T[j];
                }
                /* which groups of XA_KU keys some row sees; the chunk ends after the last such group */
                int64_t jend = 0;
                unsigned live = 0;
                for (int64_t g = 0; g < nk; g += XA_KU) {
                    VI any = (VI){0};
#pragma GCC unroll 8
                    for (int u = 0; u < XA_KU; u++) any |= *(const VF *)(S + (g + u) * VL) > ninf;
                    int seen = 0;
                    for (int l = 0; l < VL; l++) seen |= any[l] != 0;
                    if (seen) { live |= 1u << (g / XA_KU); jend = g + XA_KU < nk ? g + XA_KU : nk; }
                }
                if (!live) continue;
                const float *Kj = Kc, *Vj = Vc;
                if (pre) {
                    Kj = Kall + ((b * NHK + hk) * NKV + j0) * dp;
                    Vj = Vall + ((b * NHV + hv) * NKV + j0) * dvp;
                } else {
                    for (int64_t j = 0; j < jend; j++) {
                        FN(row_to_f32)(Kc + j * dp, ELT(k, 0, j0 + j, hk, b), k->type, k->nb[0], D);
                        FN(row_to_f32)(Vc + j * dvp, ELT(v, 0, j0 + j, hv, b), v->type, v->nb[0], Dv);
                    }
                }
                /* 2. scores: s = scale q.k (softcapped) + bias, XA_KU keys at a time */
                for (int64_t g = 0; g < jend; g += XA_KU) {
                    if (!(live >> (g / XA_KU) & 1u)) continue;
                    VF c[XA_KU];
                    FN(xa_qk)(Qt, Kj + g * dp, dp, D, c);
                    for (int u = 0; u < XA_KU && g + u < jend; u++) {
                        VF x = c[u] * scale;
                        if (softcap != 0.0f)
                            for (int l = 0; l < VL; l++) x[l] = softcap * tanhf(x[l] / softcap);
                        VF *s = (VF *)(S + (g + u) * VL);
                        *s = x + *s;
                    }
                }
                /* 3. online softmax per lane: new maximum, rescaled sum, probabilities */
                VF mc = ninf;
                for (int64_t j = 0; j < jend; j++) mc = FN(xa_max)(*(const VF *)(S + j * VL), mc);
                const VF Mn = FN(xa_max)(mc, M);
                const VF Ms = (VF)((VI)Mn & ~(VI)(Mn == ninf)); /* 0 where a row has seen nothing yet */
                const VF ms = FN(vexp_neg)(M - Ms);
                M = Mn;
                VF sum = (VF){0};
                for (int64_t j = 0; j < jend; j++) {
                    VF *s = (VF *)(S + j * VL);
                    *s = FN(vexp_neg)(*s - Ms);
                    sum += *s;
                }
                L = L * ms + sum;
                for (int l = 0; l < nq; l++)
                    if (ms[l] != 1.0f)
                        for (int64_t e = 0; e < dvp; e += VL) *(VF *)(A + l * dvp + e) *= ms[l];
                /* 4. accumulators += probabilities x V, two rows at a time */
                for (int l = 0; l < nq; l += 2)
                    FN(xa_pv)(A + l * dvp, A + (l + 1) * dvp, S, l, l + 1, Vj, dvp, jend, dvp);
            }
            if (nseg == 1) {
                float Mr[VL], Lr[VL];
                for (int l = 0; l < VL; l++) { Mr[l] = M[l]; Lr[l] = L[l]; }
                FN(xa_finish)(A, Mr, Lr, IQ, HQ, nq, dvp, Dv, sinks, d, b, T);
            } else { /* this segment's maxima, sums and accumulators, merged below */
                float *pt = part + w * part_f;
                for (int l = 0; l < VL; l++) { pt[l] = M[l]; pt[VL + l] = L[l]; }
                memcpy(pt + 2 * VL, A, (size_t)na_f * 4);
            }
        }
        if (nseg > 1) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < items; it++) {
                if (!buf) continue;
                const int64_t qb = it % nqb, hg = (it / nqb) % NG, b = it / (nqb * NG);
                const int64_t r0 = qb * VL, nq = NROW - r0 < VL ? NROW - r0 : VL;
                int64_t IQ[VL], HQ[VL];
                float Mm[VL], Lm[VL];
                FN(xa_lanes)(r0, G, hg, IQ, HQ);
                for (int64_t l = 0; l < VL; l++) {
                    Mm[l] = -INFINITY;
                    Lm[l] = 0.0f;
                    for (int64_t sg = 0; sg < nseg; sg++) {
                        const float ms = part[(it * nseg + sg) * part_f + l];
                        Mm[l] = ms > Mm[l] ? ms : Mm[l];
                    }
                }
                memset(A, 0, (size_t)na_f * 4);
                for (int64_t sg = 0; sg < nseg; sg++) { /* each segment's share, rescaled to the common maximum */
                    const float *pt = part + (it * nseg + sg) * part_f;
                    for (int64_t l = 0; l < nq; l++) {
                        if (pt[l] == -INFINITY) continue; /* the segment saw nothing of this row */
                        const float wt = expf(pt[l] - Mm[l]);
                        Lm[l] += wt * pt[VL + l];
                        const float *pa = pt + 2 * VL + l * dvp;
                        float *a = A + l * dvp;
                        for (int64_t e = 0; e < dvp; e += VL) *(VF *)(a + e) += wt * *(const VF *)(pa + e);
                    }
                }
                FN(xa_finish)(A, Mm, Lm, IQ, HQ, nq, dvp, Dv, sinks, d, b, T);
            }
        }
    }
    free(part);
    free(pre);
    return failed ? -2 : 0;
}

/* ------------------------------------------------------------ convolutions */
/* y_r[i] += w[r] * x[i] for the 4 rows y_r, i < n */
ATTR static void FN(xc_axpy4)(float *restrict y0, float *restrict y1, float *restrict y2, float *restrict y3,
                              const float *restrict x, const float *w, int64_t n) {
    const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        const VF xv = *(const VFU *)(x + i);
        *(VFU *)(y0 + i) += w0 * xv;
        *(VFU *)(y1 + i) += w1 * xv;
        *(VFU *)(y2 + i) += w2 * xv;
        *(VFU *)(y3 + i) += w3 * xv;
    }
    for (; i < n; i++) {
        y0[i] += w0 * x[i];
        y1[i] += w1 * x[i];
        y2[i] += w2 * x[i];
        y3[i] += w3 * x[i];
    }
}

ATTR static void FN(xc_axpy)(float *restrict y, const float *restrict x, float w, int64_t n) {
    int64_t i = 0;
    for (; i + VL <= n; i += VL) *(VFU *)(y + i) += w * *(const VFU *)(x + i);
    for (; i < n; i++) y[i] += w * x[i];
}

/* CONV_2D, direct: a [KW, KH, IC, OC], b [W, IH, IC, N] -> d [OW, OH, OC, N] (b's type);
   d[ox, oy, oc, n] = sum a[kw, kh, ic, oc] b[ox*s0 + kw*d0 - p0, oy*s1 + kh*d1 - p1, ic, n] (0 outside b).
   A work item is one output row (oy, n) of 4 output channels: for each input row a tap reads, the row
   is converted to F32 once and each kernel column adds w * (the row's samples at the output
   positions) to the 4 accumulator rows, vectorised over the output width. Weights are packed to F32
   first, [oc][ic][kh][kw], padded to a multiple of 4 channels with zeros. */
#define XC_OCB 4
ATTR static int FN(conv_2d)(int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1,
                            const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth) {
    const int64_t KW = a->ne[0], KH = a->ne[1], IC = a->ne[2], OC = a->ne[3];
    const int64_t W = b->ne[0], IH = b->ne[1], N = b->ne[3], OW = d->ne[0], OH = d->ne[1];
    const int64_t taps = IC * KH * KW, nocb = (OC + XC_OCB - 1) / XC_OCB, items = N * OH * nocb;
    const int64_t owp = XA_PAD(OW), wpad = XA_PAD(W);
    float *wp = (float *)csimd_alloc((size_t)(nocb * XC_OCB * taps) * 4);
    if (!wp) return -2;
    int failed = 0;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t oc = 0; oc < nocb * XC_OCB; oc++)
            for (int64_t ic = 0; ic < IC; ic++)
                for (int64_t kh = 0; kh < KH; kh++)
                    for (int64_t kw = 0; kw < KW; kw++)
                        wp[((oc * IC + ic) * KH + kh) * KW + kw] = oc < OC ? load_f32(ELT(a, kw, kh, ic, oc), a->type) : 0.0f;
        float *acc = (float *)csimd_alloc((size_t)(XC_OCB * owp + wpad + owp) * 4);
        if (!acc) failed = 1;
        float *xrow = acc ? acc + XC_OCB * owp : NULL, *xs = acc ? xrow + wpad : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!acc) continue;
            const int64_t ocb = it % nocb, oy = (it / nocb) % OH, n = it / (nocb * OH);
            memset(acc, 0, (size_t)(XC_OCB * owp) * 4);
            for (int64_t ic = 0; ic < IC; ic++)
                for (int64_t kh = 0; kh < KH; kh++) {
                    const int64_t iy = oy * s1 + kh * d1 - p1;
                    if (iy < 0 || iy >= IH) continue;
                    FN(row_to_f32)(xrow, ELT(b, 0, iy, ic, n), b->type, b->nb[0], W);
                    const float *w0 = wp + ((ocb * XC_OCB * IC + ic) * KH + kh) * KW;
                    for (int64_t kw = 0; kw < KW; kw++) {
                        /* output positions ox in [lo, hi) read x = ox*s0 + off inside [0, W) */
                        const int64_t off = kw * d0 - p0;
                        int64_t lo = off >= 0 ? 0 : (-off + s0 - 1) / s0;
                        int64_t hi = W - 1 - off >= 0 ? (W - 1 - off) / s0 + 1 : 0;
                        if (hi > OW) hi = OW;
                        if (lo >= hi) continue;
                        const float *src = xrow + lo * s0 + off;
                        if (s0 != 1) {
                            for (int64_t i = 0; i < hi - lo; i++) xs[i] = src[i * s0];
                            src = xs;
                        }
                        const float w[4] = {w0[kw], w0[taps + kw], w0[2 * taps + kw], w0[3 * taps + kw]};
                        FN(xc_axpy4)(acc + lo, acc + owp + lo, acc + 2 * owp + lo, acc + 3 * owp + lo, src, w, hi - lo);
                    }
                }
            for (int64_t r = 0; r < XC_OCB && ocb * XC_OCB + r < OC; r++)
                FN(row_from_f32)(ELT(d, 0, oy, ocb * XC_OCB + r, n), d->type, d->nb[0], acc + r * owp, OW);
        }
        free(acc);
    }
    free(wp);
    return failed ? -2 : 0;
}

/* CONV_TRANSPOSE_1D: a [K, OC, IC], b [L, IC] -> d [(L-1)*s0 + K, OC] F32;
   d[l*s0 + k, oc] = sum over (l, k, ic) of a[k, oc, ic] b[l, ic]. The output positions of one phase
   ph < min(s0, K) (o = ph + s0*j) receive the taps k = ph + t*s0 at j = l + t: per (oc, ph) a
   contiguous accumulator over j gets w * (b's row ic) shifted by t, vectorised over l. Positions no
   tap reaches (o mod s0 >= K) are 0. b is converted to F32 rows first. */
ATTR static int FN(conv_transpose_1d)(int64_t s0, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d,
                                      int nth) {
    const int64_t K = a->ne[0], OC = a->ne[1], IC = a->ne[2], L = b->ne[0], OL = d->ne[0];
    const int64_t nph = s0 < K ? s0 : K, items = OC * nph, lp = XA_PAD(L), jlen = L + (K - 1) / s0;
    float *bf = (float *)csimd_alloc((size_t)(IC * lp) * 4);
    if (!bf) return -2;
    int failed = 0;
    (void)nth;
#pragma omp parallel num_threads(nth) if (nth > 1) reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t ic = 0; ic < IC; ic++) FN(row_to_f32)(bf + ic * lp, ELT(b, 0, ic, 0, 0), b->type, b->nb[0], L);
        float *acc = (float *)csimd_alloc((size_t)XA_PAD(jlen) * 4);
        if (!acc) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!acc) continue;
            const int64_t oc = it / nph, ph = it % nph;
            memset(acc, 0, (size_t)jlen * 4);
            for (int64_t ic = 0; ic < IC; ic++)
                for (int64_t t = 0; ph + t * s0 < K; t++)
                    FN(xc_axpy)(acc + t, bf + ic * lp, load_f32(ELT(a, ph + t * s0, oc, ic, 0), a->type), L);
            for (int64_t j = 0; j < jlen && ph + s0 * j < OL; j++) memcpy(ELT(d, ph + s0 * j, oc, 0, 0), acc + j, 4);
            if (ph == 0 && s0 > K) {
                const float z = 0.0f;
                for (int64_t o = 0; o < OL; o++)
                    if (o % s0 >= K) memcpy(ELT(d, o, oc, 0, 0), &z, 4);
            }
        }
        free(acc);
    }
    free(bf);
    return failed ? -2 : 0;
}
#undef XC_OCB
#undef XA_KB
#undef XA_KU
#undef XA_PRE_BYTES
#undef XA_PAD
