"""What this machine can do at most, measured: FP32 FMA peak and memory bandwidth.

The peak is a tiny C kernel (independent FMA chains in registers, nothing read from memory) run on
every core at once, compiled here with the system C compiler and loaded with ctypes (which releases
the GIL, so the cores run together). Without a compiler the peak falls back to OpenBLAS's best
SGEMM through NumPy, a lower bound, and says so. A clock read from /proc/cpuinfo is not used: a
VM reports its base clock while the cores boost well above it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np

_KERNEL_SRC = r"""
#include <stdint.h>
#include <stddef.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define CHAINS 16 /* > FMA latency x pipes on current x86 cores */
__attribute__((target("avx512f"))) double fma_avx512(int64_t iters) {
    __m512 acc[CHAINS];
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], m, a);
    double s = 0;
    for (int j = 0; j < CHAINS; j++) s += _mm512_reduce_add_ps(acc[j]);
    return s;
}
__attribute__((target("avx2,fma"))) double fma_avx2(int64_t iters) {
    __m256 acc[12];
    const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
    for (int j = 0; j < 12; j++) acc[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) acc[j] = _mm256_fmadd_ps(acc[j], m, a);
    float t[8];
    double s = 0;
    for (int j = 0; j < 12; j++) {
        _mm256_storeu_ps(t, acc[j]);
        for (int l = 0; l < 8; l++) s += t[l];
    }
    return s;
}
/* the portable path's limit (csimd's scalar copy: 16-byte SSE2 vectors, multiply and add apart) */
double fma_sse(int64_t iters) {
    __m128 acc[12];
    const __m128 m = _mm_set1_ps(0.999999f), a = _mm_set1_ps(1e-6f);
    for (int j = 0; j < 12; j++) acc[j] = _mm_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) acc[j] = _mm_add_ps(_mm_mul_ps(acc[j], m), a);
    float t[4];
    double s = 0;
    for (int j = 0; j < 12; j++) {
        _mm_storeu_ps(t, acc[j]);
        for (int l = 0; l < 4; l++) s += t[l];
    }
    return s;
}
/* n floats copied with the ISA's widest loads and stores (n a multiple of 16) */
__attribute__((target("avx512f"))) void copy_avx512(float *d, const float *s, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(d + i, _mm512_loadu_ps(s + i));
}
__attribute__((target("avx2"))) void copy_avx2(float *d, const float *s, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(d + i, _mm256_loadu_ps(s + i));
}
void copy_sse(float *d, const float *s, int64_t n) {
    for (int64_t i = 0; i < n; i += 4) _mm_storeu_ps(d + i, _mm_loadu_ps(s + i));
}
void run_copy(int isa, float *d, const float *s, int64_t n) {
    if (isa == 2) copy_avx512(d, s, n); else if (isa == 1) copy_avx2(d, s, n); else copy_sse(d, s, n);
}
/* FLOPs per iteration of each kernel, 0 when this CPU lacks the ISA */
int64_t flops_per_iter(int isa) {
    __builtin_cpu_init();
    if (isa == 2) return __builtin_cpu_supports("avx512f") ? 16 * 2 * CHAINS : 0;
    if (isa == 1) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 12 * 8 * 2 : 0;
    return 12 * 4 * 2;
}
double run_fma(int isa, int64_t iters) {
    return isa == 2 ? fma_avx512(iters) : isa == 1 ? fma_avx2(iters) : fma_sse(iters);
}
#elif defined(__aarch64__)
#include <arm_neon.h>
#define CHAINS 16 /* > FMA latency x pipes on current Arm cores (4 x 4 on Neoverse V2, Apple's) */
/* isa 0 on arm64: Advanced SIMD, 128-bit FMA, the width of every csimd path there (neon, dotprod, i8mm) */
static double fma_neon(int64_t iters) {
    float32x4_t acc[CHAINS];
    const float32x4_t m = vdupq_n_f32(0.999999f), a = vdupq_n_f32(1e-6f);
    for (int j = 0; j < CHAINS; j++) acc[j] = vdupq_n_f32((float)j);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int j = 0; j < CHAINS; j++) acc[j] = vfmaq_f32(a, acc[j], m);
    double s = 0;
    for (int j = 0; j < CHAINS; j++) s += vaddvq_f32(acc[j]);
    return s;
}
int64_t flops_per_iter(int isa) { return isa == 0 ? 4 * 2 * CHAINS : 0; }
double run_fma(int isa, int64_t iters) { return isa == 0 ? fma_neon(iters) : 0; }
void run_copy(int isa, float *d, const float *s, int64_t n) {
    (void)isa;
    for (int64_t i = 0; i < n; i += 16) vst1q_f32_x4(d + i, vld1q_f32_x4(s + i));
}
#else
int64_t flops_per_iter(int isa) { (void)isa; return 0; }
double run_fma(int isa, int64_t iters) { (void)isa; (void)iters; return 0; }
void run_copy(int isa, float *d, const float *s, int64_t n) { (void)isa; for (int64_t i = 0; i < n; i++) d[i] = s[i]; }
#endif
/* bytes summed: a read-bandwidth stream over n floats */
double read_sum(const float *p, int64_t n) {
    float s[16] = {0};
    for (int64_t i = 0; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) s[l] += p[i + l];
    double t = 0;
    for (int l = 0; l < 16; l++) t += s[l];
    return t;
}
"""

_ARM64 = platform.machine().lower() in ("aarch64", "arm64")
_ISA_NAMES = ({0: "NEON FMA (every csimd path)"} if _ARM64 else
              {2: "AVX-512", 1: "AVX2+FMA", 0: "SSE2 (csimd's portable path)"})
_PEAK_ISAS = (0,) if _ARM64 else (2, 1)  # the widest FMA first; x86's isa 0 has no FMA
_lib_cache: list = []


def _kernel_lib() -> ctypes.CDLL | None:
    """The peak kernels compiled once per source into a cache folder; None without a C compiler."""
    if _lib_cache:
        return _lib_cache[0]
    lib = None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc:
        tag = hashlib.sha1(_KERNEL_SRC.encode()).hexdigest()[:12]
        folder = os.path.join(tempfile.gettempdir(), f"prism-bench-peak-{os.getuid()}")
        os.makedirs(folder, exist_ok=True)
        so = os.path.join(folder, f"peak-{tag}.so")
        if not os.path.exists(so):
            src = os.path.join(folder, f"peak-{tag}.c")
            with open(src, "w") as f:
                f.write(_KERNEL_SRC)
            tmp = f"{so}.{os.getpid()}"
            rc = subprocess.run([cc, "-O3", "-shared", "-fPIC", "-o", tmp, src], capture_output=True)
            if rc.returncode == 0:
                os.replace(tmp, so)
        if os.path.exists(so):
            lib = ctypes.CDLL(so)
            lib.flops_per_iter.argtypes, lib.flops_per_iter.restype = [ctypes.c_int], ctypes.c_int64
            lib.run_fma.argtypes, lib.run_fma.restype = [ctypes.c_int, ctypes.c_int64], ctypes.c_double
            lib.read_sum.argtypes, lib.read_sum.restype = [ctypes.c_void_p, ctypes.c_int64], ctypes.c_double
            lib.run_copy.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            lib.run_copy.restype = None
    _lib_cache.append(lib)
    return lib


def _on_every_core(works: list) -> list[float]:
    """CPU seconds each callable took, one Python thread per callable, all started at once (ctypes
    drops the GIL). Each thread's own CPU time, not the wall clock: on a shared machine another
    process's time slices then do not count against this one's."""
    start = threading.Barrier(len(works) + 1)
    cpu = [0.0] * len(works)

    def run(i: int) -> None:
        start.wait()
        t = time.thread_time()
        works[i]()
        cpu[i] = time.thread_time() - t
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(works))]
    for t in ts:
        t.start()
    start.wait()
    for t in ts:
        t.join()
    return cpu


def fma_peak_gflops(isa: int, threads: int | None = None, repeats: int = 5) -> float:
    """Measured FP32 GFLOPS of the FMA kernel for `isa` (2 AVX-512, 1 AVX2, 0 SSE2 multiply + add; on
    arm64 0 NEON FMA) on `threads` cores at once (default: all), each core's best run over its own CPU
    time, summed; NaN when the CPU lacks the ISA or no C compiler is present."""
    lib = _kernel_lib()
    per = lib.flops_per_iter(isa) if lib is not None else 0
    if not per:
        return float("nan")
    threads = threads or os.cpu_count() or 1
    iters = 2_000_000  # ~10 ms per core at 100 GFLOPS
    lib.run_fma(isa, iters // 10)  # warm-up: clocks up, page-in
    per_core = [max(per * iters / t / 1e9 for t in cpu) for cpu in
                zip(*(_on_every_core([lambda: lib.run_fma(isa, iters)] * threads) for _ in range(repeats)))]
    return sum(per_core)


def openblas_sgemm_gflops(n: int = 2048, repeats: int = 3) -> float:
    """NumPy's (OpenBLAS's) best F32 n^3 matrix product: a lower bound on the peak."""
    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def fp32_peak_gflops() -> tuple[float, str]:
    """(GFLOPS, how it was obtained): the FMA kernel on every core for the widest ISA the CPU has,
    else OpenBLAS's best SGEMM as a lower bound."""
    cores = os.cpu_count() or 1
    for isa in _PEAK_ISAS:
        g = fma_peak_gflops(isa, cores)
        if g == g:  # not NaN
            return g, (f"measured: {_ISA_NAMES[isa]} FMA chains in registers on {cores} cores at once, "
                       f"{g / cores:.0f} GFLOPS per core over each thread's CPU time")
    g = openblas_sgemm_gflops()
    return g, "lower bound: OpenBLAS's best SGEMM 2048^3 via NumPy (no C compiler for the FMA kernel)"


