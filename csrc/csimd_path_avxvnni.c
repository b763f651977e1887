/* The AVX2 copy of the kernel template (csimd_impl.h) with AVX-VNNI (vpdpbusd on ymm, VEX); x86-64 only.
   Only its quantized kernels differ from the AVX2 copy's (q_dp4) and are exported: the other kernels are
   never referenced, and the compiler drops them. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC diagnostic ignored "-Wunused-function"
#define CSIMD_AVXVNNI 1
#define CSIMD_QUANT_ONLY
#define SFX avxvnni
#define ATTR __attribute__((target("avx2,fma,f16c,avxvnni")))
#define ISA_LEVEL 1
#include "csimd_impl.h"
#endif
