/* arm64: the NEON copies of the kernel template and how csimd.c finds which ones this CPU runs.
   Included by csimd.c on aarch64 only. One binary runs on every ARMv8-A CPU: the dotprod and i8mm
   copies carry target attributes (no -march flag), and the kernel (getauxval's hardware capabilities)
   or macOS (sysctl) says which ones may run. */

#if defined(__clang__)
#define CSIMD_TARGET_DOTPROD __attribute__((target("dotprod")))
#define CSIMD_TARGET_I8MM __attribute__((target("dotprod,i8mm")))
#else
#define CSIMD_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define CSIMD_TARGET_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif

/* Advanced SIMD is in every ARMv8-A core: no attribute. 32 vector registers: a 4x16 micro-tile
   (16 accumulators) keeps the portable copy's 4-row packing of b. */
#undef CSIMD_ARM_Q
#define CSIMD_ARM_Q 1
#define SFX neon
#define ATTR
#define ISA_LEVEL 0
#include "csimd_impl.h"

/* dotprod and i8mm: only their quantized kernels are called (ARM_QCALL); the rest of each copy is the
   neon one and never referenced */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#undef CSIMD_ARM_Q
#define CSIMD_ARM_Q 2
#define SFX dotprod
#define ATTR CSIMD_TARGET_DOTPROD
#define ISA_LEVEL 0
#include "csimd_impl.h"

#undef CSIMD_ARM_Q
#define CSIMD_ARM_Q 3
#define SFX i8mm
#define ATTR CSIMD_TARGET_I8MM
#define ISA_LEVEL 0
#include "csimd_impl.h"
#pragma GCC diagnostic pop
#undef CSIMD_ARM_Q
#define CSIMD_ARM_Q 0

#define ARM_QCALL(fn, ...)                                                 \
    switch (q_isa()) {                                                     \
    case CSIMD_ISA_I8MM: fn##_i8mm(__VA_ARGS__); break;                    \
    case CSIMD_ISA_DOTPROD: fn##_dotprod(__VA_ARGS__); break;              \
    case CSIMD_ISA_NEON: fn##_neon(__VA_ARGS__); break;                    \
    default: fn##_scalar(__VA_ARGS__); break;                              \
    }

#if defined(__APPLE__)
#include <sys/sysctl.h>
static int arm_sysctl_flag(const char *name) {
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname(name, &v, &n, NULL, 0) == 0 && v != 0;
}
static int arm_has_dotprod(void) { return arm_sysctl_flag("hw.optional.arm.FEAT_DotProd"); }
static int arm_has_i8mm(void) { return arm_sysctl_flag("hw.optional.arm.FEAT_I8MM"); }
#elif defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
static int arm_has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
static int arm_has_i8mm(void) { return (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0; }
#else /* no way to ask here: only what every ARMv8-A core has */
static int arm_has_dotprod(void) { return 0; }
static int arm_has_i8mm(void) { return 0; }
#endif

static int arm_isa_runs(int isa) {
    switch (isa) {
    case CSIMD_ISA_SCALAR:
    case CSIMD_ISA_NEON: return 1;
    case CSIMD_ISA_DOTPROD: return arm_has_dotprod();
    case CSIMD_ISA_I8MM: return arm_has_dotprod() && arm_has_i8mm();
    default: return 0;
    }
}
