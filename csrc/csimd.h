/* prism csimd: public C interface (build_csimd.py hands these declarations to cffi's cdef). */
#ifndef PRISM_CSIMD_H
#define PRISM_CSIMD_H
#include <stdint.h>

/* bumped with every change of a function's signature or meaning: the Python side refuses a build
   from other sources (same names, other arguments) instead of calling it wrongly */
#define CSIMD_ABI_VERSION 7

/* instruction-set paths (csimd_cpu_isa, csimd_set_isa); the numbers are not an order */
#define CSIMD_ISA_SCALAR 0  /* portable: 16-byte GCC vectors, no intrinsics (SSE2 on x86-64, the compiler's NEON on arm64) */
#define CSIMD_ISA_AVX2 1    /* AVX2 + FMA + F16C */
#define CSIMD_ISA_AVX512 2  /* AVX-512F (the quantized kernels: with BW and VNNI, else the AVX-VNNI or AVX2 copy) */
#define CSIMD_ISA_AVXVNNI 3 /* AVX2 + AVX-VNNI: the AVX2 kernels, the quantized ones with vpdpbusd on ymm */
#define CSIMD_ISA_NEON 4    /* arm64 Advanced SIMD with intrinsics (F16 conversions, smull integer dot products) */
#define CSIMD_ISA_DOTPROD 5 /* arm64 + the dot-product extension: the NEON kernels, the quantized ones with sdot */
#define CSIMD_ISA_I8MM 6    /* arm64 + dotprod + i8mm: the dotprod kernels, matrix-matrix products with smmla */

/* element types */
#define CSIMD_F32 0
#define CSIMD_F16 1
#define CSIMD_BF16 2
#define CSIMD_I32 3
#define CSIMD_I64 4 /* COUNT_EQUAL's result only */
#define CSIMD_QBASE 64 /* a quantized block format: CSIMD_QBASE + its ggml type id (Q4_0 = 66, ...) */

/* A strided 4-D tensor view, ggml order: ne[0] innermost; nb in bytes.
   The Python side validates that every addressed byte lies inside the buffer. */
typedef struct {
    char *data;
    int64_t ne[4];
    int64_t nb[4];
    int type;
} csimd_tensor;

int csimd_abi_version(void);   /* CSIMD_ABI_VERSION: changes whenever a signature below changes */
int csimd_cpu_isa(void);        /* the best CSIMD_ISA_* path this CPU runs */
int csimd_isa_runs(int isa);    /* 1 when this CPU runs path isa, else 0 */
int csimd_set_isa(int isa);     /* returns 0, or -1 when the CPU cannot run it */
int csimd_get_isa(void);
int csimd_has_openmp(void);
int csimd_max_threads(void);
/* Parallel kernels take fewer threads while the calling thread waits often for a CPU (another process busy
   on the cores; csimd_threads.h, prism_core/contention.py). on: 1 or 0 (always the count asked for); the
   rule's constants: the interval between looks (s), the share of waiting above which kernels take half
   the threads, the CPUs' worth of time the process must have left to others for a wait to count, the
   first and the longest hold (s). Counts the CPUs the process may run on; every thread's watch starts
   afresh. Returns 1 (on), 0 (off, or on but the scheduler statistics are missing), -1 for a bad constant. */
int csimd_set_adaptive_threads(int on, double look, double share, double outside, double hold_min, double hold_max);
/* the rule alone, for tests (a watch of the calling thread's own): a look at time t (s), the thread having
   waited `delay` s in all, the process having run `cpu` s on all its threads, on ncpu CPUs, nth threads
   asked for; returns the limit after it (0: none); reset != 0 first starts the watch over */
int csimd_thread_watch_look(double t, double delay, double cpu, int ncpu, int nth, int reset);
/* what the rule reads, for tests: out[0] the calling thread's run-queue delay so far (s), out[1] the
   process's CPU time so far over all its threads (s), out[2] the CPUs it may run on; 0, or -1 where the
   scheduler statistics are missing */
int csimd_thread_readings(double *out);

