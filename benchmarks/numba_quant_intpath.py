"""``python -m benchmarks.numba_quant_intpath [--rows 1,4,16]``: prism_numba's two quantized
product kernels side by side, one thread, CPU time, best of several interleaved runs: the integer
path (``q_mul_mat_int``: activations quantized to int8 once, int8 dot products in AVX-512 VNNI
lanes) and the float path (``q_mul_mat``: blocks decoded to float32 tiles, float dots), with ggml's
CPU backend (ggml-python) as the peer, per format, for n activation rows x 2048 x 2048. The
evidence behind kernels_quant.INT_PATH_ROWS (backends/prism_numba/README.md, "Block types")."""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from prism_numba.kernels import _jit

from benchmarks.quantized import FORMATS, GgmlMulMat, ggml, weight_blocks

KERNELS = _jit().KERNELS


def best(f, reps: int = 15) -> float:
    f()
    times = []
    for _ in range(reps):
        t = time.process_time()
        f()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,4,16", help="activation row counts, comma-separated")
    args = p.parse_args()
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    k = m = 2048
    print(f"n x {k} x {m}, one thread, GOPS (2*n*k*m / CPU time), best of 3 interleaved rounds of 15")
    for n in (int(v) for v in args.rows.split(",")):
        x = rng.standard_normal((n, k), dtype=np.float32)
        for t in FORMATS:
            blocks = weight_blocks(t, m, k, rng)
            a, b = blocks.reshape(1, 1, m, -1), x.reshape(1, 1, n, k)
            o = np.empty((1, 1, n, m), np.float32)
            runs = {"int": lambda: KERNELS["q_mul_mat_int"](int(t), a, b, o),
                    "float": lambda: KERNELS["q_mul_mat"](int(t), a, b, o)}
            peer = GgmlMulMat(t, blocks, x, 1) if ggml is not None else None
            if peer is not None:
                runs["ggml"] = peer
            got = {name: np.inf for name in runs}
            for _ in range(3):  # rounds, each timing every kernel: the load of the machine hits all alike
                for name, f in runs.items():
                    got[name] = min(got[name], best(f))
            ops = 2 * n * k * m
            line = ", ".join(f"{name} {ops / s / 1e9:6.1f}" for name, s in got.items())
            print(f"{n:3d} x {k} x {m} {t.name:5s}: {line}  (int / float {got['float'] / got['int']:.2f}x)")
            if peer is not None:
                peer.close()


if __name__ == "__main__":
    main()
