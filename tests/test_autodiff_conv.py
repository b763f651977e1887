"""Autodiff through the conv ops: IM2COL (input gradient = IM2COL_BACK; the kernel source
gets none), POOL_2D (gradient = POOL_2D_BACK), the im2col + mul_mat convolution of
ggml_conv_2d end to end, and clear refusals for ops without a derivative rule.

Expected gradients are hand-worked or exact finite differences of a textbook
convolution loop written here (the loss is linear in each argument and the data are
small integers, so one-sided differences are exact).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from helpers import snapshot

import prism_core as pc
from prism_core import F32


def grads(loss: pc.Tensor, *params: pc.Tensor) -> list[np.ndarray | None]:
    loss.set_loss()
    g = pc.Graph().expand(loss)
    pc.build_backward(g)
    pc.reset(g)
    pc.compute(g, "numpy", strict=True)
    return [None if g.grad(p) is None else g.grad(p).numpy() for p in params]


def conv_loop(x, k, s0, s1, p0, p1):
    """x (N, IC, H, W), k (OC, IC, KH, KW) -> (N, OC, OH, OW), float64."""
    n_b, ic_n, h, w = x.shape
    oc_n, _, kh_n, kw_n = k.shape
    oh_n, ow_n = (h + 2 * p1 - kh_n) // s1 + 1, (w + 2 * p0 - kw_n) // s0 + 1
    out = np.zeros((n_b, oc_n, oh_n, ow_n))
    for n, oc, oh, ow, ic, kh, kw in itertools.product(range(n_b), range(oc_n), range(oh_n), range(ow_n),
                                                       range(ic_n), range(kh_n), range(kw_n)):
        iy, ix = oh * s1 + kh - p1, ow * s0 + kw - p0
        if 0 <= iy < h and 0 <= ix < w:
            out[n, oc, oh, ow] += k[oc, ic, kh, kw] * x[n, ic, iy, ix]
    return out


def test_conv_2d_im2col_gradients_match_exact_differences():
    rng = np.random.default_rng(0)
    x_np = rng.integers(-3, 4, size=(2, 2, 4, 5)).astype(np.float32)   # ne [5, 4, 2, 2]
    k_np = rng.integers(-3, 4, size=(3, 2, 2, 3)).astype(np.float32)   # ne [3, 2, 2, 3]
    p = (2, 1, 1, 1)  # s0, s1, p0, p1
    w_np = rng.integers(-2, 3, size=conv_loop(x_np, k_np, *p).shape).astype(np.float32)
    ctx = pc.Context()
    x, k = ctx.from_numpy(x_np).set_param(), ctx.from_numpy(k_np).set_param()
    y = pc.conv_2d_im2col(k, x, *p)
    gx, gk = grads(pc.sum(pc.mul(y, ctx.from_numpy(w_np))), x, k)

    def loss(xv, kv):
        return float(np.sum(conv_loop(xv, kv, *p) * w_np))

    base = loss(x_np, k_np)
    for arr, got, which in ((x_np, gx, 0), (k_np, gk, 1)):
        want = np.zeros(arr.shape)
        for idx in itertools.product(*map(range, arr.shape)):
            bumped = arr.astype(np.float64)
            bumped[idx] += 1.0
            want[idx] = loss(bumped, k_np) - base if which == 0 else loss(x_np, bumped) - base
        assert np.array_equal(got.reshape(arr.shape), want), which


def test_im2col_gradient_by_hand_and_kernel_gets_none():
    # 1D: x = [x0, x1, x2], K = 2, stride 1, no padding: columns (x0, x1), (x1, x2);
    # loss = sum(cols * w) with w = [[1, 2], [3, 4]] -> dx = [1, 2 + 3, 4]
    ctx = pc.Context()
    x = ctx.from_numpy(np.array([1, 2, 3], np.float32)).set_param()
    k = ctx.from_numpy(np.ones((1, 2), np.float32)).set_param()  # ne [2, 1]: K = 2, IC = 1
    cols = pc.im2col(k, x, 1, 0, 0, 0, 1, 0, False)
    assert cols.ne == (2, 2, 1, 1)
    gx, gk = grads(pc.sum(pc.mul(cols, ctx.from_numpy(np.array([[1, 2], [3, 4]], np.float32)))), x, k)
    assert gx.tolist() == [1, 5, 4]
    assert gk is None  # the kernel only supplies its shape (ggml ignores IM2COL's src0)


def test_pool_2d_gradients_by_hand():
    ctx = pc.Context()
    x_np = np.array([[1, 9, 2, 3], [4, 5, 8, 6], [7, 0, 1, 2], [3, 4, 6, 5]], np.float32)
    w_np = np.array([[10, 20], [30, 40]], np.float32)
    x = ctx.from_numpy(x_np).set_param()
    (g,) = grads(pc.sum(pc.mul(pc.pool_2d(x, "MAX", 2, 2, 2, 2), ctx.from_numpy(w_np))), x)
    assert g.tolist() == [[0, 10, 0, 0], [0, 0, 20, 0], [30, 0, 0, 0], [0, 0, 40, 0]]
    ctx = pc.Context()
    x = ctx.from_numpy(x_np).set_param()
    (g,) = grads(pc.sum(pc.mul(pc.pool_2d(x, "AVG", 2, 2, 2, 2), ctx.from_numpy(w_np))), x)
    assert g.tolist() == [[2.5, 2.5, 5, 5], [2.5, 2.5, 5, 5], [7.5, 7.5, 10, 10], [7.5, 7.5, 10, 10]]


def test_backward_graph_uses_the_back_ops():
    ctx = pc.Context()
    x = ctx.from_numpy(np.arange(16, dtype=np.float32).reshape(4, 4)).set_param()
    y = pc.pool_2d(pc.im2col(ctx.new_tensor(F32, (1, 1)), x, 1, 1, 0, 0, 1, 1), "AVG", 1, 2, 1, 2)
    loss = pc.sum(y).set_loss()
    g = pc.Graph().expand(loss)
    n_fwd = len(g.nodes)
    pc.build_backward(g)
    keys = [n.opdef.key for n in g.nodes[n_fwd:] if n.opdef is not None]
    assert "POOL_2D_BACK" in keys and "IM2COL_BACK" in keys


@pytest.mark.parametrize("make", [
    lambda ctx, x: pc.conv_2d(ctx.new_tensor(F32, (2, 2, 1, 1)), x),
    lambda ctx, x: pc.pool_1d(x, "MAX", 2, 2),
    lambda ctx, x: pc.upscale(x, 2),
    lambda ctx, x: pc.conv_transpose_1d(ctx.new_tensor(F32, (2, 1, 4)), x),
])
def test_ops_without_derivative_rule_refuse_and_roll_back(make):
    ctx = pc.Context()
    x = ctx.from_numpy(np.ones((4, 4), np.float32)).set_param()
    loss = pc.sum(make(ctx, x)).set_loss()
    g = pc.Graph().expand(loss)
    before = snapshot(ctx, g)
    with pytest.raises(pc.Unsupported, match="derivative rule not written"):
        pc.build_backward(g)
    assert snapshot(ctx, g) == before


def test_gradient_cases_catch_wrong_conv_rules(monkeypatch):
    from prism_core.conformance import FAIL
    from prism_core.conformance.gradcheck import grad_cases, run_grad_case

    def avg_instead(B, n, g):  # MAX pooling differentiated as if it were AVG
        p = {k: n.params[k] for k in ("k0", "k1", "s0", "s1", "p0", "p1")}
        return B.pool_2d_back(g, n.src[0], "AVG", **p)

    def halved(B, n, g):  # im2col_back at half strength
        p = {k: n.params[k] for k in ("s0", "s1", "p0", "p1", "d0", "d1", "is_2D")}
        return B.scale(B.im2col_back(g, n.src[0], n.src[1].ne, **p), 0.5)

    for key, rule in (("POOL_2D", avg_instead), ("IM2COL", halved)):
        d = pc.OPS[key]
        monkeypatch.setitem(pc.OPS, key, dataclasses.replace(d, grad={**d.grad, d.srcs[-1].name: rule}))
        result = run_grad_case(grad_cases([key])[0], pc.backend("numpy"))
        assert result.status == FAIL, result.describe()
