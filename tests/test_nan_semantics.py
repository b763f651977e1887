"""Where IEEE leaves the result open (NaN operands, the sign of a zero), every backend gives what
ggml's CPU expressions give. Expected values are worked out by hand from those C expressions
(src/ggml-cpu/vec.h, unary-ops.cpp, ops.cpp), with comparisons involving NaN false:

    sgn:          x > 0 ? 1 : (x < 0 ? -1 : 0)            NaN -> 0, -0.0 -> +0.0
    relu:         x > 0 ? x : 0                            NaN -> 0, -0.0 -> +0.0
    leaky_relu:   (x > 0 ? x : 0) + ns * (x < 0 ? x : 0)   NaN -> +0.0, -0.0 -> +0.0
    hardsigmoid:  fminf(1, fmaxf(0, (x + 3) / 6))          NaN -> 0
    clamp:        MAX(MIN(x, max), min), MIN(a,b) = a < b ? a : b, MAX(a,b) = a > b ? a : b: NaN -> max
    elu:          x > 0 ? x : expm1f(x)                    -0.0 -> -0.0
    round:        roundf                                   -0.4 -> -0.0
    scale:        x * s when b == 0 (ggml skips the bias)  -0.0 * 2 -> -0.0
    argmax:       max = MAX(max, x[i]); if (max == x[i]) idx = i, from max = -inf, idx = 0
    max pool:     res = std::max(v, res) = v < res ? res : v, from -FLT_MAX, padding skipped
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import prism_core as pc

BACKENDS = [b.name for b in pc.backends() if b.available]
NAN = float("nan")
FLT_MAX = float(np.finfo(np.float32).max)


def run_on(backend: str, build) -> np.ndarray:
    ctx = pc.Context()
    out = build(ctx)
    pc.compute(out, backend)
    return out.numpy()


def same(got, expected) -> None:
    """Equal values, NaN where expected, and zeros of the expected sign."""
    got = np.asarray(got, np.float64).reshape(-1)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got.tolist(), expected)):
        if e is None:  # a value libm may round either way: not what this checks
            continue
        if math.isnan(e):
            assert math.isnan(g), (i, g, e)
        else:
            assert g == e and math.copysign(1, g) == math.copysign(1, e), (i, g, e)


X = [NAN, -0.0, 0.0, 2.0, -2.0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op, params, expected", [
    ("SGN", {}, [0.0, 0.0, 0.0, 1.0, -1.0]),
    ("RELU", {}, [0.0, 0.0, 0.0, 2.0, 0.0]),
    ("LEAKY_RELU", {"negative_slope": 0.5}, [0.0, 0.0, 0.0, 2.0, -1.0]),
    ("LEAKY_RELU", {"negative_slope": -0.5}, [0.0, 0.0, 0.0, 2.0, 1.0]),
    ("HARDSIGMOID", {}, [0.0, 0.5, 0.5, 5.0 / 6.0, 1.0 / 6.0]),
    ("CLAMP", {"min": -1.0, "max": 1.5}, [1.5, -0.0, 0.0, 1.5, -1.0]),
    ("ELU", {}, [NAN, -0.0, 0.0, 2.0, None]),
    ("SCALE", {"s": 2.0}, [NAN, -0.0, 0.0, 4.0, -4.0]),
    ("SCALE", {"s": 2.0, "b": 1.0}, [NAN, 1.0, 1.0, 5.0, -3.0]),
    ("ABS", {}, [NAN, 0.0, 0.0, 2.0, 2.0]),
    ("NEG", {}, [NAN, 0.0, -0.0, -2.0, 2.0]),
])
def test_unary_nan_and_signed_zero(backend, op, params, expected):
    got = run_on(backend, lambda c: pc.node(op, c.from_numpy(np.array(X, np.float32)), **params))
    if op == "HARDSIGMOID":
        expected = [float(np.float32(v)) for v in expected]
    same(got, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_keeps_the_sign_of_zero(backend):
    x = [-0.4, -0.0, 0.4, -0.5, 0.5, -2.5, NAN]
    same(run_on(backend, lambda c: pc.round(c.from_numpy(np.array(x, np.float32)))),
         [-0.0, -0.0, 0.0, -1.0, 1.0, -3.0, NAN])


@pytest.mark.parametrize("backend", BACKENDS)
def test_argmax_follows_ggmls_loop_on_nan(backend):
    rows = [[NAN, 1, 5, 2, 0],     # the NaN never takes the index; 5 is the max after it
            [1, 5, NAN, 2, 0],     # after the NaN, max = 2 (the next element), then 0 < 2
            [1, 5, 3, 2, NAN],     # a trailing NaN leaves idx at 1
            [NAN] * 5,             # nothing ever equals the running max: idx stays 0
            [3, NAN, NAN, 1, 2],   # max NaN twice, then 1 takes it, then 2 > 1
            [-0.0, 0.0, -0.0, -1, -2],  # +-0 compare equal: the last zero
            [-math.inf] * 5]       # MAX(-inf, -inf) == -inf: the last one
    expected = [2, 3, 1, 0, 4, 2, 4]
    got = run_on(backend, lambda c: pc.argmax(c.from_numpy(np.array(rows, np.float32))))
    assert got.tolist() == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_argmax_of_empty_rows_is_zero(backend):
    got = run_on(backend, lambda c: pc.argmax(c.new_tensor(pc.F32, (0, 3))))
    assert got.tolist() == [0, 0, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool_1d_follows_std_max_on_nan(backend):
    # windows of 2 with stride 1 and padding 1: [pad, x0], [x0, x1], ..., [x4, pad]
    x = [NAN, 1.0, NAN, -math.inf, 2.0]
    got = run_on(backend, lambda c: pc.pool_1d(c.from_numpy(np.array([x], np.float32)), "MAX", 2, 1, 1))
    # [pad, NaN]: NaN; [NaN, 1]: 1; [1, NaN]: NaN; [NaN, -inf]: -inf; [-inf, 2]: 2; [2, pad]: 2
    same(got, [NAN, 1.0, NAN, -math.inf, 2.0, 2.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool_2d_all_minus_inf_window_gives_minus_flt_max(backend):
    x = np.full((2, 2), -np.inf, np.float32)
    x[1, 1] = NAN  # the last tap of the only window: res becomes NaN
    got = run_on(backend, lambda c: pc.pool_2d(c.from_numpy(x), "MAX", 2, 2, 2, 2))
    same(got, [NAN])
    x[1, 1] = -np.inf
    same(run_on(backend, lambda c: pc.pool_2d(c.from_numpy(x), "MAX", 2, 2, 2, 2)), [-FLT_MAX])


def test_conformance_compare_checks_nan_both_ways_and_zero_signs():
    from prism_core.conformance.runner import compare
    ok, msg, *_ = compare(np.array([1.0, -0.0]), np.array([1.0, 0.0]), 1e-6)
    assert not ok and "other sign" in msg
    ok, msg, *_ = compare(np.array([1.0, 0.0]), np.array([1.0, NAN]), 1e-6)
    assert not ok and "reference has NaN" in msg
    ok, msg, *_ = compare(np.array([NAN, 0.0]), np.array([1.0, 0.0]), 1e-6)
    assert not ok and "NaN where the reference has a number" in msg
    assert compare(np.array([NAN, -0.0, 2.0]), np.array([NAN, -0.0, 2.0]), 0.0)[0]
