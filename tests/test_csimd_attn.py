"""csimd's FLASH_ATTN_EXT, CONV_2D and CONV_TRANSPOSE_1D (csrc/csimd_attn.h) beyond the conformance
grid, on every ISA path this CPU runs: many key chunks and query blocks with ragged ends, fully
masked rows (with and without sinks), GQA with different K and V head counts, Dv != D, strided and
permuted views, masks broadcast over heads and batches; convolutions with padding wider than the
input, strides beyond the kernel, every accepted type. Expected values come from the NumPy reference
backend and, for attention, from a float64 softmax written out below."""

from __future__ import annotations

import os

import numpy as np
import pytest

import prism_core as pc
from prism_core import BF16, F16, F32
from prism_core.conformance.cases import leaf

ISAS = ("scalar", "avx2", "avx512", "avxvnni", "neon", "dotprod", "i8mm")  # CSIMD_ISA_* order


def _backend():
    info = next((i for i in pc.backends() if i.name == "csimd"), None)
    assert info is not None
    if not info.available:
        pytest.skip(f"csimd unavailable here: {info.reason}")
    return pc.backend("csimd")


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    """Run the test on one ISA path (the backend re-reads PRISM_CSIMD_ISA when asked for availability)."""
    be = _backend()
    from prism_csimd import kernels
    if not kernels._state["lib"].csimd_isa_runs(ISAS.index(request.param)):
        pytest.skip(f"this CPU cannot run the {request.param} path")
    monkeypatch.setenv("PRISM_CSIMD_ISA", request.param)
    monkeypatch.setenv("PRISM_CSIMD_SERIAL_WORK", "0")  # the threaded path even for small nodes
    assert be.availability()[0] and kernels._state["isa"] == request.param
    yield request.param
    monkeypatch.undo()
    be.availability()  # back to the path the environment asks for


def _both(build):
    """build(ctx, rng) -> node, computed on csimd (strict) and on the reference; (csimd, reference) values."""
    outs = []
    for name in ("csimd", "numpy"):
        ctx = pc.Context()
        node = build(ctx, np.random.default_rng(42))
        report = pc.compute(node, name, strict=name == "csimd")
        assert report.fallbacks == []
        outs.append(np.array(node.host(), dtype=np.float64))  # always 4-dim, NumPy order
    return outs


# ------------------------------------------------------------------ FLASH_ATTN_EXT
def _mask_values(rng, shape, kind):
    """F16-representable mask values (NumPy order (m3, m2, rows, n_kv)): causal, random with -inf holes,
    or random with some rows -inf throughout."""
    m3, m2, rows, n_kv = shape
    if kind == "causal":  # row i sees keys <= i: whole chunks of keys are masked for a block of rows
        tri = np.arange(n_kv)[None, :] > np.arange(rows)[:, None]
        vals = np.broadcast_to(np.where(tri, -np.inf, 0.0), shape).copy()
    else:
        vals = np.where(rng.uniform(size=shape) < 0.3, -np.inf, rng.uniform(-2, 0, shape))
        vals[..., 0] = 0.0
        if kind == "dead rows":
            vals[..., 1::4, :] = -np.inf  # every fourth query row sees nothing
    return vals.astype(np.float16)


ATTN_CASES = [
    # (D, Dv, n_q, n_kv, H, Hk, Hv, B, mask kind, mask m2/m3 broadcast, softcap, max_bias, sinks, kv type)
    (64, 64, 21, 150, 4, 2, 2, 1, "causal", (1, 1), 0.0, 0.0, False, F16),
    (80, 48, 13, 70, 6, 2, 3, 2, "random", (6, 2), 0.0, 0.0, False, F32),
    (40, 72, 9, 129, 4, 4, 1, 2, "dead rows", (1, 2), 0.0, 0.0, True, F16),
    (32, 32, 17, 64, 8, 1, 2, 1, "dead rows", (8, 1), 5.0, 4.0, False, BF16),
    (128, 128, 33, 200, 2, 1, 1, 1, "causal", (2, 1), 0.0, 8.0, True, F16),
    (16, 24, 5, 3, 3, 3, 1, 3, None, None, 2.0, 0.0, True, F32),
    (48, 48, 1, 300, 4, 2, 4, 1, "random", (1, 1), 0.0, 0.0, False, BF16),
    # decode-like: one block per K/V head, so the keys are split into segments and merged; a causal
    # row-0 sees key 0 only (the later segments see nothing of it), dead rows, ALiBi, softcap, sinks
    (64, 64, 1, 300, 4, 1, 1, 1, "causal", (1, 1), 0.0, 0.0, False, F16),
    (64, 48, 2, 777, 8, 1, 1, 1, "dead rows", (1, 1), 5.0, 4.0, True, F16),
    (32, 32, 1, 1000, 6, 2, 2, 1, "random", (6, 1), 0.0, 0.0, True, BF16),
]
SPLIT_CASE = ATTN_CASES[-2]


