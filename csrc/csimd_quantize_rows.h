/* Whole-row quantizers: ggml's reference quantizers as ggml calls them on a row (quantize_row_*_ref, and
   its CPU from_float), and ggml_quantize_chunk (what llama-quantize runs, with or without an importance
   matrix). Included at the end of csimd_quant.h; plain C, compiled once. */
#ifndef PRISM_CSIMD_QUANTIZE_ROWS_H
#define PRISM_CSIMD_QUANTIZE_ROWS_H
#include "csimd_quantize_weighted.h"
#include "csimd_quantize_grid.h"

enum { Q_MODE_CPU = 0, Q_MODE_REF = 1, Q_MODE_CHUNK = 2 };

static inline int q_is_grid_type(int t) {
    return t == Q_IQ2_XXS || t == Q_IQ2_XS || t == Q_IQ2_S || t == Q_IQ3_XXS || t == Q_IQ3_S || t == Q_IQ1_S ||
           t == Q_IQ1_M;
}

/* ggml_quantize_requires_imatrix */
static inline int q_needs_imatrix(int t) { return t == Q_IQ2_XXS || t == Q_IQ2_XS || t == Q_IQ1_S; }

/* whether q_quantize_row / q_quantize_row_chunk can write t in mode: 1 yes, 2 only with an importance
   matrix (chunk mode), 0 no. The reference exists for the grid formats ggml gives one (IQ2_S, IQ3_XXS,
   IQ3_S: their search without weights); the CPU mode is the reference except Q8_0/Q8_1 (csimd_quant.h). */
static int q_row_quantizer(int t, int mode) {
    const int block = q_has_quantizer(t) && t != Q_Q8_1 && t != Q_Q8_K;
    if (mode == Q_MODE_CHUNK) return block || t == Q_IQ2_S || t == Q_IQ3_XXS || t == Q_IQ3_S || t == Q_IQ1_M ? 1
                                     : q_needs_imatrix(t) ? 2 : 0;
    if (mode == Q_MODE_REF || mode == Q_MODE_CPU)
        return q_has_quantizer(t) || t == Q_IQ2_S || t == Q_IQ3_XXS || t == Q_IQ3_S ? 1 : 0;
    return 0;
}

/* the grid format t on one super-block (qw: its 256 weights or NULL) */
static void q_quant_grid_block(int t, const q_grid *g, const float *x, uint8_t *y, const float *qw) {
    switch (t) {
    case Q_IQ2_XXS: q_quant_iq2_xxs(g, x, y, qw); break;
    case Q_IQ2_XS: q_quant_iq2_xs_s(g, x, y, qw, 0); break;
    case Q_IQ2_S: q_quant_iq2_xs_s(g, x, y, qw, 1); break;
    case Q_IQ3_XXS: q_quant_iq3_xxs(g, x, y, qw); break;
    case Q_IQ3_S: q_quant_iq3_s(g, x, y, qw); break;
    case Q_IQ1_S: q_quant_iq1_s(g, x, y, qw); break;
    default: q_quant_iq1_m(g, x, y, qw); break;
    }
}

/* one row of n (a multiple of t's block) as ggml's reference (mode 1) or CPU from_float (mode 0) writes it.
   IQ4_NL: ggml's reference leaves an all-zero block's indices as its scratch buffer held them, i.e. the
   previous block's of the row; so does this, and the first block of a row (where ggml reads uninitialised
   memory) gets the index nearest 0, as ggml_quantize_chunk writes there. g: t's grid for the grid
   formats. Returns 0 or -1. */
