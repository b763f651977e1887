"""Independent checks of the reference RoPE, fused attention, expert routing and row scatter.

RoPE expectations are the rotations written out with ``math`` for a few positions and
pairs; attention is checked against the unfused ``soft_max(mul_mat)`` path built from
Prism ops and against a plain per-head loop; MUL_MAT_ID and SET_ROWS against loops.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import full, run, verifier

import prism_core as pc
from prism_core import F16, F32
from prism_core.ops import RopeMode

VERIFIED, verifies = verifier()  # op-table keys this module checks


def rotate(x0: float, x1: float, theta: float, mscale: float = 1.0) -> tuple[float, float]:
    c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
    return x0 * c - x1 * s, x0 * s + x1 * c


def rope_input(ctx, hd=8, heads=2, tokens=3, seed=0):
    vals = np.random.default_rng(seed).uniform(-1, 1, (tokens, heads, hd)).astype(np.float32)
    return ctx.from_numpy(vals), vals.astype(np.float64)


@verifies("ROPE")
@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX])
def test_rope_rotation_written_out(mode):
    ctx = pc.Context()
    a, x = rope_input(ctx, hd=8)
    positions = [0, 1, 7]
    pos = ctx.from_numpy(np.array(positions, np.int32))
    y = full(run(pc.rope_ext(a, pos, n_dims=6, mode=mode, freq_base=100.0)))[0]  # (tokens, heads, hd)
    for t, p in enumerate(positions):
        for h in range(2):
            expect = list(x[t, h])
            for k in range(3):  # n_dims / 2 pairs; dims 6 and 7 are copied
                theta = p * 100.0 ** (-2 * k / 6)
                i, j = (2 * k, 2 * k + 1) if mode == RopeMode.NORMAL else (k, k + 3)
                expect[i], expect[j] = rotate(x[t, h, i], x[t, h, j], theta)
            np.testing.assert_allclose(y[t, h], expect, rtol=1e-5, atol=1e-6)


@verifies("ROPE")
def test_rope_yarn_and_freq_factors_by_hand():
    ctx = pc.Context()
    a, x = rope_input(ctx, hd=8, heads=1, tokens=1)
    pos = ctx.from_numpy(np.array([5], np.int32))
    ff = ctx.from_numpy(np.array([1.0, 2.0, 4.0, 0.5], np.float32))
    fs, ef, af, n_ctx, base = 0.5, 0.8, 1.2, 64, 10.0
    y = full(run(pc.rope_ext(a, pos, ff, n_dims=8, mode=RopeMode.NORMAL, n_ctx_orig=n_ctx, freq_base=base,
                             freq_scale=fs, ext_factor=ef, attn_factor=af, beta_fast=4.0, beta_slow=1.0)))[0, 0, 0]

    def corr(r):  # the dimension at which a wavelength makes r rotations over n_ctx tokens
        return 8 * math.log(n_ctx / (r * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(0, math.floor(corr(4.0))), min(7, math.ceil(corr(1.0)))
    mscale = af * (1 + 0.1 * math.log(1 / fs))
    expect = list(x[0, 0])
    for k, f in enumerate([1.0, 2.0, 4.0, 0.5]):
        extrap = 5 * base ** (-2 * k / 8) / f
        mix = (1 - min(1, max(0, (k - low) / max(0.001, high - low)))) * ef
        theta = fs * extrap * (1 - mix) + extrap * mix
        expect[2 * k], expect[2 * k + 1] = rotate(expect[2 * k], expect[2 * k + 1], theta, mscale)
    np.testing.assert_allclose(y, expect, rtol=1e-5)


@verifies("ROPE")
@pytest.mark.parametrize("mode,streams_of_pair", [
    # sections (1, 2, 1, 0) over 4 pairs: time, height, height, width
    (RopeMode.MROPE, [0, 1, 1, 2]),
    # interleaved: pair k takes stream k % 3 while that stream's share lasts
    (RopeMode.IMROPE, [0, 1, 2, 3]),
])
def test_multi_section_rope_picks_each_pairs_stream(mode, streams_of_pair):
    ctx = pc.Context()
    a, x = rope_input(ctx, hd=8, heads=1, tokens=2)
    streams = np.array([[3, 4], [10, 20], [7, 9], [2, 6]])  # time, height, width, extra per token
    pos = ctx.from_numpy(streams.reshape(-1).astype(np.int32))
    sections = (1, 2, 1, 0) if mode == RopeMode.MROPE else (1, 1, 1, 1)
    y = full(run(pc.rope_multi(a, pos, None, 8, sections, mode)))[0, :, 0]
    for t in range(2):
        expect = list(x[t, 0])
        for k, s in enumerate(streams_of_pair):
            theta = streams[s, t] * 10000.0 ** (-2 * k / 8)
            expect[k], expect[k + 4] = rotate(x[t, 0, k], x[t, 0, k + 4], theta)
        np.testing.assert_allclose(y[t], expect, rtol=1e-5, atol=1e-6)


@verifies("ROPE")
def test_vision_rope_restarts_frequencies_per_section():
    ctx = pc.Context()
    a, x = rope_input(ctx, hd=8, heads=1, tokens=1)
    streams = [3, 5, 0, 0]
    pos = ctx.from_numpy(np.array(streams, np.int32))
    y = full(run(pc.rope_multi(a, pos, None, 4, (2, 2, 0, 0), RopeMode.VISION)))[0, 0, 0]
    expect = list(x[0, 0])
    for k in range(4):  # pairs (k, k + 4); sections of 2 pairs, each from exponent 0 again
        stream, local = (0, k) if k < 2 else (1, k - 2)
        theta = streams[stream] * 10000.0 ** (-2 * local / 4)
        expect[k], expect[k + 4] = rotate(x[0, 0, k], x[0, 0, k + 4], theta)
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-6)


@verifies("ROPE", "ROPE_BACK")
def test_rope_back_is_the_transposed_rotation_and_f16_rounds():
    ctx = pc.Context()
    a, x = rope_input(ctx, hd=16, heads=2, tokens=4)
    pos = ctx.from_numpy(np.array([0, 2, 9, 30], np.int32))
    kw = dict(n_dims=12, mode=RopeMode.NEOX, freq_scale=0.7, ext_factor=0.3, attn_factor=1.0, n_ctx_orig=128)
    y = pc.rope_ext(a, pos, **kw)
    back = run(pc.rope_ext_back(y, pos, **kw))
    mscale = 1 + 0.1 * math.log(1 / 0.7)  # YaRN's magnitude factor: the transpose undoes the angle, not it
    expect = x.copy()
    expect[..., :12] *= mscale**2  # the rotated dims; dims 12..15 are copied unscaled
    np.testing.assert_allclose(back.numpy(), expect, atol=1e-5)
    h = ctx.from_numpy(x.astype(np.float16), F16)
    yh = run(pc.rope_ext(h, pos, **kw))
    assert yh.type == F16
    np.testing.assert_allclose(yh.numpy(), run(y).numpy().astype(np.float16).astype(np.float32), atol=2e-3)


@verifies("ROPE")
def test_rope_n_offs_rotates_a_slice():
    ctx = pc.Context()
    a, x = rope_input(ctx, hd=8, heads=1, tokens=1)
    pos = ctx.from_numpy(np.array([4], np.int32))
    y = full(run(pc.rope_ext(a, pos, n_dims=4, mode=RopeMode.NORMAL, n_offs=2)))[0, 0, 0]
    expect = list(x[0, 0])
    for k in range(2):
        i = 2 + 2 * k
        expect[i], expect[i + 1] = rotate(x[0, 0, i], x[0, 0, i + 1], 4 * 10000.0 ** (-2 * k / 4))
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ attention
def attention_loop(q, k, v, mask, scale, softcap=0.0, slopes=None, sinks=None):
    """q (H, n_q, D), k (Hk, n_kv, D), v (Hv, n_kv, Dv), mask (n_q, n_kv) -> (n_q, H, Dv)."""
    n_head, n_q = q.shape[:2]
    out = np.zeros((n_q, n_head, v.shape[2]))
    for h in range(n_head):
        kh, vh = k[h // (n_head // k.shape[0])], v[h // (n_head // v.shape[0])]
        for i in range(n_q):
            s = np.array([float(q[h, i] @ kh[j]) * scale for j in range(kh.shape[0])])
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if mask is not None:
                s = s + (1.0 if slopes is None else slopes[h]) * mask[i]
            top = max(s.max(), sinks[h]) if sinks is not None else s.max()
            w = np.exp(s - top)
            den = w.sum() + (math.exp(sinks[h] - top) if sinks is not None else 0.0)
            out[i, h] = (w / den) @ vh
    return out


@verifies("FLASH_ATTN_EXT")
@pytest.mark.parametrize("gqa,softcap,max_bias,kv_type", [(1, 0.0, 0.0, F32), (2, 0.0, 0.0, F16),
                                                          (4, 5.0, 0.0, F32), (2, 0.0, 8.0, F16)])
def test_flash_attention_matches_loop_and_unfused_path(gqa, softcap, max_bias, kv_type):
    rng = np.random.default_rng(1)
    n_head, n_q, n_kv, d = 4, 5, 6, 8
    q = rng.uniform(-1, 1, (n_head, n_q, d)).astype(np.float32)
    k = rng.uniform(-1, 1, (n_head // gqa, n_kv, d)).astype(np.float16).astype(np.float32)
    v = rng.uniform(-1, 1, (n_head // gqa, n_kv, d)).astype(np.float16).astype(np.float32)
    mask = np.where(np.arange(n_kv)[None, :] > np.arange(n_q)[:, None] + 1, -np.inf, 0.0)  # causal, n_past 1
    mask[:, 0] = -0.5
    ctx = pc.Context()
    tq, tk, tv = ctx.from_numpy(q), ctx.from_numpy(k, kv_type), ctx.from_numpy(v, kv_type)
    tm = ctx.from_numpy(mask.astype(np.float16), F16)
    fused = run(pc.flash_attn_ext(tq, tk, tv, tm, scale=0.3, max_bias=max_bias, logit_softcap=softcap))
    assert fused.ne == (d, n_head, n_q, 1)
    slopes = None
    if max_bias:  # 4 heads: m0 = 2^(-max_bias/4), slope_h = m0^(h+1)
        slopes = [(2.0 ** (-max_bias / 4)) ** (h + 1) for h in range(4)]
    expect = attention_loop(q, k, v, mask, 0.3, softcap, slopes)
    np.testing.assert_allclose(fused.numpy(), expect, rtol=1e-4, atol=1e-5)
    if softcap == 0.0:  # the unfused path, from ordinary ops: softmax(k^T q * scale + mask) then v
        kq = pc.mul_mat(tk if kv_type == F32 else pc.cast(tk, F32), tq)       # [n_kv, n_q, H]
        probs = pc.soft_max_ext(kq, tm, scale=0.3, max_bias=max_bias)
        vt = pc.cont(pc.transpose(tv if kv_type == F32 else pc.cast(tv, F32)))  # [n_kv, d, Hv]
        unfused = run(pc.permute(pc.mul_mat(vt, probs), 0, 2, 1, 3))           # [d, H, n_q]
        np.testing.assert_allclose(unfused.numpy(), fused.numpy(), rtol=1e-4, atol=1e-5)


@verifies("FLASH_ATTN_EXT")
def test_flash_attention_sinks_and_fully_masked_rows():
    rng = np.random.default_rng(2)
    q, k, v = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 4)))
    mask = np.zeros((3, 5))
    mask[2] = -np.inf  # the last query sees nothing
    sinks = np.array([0.5, -1.0])
    ctx = pc.Context()
    out = run(pc.flash_attn_ext(ctx.from_numpy(q), ctx.from_numpy(k), ctx.from_numpy(v),
                                ctx.from_numpy(mask.astype(np.float16), F16), scale=1.0,
                                sinks=ctx.from_numpy(sinks.astype(np.float32)))).numpy()
    expect = attention_loop(q[:, :2], k, v, mask[:2], 1.0, sinks=sinks)
    np.testing.assert_allclose(out[:2], expect, rtol=1e-5, atol=1e-6)
    assert not out[2].any()  # nothing to attend to (besides the sink): zeros


# ------------------------------------------------------------------ experts and row scatter
@verifies("MUL_MAT_ID")
def test_mul_mat_id_routes_each_token_through_its_experts():
    rng = np.random.default_rng(3)
    experts = rng.uniform(-1, 1, (4, 3, 5)).astype(np.float32)       # 4 experts of [K=5 -> M=3]
    b = rng.uniform(-1, 1, (2, 1, 5)).astype(np.float32)              # 2 tokens, one shared input row
    ids = np.array([[2, 0], [3, 3]], np.int32)                         # token t uses experts ids[t]
    ctx = pc.Context()
    out = run(pc.mul_mat_id(ctx.from_numpy(experts), ctx.from_numpy(b), ctx.from_numpy(ids))).numpy()
    for t in range(2):
        for e in range(2):
            np.testing.assert_allclose(out[t, e], experts[ids[t, e]] @ b[t, 0], rtol=1e-6)


@verifies("SET_ROWS")
@pytest.mark.parametrize("index_type", [np.int32, np.int64])
def test_set_rows_writes_rows_into_the_destination(index_type):
    ctx = pc.Context()
    dst = ctx.from_numpy(np.zeros((2, 4, 3), np.float32))       # 2 matrices of 4 rows of 3
    rows = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(2, 2, 3) + 0.25)
    idx = ctx.from_numpy(np.array([[3, 0]], index_type))         # broadcast over both matrices
    out = run(pc.set_rows(dst, rows, idx))
    assert out.view_src is dst
    expect = np.zeros((2, 4, 3))
    for j in range(2):
        expect[j, 3], expect[j, 0] = rows.numpy()[j, 0], rows.numpy()[j, 1]
    np.testing.assert_array_equal(dst.numpy(), expect)
    h = ctx.from_numpy(np.zeros((1, 2, 3), np.float16), F16)
    run(pc.set_rows(h, ctx.from_numpy(np.array([[[1 / 3, 2 / 3, 1.0]]], np.float32)),
                    ctx.from_numpy(np.array([1], index_type))))
    np.testing.assert_array_equal(h.numpy()[1], np.float16([1 / 3, 2 / 3, 1.0]))


def test_attention_ops_refuse_bad_shapes():
    ctx = pc.Context()
    q, k = ctx.new_tensor(F32, (8, 3, 4)), ctx.new_tensor(F32, (8, 5, 3))
    with pytest.raises(pc.ShapeMismatch, match="divide"):
        pc.flash_attn_ext(q, k, k)
    with pytest.raises(pc.ShapeMismatch, match="position"):
        pc.rope_ext(q, ctx.from_numpy(np.zeros(3, np.int32)))
    with pytest.raises(pc.InvalidArgument, match="n_dims"):
        pc.rope_ext(q, ctx.from_numpy(np.zeros(4, np.int32)), n_dims=5)
