"""Independent checks of the NumPy reference backend: gated linear units (GLU and its six
sub-ops), CONCAT, DIAG, PAD, PAD_REFLECT_1D, ARANGE, TIMESTEP_EMBEDDING, ARGSORT,
L2_NORM and GROUP_NORM, plus the shape/type/parameter errors of those ops and the
``ctx=`` path of :func:`prism_core.node` that ARANGE (an op without sources) needs.

Expectations are hand-worked numbers or explicit scalar loops written from ggml's
documented semantics (/work/shared/reference/ggml-semantics.md 1.5 and 2.3); nothing
here calls or mirrors ``backends/prism_numpy/kernels.py``. ggml order: ``ne[0]`` is
innermost, so a NumPy array of shape (ne3, ne2, ne1, ne0) holds element [i0, i1, i2, i3]
at ``arr[i3, i2, i1, i0]``. test_reference_ops.py collects ``VERIFIED`` from this file.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import full, refused, round_sig, run, verifier

import prism_core as pc
from prism_core import BF16, F16, F32, I32, BoundExceeded, InvalidArgument, ShapeMismatch, TypeMismatch

VERIFIED, verifies = verifier()  # op-table keys this module checks




def eighths(rng: np.random.Generator, shape, lo: int = -24, hi: int = 25) -> np.ndarray:
    """Multiples of 1/8: exact in f32, f16 and bf16."""
    return (rng.integers(lo, hi, size=shape) / 8).astype(np.float32)


# ---------------------------------------------------------------- GLU
def _sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


ACT = {  # act(x) of each sub-op, written from the formulas in ggml-semantics.md 2.3
    "REGLU": lambda x: x if x > 0 else 0.0,
    "GEGLU": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "SWIGLU": lambda x: x * _sig(x),
    "GEGLU_ERF": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "GEGLU_QUICK": lambda x: x * _sig(1.702 * x),
}


TABLED = ("GEGLU", "GEGLU_QUICK")  # ggml's CPU reads these activations from an F16 table (prism_core.ops.gelu_tables)


def act_ggml(key: str, x: float) -> float:
    """ACT as ggml's CPU computes it: the tabled activations at the F16 rounding of x, rounded to F16
    (GEGLU's tanh form clamped outside +-10). The table holds ggml's float32 evaluation, which can be one
    F16 ulp from this float64 one: tests of the tabled keys allow that ulp (the exact bits are checked
    against ggml's own kernels in test_gelu_tables.py)."""
    if key not in TABLED:
        return ACT[key](x)
    if key == "GEGLU" and abs(x) >= 10:
        return x if x > 0 else 0.0
    return float(np.float16(ACT[key](float(np.float16(x)))))


def act_rtol(key: str) -> float:
    return 2.0 ** -10 if key in TABLED else 1e-6


def oai(x: float, g: float, alpha: float, limit: float) -> float:
    xc = min(x, limit)
    gc = max(-limit, min(g, limit))
    return xc * _sig(alpha * xc) * (gc + 1)


def test_glu_enum_and_table_entries():
    # REGLU = 0 ... GEGLU_QUICK = 5 (SWIGLU_OAI inserted at 3 since 2025-08-05)
    assert [g.name for g in pc.GluOp] == ["REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK"]
    for g in pc.GluOp:
        d = pc.opdef(g.name)
        assert d.op == pc.Op.GLU == 100 and d.sub is g and d.key == g.name
        assert [(s.name, s.optional) for s in d.srcs] == [("a", False), ("b", True)]
        assert [p.name for p in d.params][:1] == ["swapped"]
    assert [p.name for p in pc.opdef("SWIGLU_OAI").params] == ["swapped", "alpha", "limit"]


@verifies("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")
@pytest.mark.parametrize("key", list(ACT))
@pytest.mark.parametrize("form", ["plain", "swapped", "split"])
def test_glu_loop(key, form):
    rng = np.random.default_rng(21)
    x_np = eighths(rng, (2, 3, 8))  # ne = [8, 3, 2]
    ctx = pc.Context()
    a = ctx.from_numpy(x_np)
    if form == "split":
        g_np = eighths(rng, (2, 3, 8))
        y = run(pc.glu_split(a, ctx.from_numpy(g_np), key))
        assert y.ne == (8, 3, 2, 1)
    else:
        y = run(pc.glu(a, key, swapped=form == "swapped"))
        assert y.ne == (4, 3, 2, 1)
    assert y.type == F32 and y.params["glu_op"] is pc.GluOp[key]
    got = full(y)
    for i2, i1 in itertools.product(range(2), range(3)):
        row = [float(v) for v in x_np[i2, i1]]
        if form == "split":
            xs, gs = row, [float(v) for v in g_np[i2, i1]]
        elif form == "plain":
            xs, gs = row[:4], row[4:]
        else:
            xs, gs = row[4:], row[:4]
        want = [act_ggml(key, x) * g for x, g in zip(xs, gs)]
        np.testing.assert_allclose(got[0, i2, i1], want, rtol=act_rtol(key), atol=1e-7, err_msg=f"{key} {form}")


@verifies("REGLU", "SWIGLU", "GEGLU_QUICK")
def test_glu_named_builders_hand_values():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[2, -1, 3, 5]], np.float32))  # halves [2, -1] and [3, 5]
    assert run(pc.reglu(a)).numpy().tolist() == [6, 0]  # relu([2, -1]) * [3, 5]
    assert run(pc.reglu_swapped(a)).numpy().tolist() == [6, -5]  # relu([3, 5]) * [2, -1]
    b = ctx.from_numpy(np.array([[0.5, 4, -2, 1]], np.float32))
    assert run(pc.reglu_split(a, b)).numpy().tolist() == [1, 0, -6, 5]
    # silu(0) = 0, silu(x) * 1 at x = 1: 1 / (1 + e^-1)
    s = run(pc.swiglu_split(ctx.from_numpy(np.array([0, 1], np.float32)), ctx.from_numpy(np.array([7, 1], np.float32))))
    assert s.numpy()[0] == 0 and s.numpy()[1] == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-7)
    q = run(pc.geglu_quick_swapped(ctx.from_numpy(np.array([3, 0], np.float32))))  # x = 0, g = 3
    assert q.numpy().tolist() == [0]
    for name in ("reglu", "geglu", "swiglu", "geglu_erf", "geglu_quick"):
        for suffix in ("", "_swapped", "_split"):
            assert getattr(pc, name + suffix).__doc__, name + suffix