def _attn_ids(c):
    return f"D{c[0]}Dv{c[1]}-q{c[2]}kv{c[3]}-h{c[4]}/{c[5]}/{c[6]}-b{c[7]}-{c[8]}-sc{c[10]}-mb{c[11]}-s{int(c[12])}"


def _build_attn(case, permuted_q=True):
    D, Dv, nq, nkv, H, Hk, Hv, B, kind, mb2, softcap, max_bias, sinks, tkv = case

    def build(ctx, rng):
        q = leaf(ctx, rng, F32, (D, nq, H, B), layout="permuted" if permuted_q else "contiguous")
        k = leaf(ctx, rng, tkv, (D, nkv, Hk, B), layout="rowgap")
        v = leaf(ctx, rng, tkv, (Dv, nkv, Hv, B))
        m = None
        if kind is not None:
            m = ctx.from_numpy(_mask_values(rng, (mb2[1], mb2[0], nq + 3, nkv), kind), F16)
        s = ctx.from_numpy(rng.uniform(-1, 2, H).astype(np.float32)) if sinks else None
        return pc.flash_attn_ext(q, k, v, m, scale=D ** -0.5, max_bias=max_bias, logit_softcap=softcap, sinks=s)
    return build


@pytest.mark.parametrize("case", ATTN_CASES, ids=_attn_ids)
def test_flash_attn_matches_the_reference(case, isa):
    got, ref = _both(_build_attn(case))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


def test_flash_attn_fully_masked_rows_give_what_the_reference_gives(isa):
    """Rows whose mask is -inf throughout: 0, with sinks too (the sink alone has no value row)."""
    for sinks in (False, True):
        case = (32, 32, 12, 80, 2, 1, 1, 1, "dead rows", (1, 1), 0.0, 0.0, sinks, F16)
        got, ref = _both(_build_attn(case))
        dead = got[:, 1::4]  # NumPy order (B, n_q, H, Dv): rows 1, 5, 9
        assert (dead == 0).all() and (ref[:, 1::4] == 0).all()
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


