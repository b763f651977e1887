/* The NEON copy of the kernel template (csimd_impl.h) with the dot product instructions (sdot/udot);
   arm64 only, chosen at run time (csimd_neon_paths.h), so a target attribute and no -march flag. Only its
   quantized kernels differ from the neon copy's and are exported; the compiler drops the others. */
#if defined(__aarch64__)
#pragma GCC diagnostic ignored "-Wunused-function"
#define CSIMD_ARM_Q 2
#define CSIMD_QUANT_ONLY
#define SFX dotprod
#if defined(__clang__)
#define ATTR __attribute__((target("dotprod")))
#else
#define ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define ISA_LEVEL 0
#include "csimd_impl.h"
#endif
