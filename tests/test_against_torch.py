"""Gradients and values against an independent framework (PyTorch CPU), on random cases.

PyTorch is not a dependency of Prism: this module runs where it is installed
(``pip install torch==2.13.0``) and is skipped, saying so, elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the cross-framework check does not run")


def prism_grads(build, arrays):
    ctx = pc.Context()
    params = [ctx.from_numpy(a.astype(np.float32)).set_param() for a in arrays]
    loss = build(params).set_loss()
    g = pc.Graph(capacity=8192).expand(loss)
    pc.build_backward(g)
    pc.reset(g)
    pc.compute(g, "numpy")
    return float(loss.numpy()[0]), [g.grad(p).numpy() for p in params]


def torch_grads(build, arrays):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    loss = build(ts)
    loss.backward()
    return float(loss.detach()), [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("seed", range(5))
def test_mlp_with_norms_and_activations_matches_torch(seed):
    rng = np.random.default_rng(seed)
    shapes = [(6, 5), (6,), (3, 6), (3,), (4, 5), (5,)]
    arrays = [rng.normal(0, 0.7, s) for s in shapes]
    labels = np.eye(3)[rng.integers(0, 3, 4)]

    def prism_loss(p):
        w1, b1, w2, b2, x, gain = p
        h = pc.gelu(pc.add(pc.mul_mat(w1, pc.mul(pc.rms_norm(x, 1e-5), gain)), b1))
        logits = pc.add(pc.mul_mat(w2, pc.tanh(h)), b2)
        return pc.cross_entropy_loss(logits, w1.ctx.from_numpy(labels.astype(np.float32)))

    def torch_loss(t):
        w1, b1, w2, b2, x, gain = t
        xn = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * gain
        # Prism's GELU is ggml's CPU one: read from an F16 table at the input's F16 rounding
        z = (xn @ w1.T + b1).half().double()
        h = torch.nn.functional.gelu(z, approximate="tanh").half().double()
        logits = torch.tanh(h) @ w2.T + b2
        return torch.nn.functional.cross_entropy(logits, torch.tensor(labels))

    lp, gp = prism_grads(prism_loss, arrays)
    lt, gt = torch_grads(torch_loss, arrays)
    assert lp == pytest.approx(lt, rel=1e-5)
    for a, b in zip(gp, gt):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("seed", range(3))
def test_attention_softmax_and_rope_gradients_match_torch(seed):
    rng = np.random.default_rng(100 + seed)
    hd, t = 8, 5
    arrays = [rng.normal(0, 1, (t, hd)), rng.normal(0, 1, (t, hd)), rng.normal(0, 1, (t, hd))]
    pos_np = np.arange(t) + 2
    causal = np.triu(np.ones((t, t), bool), 1)

    def prism_loss(p):
        q, k, v = p
        ctx = q.ctx
        pos = ctx.from_numpy(pos_np.astype(np.int32))
        rq = pc.rope_ext(pc.reshape(q, (hd, 1, t)), pos, n_dims=hd, mode=2)
        rk = pc.rope_ext(pc.reshape(k, (hd, 1, t)), pos, n_dims=hd, mode=2)
        kq = pc.mul_mat(pc.reshape(rk, (hd, t)), pc.reshape(rq, (hd, t)))      # [t_kv, t_q]
        probs = pc.soft_max(pc.diag_mask_inf(pc.scale(kq, hd ** -0.5), 0))
        out = pc.mul_mat(pc.cont(pc.transpose(v)), probs)                     # [hd, t_q]
        return pc.sum(pc.sqr(out))

    def rope(x):
        half = hd // 2
        ang = torch.tensor(pos_np[:, None] * 10000.0 ** (-2 * np.arange(half) / hd))
        a, b = x[:, :half], x[:, half:]
        return torch.cat([a * torch.cos(ang) - b * torch.sin(ang), a * torch.sin(ang) + b * torch.cos(ang)], -1)

    def torch_loss(ts):
        q, k, v = ts
        s = (rope(q) @ rope(k).T) * hd ** -0.5
        s = s.masked_fill(torch.tensor(causal), float("-inf"))
        return ((torch.softmax(s, -1) @ v) ** 2).sum()

    lp, gp = prism_grads(prism_loss, arrays)
    lt, gt = torch_grads(torch_loss, arrays)
    assert lp == pytest.approx(lt, rel=1e-5)
    for a, b in zip(gp, gt):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