@verifies("SWIGLU_OAI")
@pytest.mark.parametrize("alpha,limit", [(1.702, 7.0), (0.5, 2.0), (1.0, 0.5)])
def test_swiglu_oai_split_and_unsplit(alpha, limit):
    xs = [-9.0, -2.5, -0.75, 0.0, 0.5, 1.25, 3.0, 8.0]
    gs = [7.5, -9.0, 0.25, 1.0, -0.5, 2.0, -3.0, 0.125]
    ctx = pc.Context()
    y = run(pc.swiglu_oai(ctx.from_numpy(np.array(xs, np.float32)), ctx.from_numpy(np.array(gs, np.float32)),
                          alpha, limit))
    want = [oai(x, g, alpha, limit) for x, g in zip(xs, gs)]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-7)
    # unsplit: x then g in one row of 16
    u = run(pc.swiglu_oai(ctx.from_numpy(np.array(xs + gs, np.float32)), None, alpha, limit))
    np.testing.assert_allclose(u.numpy(), want, rtol=1e-6, atol=1e-7)
    sw = run(pc.glu(ctx.from_numpy(np.array(gs + xs, np.float32)), "swiglu_oai", swapped=True,
                    alpha=alpha, limit=limit))
    np.testing.assert_allclose(sw.numpy(), want, rtol=1e-6, atol=1e-7)


@verifies("SWIGLU_OAI")
def test_swiglu_oai_hand_value():
    # x = 9 clamps to limit 7, g = -9 clamps to -7: 7 * sigmoid(7) * (-6)
    ctx = pc.Context()
    y = run(pc.swiglu_oai(ctx.from_numpy(np.array([9], np.float32)), ctx.from_numpy(np.array([-9], np.float32)),
                          1.0, 7.0))
    assert y.numpy()[0] == pytest.approx(-42 / (1 + math.exp(-7)), rel=1e-7)
    assert y.params["alpha"] == 1.0 and y.params["limit"] == 7.0 and y.params["glu_op"] is pc.GluOp.SWIGLU_OAI


@verifies("REGLU", "GEGLU", "SWIGLU")
@pytest.mark.parametrize("t,bits", [(F16, 11), (BF16, 8)])
def test_glu_half_types_round_once(t, bits):
    xs, gs = [1.5, -0.25, 2.0, 0.75], [3.0, 0.5, -1.25, 1.0]
    ctx = pc.Context()
    a = ctx.from_numpy(np.array(xs + gs, np.float32), type=t)
    for key in ("REGLU", "GEGLU", "SWIGLU"):
        y = run(pc.glu(a, key))
        assert y.type == t
        assert y.numpy().tolist() == [round_sig(act_ggml(key, x) * g, bits) for x, g in zip(xs, gs)], key


@verifies("GEGLU", "SWIGLU_OAI")
def test_glu_reads_rows_with_a_gap():
    # a view of rows of 6 out of rows of 9 (contiguous_1): each row still splits in halves of 3
    rng = np.random.default_rng(4)
    big = eighths(rng, (2, 4, 9))
    ctx = pc.Context()
    base = ctx.from_numpy(big)
    v = pc.view_3d(base, 6, 4, 2, base.nb[1], base.nb[2])
    assert v.is_contiguous_n(1) and not v.is_contiguous()
    y = full(run(pc.geglu(v)))
    z = full(run(pc.swiglu_oai(v, v, 1.702, 0.5)))
    for i2, i1, i0 in itertools.product(range(2), range(4), range(3)):
        x, g = float(big[i2, i1, i0]), float(big[i2, i1, i0 + 3])
        assert y[0, i2, i1, i0] == pytest.approx(act_ggml("GEGLU", x) * g, rel=act_rtol("GEGLU"), abs=1e-7)
    for i2, i1, i0 in itertools.product(range(2), range(4), range(6)):
        x = float(big[i2, i1, i0])
        assert z[0, i2, i1, i0] == pytest.approx(oai(x, x, 1.702, 0.5), rel=1e-6, abs=1e-7)


