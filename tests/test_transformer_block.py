"""A transformer block built only from Prism ops matches an independent NumPy formulation.

RMS norm, RoPE (NeoX) attention with grouped-query heads and a causal mask, computed
both with FLASH_ATTN_EXT and with the unfused mul_mat/soft_max path, then a SwiGLU
feed-forward; the NumPy version below is written in float64 with NumPy conventions.
"""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc
from prism_core import F16, F32
from prism_core.ops import RopeMode

D, H, HKV, HD, T, FF, EPS, BASE = 32, 4, 2, 8, 6, 48, 1e-5, 10000.0


def numpy_block(x, w, positions):
    """x (T, D) -> (T, D), all in float64 NumPy."""
    def rms(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS) * g

    def rope_neox(v):  # v (T, heads, HD): rotate (k, k + HD/2) by pos * BASE^(-2k/HD)
        half = HD // 2
        ang = positions[:, None] * BASE ** (-2 * np.arange(half) / HD)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = v[..., :half], v[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)

    h = rms(x, w["attn_norm"])
    q = rope_neox((h @ w["wq"].T).reshape(T, H, HD))
    k = rope_neox((h @ w["wk"].T).reshape(T, HKV, HD))
    v = (h @ w["wv"].T).reshape(T, HKV, HD)
    out = np.zeros((T, H, HD))
    for head in range(H):
        kv = head // (H // HKV)
        s = q[:, head] @ k[:, kv].T / np.sqrt(HD)
        s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
    x = x + out.reshape(T, D) @ w["wo"].T
    h = rms(x, w["ffn_norm"])
    gate, up = h @ w["wg"].T, h @ w["wu"].T
    return x + (gate / (1 + np.exp(-gate)) * up) @ w["wd"].T


def prism_block(ctx, x, w, pos, mask, fused):
    """The same block from Prism ops; tensors in ggml order (x: ne [D, T])."""
    def rms(v, g):
        return pc.mul(pc.rms_norm(v, EPS), g)

    def heads(t, n):  # [n*HD, T] -> [HD, n, T], then RoPE over dim 2 = tokens
        return pc.rope_ext(pc.reshape(t, (HD, n, T)), pos, n_dims=HD, mode=RopeMode.NEOX, freq_base=BASE)

    h = rms(x, w["attn_norm"])
    q = heads(pc.mul_mat(w["wq"], h), H)                               # [HD, H, T]
    k = heads(pc.mul_mat(w["wk"], h), HKV)
    v = pc.reshape(pc.mul_mat(w["wv"], h), (HD, HKV, T))
    q, k, v = (pc.permute(t, 0, 2, 1, 3) for t in (q, k, v))           # [HD, T, heads]
    if fused:
        attn = pc.flash_attn_ext(q, pc.cast(k, F16), pc.cast(v, F16), mask, scale=HD ** -0.5)  # [HD, H, T]
    else:
        kq = pc.mul_mat(pc.cont(k), q)                                  # [T_kv, T_q, H]; kv heads broadcast
        probs = pc.soft_max_ext(kq, mask, scale=HD ** -0.5)
        vt = pc.cont(pc.transpose(v))                                   # [T_kv, HD, HKV]
        attn = pc.permute(pc.mul_mat(vt, probs), 0, 2, 1, 3)            # [HD, H, T_q]
    x = pc.add(x, pc.mul_mat(w["wo"], pc.cont(attn, (D, T))))
    h = rms(x, w["ffn_norm"])
    ff = pc.swiglu_split(pc.mul_mat(w["wg"], h), pc.mul_mat(w["wu"], h))
    return pc.add(x, pc.mul_mat(w["wd"], ff))


@pytest.mark.parametrize("fused", [True, False], ids=["flash_attn_ext", "unfused"])
@pytest.mark.parametrize("backend", [b.name for b in pc.backends() if b.available])
def test_transformer_block_matches_numpy(fused, backend):
    rng = np.random.default_rng(7)
    shapes = {"attn_norm": (D,), "ffn_norm": (D,), "wq": (H * HD, D), "wk": (HKV * HD, D), "wv": (HKV * HD, D),
              "wo": (D, H * HD), "wg": (FF, D), "wu": (FF, D), "wd": (D, FF)}
    w_np = {k: rng.normal(0, 0.3 if len(s) == 2 else 1.0, s) for k, s in shapes.items()}
    x_np = rng.normal(0, 1, (T, D))
    positions = np.arange(T) + 3
    expected = numpy_block(x_np, w_np, positions)

    ctx = pc.Context()
    w = {k: ctx.from_numpy(v.astype(np.float32)) for k, v in w_np.items()}
    x = ctx.from_numpy(x_np.astype(np.float32))
    pos = ctx.from_numpy(positions.astype(np.int32))
    causal = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, 0.0)
    mask = ctx.from_numpy(causal.astype(np.float16), F16)
    out = prism_block(ctx, x, w, pos, mask, fused)
    report = pc.compute(out, backend)
    assert out.type == F32 and out.shape == (T, D)
    tol = 2e-3 if fused else 1e-4  # F16 K/V in the fused path
    np.testing.assert_allclose(out.numpy(), expected, rtol=tol, atol=tol * np.abs(expected).max())
    be = pc.backend(backend)
    assert all(not be.supports(f.node) for f in report.fallbacks)  # only what the backend lacks falls back
