"""Symbolic autodiff: hand-derived gradients, graph API, accumulators, reset, transactional failure."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import slow_on_numba, snapshot

import prism_core as pc
from prism_core.cli import main as cli
from prism_core.conformance import FAIL, PASS
from prism_core.conformance.gradcheck import GRAD_CASES, grad_cases, run_grad, run_grad_case


def f32(ctx, values):
    return ctx.from_numpy(np.asarray(values, dtype=np.float32))


def test_mul_mat_gradient_by_hand():
    ctx = pc.Context()
    w = f32(ctx, [[1, 2], [3, 4], [5, 6]]).set_param()    # ggml ne [2, 3]: 3 output rows
    x = f32(ctx, [[1, -1], [2, 0.5]])                      # two inputs of 2 features
    loss = pc.sum(pc.sqr(pc.mul_mat(w, x))).set_loss()     # sum_n sum_m (w_m . x_n)^2
    g = pc.Graph().expand(loss)
    pc.build_backward(g)
    pc.reset(g)
    pc.compute(g)
    wv, xv = w.numpy(), x.numpy()
    expected = sum(2 * np.outer(wv @ xv[n], xv[n]) for n in range(2))  # d/dw_m = 2 (w_m . x_n) x_n
    np.testing.assert_allclose(g.grad(w).numpy(), expected, rtol=1e-6)
    assert g.grad(x) is None  # x is not a parameter and nothing needs its gradient


def test_gradients_of_a_tensor_used_twice_add_up():
    ctx = pc.Context()
    x = f32(ctx, [1.0, -2.0, 3.0]).set_param()
    loss = pc.sum(pc.add(pc.mul(x, x), pc.scale(x, 3.0))).set_loss()  # d/dx (x^2 + 3x) = 2x + 3
    g = pc.Graph().expand(loss)
    pc.build_backward(g)
    pc.reset(g)
    pc.compute(g)
    np.testing.assert_allclose(g.grad(x).numpy(), [5.0, -1.0, 9.0])


def test_no_nodes_for_inputs_that_need_no_gradient():
    ctx = pc.Context()
    w = f32(ctx, [1.0, 2.0]).set_param()
    c = f32(ctx, [3.0, 4.0])
    side = pc.sin(pc.cos(c))                             # depends on constants only
    loss = pc.sum(pc.mul(w, side)).set_loss()
    g = pc.Graph().expand(loss)
    n_forward = len(g.nodes)
    pc.build_backward(g)
    assert g.grad(c) is None and g.grad(side) is None
    new_ops = [n.opdef.key for n in g.nodes[n_forward:]]
    assert "SIN" not in new_ops and "COS" not in new_ops  # no derivative work for the constant branch
    pc.reset(g)
    pc.compute(g)
    np.testing.assert_allclose(g.grad(w).numpy(), np.sin(np.cos([3.0, 4.0])), rtol=1e-6)


def test_accumulators_sum_until_reset_and_loss_gets_one():
    ctx = pc.Context()
    w = f32(ctx, [1.0, 2.0]).set_param()
    loss = pc.sum(pc.sqr(w)).set_loss()
    acc = ctx.new_tensor(pc.F32, w.ne)
    g = pc.Graph().expand(loss)
    pc.build_backward(g, {w: acc})
    assert g.grad_acc(w) is acc and g.grad_acc(loss) is not None
    pc.reset(g)
    assert g.grad_acc(loss).numpy()[0] == 1.0
    pc.compute(g)
    pc.compute(g)
    np.testing.assert_allclose(acc.numpy(), [4.0, 8.0])  # 2 * (2w): summed over two evaluations
    pc.reset(g)
    assert not acc.numpy().any()


def test_reset_zeroes_adamw_moments():
    ctx = pc.Context()
    w = f32(ctx, [1.0, 2.0]).set_param()
    loss = pc.sum(pc.sqr(w)).set_loss()
    g = pc.Graph().expand(loss)
    pc.build_backward(g)
    m, v = f32(ctx, [5.0, 5.0]), f32(ctx, [7.0, 7.0])
    opt = f32(ctx, [0.1, 0.9, 0.999, 1e-8, 0.0, 10.0, 1000.0])
    g.expand(pc.opt_step_adamw(w, g.grad(w), m, v, opt))
    pc.reset(g)
    assert not m.numpy().any() and not v.numpy().any()
    pc.compute(g)
    # first AdamW step from zero moments moves each weight by about alpha against its gradient's sign
    np.testing.assert_allclose(w.numpy(), [0.9, 1.9], atol=1e-5)


# ------------------------------------------------------------------ failures roll back
def _state(ctx, g):
    return snapshot(ctx, g), dict(g.grads), dict(g.grad_accs)


@pytest.mark.parametrize("case", ["unsupported", "no_param", "no_loss", "acc_shape", "acc_type", "acc_foreign",
                                  "inplace", "bf16_source"])
def test_failed_expansion_raises_and_rolls_back(case):
    ctx = pc.Context()
    w = f32(ctx, [[0.5, -1.0], [2.0, 1.0]]).set_param()
    h = pc.mul_mat(w, w)                                   # some derivative nodes get built first
    if case == "unsupported":
        out = pc.gelu_erf(h)                               # GELU_ERF has no derivative rule
    elif case == "inplace":
        out = pc.relu_inplace(h)
    elif case == "bf16_source":
        out = pc.add(h, pc.cast(h, pc.BF16))               # a bf16 tensor on the gradient path
    else:
        out = pc.sqr(h)
    loss = pc.sum(out)
    if case != "no_loss":
        loss.set_loss()
    if case == "no_param":
        w.flags &= ~pc.Flag.PARAM
    accs = {"acc_shape": {w: ctx.new_tensor(pc.F32, (3,))}, "acc_type": {w: ctx.new_tensor(pc.F16, w.ne)},
            "acc_foreign": {f32(ctx, [1.0]): ctx.new_tensor(pc.F32, (1,))}}.get(case)
    g = pc.Graph().expand(loss)
    before = _state(ctx, g)
    expected = {"unsupported": (pc.Unsupported, "GELU_ERF"), "no_param": (pc.InvalidArgument, "parameter"),
                "no_loss": (pc.InvalidArgument, "loss"), "acc_shape": (pc.ShapeMismatch, "accumulator"),
                "acc_type": (pc.TypeMismatch, "f32"), "acc_foreign": (pc.InvalidArgument, "not a node"),
                "inplace": (pc.InvalidArgument, "in-place"), "bf16_source": (pc.TypeMismatch, "bf16")}[case]
    with pytest.raises(expected[0], match=expected[1]):
        pc.build_backward(g, accs)
    assert _state(ctx, g) == before


def test_mask_gradient_is_refused_not_ignored():
    ctx = pc.Context()
    a = f32(ctx, np.zeros((2, 3)))
    mask = f32(ctx, np.zeros((2, 3))).set_param()
    loss = pc.sum(pc.soft_max_ext(a, mask)).set_loss()
    g = pc.Graph().expand(loss)
    with pytest.raises(pc.Unsupported, match="mask"):
        pc.build_backward(g)


# ------------------------------------------------------------------ gradient conformance
def test_every_differentiable_op_has_gradient_cases():
    for key, d in pc.OPS.items():
        if d.differentiable:
            assert key in GRAD_CASES, f"{key} is differentiable but has no gradient cases"


@pytest.mark.parametrize("name", slow_on_numba(b.name for b in pc.backends() if b.available))
def test_gradients_match_finite_differences_on_every_backend(name):
    results = run_grad(pc.backend(name), grad_cases())
    failures = [r.describe() for r in results if r.status == FAIL]
    assert not failures, "\n".join(failures[:10])
    assert any(r.status == PASS for r in results)


def test_gradcheck_catches_a_wrong_derivative(monkeypatch):
    wrong = dataclasses.replace(pc.OPS["SIN"], grad={"a": lambda B, n, g: B.mul(g, B.sin(n.src[0]))})
    monkeypatch.setitem(pc.OPS, "SIN", wrong)
    (case, *_) = grad_cases(["SIN"])
    result = run_grad_case(case, pc.backend("numpy"))
    assert result.status == FAIL and "finite differences" in result.message


def test_cli_grad_mode(capsys):
    assert cli(["conformance", "--mode", "grad", "--backend", "numpy", "--op", "MUL_MAT", "--op", "SOFT_MAX"]) == 0
    out = capsys.readouterr().out
    assert "MUL_MAT" in out and "SOFT_MAX" in out and "0 failed" in out


def test_two_layer_mlp_gradients_match_a_hand_written_numpy_backward():
    rng = np.random.default_rng(11)
    n, d_in, d_hid, d_out = 8, 5, 7, 3
    x_np = rng.normal(size=(n, d_in))
    labels = np.eye(d_out)[rng.integers(0, d_out, n)]
    w1_np, b1_np = rng.normal(0, 0.5, (d_hid, d_in)), rng.normal(0, 0.1, d_hid)
    w2_np, b2_np = rng.normal(0, 0.5, (d_out, d_hid)), rng.normal(0, 0.1, d_out)

    # NumPy forward and backward, written out
    z1 = x_np @ w1_np.T + b1_np
    h = np.maximum(z1, 0)
    z2 = h @ w2_np.T + b2_np
    p = np.exp(z2 - z2.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz2 = (p - labels) / n                     # d mean-cross-entropy / d logits
    dw2, db2 = dz2.T @ h, dz2.sum(0)
    dz1 = (dz2 @ w2_np) * (z1 > 0)
    dw1, db1 = dz1.T @ x_np, dz1.sum(0)

    ctx = pc.Context()
    w1, b1 = ctx.from_numpy(w1_np.astype(np.float32)).set_param(), ctx.from_numpy(b1_np.astype(np.float32)).set_param()
    w2, b2 = ctx.from_numpy(w2_np.astype(np.float32)).set_param(), ctx.from_numpy(b2_np.astype(np.float32)).set_param()
    x = ctx.from_numpy(x_np.astype(np.float32))
    hidden = pc.relu(pc.add(pc.mul_mat(w1, x), b1))
    logits = pc.add(pc.mul_mat(w2, hidden), b2)
    loss = pc.cross_entropy_loss(logits, ctx.from_numpy(labels.astype(np.float32))).set_loss()
    g = pc.Graph().expand(loss)
    pc.build_backward(g)
    pc.reset(g)
    pc.compute(g)
    for t, expect in ((w1, dw1), (b1, db1), (w2, dw2), (b2, db2)):
        np.testing.assert_allclose(g.grad(t).numpy(), expect, rtol=1e-4, atol=1e-6)
