"""ggml's own quantized mul_mat on its CPU backend: golden outputs for tests/test_ggml_mulmat_golden.py.

    python tests/data/make_ggml_mulmat_golden.py     # writes tests/data/ggml_mulmat_golden.npz

Seeded float32 weights ``w`` [M, K] are quantized by ggml itself (its reference quantizer, the type
traits' ``from_float_ref`` = ``quantize_row_<type>_ref``, which Prism's quantizers follow; for IQ1_M, which
has none, ``ggml_quantize_chunk`` without an importance matrix) to every block format that ggml-python's
CPU backend multiplies, Prism takes as a MUL_MAT weight and ggml quantizes without an importance matrix.
ggml then computes ``mul_mat(W, X)`` on its CPU backend (``ggml_graph_compute_with_ctx``, 1 thread) for
seeded float32 activations of 1 row (the matrix-vector path) and of 5 and 37 rows (matrix-matrix), the
first 256 values of each row rounding ties of the Q8 activation formats. Keys: ``w`` (float32 [M, K]),
``x{n}`` (float32 [n, K]), ``q_<type>`` (ggml's uint8 blocks [M, row bytes]), ``y_<type>_{n}`` (ggml's
float32 [n, M]), ``types``, ``ns``, ``seed``, ``ggml_python``. Needs ggml-python (a test-data peer only, never a test or
runtime dependency); provenance in tests/data/README.md.
"""

from __future__ import annotations

import ctypes
import functools
from importlib.metadata import version
from pathlib import Path

import ggml
import numpy as np

from prism_core.ops.table import QUANT_WEIGHTS
from prism_core.types import GGMLType, traits

OUT = Path(__file__).resolve().parent / "ggml_mulmat_golden.npz"
SEED = 20261201
M, K = 32, 768  # K: three K-quant super-blocks
NS = (1, 5, 37)  # activation rows: ggml's (and Prism's) matrix-vector path, then its matrix-matrix path


def formats() -> list[GGMLType]:
    """Prism's MUL_MAT weight formats that ggml-python knows and quantizes without an importance matrix."""
    return [t for t in sorted(QUANT_WEIGHTS) if hasattr(ggml, f"GGML_TYPE_{t.name}")
            and getattr(ggml, f"GGML_TYPE_{t.name}") == int(t) and not ggml.ggml_quantize_requires_imatrix(int(t))]


def data(seed: int = SEED) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The weights and activations (tests/test_ggml_mulmat_golden.py regenerates them from the seed)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((M, K), dtype=np.float32)
    xs = {}
    for n in NS:
        x = rng.standard_normal((n, K), dtype=np.float32)
        # the first super-block in half-integers with each 32-block's largest magnitude 127: the Q8
        # scale is then exactly 1, so every value is a rounding tie and ggml's rounding rule shows
        ties = rng.integers(-253, 254, (n, 256)).astype(np.float32) / 2
        ties[:, ::32] = np.where(rng.integers(0, 2, (n, 8)) == 1, 127.0, -127.0)
        x[:, :256] = ties
        xs[n] = x
    return w, xs