int csimd_binary(int op, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_unary(int op, double p0, double p1, const csimd_tensor *a, const csimd_tensor *d, int nth);
/* ggml's GELU and quick GELU tables (float32[65536], indexed by an input's F16 bits; prism_core.gelu_tables):
   kept by pointer, set once before any GELU; 0, or -1 for a NULL table */
int csimd_set_gelu_tables(const float *gelu, const float *gelu_quick);
int csimd_mul_mat(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_soft_max(const csimd_tensor *a, const csimd_tensor *mask, const csimd_tensor *sinks, const csimd_tensor *d,
                   const float *slopes, float scale, int nth);
int csimd_norm(int rms, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_cpy(const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_get_rows(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth);
int csimd_cross_entropy(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, const csimd_tensor *g,
                        int back, int nth);
int csimd_opt_step(int adamw, const csimd_tensor *p, const csimd_tensor *a, const csimd_tensor *g,
                   const csimd_tensor *m, const csimd_tensor *v, const csimd_tensor *d, int nth);
int csimd_repeat(const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_reduce(int op, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_repeat_back(const csimd_tensor *a, const csimd_tensor *d);
int csimd_rows_back(int op, float p, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_diag_mask(int inf, int64_t n_past, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_get_rows_back(const csimd_tensor *g, const csimd_tensor *idx, const csimd_tensor *d);
int csimd_out_prod(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_glu(int act, int swapped, double alpha, double limit, const csimd_tensor *a, const csimd_tensor *b,
              const csimd_tensor *d, int nth);
int csimd_index_map(int mode, const int64_t *p, int circular, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_arange(double start, double step, const csimd_tensor *d);
int csimd_argmax(const csimd_tensor *a, const csimd_tensor *d);
int csimd_xielu(double an, double ap, double beta, double eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_timestep_embedding(double max_period, const csimd_tensor *t, const csimd_tensor *d, int nth);
int csimd_group_norm(int64_t n_groups, float eps, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_argsort(int descending, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_set_rows(const csimd_tensor *b, const csimd_tensor *c, const csimd_tensor *d, int nth);
int csimd_count_equal(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_pool(int dims2, int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
               const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_im2col(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t KH,
                 int64_t KW, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_pool_2d_back(int op_max, int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1,
                       const csimd_tensor *g, const csimd_tensor *x, const csimd_tensor *d, int nth);
int csimd_mul_mat_id(const csimd_tensor *w, const csimd_tensor *b, const csimd_tensor *ids, const csimd_tensor *d, int nth);
int csimd_flash_attn_ext(const csimd_tensor *q, const csimd_tensor *k, const csimd_tensor *v, const csimd_tensor *mask,
                         const csimd_tensor *sinks, const float *slopes, float scale, float softcap, const csimd_tensor *d,
                         int nth);
int csimd_conv_2d(int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, const csimd_tensor *a,
                  const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_conv_transpose_1d(int64_t s0, const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_rope(int back, int mode, int64_t n_dims, int64_t n_offs, const int64_t *sections, double freq_base,
               double freq_scale, double ext_factor, double attn_factor, double corr_low, double corr_high,
               const csimd_tensor *a, const csimd_tensor *pos, const csimd_tensor *ff, const csimd_tensor *d, int nth);
int csimd_upscale(int bilinear, int align_corners, const csimd_tensor *a, const csimd_tensor *d, int nth);
int csimd_im2col_back(int is2d, int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t KH,
                      int64_t KW, const csimd_tensor *g, const csimd_tensor *d, int nth);
/* quantized block formats (csimd_quant*.h); t below is a ggml type id */
int csimd_q_isa(void);          /* the path the quantized kernels run: AVX-512 needs BW and VNNI too */
int csimd_q_info(int t, int *block_elems, int *block_bytes, int *has_quantizer);
int csimd_q_dequantize(int t, const void *src, float *dst, int64_t n, int nth);
int csimd_q_quantize(int t, int mode, const float *src, void *dst, int64_t n, int nth);
/* nrows rows of n_per_row floats to block type t: mode 0 as ggml's CPU from_float, 1 its reference quantizer,
   2 ggml_quantize_chunk (llama-quantize's quantizers) with importance weights imatrix (n_per_row floats; NULL:
   none; modes 0 and 1 take none). 0, -1 for bad arguments or no such quantizer, -2 for a type that needs an
   importance matrix and got none */
int csimd_q_quantize_rows(int t, int mode, const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                          const float *imatrix, int nth);
int csimd_q_row_quantizer(int t, int mode); /* 1: csimd_q_quantize_rows writes t in mode, 2: with an imatrix, 0: no */
int csimd_q_vec_dot(int wt, const void *w, int at, const void *a, int64_t k, int64_t rows, float *out);
int csimd_q_mul_mat(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int at, int nth);
int csimd_q_mul_mat_id(const csimd_tensor *w, const csimd_tensor *b, const csimd_tensor *ids, const csimd_tensor *d,
                       int at, int nth);
int csimd_q_get_rows(const csimd_tensor *a, const csimd_tensor *idx, const csimd_tensor *d, int nth);
int csimd_q_cpy(const csimd_tensor *a, const csimd_tensor *d, int mode, int nth);
int csimd_q_set_rows(const csimd_tensor *b, const csimd_tensor *c, const csimd_tensor *d, int mode, int nth);
int csimd_q_out_prod(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int nth);
int csimd_q_add(const csimd_tensor *a, const csimd_tensor *b, const csimd_tensor *d, int mode, int nth);
#endif
