"""Independent checks of the NumPy reference backend: element-wise ops, unary sub-ops,
reductions and normalisations.

Every expectation is written here, from ggml's documented semantics
(/work/shared/reference/ggml-semantics.md sections 2.1-2.3): hand-worked numbers, or a
scalar loop / plain formula that does not share code or structure with
``backends/prism_numpy/kernels.py``. Nothing here calls the kernels' helpers.

Sibling files: test_reference_matrix.py (matrices, indexing, regions, copies and views),
test_reference_softmax_loss.py (masks, softmax, losses, optimizer steps) and
test_reference_more_ops.py (GLU sub-ops, concat, diag, padding, arange, timestep
embedding, argsort, l2/group norm). The last test of this file checks that all of them
together verify every key of the op table.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import pathlib

import numpy as np
import pytest
from helpers import full, round_sig, run, verifier

import prism_core as pc
from prism_core import BF16, F16, F32, I32, I64

VERIFIED, verifies = verifier()  # op-table keys this module checks




SIG_BITS = {F32: 24, F16: 11, BF16: 8}
HOST_NAME = {F32: "f32", F16: "f16", BF16: "bf16"}


def test_round_sig_helper_on_hand_values():
    # the helper itself, on values whose roundings are known by hand
    assert round_sig(1 + 2 ** -11, 11) == 1.0  # tie, 1.0 is even
    assert round_sig(1 + 3 * 2 ** -11, 11) == 1 + 2 ** -9  # tie, 1+2^-10 is odd
    assert round_sig(2049.0, 11) == 2048.0
    assert round_sig(2051.0, 11) == 2052.0
    assert round_sig(1 + 2 ** -8, 8) == 1.0
    assert round_sig(1 + 3 * 2 ** -8, 8) == 1.015625
    assert round_sig(-259.0, 8) == -260.0
    assert round_sig(0.1, 24) == float(np.float32(0.1))


# ---------------------------------------------------------------- binary ops
BIN_F = {"ADD": lambda x, y: x + y, "SUB": lambda x, y: x - y,
         "MUL": lambda x, y: x * y, "DIV": lambda x, y: x / y}
BUILD = {"ADD": pc.add, "SUB": pc.sub, "MUL": pc.mul, "DIV": pc.div}
BUILD_INPLACE = {"ADD": pc.add_inplace, "SUB": pc.sub_inplace, "MUL": pc.mul_inplace, "DIV": pc.div_inplace}


def _grid_values(rng: np.random.Generator, shape, nonzero=False) -> np.ndarray:
    """Multiples of 1/8 in [-4, 4]: exact in f32, f16 and bf16 (at most 6 significant bits)."""
    k = rng.integers(-32, 33, size=shape)
    if nonzero:
        k = np.where(k == 0, 5, k)
    return (k / 8).astype(np.float32)


@verifies("ADD", "SUB", "MUL", "DIV")
@pytest.mark.parametrize("key", list(BIN_F))
@pytest.mark.parametrize("ta,tb", [(F32, F32), (F16, F16), (BF16, BF16), (F16, F32), (BF16, F32), (F32, F16)])
def test_binary_modulo_broadcast(key, ta, tb):
    rng = np.random.default_rng(7)
    a_np = _grid_values(rng, (3, 2, 4, 6))  # ne = [6, 4, 2, 3]
    b_np = _grid_values(rng, (3, 1, 2, 3), nonzero=True)  # ne = [3, 2, 1, 3]
    ctx = pc.Context()
    a, b = ctx.from_numpy(a_np, type=ta), ctx.from_numpy(b_np, type=tb)
    assert np.array_equal(full(a), a_np) and np.array_equal(full(b), b_np)  # inputs exact
    y = run(BUILD[key](a, b))
    assert y.type == ta and y.ne == a.ne
    got = full(y)
    B3, B2, B1, B0 = b_np.shape
    for i3, i2, i1, i0 in itertools.product(*(range(n) for n in a_np.shape)):
        x, z = float(a_np[i3, i2, i1, i0]), float(b_np[i3 % B3, i2 % B2, i1 % B1, i0 % B0])
        want = round_sig(BIN_F[key](x, z), SIG_BITS[ta])
        assert got[i3, i2, i1, i0] == want, (key, (i0, i1, i2, i3), x, z, got[i3, i2, i1, i0], want)


def test_binary_broadcast_is_modulo_not_block():
    # a row of 4 plus b of 2: b is repeated [b0, b1, b0, b1], not stretched [b0, b0, b1, b1]
    ctx = pc.Context()
    a = ctx.from_numpy(np.zeros(4, np.float32))
    b = ctx.from_numpy(np.array([1, 2], np.float32))
    assert run(pc.add(a, b)).numpy().tolist() == [1, 2, 1, 2]
    a2 = ctx.from_numpy(np.zeros((4, 1), np.float32))  # ne = [1, 4]: broadcast over dim 1
    b2 = ctx.from_numpy(np.array([[10], [20]], np.float32))
    assert run(pc.add(a2, b2)).numpy().tolist() == [[10], [20], [10], [20]]


@verifies("ADD", "MUL", "SUB", "DIV")
@pytest.mark.parametrize("t,cases", [
    # F16 has 11 significant bits: ulp(1) = 2^-10, ulp(2048) = 2
    (F16, [("ADD", 1.0, 2 ** -11, 1.0),  # exact tie -> even (1.0)
           ("ADD", 1 + 2 ** -10, 2 ** -11, 1 + 2 ** -9),  # tie, 1+2^-10 odd -> up
           ("ADD", 2048.0, 1.0, 2048.0), ("ADD", 2050.0, 1.0, 2052.0),
           ("SUB", 2048.0, -1.0, 2048.0), ("MUL", 1 + 2 ** -10, 1 + 2 ** -10, 1 + 2 ** -9),
           ("DIV", 1.0, 3.0, 0.333251953125)]),  # 1/3 = 0.0101010101 01|01..b -> 683/2048
    # BF16 has 8 significant bits: ulp(1) = 2^-7, ulp(256) = 2
    (BF16, [("ADD", 1.0, 2 ** -8, 1.0), ("ADD", 1 + 2 ** -7, 2 ** -8, 1 + 2 ** -6),
            ("ADD", 256.0, 1.0, 256.0), ("ADD", 258.0, 1.0, 260.0),
            ("MUL", 1 + 2 ** -7, 1 + 2 ** -7, 1 + 2 ** -6),  # 1 + 2^-6 + 2^-14 -> down
            ("DIV", 1.0, 3.0, 0.333984375)]),  # 171/512
])
def test_binary_half_precision_rounds_to_nearest_even(t, cases):
    ctx = pc.Context()
    for key, x, z, want in cases:
        a = ctx.from_numpy(np.array([x], np.float32), type=t)
        b = ctx.from_numpy(np.array([z], np.float32), type=t)
        y = run(BUILD[key](a, b))
        assert y.type == t
        assert float(y.numpy()[0]) == want, (t, key, x, z, float(y.numpy()[0]), want)


@verifies("ADD", "SUB", "MUL", "DIV")
@pytest.mark.parametrize("key", list(BIN_F))
def test_binary_inplace_writes_into_a(key):
    ctx = pc.Context()
    a_np = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    a = ctx.from_numpy(a_np)
    b = ctx.from_numpy(np.array([2, 4, 8], np.float32))
    y = BUILD_INPLACE[key](a, b)
    assert y.view_src is a
    run(y)
    want = [[BIN_F[key](float(a_np[r, c]), [2, 4, 8][c]) for c in range(3)] for r in range(2)]
    assert a.numpy().tolist() == want
    assert y.numpy().tolist() == want


@verifies("ADD", "SUB", "NEG", "VIEW", "TRANSPOSE")
def test_binary_reads_strided_views():
    # b is a view with a row gap (rows of 2 taken from rows of 3)
    ctx = pc.Context()
    big = ctx.from_numpy(np.array([[1, 2, 99], [3, 4, 99]], np.float32))
    b = pc.view_2d(big, 2, 2, big.nb[1])
    a = ctx.from_numpy(np.array([[10, 20], [30, 40]], np.float32))
    assert run(pc.add(a, b)).numpy().tolist() == [[11, 22], [33, 44]]
    # a transposed a: the result is contiguous with a's logical values
    t = pc.transpose(a)  # logical [[10, 30], [20, 40]]
    y = run(pc.sub(t, b))
    assert y.is_contiguous() and y.numpy().tolist() == [[9, 28], [17, 36]]
    # a unary op on a transposed view
    assert run(pc.neg(t)).numpy().tolist() == [[-10, -30], [-20, -40]]


@verifies("ADD1")
def test_add1():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, -2], [3.5, 0]], np.float32))
    b = ctx.from_numpy(np.array([0.25], np.float32))
    assert run(pc.add1(a, b)).numpy().tolist() == [[1.25, -1.75], [3.75, 0.25]]
    # F16: 2048 + 0.5 -> 2048 (below the half-way point 2049), 1 + 0.5 exact
    h = ctx.from_numpy(np.array([1, 2048], np.float32), type=F16)
    y = run(pc.add1(h, b))
    assert y.type == F16 and y.numpy().tolist() == [1.25, 2048.0]
    ip = pc.add1_inplace(a, b)
    run(ip)
    assert ip.view_src is a and a.numpy().tolist() == [[1.25, -1.75], [3.75, 0.25]]


# ---------------------------------------------------------------- unary ops
def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _gelu_f16_table(x: float, fn, clamp: bool) -> float:
    """ggml's CPU GELU of an F32 value: the function (here in float64) at x rounded to F16, rounded
    to F16 (the tanh form: 0 for x <= -10, x itself for x >= 10); NumPy's float16 rounds to even."""
    if clamp and x <= -10:
        return 0.0
    if clamp and x >= 10:
        return x
    return float(np.float16(fn(float(np.float16(x)))))


