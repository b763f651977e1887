"""``python -m benchmarks.numba_quant_intpath``: the trial behind prism_numba's choice of the float path
(backends/prism_numba/README.md, "Block types"): the integer activation path written in numba for
Q8_0 and Q4_0 (activations quantized to Q8_0 once, int8 x int8 products summed in int32 per block,
then scaled), against the backend's float path (blocks decoded to float32, float dots), on a
1 x 2048 x 2048 matrix-vector product, one thread. Its kernels are a trial, not part of the backend."""
import time

import numba
import numpy as np
from numba import njit, prange
from prism_numba._jit import KERNELS
from prism_numba._jit_quant import F16_LUT

from prism_core.quant import quantize, quantize_activations
from prism_core.types import GGMLType as G

OPTS = dict(cache=True, fastmath={"reassoc", "contract"}, nogil=True, error_model="numpy")


@njit(parallel=True, **OPTS)
def q8_0_int(a, ai8, qb, db, o):
    nm = a.shape[0]
    nb = qb.shape[0] // 32
    w32 = min(32, qb.shape[0])  # a runtime bound: vectorised, not unrolled into scalars
    for m in prange(nm):
        r = a[m]
        ri = ai8[m]
        s = np.float32(0.0)
        for ib in range(nb):
            o0 = ib * 34
            d = F16_LUT[np.int64(r[o0]) | (np.int64(r[o0 + 1]) << 8)]
            acc = np.int32(0)
            for j in range(w32):
                acc += np.int32(ri[o0 + 2 + j]) * np.int32(qb[ib * 32 + j])
            s += d * db[ib] * np.float32(acc)
        o[m] = s


@njit(parallel=True, **OPTS)
def q4_0_int(a, qb, db, o):
    nm = a.shape[0]
    nb = qb.shape[0] // 32
    w16 = min(16, qb.shape[0])
    for m in prange(nm):
        r = a[m]
        s = np.float32(0.0)
        for ib in range(nb):
            o0 = ib * 18
            d = F16_LUT[np.int64(r[o0]) | (np.int64(r[o0 + 1]) << 8)]
            acc = np.int32(0)
            for j in range(w16):
                v = np.int32(r[o0 + 2 + j])
                acc += ((v & 0xF) - 8) * np.int32(qb[ib * 32 + j]) + ((v >> 4) - 8) * np.int32(qb[ib * 32 + 16 + j])
            s += d * db[ib] * np.float32(acc)
        o[m] = s


def best(f, n: int = 15) -> float:
    f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    k = m = 2048
    rng = np.random.default_rng(0)
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((1, 1, 1, k)).astype(np.float32)
    numba.set_num_threads(1)  # one thread: the least disturbed by other processes
    for t in (G.Q8_0, G.Q4_0):
        raw = quantize(w, t)
        o = np.empty((1, 1, 1, m), np.float32)
        fl = KERNELS["q_mul_mat"]
        t_float = best(lambda: fl(int(t), raw.reshape(1, 1, m, -1), x, o))

        def int_path():
            blk = quantize_activations(x.reshape(1, k), G.Q8_0).reshape(-1, 34)  # once per activation row
            qb = blk[:, 2:].view(np.int8).reshape(-1)
            db = blk[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
            out = np.empty(m, np.float32)
            if t == G.Q8_0:
                q8_0_int(raw, raw.view(np.int8), qb, db, out)
            else:
                q4_0_int(raw, qb, db, out)
            return out
        t_int = best(int_path)
        diff = np.abs(int_path() - o.reshape(-1)).max() / np.abs(o).max()
        print(f"{t.name}: float path {t_float * 1e3:.3f} ms, integer path {t_int * 1e3:.3f} ms "
              f"(activation quantization included), max difference {diff:.1e} of the largest output")


if __name__ == "__main__":
    main()
