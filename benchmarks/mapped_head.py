"""Gemma 3 270M's Q8_0 output head (262144 x 640) from its GGUF file mapping and from a copy in anonymous memory.

``python -m benchmarks.mapped_head BEFORE.so AFTER.so [--isas avx2,avx512] [--rounds 3]``: one activation row, one
thread, each build's ``csimd_q_mul_mat`` called directly on each path, in interleaved rounds of one process (as
``benchmarks.csimd_ab``), timed by the process's CPU time, best of ``--rounds``. The weights read from the mapping
sit on 4 KiB file pages (as ``prism_core.gguf`` maps them); the copy is one NumPy array (huge pages where the
kernel gives them), so the two columns show what the page size costs a memory-bound product.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from prism_core.gguf.file import load as load_gguf
from prism_core.models.catalog import resolve
from prism_core.types import GGMLType

from .csimd_ab import ISAS, load, product


def _best_cpu_ms(call, rounds_left: list[float], i: int) -> None:
    call()  # warm: the weights' pages mapped
    reps, t0 = 0, time.process_time()
    while time.process_time() - t0 < 0.2:
        call()
        reps += 1
    rounds_left[i] = min(rounds_left[i], (time.process_time() - t0) / reps * 1e3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--isas", default="avx2,avx512")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    f = load_gguf(resolve("gemma3-270m"))
    ti = f.tensor_info["token_embd.weight"]
    k, m = ti.ne4[0], ti.ne4[1]
    mapped = f.tensor_bytes(ti.name).reshape(m, -1)
    sources = {"mapping": mapped, "copy": mapped.copy()}
    builds = {"before": load(args.before, "csimd_before"), "after": load(args.after, "csimd_after")}
    x = np.random.default_rng(0).standard_normal((1, k), dtype=np.float32)
    d = np.empty((1, m), np.float32)
    print(f"{ti.name} ({m} x {k} Q8_0, {ti.nbytes / 1e6:.0f} MB), 1 row, 1 thread: CPU ms, best of {args.rounds}")
    for isa in args.isas.split(","):
        calls = {(s, b): product(ffi, lib, GGMLType.Q8_0, w, x, d, ISAS.index(isa))
                 for s, w in sources.items() for b, (ffi, lib) in builds.items()}
        best = [float("inf")] * len(calls)
        for _ in range(args.rounds):
            for i, call in enumerate(calls.values()):
                _best_cpu_ms(call, best, i)
        cells = "  ".join(f"{s}:{b} {t:6.2f}" for (s, b), t in zip(calls, best))
        print(f"{isa:<8} {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
