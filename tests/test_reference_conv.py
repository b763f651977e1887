"""Independent checks of the NumPy reference backend: IM2COL / IM2COL_BACK, CONV_2D (and
the im2col + mul_mat forms ggml_conv_2d / ggml_conv_1d), CONV_TRANSPOSE_1D, POOL_1D,
POOL_2D / POOL_2D_BACK and UPSCALE, plus the shape/parameter errors of those ops.

Expectations are hand-worked numbers or textbook scalar loops written here from ggml's
documented semantics (/work/shared/reference/ggml-semantics.md 2.3, 3.3); nothing here
calls or mirrors ``backends/prism_numpy/kernels_conv.py``. ggml order: ``ne[0]`` is
innermost, so a NumPy array of shape (ne3, ne2, ne1, ne0) holds element [i0, i1, i2, i3]
at ``arr[i3, i2, i1, i0]``. Inputs are small integers (or multiples of 1/8), so that
sums of products are exact in f32 and the comparisons can be exact.
test_reference_ops.py collects ``VERIFIED`` from this file.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import full, refused, run, verifier

import prism_core as pc
from prism_core import F16, F32, InvalidArgument, ShapeMismatch, TypeMismatch

VERIFIED, verifies = verifier()  # op-table keys this module checks

FLT_MAX = 3.4028234663852886e38


def ints(rng, shape, lo=-3, hi=4):
    return rng.integers(lo, hi, size=shape).astype(np.float32)


def out_size(n, k, s, p, d):
    # ggml_calc_conv_output_size, with C division (all our cases have a non-negative numerator)
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


# ---------------------------------------------------------------- IM2COL
IM2COL_2D = [  # (W, H, IC, N), (KW, KH), s0, s1, p0, p1, d0, d1
    ((6, 5, 2, 2), (3, 2), 1, 1, 0, 0, 1, 1),
    ((6, 5, 2, 1), (3, 3), 1, 1, 1, 1, 1, 1),
    ((7, 6, 3, 2), (2, 3), 2, 1, 1, 2, 1, 2),
    ((8, 4, 1, 1), (3, 1), 3, 2, 2, 0, 2, 1),
]


def im2col_2d_loop(x, kw_n, kh_n, s0, s1, p0, p1, d0, d1):
    """x: (N, IC, H, W) -> (N, OH, OW, IC*KH*KW), the textbook patch extraction."""
    n_b, ic_n, h, w = x.shape
    oh_n, ow_n = out_size(h, kh_n, s1, p1, d1), out_size(w, kw_n, s0, p0, d0)
    out = np.zeros((n_b, oh_n, ow_n, ic_n * kh_n * kw_n), np.float32)
    for n, oh, ow, ic, kh, kw in itertools.product(range(n_b), range(oh_n), range(ow_n), range(ic_n),
                                                   range(kh_n), range(kw_n)):
        iy, ix = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
        if 0 <= iy < h and 0 <= ix < w:
            out[n, oh, ow, ic * kh_n * kw_n + kh * kw_n + kw] = x[n, ic, iy, ix]
    return out


@verifies("IM2COL")
@pytest.mark.parametrize("case", IM2COL_2D)
@pytest.mark.parametrize("dst", [F32, F16])
def test_im2col_2d_matches_patch_loop(case, dst):
    (w, h, ic, n), (kw, kh), s0, s1, p0, p1, d0, d1 = case
    rng = np.random.default_rng(1)
    x_np = ints(rng, (n, ic, h, w))
    ctx = pc.Context()
    k = ctx.new_tensor(F16, (kw, kh, ic, 5))  # only its shape is read
    y = run(pc.im2col(k, ctx.from_numpy(x_np), s0, s1, p0, p1, d0, d1, True, dst))
    want = im2col_2d_loop(x_np, kw, kh, s0, s1, p0, p1, d0, d1)
    assert y.type == dst
    assert y.ne == (ic * kh * kw, want.shape[2], want.shape[1], n)
    assert np.array_equal(full(y).astype(np.float32), want)


@verifies("IM2COL")
def test_im2col_hand_worked_2d():
    # 3x3 image 1..9 (row = dim 1), 2x2 kernel, padding 1, stride 2 -> 2x2 outputs;
    # columns are (kh, kw) = (0,0), (0,1), (1,0), (1,1)
    ctx = pc.Context()
    x = ctx.from_numpy(np.arange(1, 10, dtype=np.float32).reshape(3, 3))
    y = run(pc.im2col(ctx.new_tensor(F32, (2, 2)), x, 2, 2, 1, 1, 1, 1))
    assert y.ne == (4, 2, 2, 1)
    assert full(y)[0].tolist() == [[[0, 0, 0, 1], [0, 0, 2, 3]],
                                   [[0, 4, 0, 7], [5, 6, 8, 9]]]


@verifies("IM2COL")
@pytest.mark.parametrize("s0,p0,d0", [(1, 0, 1), (2, 1, 1), (1, 2, 2), (3, 0, 2)])
def test_im2col_1d_matches_patch_loop(s0, p0, d0):
    rng = np.random.default_rng(2)
    length, ic_n, n_b, k_n = 11, 3, 2, 3
    x_np = ints(rng, (n_b, ic_n, length))  # ne = [L, IC, N]
    ctx = pc.Context()
    y = run(pc.im2col(ctx.new_tensor(F16, (k_n, ic_n, 4)), ctx.from_numpy(x_np), s0, 0, p0, 0, d0, 0, False))
    ol = out_size(length, k_n, s0, p0, d0)
    assert y.ne == (ic_n * k_n, ol, n_b, 1) and y.type == F32
    got = full(y)[0]
    for n, o, ic, k in itertools.product(range(n_b), range(ol), range(ic_n), range(k_n)):
        i = o * s0 + k * d0 - p0
        assert got[n, o, ic * k_n + k] == (x_np[n, ic, i] if 0 <= i < length else 0.0)


@verifies("IM2COL")
def test_im2col_reads_a_channel_slice_view():
    rng = np.random.default_rng(3)
    base_np = ints(rng, (2, 4, 5, 6))  # ne = [6, 5, 4, 2]
    ctx = pc.Context()
    base = ctx.from_numpy(base_np)
    x = pc.view_4d(base, 6, 5, 2, 2, base.nb[1], base.nb[2], base.nb[3], base.nb[2])  # channels 1, 2
    assert not x.is_contiguous()
    y = run(pc.im2col(ctx.new_tensor(F32, (3, 3, 2, 1)), x, 1, 2, 1, 0, 1, 1))
    assert np.array_equal(full(y), im2col_2d_loop(base_np[:, 1:3], 3, 3, 1, 2, 1, 0, 1, 1))


@verifies("IM2COL_BACK")
@pytest.mark.parametrize("case", IM2COL_2D)
def test_im2col_back_sums_the_columns_that_read_each_element(case):
    (w, h, ic_n, n_b), (kw_n, kh_n), s0, s1, p0, p1, d0, d1 = case
    oh_n, ow_n = out_size(h, kh_n, s1, p1, d1), out_size(w, kw_n, s0, p0, d0)
    rng = np.random.default_rng(4)
    g_np = ints(rng, (n_b, oh_n, ow_n, ic_n * kh_n * kw_n))
    ctx = pc.Context()
    y = run(pc.im2col_back(ctx.from_numpy(g_np), ctx.new_tensor(F32, (kw_n, kh_n, ic_n, 2)), (w, h, ic_n, n_b),
                           s0, s1, p0, p1, d0, d1))
    want = np.zeros((n_b, ic_n, h, w), np.float32)
    for n, oh, ow, ic, kh, kw in itertools.product(range(n_b), range(oh_n), range(ow_n), range(ic_n),
                                                   range(kh_n), range(kw_n)):
        iy, ix = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
        if 0 <= iy < h and 0 <= ix < w:
            want[n, ic, iy, ix] += g_np[n, oh, ow, ic * kh_n * kw_n + kh * kw_n + kw]
    assert y.type == F32 and y.ne == (w, h, ic_n, n_b)
    assert np.array_equal(full(y), want)


@verifies("IM2COL_BACK")
def test_im2col_back_1d_hand_worked():
    # L = 4, K = 2, stride 1, padding 1: OL = 5 windows (-1,0) (0,1) (1,2) (2,3) (3,4)
    ctx = pc.Context()
    g = ctx.from_numpy(np.array([[10, 1], [20, 2], [30, 3], [40, 4], [50, 5]], np.float32))  # ne [2, 5]
    y = run(pc.im2col_back(g, ctx.new_tensor(F32, (2, 1, 1)), (4, 1, 1, 1), 1, 0, 1, 0, 1, 0, False))
    # x[i] is read by window i (tap 1) and window i+1 (tap 0)
    assert y.numpy().tolist() == [1 + 20, 2 + 30, 3 + 40, 4 + 50]


# ---------------------------------------------------------------- CONV_2D
def conv2d_loop(x, k, s0, s1, p0, p1, d0, d1):
    """x (N, IC, H, W), k (OC, IC, KH, KW) -> (N, OC, OH, OW): the textbook convolution loop."""
    n_b, ic_n, h, w = x.shape
    oc_n, _, kh_n, kw_n = k.shape
    oh_n, ow_n = out_size(h, kh_n, s1, p1, d1), out_size(w, kw_n, s0, p0, d0)
    out = np.zeros((n_b, oc_n, oh_n, ow_n), np.float64)
    for n, oc, oh, ow in itertools.product(range(n_b), range(oc_n), range(oh_n), range(ow_n)):
        acc = 0.0
        for ic, kh, kw in itertools.product(range(ic_n), range(kh_n), range(kw_n)):
            iy, ix = oh * s1 + kh * d1 - p1, ow * s0 + kw * d0 - p0
            if 0 <= iy < h and 0 <= ix < w:
                acc += float(k[oc, ic, kh, kw]) * float(x[n, ic, iy, ix])
        out[n, oc, oh, ow] = acc
    return out


CONV_CASES = [  # (W, H, IC, N), (KW, KH, OC), s0, s1, p0, p1, d0, d1
    ((7, 6, 2, 2), (3, 3, 3), 1, 1, 0, 0, 1, 1),
    ((7, 6, 2, 1), (3, 3, 2), 1, 1, 1, 1, 1, 1),
    ((9, 8, 3, 2), (3, 2, 4), 2, 1, 1, 0, 1, 2),
    ((8, 9, 1, 1), (2, 4, 2), 3, 2, 2, 3, 2, 1),
]


@verifies("CONV_2D")
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_2d_matches_textbook_loop(case):
    (w, h, ic, n), (kw, kh, oc), *p = case
    rng = np.random.default_rng(5)
    x_np, k_np = ints(rng, (n, ic, h, w)), ints(rng, (oc, ic, kh, kw))
    ctx = pc.Context()
    y = run(pc.conv_2d(ctx.from_numpy(k_np), ctx.from_numpy(x_np), *p))
    want = conv2d_loop(x_np, k_np, *p)
    assert y.type == F32 and y.ne == (want.shape[3], want.shape[2], oc, n)
    assert np.array_equal(full(y), want)


@verifies("CONV_2D", "IM2COL")
@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("kt", [F32, F16])
def test_conv_2d_im2col_agrees_with_direct_conv_2d(case, kt):
    (w, h, ic, n), (kw, kh, oc), *p = case
    rng = np.random.default_rng(6)
    x_np, k_np = ints(rng, (n, ic, h, w)), ints(rng, (oc, ic, kh, kw))
    ctx = pc.Context()
    k, x = ctx.from_numpy(k_np, type=kt), ctx.from_numpy(x_np)
    direct = run(pc.conv_2d(k, x, *p))
    composed = run(pc.conv_2d_im2col(k, x, *p))
    assert composed.ne == direct.ne and composed.type == F32
    assert np.array_equal(full(composed), full(direct))  # small integers: both exact
    assert np.array_equal(full(direct), conv2d_loop(x_np, k_np, *p))


@verifies("CONV_2D")
def test_conv_2d_hand_worked_and_result_type():
    # 3x3 image 1..9, 2x2 kernel [[1, 0], [0, -1]] (row = dim 1): out = x[y, x] - x[y+1, x+1]
    ctx = pc.Context()
    x = ctx.from_numpy(np.arange(1, 10, dtype=np.float32).reshape(3, 3), type=F16)
    k = ctx.from_numpy(np.array([[1, 0], [0, -1]], np.float32))
    y = run(pc.conv_2d(k, x))
    assert y.type == F16 and y.ne == (2, 2, 1, 1)  # the input's type
    assert y.numpy().astype(np.float32).tolist() == [[-4, -4], [-4, -4]]
    y = run(pc.conv_2d(k, x, p0=1, p1=1, s0=2, s1=2))  # windows at -1 and 1 in both dims
    assert y.numpy().astype(np.float32).tolist() == [[-1, -3], [-7, 5 - 9]]


@verifies("IM2COL")
@pytest.mark.parametrize("s0,p0,d0", [(1, 0, 1), (2, 1, 1), (1, 2, 2)])
def test_conv_1d_composition_matches_textbook_loop(s0, p0, d0):
    rng = np.random.default_rng(7)
    length, ic_n, n_b, k_n, oc_n = 10, 3, 2, 3, 4
    x_np, k_np = ints(rng, (n_b, ic_n, length)), ints(rng, (oc_n, ic_n, k_n))  # ne [L, IC, N], [K, IC, OC]
    ctx = pc.Context()
    y = run(pc.conv_1d(ctx.from_numpy(k_np), ctx.from_numpy(x_np), s0, p0, d0))
    ol = out_size(length, k_n, s0, p0, d0)
    assert y.ne == (ol, oc_n, n_b, 1)
    got = full(y)[0]
    for n, oc, o in itertools.product(range(n_b), range(oc_n), range(ol)):
        want = sum(float(k_np[oc, ic, k]) * float(x_np[n, ic, o * s0 + k * d0 - p0])
                   for ic in range(ic_n) for k in range(k_n) if 0 <= o * s0 + k * d0 - p0 < length)
        assert got[n, oc, o] == want


# ---------------------------------------------------------------- CONV_TRANSPOSE_1D
@verifies("CONV_TRANSPOSE_1D")
@pytest.mark.parametrize("s0", [1, 2, 3])
@pytest.mark.parametrize("kt", [F32, F16])
def test_conv_transpose_1d_matches_scatter_loop(s0, kt):
    rng = np.random.default_rng(8)
    length, ic_n, k_n, oc_n = 6, 3, 4, 2
    a_np, b_np = ints(rng, (ic_n, oc_n, k_n)), ints(rng, (ic_n, length))  # ne [K, OC, IC], [L, IC]
    ctx = pc.Context()
    y = run(pc.conv_transpose_1d(ctx.from_numpy(a_np, type=kt), ctx.from_numpy(b_np), s0))
    ol = (length - 1) * s0 + k_n
    want = np.zeros((oc_n, ol))
    for l_, k, oc, ic in itertools.product(range(length), range(k_n), range(oc_n), range(ic_n)):
        want[oc, l_ * s0 + k] += float(a_np[ic, oc, k]) * float(b_np[ic, l_])
    assert y.type == F32 and y.ne == (ol, oc_n, 1, 1)
    assert np.array_equal(y.numpy(), want)


@verifies("CONV_TRANSPOSE_1D")
def test_conv_transpose_1d_hand_worked():
    # one channel: b = [1, 2], kernel [1, 10, 100], stride 2 -> [1, 10, 100+2, 20, 200]
    ctx = pc.Context()
    y = run(pc.conv_transpose_1d(ctx.from_numpy(np.array([1, 10, 100], np.float32)),
                                 ctx.from_numpy(np.array([1, 2], np.float32)), 2))
    assert y.numpy().tolist() == [1, 10, 102, 20, 200]


# ---------------------------------------------------------------- POOL_1D
@verifies("POOL_1D")
def test_pool_1d_hand_worked_with_padding():
    # x = 1..5, k = 3, s = 2, p = 1: windows {-1,0,1} {1,2,3} {3,4,5}; out-of-range taps are skipped
    ctx = pc.Context()
    x = ctx.from_numpy(np.array([1, 2, 3, 4, 5], np.float32))
    avg = run(pc.pool_1d(x, "AVG", 3, 2, 1))
    mx = run(pc.pool_1d(x, pc.PoolOp.MAX, 3, 2, 1))
    assert avg.type == F32 and avg.ne == (3, 1, 1, 1)
    assert avg.numpy().tolist() == [1.5, 3.0, 4.5]  # the mean of the valid taps only (ggml HEAD)
    assert mx.numpy().tolist() == [2, 4, 5]
    neg = ctx.from_numpy(np.array([-1, -2, -3, -4, -5], np.float32))
    assert run(pc.pool_1d(neg, "MAX", 3, 2, 1)).numpy().tolist() == [-1, -2, -4]  # padding is not a 0 tap


@verifies("POOL_1D")
@pytest.mark.parametrize("k0,s0,p0", [(1, 1, 0), (2, 2, 0), (3, 1, 2), (4, 3, 1)])
def test_pool_1d_matches_window_loop(k0, s0, p0):
    rng = np.random.default_rng(9)
    x_np = (rng.integers(-40, 40, size=(2, 3, 11)) / 8).astype(np.float32)
    ctx = pc.Context()
    x = ctx.from_numpy(x_np, type=F16)
    mx, avg = run(pc.pool_1d(x, "MAX", k0, s0, p0)), run(pc.pool_1d(x, "AVG", k0, s0, p0))
    ol = (11 + 2 * p0 - k0) // s0 + 1
    assert mx.ne == (ol, 3, 2, 1)
    for i2, i1, o in itertools.product(range(2), range(3), range(ol)):
        taps = [float(x_np[i2, i1, o * s0 - p0 + j]) for j in range(k0) if 0 <= o * s0 - p0 + j < 11]
        assert full(mx)[0, i2, i1, o] == max(taps)
        assert full(avg)[0, i2, i1, o] == pytest.approx(sum(taps) / len(taps), rel=1e-6)


# ---------------------------------------------------------------- POOL_2D
X33 = np.arange(1, 10, dtype=np.float32).reshape(3, 3)  # rows = dim 1


@verifies("POOL_2D")
def test_pool_2d_hand_worked_with_padding():
    # k = 2, s = 2, p = 1 on 3x3: windows cover {-1,0} and {1,2} in each dim
    ctx = pc.Context()
    x = ctx.from_numpy(X33)
    avg = run(pc.pool_2d(x, "AVG", 2, 2, 2, 2, 1, 1))
    assert avg.type == F32 and avg.ne == (2, 2, 1, 1)
    assert avg.numpy().tolist() == [[1 / 4, (2 + 3) / 4], [(4 + 7) / 4, (5 + 6 + 8 + 9) / 4]]  # padding counts
    assert run(pc.pool_2d(x, "MAX", 2, 2, 2, 2, 1, 1)).numpy().tolist() == [[1, 3], [7, 9]]
    neg = ctx.from_numpy(-X33)
    assert run(pc.pool_2d(neg, "MAX", 2, 2, 2, 2, 1, 1)).numpy().tolist() == [[-1, -2], [-4, -5]]


@verifies("POOL_2D")
def test_pool_2d_windows_of_padding_only():
    # k = 1, p = 1: the border windows read no element: MAX keeps ggml's start value -FLT_MAX, AVG gives 0
    ctx = pc.Context()
    x = ctx.from_numpy(X33)
    mx = run(pc.pool_2d(x, "MAX", 1, 1, 1, 1, 1, 1)).numpy()
    avg = run(pc.pool_2d(x, "AVG", 1, 1, 1, 1, 1, 1)).numpy()
    assert mx.shape == (5, 5)
    assert mx[1:4, 1:4].tolist() == X33.tolist() and avg[1:4, 1:4].tolist() == X33.tolist()
    border = np.ones((5, 5), bool)
    border[1:4, 1:4] = False
    assert np.all(mx[border] == np.float32(-FLT_MAX)) and np.all(avg[border] == 0)


def pool2d_loop(x, op, k0, k1, s0, s1, p0, p1):
    h, w = x.shape[-2:]
    oh_n, ow_n = (h + 2 * p1 - k1) // s1 + 1, (w + 2 * p0 - k0) // s0 + 1
    out = np.zeros(x.shape[:-2] + (oh_n, ow_n))
    for lead in itertools.product(*map(range, x.shape[:-2])):
        for oy, ox in itertools.product(range(oh_n), range(ow_n)):
            taps = [float(x[lead + (oy * s1 - p1 + ky, ox * s0 - p0 + kx)])
                    for ky in range(k1) for kx in range(k0)
                    if 0 <= oy * s1 - p1 + ky < h and 0 <= ox * s0 - p0 + kx < w]
            out[lead + (oy, ox)] = max(taps, default=-FLT_MAX) if op == "MAX" else sum(taps) / (k0 * k1)
    return out


@verifies("POOL_2D")
@pytest.mark.parametrize("op", ["MAX", "AVG"])
@pytest.mark.parametrize("k0,k1,s0,s1,p0,p1", [(3, 3, 1, 1, 0, 0), (3, 3, 2, 2, 1, 1), (2, 3, 1, 2, 1, 0),
                                               (3, 1, 2, 1, 0, 1), (4, 2, 3, 2, 2, 1)])
def test_pool_2d_matches_window_loop(op, k0, k1, s0, s1, p0, p1):
    rng = np.random.default_rng(10)
    x_np = ints(rng, (2, 3, 7, 8), -9, 10)
    ctx = pc.Context()
    base = ctx.from_numpy(np.concatenate([x_np, np.zeros((2, 3, 7, 2), np.float32)], axis=3))
    x = pc.view_4d(base, 8, 7, 3, 2, base.nb[1], base.nb[2], base.nb[3], 0)  # rows with a gap
    y = run(pc.pool_2d(x, op, k0, k1, s0, s1, p0, p1))
    want = pool2d_loop(x_np, op, k0, k1, s0, s1, p0, p1)
    assert y.ne == tuple(reversed(want.shape))
    np.testing.assert_allclose(full(y), want, rtol=1e-6)


# ---------------------------------------------------------------- POOL_2D_BACK
@verifies("POOL_2D_BACK")
def test_pool_2d_back_hand_worked():
    ctx = pc.Context()
    af = ctx.from_numpy(np.array([[1, 5, 2], [5, 0, 3], [4, 4, 9]], np.float32))
    g = ctx.from_numpy(np.array([[10, 20], [30, 40]], np.float32))
    # MAX, k = 2, s = 1, p = 0: windows (0,0) {1,5,5,0} -> first 5 (row 0, col 1); (0,1) {5,2,0,3} -> 5 again;
    # (1,0) {5,0,4,4} -> (row 1, col 0); (1,1) {0,3,4,9} -> 9
    mx = run(pc.pool_2d_back(g, af, "MAX", 2, 2, 1, 1, 0, 0))
    assert mx.type == F32 and mx.ne == (3, 3, 1, 1)
    assert mx.numpy().tolist() == [[0, 30, 0], [30, 0, 0], [0, 0, 40]]
    # AVG, k = 2, s = 2, p = 1 (padding counts in the divisor 4): each element is in exactly one window
    avg = run(pc.pool_2d_back(g, af, "AVG", 2, 2, 2, 2, 1, 1))
    assert avg.numpy().tolist() == [[2.5, 5, 5], [7.5, 10, 10], [7.5, 10, 10]]


@verifies("POOL_2D_BACK")
@pytest.mark.parametrize("op", ["MAX", "AVG"])
@pytest.mark.parametrize("k0,k1,s0,s1,p0,p1", [(3, 3, 1, 1, 1, 1), (2, 3, 2, 1, 0, 1), (1, 1, 1, 1, 1, 1)])
def test_pool_2d_back_matches_scatter_loop(op, k0, k1, s0, s1, p0, p1):
    rng = np.random.default_rng(11)
    x_np = ints(rng, (2, 6, 7), -3, 3)  # many ties: the first maximum (row-major scan) takes the gradient
    h, w = 6, 7
    oh_n, ow_n = (h + 2 * p1 - k1) // s1 + 1, (w + 2 * p0 - k0) // s0 + 1
    g_np = ints(rng, (2, oh_n, ow_n), 1, 9)
    ctx = pc.Context()
    y = run(pc.pool_2d_back(ctx.from_numpy(g_np), ctx.from_numpy(x_np), op, k0, k1, s0, s1, p0, p1))
    want = np.zeros((2, h, w))
    for c, oy, ox in itertools.product(range(2), range(oh_n), range(ow_n)):
        taps = [(oy * s1 - p1 + ky, ox * s0 - p0 + kx) for ky in range(k1) for kx in range(k0)
                if 0 <= oy * s1 - p1 + ky < h and 0 <= ox * s0 - p0 + kx < w]
        if op == "AVG":
            for t in taps:
                want[(c,) + t] += g_np[c, oy, ox] / (k0 * k1)
        elif taps:
            best = taps[0]
            for t in taps[1:]:
                if x_np[(c,) + t] > x_np[(c,) + best]:
                    best = t
            want[(c,) + best] += g_np[c, oy, ox]
    np.testing.assert_allclose(full(y)[0], want, rtol=1e-6)


# ---------------------------------------------------------------- UPSCALE
@verifies("UPSCALE")
def test_upscale_nearest_by_hand():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2], [3, 4]], np.float32))
    y = run(pc.upscale(a, 2))
    assert y.type == F32 and y.ne == (4, 4, 1, 1)
    assert y.numpy().tolist() == [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]]
    # ratio 3/2: src index floor(i / 1.5) = 0, 0, 1; rows 2 -> 1: floor(0 / 0.5) = 0
    y = run(pc.upscale_ext(a, 3, 1))
    assert y.ne == (3, 1, 1, 1) and y.numpy().tolist() == [1, 1, 2]
    # dims 2 and 3 too: [1, 1, 2, 1] -> [1, 1, 4, 2] repeats each plane twice, then the whole twice
    b = ctx.from_numpy(np.array([[[[7]], [[8]]]], np.float32))  # ne [1, 1, 2, 1]
    y = run(pc.upscale_ext(b, 1, 1, 4, 2))
    assert y.numpy().reshape(-1).tolist() == [7, 7, 8, 8, 7, 7, 8, 8]


@verifies("UPSCALE")
def test_upscale_nearest_matches_index_loop_for_odd_ratios():
    rng = np.random.default_rng(12)
    x_np = ints(rng, (2, 3, 5, 7))
    ctx = pc.Context()
    y = run(pc.upscale_ext(ctx.from_numpy(x_np), 16, 3, 5, 3))
    src, dst = (7, 5, 3, 2), (16, 3, 5, 3)
    got = full(y)
    for i3, i2, i1, i0 in itertools.product(*(range(n) for n in reversed(dst))):
        j = [math.floor(i * s / d) for i, s, d in zip((i0, i1, i2, i3), src, dst)]  # exact ratios
        assert got[i3, i2, i1, i0] == x_np[j[3], j[2], j[1], j[0]]


@verifies("UPSCALE")
def test_upscale_bilinear_by_hand():
    ctx = pc.Context()
    # 1D: [0, 1] -> 4: sample at (i + 0.5)/2 - 0.5 = -0.25, 0.25, 0.75, 1.25, clamped at the edges
    y = run(pc.upscale_ext(ctx.from_numpy(np.array([0, 1], np.float32)), 4, 1, mode="BILINEAR"))
    assert y.numpy().tolist() == [0, 0.25, 0.75, 1]
    # 2D: [[0, 1], [2, 3]] -> 4x4 is separable: f(x) + 2 f(y) with f = [0, .25, .75, 1]
    y = run(pc.upscale(ctx.from_numpy(np.array([[0, 1], [2, 3]], np.float32)), 2, "BILINEAR"))
    f = [0, 0.25, 0.75, 1]
    assert y.numpy().tolist() == [[fx + 2 * fy for fx in f] for fy in f]
    # align_corners: offset 0 and sf = (3 - 1) / (2 - 1): samples at 0, 0.5, 1
    y = run(pc.upscale_ext(ctx.from_numpy(np.array([2, 4], np.float32)), 3, 1, mode="BILINEAR",
                           align_corners=True))
    assert y.numpy().tolist() == [2, 3, 4]
    # downscale 4 -> 2: samples at 0.5 and 2.5
    y = run(pc.upscale_ext(ctx.from_numpy(np.array([0, 8, 16, 24], np.float32)), 2, 1, mode="BILINEAR"))
    assert y.numpy().tolist() == [4, 20]
    # dims 2, 3 are nearest, not interpolated: planes [1] and [5] -> 3 planes 1, 1, 5
    y = run(pc.upscale_ext(ctx.from_numpy(np.array([[[1]], [[5]]], np.float32)), 1, 1, 3, 1, mode="BILINEAR"))
    assert y.numpy().reshape(-1).tolist() == [1, 1, 5]


@verifies("UPSCALE")
def test_upscale_bilinear_reads_a_permuted_view():
    rng = np.random.default_rng(13)
    m = ints(rng, (4, 3))  # NumPy (4, 3): ne [3, 4]
    ctx = pc.Context()
    t = pc.transpose(ctx.from_numpy(m))  # ne [4, 3], element [i0, i1] = m[i0, i1]
    y = run(pc.upscale_ext(t, 8, 6, mode="BILINEAR"))
    want = run(pc.upscale_ext(ctx.from_numpy(np.ascontiguousarray(m.T)), 8, 6, mode="BILINEAR"))
    assert np.array_equal(y.numpy(), want.numpy())


# ---------------------------------------------------------------- errors
def test_conv_op_errors():
    ctx = pc.Context()
    k = ctx.new_tensor(F32, (3, 3, 2, 4))
    x = ctx.new_tensor(F32, (8, 8, 3, 1))
    x2 = ctx.new_tensor(F32, (8, 8, 2, 1))
    small = ctx.new_tensor(F32, (2, 8, 2, 1))
    k1d, x1d = ctx.new_tensor(F32, (3, 2)), ctx.new_tensor(F32, (9, 2))
    g_bad, k_back = ctx.new_tensor(F32, (18, 6, 6, 1)), ctx.new_tensor(F32, (3, 3, 2, 1))
    a1, b1, b3 = ctx.new_tensor(F32, (3, 2, 4)), ctx.new_tensor(F32, (10, 4)), ctx.new_tensor(F32, (10, 3))
    with refused(ShapeMismatch, "IM2COL: kernel channels a.ne\\[2\\]=2 differ from input channels", ctx):
        pc.im2col(k, x, 1, 1, 0, 0, 1, 1)
    with refused(ShapeMismatch, "CONV_2D: output size along dim 0 is 0 < 1", ctx):
        pc.conv_2d(k, small)
    with refused(InvalidArgument, "IM2COL: parameter 's0' must be >= 1", ctx):
        pc.im2col(k, small, 0, 1, 0, 0, 1, 1)
    with refused(TypeMismatch, "IM2COL: dst_type must be f32 or f16", ctx):
        pc.im2col(k, x2, 1, 1, 0, 0, 1, 1, True, pc.BF16)
    with refused(InvalidArgument, "is_2D=False\\): p1=1 must be 0", ctx):
        pc.im2col(k1d, x1d, 1, 0, 0, 1, 1, 0, False)
    with refused(ShapeMismatch, "IM2COL_BACK: grad has ne=\\[18, 6, 6, 1\\]", ctx):
        pc.im2col_back(g_bad, k_back, (8, 8, 2, 1), 1, 1, 1, 1, 1, 1)
    with refused(InvalidArgument, "CONV_TRANSPOSE_1D: p0=1: only p0 = 0 is supported", ctx):
        pc.conv_transpose_1d(a1, b1, 1, 1, 1)
    with refused(InvalidArgument, "CONV_TRANSPOSE_1D: d0=2: only d0 = 1", ctx):
        pc.conv_transpose_1d(a1, b1, 1, 0, 2)
    with refused(ShapeMismatch, "CONV_TRANSPOSE_1D: input channels differ", ctx):
        pc.conv_transpose_1d(a1, b3)


def test_pool_and_upscale_errors():
    ctx = pc.Context()
    x = ctx.new_tensor(F32, (5, 4, 2, 1))
    g_bad, h = ctx.new_tensor(F32, (4, 4, 2, 1)), ctx.new_tensor(F16, (2, 2))
    with refused(InvalidArgument, "POOL_2D: unknown PoolOp 'MIN'", ctx):
        pc.pool_2d(x, "MIN", 2, 2, 1, 1)
    with refused(InvalidArgument, "POOL_2D: parameter 'op' must be one of", ctx):
        pc.pool_2d(x, 7, 2, 2, 1, 1)
    with refused(ShapeMismatch, "POOL_2D: output size along dim 1 is 0 < 1", ctx):
        pc.pool_2d(x, "MAX", 2, 6, 1, 1)
    with refused(InvalidArgument, "POOL_1D: p0=3 must be less than k0=3", ctx):
        pc.pool_1d(x, "AVG", 3, 1, 3)
    with refused(ShapeMismatch, "POOL_2D_BACK: grad has ne=\\[4, 4, 2, 1\\]", ctx):
        pc.pool_2d_back(g_bad, x, "MAX", 2, 2, 1, 1)
    with refused(InvalidArgument, "UPSCALE: align_corners applies to BILINEAR only", ctx):
        pc.upscale_ext(x, 10, 8, align_corners=True)
    with refused(InvalidArgument, "UPSCALE: target extents ne=\\[0, 8, 2, 1\\]", ctx):
        pc.upscale_ext(x, 0, 8)
    with refused(TypeMismatch, "UPSCALE: source 'a' has type f16", ctx):
        pc.upscale(h, 2)
    with refused(InvalidArgument, "UPSCALE: unknown ScaleMode 'CUBIC'", ctx):
        pc.upscale(x, 2, "CUBIC")


def test_conv_2d_im2col_failure_leaves_context_unchanged():
    ctx = pc.Context()
    k = pc.transpose(ctx.new_tensor(F32, (3, 3, 2, 1)))  # not contiguous: the reshape refuses it
    x = ctx.new_tensor(F32, (8, 8, 2, 1))
    with refused(InvalidArgument, "RESHAPE: a must be contiguous", ctx):
        pc.conv_2d_im2col(k, x)


def test_conv_ops_sit_in_ggml_op_order():
    keys = list(pc.OPS)
    conv = ["CLAMP", "CONV_TRANSPOSE_1D", "IM2COL", "IM2COL_BACK", "CONV_2D", "POOL_1D", "POOL_2D",
            "POOL_2D_BACK", "UPSCALE", "PAD"]
    assert keys[keys.index("CLAMP"):keys.index("PAD") + 1] == conv
    assert [int(pc.opdef(k).op) for k in conv] == [50, 51, 52, 53, 56, 60, 61, 62, 63, 64]
    # test-backend-ops' bounds: 5e-4 for CONV_2D (like MUL_MAT), the default 1e-7 for the others
    assert pc.opdef("CONV_2D").nmse == 5e-4
    assert all(pc.opdef(k).nmse == 1e-7 for k in conv if k != "CONV_2D")
