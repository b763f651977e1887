/* The portable copy of the kernel template (csimd_impl.h), which every CPU runs: 16-byte GCC vectors
   (SSE2 on x86-64, NEON on arm64, scalar code elsewhere). */
#define SFX scalar
#define ATTR
#define ISA_LEVEL 0
#include "csimd_impl.h"
