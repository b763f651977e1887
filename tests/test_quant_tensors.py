"""Quantized tensors in the core and the reference: creation, raw blocks, values, views, the ops that
read or write block types, gradients through frozen quantized weights, and refusals.

Expected values are derived by hand (a Q8_0 block is its scale times its int8s) or computed with
ggml-org's ``gguf.quants`` (an independent implementation of the block layouts) and float64 NumPy,
never with the reference kernels under test."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
from gguf import quants as gq
from helpers import refused, run

import prism_core as pc
from prism_core.conformance import cases_for
from prism_core.errors import InvalidArgument, ShapeMismatch, TypeMismatch
from prism_core.ops.table import OPS, QUANT_WEIGHTS, QUANT_WRITABLE, QUANTIZED
from prism_core.types import GGMLType as G
from prism_core.types import traits

RNG = np.random.default_rng(7)


def q8_0_block(d: float, qs) -> bytes:
    """A Q8_0 block by hand: fp16 scale, then 32 int8 quants."""
    return np.float16(d).tobytes() + np.asarray(qs, np.int8).tobytes()


def peer_dequantize(t: pc.Tensor) -> np.ndarray:
    """The tensor's values through gguf.quants (not Prism's code), NumPy order."""
    return gq.dequantize(t.raw(), gguf.GGMLQuantizationType(int(t.type))).reshape(t.shape)


@pytest.fixture
def ctx():
    return pc.Context()


# ---------------------------------------------------------------- tensors
def test_hand_made_q8_0_block_values_and_raw_round_trip(ctx):
    qs = np.arange(-16, 16)
    t = ctx.new_tensor(G.Q8_0, (32,)).set_raw(q8_0_block(0.5, qs))
    assert t.nb[0] == 34 and t.raw().shape == (1, 1, 1, 34)
    np.testing.assert_array_equal(t.numpy(), qs * 0.5)
    assert bytes(t.raw().reshape(-1)) == q8_0_block(0.5, qs)


def test_from_numpy_quantizes_with_ggml_reference_quantizer(ctx):
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    t = ctx.from_numpy(x, type=G.Q4_0)
    assert t.ne == (64, 3, 1, 1) and t.type == G.Q4_0
    want = gq.quantize(x, gguf.GGMLQuantizationType.Q4_0)  # ggml-org's exact port of quantize_row_q4_0_ref
    np.testing.assert_array_equal(t.raw().reshape(3, -1), want)
    np.testing.assert_array_equal(t.numpy(), peer_dequantize(t))


@pytest.mark.parametrize("t", sorted(QUANTIZED, key=int), ids=lambda t: traits(t).name)
def test_every_usable_block_type_holds_values(t, ctx):
    from prism_core.conformance.cases_quant import qleaf
    x = qleaf(ctx, np.random.default_rng(int(t)), t, (traits(t).blck_size * 2, 3))
    v = x.numpy()
    assert v.shape == (3, traits(t).blck_size * 2) and v.dtype == np.float32 and np.isfinite(v).all()
    if t not in (G.Q8_1, G.Q8_K):  # gguf.quants has no dequantizer for the two activation formats
        np.testing.assert_array_equal(v, peer_dequantize(x))


def test_set_raw_refuses_truncated_and_mistyped_data(ctx):
    t = ctx.new_tensor(G.Q8_0, (64, 2))
    with refused(ShapeMismatch, r"holds 136 bytes of rows, got 135 \(truncated or too long\)", ctx):
        t.set_raw(bytes(135))
    with refused(TypeMismatch, r"must be uint8 bytes, got dtype float32", ctx):
        t.set_raw(np.zeros(136, np.float32))
    assert not t.raw().any()  # unchanged


def test_quantized_views_keep_whole_blocks(ctx):
    w = ctx.from_numpy(RNG.standard_normal((4, 64)).astype(np.float32), type=G.Q8_0)
    rows = pc.view_2d(w, 64, 2, w.nb[1], w.nb[1])  # rows 1..2
    np.testing.assert_array_equal(rows.numpy(), w.numpy()[1:3])
    half = pc.view_2d(w, 32, 4, w.nb[1], 34)  # the second block of every row
    np.testing.assert_array_equal(half.numpy(), w.numpy()[:, 32:])
    n = len(ctx.tensors)
    with refused(InvalidArgument, r"a q8_0 view must keep whole blocks of 32 elements", ctx):
        pc.view_2d(w, 16, 4, w.nb[1], 0)
    with refused(InvalidArgument, r"a q8_0 view must keep whole blocks", ctx):
        pc.view_2d(w, 32, 4, w.nb[1], 17)
    with refused(InvalidArgument, r"a q8_0 view must keep whole blocks", ctx):
        pc.transpose(w)
    assert len(ctx.tensors) == n


# ---------------------------------------------------------------- ops on the reference
def test_mul_mat_of_hand_made_q8_0_weight(ctx):
    w = ctx.new_tensor(G.Q8_0, (32, 2)).set_raw(q8_0_block(0.25, np.ones(32)) + q8_0_block(2.0, np.arange(32) % 3))
    x = ctx.from_numpy(np.ones((1, 32), np.float32))
    y = run(pc.mul_mat(w, x))
    # row 0: 32 * 0.25; row 1: 2 * (sum of 0,1,2 repeated: 11 zeros, 11 ones, 10 twos) = 2 * 31
    np.testing.assert_array_equal(y.numpy(), [8.0, 62.0])


@pytest.mark.parametrize("t", [G.Q4_0, G.Q5_1, G.Q8_0, G.Q4_K, G.Q6_K, G.IQ4_NL, G.IQ2_XXS],
                         ids=lambda t: traits(t).name)
def test_mul_mat_and_get_rows_use_the_dequantized_weights(t, ctx):
    from prism_core.conformance.cases_quant import qleaf
    k = max(256, traits(t).blck_size)
    w = qleaf(ctx, np.random.default_rng(1), t, (k, 7, 2))
    x = ctx.from_numpy(RNG.standard_normal((2, 3, k)).astype(np.float32))
    wv = peer_dequantize(w).astype(np.float64)
    y = run(pc.mul_mat(w, x))
    np.testing.assert_allclose(y.numpy(), x.numpy() @ np.swapaxes(wv, -1, -2), rtol=1e-5, atol=1e-5)
    idx = ctx.from_numpy(np.array([[6, 0, 6], [1, 2, 3]], np.int32))
    rows = run(pc.get_rows(w, idx))
    np.testing.assert_array_equal(rows.numpy(), np.stack([wv[0][[6, 0, 6]], wv[1][[1, 2, 3]]]).astype(np.float32))


def test_cpy_between_f32_and_blocks(ctx):
    x = RNG.standard_normal((6, 64)).astype(np.float32)
    q = run(pc.cpy(ctx.from_numpy(x), ctx.new_tensor(G.Q8_0, (64, 6))))
    np.testing.assert_array_equal(q.raw().reshape(6, -1), gq.quantize(x, gguf.GGMLQuantizationType.Q8_0))
    back = run(pc.cpy(q, ctx.new_tensor(pc.F32, (32, 12))))  # row-major order, new shape
    np.testing.assert_array_equal(back.numpy(), peer_dequantize(q).reshape(12, 32))
    same = run(pc.cpy(q, ctx.new_tensor(G.Q8_0, (128, 3))))  # one block type: the blocks, unchanged
    assert bytes(same.raw()) == bytes(q.raw())


def test_set_rows_quantizes_each_row_into_a_q8_0_cache(ctx):
    cache = ctx.new_tensor(G.Q8_0, (64, 5))
    rows = RNG.standard_normal((2, 64)).astype(np.float32)
    run(pc.set_rows(cache, ctx.from_numpy(rows), ctx.from_numpy(np.array([3, 1], np.int64))))
    raw = cache.raw().reshape(5, -1)
    want = gq.quantize(rows, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(raw[[3, 1]], want)
    assert not raw[[0, 2, 4]].any()  # untouched rows stay zero blocks


def test_add_dequantizes_adds_and_requantizes(ctx):
    a = ctx.from_numpy(RNG.standard_normal((3, 32)).astype(np.float32), type=G.Q4_0)
    b = ctx.from_numpy(RNG.standard_normal((3, 32)).astype(np.float32))
    s = run(pc.add(a, b))
    assert s.type == G.Q4_0
    want = gq.quantize((peer_dequantize(a) + b.numpy()).astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
    np.testing.assert_array_equal(s.raw().reshape(3, -1), want)
    row = ctx.from_numpy(np.ones((1, 32), np.float32))
    with refused(ShapeMismatch, r"ADD: a has ne=\[32, 3, 1, 1\] but b has ne=\[32, 1, 1, 1\]", ctx):
        pc.add(a, row)  # ggml's add_q_f32 does not broadcast


def test_out_prod_with_a_quantized_first_source(ctx):
    a = ctx.from_numpy(RNG.standard_normal((6, 32)).astype(np.float32), type=G.Q8_0)  # [32, 6]
    b = ctx.from_numpy(RNG.standard_normal((6, 5)).astype(np.float32))  # [5, 6]
    y = run(pc.out_prod(a, b))
    np.testing.assert_allclose(y.numpy(), b.numpy().T.astype(np.float64) @ peer_dequantize(a), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- autodiff through frozen weights
def _finite_differences(f, x: np.ndarray, h: float = 1e-2) -> np.ndarray:
    g = np.zeros_like(x, dtype=np.float64)
    for i in np.ndindex(x.shape):
        vals = []
        for s in (-1.0, -0.5, 0.5, 1.0):
            v = x.astype(np.float64).copy()
            v[i] += s * h
            vals.append(f(v))
        g[i] = (vals[0] - 8 * vals[1] + 8 * vals[2] - vals[3]) / (6 * h)
    return g


@pytest.mark.parametrize("backend", ["numpy", "numba", "csimd"])
def test_lora_gradient_through_a_q4_k_weight_on_every_backend(backend):
    if backend not in {b.name for b in pc.backends() if b.available}:
        pytest.skip(f"{backend} is not available here")
    ctx = pc.Context()
    r = np.random.default_rng(3)
    wv = r.standard_normal((4, 256)).astype(np.float32)
    w = ctx.from_numpy(wv, type=G.Q4_K)  # frozen: not a param
    x = ctx.from_numpy(r.standard_normal((2, 256)).astype(np.float32) * 0.1)
    lo_a = ctx.from_numpy(r.standard_normal((2, 256)).astype(np.float32) * 0.1).set_param()
    lo_b = ctx.from_numpy(r.standard_normal((256, 2)).astype(np.float32)).set_param()
    # the adapter feeds the quantized product, so the gradient passes through its f32 input
    y = pc.mul_mat(w, pc.add(x, pc.mul_mat(lo_b, pc.mul_mat(lo_a, x))))
    # a linear loss: the gradients do not depend on forward values, which a backend may compute with
    # quantized activations (ggml's vec_dot_type); the backward products then leave nothing to chance
    cv = r.standard_normal((2, 4)).astype(np.float32)
    loss = pc.sum(pc.mul(y, ctx.from_numpy(cv))).set_loss()
    g = pc.Graph().expand(loss)
    pc.build_backward(g)
    pc.reset(g)
    report = pc.compute(g, backend)
    wd, xv = peer_dequantize(w).astype(np.float64), x.numpy().astype(np.float64)

    def loss_of(a, b):  # float64, from the formulas: y = (x + (x A^T) B^T) W^T
        return float(np.sum(((xv + (xv @ a.T) @ b.T) @ wd.T) * cv))
    av, bv = lo_a.numpy().astype(np.float64), lo_b.numpy().astype(np.float64)
    bound = 1e-8  # normalised squared error against float64 finite differences of the formula
    for got, want in ((g.grad(lo_a), _finite_differences(lambda a: loss_of(a, bv), av)),
                      (g.grad(lo_b), _finite_differences(lambda b: loss_of(av, b), bv))):
        err = np.sum((got.numpy() - want) ** 2) / np.sum(want ** 2)
        assert err < bound, (backend, err)
    assert all(n in ("OUT_PROD", "MUL_MAT") for n in report.fell_back)  # only block-type nodes may fall back


def test_gradient_of_a_quantized_tensor_is_refused():
    ctx = pc.Context()
    p = ctx.from_numpy(np.ones((2, 32), np.float32)).set_param()
    q = pc.cpy(p, ctx.new_tensor(G.Q8_0, (32, 2)))  # a quantized tensor depending on a param
    loss = pc.sum(pc.mul_mat(q, ctx.from_numpy(np.ones((1, 32), np.float32)))).set_loss()
    g = pc.Graph().expand(loss)
    n = len(ctx.tensors)
    with pytest.raises(TypeMismatch, match=r"has type q8_0; only f32 and f16 .*quantization is not differentiable"):
        pc.build_backward(g)
    assert len(ctx.tensors) == n
    with pytest.raises(TypeMismatch, match=r"parameters must be f32"):
        ctx.new_tensor(G.Q4_0, (32,)).set_param()


# ---------------------------------------------------------------- refusals and coverage
def test_quantizing_a_type_without_quantizer_is_refused_and_rolled_back(ctx):
    n = len(ctx.tensors)
    with pytest.raises(pc.PrismError, match=r"iq2_xxs"):
        ctx.from_numpy(np.ones((1, 256), np.float32), type=G.IQ2_XXS)
    assert len(ctx.tensors) == n


def test_block_type_op_refusals_name_op_source_and_type(ctx):
    q, f = ctx.new_tensor(G.Q4_0, (32, 2)), ctx.new_tensor(pc.F32, (32, 2))
    with refused(TypeMismatch, r"SOFT_MAX: source 'a' has type q4_0; accepted: f32", ctx):
        pc.soft_max(q)
    with refused(TypeMismatch, r"MUL_MAT: source 'b' has type q4_0", ctx):
        pc.mul_mat(f, q)
    with refused(ShapeMismatch, r"CONT: new ne\[0\]=16 must be a multiple of q4_0's block size 32", ctx):
        pc.cont(q, (16, 4))


def test_backends_without_block_types_say_unsupported_with_the_reason():
    ctx = pc.Context()
    y = pc.mul_mat(ctx.new_tensor(G.Q4_K, (256, 2)), ctx.new_tensor(pc.F32, (256, 1)))
    be = pc.Backend()
    be.kernels = {"MUL_MAT": lambda n: None}
    assert not be.supports(y) and "q4_K data" in be.why_unsupported(y)
    assert pc.backend("numpy").supports(y)


def test_every_block_type_has_conformance_cases_on_every_op_that_accepts_it():
    accepted = {key: {t for s in d.srcs for t in s.types if traits(t).is_quantized} for key, d in OPS.items()}
    for key, types in accepted.items():
        if not types or OPS[key].view_only:
            continue
        named = {tok for c in cases_for(key) for tok in re.split(r"[^A-Za-z0-9_]+", c.desc)}
        covered = {t for t in types if traits(t).name in named}
        assert covered == types, (key, sorted(traits(t).name for t in types - covered))
    assert QUANT_WEIGHTS <= QUANTIZED and QUANT_WRITABLE <= QUANTIZED