UNARY_REF = {
    "ABS": abs,
    "SGN": lambda x: 1.0 if x > 0 else (-1.0 if x < 0 else 0.0),
    "NEG": lambda x: -x,
    "STEP": lambda x: 1.0 if x > 0 else 0.0,
    "TANH": math.tanh,
    "ELU": lambda x: x if x > 0 else math.expm1(x),
    "RELU": lambda x: x if x > 0 else 0.0,
    "SIGMOID": _sig,
    "GELU": lambda x: _gelu_f16_table(x, lambda h: 0.5 * h * (1 + math.tanh(math.sqrt(2 / math.pi) * h
                                                                              * (1 + 0.044715 * h * h))), clamp=True),
    "GELU_QUICK": lambda x: _gelu_f16_table(x, lambda h: h * _sig(1.702 * h), clamp=False),
    "SILU": lambda x: x * _sig(x),
    "HARDSWISH": lambda x: x * min(max((x + 3) / 6, 0.0), 1.0),
    "HARDSIGMOID": lambda x: min(max((x + 3) / 6, 0.0), 1.0),
    "EXP": math.exp,
    "EXPM1": math.expm1,
    "SOFTPLUS": lambda x: x if x > 20 else math.log(1 + math.exp(x)),
    "GELU_ERF": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "FLOOR": math.floor,
    "CEIL": math.ceil,
    "ROUND": lambda x: math.copysign(math.floor(abs(x) + 0.5), x),
    "TRUNC": math.trunc,
    "SQR": lambda x: x * x,
    "SIN": math.sin,
    "COS": math.cos,
}
UNARY_KEYS = [u.name for u in pc.UnaryOp if u.name != "XIELU"]
assert set(UNARY_KEYS) <= set(UNARY_REF)
XS = np.array([-4, -3, -2.5, -1, -0.3, -1e-3, 0, 1e-3, 0.3, 0.5, 1, 2.5, 4, 19.5, 20.5, 25],
              np.float32)