def test_flash_attn_causal_matches_a_float64_softmax(isa):
    """An independent formulation: per head, softmax(scale q k^T + mask) v in float64."""
    rng = np.random.default_rng(5)
    D, T, H, Hk = 64, 70, 4, 2
    q = rng.standard_normal((H, T, D)).astype(np.float32)
    k = rng.standard_normal((Hk, T, D)).astype(np.float16)
    v = rng.standard_normal((Hk, T, D)).astype(np.float16)
    causal = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, 0.0)
    ctx = pc.Context()
    y = pc.flash_attn_ext(ctx.from_numpy(q), ctx.from_numpy(k, F16), ctx.from_numpy(v, F16),
                          ctx.from_numpy(causal.astype(np.float16), F16), scale=0.125)
    pc.compute(y, "csimd", strict=True)
    got = y.host()[0]  # NumPy order (T, H, D)
    for h in range(H):
        s = q[h].astype(np.float64) @ k[h // 2].astype(np.float64).T * 0.125 + causal
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v[h // 2].astype(np.float64)
        np.testing.assert_allclose(got[:, h], want, rtol=1e-5, atol=1e-5)


def test_flash_attn_thread_count_does_not_change_results(monkeypatch):
    be = _backend()
    outs = []
    for n in ("1", "2", "3"):
        monkeypatch.setenv("PRISM_NUM_THREADS", n)
        monkeypatch.setenv("PRISM_CSIMD_SERIAL_WORK", "0")
        be.availability()
        ctx = pc.Context()
        y = [_build_attn(c)(ctx, np.random.default_rng(1)) for c in (ATTN_CASES[2], SPLIT_CASE)]
        for t in y:
            pc.compute(t, be, strict=True)
        outs.append([t.numpy() for t in y])
    monkeypatch.undo()
    be.availability()
    for per_count in outs[1:]:  # rows split by block, and keys split into segments, the same at any count
        for a, b in zip(outs[0], per_count):
            np.testing.assert_array_equal(a, b)


def test_flash_attn_planned_graph_reads_sinks_and_mask_at_every_compute():
    """A plan prepares the call once; sinks and mask changed afterwards must still be what it uses."""
    be = _backend()
    rng = np.random.default_rng(9)
    D, nq, nkv, H = 32, 10, 70, 4
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((H, nq, D), (2, nkv, D), (2, nkv, D)))
    masks = [_mask_values(rng, (1, 1, nq, nkv), kind).astype(np.float32) for kind in ("random", "causal")]
    sinks = [rng.uniform(-1, 2, H).astype(np.float32), rng.uniform(3, 5, H).astype(np.float32)]

    def build(ctx, mask, sink):
        m = ctx.from_numpy(mask[0, 0], F16)
        base = ctx.from_numpy(np.stack([sink, np.full(H, np.nan, np.float32)], axis=1))  # ne [2, H]
        s = pc.view_2d(base, 1, H, base.nb[1], 0)  # a strided view: the sinks are column 0, ne [1, H]
        y = pc.flash_attn_ext(ctx.from_numpy(q), ctx.from_numpy(k, F16), ctx.from_numpy(v, F16), m, scale=0.2,
                              sinks=s)
        return y, m, s

    ctx = pc.Context()
    y, m, s = build(ctx, masks[0], sinks[0])
    step = pc.plan(y, be, strict=True)
    got = []
    for mask, sink in zip(masks, sinks):
        m.set(mask[0, 0])
        s.set(sink.reshape(H, 1))
        step.compute()
        got.append(np.array(y.host()))
    for (mask, sink), g in zip(zip(masks, sinks), got):
        ref, _, _ = build(pc.Context(), mask, sink)
        pc.compute(ref, "numpy")
        np.testing.assert_allclose(g, ref.host(), rtol=2e-5, atol=2e-6)
    assert not np.allclose(got[0], got[1])


# ------------------------------------------------------------------ CONV_2D
CONV_2D_CASES = [
    # (input ne [W, H, IC, N], kernel ne [KW, KH, IC, OC], s0, s1, p0, p1, d0, d1, kernel type, input type, layout)
    ((23, 9, 3, 2), (3, 3, 3, 5), 1, 1, 1, 1, 1, 1, F32, F32, "permuted"),
    ((5, 4, 2, 1), (3, 2, 2, 3), 3, 1, 4, 3, 2, 2, F16, F32, "contiguous"),  # padding wider than the input
    ((40, 7, 4, 1), (5, 3, 4, 7), 2, 3, 2, 1, 3, 1, BF16, F16, "rowgap"),
    ((17, 17, 6, 2), (1, 1, 6, 9), 4, 5, 0, 0, 1, 1, F32, F16, "contiguous"),
    ((70, 3, 1, 1), (7, 3, 1, 2), 1, 1, 3, 1, 1, 1, F16, F16, "permuted"),
]


@pytest.mark.parametrize("case", CONV_2D_CASES,
                         ids=lambda c: f"in{list(c[0])}-k{list(c[1])}-{c[-3].name}-{c[-2].name}-{c[-1]}")
def test_conv_2d_matches_the_reference(case, isa):
    ine, kne, s0, s1, p0, p1, d0, d1, tk, tb, layout = case

    def build(ctx, rng):
        return pc.conv_2d(leaf(ctx, rng, tk, kne), leaf(ctx, rng, tb, ine, layout=layout), s0, s1, p0, p1, d0, d1)
    got, ref = _both(build)
    if tb == F16:  # rounded to F16 from float32 sums here, from float64 sums in the reference
        np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ CONV_TRANSPOSE_1D
CONV_T_CASES = [  # (L, IC, K, OC, s0, kernel type, input type, layout)
    (37, 5, 4, 3, 1, F32, F32, "contiguous"), (37, 5, 4, 3, 3, F16, F32, "rowgap"),
    (20, 2, 3, 4, 7, BF16, F16, "contiguous"),  # s0 > K: positions no tap reaches are 0
    (9, 3, 5, 2, 5, F32, BF16, "permuted"), (200, 16, 9, 8, 2, F16, F16, "contiguous"),
]


@pytest.mark.parametrize("case", CONV_T_CASES,
                         ids=lambda c: f"L{c[0]}-ic{c[1]}-k{c[2]}-oc{c[3]}-s{c[4]}-{c[5].name}-{c[6].name}-{c[7]}")
def test_conv_transpose_1d_matches_the_reference(case, isa):
    L, IC, K, OC, s0, tk, tb, layout = case

    def build(ctx, rng):
        return pc.conv_transpose_1d(leaf(ctx, rng, tk, (K, OC, IC)), leaf(ctx, rng, tb, (L, IC), layout=layout), s0)
    got, ref = _both(build)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    if s0 > K:
        assert (got.reshape(OC, -1)[:, np.arange(got.shape[-1]) % s0 >= K] == 0).all()


# ------------------------------------------------------------------ defence in depth
def test_c_entry_points_refuse_inconsistent_descriptors():
    """Past the Python checks, the new C entry points refuse extents that do not fit together and
    write nothing."""
    _backend()
    from prism_csimd import kernels

    ffi, lib = kernels._state["ffi"], kernels._state["lib"]
    bufs = {n: np.zeros(4096, np.float32) for n in ("q", "k", "v", "d")}
    bufs["d"][:] = 7.0

    def t(name, ne, typ=0):
        d = ffi.new("csimd_tensor *")
        d.data = ffi.cast("char *", ffi.from_buffer(bufs[name]))
        d.ne = list(ne)
        d.nb = [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]]
        d.type = typ
        return d

    slopes = np.ones(4, np.float32)
    sl = ffi.from_buffer("float[]", slopes)
    nth = os.cpu_count() or 1
    fa = lib.csimd_flash_attn_ext
    assert fa(t("q", (8, 3, 4, 1)), t("k", (6, 5, 2, 1)), t("v", (8, 5, 2, 1)), ffi.NULL, ffi.NULL, sl, 1.0, 0.0,
              t("d", (8, 4, 3, 1)), nth) == -1  # head sizes of q and k differ
    assert fa(t("q", (8, 3, 4, 1)), t("k", (8, 5, 3, 1)), t("v", (8, 5, 2, 1)), ffi.NULL, ffi.NULL, sl, 1.0, 0.0,
              t("d", (8, 4, 3, 1)), nth) == -1  # 3 k heads do not divide 4
    assert fa(t("q", (8, 3, 4, 1)), t("k", (8, 5, 2, 1)), t("v", (8, 5, 2, 1)), t("v", (4, 3, 1, 1), 1), ffi.NULL,
              sl, 1.0, 0.0, t("d", (8, 4, 3, 1)), nth) == -1  # mask narrower than n_kv
    assert fa(t("q", (8, 3, 4, 1)), t("k", (8, 5, 2, 1)), t("v", (8, 5, 2, 1)), ffi.NULL, ffi.NULL, sl, 1.0, 0.0,
              t("d", (8, 3, 4, 1)), nth) == -1  # result not [Dv, H, n_q, B]
    assert lib.csimd_conv_2d(1, 1, 0, 0, 1, 1, t("k", (3, 3, 2, 4)), t("q", (8, 8, 3, 1)), t("d", (6, 6, 4, 1)),
                             nth) == -1  # channels differ
    assert lib.csimd_conv_2d(0, 1, 0, 0, 1, 1, t("k", (3, 3, 3, 4)), t("q", (8, 8, 3, 1)), t("d", (6, 6, 4, 1)),
                             nth) == -1  # stride 0
    assert lib.csimd_conv_transpose_1d(2, t("k", (3, 4, 2, 1)), t("q", (5, 2, 1, 1)), t("d", (12, 4, 1, 1)),
                                       nth) == -1  # (5-1)*2 + 3 = 11 positions, not 12
    assert (bufs["d"] == 7.0).all()
    assert fa(t("q", (8, 3, 4, 1)), t("k", (8, 5, 2, 1)), t("v", (8, 5, 2, 1)), ffi.NULL, ffi.NULL, sl, 1.0, 0.0,
              t("d", (8, 4, 3, 1)), nth) == 0  # consistent: all zeros in, the mean of zero rows out
    assert (bufs["d"][:96] == 0.0).all() and (bufs["d"][96:] == 7.0).all()


