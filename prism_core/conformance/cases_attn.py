"""Conformance cases (forward and gradient): RoPE, fused attention, expert routing, row scatter."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ..ops import build as B
from ..ops.codes import RopeMode
from ..ops.table import OpDef
from ..types import BF16, F16, F32, I32, I64
from .cases import Built, Case, family, leaf, tname
from .gradcheck import GradCase, grad_family, param

# (mode, head_dim, n_dims, sections) in the shape families ggml tests: llama, neox, partial
# rotation, multi-section (qwen2-vl), vision, interleaved
ROPE_SHAPES = [(RopeMode.NORMAL, 128, 128, None), (RopeMode.NORMAL, 64, 32, None), (RopeMode.NEOX, 64, 64, None),
               (RopeMode.NEOX, 80, 32, None), (RopeMode.MROPE, 128, 128, (16, 24, 24, 0)),
               (RopeMode.VISION, 80, 40, (10, 10, 10, 10)), (RopeMode.IMROPE, 128, 128, (24, 20, 20, 0))]


def _positions(c, r, mode, n_tok):
    streams = 4 if mode in (RopeMode.MROPE, RopeMode.VISION, RopeMode.IMROPE) else 1
    return c.from_numpy(r.integers(0, 2000, streams * n_tok).astype(np.int32))


@family("ROPE", "ROPE_BACK")
def rope_cases(d: OpDef) -> Iterator[Case]:
    back = d.key == "ROPE_BACK"
    build_fn = B.rope_ext_back if back else B.rope_ext
    grid = itertools.product(ROPE_SHAPES, (1.0, 1.4245), (0.0, 0.7465), (1.0, 1.4245))
    for (mode, hd, n_dims, sections), fs, ef, af in grid:
        if (fs, ef, af) not in [(1.0, 0.0, 1.0), (1.4245, 0.7465, 1.4245), (1.0, 0.7465, 1.0)] and mode != 0:
            continue
        for t in (F32, F16):
            def build(c, r, mode=mode, hd=hd, n_dims=n_dims, sections=sections, fs=fs, ef=ef, af=af, t=t):
                a = leaf(c, r, t, (hd, 4, 5, 1))
                kw = dict(n_dims=n_dims, mode=mode, n_ctx_orig=512, freq_base=10000.0, freq_scale=fs,
                          ext_factor=ef, attn_factor=af, beta_fast=32.0, beta_slow=1.0,
                          sections=sections or (0, 0, 0, 0))
                return Built(build_fn(a, _positions(c, r, mode, 5), None, **kw))
            yield Case(d.key, f"{mode.name},ne=[{hd},4,5],n_dims={n_dims},fs={fs},ef={ef},af={af},{tname(t)}", build)
    for mode in (RopeMode.NORMAL, RopeMode.NEOX):
        def build_ff(c, r, mode=mode):
            a = leaf(c, r, F32, (64, 3, 4, 2), layout="rowgap")
            ff = c.from_numpy(r.uniform(0.5, 2.0, 32).astype(np.float32))
            return Built(build_fn(a, _positions(c, r, mode, 4), ff, n_dims=64, mode=mode, n_ctx_orig=512))
        yield Case(d.key, f"{mode.name},freq_factors,rowgap view,ne=[64,3,4,2]", build_ff)
    if not back:
        yield Case(d.key, "NEOX,n_offs=8,inplace", lambda c, r: Built(B.rope_ext(
            leaf(c, r, F32, (48, 2, 3)), _positions(c, r, 2, 3), None, n_dims=32, mode=RopeMode.NEOX, n_offs=8,
            inplace=True)))


@family("FLASH_ATTN_EXT")
def flash_attn_cases(d: OpDef) -> Iterator[Case]:
    n_q, n_kv, h = 7, 32, 4
    grid = itertools.product((40, 64), (1, 4), (True, False), (0.0, 8.0), (0.0, 10.0), (F32, F16, BF16))
    for hs, gqa, use_mask, mb, sc, tkv in grid:
        if (mb and not use_mask) or (tkv == BF16 and (gqa, mb, sc) != (4, 0.0, 0.0)):
            continue
        if hs == 40 and (mb or sc):
            continue
        def build(c, r, hs=hs, gqa=gqa, use_mask=use_mask, mb=mb, sc=sc, tkv=tkv):
            q = leaf(c, r, F32, (hs, n_q, h, 1))
            k = leaf(c, r, tkv, (hs, n_kv, h // gqa, 1))
            v = leaf(c, r, tkv, (hs, n_kv, h // gqa, 1))
            m = None
            if use_mask:
                shape = (1, 1, n_q + 1, n_kv)
                vals = np.where(r.uniform(size=shape) < 0.2, -np.inf, r.uniform(-1, 0, shape))
                vals[..., 0] = 0.0  # every row keeps at least one position
                m = c.from_numpy(vals.astype(np.float16), F16)
            return Built(B.flash_attn_ext(q, k, v, m, scale=1 / np.sqrt(hs), max_bias=mb, logit_softcap=sc))
        yield Case(d.key, f"hs={hs},n_q={n_q},n_kv={n_kv},heads={h}/{h // gqa},mask={use_mask},max_bias={mb},"
                          f"softcap={sc},kv={tname(tkv)}", build)
    def long_causal(c, r):
        # keys beyond one block of a blocked kernel, and scores that grow along the keys so the
        # running maximum of an online softmax moves between blocks
        q = leaf(c, r, F32, (64, 9, 4, 1))
        ramp = np.linspace(0.0, 3.0, 300, dtype=np.float32)[:, None] * np.ones(64, np.float32)
        kv = r.standard_normal((2, 300, 64)).astype(np.float32) + ramp
        k, v = (c.from_numpy(kv[None].astype(np.float16), F16) for _ in range(2))
        causal = np.where(np.arange(300)[None, :] <= 290 + np.arange(10)[:, None], 0.0, -np.inf)
        m = c.from_numpy(causal.reshape(1, 1, 10, 300).astype(np.float16), F16)
        return Built(B.flash_attn_ext(q, k, v, m, scale=0.125))
    yield Case(d.key, "300 keys,causal,rising scores,kv=f16", long_causal)
    yield Case(d.key, "sinks,mask broadcast over 2 batches", lambda c, r: Built(B.flash_attn_ext(
        leaf(c, r, F32, (32, 5, 4, 2)), leaf(c, r, F16, (32, 9, 2, 2)), leaf(c, r, F16, (32, 9, 2, 2)),
        c.from_numpy(r.uniform(-1, 0, (1, 1, 5, 9)).astype(np.float16), F16), scale=0.2,
        sinks=leaf(c, r, F32, (4,)))))


@family("MUL_MAT_ID")
def mul_mat_id_cases(d: OpDef) -> Iterator[Case]:
    for n_exp, n_used, n_b, tw in [(4, 2, 1, F32), (8, 4, 4, F32), (4, 1, 1, F16), (8, 2, 2, BF16)]:
        def build(c, r, n_exp=n_exp, n_used=n_used, n_b=n_b, tw=tw):
            n_tok, k, m = 6, 64, 16
            w = leaf(c, r, tw, (k, m, n_exp))
            b = leaf(c, r, F32, (k, n_b, n_tok))
            ids = np.stack([r.permutation(n_exp)[:n_used] for _ in range(n_tok)]).astype(np.int32)
            return Built(B.mul_mat_id(w, b, c.from_numpy(ids)))
        yield Case(d.key, f"n_exp={n_exp},n_used={n_used},b.ne1={n_b},{tname(tw)}", build)


@family("SET_ROWS")
def set_rows_cases(d: OpDef) -> Iterator[Case]:
    for ta, tb, ti, bcast in [(F32, F32, I64, False), (F16, F32, I32, False), (BF16, F32, I64, True),
                              (F32, F16, I32, True)]:
        def build(c, r, ta=ta, tb=tb, ti=ti, bcast=bcast):
            a = leaf(c, r, ta, (16, 10, 2, 3))
            b = leaf(c, r, tb, (16, 4, 2, 3))
            c1 = 1 if bcast else 2
            idx = np.stack([r.permutation(10)[:4] for _ in range(3 * c1)]).reshape(3, c1, 4)
            return Built(B.set_rows(a, b, c.from_numpy(idx.astype(np.int64 if ti == I64 else np.int32))))
        yield Case(d.key, f"dst {tname(ta)}, rows {tname(tb)}, idx {tname(ti)}, broadcast={bcast}", build)


@grad_family("ROPE", "ROPE_BACK")
def rope_grad(d: OpDef) -> Iterator[GradCase]:
    fn = B.rope_ext_back if d.key == "ROPE_BACK" else B.rope_ext
    for mode, hd, n_dims in [(RopeMode.NORMAL, 8, 8), (RopeMode.NEOX, 8, 4)]:
        def build(c, r, mode=mode, hd=hd, n_dims=n_dims):
            a = param(c, r, (hd, 2, 3, 1))
            pos = c.from_numpy(np.array([0, 3, 11], np.int32))
            return fn(a, pos, None, n_dims=n_dims, mode=mode, freq_scale=0.8, ext_factor=0.5, n_ctx_orig=64), [a]
        yield GradCase(d.key, f"{mode.name},ne=[{hd},2,3],n_dims={n_dims}", build)