@verifies(*UNARY_KEYS, "SQR", "SIN", "COS")
@pytest.mark.parametrize("key", UNARY_KEYS + ["SQR", "SIN", "COS"])
def test_unary_formula(key):
    xs = XS[XS < 10] if key in ("EXP", "EXPM1") else XS  # keep exp in a comfortable f32 range
    ctx = pc.Context()
    a = ctx.from_numpy(xs.reshape(2, -1) if xs.size % 2 == 0 else xs)
    y = run(pc.unary(a, key) if key in UNARY_KEYS else pc.node(key, a))
    assert y.type == F32 and y.ne == a.ne
    want = np.array([UNARY_REF[key](float(x)) for x in xs], np.float64)
    got = y.numpy().reshape(-1)
    if key in ("GELU", "GELU_QUICK"):  # table values: F16 numbers, which ggml computes in float32 steps
        # (1 + tanh(...) cancels in the negative tail: |error| up to 2e-7 there, not a relative one)
        inside = xs < 10 if key == "GELU" else np.ones(xs.shape, bool)
        assert (got[inside] == got[inside].astype(np.float16)).all(), got
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-7)
        return
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-30)


@verifies("SQRT", "LOG")
def test_sqrt_log_positive_inputs():
    xs = np.array([1e-3, 0.25, 1, 2, 10, 1e6], np.float32)
    ctx = pc.Context()
    a = ctx.from_numpy(xs)
    np.testing.assert_allclose(run(pc.sqrt(a)).numpy(), [math.sqrt(float(x)) for x in xs], rtol=2e-7)
    np.testing.assert_allclose(run(pc.log(a)).numpy(), [math.log(float(x)) for x in xs], rtol=2e-7, atol=1e-30)
    assert run(pc.sqrt(ctx.from_numpy(np.array([4, 0.25, 0], np.float32)))).numpy().tolist() == [2, 0.5, 0]
    assert run(pc.log(ctx.from_numpy(np.array([1.0], np.float32)))).numpy().tolist() == [0.0]


