"""Independent checks of the NumPy reference backend: diagonal masks, softmax (mask,
scale, ALiBi, sinks) and its backward, cross-entropy loss and its backward, and the
AdamW / SGD optimizer steps.

Expectations are hand-worked numbers, per-row Python loops or finite differences,
following /work/shared/reference/ggml-semantics.md (2.3 and 4.6); none calls the
kernels' code.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import full, run, verifier

import prism_core as pc
from prism_core import F16, F32

VERIFIED, verifies = verifier()  # op-table keys this module checks


INF = math.inf
LN2, LN3 = math.log(2), math.log(3)


# ---------------------------------------------------------------- diagonal masks
M24 = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4)  # ne = [4 cols, 3 rows, 2 matrices]


@verifies("DIAG_MASK_INF")
def test_diag_mask_inf_hand_matrix():
    ctx = pc.Context()
    y = run(pc.diag_mask_inf(ctx.from_numpy(M24), 1))
    # row j keeps columns i <= 1 + j
    assert y.numpy().tolist() == [
        [[1, 2, -INF, -INF], [5, 6, 7, -INF], [9, 10, 11, 12]],
        [[13, 14, -INF, -INF], [17, 18, 19, -INF], [21, 22, 23, 24]],
    ]


@verifies("DIAG_MASK_ZERO")
def test_diag_mask_zero_hand_matrix():
    ctx = pc.Context()
    y = run(pc.diag_mask_zero(ctx.from_numpy(M24), 0))
    assert y.numpy().tolist() == [
        [[1, 0, 0, 0], [5, 6, 0, 0], [9, 10, 11, 0]],
        [[13, 0, 0, 0], [17, 18, 0, 0], [21, 22, 23, 0]],
    ]


@verifies("DIAG_MASK_INF", "DIAG_MASK_ZERO")
@pytest.mark.parametrize("n_past", [-2, -1, 0, 2, 3, 7])
@pytest.mark.parametrize("key", ["DIAG_MASK_INF", "DIAG_MASK_ZERO"])
def test_diag_mask_rule_and_inplace(n_past, key):
    fill = -INF if key == "DIAG_MASK_INF" else 0.0
    build = pc.diag_mask_inf if key == "DIAG_MASK_INF" else pc.diag_mask_zero
    want = M24.astype(np.float64)
    for k, j, i in itertools.product(range(2), range(3), range(4)):
        if i > n_past + j:
            want[k, j, i] = fill
    ctx = pc.Context()
    a = ctx.from_numpy(M24)
    assert np.array_equal(run(build(a, n_past)).numpy(), want)
    ip = build(a, n_past, inplace=True)
    assert ip.view_src is a
    run(ip)
    assert np.array_equal(a.numpy(), want)


# ---------------------------------------------------------------- softmax
def softmax_row(vals, sink=None):
    mx = max(list(vals) + ([sink] if sink is not None else []))
    es = [math.exp(v - mx) for v in vals]
    den = sum(es) + (math.exp(sink - mx) if sink is not None else 0.0)
    return [e / den for e in es]


def alibi_slope(h: int, n_head: int, max_bias: float) -> float:
    if max_bias <= 0:
        return 1.0
    n_log2 = 1
    while n_log2 * 2 <= n_head:
        n_log2 *= 2
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-max_bias / 2 / n_log2)
    return m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1)


def test_alibi_slope_formula_hand_values():
    # n_head 6: L = 4, m0 = 2^-2, m1 = 2^-1; n_head 3: L = 2, m0 = 2^-4, m1 = 2^-2
    assert [alibi_slope(h, 6, 8.0) for h in range(6)] == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    assert [alibi_slope(h, 3, 8.0) for h in range(3)] == [1 / 16, 1 / 256, 1 / 4]
    assert [alibi_slope(h, 4, 0.0) for h in range(4)] == [1, 1, 1, 1]


@verifies("SOFT_MAX")
def test_soft_max_hand_values():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[0, LN2, LN3], [5, 5, 5]], np.float32))
    y = run(pc.soft_max(a))
    np.testing.assert_allclose(y.numpy(), [[1 / 6, 1 / 3, 1 / 2], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
    # scale = ln 2 on [0, 1, 2] gives weights 1 : 2 : 4
    b = ctx.from_numpy(np.array([0, 1, 2], np.float32))
    np.testing.assert_allclose(run(pc.soft_max_ext(b, scale=LN2)).numpy(), [1 / 7, 2 / 7, 4 / 7], rtol=1e-6)
    # a -inf mask entry removes a column
    m = ctx.from_numpy(np.array([0, -INF, 0, LN2], np.float32), type=F16)
    z = ctx.from_numpy(np.zeros(4, np.float32))
    np.testing.assert_allclose(run(pc.soft_max_ext(z, m)).numpy(), [0.25, 0, 0.25, 0.5], rtol=1e-3)


@verifies("SOFT_MAX")
def test_soft_max_large_logits_are_stable():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([1000, 1000 + LN3, -1000], np.float32))
    y = run(pc.soft_max(a)).numpy()
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, softmax_row([1000.0, float(np.float32(1000 + LN3)), -1000.0]), rtol=1e-6)


@verifies("SOFT_MAX")
@pytest.mark.parametrize("n_head,max_bias,mask_type", [(6, 8.0, F32), (3, 8.0, F16), (6, 2.5, F32), (3, 0.0, F32)])
def test_soft_max_ext_mask_broadcast_scale_alibi(n_head, max_bias, mask_type):
    ne0, ne1, ne3 = 5, 2, 4
    m1, m2, m3 = 3, 3 if n_head % 3 == 0 else 1, 2  # mask.ne1 > a.ne1; dims 2, 3 broadcast
    rng = np.random.default_rng(n_head)
    a_np = rng.standard_normal((ne3, n_head, ne1, ne0)).astype(np.float32)
    mask_np = (rng.integers(-8, 9, size=(m3, m2, m1, ne0)) / 4).astype(np.float32)  # exact in f16
    mask_np[0, 0, 1, 2] = -INF
    scale = 0.7
    ctx = pc.Context()
    a, mask = ctx.from_numpy(a_np), ctx.from_numpy(mask_np, type=mask_type)
    y = run(pc.soft_max_ext(a, mask, scale=scale, max_bias=max_bias))
    assert y.type == F32 and y.ne == a.ne
    got = full(y)
    for i3, i2, i1 in itertools.product(range(ne3), range(n_head), range(ne1)):
        slope = alibi_slope(i2, n_head, max_bias)
        row = [float(a_np[i3, i2, i1, i0]) * scale + slope * float(mask_np[i3 % m3, i2 % m2, i1, i0])
               for i0 in range(ne0)]
        np.testing.assert_allclose(got[i3, i2, i1], softmax_row(row), rtol=2e-6, atol=1e-9,
                                   err_msg=f"row {(i1, i2, i3)}")
    if max_bias == 0:
        return
    # the slope really matters here: a slope-free expectation disagrees
    plain = [float(a_np[0, 1, 0, i0]) * scale + float(mask_np[0, 1 % m2, 0, i0]) for i0 in range(ne0)]
    assert not np.allclose(got[0, 1, 0], softmax_row(plain), rtol=1e-3)


@verifies("SOFT_MAX")
def test_soft_max_sinks_join_max_and_denominator():
    ctx = pc.Context()
    # two heads (dim 2); head 0 sink ln 3, head 1 sink -inf-like (very small)
    a = ctx.from_numpy(np.array([[[0, LN2]], [[0, LN2]]], np.float32))  # ne = [2, 1, 2]
    sinks = ctx.from_numpy(np.array([LN3, -50.0], np.float32))
    y = run(pc.soft_max_ext(a, sinks=sinks))
    # head 0: e^0 : e^ln2 over (1 + 2 + 3) -> [1/6, 2/6]; head 1: ~[1/3, 2/3]
    np.testing.assert_allclose(y.numpy().reshape(2, 2), [[1 / 6, 2 / 6], [1 / 3, 2 / 3]], rtol=1e-6)
    # a sink larger than every logit: max is the sink
    b = ctx.from_numpy(np.array([[[-1000, -1000]]], np.float32))
    s = ctx.from_numpy(np.array([0.0], np.float32))
    np.testing.assert_allclose(run(pc.soft_max_ext(b, sinks=s)).numpy(), [0, 0], atol=1e-30)
    # with a mask and a scale as well
    mask = ctx.from_numpy(np.array([[0, -INF]], np.float32))
    c = ctx.from_numpy(np.array([[[1, 5]], [[2, 7]]], np.float32))
    z = run(pc.soft_max_ext(c, mask, scale=LN2, sinks=sinks)).numpy().reshape(2, 2)
    want = [softmax_row([LN2, -INF], LN3), softmax_row([2 * LN2, -INF], -50.0)]
    np.testing.assert_allclose(z, want, rtol=1e-6, atol=1e-30)
    assert z[0].tolist() == pytest.approx([2 / 5, 0])  # e^ln2 = 2 over (2 + 3)


@verifies("SOFT_MAX")
def test_soft_max_inplace():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([0, LN3], np.float32))
    y = pc.soft_max(a, inplace=True)
    assert y.view_src is a
    run(y)
    np.testing.assert_allclose(a.numpy(), [0.25, 0.75], rtol=1e-6)


@verifies("SOFT_MAX_BACK")
def test_soft_max_back_hand_and_finite_difference():
    ctx = pc.Context()
    y = ctx.from_numpy(np.array([0.25, 0.75], np.float32))
    dy = ctx.from_numpy(np.array([1, 3], np.float32))
    # <y, dy> = 2.5; dx = scale * y * (dy - 2.5)
    assert run(pc.soft_max_ext_back(dy, y)).numpy().tolist() == [-0.375, 0.375]
    assert run(pc.soft_max_ext_back(dy, y, scale=2.0)).numpy().tolist() == [-0.75, 0.75]

    # d/dx <g, softmax(scale x)> by central differences, per row
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 5))
    g = rng.standard_normal((3, 5)).astype(np.float32)
    scale = 0.8
    ys = np.array([softmax_row([scale * v for v in row]) for row in x], np.float32)
    got = run(pc.soft_max_ext_back(ctx.from_numpy(g), ctx.from_numpy(ys), scale=scale)).numpy()
    h = 1e-6
    for r, i in itertools.product(range(3), range(5)):
        up, dn = list(x[r]), list(x[r])
        up[i] += h
        dn[i] -= h
        fu = softmax_row([scale * v for v in up])
        fd = softmax_row([scale * v for v in dn])
        want = sum(float(g[r, j]) * (fu[j] - fd[j]) / (2 * h) for j in range(5))
        assert got[r, i] == pytest.approx(want, rel=1e-4, abs=1e-6), (r, i)


# ---------------------------------------------------------------- cross-entropy
def ce_loss(logits, labels):
    total = 0.0
    for row, lab in zip(logits, labels):
        lse = math.log(sum(math.exp(v) for v in row))
        total -= sum(p * (v - lse) for v, p in zip(row, lab))
    return total / len(logits)


@verifies("CROSS_ENTROPY_LOSS")
def test_cross_entropy_loss_hand_and_rows():
    ctx = pc.Context()
    # rows: [0, 0] with label [1, 0] -> ln 2; [0, ln 3] with label [0, 1] -> -ln(3/4)
    a = ctx.from_numpy(np.array([[0, 0], [0, LN3]], np.float32))
    b = ctx.from_numpy(np.array([[1, 0], [0, 1]], np.float32))
    y = run(pc.cross_entropy_loss(a, b))
    assert y.type == F32 and y.ne == (1, 1, 1, 1)
    assert float(y.numpy()[0]) == pytest.approx(math.log(8 / 3) / 2, rel=1e-6)

    rng = np.random.default_rng(21)
    logits = rng.standard_normal((2, 3, 6)).astype(np.float32)  # 6 rows of 6 classes over dims 1, 2
    raw = rng.random((2, 3, 6))
    labels = (raw / raw.sum(axis=-1, keepdims=True)).astype(np.float32)
    z = run(pc.cross_entropy_loss(ctx.from_numpy(logits), ctx.from_numpy(labels)))
    want = ce_loss([[float(v) for v in r] for r in logits.reshape(6, 6)],
                   [[float(v) for v in r] for r in labels.reshape(6, 6)])
    assert float(z.numpy()[0]) == pytest.approx(want, rel=1e-6)


@verifies("CROSS_ENTROPY_LOSS_BACK")
def test_cross_entropy_loss_back_hand_and_finite_difference():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[0, 0], [0, LN3]], np.float32))
    b = ctx.from_numpy(np.array([[1, 0], [0, 1]], np.float32))
    g = ctx.from_numpy(np.array([2.0], np.float32))
    y = run(pc.cross_entropy_loss_back(g, a, b))
    # softmax rows [1/2, 1/2], [1/4, 3/4]; (s - b) * 2 / 2 rows
    np.testing.assert_allclose(y.numpy(), [[-0.5, 0.5], [0.25, -0.25]], rtol=1e-6)

    rng = np.random.default_rng(22)
    logits = rng.standard_normal((4, 5))
    raw = rng.random((4, 5))
    labels = raw / raw.sum(axis=-1, keepdims=True)
    gs = 0.75
    got = run(pc.cross_entropy_loss_back(ctx.from_numpy(np.array([gs], np.float32)),
                                         ctx.from_numpy(logits.astype(np.float32)),
                                         ctx.from_numpy(labels.astype(np.float32)))).numpy()
    x = [[float(np.float32(v)) for v in r] for r in logits]
    lab = [[float(np.float32(v)) for v in r] for r in labels]
    h = 1e-6
    for r, i in itertools.product(range(4), range(5)):
        up = [list(row) for row in x]
        dn = [list(row) for row in x]
        up[r][i] += h
        dn[r][i] -= h
        want = gs * (ce_loss(up, lab) - ce_loss(dn, lab)) / (2 * h)
        assert got[r, i] == pytest.approx(want, rel=1e-4, abs=1e-7), (r, i)


# ---------------------------------------------------------------- optimizer steps
def f32(x: float) -> float:
    return float(np.float32(x))


@verifies("OPT_STEP_ADAMW")
def test_adamw_step_hand_computed():
    it = 3
    alpha, beta1, beta2, eps, wd = 0.1, 0.9, 0.999, 1e-8, 0.01
    beta1h = 1 / (1 - beta1 ** it)  # computed on the host, as ggml-opt does
    beta2h = 1 / (1 - beta2 ** it)
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([1.0, -2.0], np.float32)).set_param()
    g = ctx.from_numpy(np.array([0.5, -1.0], np.float32))
    m = ctx.from_numpy(np.array([0.1, 0.0], np.float32))
    v = ctx.from_numpy(np.array([0.01, 0.0], np.float32))
    p = ctx.from_numpy(np.array([alpha, beta1, beta2, eps, wd, beta1h, beta2h], np.float32))
    y = pc.opt_step_adamw(a, g, m, v, p)
    assert y.view_src is a
    run(y)

    # by hand (decimal params): element 0: m = 0.9*0.1 + 0.1*0.5 = 0.14, v = 0.999*0.01 + 0.001*0.25 = 0.01024;
    # element 1: m = 0.1 * -1 = -0.1, v = 0.001 * 1 = 0.001. The params are f32, hence the loose bound.
    assert m.numpy().tolist() == pytest.approx([0.14, -0.1], rel=1e-6)
    assert v.numpy().tolist() == pytest.approx([0.01024, 0.001], rel=5e-5)
    w0 = 1.0 * (1 - alpha * wd) - alpha * (0.14 * beta1h) / (math.sqrt(0.01024 * beta2h) + eps)
    assert w0 == pytest.approx(0.97105, abs=1e-5)  # 0.999 - 0.1 * 0.51661 / 1.84845
    assert float(a.numpy()[0]) == pytest.approx(w0, rel=1e-5)

    # the same step with the f32 values of the params, plain Python floats, both elements
    A, B1, B2, E, WD, B1H, B2H = (f32(x) for x in (alpha, beta1, beta2, eps, wd, beta1h, beta2h))
    want_w, want_m, want_v = [], [], []
    for w, gr, mm, vv in ((1.0, 0.5, f32(0.1), f32(0.01)), (-2.0, -1.0, 0.0, 0.0)):
        mm = B1 * mm + (1 - B1) * gr
        vv = B2 * vv + (1 - B2) * gr * gr
        want_m.append(mm)
        want_v.append(vv)
        want_w.append(w * (1 - A * WD) - A * (mm * B1H) / (math.sqrt(vv * B2H) + E))
    assert m.numpy().tolist() == pytest.approx(want_m, rel=1e-6)
    assert v.numpy().tolist() == pytest.approx(want_v, rel=1e-6)
    assert a.numpy().tolist() == pytest.approx(want_w, rel=1e-6)
    assert y.numpy().tolist() == pytest.approx(want_w, rel=1e-6)


@verifies("OPT_STEP_ADAMW")
def test_adamw_first_step_is_sign_step():
    # iter 1, zero moments, no decay: m_hat = g, sqrt(v_hat) = |g| -> w - alpha * g / (|g| + eps)
    alpha, beta1, beta2, eps = 0.05, 0.9, 0.99, 1e-8
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)).set_param()
    g = ctx.from_numpy(np.array([[0.5, -3.0], [1e-3, -1e-3]], np.float32))
    m = ctx.new_tensor(F32, (2, 2))
    v = ctx.new_tensor(F32, (2, 2))
    p = ctx.from_numpy(np.array([alpha, beta1, beta2, eps, 0.0, 1 / (1 - beta1), 1 / (1 - beta2)], np.float32))
    run(pc.opt_step_adamw(a, g, m, v, p))
    assert a.numpy().reshape(-1).tolist() == pytest.approx([0.95, 2.05, 2.95, 4.05], rel=1e-5)
    assert m.numpy().reshape(-1).tolist() == pytest.approx([0.05, -0.3, 1e-4, -1e-4], rel=1e-5)


@verifies("OPT_STEP_SGD")
def test_sgd_step_hand_computed():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([1, -2, 3], np.float32)).set_param()
    g = ctx.from_numpy(np.array([0.5, 0.5, -1], np.float32))
    p = ctx.from_numpy(np.array([0.1, 0.5], np.float32))  # alpha, wd
    y = pc.opt_step_sgd(a, g, p)
    assert y.view_src is a
    run(y)
    # w (1 - 0.05) - 0.1 g
    assert a.numpy().tolist() == pytest.approx([0.9, -1.95, 2.95], rel=1e-6)
