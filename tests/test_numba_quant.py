"""numba's block-type kernels (backends/prism_numba/_jit_quant.py, kernels_quant.py): the compiled
decoders against gguf.quants' dequantizers bit for bit on random block bytes (every bit pattern of
the quants), and the ops on them against float64 NumPy on gguf-dequantized operands, with odd row
counts, rows of zeros, broadcast batches and both the serial and the thread-pool compilations;
plus MUL_MAT/OUT_PROD with an F16/BF16 second source."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq
from test_csimd_quant import FORMATS, hand_dequant, random_blocks

import prism_core as pc
from prism_core.quant import quantize_activations
from prism_core.types import TRAITS, GGMLType

DECODED = (GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.Q8_1, GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K,
           GT.Q6_K, GT.Q8_K, GT.IQ4_NL, GT.IQ4_XS, GT.TQ1_0, GT.TQ2_0, GT.MXFP4)
WEIGHTS = tuple(t for t in FORMATS if t not in (GT.Q8_1, GT.Q8_K))  # QUANT_WEIGHTS


@pytest.fixture(scope="module")
def nb():
    info = next((i for i in pc.backends() if i.name == "numba"), None)
    if info is None or not info.available:
        pytest.skip(f"numba unavailable here: {info.reason if info else 'not registered'}")
    return pc.backend("numba")


@pytest.fixture(params=("serial", "parallel"))
def mode(request, monkeypatch):
    """Small nodes run the serial compilations; PRISM_NUMBA_SERIAL_WORK=0 sends them to the pool."""
    monkeypatch.setenv("PRISM_NUMBA_SERIAL_WORK", "0" if request.param == "parallel" else str(1 << 40))
    return request.param


def _gguf_values(blocks: np.ndarray, t: GT) -> np.ndarray:
    """Dequantized by gguf.quants (the peer), or d*q by hand for the two formats it lacks."""
    if t in (GT.Q8_1, GT.Q8_K):
        return hand_dequant(blocks.reshape(-1, TRAITS[GGMLType(int(t))].type_size), t)
    return gq.dequantize(blocks, t).reshape(-1)


def _qtensor(ctx: pc.Context, t: GT, k: int, rows: int, rng: np.random.Generator, zero_rows=()):
    tr = TRAITS[GGMLType(int(t))]
    blocks = random_blocks(t, rows * k // tr.blck_size, rng).reshape(rows, -1)
    for r in zero_rows:  # all-zero blocks: a zero scale and zero quants decode to zeros in every format
        blocks[r] = 0
    x = ctx.new_tensor(GGMLType(int(t)), (k, rows))
    x.set_raw(blocks)
    return x, _gguf_values(blocks, t).reshape(rows, k).astype(np.float64)


@pytest.mark.parametrize("t", DECODED, ids=lambda t: t.name)
def test_decoder_is_gguf_bit_for_bit(nb, t):
    from prism_numba.kernels import _jit
    KERNELS = _jit().KERNELS
    tr = TRAITS[GGMLType(int(t))]
    rng = np.random.default_rng(int(t))
    rows, nblk = 3, 2
    blocks = random_blocks(t, rows * nblk, rng).reshape(1, 1, rows, -1)
    out = np.full((1, 1, rows, nblk * tr.blck_size), np.nan, np.float32)
    KERNELS["q_dequant"].serial()(int(t), blocks, out)
    want = _gguf_values(blocks.reshape(rows, -1), t).astype(np.float32)
    assert np.array_equal(out.reshape(-1).view(np.uint32), want.view(np.uint32))


def activation_values(bv: np.ndarray, t: GT) -> np.ndarray:
    """The float64 values of activation rows bv as ggml's CPU backend quantizes them for a dot
    product with weights of type t (prism_core.quant.quantize_activations, decoded by gguf.quants
    or by hand): the integer path's second operand."""
    vt = TRAITS[GGMLType(int(t))].vec_dot_type
    blocks = quantize_activations(bv, vt)
    return _gguf_values(blocks, GT(int(vt))).reshape(bv.shape).astype(np.float64)