@verifies("ROUND", "FLOOR", "CEIL", "TRUNC", "ABS", "SGN", "NEG", "STEP", "RELU")
def test_rounding_and_sign_ops_hand_table():
    xs = [-2.5, -1.5, -0.5, -0.4, 0.0, 0.4, 0.5, 1.5, 2.5, 2.6]
    table = {  # ROUND is half away from zero (C roundf), not NumPy's half-to-even
        "ROUND": [-3, -2, -1, -0.0, 0, 0, 1, 2, 3, 3],
        "FLOOR": [-3, -2, -1, -1, 0, 0, 0, 1, 2, 2],
        "CEIL": [-2, -1, -0.0, -0.0, 0, 1, 1, 2, 3, 3],
        "TRUNC": [-2, -1, -0.0, -0.0, 0, 0, 0, 1, 2, 2],
        "ABS": [2.5, 1.5, 0.5, 0.4, 0, 0.4, 0.5, 1.5, 2.5, 2.6],
        "SGN": [-1, -1, -1, -1, 0, 1, 1, 1, 1, 1],
        "NEG": [2.5, 1.5, 0.5, 0.4, 0, -0.4, -0.5, -1.5, -2.5, -2.6],
        "STEP": [0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
        "RELU": [0, 0, 0, 0, 0, 0.4, 0.5, 1.5, 2.5, 2.6],
    }
    ctx = pc.Context()
    a = ctx.from_numpy(np.array(xs, np.float32))
    for key, want in table.items():
        got = run(pc.unary(a, key)).numpy()
        assert np.array_equal(got, np.array(want, np.float32)), (key, got.tolist())


@verifies("HARDSWISH", "HARDSIGMOID", "ELU", "SOFTPLUS", "SIGMOID", "SILU")
def test_piecewise_unary_hand_values():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([-4, -3, -1.5, 0, 1, 3, 3.5], np.float32))
    assert run(pc.hardsigmoid(a)).numpy().tolist() == pytest.approx([0, 0, 0.25, 0.5, 4 / 6, 1, 1])
    assert run(pc.hardswish(a)).numpy().tolist() == pytest.approx([0, 0, -0.375, 0, 4 / 6, 3, 3.5])
    assert run(pc.sigmoid(a)).numpy()[3] == 0.5
    assert run(pc.silu(a)).numpy()[3] == 0.0
    e = ctx.from_numpy(np.array([-1, 0, 2], np.float32))
    assert run(pc.elu(e)).numpy().tolist() == pytest.approx([math.e ** -1 - 1, 0, 2])
    # above 20 softplus is x itself, also where ln(1 + e^x) would overflow
    sp = ctx.from_numpy(np.array([0, 25, 100, 1000], np.float32))
    assert run(pc.softplus(sp)).numpy().tolist() == pytest.approx([math.log(2), 25, 100, 1000], rel=1e-7)


