"""Independent checks of the NumPy reference backend: matrix products, row indexing,
strided regions (ACC/SET), copies and conversions, and the view ops.

Expectations are hand-worked numbers or explicit index loops following ggml's documented
semantics (/work/shared/reference/ggml-semantics.md 2.1-2.3); none calls the kernels'
code. ggml order: ``ne[0]`` is innermost, so a NumPy array of shape (ne3, ne2, ne1, ne0)
holds element [i0, i1, i2, i3] at ``arr[i3, i2, i1, i0]``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import full, round_sig, run, verifier

import prism_core as pc
from prism_core import BF16, F16, F32, I32

VERIFIED, verifies = verifier()  # op-table keys this module checks




def ints_as_f32(rng, shape, lo=-3, hi=4):
    return rng.integers(lo, hi, size=shape).astype(np.float32)


# ---------------------------------------------------------------- MUL_MAT
@verifies("MUL_MAT")
def test_mul_mat_hand_worked():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2, 3], [4, 5, 6]], np.float32))  # ne = [K=3, M=2]
    b = ctx.from_numpy(np.array([[1, 0, 1], [0, 1, 0]], np.float32))  # ne = [K=3, N=2]
    y = run(pc.mul_mat(a, b))
    # out[m, n] = sum_k a[k, m] b[k, n]; ne = [M, N], NumPy rows are n
    assert y.type == F32 and y.ne == (2, 2, 1, 1)
    assert y.numpy().tolist() == [[1 + 3, 4 + 6], [2, 5]]
    # a matrix times a single column vector
    v = ctx.from_numpy(np.array([2, -1, 1], np.float32))
    assert run(pc.mul_mat(a, v)).numpy().tolist() == [3, 9]


@verifies("MUL_MAT")
def test_mul_mat_batch_broadcast_is_blockwise():
    K, M, N = 3, 2, 2
    A2, A3, B2, B3 = 2, 2, 6, 4
    rng = np.random.default_rng(1)
    a_np = ints_as_f32(rng, (A3, A2, M, K))
    b_np = ints_as_f32(rng, (B3, B2, N, K))
    ctx = pc.Context()
    y = run(pc.mul_mat(ctx.from_numpy(a_np), ctx.from_numpy(b_np)))
    assert y.ne == (M, N, B2, B3)

    def expected(src2, src3):
        out = np.zeros((B3, B2, N, M))
        for i3, i2, n, m in itertools.product(range(B3), range(B2), range(N), range(M)):
            j2, j3 = src2(i2), src3(i3)
            s = 0.0
            for k in range(K):
                s += float(a_np[j3, j2, m, k]) * float(b_np[i3, i2, n, k])
            out[i3, i2, n, m] = s
        return out

    block = expected(lambda i2: i2 // (B2 // A2), lambda i3: i3 // (B3 // A3))  # ggml: i2 / (ne12/ne02)
    modulo = expected(lambda i2: i2 % A2, lambda i3: i3 % A3)
    assert not np.array_equal(block, modulo)  # the data tells the two rules apart
    assert np.array_equal(full(y), block)


@verifies("MUL_MAT", "TRANSPOSE")
def test_mul_mat_noncontiguous_b_and_f16_a():
    rng = np.random.default_rng(2)
    K, M, N = 4, 3, 5
    a_np = (rng.integers(-8, 9, size=(M, K)) / 4).astype(np.float32)  # exact in f16
    c_np = ints_as_f32(rng, (K, N))  # ne = [N, K]; its transpose has ne = [K, N]
    ctx = pc.Context()
    a16 = ctx.from_numpy(a_np, type=F16)
    bt = pc.transpose(ctx.from_numpy(c_np))
    y = run(pc.mul_mat(a16, bt))
    assert y.type == F32 and y.ne == (M, N, 1, 1)
    want = [[sum(float(a_np[m, k]) * float(c_np[k, n]) for k in range(K)) for m in range(M)] for n in range(N)]
    assert y.numpy().tolist() == want


@verifies("MUL_MAT")
def test_mul_mat_bf16_operands():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1.5, -2], [0.25, 4]], np.float32), type=BF16)
    b = ctx.from_numpy(np.array([[2, 1], [-1, 0.5]], np.float32), type=BF16)
    y = run(pc.mul_mat(a, b))
    # n=0: [1.5*2 - 2*1, 0.25*2 + 4*1]; n=1: [-1.5 - 1, -0.25 + 2]
    assert y.type == F32 and y.numpy().tolist() == [[1.0, 4.5], [-2.5, 1.75]]


# ---------------------------------------------------------------- OUT_PROD
@verifies("OUT_PROD")
def test_out_prod_hand_worked():
    ctx = pc.Context()
    # vectors as ne [I, 1] and [J, 1]: the outer product out[i, j] = a[i] b[j]
    a = ctx.from_numpy(np.array([[1, 2, 3]], np.float32))
    b = ctx.from_numpy(np.array([[10, 20]], np.float32))
    y = run(pc.out_prod(a, b))
    assert y.ne == (3, 2, 1, 1) and y.type == F32
    assert y.numpy().tolist() == [[10, 20, 30], [20, 40, 60]]
    # a [I=2, T=3]: a[0, :] = (1, 3, 5), a[1, :] = (2, 4, 6); b [J=1, T=3]: (1, 0, 2)
    a2 = ctx.from_numpy(np.array([[1, 2], [3, 4], [5, 6]], np.float32))
    b2 = ctx.from_numpy(np.array([[1], [0], [2]], np.float32))
    assert run(pc.out_prod(a2, b2)).numpy().tolist() == [11, 14]


@verifies("OUT_PROD")
def test_out_prod_batch_broadcast_is_blockwise():
    NI, NJ, NT = 3, 2, 4
    A2, A3, B2, B3 = 2, 1, 4, 3
    rng = np.random.default_rng(4)
    a_np = ints_as_f32(rng, (A3, A2, NT, NI))
    b_np = ints_as_f32(rng, (B3, B2, NT, NJ))
    ctx = pc.Context()
    y = run(pc.out_prod(ctx.from_numpy(a_np), ctx.from_numpy(b_np)))
    assert y.ne == (NI, NJ, B2, B3)
    want = np.zeros((B3, B2, NJ, NI))
    for i3, i2, j, i in itertools.product(range(B3), range(B2), range(NJ), range(NI)):
        for t in range(NT):
            want[i3, i2, j, i] += a_np[i3 // (B3 // A3), i2 // (B2 // A2), t, i] * b_np[i3, i2, t, j]
    assert np.array_equal(full(y), want)


# ---------------------------------------------------------------- GET_ROWS
@verifies("GET_ROWS")
@pytest.mark.parametrize("t", [F32, F16, BF16])
def test_get_rows_float_sources_give_f32(t):
    ctx = pc.Context()
    rows = [[0.5, 1, 1.5], [2, 2.5, 3], [-1, -2, -4], [8, 16, 32]]
    a = ctx.from_numpy(np.array(rows, np.float32), type=t)  # ne = [3, 4]
    b = ctx.from_numpy(np.array([2, 0, 3, 0], np.int32))
    y = run(pc.get_rows(a, b))
    assert y.type == F32 and y.ne == (3, 4, 1, 1)
    assert y.numpy().tolist() == [rows[2], rows[0], rows[3], rows[0]]


@verifies("GET_ROWS")
def test_get_rows_i32_source_gives_i32():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, -2], [30, 40], [2 ** 30, 7]], np.int32))
    y = run(pc.get_rows(a, ctx.from_numpy(np.array([1, 1, 2], np.int32))))
    assert y.type == I32
    assert y.numpy().tolist() == [[30, 40], [30, 40], [2 ** 30, 7]]


@verifies("GET_ROWS")
def test_get_rows_3d_indices():
    n, R, A2, A3, m = 2, 3, 2, 2, 4
    rng = np.random.default_rng(6)
    a_np = ints_as_f32(rng, (A3, A2, R, n), -50, 50)
    idx = rng.integers(0, R, size=(A3, A2, m)).astype(np.int32)  # ne = [m, A2, A3]
    ctx = pc.Context()
    y = run(pc.get_rows(ctx.from_numpy(a_np), ctx.from_numpy(idx)))
    assert y.ne == (n, m, A2, A3)
    got = full(y)
    for k, j, i in itertools.product(range(A3), range(A2), range(m)):
        assert got[k, j, i].tolist() == a_np[k, j, idx[k, j, i]].tolist()  # out[:, i, j, k] = a[:, b[i,j,k], j, k]


@verifies("GET_ROWS_BACK")
def test_get_rows_back_accumulates_duplicates():
    ctx = pc.Context()
    grad = ctx.from_numpy(np.array([[1, 2], [10, 20], [100, 200], [1000, 2000]], np.float32))  # ne [2, 4]
    idx = ctx.from_numpy(np.array([1, 3, 1, 1], np.int32))
    c = ctx.new_tensor(F16, (2, 5))  # shape only
    y = run(pc.get_rows_back(grad, idx, c))
    assert y.type == F32 and y.ne == (2, 5, 1, 1)
    assert y.numpy().tolist() == [[0, 0], [1101, 2202], [0, 0], [10, 20], [0, 0]]


# ---------------------------------------------------------------- ACC / SET
A45 = np.arange(20, dtype=np.float32).reshape(4, 5)  # ne = [5, 4]: nb1 = 20 bytes


@verifies("ACC")
def test_acc_2x2_at_row1_col2():
    ctx = pc.Context()
    a = ctx.from_numpy(A45)
    b = ctx.from_numpy(np.array([[100, 200], [300, 400]], np.float32))
    y = run(pc.acc(a, b, a.nb[1], a.nb[2], a.nb[3], 1 * a.nb[1] + 2 * a.nb[0]))
    assert y.view_src is None
    assert y.numpy().tolist() == [[0, 1, 2, 3, 4],
                                  [5, 6, 107, 208, 9],
                                  [10, 11, 312, 413, 14],
                                  [15, 16, 17, 18, 19]]
    assert np.array_equal(a.numpy(), A45)  # a untouched


@verifies("ACC")
def test_acc_strides_and_wrapping():
    ctx = pc.Context()
    a = ctx.from_numpy(A45)
    b = ctx.from_numpy(np.array([[1, 2], [3, 4]], np.float32))
    # nb1 = two rows: b's rows land on rows 0 and 2, columns 1..2
    y = run(pc.acc(a, b, 2 * a.nb[1], a.nb[2], a.nb[3], 4))
    assert y.numpy().tolist() == [[0, 2, 4, 3, 4], [5, 6, 7, 8, 9],
                                  [10, 14, 16, 13, 14], [15, 16, 17, 18, 19]]
    # a 1-d b of 3 at element 3 runs on past the end of row 0
    c = ctx.from_numpy(np.array([-1, -2, -3], np.float32))
    z = run(pc.acc(a, c, a.nb[1], a.nb[2], a.nb[3], 3 * 4))
    assert z.numpy()[:2].tolist() == [[0, 1, 2, 2, 2], [2, 6, 7, 8, 9]]


@verifies("ACC")
def test_acc_3d_with_nb2():
    ctx = pc.Context()
    a_np = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # ne = [4, 3, 2]
    a = ctx.from_numpy(a_np)
    b = ctx.from_numpy(np.array([[[1, 2]], [[3, 4]]], np.float32))  # ne = [2, 1, 2]
    y = run(pc.acc(a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + a.nb[0]))
    want = a_np.copy()
    want[0, 1, 1:3] += [1, 2]
    want[1, 1, 1:3] += [3, 4]
    assert y.numpy().tolist() == want.tolist()
    assert y.numpy()[1, 1].tolist() == [16, 20, 22, 19]  # by hand: [16, 17+3, 18+4, 19]


@verifies("ACC")
def test_acc_inplace_shares_a():
    ctx = pc.Context()
    a = ctx.from_numpy(A45)
    b = ctx.from_numpy(np.array([[100, 200], [300, 400]], np.float32))
    y = pc.acc(a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + 8, inplace=True)
    assert y.view_src is a and y.view_offs == 0
    run(y)
    assert a.numpy()[1:3].tolist() == [[5, 6, 107, 208, 9], [10, 11, 312, 413, 14]]
    assert a.numpy()[0].tolist() == [0, 1, 2, 3, 4]


@verifies("ACC", "SET", "VIEW")
@pytest.mark.parametrize("key", ["ACC", "SET"])
def test_acc_set_inplace_on_an_offset_view(key):
    # a = rows 1..3 of a 4x5 matrix (a contiguous view at byte offset 20); the region's
    # offset counts from a's first element, not from the start of the storage
    ctx = pc.Context()
    big = ctx.from_numpy(A45)
    a = pc.view_2d(big, 5, 3, big.nb[1], big.nb[1])
    b = ctx.from_numpy(np.array([[100, 200], [300, 400]], np.float32))
    build = pc.acc if key == "ACC" else pc.set
    y = build(a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + 2 * a.nb[0], inplace=True)
    assert y.base is big
    run(y)
    if key == "ACC":
        rows = [[10, 11, 112, 213, 14], [15, 16, 317, 418, 19]]
    else:
        rows = [[10, 11, 100, 200, 14], [15, 16, 300, 400, 19]]
    assert big.numpy().tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] + rows
    # not in place: the result is a fresh copy of the view with the same region
    ctx2 = pc.Context()
    big2 = ctx2.from_numpy(A45)
    a2 = pc.view_2d(big2, 5, 3, big2.nb[1], big2.nb[1])
    b2 = ctx2.from_numpy(np.array([[100, 200], [300, 400]], np.float32))
    z = run(build(a2, b2, a2.nb[1], a2.nb[2], a2.nb[3], a2.nb[1] + 2 * a2.nb[0]))
    assert z.numpy().tolist() == [[5, 6, 7, 8, 9]] + rows
    assert big2.numpy().tolist() == A45.tolist()


@verifies("SET")
@pytest.mark.parametrize("t", [F32, F16, BF16, I32])
def test_set_2x2_at_row1_col2(t):
    ctx = pc.Context()
    a = ctx.from_numpy(A45.astype(np.int32) if t == I32 else A45, type=t)
    b_np = np.array([[-1, -2], [-3, -4]], np.float32)
    b = ctx.from_numpy(b_np.astype(np.int32) if t == I32 else b_np, type=t)
    ts = a.nb[0]
    y = run(pc.set(a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + 2 * ts))
    assert y.type == t and y.view_src is None
    assert y.numpy().tolist() == [[0, 1, 2, 3, 4],
                                  [5, 6, -1, -2, 9],
                                  [10, 11, -3, -4, 14],
                                  [15, 16, 17, 18, 19]]
    assert a.numpy().tolist() == A45.tolist()


@verifies("SET")
def test_set_1d_2d_and_inplace():
    ctx = pc.Context()
    a = ctx.from_numpy(A45)
    b = ctx.from_numpy(np.array([7, 8, 9], np.float32))
    y = run(pc.set_1d(a, b, 4 * 4))  # elements 4, 5, 6: the last of row 0, the first two of row 1
    assert y.numpy()[:2].tolist() == [[0, 1, 2, 3, 7], [8, 9, 7, 8, 9]]
    c = ctx.from_numpy(np.array([[1, 2], [3, 4], [5, 6]], np.float32))
    z = run(pc.set_2d(a, c, a.nb[1], 3 * 4))  # columns 3..4 of rows 0..2
    assert z.numpy().tolist() == [[0, 1, 2, 1, 2], [5, 6, 7, 3, 4], [10, 11, 12, 5, 6], [15, 16, 17, 18, 19]]
    d = ctx.from_numpy(np.array([[-1, -2], [-3, -4]], np.float32))
    ip = pc.set_2d(a, d, 2 * a.nb[1], 0, inplace=True)  # rows 0 and 2, columns 0..1
    assert ip.view_src is a
    run(ip)
    assert a.numpy().tolist() == [[-1, -2, 2, 3, 4], [5, 6, 7, 8, 9], [-3, -4, 12, 13, 14], [15, 16, 17, 18, 19]]


# ---------------------------------------------------------------- CPY / CONT / DUP
def _cpy_values(src_vals, t_src, t_dst, ne=None):
    ctx = pc.Context()
    arr = np.array(src_vals, np.int32 if t_src == I32 else np.float32)
    a = ctx.from_numpy(arr, type=t_src)
    b = ctx.new_tensor(t_dst, ne or a.ne)
    y = run(pc.cpy(a, b))
    assert y.view_src is b and y.type == t_dst
    return b.numpy()


@verifies("CPY")
def test_cpy_f32_to_f16_rounds_to_nearest_even():
    vals = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 2049, 2051, 65504, 65520, -0.1, 3.0]
    got = _cpy_values(vals, F32, F16)
    want = [1.0, 1 + 2 ** -9, 2048, 2052, 65504, math.inf, round_sig(float(np.float32(-0.1)), 11), 3.0]
    assert got.dtype == np.float16 and [float(v) for v in got] == want


@verifies("CPY")
def test_cpy_f32_to_bf16_rounds_to_nearest_even():
    vals = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 257, 259, 1 / 3, -1 / 3, math.nan]
    got = _cpy_values(vals, F32, BF16)
    third = round_sig(float(np.float32(1 / 3)), 8)
    assert third == 0.333984375
    assert [float(v) for v in got[:6]] == [1.0, 1.015625, 256, 260, third, -third]
    assert math.isnan(float(got[6]))


@verifies("CPY")
def test_cpy_to_and_from_i32():
    # F32 -> I32 truncates toward zero
    assert _cpy_values([2.7, -2.7, -0.5, 0.5, 7.0, -7.99], F32, I32).tolist() == [2, -2, 0, 0, 7, -7]
    # I32 -> F32 rounds to nearest even above 2^24
    got = _cpy_values([-3, 0, 5, 2 ** 24 + 1, 2 ** 24 + 3], I32, F32)
    assert got.tolist() == [-3, 0, 5, 2 ** 24, 2 ** 24 + 4]
    assert _cpy_values([-3, 4, 2049], I32, F16).tolist() == [-3, 4, 2048]
    assert _cpy_values([-3, 4, 259], I32, BF16).tolist() == [-3, 4, 260]
    assert _cpy_values([1.75, -300.5], F16, I32).tolist() == [1, -300]
    assert _cpy_values([1.75, -300.5], BF16, I32).tolist() == [1, -300]


@verifies("CPY")
def test_cpy_between_half_types_and_to_f32():
    # f16 1 + 2^-8 + 2^-10 -> bf16: nearer to 1 + 2^-7 than to 1
    assert _cpy_values([1 + 2 ** -8 + 2 ** -10, 0.5], F16, BF16).tolist() == [1.0078125, 0.5]
    # bf16 2^20 does not fit f16 (max 65504)
    assert _cpy_values([0.333984375, 2.0 ** 20], BF16, F16).tolist() == [0.333984375, math.inf]
    assert _cpy_values([0.333251953125, -2048], F16, F32).tolist() == [0.333251953125, -2048]
    assert _cpy_values([0.333984375, -2 ** 100], BF16, F32).tolist() == [0.333984375, -2.0 ** 100]


@verifies("CPY", "TRANSPOSE")
def test_cpy_writes_row_major_order_into_b():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2, 3], [4, 5, 6]], np.float32))  # ne = [3, 2]
    b = ctx.new_tensor(F32, (2, 3))
    run(pc.cpy(a, b))
    assert b.numpy().tolist() == [[1, 2], [3, 4], [5, 6]]
    # a transposed view is read in its own logical order
    c = ctx.new_tensor(F16, (6,))
    run(pc.cpy(pc.transpose(a), c))
    assert c.numpy().tolist() == [1, 4, 2, 5, 3, 6]


@verifies("CPY", "VIEW")
def test_cpy_into_a_strided_view_touches_only_the_view():
    ctx = pc.Context()
    big = ctx.new_tensor(F16, (4, 3))  # zeros, NumPy shape (3, 4)
    dst = pc.view_2d(big, 2, 3, big.nb[1], 1 * big.nb[0])  # columns 1..2
    a = ctx.from_numpy(np.array([[1, 2], [3, 4], [5, 6]], np.float32))
    y = run(pc.cpy(a, dst))
    assert y.base is big
    assert big.numpy().tolist() == [[0, 1, 2, 0], [0, 3, 4, 0], [0, 5, 6, 0]]


@verifies("CPY")
def test_cast():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([1.9, -1.9, 2049], np.float32))
    assert run(pc.cast(a, I32)).numpy().tolist() == [1, -1, 2049]
    assert run(pc.cast(a, F16)).numpy().tolist() == [round_sig(float(np.float32(1.9)), 11),
                                                      round_sig(float(np.float32(-1.9)), 11), 2048]


@verifies("CONT", "TRANSPOSE", "PERMUTE")
@pytest.mark.parametrize("t", [F32, F16, BF16, I32])
def test_cont(t):
    ctx = pc.Context()
    a_np = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    a = ctx.from_numpy(a_np.astype(np.int32) if t == I32 else a_np, type=t)
    c = run(pc.cont(pc.transpose(a)))
    assert c.type == t and c.view_src is None and c.is_contiguous()
    assert c.numpy().tolist() == [[1, 4], [2, 5], [3, 6]]
    # with a new shape: the transposed elements in row-major order [1, 4, 2, 5, 3, 6]
    d = run(pc.cont_2d(pc.transpose(a), 3, 2))
    assert d.numpy().tolist() == [[1, 4, 2], [5, 3, 6]]
    e = run(pc.cont_4d(pc.permute(a, 1, 0, 2, 3), 1, 2, 1, 3))
    assert e.ne == (1, 2, 1, 3) and e.numpy().reshape(-1).tolist() == [1, 4, 2, 5, 3, 6]


@verifies("DUP", "TRANSPOSE")
@pytest.mark.parametrize("t", [F32, F16, BF16, I32])
def test_dup(t):
    ctx = pc.Context()
    a_np = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    a = ctx.from_numpy(a_np.astype(np.int32) if t == I32 else a_np, type=t)
    d = run(pc.dup(a))
    assert d.type == t and d.view_src is None and d.numpy().tolist() == a_np.tolist()
    dt = run(pc.dup(pc.transpose(a)))
    assert dt.ne == (2, 3, 1, 1) and dt.numpy().tolist() == [[1, 4], [2, 5], [3, 6]]


@verifies("DUP")
def test_dup_keeps_bits_and_inplace_aliases():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([1 / 3, -0.0, 65504], np.float32), type=BF16)
    bits = a.host().copy()
    d = run(pc.dup(a))
    assert np.array_equal(d.host(), bits)
    ip = run(pc.dup_inplace(a))
    assert ip.view_src is a and np.array_equal(a.host(), bits)


# ---------------------------------------------------------------- views
@verifies("RESHAPE")
def test_reshape_reads_through_the_view():
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    r = pc.reshape_2d(a, 6, 2)
    assert r.view_src is a and r.ne == (6, 2, 1, 1)
    assert r.numpy().tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    r3 = pc.reshape_3d(a, 2, 3, 2)
    assert full(r3)[0, 1, 2].tolist() == [10, 11]
    # reshape of a computed node; the view shares the node's memory
    s = pc.reshape_1d(pc.add(a, a), 12)
    run(s)
    assert s.numpy().tolist() == [2 * i for i in range(12)]
    # and a kernel reading through a reshape
    assert run(pc.sum_rows(pc.reshape(a, (6, 2)))).numpy().tolist() == [[15], [51]]


@verifies("VIEW")
def test_view_offsets_and_strides():
    ctx = pc.Context()
    a = ctx.from_numpy(np.arange(20, dtype=np.float32).reshape(4, 5))  # ne = [5, 4]
    v2 = pc.view_2d(a, 2, 3, a.nb[1], a.nb[1] + a.nb[0])  # rows 1..3, columns 1..2
    assert v2.numpy().tolist() == [[6, 7], [11, 12], [16, 17]]
    v1 = pc.view_1d(a, 3, 4 * a.nb[0])
    assert v1.numpy().tolist() == [4, 5, 6]
    # every other row, columns 0..1, as a 3-d view of 2 x (1 x 2)
    v3 = pc.view_3d(a, 2, 1, 2, a.nb[1], 2 * a.nb[1], 0)
    assert full(v3).reshape(2, 2).tolist() == [[0, 1], [10, 11]]
    # a view of a view collapses to the base with summed offsets
    vv = pc.view_1d(v2, 2, a.nb[1])
    assert vv.view_src is a and vv.numpy().tolist() == [11, 12]
    # kernels read through strided views
    assert run(pc.sum_rows(v2)).numpy().tolist() == [[13], [23], [33]]
    assert run(pc.cont(v2)).numpy().tolist() == [[6, 7], [11, 12], [16, 17]]


@verifies("PERMUTE")
def test_permute_moves_source_dim_k_to_axes_k():
    ctx = pc.Context()
    a_np = np.arange(120, dtype=np.float32).reshape(5, 4, 3, 2)  # ne = [2, 3, 4, 5]
    a = ctx.from_numpy(a_np)
    axes = (1, 2, 0, 3)
    p = pc.permute(a, *axes)
    assert p.ne == (4, 2, 3, 5)  # out.ne[axes[k]] = a.ne[k]
    want = np.zeros((5, 3, 2, 4), np.float32)
    for o0, o1, o2, o3 in itertools.product(range(4), range(2), range(3), range(5)):
        o = (o0, o1, o2, o3)
        s = [o[axes[k]] for k in range(4)]  # source index along dim k
        want[o3, o2, o1, o0] = a_np[s[3], s[2], s[1], s[0]]
    assert np.array_equal(full(p), want)
    c = run(pc.cont(p))
    assert np.array_equal(full(c), want)


@verifies("PERMUTE", "TRANSPOSE")
def test_transpose_and_2d_permute():
    ctx = pc.Context()
    a = ctx.from_numpy(np.array([[1, 2, 3], [4, 5, 6]], np.float32))
    t = pc.transpose(a)
    assert t.ne == (2, 3, 1, 1) and t.nb[:2] == (a.nb[1], a.nb[0])
    assert t.numpy().tolist() == [[1, 4], [2, 5], [3, 6]]
    p = pc.permute(a, 1, 0, 2, 3)
    assert p.numpy().tolist() == [[1, 4], [2, 5], [3, 6]]
    # a 3-cycle on a 3-d tensor, hand-checked element: ne [2, 3, 4] -> axes (2, 0, 1, 3)
    b_np = np.arange(24, dtype=np.float32).reshape(4, 3, 2)  # element [i0, i1, i2] = i0 + 2 i1 + 6 i2
    q = pc.permute(ctx.from_numpy(b_np), 2, 0, 1, 3)  # dim0 -> 2, dim1 -> 0, dim2 -> 1
    assert q.ne == (3, 4, 2, 1)
    # q[j0, j1, j2] = b[i0 = j2, i1 = j0, i2 = j1]; q[2, 1, 1] = b[1, 2, 1] = 1 + 4 + 6
    assert full(q)[0, 1, 1, 2] == 11
    assert run(pc.cont(q)).numpy()[1, 1, 2] == 11
