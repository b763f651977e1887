"""MUL_MAT and MUL_MAT_ID with an F16 or BF16 first operand round an F32 b to that type before the
products, as ggml's CPU does (b is converted to the weight's vec_dot_type): on every backend, against
hand-derived values and, where ggml-python is installed, ggml's own CPU product (within F16 sums' error
where ggml's build sums F16 products in half precision: docs/backends/ggml.md)."""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc

BACKENDS = [b.name for b in pc.backends() if b.available]
A = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)  # two rows of a (exact in F16 and BF16)
B = np.array([[1.0005, 0.1]], np.float32)
# F16: 1.0005 -> 1 + 2^-10 (past the midpoint 1 + 2^-11), 0.1 -> 3277 * 2^-15 = 0.0999755859375;
#   rows: 1.0009765625 + 2 * 0.0999755859375 = 1.200927734375, 3 * 1.0009765625 - 0.0999755859375
# BF16: 1.0005 -> 1 (steps of 2^-7), 0.1 -> 205 * 2^-11 = 0.10009765625: 1.2001953125, 2.89990234375
# (unrounded: 1.2005 and 2.9015)
WANT = {pc.F16: [1.200927734375, 2.9029541015625], pc.BF16: [1.2001953125, 2.89990234375]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [pc.F16, pc.BF16])
def test_mul_mat_rounds_b_to_the_half_weights_type(backend, t):
    ctx = pc.Context(mem_size=1 << 20)
    a = ctx.from_numpy(A, type=t)
    ys = [pc.mul_mat(a, ctx.from_numpy(B)),
          pc.mul_mat(a, pc.transpose(ctx.from_numpy(B.T.copy())))]  # b's elements strided
    for y in ys:
        y.set_output()
        pc.compute(y, backend)
        assert y.numpy().ravel().tolist() == WANT[t]
    f32 = pc.mul_mat(ctx.from_numpy(A), ctx.from_numpy(B)).set_output()  # an F32 a: b as it is
    pc.compute(f32, backend)
    np.testing.assert_allclose(f32.numpy().ravel(), [1.2005, 2.9015], rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mul_mat_id_rounds_b_like_mul_mat(backend):
    ctx = pc.Context(mem_size=1 << 20)
    experts = ctx.from_numpy(np.stack([A, -A]), type=pc.F16)  # [2, 2, 2 experts]
    ids = ctx.from_numpy(np.array([[1, 0]], np.int32))  # token 0 uses expert 1, then expert 0
    y = pc.mul_mat_id(experts, ctx.from_numpy(B.reshape(1, 1, 2)), ids).set_output()
    if backend != "numpy" and not pc.backend(backend).supports(y):
        pytest.skip(f"{backend} does not compute MUL_MAT_ID")
    pc.compute(y, backend)
    assert y.numpy().ravel().tolist() == [-v for v in WANT[pc.F16]] + WANT[pc.F16]


@pytest.mark.parametrize("backend", BACKENDS)
def test_f16_products_agree_with_ggml(backend):
    pytest.importorskip("ggml", reason="ggml-python (ggml's own CPU kernels) is not installed")
    from data.make_ggml_mulmat_golden import f16_sums_in_half, ggml_mul_mat
    rng = np.random.default_rng(0)
    k, m, n = 256, 64, 7  # a KV-cache-like product: F16 [k, m] times F32 [k, n]
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float32)
    ctx = pc.Context(mem_size=1 << 22)
    y = pc.mul_mat(ctx.from_numpy(a), ctx.from_numpy(b)).set_output()
    pc.compute(y, backend)
    got = y.numpy().astype(np.float64)
    a64, b16 = a.astype(np.float64), b.astype(np.float16).astype(np.float64)
    rounded, unrounded = b16 @ a64.T, b.astype(np.float64) @ a64.T
    scale = np.abs(rounded).max()
    assert np.abs(unrounded - rounded).max() > 2e-5 * scale  # rounding b is visible at the bounds below
    want, half_sums = ggml_mul_mat(pc.F16, a, b).astype(np.float64), f16_sums_in_half()
    if half_sums:  # ggml built for AVX512-FP16 (or ARM FP16 arithmetic) sums in F16
        # 2 products per accumulator lane, 2 steps joining 4 accumulators, 5 joining 32 lanes: 9 F16
        # roundings, each within 2^-11 of the sum of |products|
        err, bound = np.abs(want - rounded), 9 * 2.0**-11 * (np.abs(b16) @ np.abs(a64).T)
        assert (err <= bound).all(), (err / bound).max()
        assert err.max() > 2e-6 * scale  # F16 sums are visibly not float32 ones, or the probe is wrong
    if backend != "ggml":  # Prism: float32 sums of b rounded to F16, a few 1e-7 of the scale
        assert np.abs(got - rounded).max() < 2e-6 * scale
    if backend == "ggml" or not half_sums:  # float32 summation order apart, Prism is ggml
        assert np.abs(got - want).max() < 2e-6 * scale