def test_flash_attn_gives_the_same_bits_whatever_ran_before_on_the_thread(isa):
    """Each thread's work rows are kept from one call to the next (csrc/csimd_scratch.h): a call after
    another of a wider head size (whose V rows held NaN where this call's rows have their padding), with
    keys beyond a chunk's last live group, gives the bits it gave before, and the reference's values."""
    narrow = (40, 40, 1, 300, 4, 1, 1, 1, "causal", (1, 1), 0.0, 0.0, False, F16)  # Dv 40: rows padded to 48
    first, ref = _both(_build_attn(narrow))
    np.testing.assert_allclose(first, ref, rtol=2e-5, atol=2e-6)

    def wide_nan(ctx, rng):
        q = leaf(ctx, rng, F32, (64, 1, 4, 1))
        k = leaf(ctx, rng, F16, (64, 300, 1, 1))
        v = ctx.from_numpy(np.full((1, 1, 300, 64), np.nan, np.float16), F16)
        return pc.flash_attn_ext(q, k, v, None, scale=0.125)
    ctx = pc.Context()
    pc.compute(wide_nan(ctx, np.random.default_rng(1)), "csimd", strict=True)
    again, _ = _both(_build_attn(narrow))
    assert np.isfinite(again).all()
    np.testing.assert_array_equal(again, first)
