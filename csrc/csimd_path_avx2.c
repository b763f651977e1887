/* The AVX2+FMA+F16C copy of the kernel template (csimd_impl.h); x86-64 only. */
#if defined(__x86_64__) || defined(__i386__)
#define SFX avx2
#define ATTR __attribute__((target("avx2,fma,f16c")))
#define ISA_LEVEL 1
#include "csimd_impl.h"
#endif