@verifies("ABS", "EXP", "NEG")
@pytest.mark.parametrize("key", ["ABS", "EXP", "NEG"])
def test_unary_inplace_aliases_a(key):
    ctx = pc.Context()
    xs = [-1.0, 0.5, 2.0]
    a = ctx.from_numpy(np.array(xs, np.float32))
    y = pc.unary(a, key, inplace=True)
    assert y.view_src is a
    run(y)
    np.testing.assert_allclose(a.numpy(), [UNARY_REF[key](x) for x in xs], rtol=2e-7)


@verifies("SQR", "SQRT", "NEG", "ABS")
@pytest.mark.parametrize("t", [F16, BF16])
def test_unary_half_types_round_once(t):
    ctx = pc.Context()
    xs = [2.0, 3.0, 0.25, 1 + 2 ** -7, 100.0]  # exact in both f16 and bf16
    a = ctx.from_numpy(np.array(xs, np.float32), type=t)
    bits = SIG_BITS[t]
    for build, f in ((pc.sqr, lambda x: x * x), (pc.sqrt, math.sqrt), (pc.neg, lambda x: -x), (pc.abs, abs)):
        y = run(build(a))
        assert y.type == t
        assert y.numpy().tolist() == [round_sig(f(x), bits) for x in xs], build.__name__


@verifies("XIELU")
def test_xielu_with_its_four_params():
    alpha_n, alpha_p, beta, eps = 0.3, 1.2, 0.25, -1e-3

    def softplus(z):
        return z if z > 20 else math.log(1 + math.exp(z))

    an = beta + softplus(alpha_n)
    ap = softplus(alpha_p)

    def ref(x):
        if x > 0:
            return ap * x * x + beta * x
        return (math.expm1(min(x, eps)) - x) * an + beta * x

    xs = np.array([-3, -1, -1e-4, 0, 1e-4, 0.5, 2], np.float32)
    ctx = pc.Context()
    a = ctx.from_numpy(xs)
    y = run(pc.xielu(a, alpha_n=alpha_n, alpha_p=alpha_p, beta=beta, eps=eps))
    want = [ref(float(x)) for x in xs]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-12)
    # at x = 0 the eps clamp matters: (expm1(eps) - 0) * an, not 0
    assert y.numpy()[3] == pytest.approx(math.expm1(eps) * an, rel=1e-6)
    # defaults (0.8, 0.8, 0.5, -1e-6)
    d = run(pc.xielu(ctx.from_numpy(np.array([2.0], np.float32))))
    assert d.numpy()[0] == pytest.approx(math.log(1 + math.exp(0.8)) * 4 + 0.5 * 2, rel=1e-6)


