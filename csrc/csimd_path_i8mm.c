/* The NEON copy of the kernel template (csimd_impl.h) with dotprod and the int8 matrix multiply
   (smmla/ummla); arm64 only, chosen at run time (csimd_neon_paths.h). Only its quantized kernels differ
   from the neon copy's and are exported; the compiler drops the others. */
#if defined(__aarch64__)
#pragma GCC diagnostic ignored "-Wunused-function"
#define CSIMD_ARM_Q 3
#define CSIMD_QUANT_ONLY
#define SFX i8mm
#if defined(__clang__)
#define ATTR __attribute__((target("dotprod,i8mm")))
#else
#define ATTR __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif
#define ISA_LEVEL 0
#include "csimd_impl.h"
#endif
