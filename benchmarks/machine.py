"""What this machine can do at most: copy bandwidth (measured) and FP32 peak (from its CPU flags)."""

from __future__ import annotations

import os
import re
import time

import numpy as np


def copy_bandwidth_gbs(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """GB/s of np.copyto between two large buffers (bytes read + written)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = min(_time(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * nbytes / best / 1e9


def fp32_peak_gflops() -> tuple[float, str]:
    """Cores x clock x FP32 FMA throughput per cycle, from /proc/cpuinfo (an estimate)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return float("nan"), "unknown CPU"
    mhz = float(re.search(r"cpu MHz\s*:\s*([\d.]+)", info).group(1)) if "cpu MHz" in info else float("nan")
    flags = set(re.search(r"flags\s*:\s*(.*)", info).group(1).split()) if "flags" in info else set()
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    per_cycle = 2 * lanes * 2  # two FMA pipes, each lane a multiply and an add
    cores = os.cpu_count() or 1
    isa = "AVX-512" if lanes == 16 else "AVX2" if lanes == 8 else "SSE"
    how = f"{cores} cores x {mhz / 1000:.2f} GHz x {per_cycle} FP32 FLOP/cycle ({isa})"
    return cores * mhz / 1000 * per_cycle, how


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