static int q_quantize_row(int t, int mode, const float *x, uint8_t *y, int64_t n, const q_grid *g) {
    const int be = q_block_elems(t), bb = q_block_bytes(t);
    if (q_is_grid_type(t)) {
        if (!g || q_row_quantizer(t, Q_MODE_REF) != 1) return -1;
        for (int64_t ib = 0; ib < n / be; ib++) q_quant_grid_block(t, g, x + ib * be, y + ib * bb, NULL);
        return 0;
    }
    if (t == Q_IQ4_NL) {
        for (int64_t ib = 0; ib < n / 32; ib++) {
            const float *xb = x + 32 * ib;
            uint8_t *yb = y + 18 * ib;
            float amax;
            q_signed_absmax(32, xb, &amax);
            q_quant_iq4_nl(xb, yb);
            if (amax < Q_GROUP_MAX_EPS && ib > 0) memcpy(yb + 2, yb + 2 - 18, 16);
        }
        return 0;
    }
    if (q_x86_blocks(t, x, y, n / be)) return 0; /* the same in every mode */
    for (int64_t ib = 0; ib < n / be; ib++)
        if (q_quantize_block(t, mode, x + ib * be, y + ib * bb)) return -1;
    return 0;
}

/* one row as ggml_quantize_chunk writes it, with the row's importance weights qw (n floats) or none.
   Returns 0, -1 for a type without this quantizer, -2 when t needs weights and qw is NULL. */
static int q_quantize_row_chunk(int t, const float *x, uint8_t *y, int64_t n, const float *qw, const q_grid *g) {
    const int avail = q_row_quantizer(t, Q_MODE_CHUNK);
    if (!avail) return -1;
    if (avail == 2 && !qw) return -2;
    const int be = q_block_elems(t), bb = q_block_bytes(t);
    if (q_is_grid_type(t)) {
        if (!g) return -1;
        for (int64_t ib = 0; ib < n / be; ib++)
            q_quant_grid_block(t, g, x + ib * be, y + ib * bb, qw ? qw + ib * be : NULL);
        return 0;
    }
    switch (t) {
    case Q_IQ4_NL:
        for (int64_t ib = 0; ib < n / 32; ib++) q_quant_iq4_nl_chunk(x + 32 * ib, y + 18 * ib, qw ? qw + 32 * ib : NULL);
        return 0;
    case Q_IQ4_XS:
        for (int64_t ib = 0; ib < n / 256; ib++) q_quant_iq4_xs(x + 256 * ib, y + 136 * ib, qw ? qw + 256 * ib : NULL);
        return 0;
    default: break;
    }
    if (qw) switch (t) {
        case Q_Q4_0: q_quant_q4q5_0_rows_w(x, y, n, qw, 4); return 0;
        case Q_Q5_0: q_quant_q4q5_0_rows_w(x, y, n, qw, 5); return 0;
        case Q_Q4_1: q_quant_q4q5_1_rows_w(x, y, n, qw, 4); return 0;
        case Q_Q5_1: q_quant_q4q5_1_rows_w(x, y, n, qw, 5); return 0;
        case Q_Q2_K:
            for (int64_t ib = 0; ib < n / 256; ib++) q_quant_q2_k_w(x + 256 * ib, y + bb * ib, qw + 256 * ib);
            return 0;
        case Q_Q3_K:
            for (int64_t ib = 0; ib < n / 256; ib++) q_quant_q3_k_w(x + 256 * ib, y + bb * ib, qw + 256 * ib);
            return 0;
        case Q_Q4_K: case Q_Q5_K:
            for (int64_t ib = 0; ib < n / 256; ib++)
                q_quant_q4q5_k_w(x + 256 * ib, y + bb * ib, qw + 256 * ib, t == Q_Q5_K);
            return 0;
        case Q_Q6_K:
            for (int64_t ib = 0; ib < n / 256; ib++) q_quant_q6_k(x + 256 * ib, y + bb * ib, qw + 256 * ib);
            return 0;
        default: break; /* Q8_0, MXFP4, TQ1_0, TQ2_0: ggml ignores the weights */
        }
    if (q_x86_blocks(t, x, y, n / be)) return 0;
    for (int64_t ib = 0; ib < n / be; ib++)
        if (q_quantize_block(t, Q_MODE_REF, x + ib * be, y + ib * bb)) return -1;
    return 0;
}
#endif
