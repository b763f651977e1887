"""``python -m benchmarks.numba_quant [--gemm] [--model]``: numba's quantized matrix-vector product beside
csimd's and beside NumPy's float32 product on the dequantized weights (1 x 2048 x 2048, Q4_0/Q8_0/Q4_K/Q6_K),
best of several runs each, ratios against NumPy; ``--gemm``: also 128 x 2048 x 2048; ``--model``:
Gemma 3 270M decode tok/s on numba (and csimd) through ``prism_core.models``. Numba compiles on first
use: the first call of each kernel is a warm-up (or an on-disk cache load) and is not timed."""

from __future__ import annotations

import argparse
import time

import numpy as np

import prism_core as pc
from prism_core.quant import dequantize, quantize
from prism_core.types import GGMLType

FORMATS = (GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K)


def _best(f, reps: int = 15) -> float:
    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def matvec(k: int = 2048, m: int = 2048, n: int = 1) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((n, k)).astype(np.float32)
    names = [b.name for b in pc.backends() if b.available and b.name in ("numba", "csimd")]
    print(f"{n} x {k} x {m}, best of 15, ms (ratio: NumPy f32 time / this time)")
    for t in FORMATS:
        blocks = quantize(w, t)
        wd = dequantize(blocks, t)
        t_np = _best(lambda: x @ wd.T)
        line = [f"{t.name:5s} numpy-f32-dequantized {t_np * 1e3:7.3f}"]
        for name in names:
            ctx = pc.Context()
            a = ctx.new_tensor(t, (k, m))
            a.set_raw(blocks)
            out = pc.mul_mat(a, ctx.from_numpy(x))
            p = pc.plan(pc.Graph().expand(out), pc.backend(name), strict=True)
            dt = _best(p.compute)
            gbs = blocks.nbytes / dt / 1e9
            line.append(f"{name} {dt * 1e3:7.3f} ({t_np / dt:4.2f}x, {gbs:5.1f} GB/s of weights)")
        print("  ".join(line))


def model(n_tokens: int = 16) -> None:
    from prism_core.models import load
    for name in ("numba", "csimd"):
        if not any(b.name == name and b.available for b in pc.backends()):
            continue
        m = load("gemma3-270m", backend=name, n_ctx=256)
        list(m.generate("The capital of France is", max_tokens=4))  # warm-up: compiles or loads the cache
        list(m.generate("The capital of France is", max_tokens=n_tokens))
        t = m.timings
        print(f"gemma3-270m on {name}: decode {t.decode_tok_s:6.1f} tok/s ({t.n_decode} tokens), "
              f"prompt {t.prompt_tok_s:6.1f} tok/s ({t.n_prompt} tokens)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", action="store_true", help="also Gemma 3 270M decode tok/s")
    ap.add_argument("--gemm", action="store_true", help="also the matrix-matrix product 128 x 2048 x 2048")
    args = ap.parse_args()
    matvec()
    if args.gemm:
        matvec(n=128)
    if args.model:
        model()


if __name__ == "__main__":
    main()