def test_glu_errors():
    ctx = pc.Context()
    odd = ctx.from_numpy(np.zeros((2, 5), np.float32))
    a = ctx.from_numpy(np.zeros((2, 4), np.float32))
    a2 = ctx.from_numpy(np.zeros((4, 2), np.float32))
    h = ctx.from_numpy(np.zeros((2, 4), np.float32), type=F16)
    t = pc.transpose(a2)
    i = ctx.from_numpy(np.zeros((2, 4), np.int32))
    with refused(ShapeMismatch, "REGLU: a.ne\\[0\\]=5 must be even", ctx):
        pc.reglu(odd)
    with refused(InvalidArgument, "swapped applies to the unsplit form only", ctx):
        pc.node("SWIGLU", a, a, swapped=True)
    with refused(ShapeMismatch, "GEGLU: a has ne=\\[4, 2, 1, 1\\] but b has", ctx):
        pc.geglu_split(a, a2)
    with refused(TypeMismatch, "b has type f16 but a has f32", ctx):
        pc.swiglu_split(a, h)
    with refused(InvalidArgument, "a must be contiguous apart from its rows' stride", ctx):
        pc.swiglu(t)
    with refused(TypeMismatch, "source 'a' has type i32", ctx):
        pc.reglu(i)
    with refused(InvalidArgument, "unknown GLU op 'nope'", ctx):
        pc.glu(a, "nope")
    with refused(InvalidArgument, "parameter 'limit' must be >= 0.0", ctx):
        pc.swiglu_oai(a, a, 1.0, -1.0)
    with refused(InvalidArgument, "parameter 'alpha' must be finite", ctx):
        pc.swiglu_oai(a, a, math.nan, 1.0)
    with refused(InvalidArgument, "unknown parameter", ctx):
        pc.glu(a, "reglu", alpha=1.0)


# ---------------------------------------------------------------- CONCAT
@verifies("CONCAT")
def test_concat_hand():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2], [3, 4]], np.float32))  # ne = [2, 2]
    b = ctx.from_numpy(np.array([[5], [6]], np.float32))  # ne = [1, 2]
    y = run(pc.concat(a, b, 0))
    assert y.ne == (3, 2, 1, 1) and y.numpy().tolist() == [[1, 2, 5], [3, 4, 6]]
    c = ctx.from_numpy(np.array([[7, 8]], np.float32))  # ne = [2, 1]
    y1 = run(pc.concat(a, c, 1))
    assert y1.ne == (2, 3, 1, 1) and y1.numpy().tolist() == [[1, 2], [3, 4], [7, 8]]
    y2 = run(pc.concat(a, a, 2))
    assert y2.ne == (2, 2, 2, 1) and y2.params["dim"] == 2


@verifies("CONCAT")
@pytest.mark.parametrize("dim", range(4))
@pytest.mark.parametrize("t", [F32, F16, BF16, I32])
def test_concat_loop_every_dim(dim, t):
    rng = np.random.default_rng(dim)
    a_ne = [3, 2, 4, 2]
    b_ne = list(a_ne)
    b_ne[dim] = 3
    a_np = rng.integers(-50, 50, size=tuple(reversed(a_ne)))
    b_np = rng.integers(-50, 50, size=tuple(reversed(b_ne)))
    ctx = pc.Context()
    cast = np.int32 if t == I32 else np.float32
    a, b = ctx.from_numpy(a_np.astype(cast), type=t), ctx.from_numpy(b_np.astype(cast), type=t)
    y = run(pc.concat(a, b, dim))
    want_ne = list(a_ne)
    want_ne[dim] += 3
    assert y.type == t and list(y.ne) == want_ne
    got = full(y)
    for i0, i1, i2, i3 in itertools.product(*(range(n) for n in want_ne)):
        idx = [i0, i1, i2, i3]
        if idx[dim] < a_ne[dim]:
            want = a_np[idx[3], idx[2], idx[1], idx[0]]
        else:
            idx[dim] -= a_ne[dim]
            want = b_np[idx[3], idx[2], idx[1], idx[0]]
        assert got[i3, i2, i1, i0] == want


@verifies("CONCAT", "TRANSPOSE")
def test_concat_strided_inputs():
    ctx = pc.Context()
    a = pc.transpose(ctx.from_numpy(np.array([[1, 2, 3], [4, 5, 6]], np.float32)))  # logical [[1,4],[2,5],[3,6]]
    base = ctx.from_numpy(np.array([[7, 70, -1], [8, 80, -1], [9, 90, -1]], np.float32))
    b = pc.view_2d(base, 2, 3, base.nb[1])  # rows [7, 70], [8, 80], [9, 90]
    y = run(pc.concat(a, b, 0))
    assert y.numpy().tolist() == [[1, 4, 7, 70], [2, 5, 8, 80], [3, 6, 9, 90]]


