/* arm64: which NEON paths this CPU runs (included by csimd.c on aarch64 only). One binary runs on every
   ARMv8-A CPU: the dotprod and i8mm copies of the template (csimd_path_dotprod.c, csimd_path_i8mm.c) carry
   target attributes (no -march flag), and the kernel (getauxval's hardware capabilities) or macOS (sysctl)
   says which ones may run. */

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
