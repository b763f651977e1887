"""Reference kernels: RoPE, fused attention, expert routing, row scatter."""

from __future__ import annotations

import numpy as np

from prism_core import Tensor
from prism_core.errors import InvalidArgument
from prism_core.ops.semantics import RopeTables, alibi_slopes, checked_row_indices, rope_tables
from prism_core.types import from_f32

from .kernels import elements, f32_round, kernel, mul_mat_b, store, val


def rope_angles(n: Tensor, t: RopeTables) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (times mscale) for each token (rows) and pair index k (columns)."""
    p = n.params
    ff = val(n.src[2]).reshape(-1) if len(n.src) > 2 and n.src[2] is not None else None
    theta_base = t.streams[t.which].T * t.inv_freq  # (n_tok, n_pairs)
    if ff is not None:
        theta_base = theta_base / ff[:t.n_pairs]
    theta = p["freq_scale"] * theta_base
    if p["ext_factor"] != 0.0:
        theta = theta * (1 - t.mix) + theta_base * t.mix
    return np.cos(theta) * t.mscale, np.sin(theta) * t.mscale


@kernel("ROPE", "ROPE_BACK")
def _rope(n: Tensor) -> None:
    a, pos = n.src[0], n.src[1].host().reshape(-1)
    p = n.params
    x = val(a)  # (ne3, n_tok, n_head, ne0)
    out = x.copy()
    t = rope_tables(p, pos, n.ne[2])
    first, second = t.first, t.second
    cos, sin = rope_angles(n, t)
    if n.opdef.key == "ROPE_BACK":
        sin = -sin  # the inverse rotation is the transpose
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # broadcast over batch and heads
    x0, x1 = x[..., first], x[..., second]
    out[..., first] = x0 * cos - x1 * sin
    out[..., second] = x0 * sin + x1 * cos
    store(n, out)


@kernel("FLASH_ATTN_EXT")
def _flash_attn_ext(n: Tensor) -> None:
    q, k, v = (val(t) for t in n.src[:3])  # (B, H, n_q, D), (B, Hk, n_kv, D), (B, Hv, n_kv, Dv)
    mask = n.src[3] if len(n.src) > 3 else None
    sinks = n.src[4] if len(n.src) > 4 else None
    p = n.params
    n_head = q.shape[1]
    kk = np.repeat(k, n_head // k.shape[1], axis=1)  # grouped-query heads: block broadcast
    vv = np.repeat(v, n_head // v.shape[1], axis=1)
    with np.errstate(over="ignore"):  # ggml scales the scores in float32: overflow gives inf there
        s = f32_round(q @ np.swapaxes(kk, -1, -2) * p["scale"])  # (B, H, n_q, n_kv)
    if p["logit_softcap"] != 0.0:
        s = p["logit_softcap"] * np.tanh(s / p["logit_softcap"])
    if mask is not None:
        m = val(mask)[:, :, : q.shape[2], :]
        m = np.tile(m, (q.shape[0] // m.shape[0], n_head // m.shape[1], 1, 1))
        s = s + alibi_slopes(n_head, p["max_bias"]).reshape(1, -1, 1, 1) * m
    mx = s.max(axis=-1, keepdims=True, initial=-np.inf)  # no keys (n_kv = 0): -inf, then ggml's S == 0 case
    if sinks is not None:
        mx = np.maximum(mx, val(sinks).reshape(1, -1, 1, 1))
    with np.errstate(invalid="ignore"):
        mx = np.where(np.isfinite(mx), mx, 0.0)  # fully masked rows give 0, as ggml's S == 0 case
        e = np.exp(s - mx)
        den = e.sum(axis=-1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(val(sinks).reshape(1, -1, 1, 1) - mx)
        out = np.where(den > 0, (e @ vv) / np.where(den > 0, den, 1.0), 0.0)  # (B, H, n_q, Dv)
    store(n, np.swapaxes(out, 1, 2))  # result [Dv, H, n_q, B]: heads and queries swapped


@kernel("MUL_MAT_ID")
def _mul_mat_id(n: Tensor) -> None:
    w, b = val(n.src[0])[0], mul_mat_b(n)[0]  # (n_exp, M, K), (n_tok, n_b, K)
    ids = n.src[2].host()[0, 0]  # (n_tok, n_used)
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        raise InvalidArgument(f"MUL_MAT_ID: expert id out of range [0, {w.shape[0]})")
    n_tok, n_used = ids.shape
    out = np.empty((n_tok, n_used, w.shape[1]))
    for t in range(n_tok):
        for e in range(n_used):
            out[t, e] = w[ids[t, e]] @ b[t, e % b.shape[1]]
    store(n, out[None])


@kernel("SET_ROWS")
def _set_rows(n: Tensor) -> None:
    b, c = n.src[0], n.src[1]
    rows = checked_row_indices("SET_ROWS", c, n.ne[1])[0]  # (C2, C1, m)
    src = val(b)  # (S3, S2, m, n)
    dst = elements(n)  # a block type: each row quantized (from float32, as ggml) into its block bytes
    for k in range(n.ne[3]):
        for j in range(n.ne[2]):
            idx = rows[k % rows.shape[0], j % rows.shape[1]]
            row = src[k, j].astype(np.float32) if n.traits.is_quantized else src[k, j]
            dst[k, j, idx] = from_f32(row, n.type)