def stored_sum_part(bv: np.ndarray, t: GT, blocks: np.ndarray) -> np.ndarray | float:
    """The part of ggml's integer product of weight blocks (t; [M, row bytes]) and activation rows bv [N, K] that
    the activation values leave out: with Q8_1 activations (Q4_1, Q5_1 weights) ggml adds each weight block's min
    m times the activation block's stored s = fp16(d * sum(q)), not d_fp16 * sum(q); sum over blocks of
    m * (s - d * sum(q)), [N, M] (0 for the other formats, where the activations' values are the whole story)."""
    vt = TRAITS[GGMLType(int(t))].vec_dot_type
    if vt != GGMLType.Q8_1:
        return 0.0
    xa = quantize_activations(bv, vt).reshape(len(bv), -1, TRAITS[vt].type_size)
    d = xa[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    s = xa[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    q = xa[..., 4:].view(np.int8).astype(np.float64).sum(axis=2)
    wb = blocks.reshape(-1, bv.shape[1] // 32, TRAITS[GGMLType(int(t))].type_size)
    mins = wb[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return (s - d * q) @ mins.T


def int_path(node: pc.Tensor) -> bool:
    from prism_numba.kernels_quant import int_path
    return int_path(node)


@pytest.mark.parametrize("t", WEIGHTS, ids=lambda t: t.name)
def test_mul_mat_against_float64(nb, mode, t):
    """Against float64 on the decoded weights and, on the integer path, on the activations as quantized for it
    (ggml's rounding; with Q8_1's stored block sums for Q4_1/Q5_1): float32 sums of exact integer dots."""
    rng = np.random.default_rng(100 + int(t))
    k = max(256, TRAITS[GGMLType(int(t))].blck_size) * 2
    for m, n in ((13, 1), (13, 3), (17, 5), (13, 32)):  # odd row counts: the row groups have a tail
        ctx = pc.Context()
        a, av = _qtensor(ctx, t, k, m, rng, zero_rows=(0, m - 1))
        bv = rng.standard_normal((n, k)).astype(np.float32)
        out = pc.mul_mat(a, ctx.from_numpy(bv))
        pc.compute(pc.Graph().expand(out), nb, strict=True)
        got = out.numpy().reshape(n, m)
        on_int = int_path(out)
        xv = activation_values(bv, t) if on_int else bv.astype(np.float64)
        want = xv @ av.T + (stored_sum_part(bv, t, a.raw()) if on_int else 0.0)
        assert np.all(got[:, 0] == 0) and np.all(got[:, m - 1] == 0)
        scale = np.abs(xv) @ np.abs(av).T + 1e-30
        assert np.max(np.abs(got - want) / scale) < 1e-5, (m, n)


def test_mul_mat_broadcast_and_strided(nb, mode):
    """ggml's batch broadcast (a's matrices serve runs of b's) and a permuted b."""
    rng = np.random.default_rng(7)
    ctx = pc.Context()
    t, k = GT.Q4_K, 256
    raw = random_blocks(t, 2 * 9, rng).reshape(1, 2, 9, -1)
    a = ctx.new_tensor(GGMLType.Q4_K, (k, 9, 2))
    a.set_raw(raw)
    av = gq.dequantize(raw, t).astype(np.float64)  # (1, 2, 9, k)
    bv = rng.standard_normal((3, 4, 5, k)).astype(np.float32)
    b = pc.permute(ctx.from_numpy(np.ascontiguousarray(bv.transpose(0, 2, 1, 3))), 0, 2, 1, 3)
    out = pc.mul_mat(a, b)  # a (1, 2) broadcast onto b (3, 4): each a matrix serves two b matrices
    pc.compute(pc.Graph().expand(out), nb, strict=True)
    # on the integer path (every row count of Q4_K) against the activations as quantized for it
    xv = activation_values(bv.reshape(-1, k), t).reshape(bv.shape) if int_path(out) else bv.astype(np.float64)
    want = np.einsum("xynk,xymk->xynm", xv, np.repeat(np.repeat(av, 3, 0), 2, 1))
    assert np.allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("t", (GT.Q8_0, GT.Q5_0, GT.Q4_K, GT.Q6_K, GT.IQ2_XXS, GT.IQ4_XS), ids=lambda t: t.name)
def test_get_rows_bit_for_bit(nb, mode, t):
    rng = np.random.default_rng(3)
    ctx = pc.Context()
    k = TRAITS[GGMLType(int(t))].blck_size * 2
    a, av = _qtensor(ctx, t, k, 11, rng, zero_rows=(4,))
    idx = np.array([10, 0, 4, 4, 7], np.int32)
    out = pc.get_rows(a, ctx.from_numpy(idx))
    pc.compute(pc.Graph().expand(out), nb, strict=True)
    assert np.array_equal(out.numpy(), av[idx].astype(np.float32))
    assert not out.numpy()[2:4].any()


def test_get_rows_zero_indices_is_refused_cleanly(nb):
    """An empty index vector is an empty result: refused (falls back), never a crash."""
    ctx = pc.Context()
    a, _ = _qtensor(ctx, GT.Q8_0, 32, 3, np.random.default_rng(0))
    node = pc.get_rows(a, ctx.new_tensor(pc.I32, (0,)))
    assert not nb.supports(node) and "empty" in nb.why_unsupported(node)


def test_mul_mat_id_and_out_prod(nb, mode):
    rng = np.random.default_rng(11)
    ctx = pc.Context()
    t, k = GT.Q6_K, 256
    raw = random_blocks(t, 4 * 5, rng).reshape(1, 4, 5, -1)
    w = ctx.new_tensor(GGMLType.Q6_K, (k, 5, 4))
    w.set_raw(raw)
    wv = gq.dequantize(raw, t).astype(np.float64)[0]  # (4 experts, 5, k)
    bv = rng.standard_normal((3, 2, k)).astype(np.float32)
    ids = np.array([[0, 3], [2, 2], [1, 0]], np.int32)
    out = pc.mul_mat_id(w, ctx.from_numpy(bv), ctx.from_numpy(ids))
    pc.compute(pc.Graph().expand(out), nb, strict=True)
    want = np.einsum("temk,tek->tem", wv[ids], bv.astype(np.float64))
    assert np.allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)

    a, av = _qtensor(ctx, GT.Q5_0, 64, 7, rng)  # OUT_PROD: out[j, i] = sum_t a[t, i] b[t, j]
    b2 = rng.standard_normal((7, 3)).astype(np.float32)
    op = pc.out_prod(a, ctx.from_numpy(b2))
    pc.compute(pc.Graph().expand(op), nb, strict=True)
    assert np.allclose(op.numpy(), b2.T.astype(np.float64) @ av, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("half", (np.float16, "bf16"), ids=("F16", "BF16"))
def test_mul_mat_and_out_prod_with_half_b(nb, mode, half):
    """The F32 gap closed: a 16-bit second source is converted exactly, then the F32 kernels."""
    rng = np.random.default_rng(5)
    ctx = pc.Context()
    av = rng.standard_normal((6, 40)).astype(np.float32)
    bv = rng.standard_normal((3, 40)).astype(np.float32)
    if half == "bf16":
        b = ctx.new_tensor(pc.BF16, (40, 3)).set(bv)
    else:
        b = ctx.from_numpy(bv.astype(np.float16))
    bq = b.numpy().astype(np.float64)  # the values it holds
    mm = pc.mul_mat(ctx.from_numpy(av), b)
    c = ctx.from_numpy(rng.standard_normal((3, 6)).astype(np.float32))
    op = pc.out_prod(c, b)
    pc.compute(pc.Graph().expand(mm).expand(op), nb, strict=True)
    assert np.allclose(mm.numpy(), bq @ av.T.astype(np.float64), rtol=1e-5, atol=1e-4)
    assert np.allclose(op.numpy(), bq.T @ c.numpy().astype(np.float64), rtol=1e-5, atol=1e-4)


def test_conv_2d_with_f16_kernel_stays_on_numba(nb):
    rng = np.random.default_rng(2)
    ctx = pc.Context()
    kern = ctx.from_numpy(rng.standard_normal((4, 3, 3, 3)).astype(np.float16))
    x = ctx.from_numpy(rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    out = pc.conv_2d_im2col(kern, x, 1, 1, 1, 1, 1, 1)
    g = pc.Graph().expand(out)
    pc.compute(g, nb, strict=True)  # strict: a fallback would raise
    ref = pc.Graph().expand(pc.conv_2d_im2col(kern, x, 1, 1, 1, 1, 1, 1))
    pc.compute(ref, pc.backend("numpy"))
    assert np.allclose(out.numpy(), ref.nodes[-1].numpy(), rtol=1e-4, atol=1e-4)


def test_quantizing_copies_match_the_reference_bytes(nb):
    """CPY into a block type goes through prism_core.quant (ggml's reference quantizer): the bytes
    equal gguf.quants' own reference quantizer for the formats it has."""
    rng = np.random.default_rng(9)
    ctx = pc.Context()
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[2] = 0.0
    dst = ctx.new_tensor(GGMLType.Q4_0, (64, 5))
    node = pc.cpy(ctx.from_numpy(x), dst)
    pc.compute(pc.Graph().expand(node), nb, strict=True)
    assert np.array_equal(dst.raw().reshape(5, -1), gq.quantize(x, GT.Q4_0))