@verifies("SCALE")
def test_scale_and_scale_bias():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, -2], [0.5, 4]], np.float32))
    assert run(pc.scale(a, 2.5)).numpy().tolist() == [[2.5, -5], [1.25, 10]]
    assert run(pc.scale_bias(a, 2.5, -1.0)).numpy().tolist() == [[1.5, -6], [0.25, 9]]
    ip = pc.scale_inplace(a, -2.0)
    run(ip)
    assert ip.view_src is a and a.numpy().tolist() == [[-2, 4], [-1, -8]]


@verifies("CLAMP")
def test_clamp():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([-2, -0.5, 0, 0.7, 3], np.float32))
    assert run(pc.clamp(a, -1.0, 0.5)).numpy().tolist() == [-1, -0.5, 0, 0.5, 0.5]
    assert a.numpy().tolist() == pytest.approx([-2, -0.5, 0, 0.7, 3])  # not in place
    ip = pc.clamp_inplace(a, 0.0, 1.0)
    run(ip)
    assert ip.view_src is a and a.numpy().tolist() == pytest.approx([0, 0, 0, 0.7, 1])


@verifies("LEAKY_RELU")
def test_leaky_relu():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([-2, -0.5, 0, 0.75, 3], np.float32))
    assert run(pc.leaky_relu(a, 0.25)).numpy().tolist() == [-0.5, -0.125, 0, 0.75, 3]
    ip = pc.leaky_relu(a, 0.5, inplace=True)
    run(ip)
    assert ip.view_src is a and a.numpy().tolist() == [-1, -0.25, 0, 0.75, 3]


@verifies("SILU_BACK")
def test_silu_back_matches_finite_difference():
    def silu(x):
        return x / (1 + math.exp(-x))

    xs = np.array([-4, -1.3, -0.2, 0, 0.4, 1.7, 5], np.float32)
    gs = np.array([1, 0.5, -2, 3, 1.5, -0.25, 2], np.float32)
    ctx = pc.Context()
    y = run(pc.silu_back(ctx.from_numpy(gs), ctx.from_numpy(xs)))
    h = 1e-6
    want = [float(g) * (silu(float(x) + h) - silu(float(x) - h)) / (2 * h) for g, x in zip(gs, xs)]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- reductions
@verifies("SUM", "SUM_ROWS", "MEAN")
def test_sum_sum_rows_mean_hand():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2, 3], [4, 5, 9]], np.float32))
    s = run(pc.sum(a))
    assert s.ne == (1, 1, 1, 1) and s.type == F32 and s.numpy().tolist() == [24]
    r = run(pc.sum_rows(a))
    assert r.ne == (1, 2, 1, 1) and r.numpy().tolist() == [[6], [18]]
    m = run(pc.mean(a))  # per row, not global
    assert m.ne == (1, 2, 1, 1) and m.type == F32 and m.numpy().tolist() == [[2], [6]]


@verifies("SUM", "SUM_ROWS", "MEAN")
def test_reductions_4d_loops():
    rng = np.random.default_rng(3)
    x = _grid_values(rng, (2, 3, 4, 5))
    ctx = pc.Context()
    a = ctx.from_numpy(x)
    total, rows, means = 0.0, np.zeros((2, 3, 4, 1)), np.zeros((2, 3, 4, 1))
    for i3, i2, i1 in itertools.product(range(2), range(3), range(4)):
        acc = 0.0
        for i0 in range(5):
            acc += float(x[i3, i2, i1, i0])
        rows[i3, i2, i1, 0], means[i3, i2, i1, 0] = acc, acc / 5
        total += acc
    assert run(pc.sum(a)).numpy().tolist() == [total]
    assert np.array_equal(full(run(pc.sum_rows(a))), rows)
    np.testing.assert_allclose(full(run(pc.mean(a))), means, rtol=2e-7)