def test_concat_errors():
    ctx = pc.Context()
    a = ctx.from_numpy(np.zeros((2, 3), np.float32))
    i = ctx.from_numpy(np.zeros((2, 3), np.int32))
    b = ctx.from_numpy(np.zeros((3, 3), np.float32))
    with refused(TypeMismatch, "CONCAT: a has type f32 but b has i32", ctx):
        pc.concat(a, i, 0)
    with refused(ShapeMismatch, "differ in dim 1; only the concatenated dim 0 may differ", ctx):
        pc.concat(a, b, 0)
    with refused(InvalidArgument, "parameter 'dim' must be <= 3", ctx):
        pc.concat(a, a, 4)
    with refused(InvalidArgument, "parameter 'dim' must be >= 0", ctx):
        pc.concat(a, a, -1)


# ---------------------------------------------------------------- DIAG
@verifies("DIAG")
def test_diag_hand_and_loop():
    ctx = pc.Context()
    y = run(pc.diag(ctx.from_numpy(np.array([2, -1, 0.5], np.float32))))
    assert y.ne == (3, 3, 1, 1) and y.numpy().tolist() == [[2, 0, 0], [0, -1, 0], [0, 0, 0.5]]
    rng = np.random.default_rng(2)
    v = eighths(rng, (2, 3, 1, 4))  # ne = [4, 1, 3, 2]
    inf = v.copy()
    inf[0, 0, 0, 0] = np.inf  # off-diagonal zeros stay 0, not inf * 0
    got = full(run(pc.diag(ctx.from_numpy(inf))))
    for i3, i2, i1, i0 in itertools.product(range(2), range(3), range(4), range(4)):
        assert got[i3, i2, i1, i0] == (inf[i3, i2, 0, i0] if i0 == i1 else 0.0)


def test_diag_errors():
    ctx = pc.Context()
    m = ctx.from_numpy(np.zeros((2, 3), np.float32))
    h = ctx.from_numpy(np.zeros(3, np.float32), type=F16)
    with refused(ShapeMismatch, "DIAG: a must have ne\\[1\\] == 1", ctx):
        pc.diag(m)
    with refused(TypeMismatch, "DIAG: source 'a' has type f16", ctx):
        pc.diag(h)


# ---------------------------------------------------------------- PAD
@verifies("PAD")
def test_pad_hand():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2], [3, 4]], np.float32))
    y = run(pc.pad(a, 1, 1))  # zeros appended after dims 0 and 1
    assert y.ne == (3, 3, 1, 1) and y.numpy().tolist() == [[1, 2, 0], [3, 4, 0], [0, 0, 0]]
    e = run(pc.pad_ext(a, 1, 0, 0, 2))
    assert e.numpy().tolist() == [[0, 1, 2], [0, 3, 4], [0, 0, 0], [0, 0, 0]]
    r = ctx.from_numpy(np.array([1, 2, 3], np.float32))
    c = run(pc.pad_ext_circular(r, 2, 4))  # out[i] = a[(i - 2) mod 3]
    assert c.numpy().tolist() == [2, 3, 1, 2, 3, 1, 2, 3, 1]
    assert run(pc.pad_circular(r, 2)).numpy().tolist() == [1, 2, 3, 1, 2]
    assert c.params["circular"] is True and c.params["lp0"] == 2 and c.params["rp0"] == 4


@verifies("PAD", "PERMUTE")
@pytest.mark.parametrize("circular", [False, True])
def test_pad_loop_all_dims(circular):
    rng = np.random.default_rng(8)
    x = eighths(rng, (2, 3, 2, 4))  # ne = [4, 2, 3, 2]
    ctx = pc.Context()
    base = ctx.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 2, 3)))  # ne = [4, 2, 2, 3]
    a = pc.permute(base, 0, 1, 3, 2)  # swaps dims 2 and 3: logical ne = [4, 2, 3, 2], values x
    assert not a.is_contiguous()
    lp, rp = [2, 0, 1, 3], [1, 3, 0, 1]
    y = run(pc.pad_ext(a, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3], circular=circular))
    ne = [4, 2, 3, 2]
    out_ne = [ne[i] + lp[i] + rp[i] for i in range(4)]
    assert list(y.ne) == out_ne
    got = full(y)
    for i0, i1, i2, i3 in itertools.product(*(range(n) for n in out_ne)):
        src = [i - p for i, p in zip((i0, i1, i2, i3), lp)]
        if circular:
            src = [s % n for s, n in zip(src, ne)]
            want = x[src[3], src[2], src[1], src[0]]
        elif all(0 <= s < n for s, n in zip(src, ne)):
            want = x[src[3], src[2], src[1], src[0]]
        else:
            want = 0.0
        assert got[i3, i2, i1, i0] == want, (i0, i1, i2, i3)


def test_pad_errors():
    ctx = pc.Context()
    a = ctx.from_numpy(np.zeros((2, 3), np.float32))
    with refused(InvalidArgument, "PAD: parameter 'rp1' must be >= 0", ctx):
        pc.pad(a, 0, -1)
    with refused(InvalidArgument, "parameter 'circular' must be a bool", ctx):
        pc.pad_ext(a, 1, 1, circular=1)
    empty = ctx.new_tensor(F32, (0, 2))
    i = ctx.from_numpy(np.zeros(3, np.int32))
    with refused(ShapeMismatch, "circular padding of dim 0 needs a non-empty source", ctx):
        pc.pad_circular(empty, 2)
    with refused(TypeMismatch, "PAD: source 'a' has type i32", ctx):
        pc.pad(i, 1)
    z = run(pc.pad(empty, 2))  # zero padding of an empty dim is fine
    assert z.ne == (2, 2, 1, 1) and z.numpy().tolist() == [[0, 0], [0, 0]]