# the vector width each csimd path computes with (its version ends in +PATH): the key of _ISA_NAMES
_CSIMD_PATH_ISA = {"avx512": 2, "avxvnni": 1, "avx2": 1, "scalar": 0, "neon": 0, "dotprod": 0, "i8mm": 0}


def path_peak_gflops(version: str) -> tuple[str, float] | None:
    """(ISA name, FP32 GFLOPS on every core) of the kernels a backend whose version names its path
    (csimd's ``0.1.0+avx2``) computes with: the limit beside that backend's ratios when it runs a
    narrower path than the CPU's widest (``PRISM_CSIMD_ISA=avx2`` on an AVX-512 machine). None for
    a version naming no such path."""
    isa = _CSIMD_PATH_ISA.get(version.rpartition("+")[2])
    if isa is None or (_ARM64 and isa != 0):
        return None
    g = fma_peak_gflops(isa)
    return (_ISA_NAMES[isa], g) if g == g else None


def copy_bandwidth_gbs(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """GB/s of np.copyto between two large buffers (bytes read + written), one thread."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = min(_time(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * nbytes / best / 1e9


def read_bandwidth_gbs(nbytes: int = 256 << 20, threads: int | None = None, repeats: int = 3) -> float:
    """GB/s read by every core at once, each summing its own slice of one buffer far beyond the
    caches (each core's best over its own CPU time, summed); NaN without a C compiler."""
    lib = _kernel_lib()
    if lib is None:
        return float("nan")
    threads = threads or os.cpu_count() or 1
    buf = np.ones(nbytes // 4, np.float32)
    part = buf.size // threads
    works = [lambda p=buf[i * part:].ctypes.data: lib.read_sum(p, part) for i in range(threads)]
    _on_every_core(works)  # warm-up: pages touched
    runs = [_on_every_core(works) for _ in range(repeats)]
    return sum(max(part * 4 / t / 1e9 for t in cpu) for cpu in zip(*runs))


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def isa_copy_gbs(isa: int, nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """GB/s (read + written) of one thread copying nbytes with `isa`'s widest vectors (2 AVX-512,
    1 AVX2, 0 SSE2); NaN without the C kernels or the ISA."""
    lib = _kernel_lib()
    if lib is None or not lib.flops_per_iter(isa):
        return float("nan")
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    run = lambda: lib.run_copy(isa, dst.ctypes.data, src.ctypes.data, src.size)  # noqa: E731
    run()
    return 2 * nbytes / min(_time(run) for _ in range(repeats)) / 1e9


def limits_per_isa(threads: int | None = None) -> list[tuple[str, float, float, float]]:
    """(ISA, FP32 GFLOPS on one core, on `threads` cores, one thread's copy GB/s) for each ISA this
    CPU runs, widest first: the limit beside each path's ratios (csimd's avx512, avx2/avxvnni and
    scalar paths compute with these widths)."""
    out = []
    for isa in sorted(_ISA_NAMES, reverse=True):
        one = fma_peak_gflops(isa, 1)
        if one == one:
            out.append((_ISA_NAMES[isa], one, fma_peak_gflops(isa, threads), isa_copy_gbs(isa)))
    return out


if __name__ == "__main__":
    print("per ISA: FP32 peak (FMA chains in registers) and one thread's copy bandwidth")
    print(f"{'ISA':<30}{'GFLOPS 1 core':>15}{'all cores':>12}{'copy GB/s':>12}")
    for name, one, every, copy in limits_per_isa():
        print(f"{name:<30}{one:15.1f}{every:12.1f}{copy:12.1f}")
