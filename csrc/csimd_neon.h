/* NEON pieces of the kernel template (arm64 only), included by csimd_impl.h when CSIMD_ARM_Q >= 1:
   the copies csimd.c compiles for arm64 (neon: CSIMD_ARM_Q 1, dotprod: 2, i8mm: 3). Everything else of
   those copies is the template's 16-byte GCC vector code, which is NEON already (Advanced SIMD is part
   of every ARMv8-A core); what the vector extensions cannot say is written here with intrinsics. */
#include <arm_neon.h>

/* F16 -> F32 of n values, 8 at a time (fcvtl/fcvtl2, exact as the software conversion); returns how
   many it converted (the caller converts the rest) */
ATTR static inline int64_t FN(neon_f16_to_f32)(float *restrict dst, const uint16_t *restrict s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(s + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    return i;
}

/* F32 -> F16 of n values, 8 at a time (fcvtn/fcvtn2 in the FPCR's rounding mode, to nearest even unless a
   caller changed it: the software conversion's rounding; NaN stays NaN, quieted, as F16C does) */
ATTR static inline int64_t FN(neon_f32_to_f16)(uint16_t *restrict d, const float *restrict src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(src + i)), vld1q_f32(src + i + 4));
        vst1q_u16(d + i, vreinterpretq_u16_f16(h));
    }
    return i;
}

/* fp16 bits -> float (one fcvt) */
ATTR static inline float FN(neon_h2f)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