# ---------------------------------------------------------------- PAD_REFLECT_1D
@verifies("PAD_REFLECT_1D")
def test_pad_reflect_1d_hand_and_loop():
    ctx = pc.Context()
    y = run(pc.pad_reflect_1d(ctx.from_numpy(np.array([1, 2, 3, 4], np.float32)), 2, 3))
    assert y.numpy().tolist() == [3, 2, 1, 2, 3, 4, 3, 2, 1]  # edges 1 and 4 not repeated
    rng = np.random.default_rng(6)
    x = eighths(rng, (2, 3, 7))
    for p0, p1 in [(0, 0), (6, 6), (3, 1), (0, 5)]:
        got = full(run(pc.pad_reflect_1d(ctx.from_numpy(x), p0, p1)))
        assert got.shape == (1, 2, 3, 7 + p0 + p1)
        for i2, i1, j in itertools.product(range(2), range(3), range(7 + p0 + p1)):
            i = j - p0
            src = -i if i < 0 else (2 * 6 - i if i > 6 else i)
            assert got[0, i2, i1, j] == x[i2, i1, src]


def test_pad_reflect_1d_errors():
    ctx = pc.Context()
    a = ctx.from_numpy(np.zeros((2, 3), np.float32))
    with refused(InvalidArgument, "p0=3 must be less than a.ne\\[0\\]=3", ctx):
        pc.pad_reflect_1d(a, 3, 0)
    with refused(InvalidArgument, "p1=5 must be less than", ctx):
        pc.pad_reflect_1d(a, 0, 5)
    t = pc.transpose(a)
    with refused(InvalidArgument, "PAD_REFLECT_1D: a must be contiguous", ctx):
        pc.pad_reflect_1d(t, 1, 1)
    with refused(InvalidArgument, "parameter 'p0' must be >= 0", ctx):
        pc.pad_reflect_1d(a, -1, 0)


# ---------------------------------------------------------------- ARANGE
@verifies("ARANGE")
def test_arange_hand():
    ctx = pc.Context()
    y = run(pc.arange(ctx, -1.0, 1.0, 0.5))
    assert y.type == F32 and y.ne == (4, 1, 1, 1) and y.src == ()
    assert y.numpy().tolist() == [-1, -0.5, 0, 0.5]
    assert run(pc.arange(ctx, 0, 5)).numpy().tolist() == [0, 1, 2, 3, 4]  # step 1 by default
    assert run(pc.arange(ctx, 2.0, 2.5, 5.0)).numpy().tolist() == [2]
    assert run(pc.arange(ctx, 0.0, 1.0, 0.3)).numpy().tolist() == pytest.approx([0, 0.3, 0.6, 0.9], rel=1e-7)
    g = pc.Graph().expand(y)
    assert g.nodes == [y] and g.leafs == []  # a node with no sources, not a leaf


@verifies("ARANGE")
def test_arange_counts_in_float32_like_ggml():
    ctx = pc.Context()
    # (1.1 - 0) / 0.1 is 11.000000000000002 in double (NumPy's arange gives 12 values) but
    # f32(1.1) / f32(0.1) rounds to exactly 11.0 in float32, and ggml's ceilf gives 11
    y = run(pc.arange(ctx, 0.0, 1.1, 0.1))
    assert y.ne[0] == 11
    for i, v in enumerate(y.numpy().tolist()):  # ggml's float32 expression start + step * i, step = f32(0.1)
        assert v == float(np.float32(0.0) + np.float32(0.1) * np.float32(i))
    assert pc.arange(ctx, 0.0, 1.0, 0.1).ne[0] == 10


