/* The AVX-512 copy of the kernel template (csimd_impl.h); x86-64 only. Its quantized kernels also need
   AVX512BW and VNNI (csimd_quant_impl.h's QATTR; csimd_quant_api.h runs them only where the CPU has them). */
#if defined(__x86_64__) || defined(__i386__)
#define SFX avx512
#define ATTR __attribute__((target("avx512f,avx2,fma,f16c")))
#define ISA_LEVEL 2
#include "csimd_impl.h"
#endif
