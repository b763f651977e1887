"""numba's MUL_MAT is batch-invariant: each row of the result is, bit for bit, what that activation row
gives alone, whatever the number of rows beside it (1..64: the old switch points of 4 rows for F32 and
24/32 rows for the quantized formats included), its position among them and their values (a row holding
a NaN among them too), at 1 and 2 threads, with the serial compilation (small nodes) and the thread-pool
one (large nodes) both in play. The formats of Gemma 3's Q4_K_M file (Q8_0, Q5_0, Q4_K, Q6_K), the other
integer-path formats (Q4_0; Q4_1 and Q5_1 with Q8_1 activations; Q5_K, Q2_K, Q3_K; the code-book formats
IQ4_NL, IQ4_XS and MXFP4, a byte shuffle of the indices), TQ2_0 (the float path: no
integer kernel) and F32/F16 weights. This is what
lets a continuous-batching engine give each sequence its solo output (tests/test_engine.py)."""

from __future__ import annotations

import numpy as np
import pytest
import test_numba_quant
from gguf import GGMLQuantizationType as GT
from test_csimd_quant import random_blocks

import prism_core as pc
from prism_core.types import TRAITS, GGMLType

ROWS = (1, 2, 3, 4, 5, 7, 8, 13, 23, 24, 25, 31, 32, 33, 47, 64)
M = 45  # weight rows: not a multiple of 4 or 8, so every kernel's row-group tails are in play
# values per row: several k blocks of the F32 kernels (512) with a remainder that is not a whole vector;
# for the 32-value formats an odd block count (the scalar tail), for the K-quants whole super-blocks
K = {"f32": 1000, "f16": 1000, GT.Q4_0: 2336, GT.Q5_0: 2336, GT.Q8_0: 2336, GT.Q4_K: 2304, GT.Q6_K: 2304,
     GT.Q5_K: 2304, GT.Q4_1: 2336, GT.Q5_1: 2336, GT.Q2_K: 2304, GT.Q3_K: 2304, GT.TQ2_0: 2304,
     GT.IQ4_NL: 2336, GT.MXFP4: 2336, GT.IQ4_XS: 2304}
WEIGHTS = ("f32", "f16", GT.Q8_0, GT.Q5_0, GT.Q4_K, GT.Q6_K, GT.Q4_0, GT.Q4_1, GT.Q5_1, GT.Q5_K, GT.Q2_K, GT.Q3_K,
           GT.TQ2_0, GT.IQ4_NL, GT.IQ4_XS, GT.MXFP4)
nb = test_numba_quant.nb  # the numba backend (skips where numba is unavailable)


def _weight(ctx: pc.Context, kind, rng: np.random.Generator) -> pc.Tensor:
    k = K[kind]
    if kind in ("f32", "f16"):
        return ctx.from_numpy(rng.standard_normal((M, k)).astype(np.float32 if kind == "f32" else np.float16))
    t = ctx.new_tensor(GGMLType(int(kind)), (k, M))
    t.set_raw(random_blocks(kind, M * k // TRAITS[GGMLType(int(kind))].blck_size, rng).reshape(M, -1))
    return t


def _product(nb, ctx: pc.Context, w: pc.Tensor, x: np.ndarray) -> np.ndarray:
    """MUL_MAT of w by the rows of x, computed strictly on numba; the result's bits as uint32."""
    out = pc.mul_mat(w, ctx.from_numpy(np.ascontiguousarray(x)))
    pc.compute(pc.Graph().expand(out), nb, strict=True)
    return out.numpy().reshape(len(x), M).view(np.uint32)


@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("kind", WEIGHTS, ids=lambda t: t if isinstance(t, str) else t.name)
def test_each_row_is_what_it_gives_alone(nb, monkeypatch, kind, threads):
    monkeypatch.setenv("PRISM_NUM_THREADS", str(threads))
    monkeypatch.setattr(nb, "_adaptive", False)  # the count asked for, whatever the load
    rng = np.random.default_rng(7)
    ctx = pc.Context()
    w = _weight(ctx, kind, rng)
    n = max(ROWS)
    x = rng.standard_normal((n + 8, K[kind])).astype(np.float32)
    x[5] *= 1e-3  # rows of other magnitudes: their quantization scales differ
    x[9] *= 50.0
    alone = np.stack([_product(nb, ctx, w, x[i:i + 1])[0] for i in range(len(x))])
    # the rows are not trivially alike: a wrong row would show
    assert len({r.tobytes() for r in alone}) == len(x)
    for rows in ROWS:
        for start in sorted({0, 3, len(x) - rows}):  # the same row at different positions, other neighbours
            got = _product(nb, ctx, w, x[start:start + rows])
            for i in range(rows):
                assert np.array_equal(got[i], alone[start + i]), (rows, start, i)
    # a row holding a NaN (not quantized: the float product) changes only its own result
    y = x[:33].copy()
    y[6, 17] = np.nan
    got = _product(nb, ctx, w, y)
    for i in range(len(y)):
        if i != 6:
            assert np.array_equal(got[i], alone[i]), i
    assert np.isnan(got[6].view(np.float32)).all()


@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("kind", (GT.Q8_0, GT.Q4_1, GT.Q6_K, GT.Q3_K, GT.IQ4_NL, GT.IQ4_XS), ids=lambda t: t.name)
def test_few_rows_with_a_nan_match_the_blocked_walk(nb, monkeypatch, kind, threads):
    """Fewer activation rows than a ROWS x COLS block (1-3: each runs over a task's weight rows in one call,
    _jit_qwalk.row_run) give the bits that the same rows get in a batch of eight (the 4 x 4 blocks), and a
    row holding a NaN among them takes the float product without disturbing its neighbours."""
    monkeypatch.setenv("PRISM_NUM_THREADS", str(threads))
    monkeypatch.setattr(nb, "_adaptive", False)
    rng = np.random.default_rng(11)
    ctx = pc.Context()
    w = _weight(ctx, kind, rng)
    x = rng.standard_normal((8, K[kind])).astype(np.float32)
    blocked = _product(nb, ctx, w, x)
    for rows in (1, 2, 3):
        assert np.array_equal(_product(nb, ctx, w, x[:rows]), blocked[:rows]), rows
    y = x[:3].copy()
    y[1, 40] = np.nan
    got = _product(nb, ctx, w, y)
    assert np.array_equal(got[0], blocked[0]) and np.array_equal(got[2], blocked[2])
    assert np.isnan(got[1].view(np.float32)).all()