def test_arange_errors_and_ctx_argument():
    ctx = pc.Context()
    with refused(InvalidArgument, "ARANGE: step must be non-zero", ctx):
        pc.arange(ctx, 0.0, 1.0, 0.0)
    with refused(InvalidArgument, "stop=0.0 must be greater than start=1.0", ctx):
        pc.arange(ctx, 1.0, 0.0, -1.0)
    with refused(InvalidArgument, "step=-1.0 is negative", ctx):
        pc.arange(ctx, 0.0, 1.0, -1.0)
    with refused(InvalidArgument, "parameter 'stop' must be finite", ctx):
        pc.arange(ctx, 0.0, math.inf, 1.0)
    with refused(InvalidArgument, "stop=100000000.0 must be greater than start=100000000.0 in float32", ctx):
        pc.arange(ctx, 1e8, 1e8 + 1, 1.0)  # f32(1e8 + 1) == 1e8: params are kept in float32, as ggml's
    with refused(BoundExceeded, "over the bound 2\\*\\*62", ctx):
        pc.arange(ctx, 0.0, 1.0, 1e-30)
    with refused(BoundExceeded, "context memory budget exceeded", ctx):
        pc.arange(ctx, 0.0, 1e9, 1.0)  # 4 GB does not fit the default 1 GiB context
    with pytest.raises(InvalidArgument, match="ctx must be a Context"):
        pc.arange(np.zeros(3), 0.0, 1.0)
    # node(): an op without sources needs ctx=, and ctx= must agree with the sources' context
    with refused(InvalidArgument, "ARANGE: has no source tensors; pass the context as ctx=", ctx):
        pc.node("ARANGE", start=0.0, stop=1.0)
    with refused(InvalidArgument, "ADD: needs at least one source tensor", ctx):
        pc.node("ADD")
    a = ctx.from_numpy(np.ones(2, np.float32))
    other = pc.Context()
    with refused(InvalidArgument, "ADD: source 'a' belongs to another context", ctx):
        pc.node("ADD", a, a, ctx=other)
    with refused(InvalidArgument, "ADD: ctx must be a Context", ctx):
        pc.node("ADD", a, a, ctx="ctx")
    y = pc.node("ADD", a, a, ctx=ctx)  # the same context: accepted
    assert run(y).numpy().tolist() == [2, 2]
    z = pc.node("ARANGE", ctx=other, start=0.0, stop=3.0)
    assert z.ctx is other and z in other.tensors and run(z).numpy().tolist() == [0, 1, 2]


# ---------------------------------------------------------------- TIMESTEP_EMBEDDING
def embed_row(t: float, dim: int, max_period: int) -> list[float]:
    half = dim // 2
    row = [0.0] * dim
    for j in range(half):
        f = math.exp(-math.log(max_period) * j / half)
        row[j] = math.cos(t * f)
        row[j + half] = math.sin(t * f)
    return row


@verifies("TIMESTEP_EMBEDDING")
@pytest.mark.parametrize("dim,max_period", [(8, 10000), (7, 100), (1, 10), (2, 5), (320, 10000)])
def test_timestep_embedding_loop(dim, max_period):
    ts = [0.0, 1.0, 2.5, 37.0, 999.0]
    ctx = pc.Context()
    y = run(pc.timestep_embedding(ctx.from_numpy(np.array(ts, np.float32)), dim, max_period))
    assert y.type == F32 and y.ne == (dim, len(ts), 1, 1)
    got = full(y)[0, 0]
    for n, t in enumerate(ts):
        np.testing.assert_allclose(got[n], embed_row(t, dim, max_period), rtol=1e-6, atol=2e-7)
    if dim % 2:
        assert all(got[:, dim - 1] == 0)  # odd dim: the last column is 0 (HEAD semantics)


@verifies("TIMESTEP_EMBEDDING")
def test_timestep_embedding_hand():
    ctx = pc.Context()
    # dim 4, half 2: f = [1, max_period^(-1/2)] = [1, 0.01] for max_period 10000
    y = run(pc.timestep_embedding(ctx.from_numpy(np.array([0, 100], np.float32)), 5))
    want0 = [1, 1, 0, 0, 0]
    want1 = [math.cos(100), math.cos(1), math.sin(100), math.sin(1), 0]
    np.testing.assert_allclose(y.numpy(), [want0, want1], rtol=1e-6, atol=1e-7)
    assert y.params["max_period"] == 10000


def test_timestep_embedding_errors():
    ctx = pc.Context()
    t = ctx.from_numpy(np.zeros(3, np.float32))
    m = ctx.from_numpy(np.zeros((2, 3), np.float32))
    h = ctx.from_numpy(np.zeros(3, np.float32), type=F16)
    with refused(ShapeMismatch, "timesteps must be a vector", ctx):
        pc.timestep_embedding(m, 4)
    with refused(InvalidArgument, "parameter 'dim' must be >= 1", ctx):
        pc.timestep_embedding(t, 0)
    with refused(InvalidArgument, "parameter 'max_period' must be >= 1", ctx):
        pc.timestep_embedding(t, 4, 0)
    gapped = pc.permute(pc.view_2d(ctx.from_numpy(np.arange(6, dtype=np.float32)), 1, 3, 8), 1, 0, 2, 3)
    assert gapped.ne == (3, 1, 1, 1) and gapped.nb[0] == 8  # every other element of the base
    with refused(InvalidArgument, "timesteps must be contiguous", ctx):
        pc.timestep_embedding(gapped, 4)
    with refused(TypeMismatch, "source 'timesteps' has type f16", ctx):
        pc.timestep_embedding(h, 4)


# ---------------------------------------------------------------- ARGSORT
@verifies("ARGSORT")
def test_argsort_hand_and_ties_are_stable():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[3, 1, 2, 1], [0.5, -1, 7, 0.5]], np.float32))
    asc = run(pc.argsort(a))
    assert asc.type == I32 and asc.ne == a.ne
    # ties keep their index order in the reference (ggml leaves it unspecified)
    assert asc.numpy().tolist() == [[1, 3, 2, 0], [1, 0, 3, 2]]
    desc = run(pc.argsort(a, "desc"))
    assert desc.numpy().tolist() == [[0, 2, 1, 3], [2, 0, 3, 1]]
    assert desc.params["order"] is pc.SortOrder.DESC and int(pc.SortOrder.DESC) == 1


