"""prism_core.train (ggml-opt): shuffling, datasets, optimizer contexts, accumulation, metrics, fit."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

import prism_core as pc
from prism_core import train
from prism_core.errors import InvalidArgument, PrismWarning, ShapeMismatch, TypeMismatch
from prism_core.train.progress import bar, hms

BACKEND = "numpy"


# ------------------------------------------------------------------ mt19937 and std::shuffle
def test_mt19937_first_outputs():
    rng = train.MT19937()
    assert [rng(), rng(), rng()] == [3499211612, 581869302, 3890346734]


def test_mt19937_matches_numpy_legacy_seeding_over_several_twists():
    bg = np.random.MT19937()
    if not hasattr(bg, "_legacy_seeding"):
        pytest.skip("this NumPy has no MT19937._legacy_seeding")
    bg._legacy_seeding(5489)
    rng = train.MT19937()
    assert [rng() for _ in range(2000)] == bg.random_raw(2000).tolist()


def test_libstdcxx_shuffle_check_values():
    rng = train.MT19937()
    p = list(range(10))
    train.shuffle(p, rng)
    assert p == [2, 9, 0, 5, 4, 6, 7, 1, 3, 8]
    q = list(range(7))  # same generator, continued
    train.shuffle(q, rng)
    assert q == [0, 5, 6, 4, 3, 1, 2]
    big = np.arange(70000)
    train.shuffle(big, train.MT19937())
    assert big[:5].tolist() == [49860, 33005, 32937, 42750, 57907]
    assert sorted(big.tolist()) == list(range(70000))


def test_uniform_int_and_shuffle_ranges():
    rng = train.MT19937()
    vals = [train.uniform_int(rng, 3, 5) for _ in range(300)]
    assert set(vals) == {3, 4, 5}
    assert train.uniform_int(rng, 7, 7) == 7
    with pytest.raises(InvalidArgument):
        train.uniform_int(rng, 2, 1)
    p = [0, 1, 2, 3, 4, 5]
    train.shuffle(p, train.MT19937(), 2, 5)  # only the middle part moves
    assert p[:2] == [0, 1] and p[5] == 5 and sorted(p[2:5]) == [2, 3, 4]


# ----------------------------------------------------------------------------- datasets
def make_ds(ndata=12, width=3, nlabel=2, shard=1):
    data = np.arange(ndata * width, dtype=np.float32).reshape(ndata, width)
    labels = None if nlabel == 0 else 1000 + np.arange(ndata * nlabel, dtype=np.float32).reshape(ndata, nlabel)
    return train.Dataset.from_numpy(data, labels, shard), data, labels


def test_dataset_layout_and_batches_follow_the_permutation():
    ds, data, labels = make_ds(ndata=12, shard=2)
    assert ds.data.ne[:2] == (3, 12) and ds.labels.ne[:2] == (2, 12)
    assert ds.permutation.tolist() == list(range(6))
    ctx = pc.Context()
    xb, yb = ctx.new_tensor(pc.F32, (3, 4)), ctx.new_tensor(pc.F32, (2, 4))
    ds.get_batch(xb, yb, 1)  # shards 2 and 3 -> points 4..7
    np.testing.assert_array_equal(xb.numpy(), data[4:8])
    np.testing.assert_array_equal(yb.numpy(), labels[4:8])
    rng = train.MT19937()
    ds.shuffle(rng)
    expected = list(range(6))
    train.shuffle(expected, train.MT19937())
    assert ds.permutation.tolist() == expected
    ds.get_batch(xb, yb, 2)
    shards = expected[4:6]
    rows = [2 * s + k for s in shards for k in range(2)]
    np.testing.assert_array_equal(xb.numpy(), data[rows])
    np.testing.assert_array_equal(yb.numpy(), labels[rows])
    hx, hy = np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)
    ds.get_batch_host(hx, hy, 2)
    np.testing.assert_array_equal(hx, data[rows])
    np.testing.assert_array_equal(hy, labels[rows])


def test_dataset_partial_shuffle_and_opt_context_rng():
    ds, _, _ = make_ds(ndata=12, shard=2)
    ds.shuffle(train.MT19937(), 6)  # the first 3 shards only
    assert ds.permutation[3:].tolist() == [3, 4, 5] and sorted(ds.permutation[:3].tolist()) == [0, 1, 2]
    opt = linear_ctx(loss="mean_squared_error")[0]
    ds2, _, _ = make_ds(ndata=10, nlabel=1)
    ds2.shuffle(opt)  # the context's persistent generator: the check permutation for n = 10
    assert ds2.permutation.tolist() == [2, 9, 0, 5, 4, 6, 7, 1, 3, 8]
    p = list(range(10))
    ds2.shuffle(opt)  # continues the same generator
    r = train.MT19937()
    train.shuffle(p, r)
    train.shuffle(p, r)
    assert ds2.permutation.tolist() == p


def test_dataset_errors():
    with pytest.raises(InvalidArgument, match="ne_datapoint"):
        train.Dataset(0, 1, 10)
    with pytest.raises(InvalidArgument, match="ndata"):
        train.Dataset(2, 1, 0)
    with pytest.raises(ShapeMismatch, match="rows"):
        train.Dataset.from_numpy(np.zeros((4, 2)), np.zeros((5, 1)))
    with pytest.raises(ShapeMismatch, match="2-dim"):
        train.Dataset.from_numpy(np.zeros(4))
    ds, _, _ = make_ds(ndata=12, shard=2)
    ctx = pc.Context()
    xb, yb = ctx.new_tensor(pc.F32, (3, 4)), ctx.new_tensor(pc.F32, (2, 4))
    with pytest.raises(InvalidArgument, match="past the end"):
        ds.get_batch(xb, yb, 3)
    with pytest.raises(ShapeMismatch, match="whole shards"):
        ds.get_batch(ctx.new_tensor(pc.F32, (3, 3)), ctx.new_tensor(pc.F32, (2, 3)), 0)  # 1.5 shards
    with pytest.raises(ShapeMismatch, match="labels batch"):
        ds.get_batch(xb, ctx.new_tensor(pc.F32, (2, 2)), 0)
    with pytest.raises(InvalidArgument, match="no labels batch"):
        ds.get_batch(xb, None, 0)
    with pytest.raises(TypeMismatch):
        ds.get_batch(ctx.new_tensor(pc.F16, (3, 4)), yb, 0)
    with pytest.raises(InvalidArgument, match="contiguous"):
        ds.get_batch(pc.transpose(ctx.new_tensor(pc.F32, (4, 3))), yb, 0)
    with pytest.raises(InvalidArgument, match="ibatch"):
        ds.get_batch(xb, yb, -1)
    with pytest.raises(InvalidArgument, match="multiple of ndata_shard"):
        ds.shuffle(train.MT19937(), 3)
    with pytest.raises(InvalidArgument, match="exceeds"):
        ds.shuffle(train.MT19937(), 14)
    with pytest.raises(InvalidArgument, match="MT19937"):
        ds.shuffle(np.random.default_rng(0))
    nolab, _, _ = make_ds(ndata=4, nlabel=0)
    with pytest.raises(InvalidArgument, match="no labels"):
        nolab.get_batch(ctx.new_tensor(pc.F32, (3, 2)), ctx.new_tensor(pc.F32, (2, 2)), 0)


# ------------------------------------------------------------------- optimizer contexts
def linear_ctx(nin=3, nout=1, batch=4, loss="mean_squared_error", optimizer="sgd", opt_period=1, pars=None,
               seed=0, **kw):
    ctx = pc.Context()
    x = ctx.new_tensor(pc.F32, (nin, batch), "x")
    w = ctx.new_tensor(pc.F32, (nin, nout), "w").set_param()
    b = ctx.new_tensor(pc.F32, (nout, 1), "b").set_param()
    w.set(np.random.default_rng(seed).normal(0, 0.5, (nout, nin)).reshape(w.shape))
    out = pc.add(pc.mul_mat(w, x), b)
    opt = train.OptContext(ctx, x, out, loss, optimizer, opt_period, get_opt_pars=pars, backend=BACKEND, **kw)
    return opt, x, w, b, out


@pytest.mark.parametrize("loss", ["mean", "sum", "cross_entropy", "mean_squared_error"])
@pytest.mark.parametrize("period", [1, 3])
def test_loss_construction_and_scaling(loss, period):
    opt, x, w, b, out = linear_ctx(nin=3, nout=4, batch=5, loss=loss, opt_period=period)
    rng = np.random.default_rng(1)
    xv = rng.normal(size=(5, 3)).astype(np.float32)
    x.set(xv)
    y = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 5)]
    if opt.labels is not None:
        opt.labels.set(y)
    else:
        assert loss in ("mean", "sum")
    res = train.Result()
    opt.alloc(False)
    opt.eval(res)
    o = xv @ w.numpy().T + b.numpy().reshape(1, -1)
    logp = o - np.log(np.exp(o).sum(1, keepdims=True))
    expected = {"mean": o.sum() / (period * o.size), "sum": o.sum(),
                "cross_entropy": -(y * logp).sum() / 5 / period,
                "mean_squared_error": ((o - y) ** 2).sum() / (period * o.size)}[loss]
    assert float(opt.loss.numpy()[0]) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert opt.loss.flags & pc.Flag.LOSS and opt.loss.flags & pc.Flag.OUTPUT
    assert opt.loss_per_datapoint == (loss != "sum")
    # the result undoes the 1/opt_period scaling of per-datapoint losses
    assert res.loss()[0] == pytest.approx(expected * (period if loss != "sum" else 1), rel=1e-5, abs=1e-6)
    if loss == "cross_entropy":
        np.testing.assert_array_equal(opt.pred.numpy(), o.argmax(1))
        assert res.ncorrect == int((o.argmax(1) == y.argmax(1)).sum())
        np.testing.assert_array_equal(res.pred(), o.argmax(1))
    else:
        assert opt.pred is None and math.isnan(res.accuracy()[0])


def test_sgd_and_adamw_single_steps_by_hand():
    for optimizer in ("sgd", "adamw"):
        pars = train.OptimizerParams(adamw=train.AdamWParams(alpha=0.01, wd=0.1), sgd=train.SGDParams(0.1, wd=0.2))
        opt, x, w, b, out = linear_ctx(batch=4, loss="mean_squared_error", optimizer=optimizer, pars=pars)
        rng = np.random.default_rng(2)
        xv = rng.normal(size=(4, 3)).astype(np.float32)
        yv = rng.normal(size=(4, 1)).astype(np.float32)
        x.set(xv)
        opt.labels.set(yv)
        w0, b0 = w.numpy().reshape(1, 3).astype(np.float64), b.numpy().reshape(1, 1).astype(np.float64)
        err = xv @ w0.T + b0.reshape(1, -1) - yv
        gw = (2 * err.T @ xv / err.size).reshape(w0.shape)
        gb = (2 * err.sum(0) / err.size).reshape(b0.shape)
        opt.alloc(True)
        opt.eval()
        assert opt.iter == 2
        np.testing.assert_allclose(opt.grad(w).numpy().reshape(1, 3), gw, rtol=1e-5, atol=1e-7)
        if optimizer == "sgd":
            ew, eb = w0 * (1 - 0.1 * 0.2) - 0.1 * gw, b0 * (1 - 0.1 * 0.2) - 0.1 * gb
        else:  # first AdamW step: m^ = g, v^ = g^2
            ew = w0 * (1 - 0.01 * 0.1) - 0.01 * gw / (np.abs(gw) + 1e-8)
            eb = b0 * (1 - 0.01 * 0.1) - 0.01 * gb / (np.abs(gb) + 1e-8)
            np.testing.assert_allclose(opt.grad_m[w].numpy().reshape(1, 3), 0.1 * gw, rtol=1e-5)
            np.testing.assert_allclose(opt.opt_step_params.numpy(),
                                       [0.01, 0.9, 0.999, 1e-8, 0.1, 1 / (1 - 0.9), 1 / (1 - 0.999)], rtol=1e-4)
        np.testing.assert_allclose(w.numpy().reshape(1, 3), ew, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b.numpy().reshape(1, 1), eb, rtol=1e-5, atol=1e-7)


def _regression_data(n=64, d=3, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = (X @ np.array([1.5, -2.0, 0.5]) + 0.3 + rng.normal(0, 0.1, n)).astype(np.float32)[:, None]
    A = np.hstack([X, np.ones((n, 1))]).astype(np.float64)
    return X, y, np.linalg.lstsq(A, y.astype(np.float64), rcond=None)[0].ravel()


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_linear_regression_converges_to_least_squares(optimizer):
    X, y, solution = _regression_data()
    ctx = pc.Context()
    x = ctx.new_tensor(pc.F32, (3, 16), "x")
    w = ctx.new_tensor(pc.F32, (3, 1), "w").set_param()
    b = ctx.new_tensor(pc.F32, (1, 1), "b").set_param()
    out = pc.add(pc.mul_mat(w, x), b)
    ds = train.Dataset.from_numpy(X, y)
    seen = []

    def schedule(epoch):  # per-epoch parameters; full-batch steps (64 = 4 physical batches of 16)
        seen.append(epoch)
        return train.OptimizerParams(adamw=train.AdamWParams(alpha=0.1 * 0.98 ** epoch),
                                     sgd=train.SGDParams(alpha=0.2))

    nepoch = 150 if optimizer == "sgd" else 300
    res = train.fit(ctx, x, out, ds, "mean_squared_error", optimizer, schedule, nepoch=nepoch, nbatch_logical=64,
                    backend=BACKEND)
    got = np.r_[w.numpy().ravel(), b.numpy().ravel()]
    np.testing.assert_allclose(got, solution, atol=1e-4 if optimizer == "sgd" else 1e-2)
    assert sorted(set(seen)) == list(range(1, nepoch + 1))
    assert res.opt_ctx.iter == nepoch + 1 and res.opt_ctx.opt_period == 4
    assert len(res.history) == nepoch
    resid = np.hstack([X, np.ones((64, 1))]) @ solution - y.ravel()
    assert res.result_train.loss()[0] == pytest.approx(float((resid ** 2).mean()), rel=0.05)


def mlp(batch, loss, optimizer, seed=3, nin=4, nhidden=5, nout=3):
    ctx = pc.Context()
    rng = np.random.default_rng(seed)
    x = ctx.new_tensor(pc.F32, (nin, batch), "x")
    w1 = ctx.new_tensor(pc.F32, (nin, nhidden), "w1").set_param()
    b1 = ctx.new_tensor(pc.F32, (nhidden, 1), "b1").set_param()
    w2 = ctx.new_tensor(pc.F32, (nhidden, nout), "w2").set_param()
    b2 = ctx.new_tensor(pc.F32, (nout, 1), "b2").set_param()
    for p in (w1, b1, w2, b2):
        p.set(rng.normal(0, 0.7, p.shape))
    h = pc.relu(pc.add(pc.mul_mat(w1, x), b1))
    out = pc.add(pc.mul_mat(w2, h), b2)
    return ctx, x, out, (w1, b1, w2, b2)


@pytest.mark.parametrize("loss,optimizer", [("cross_entropy", "sgd"), ("mean_squared_error", "sgd"),
                                            ("mean", "sgd"), ("cross_entropy", "adamw")])
def test_accumulating_k_physical_batches_equals_one_logical_batch(loss, optimizer):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(32, 4)).astype(np.float32)
    Y = None if loss == "mean" else np.eye(3, dtype=np.float32)[rng.integers(0, 3, 32)]
    pars = train.OptimizerParams(adamw=train.AdamWParams(alpha=0.05), sgd=train.SGDParams(alpha=0.5))
    final, losses = [], []
    for physical in (4, 16):  # 2 optimizer steps of 16 points: opt_period 4 vs 1
        ctx, x, out, params = mlp(physical, loss, optimizer)
        ds = train.Dataset.from_numpy(X, Y)
        res = train.fit(ctx, x, out, ds, loss, optimizer, pars, nepoch=1, nbatch_logical=16, backend=BACKEND)
        assert res.opt_ctx.opt_period == 16 // physical and res.opt_ctx.iter == 3
        final.append([p.numpy() for p in params])
        losses.append(res.result_train.loss()[0])
    assert not np.allclose(final[0][0], mlp(4, loss, optimizer)[3][0].numpy())  # training moved the weights
    for a, b in zip(*final):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # the same data seen in both runs, the per-datapoint loss rescaled by opt_period
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_gradient_accumulators_and_reset():
    opt, x, w, b, out = linear_ctx(batch=2, opt_period=2, pars=train.OptimizerParams(sgd=train.SGDParams(0.1)))
    acc = opt.grad_acc(w)
    assert acc is not None and opt.gb_grad.grad_acc(w) is acc
    rng = np.random.default_rng(5)
    x.set(rng.normal(size=(2, 3)))
    opt.labels.set(rng.normal(size=(2, 1)))
    w0 = w.numpy()
    opt.alloc(True)
    assert opt.build_type == train.BuildType.GRAD
    opt.eval()
    g1 = acc.numpy().copy()
    assert np.any(g1 != 0) and opt.iter == 1 and opt.opt_i == 1
    np.testing.assert_array_equal(w.numpy(), w0)  # no step yet
    opt.alloc(True)
    assert opt.build_type == train.BuildType.OPT
    opt.eval()
    np.testing.assert_allclose(acc.numpy(), 2 * g1, rtol=1e-6)  # same batch twice: summed
    np.testing.assert_allclose(w.numpy(), w0 - 0.1 * 2 * g1, rtol=1e-5, atol=1e-7)
    assert opt.iter == 2 and opt.opt_i == 0
    opt.alloc(True)  # a new logical batch starts: accumulators zeroed first
    opt.eval()
    np.testing.assert_allclose(acc.numpy(), opt.grad(w).numpy())
    opt.reset(optimizer=False)
    assert not acc.numpy().any()
    assert float(opt.gb_grad.grad_acc(opt.loss).numpy()[0]) == 1.0


def test_reset_optimizer_zeroes_moments_and_iter():
    opt, x, w, b, out = linear_ctx(optimizer="adamw")
    x.set(np.ones((4, 3)))
    opt.labels.set(np.ones((4, 1)) * 5)
    for _ in range(3):
        opt.alloc(True)
        opt.eval()
    assert opt.iter == 4 and opt.grad_m[w].numpy().any() and opt.grad_v[w].numpy().any()
    opt.reset(optimizer=True)
    assert opt.iter == 1 and not opt.grad_m[w].numpy().any() and not opt.grad_v[w].numpy().any()


@pytest.mark.parametrize("bad", [
    dict(alpha=0.0), dict(alpha=-1.0), dict(alpha=math.nan), dict(alpha=math.inf), dict(beta1=1.0),
    dict(beta2=-0.1), dict(eps=-1e-8), dict(wd=1.5), dict(wd=-0.1), dict(beta1="0.9")])
def test_bad_adamw_params_raise_before_any_compute(bad):
    opt, x, w, b, out = linear_ctx(optimizer="adamw",
                                   pars=lambda ud: train.OptimizerParams(adamw=train.AdamWParams(**bad)))
    w0 = w.numpy()
    opt.alloc(True)
    with pytest.raises(InvalidArgument, match="adamw"):
        opt.eval()
    np.testing.assert_array_equal(w.numpy(), w0)
    with pytest.raises(InvalidArgument):
        train.constant_optimizer_params(train.OptimizerParams(adamw=train.AdamWParams(**bad)))


def test_bad_sgd_params_and_callbacks():
    for bad in (dict(alpha=0.0), dict(wd=2.0), dict(alpha=math.nan)):
        with pytest.raises(InvalidArgument, match="sgd"):
            train.validate_optimizer_params(train.OptimizerParams(sgd=train.SGDParams(**bad)), train.OptimizerType.SGD)
    opt = linear_ctx(pars=lambda ud: {"alpha": 0.1})[0]
    opt.alloc(True)
    with pytest.raises(InvalidArgument, match="OptimizerParams"):
        opt.eval()
    with pytest.raises(InvalidArgument, match="get_opt_pars"):
        linear_ctx(pars=42)


def test_opt_context_errors_leave_the_context_unchanged():
    ctx = pc.Context()
    x = ctx.new_tensor(pc.F32, (3, 4), "x")
    w = ctx.new_tensor(pc.F32, (3, 2), "w")  # not a parameter
    out = pc.mul_mat(w, x)
    n = len(ctx.tensors)
    with pytest.raises(InvalidArgument, match="no parameters"):
        train.OptContext(ctx, x, out, "mean", "sgd", backend=BACKEND)
    assert len(ctx.tensors) == n
    w.set_param()
    with pytest.raises(InvalidArgument, match="loss type"):
        train.OptContext(ctx, x, out, "hinge", "sgd", backend=BACKEND)
    with pytest.raises(InvalidArgument, match="optimizer type"):
        train.OptContext(ctx, x, out, "mean", "lbfgs", backend=BACKEND)
    with pytest.raises(InvalidArgument, match="opt_period"):
        train.OptContext(ctx, x, out, "mean", "sgd", 0, backend=BACKEND)
    with pytest.raises(InvalidArgument, match="another context"):
        train.OptContext(pc.Context(), x, out, "mean", "sgd", backend=BACKEND)
    with pytest.raises(pc.UnknownBackend):
        train.OptContext(ctx, x, out, "mean", "sgd", backend="no_such_backend")
    assert len(ctx.tensors) == n
    opt = train.OptContext(ctx, x, out, "mean", "sgd", backend=BACKEND)
    with pytest.raises(InvalidArgument, match="alloc"):
        opt.eval()
    opt.alloc(False)
    with pytest.raises(InvalidArgument, match="not followed by eval"):
        opt.alloc(False)
    fwd = train.OptContext(ctx, x, pc.scale(out, 2.0), "sum", "sgd", build_type="forward", backend=BACKEND)
    with pytest.raises(InvalidArgument, match="build_type"):
        fwd.alloc(True)
    fwd.alloc(False)
    fwd.eval()


# -------------------------------------------------------------------------------- metrics
def test_result_formulas_on_hand_made_values():
    r = train.Result()
    assert r.loss()[0] == 0.0 and math.isnan(r.loss()[1]) and math.isnan(r.accuracy()[0])
    for v, c in zip([1.0, 2.0, 3.0, 4.0], [10, 5, 8, 7]):
        r.add_batch(v, 10, ncorrect=c, pred=np.arange(10) % 3)
    var = 7.5 - 2.5 ** 2
    assert r.loss() == pytest.approx((2.5, math.sqrt(var / 3)))
    assert r.accuracy() == pytest.approx((0.75, math.sqrt(0.75 * 0.25 / 39)))
    assert r.ndata == 40 and r.pred().shape == (40,)
    s = train.Result()
    for v in [1.0, 2.0, 3.0, 4.0]:
        s.add_batch(v, 5, loss_per_datapoint=False)
    assert s.loss() == pytest.approx((10.0, math.sqrt(var * 4 / 3)))
    assert math.isnan(s.accuracy()[0]) and math.isnan(s.accuracy()[1]) and s.ncorrect == -1
    p = train.Result()
    for v in [0.5, 1.0]:  # per-datapoint losses scaled by 1/opt_period in the graph
        p.add_batch(v, 4, ncorrect=2, opt_period=2)
    assert p.loss() == pytest.approx((1.5, math.sqrt((2.5 - 1.5 ** 2) / 1)))  # values 1, 2
    one = train.Result()
    one.add_batch(0.3, 1, ncorrect=1)
    assert one.loss()[0] == pytest.approx(0.3) and math.isnan(one.loss()[1])
    assert one.accuracy()[0] == 1.0 and math.isnan(one.accuracy()[1])
    with pytest.raises(InvalidArgument, match="varying batch size"):
        r.add_batch(1.0, 3, ncorrect=1)
    with pytest.raises(InvalidArgument, match="opt_period"):
        r.add_batch(1.0, 10, ncorrect=1, opt_period=2)
    with pytest.raises(InvalidArgument, match="ndata"):
        r.add_batch(1.0, 0)
    r.reset()
    assert r.ndata == 0 and r.nbatches == 0 and r.ncorrect == 0 and r.pred().size == 0


# ------------------------------------------------------------------------- fit / epoch
def _blobs(n=96, seed=6):
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 3, n)
    centers = np.array([[2.0, 0.0, 0, 0], [-1.0, 1.7, 0, 0], [-1.0, -1.7, 0, 0]])
    X = (centers[c] + rng.normal(0, 0.5, (n, 4))).astype(np.float32)
    return X, np.eye(3, dtype=np.float32)[c]


def test_fit_classification_progress_and_callbacks():
    X, Y = _blobs()
    ctx, x, out, params = mlp(8, "cross_entropy", "adamw")
    ds = train.Dataset.from_numpy(X, Y)
    calls = []
    stream = io.StringIO()
    res = train.fit(ctx, x, out, ds, "cross_entropy", "adamw",
                    lambda ep: train.OptimizerParams(adamw=train.AdamWParams(alpha=0.05)), nepoch=3,
                    nbatch_logical=16, val_split=0.25, backend=BACKEND, progress=True, stream=stream,
                    callback=lambda *a: calls.append((a[0], a[4], a[5])))
    # 96 points, 6 logical batches of 16: floor(0.75 * 6) = 4 train (8 physical of 8), 2 val (4 physical)
    assert [c for c in calls if c[0]][:8] == [(True, i, 8) for i in range(1, 9)]
    assert [c for c in calls if not c[0]][:4] == [(False, i, 4) for i in range(1, 5)]
    assert len(calls) == 3 * 12
    assert res.result_train.ndata == 64 and res.result_val.ndata == 32
    assert res.history[-1].val_accuracy[0] >= 0.9
    assert res.result_val.accuracy() == res.history[-1].val_accuracy
    text = stream.getvalue()
    assert text.startswith("fit: epoch 0001/0003:\ntrain: [")
    assert "val:   [" in text and "data=0000064/0000064" in text and text.rstrip().split("\n")[-1].startswith(
        "fit: training took 00:00:")
    for quiet in (dict(silent=True, progress=True), dict()):  # StringIO is not a terminal
        s = io.StringIO()
        ctx, x, out, _ = mlp(8, "cross_entropy", "adamw")
        train.fit(ctx, x, out, train.Dataset.from_numpy(X, Y), "cross_entropy", nepoch=1, backend=BACKEND,
                  stream=s, **quiet)
        assert s.getvalue() == ""


def test_progress_bar_format():
    assert bar(0, 8) == " " * 8
    assert bar(8, 8) == "\u2588" * 7 + "\u2589"  # ggml's strict comparison never fills the last cell
    assert bar(1, 16) == "\u258d" + " " * 7  # 1/16 of the data is half a cell, drawn as 3/8 (strict <)
    assert hms(3_723_000_000) == "01:02:03"
    line = train.progress_line(True, 32, (0.123456, 0.01), (0.5, 0.02), 2, 4, 0, now_us=4_000_000)
    assert line == ("train: [\u2588\u2588\u2588\u2589    ] data=0000064/0000128 loss=0.12346\u00b10.01000 "
                    "acc=50.00\u00b12.00% t=00:00:04 ETA=00:00:04 \r")
    assert train.progress_line(False, 1, (0, 0), (0, 0), 3, 3, 0, now_us=0).endswith(" \r\n")


def test_fit_schedule_errors():
    X, Y = _blobs(n=96)

    def go(**kw):
        ctx, x, out, _ = mlp(8, "cross_entropy", "sgd")
        args = dict(nepoch=1, backend=BACKEND)
        args.update(kw)
        data = args.pop("data", (X, Y))
        return train.fit(ctx, x, out, train.Dataset.from_numpy(*data), args.pop("loss", "cross_entropy"), "sgd",
                         **args)

    with pytest.raises(InvalidArgument, match="multiple of the physical"):
        go(nbatch_logical=12)
    with pytest.raises(InvalidArgument, match="multiple of nbatch_logical"):
        go(nbatch_logical=64)
    for bad in (1.0, -0.1, math.nan, "0.2"):
        with pytest.raises(InvalidArgument, match="val_split"):
            go(val_split=bad)
    with pytest.raises(InvalidArgument, match="no training batch"):
        go(nbatch_logical=48, val_split=0.6)
    with pytest.raises(InvalidArgument, match="nepoch"):
        go(nepoch=0)
    with pytest.raises(ShapeMismatch, match="datapoints have 5"):
        go(data=(np.zeros((96, 5), np.float32), Y))
    with pytest.raises(InvalidArgument, match="takes no labels"):
        go(loss="mean")
    with pytest.raises(InvalidArgument, match="needs labels"):
        go(data=(X,))
    with pytest.raises(InvalidArgument, match="get_opt_pars"):
        go(get_opt_pars="fast")
    with pytest.raises(InvalidArgument, match="learning rate"):
        go(get_opt_pars=train.OptimizerParams(sgd=train.SGDParams(alpha=-1.0)), nbatch_logical=8)
    ctx, x, out, _ = mlp(8, "cross_entropy", "sgd")
    opt = train.OptContext(ctx, x, out, "cross_entropy", "sgd", backend=BACKEND)
    with pytest.raises(InvalidArgument, match="idata_split"):
        train.epoch(opt, train.Dataset.from_numpy(X, Y), idata_split=12)
    with pytest.raises(InvalidArgument, match="multiple of the physical batch"):
        train.epoch(opt, train.Dataset.from_numpy(X[:90], Y[:90]))


def test_failed_build_restores_flags():
    ctx = pc.Context()
    x = ctx.new_tensor(pc.F32, (3, 4), "x")
    out = pc.mul_mat(ctx.new_tensor(pc.F32, (3, 2)), x)
    with pytest.raises(InvalidArgument):
        train.OptContext(ctx, x, out, "cross_entropy", "adamw", backend=BACKEND)
    assert x.flags == 0 and out.flags == 0


def test_fit_shuffles_like_ggml_opt_fit():
    X, y, _ = _regression_data(n=32)
    opt, x, w, b, out = linear_ctx(batch=4)
    ds = train.Dataset.from_numpy(X, y)
    ctx = x.ctx
    res = train.fit(ctx, x, out, ds, "mean_squared_error", "sgd", train.OptimizerParams(sgd=train.SGDParams(0.01)),
                    nepoch=2, nbatch_logical=8, val_split=0.25, backend=BACKEND)
    # all 32 points once, then the training part (floor(0.75 * 4) * 8 = 24 points) every epoch
    rng, p = train.MT19937(), list(range(32))
    train.shuffle(p, rng)
    val_points = p[24:]
    train.shuffle(p, rng, 0, 24)
    train.shuffle(p, rng, 0, 24)
    assert ds.permutation.tolist() == p and p[24:] == val_points
    assert res.result_train.ndata == 24 and res.result_val.ndata == 8
    assert res.opt_ctx.iter == 1 + 2 * 3 and res.opt_ctx.opt_period == 2


# ------------------------------------------------------------------ input checks (issue 18)
def test_partial_trailing_shard_is_accepted_unused_and_named():
    """ggml's dataset: nshards = ndata / ndata_shard (truncated), shard bytes = nbytes * shard / ndata,
    so points past the last whole shard are never copied into a batch."""
    data = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    labels = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)
    with pytest.warns(PrismWarning, match=r"datapoints 8..9 \(2 of them\) form a partial shard that no batch uses"):
        ds = train.Dataset.from_numpy(data, labels, 4)
    assert ds.nshards == 2 and ds.nbs_data == 4 * 3 * 4
    ctx = pc.Context()
    xb, yb = ctx.new_tensor(pc.F32, (3, 8)), ctx.new_tensor(pc.F32, (2, 8))
    ds.get_batch(xb, yb, 0)
    np.testing.assert_array_equal(xb.numpy(), data[:8])
    np.testing.assert_array_equal(yb.numpy(), labels[:8])
    ds.permutation[:] = [1, 0]
    ds.get_batch(xb, yb, 0)
    np.testing.assert_array_equal(xb.numpy(), np.concatenate([data[4:8], data[0:4]]))
    with pytest.raises(InvalidArgument, match="past the end"):
        ds.get_batch(ctx.new_tensor(pc.F32, (3, 4)), ctx.new_tensor(pc.F32, (2, 4)), 2)
    with pytest.warns(PrismWarning, match=r"datapoint 6 \(1 of them\)"):
        train.Dataset(3, 1, 7, 2)


@pytest.mark.parametrize("corrupt, match", [
    (lambda X, Y: Y.__setitem__((5, 0), -0.5), r"labels of datapoint 5 are not a probability distribution: -0.5 < 0"),
    (lambda X, Y: Y.__setitem__((7, 1), np.nan), r"labels of datapoint 7 holds NaN or infinity"),
    (lambda X, Y: Y.__setitem__(11, [0.5, 0.25, 0.0]), r"labels of datapoint 11 sum to 0.75, not 1"),
    (lambda X, Y: X.__setitem__((3, 2), np.inf), r"data of datapoint 3 holds NaN or infinity \(1 datapoints do\)"),
], ids=["negative-label", "nan-label", "labels-not-summing-to-1", "infinite-data"])
def test_fit_refuses_data_the_loss_cannot_use(corrupt, match):
    X, Y = _blobs(n=96)
    X, Y = X.astype(np.float32).copy(), Y.astype(np.float32).copy()
    corrupt(X, Y)
    ctx, x, out, _ = mlp(8, "cross_entropy", "sgd")
    before = (len(ctx.tensors), ctx.used)
    with pytest.raises(InvalidArgument, match=match):
        train.fit(ctx, x, out, train.Dataset.from_numpy(X, Y), "cross_entropy", "sgd", nepoch=1, backend=BACKEND)
    assert (len(ctx.tensors), ctx.used) == before
    if "data of" not in match:  # the documented switch: unchecked, the same data trains (to whatever end)
        ctx, x, out, _ = mlp(8, "cross_entropy", "sgd")
        train.fit(ctx, x, out, train.Dataset.from_numpy(X, Y), "cross_entropy", "sgd", nepoch=1, backend=BACKEND,
                  check_data=False)


def test_non_probability_labels_are_fine_for_other_losses():
    ds = train.Dataset.from_numpy(np.ones((4, 2), np.float32), np.full((4, 3), -2.0, np.float32))
    ds.check(probabilities=False)
    with pytest.raises(InvalidArgument, match="datapoint 0 are not a probability"):
        ds.check(probabilities=True)


@pytest.mark.parametrize("how", ["callback-raises", "datapoint-width", "labels-missing"])
def test_a_fit_failing_on_its_first_batch_leaves_no_orphan_tensors(how):
    X, Y = _blobs(n=96)
    ctx, x, out, _ = mlp(8, "cross_entropy", "sgd")
    before = (list(ctx.tensors), ctx.used, x.flags, out.flags)

    def boom(*args):
        raise RuntimeError("stop after the first batch")

    data = {"callback-raises": (X, Y), "datapoint-width": (np.zeros((96, 5), np.float32), Y),
            "labels-missing": (X,)}[how]
    with pytest.raises((RuntimeError, InvalidArgument, ShapeMismatch)):
        train.fit(ctx, x, out, train.Dataset.from_numpy(*data), "cross_entropy", "sgd", nepoch=1, backend=BACKEND,
                  callback=boom)
    assert (list(ctx.tensors), ctx.used, x.flags, out.flags) == before
    res = train.fit(ctx, x, out, train.Dataset.from_numpy(X, Y), "cross_entropy", "sgd", nepoch=1, backend=BACKEND)
    assert res.history  # the same context trains afterwards