@verifies("SUM", "MEAN", "SUM_ROWS")
def test_reductions_half_types():
    ctx = pc.Context()
    # f16: 1025.75 is between 1025 and 1026 (ulp 1 at 1024) -> 1026
    h = ctx.from_numpy(np.array([0.5, 0.25, 1024, 1], np.float32), type=F16)
    s = run(pc.sum(h))
    assert s.type == F16 and s.numpy().tolist() == [1026.0]
    m = run(pc.mean(h))
    assert m.type == F32 and m.numpy().tolist() == [1025.75 / 4]
    # bf16: 257.5 -> 258 (ulp 2 at 256)
    b = ctx.from_numpy(np.array([[256, 1, 0.5], [1, 2, 4]], np.float32), type=BF16)
    sr = run(pc.sum_rows(b))
    assert sr.type == BF16 and sr.numpy().tolist() == [[258.0], [7.0]]


@verifies("ARGMAX")
def test_argmax_last_index_wins_on_ties():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 3, 3, 2], [5, 5, 5, 5], [-1, -2, -7, -1], [0, 9, -9, 8]], np.float32))
    y = run(pc.argmax(a))
    assert y.type == I32 and y.ne == (4, 1, 1, 1)
    assert y.numpy().tolist() == [2, 3, 3, 1]


@verifies("COUNT_EQUAL")
def test_count_equal():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2, 3], [4, 5, 6]], np.int32))
    b = ctx.from_numpy(np.array([[1, 0, 3], [4, 5, -6]], np.int32))
    y = run(pc.count_equal(a, b))
    assert y.type == I64 and y.ne == (1, 1, 1, 1) and y.numpy().tolist() == [4]


@verifies("REPEAT")
@pytest.mark.parametrize("t", [F32, F16, BF16, I32])
def test_repeat_tiles_by_modulo(t):
    small = np.array([[[1, 2, 3], [4, 5, 6]]], np.float32)  # ne = [3, 2, 1]
    ctx = pc.Context()
    a = ctx.from_numpy(small.astype(np.int32) if t == I32 else small, type=t)
    b = ctx.new_tensor(F32, (6, 4, 2, 2))  # only its shape is read
    y = run(pc.repeat(a, b))
    assert y.type == t and y.ne == (6, 4, 2, 2)
    got = full(y)
    for i3, i2, i1, i0 in itertools.product(range(2), range(2), range(4), range(6)):
        assert got[i3, i2, i1, i0] == small[0, i1 % 2, i0 % 3]
    assert full(y)[0, 0, 0].tolist() == [1, 2, 3, 1, 2, 3]


@verifies("REPEAT_BACK")
def test_repeat_back_sums_tiles():
    rng = np.random.default_rng(11)
    big = _grid_values(rng, (2, 2, 4, 6))  # ne = [6, 4, 2, 2]
    ctx = pc.Context()
    a = ctx.from_numpy(big)
    b = ctx.new_tensor(F32, (3, 2, 1, 2))
    y = run(pc.repeat_back(a, b))
    assert y.ne == (3, 2, 1, 2)
    want = np.zeros((2, 1, 2, 3))
    for i3, i2, i1, i0 in itertools.product(range(2), range(2), range(4), range(6)):
        want[i3 % 2, i2 % 1, i1 % 2, i0 % 3] += big[i3, i2, i1, i0]
    assert np.array_equal(full(y), want)
    # hand case: [1, 2, 3, 4] folded to 2 -> [1+3, 2+4]
    v = run(pc.repeat_back(ctx.from_numpy(np.array([1, 2, 3, 4], np.float32)), ctx.new_tensor(F32, (2,))))
    assert v.numpy().tolist() == [4, 6]


