/* The interface between csimd.c and the copies of the kernel template (csimd_impl.h), each compiled in a
   translation unit of its own (csimd_path_*.c) so that the build compiles them in parallel: the table of
   entry points a copy exports, and what csimd.c defines once for every copy. Every name here has hidden
   visibility: the extension's symbols stay csimd.h's functions. */
#ifndef PRISM_CSIMD_KERNELS_H
#define PRISM_CSIMD_KERNELS_H
#include "csimd.h"

#define CSIMD_HIDDEN __attribute__((visibility("hidden")))

/* The per-pair tables of one ROPE call (built by csimd_rope in csimd.c, O(n_pairs)):
   inverse frequency, position stream (0..3; 0 for the single-stream modes), freq factor (or
   none) and YaRN ramp mix; plus what the per-position cache needs. */
typedef struct {
    int mode;             /* RopeMode: 0 NORMAL, 2 NEOX, 8 MROPE, 24 VISION, 40 IMROPE */
    int streams;          /* positions per token: 1, or 4 for the multi-section modes */
    int64_t n_pairs;      /* rotated pairs per row */
    int64_t n_offs;       /* first rotated element */
    double freq_scale, ext_factor, mscale, sign;
    double *inv_freq, *ffac, *mix; /* ffac NULL without freq factors */
    int *which;
} csimd_rope_tab;

/* The float kernels of one copy (csimd.c's CALL). Arguments were checked by csimd.c's entry points. */
typedef struct {
    void (*binary)(int op, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
    void (*unary)(int op, double p0, double p1, const csimd_tensor *a, const csimd_tensor *d, int nth);
    int (*mul_mat)(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
    void (*soft_max)(const csimd_tensor *a, const csimd_tensor *mask, const csimd_tensor *sinks,
                     const csimd_tensor *d, const float *slopes, float scale, int nth);
    void (*norm)(int rms, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*cpy)(const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*get_rows)(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth);
    void (*cross_entropy)(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, float g, int back,
                          int nth);
    void (*opt_step)(int adamw, const float *p, const csimd_tensor *a, const csimd_tensor *g, const csimd_tensor *m,
                     const csimd_tensor *v, const csimd_tensor *d, int nth);
    void (*repeat)(const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*reduce)(int op, const csimd_tensor *a, const csimd_tensor *d, int nth);
    int (*repeat_back)(const csimd_tensor *a, const csimd_tensor *d);
    void (*rows_back)(int op, float p, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
    void (*diag_mask)(int inf, int64_t n_past, const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*get_rows_back)(const csimd_tensor *g, const csimd_tensor *idx, const csimd_tensor *d);
    int (*out_prod)(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
    void (*glu)(int act, int swapped, double alpha, double limit, const csimd_tensor *a, const csimd_tensor *b,
                const csimd_tensor *d, int nth);
    void (*index_map)(int mode, const int64_t *p, int circular, const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*arange)(double start, double step, const csimd_tensor *d);
    void (*argmax)(const csimd_tensor *a, const csimd_tensor *d);
    void (*xielu)(double an, double ap, double beta, double eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*timestep_embedding)(double max_period, const csimd_tensor *t, const csimd_tensor *d, int nth);
    void (*group_norm)(int64_t n_groups, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*row_from_f32)(char *dst, int t, int64_t dnb, const float *src, int64_t n);
    int (*pool)(int dims2, int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
                const csimd_tensor *a, const csimd_tensor *d, int nth);
    int (*im2col)(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t KH,
                  int64_t KW, const csimd_tensor *b, const csimd_tensor *d, int nth);
    int (*flash_attn)(const csimd_tensor *q, const csimd_tensor *k, const csimd_tensor *v, const csimd_tensor *mask,
                      const csimd_tensor *sinks, const float *slopes, float scale, float softcap,
                      const csimd_tensor *d, int nth);
    int (*conv_2d)(int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, const csimd_tensor *a,
                   const csimd_tensor *b, const csimd_tensor *d, int nth);
    int (*conv_transpose_1d)(int64_t s0, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d,
                             int nth);
    int (*rope)(const csimd_rope_tab *t, const csimd_tensor *a, const csimd_tensor *pos, const csimd_tensor *d,
                int nth);
    int (*upscale)(int bilinear, int align, const csimd_tensor *a, const csimd_tensor *d, int nth);
    void (*im2col_back)(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t KH,
                        int64_t KW, const csimd_tensor *g, const csimd_tensor *d, int nth);
} csimd_kernels;

/* The quantized kernels of one copy (csimd_quant_api.h's QCALL); t, qa, at, qw: ggml type ids */
typedef struct {
    void (*q_dequant)(int t, const uint8_t *src, float *dst, int64_t n);
    int (*q_mul_mat)(int qa, int at, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
    int (*q_mul_mat_id)(int qa, int at, const csimd_tensor *w, const csimd_tensor *b, const csimd_tensor *ids,
                        const csimd_tensor *d, int nth);
    int (*q_vec_dot)(int qw, const uint8_t *w, int at, const uint8_t *a, int64_t K, int64_t rows, float *out);
} csimd_qkernels;

/* the copies (csimd_path_<suffix>.c): AVX-VNNI, dotprod and i8mm differ from the AVX2 or neon copy in
   their quantized kernels only, and export those alone */
extern CSIMD_HIDDEN const csimd_kernels csimd_kernels_scalar;
extern CSIMD_HIDDEN const csimd_qkernels csimd_qkernels_scalar;
#if defined(__x86_64__) || defined(__i386__)
extern CSIMD_HIDDEN const csimd_kernels csimd_kernels_avx2, csimd_kernels_avx512;
extern CSIMD_HIDDEN const csimd_qkernels csimd_qkernels_avx2, csimd_qkernels_avxvnni, csimd_qkernels_avx512;
#elif defined(__aarch64__)
extern CSIMD_HIDDEN const csimd_kernels csimd_kernels_neon;
extern CSIMD_HIDDEN const csimd_qkernels csimd_qkernels_neon, csimd_qkernels_dotprod, csimd_qkernels_i8mm;
#endif

/* defined once in csimd.c, used by every copy */
CSIMD_HIDDEN int64_t csimd_cache_bytes(int level); /* bytes of this machine's data cache at level 1, 2, 3 */
enum { SCRATCH_FLASH_ATTN, SCRATCH_SLOTS };
CSIMD_HIDDEN void *csimd_scratch(int slot, size_t bytes); /* csimd_scratch.h */
/* csimd_set_gelu_tables(): ggml's CPU reads the tanh and quick GELU of an F32 value from tables over
   its F16 rounding; these point to the core's tables (prism_core.gelu_tables), NULL until set */
extern CSIMD_HIDDEN const float *csimd_gelu_f16, *csimd_gelu_quick_f16;

#endif