@verifies("ARGSORT")
@pytest.mark.parametrize("order", list(pc.SortOrder))
def test_argsort_loop_distinct_values(order):
    rng = np.random.default_rng(13)
    x = (np.stack([rng.permutation(9) for _ in range(12)]).reshape(2, 3, 2, 9) - 4.0).astype(np.float32) / 2
    ctx = pc.Context()
    base = ctx.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 2, 3)))  # ne = [9, 2, 2, 3]
    a = pc.permute(base, 0, 1, 3, 2)  # logical values x, not contiguous
    got = full(run(pc.argsort(a, order)))
    for i3, i2, i1 in itertools.product(range(2), range(3), range(2)):
        row = [float(v) for v in x[i3, i2, i1]]
        want = sorted(range(9), key=lambda j: row[j], reverse=order == pc.SortOrder.DESC)
        assert got[i3, i2, i1].tolist() == want


@verifies("ARGSORT", "VIEW")
def test_argsort_top_k():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[3, 9, -1, 4, 7], [0, 1, 2, 3, 4]], np.float32))
    y = run(pc.argsort_top_k(a, 2))
    assert y.type == I32 and y.ne == (2, 2, 1, 1) and y.op == pc.Op.VIEW
    assert y.src[0].opdef.key == "ARGSORT" and y.src[0].params["order"] is pc.SortOrder.DESC
    assert y.numpy().tolist() == [[1, 4], [4, 3]]
    assert run(pc.argsort_top_k(a, 5)).numpy().tolist() == [[1, 4, 3, 0, 2], [4, 3, 2, 1, 0]]


def test_argsort_errors():
    ctx = pc.Context()
    a = ctx.from_numpy(np.zeros((2, 3), np.float32))
    h = ctx.from_numpy(np.zeros(3, np.float32), type=F16)
    with refused(InvalidArgument, "argsort_top_k: k=4 must be in \\[1, a.ne\\[0\\]=3\\]", ctx):
        pc.argsort_top_k(a, 4)
    with refused(InvalidArgument, "k=0 must be in", ctx):
        pc.argsort_top_k(a, 0)
    with refused(InvalidArgument, "k must be an int", ctx):
        pc.argsort_top_k(a, 1.0)
    with refused(InvalidArgument, "unknown sort order 'up'", ctx):
        pc.argsort(a, "up")
    with refused(InvalidArgument, "parameter 'order' must be one of \\['ASC', 'DESC'\\]", ctx):
        pc.argsort(a, 2)
    with refused(TypeMismatch, "ARGSORT: source 'a' has type f16", ctx):
        pc.argsort_top_k(h, 1)


# ---------------------------------------------------------------- L2_NORM
@verifies("L2_NORM")
def test_l2_norm_hand():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[3, 4], [0.3, -0.4], [0, 0]], np.float32))
    y = run(pc.l2_norm(a, eps=1.0))  # norms 5, 0.5, 0 -> divide by 5, 1, 1
    np.testing.assert_allclose(y.numpy(), [[0.6, 0.8], [0.3, -0.4], [0, 0]], rtol=1e-7)
    z = run(pc.l2_norm(a))  # eps 0: a zero row is 0 / 0 = NaN, as in ggml (1/fmaxf(0, 0) = inf)
    np.testing.assert_allclose(z.numpy()[:2], [[0.6, 0.8], [0.6, -0.8]], rtol=1e-7)
    assert np.isnan(z.numpy()[2]).all()
    ip = pc.l2_norm(a, eps=10.0, inplace=True)
    run(ip)
    assert ip.view_src is a
    np.testing.assert_allclose(a.numpy(), [[0.3, 0.4], [0.03, -0.04], [0, 0]], rtol=1e-6)


@verifies("L2_NORM")
def test_l2_norm_loop_rowgap():
    rng = np.random.default_rng(17)
    big = rng.standard_normal((3, 2, 12)).astype(np.float32)
    ctx = pc.Context()
    base = ctx.from_numpy(big)
    v = pc.view_3d(base, 9, 2, 3, base.nb[1], base.nb[2])
    got = full(run(pc.l2_norm(v, eps=2.5)))
    for i2, i1 in itertools.product(range(3), range(2)):
        row = [float(t) for t in big[i2, i1, :9]]
        n = math.sqrt(sum(t * t for t in row))
        np.testing.assert_allclose(got[0, i2, i1], [t / max(n, 2.5) for t in row], rtol=1e-6)


def test_l2_norm_errors():
    ctx = pc.Context()
    a = ctx.from_numpy(np.zeros(3, np.float32))
    h = ctx.from_numpy(np.zeros(3, np.float32), type=F16)
    with refused(InvalidArgument, "L2_NORM: parameter 'eps' must be >= 0.0", ctx):
        pc.l2_norm(a, eps=-1.0)
    with refused(TypeMismatch, "L2_NORM: source 'a' has type f16", ctx):
        pc.l2_norm(h)


