/* The NEON copy of the kernel template (csimd_impl.h); arm64 only. Advanced SIMD is in every ARMv8-A core:
   no attribute. 32 vector registers: a 4x16 micro-tile (16 accumulators) keeps the portable copy's 4-row
   packing of b. */
#if defined(__aarch64__)
#define CSIMD_ARM_Q 1
#define SFX neon
#define ATTR
#define ISA_LEVEL 0
#include "csimd_impl.h"
#endif