# ---------------------------------------------------------------- normalisation
@verifies("NORM")
def test_norm_hand_and_loop():
    ctx = pc.Context()
    # row [1, 3]: mean 2, population variance 1; eps 3 -> (x - 2) / 2
    a = ctx.from_numpy(np.array([[1, 3], [5, 5]], np.float32))
    assert run(pc.norm(a, eps=3.0)).numpy().tolist() == [[-0.5, 0.5], [0, 0]]
    # row [1, 2, 3, 4]: mean 2.5, var 1.25
    r = run(pc.norm(ctx.from_numpy(np.array([1, 2, 3, 4], np.float32))))
    np.testing.assert_allclose(r.numpy(), np.array([-1.5, -0.5, 0.5, 1.5]) / math.sqrt(1.25), rtol=2e-7)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 7)).astype(np.float32)
    y = run(pc.norm(ctx.from_numpy(x), eps=1e-3)).numpy()
    for idx in itertools.product(range(3), range(2)):
        row = [float(v) for v in x[idx]]
        mu = sum(row) / len(row)
        var = sum((v - mu) ** 2 for v in row) / len(row)
        np.testing.assert_allclose(y[idx], [(v - mu) / math.sqrt(var + 1e-3) for v in row], rtol=1e-6, atol=1e-7)


@verifies("RMS_NORM")
def test_rms_norm_hand_and_inplace():
    ctx = pc.Context()
    # [3, 4]: mean square 12.5; + eps 3.5 -> sqrt 16 = 4
    a = ctx.from_numpy(np.array([[3, 4], [-6, 8]], np.float32))
    want = [[0.75, 1.0], [-6 / math.sqrt(53.5), 8 / math.sqrt(53.5)]]
    np.testing.assert_allclose(run(pc.rms_norm(a, eps=3.5)).numpy(), want, rtol=2e-7)
    r = run(pc.rms_norm(ctx.from_numpy(np.array([1, 2, 3, 4], np.float32))))
    np.testing.assert_allclose(r.numpy(), np.array([1, 2, 3, 4]) / math.sqrt(7.5), rtol=2e-7)
    ip = pc.rms_norm(a, eps=3.5, inplace=True)
    run(ip)
    assert ip.view_src is a
    np.testing.assert_allclose(a.numpy(), want, rtol=2e-7)


@verifies("NORM")
def test_norm_inplace():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([1, 3], np.float32))
    ip = pc.norm(a, eps=3.0, inplace=True)
    run(ip)
    assert ip.view_src is a and a.numpy().tolist() == [-0.5, 0.5]


@verifies("RMS_NORM_BACK")
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_rms_norm_back_matches_finite_difference(eps):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    dz = rng.standard_normal((3, 6)).astype(np.float32)
    ctx = pc.Context()
    y = run(pc.rms_norm_back(ctx.from_numpy(dz), ctx.from_numpy(x), eps=eps)).numpy()

    def rms_norm_row(row):  # float64, plain Python
        ms = sum(v * v for v in row) / len(row)
        return [v / math.sqrt(ms + eps) for v in row]

    h = 1e-6
    for r in range(3):
        row = [float(v) for v in x[r]]
        for i in range(6):
            up, dn = list(row), list(row)
            up[i] += h
            dn[i] -= h
            fu, fd = rms_norm_row(up), rms_norm_row(dn)
            grad_i = sum(float(dz[r, j]) * (fu[j] - fd[j]) / (2 * h) for j in range(6))
            assert y[r, i] == pytest.approx(grad_i, rel=1e-5, abs=1e-6), (r, i)


# ---------------------------------------------------------------- coverage
def test_every_op_key_is_verified():
    here = pathlib.Path(__file__)
    keys = set(VERIFIED)
    siblings = sorted(p for p in here.parent.glob("test_reference_*.py") if p != here)
    assert {p.name for p in siblings} >= {"test_reference_matrix.py", "test_reference_softmax_loss.py",
                                          "test_reference_more_ops.py", "test_reference_attn.py",
                                          "test_reference_conv.py"}
    for path in siblings:
        spec = importlib.util.spec_from_file_location(f"_prism_refcov_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        keys |= mod.VERIFIED
    assert keys - set(pc.OPS) == set(), "unknown keys claimed"
    assert set(pc.OPS) - keys == set(), "op-table keys with no independent test"