def ggml_quantize(t: GGMLType, w: np.ndarray) -> np.ndarray:
    """ggml's reference quantizer of the format (its type traits' ``from_float_ref``, row by row: the
    ``quantize_row_<type>_ref`` Prism's quantizers follow), else ``ggml_quantize_chunk`` without an
    importance matrix (formats with no reference quantizer: IQ1_M)."""
    tr = traits(t)
    out = np.zeros((w.shape[0], w.shape[1] // tr.blck_size * tr.type_size), np.uint8)
    src = np.ascontiguousarray(w, np.float32)
    ggml.ggml_quantize_init(int(t))  # the lattice grids of the IQ2/IQ3 formats' searches
    ref = ggml.ggml_get_type_traits(int(t)).contents.from_float_ref
    if ref:
        for r in range(w.shape[0]):
            ref(src[r].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out[r].ctypes.data, w.shape[1])
        return out
    done = ggml.ggml_quantize_chunk(int(t), src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data,
                                    0, w.shape[0], w.shape[1], None)
    assert done == out.nbytes, (t.name, done, out.nbytes)
    return out


def ggml_quantize_chunk_differs(t: GGMLType, w: np.ndarray, q: np.ndarray) -> bool:
    """Whether ggml_quantize_chunk (llama-quantize's path) gives other bytes than the reference quantizer."""
    out = np.zeros_like(q)
    src = np.ascontiguousarray(w, np.float32)
    ggml.ggml_quantize_chunk(int(t), src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.ctypes.data, 0,
                             w.shape[0], w.shape[1], None)
    return bool((out != q).any())


def ggml_mul_mat(t: GGMLType, blocks: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml's mul_mat(W [K, M], X [K, n]) -> [n, M] on its CPU backend, 1 thread."""
    m, (n, k) = blocks.shape[0], x.shape
    params = ggml.ggml_init_params(mem_size=blocks.nbytes + x.nbytes + 4 * m * n + (16 << 20), mem_buffer=None,
                                   no_alloc=False)
    ctx = ggml.ggml_init(params)
    try:
        wt = ggml.ggml_new_tensor_2d(ctx, int(t), k, m)
        xt = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, k, n)
        ctypes.memmove(ggml.ggml_get_data(wt), blocks.ctypes.data, blocks.nbytes)
        ctypes.memmove(ggml.ggml_get_data(xt), np.ascontiguousarray(x).ctypes.data, x.nbytes)
        y = ggml.ggml_mul_mat(ctx, wt, xt)
        graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(graph, y)
        ggml.ggml_graph_compute_with_ctx(ctx, graph, 1)
        p = ctypes.cast(ggml.ggml_get_data(y), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(p, shape=(n, m)).copy()
    finally:
        ggml.ggml_free(ctx)


@functools.cache  # one ggml build per process: probed once, asked by several tests
def f16_sums_in_half() -> bool:
    """Whether this ggml build adds F16 products in half precision rather than float32.

    ggml's CPU dot product of two F16 rows (an F16 weight's MUL_MAT, b rounded to F16) multiplies and
    accumulates in F16 where it was compiled for AVX512-FP16 (ggml-python builds with -march=native, so on
    Sapphire Rapids and later) or ARM's FP16 vector arithmetic, and in float32 everywhere else, which is
    what Prism's backends do. The probe: 2048 + 1 in one accumulator lane (elements 0 and 128) is 2049 in
    float32 and 2048 in F16 (spacing 2 there, the tie rounding to even)."""
    k = 256
    w, x = np.zeros((1, k), np.float16), np.zeros((1, k), np.float32)
    w[0, 0], x[0, 0], w[0, 128], x[0, 128] = 2048, 1, 1, 1
    y = float(ggml_mul_mat(GGMLType.F16, w, x)[0, 0])
    assert y in (2048.0, 2049.0), y
    return y == 2048.0


def main() -> None:
    w, xs = data()
    types = formats()
    out: dict[str, np.ndarray] = {"w": w, "types": np.array([traits(t).name for t in types]), "ns": np.array(NS),
                                  "seed": np.array(SEED), "ggml_python": np.array(version("ggml_python"))}
    out.update({f"x{n}": x for n, x in xs.items()})
    for t in types:
        name = traits(t).name
        out[f"q_{name}"] = q = ggml_quantize(t, w)
        if ggml_quantize_chunk_differs(t, w, q):
            print(f"{name}: ggml_quantize_chunk's bytes differ from the reference quantizer's")
        for n, x in xs.items():
            y = ggml_mul_mat(t, q, x)
            assert np.isfinite(y).all(), name
            out[f"y_{name}_{n}"] = y
    np.savez_compressed(OUT, **out)
    print(f"{OUT}: {OUT.stat().st_size} bytes, formats {', '.join(out['types'])}")


if __name__ == "__main__":
    main()