# ---------------------------------------------------------------- GROUP_NORM
def group_norm_loop(x: np.ndarray, n_groups: int, eps: float) -> np.ndarray:
    """x in NumPy order (ne3, ne2, ne1, ne0), channels along ne2, plain Python sums."""
    ne3, ne2, ne1, ne0 = x.shape
    per = (ne2 + n_groups - 1) // n_groups
    out = np.full(x.shape, np.nan)
    for i3 in range(ne3):
        for g in range(n_groups):
            chans = [c for c in range(g * per, min(g * per + per, ne2))]
            if not chans:
                continue
            vals = [float(x[i3, c, i1, i0]) for c in chans for i1 in range(ne1) for i0 in range(ne0)]
            mean = sum(vals) / len(vals)
            var = sum((v - mean) ** 2 for v in vals) / len(vals)
            for c in chans:
                for i1, i0 in itertools.product(range(ne1), range(ne0)):
                    out[i3, c, i1, i0] = (float(x[i3, c, i1, i0]) - mean) / math.sqrt(var + eps)
    return out


@verifies("GROUP_NORM")
def test_group_norm_hand():
    ctx = pc.Context()
    # ne = [2, 1, 3]: channels [1, 3], [5, 7], [2, 2]; n_groups 2 -> groups of 2 channels: {0, 1}, {2}
    x = np.array([[[1, 3]], [[5, 7]], [[2, 2]]], np.float32)
    y = run(pc.group_norm(ctx.from_numpy(x), 2, eps=0.0))
    # group {0,1}: values 1, 3, 5, 7: mean 4, var 5; group {2}: constant 2 -> 0 / sqrt(0 + 0) = NaN
    s5 = math.sqrt(5)
    np.testing.assert_allclose(y.numpy()[:2], [[[-3 / s5, -1 / s5]], [[1 / s5, 3 / s5]]], rtol=1e-7)
    assert np.isnan(y.numpy()[2]).all()
    z = run(pc.group_norm(ctx.from_numpy(x), 2, eps=1.0))
    np.testing.assert_allclose(z.numpy(), [[[-3 / math.sqrt(6), -1 / math.sqrt(6)]],
                                           [[1 / math.sqrt(6), 3 / math.sqrt(6)]], [[0, 0]]], rtol=1e-7)
    assert z.params["n_groups"] == 2 and z.params["eps"] == 1.0


@verifies("GROUP_NORM")
@pytest.mark.parametrize("n_groups", [1, 2, 4, 5, 7, 32])
def test_group_norm_loop(n_groups):
    rng = np.random.default_rng(n_groups)
    x = rng.standard_normal((2, 7, 3, 4)).astype(np.float32)  # ne = [4, 3, 7, 2]
    ctx = pc.Context()
    got = full(run(pc.group_norm(ctx.from_numpy(x), n_groups, eps=1e-3)))
    np.testing.assert_allclose(got, group_norm_loop(x, n_groups, 1e-3), rtol=2e-6, atol=1e-6)


@verifies("GROUP_NORM", "TRANSPOSE")
def test_group_norm_strided_and_inplace():
    rng = np.random.default_rng(23)
    x = rng.standard_normal((1, 4, 5, 3)).astype(np.float32)  # ne = [3, 5, 4]
    ctx = pc.Context()
    t = pc.transpose(ctx.from_numpy(np.ascontiguousarray(x.transpose(0, 1, 3, 2))))  # logical x
    np.testing.assert_allclose(full(run(pc.group_norm(t, 2, 1e-4))), group_norm_loop(x, 2, 1e-4), rtol=2e-6,
                               atol=1e-6)
    a = ctx.from_numpy(x)
    ip = pc.group_norm(a, 3, 1e-4, inplace=True)
    run(ip)
    assert ip.view_src is a
    np.testing.assert_allclose(full(a), group_norm_loop(x, 3, 1e-4), rtol=2e-6, atol=1e-6)


def test_group_norm_errors():
    ctx = pc.Context()
    a = ctx.from_numpy(np.zeros((2, 2, 2), np.float32))
    b = ctx.from_numpy(np.zeros(2, np.float32), type=BF16)
    with refused(InvalidArgument, "GROUP_NORM: parameter 'n_groups' must be >= 1", ctx):
        pc.group_norm(a, 0)
    with refused(InvalidArgument, "parameter 'eps' must be >= 0.0", ctx):
        pc.group_norm(a, 1, eps=-1e-6)
    with refused(TypeMismatch, "GROUP_NORM: source 'a' has type bf16", ctx):
        pc.group_norm(b, 1)


# ---------------------------------------------------------------- table order
def test_new_ops_follow_ggml_op_order():
    keys = list(pc.OPS)
    new = ["CONCAT", "GROUP_NORM", "L2_NORM", "DIAG", "PAD", "PAD_REFLECT_1D", "ARANGE", "TIMESTEP_EMBEDDING",
           "ARGSORT", "REGLU"]
    pos = [keys.index(k) for k in new]
    assert pos == sorted(pos)
    assert [int(pc.opdef(k).op) for k in new] == [22, 27, 28, 43, 64, 65, 67, 68, 69, 100]
    assert keys[-6:] == [g.name for g in pc.GluOp]
    assert pc.opdef("ARGSORT").nmse == 0.0 and pc.opdef("CONCAT").nmse == 1e-7
