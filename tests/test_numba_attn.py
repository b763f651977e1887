"""numba's FLASH_ATTN_EXT (backends/prism_numba/_jit_ext.py) beyond the conformance cases: an independent
float64 softmax, each query row the same bits alone as among others (batch invariance) at 1 and 2 threads,
and a key the mask hides skipped before its product, as ggml's CPU kernel does."""

from __future__ import annotations

import numpy as np
import pytest
import test_numba_quant

import prism_core as pc
from prism_core.types import F16

nb = test_numba_quant.nb  # the numba backend (skips where numba is unavailable)

D, T, H, HK = 72, 45, 4, 1  # D not a multiple of 16: the dot product's padded tail is in play


def _inputs(rng: np.random.Generator):
    q = rng.standard_normal((H, T, D)).astype(np.float32)
    k = rng.standard_normal((HK, T, D)).astype(np.float16)
    v = rng.standard_normal((HK, T, D)).astype(np.float16)
    causal = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, 0.0).astype(np.float16)
    return q, k, v, causal


def _attn(nb, q, k, v, mask, scale=0.125) -> np.ndarray:
    """FLASH_ATTN_EXT on numba, strictly; NumPy order (n_q, H, D)."""
    ctx = pc.Context()
    y = pc.flash_attn_ext(ctx.from_numpy(q), ctx.from_numpy(k, F16), ctx.from_numpy(v, F16),
                          ctx.from_numpy(mask, F16), scale=scale)
    pc.compute(y, nb, strict=True)
    return y.host()[0].copy()


def test_causal_gqa_matches_a_float64_softmax(nb):
    q, k, v, causal = _inputs(np.random.default_rng(3))
    got = _attn(nb, q, k, v, causal)
    for h in range(H):
        s = q[h].astype(np.float64) @ k[0].astype(np.float64).T * 0.125 + causal.astype(np.float64)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v[0].astype(np.float64)
        np.testing.assert_allclose(got[:, h], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", (1, 2))
def test_each_query_row_is_what_it_gives_alone(nb, monkeypatch, threads):
    monkeypatch.setenv("PRISM_NUM_THREADS", str(threads))
    monkeypatch.setattr(nb, "_adaptive", False)  # the count asked for, whatever the load
    q, k, v, causal = _inputs(np.random.default_rng(4))
    together = _attn(nb, q, k, v, causal).view(np.uint32)
    for i in (0, 1, 17, T - 1):  # the first row sees one key, the last every key
        alone = _attn(nb, np.ascontiguousarray(q[:, i:i + 1]), k, v, np.ascontiguousarray(causal[i:i + 1]))
        np.testing.assert_array_equal(alone.view(np.uint32)[0], together[i])


def test_a_masked_key_is_skipped_before_its_product(nb):
    """Key 1 is infinite but masked: it takes no part (ggml skips the key), so the one visible key's
    softmax weight is 1 and the output is its value row exactly; computing the product first would give
    inf + -inf = NaN."""
    rng = np.random.default_rng(5)
    q = np.abs(rng.standard_normal((1, 1, D))).astype(np.float32)
    k = np.ones((1, 2, D), np.float16)
    k[0, 1] = np.inf
    v = rng.standard_normal((1, 2, D)).astype(np.float16)
    v[0, 1] = np.nan  # hidden from every row: never read
    mask = np.array([[0.0, -np.inf]], np.float16)
    got = _attn(nb, q, k, v, mask)
    np.testing.assert_array_equal(got[0, 0], v[0, 0].astype(np.float32))
