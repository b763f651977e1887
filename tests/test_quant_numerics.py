"""The float32 building blocks of prism_core.quant against C semantics worked out by hand."""

from __future__ import annotations

import numpy as np

from prism_core.quant.iquants import KVALUES_IQ4NL
from prism_core.quant.numerics import Int8Table, nearest_int, nearest_small, select, seq_sum, signed_absmax

F32 = np.float32


def test_seq_sum_adds_in_order_like_a_c_loop_not_pairwise():
    rng = np.random.default_rng(0)
    t = (rng.standard_normal((32, 4000)) * 10.0 ** rng.uniform(-8, 8, (32, 4000))).astype(F32)
    loop = np.zeros(4000, F32)
    for row in t:
        loop += row  # one float32 rounding per step, in index order
    assert (seq_sum(t).view(np.uint32) == loop.view(np.uint32)).all()
    pairwise = t.T.copy().sum(axis=1)  # NumPy's contiguous-axis sum: pairwise, rounds differently
    assert (pairwise.view(np.uint32) != loop.view(np.uint32)).any()
    # the C loop starts from +0.0: a sum of -0.0 terms is +0.0
    assert not np.signbit(seq_sum(-np.zeros((4, 1), F32))).any()
    assert seq_sum(np.array([[1e8], [1.0], [-1e8]], F32))[0] == 0.0  # 1e8 + 1 rounds back to 1e8 first


def test_nearest_int_rounds_ties_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999998, 3.5000002, 4194303.0], F32)
    want = [0, 2, 2, 0, -2, -2, 2, 4, 4194303]
    assert nearest_int(x).tolist() == want
    assert nearest_small(x[:-1]).tolist() == want[:-1]


def test_select_is_np_where_bit_for_bit():
    rng = np.random.default_rng(1)
    a = np.array([-0.0, np.nan, 1.5, np.inf, -3.0], F32)
    b = np.array([0.0, 2.0, -np.nan, -1.0, 7.0], F32)
    cond = np.array([True, False, True, False, True])
    assert (select(cond, a, b).view(np.uint32) == np.where(cond, a, b).view(np.uint32)).all()
    i = rng.integers(-100, 100, (3, 5)).astype(np.int32)
    assert (select(cond, 0, i) == np.where(cond, 0, i)).all()  # scalar side, broadcast condition


def test_best_index_int8_ties_go_up_and_ends_clamp():
    table = Int8Table(KVALUES_IQ4NL)
    # -10 and 1 are neighbours: -4.5 is halfway (tie → upper, 8), a hair less goes to -10 (7)
    x = np.array([-4.5, np.nextafter(F32(-4.5), F32(-10)), -127.0, -300.0, 113.0, 500.0, 0.0, 101.0, 100.99], F32)
    idx, val = table.best_index(x)
    assert idx.tolist() == [8, 7, 0, 0, 15, 15, 8, 15, 14]
    assert val.tolist() == [float(KVALUES_IQ4NL[i]) for i in idx]


def test_best_index_int8_sends_nan_to_the_last_entry():
    """ggml's best_index_int8 on a NaN: `x <= val[0]` and `x >= val[n-1]` are false, the bisection's
    `x < val[mav]` is false every time (ml climbs to n-2, mu stays n-1), and the final
    `x - val[mu-1] < val[mu] - x` is false: index n-1. (A NaN comes from 0·inf or inf/inf in the scale
    searches of huge inputs.)"""
    idx, val = Int8Table(KVALUES_IQ4NL).best_index(np.array([np.nan, -np.nan, 0.0], F32))
    assert idx.tolist() == [15, 15, 8] and val.tolist() == [113.0, 113.0, 1.0]
    idx, val = Int8Table(np.array([-3, 0, 5], np.int8)).best_index(np.array([np.nan], F32))
    assert idx.tolist() == [2] and val.tolist() == [5.0]


def test_signed_absmax_scans_past_nan_as_ggml():
    """ggml's `amax = 0, max = 0; if (fabsf(x) > amax) {amax = fabsf(x); max = x;}` never takes a NaN (the
    comparison is false), keeps the first of equal magnitudes, and leaves (0, 0) when nothing is larger."""
    cols = np.array([[1.0, np.nan, np.nan, 2.0, np.nan],
                     [np.nan, -4.0, np.nan, -2.0, 0.0],
                     [-3.0, 4.0, np.nan, np.inf, np.nan],
                     [2.0, np.nan, np.nan, 1.0, 0.0]], F32)
    amax, vmax = signed_absmax(cols)
    assert amax.tolist() == [3.0, 4.0, 0.0, np.inf, 0.0]
    assert vmax.tolist() == [-3.0, -4.0, 0.0, np.inf, 0.0]
    assert not np.signbit(vmax[2])
