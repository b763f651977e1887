"""csimd's quantized C kernels called directly (csrc/csimd_quant*.h), on every ISA path this CPU runs:
dequantize against gguf.quants (bit for bit), the quantizers against gguf.quants' reference ones and
hand-written NumPy versions of ggml's CPU activation quantizers, and the integer dot products and
mul_mat against float64 NumPy on the dequantized operands."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

import prism_core as pc
from prism_core.types import TRAITS, GGMLType

QBASE = 64  # csrc/csimd.h: CSIMD_QBASE
ISAS = ("scalar", "avx2", "avx512", "avxvnni", "neon", "dotprod", "i8mm")  # CSIMD_ISA_* order

# where each format keeps its fp16 scale fields (byte offsets in a block): random blocks get finite scales there
F16_FIELDS = {
    GT.Q4_0: (0,), GT.Q4_1: (0, 2), GT.Q5_0: (0,), GT.Q5_1: (0, 2), GT.Q8_0: (0,), GT.Q8_1: (0, 2),
    GT.Q2_K: (80, 82), GT.Q3_K: (108,), GT.Q4_K: (0, 2), GT.Q5_K: (0, 2), GT.Q6_K: (208,),
    GT.IQ2_XXS: (0,), GT.IQ2_XS: (0,), GT.IQ2_S: (0,), GT.IQ3_XXS: (0,), GT.IQ3_S: (0,), GT.IQ1_S: (0,),
    GT.IQ4_NL: (0,), GT.IQ4_XS: (0,), GT.TQ1_0: (52,), GT.TQ2_0: (64,), GT.Q8_K: (), GT.IQ1_M: (), GT.MXFP4: (),
}
FORMATS = tuple(F16_FIELDS)
# ggml's vec_dot_type: what the CPU backend quantizes activations to for each weight format
VEC_DOT = {t: GT.Q8_K for t in FORMATS}
VEC_DOT.update({GT.Q4_0: GT.Q8_0, GT.Q5_0: GT.Q8_0, GT.Q8_0: GT.Q8_0, GT.IQ4_NL: GT.Q8_0, GT.MXFP4: GT.Q8_0,
                GT.Q4_1: GT.Q8_1, GT.Q5_1: GT.Q8_1, GT.Q8_1: GT.Q8_1})
# gguf.quants has these reference quantizers; csimd carries the same
REF_QUANTIZERS = (GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.MXFP4, GT.TQ1_0, GT.TQ2_0)


def _block(t: GT) -> tuple[int, int]:
    """(elements, bytes) of a block, as Prism declares them (gguf's table still has Q8_1's old 40 bytes;
    ggml's block_q8_1 is d, s fp16 and 32 int8 = 36)."""
    tr = TRAITS[GGMLType(int(t))]
    return tr.blck_size, tr.type_size


@pytest.fixture(scope="module")
def cs():
    info = next((i for i in pc.backends() if i.name == "csimd"), None)
    if info is None or not info.available:
        pytest.skip(f"csimd unavailable here: {info.reason if info else 'not registered'}")
    pc.backend("csimd")
    from prism_csimd import kernels
    return kernels._state["ffi"], kernels._state["lib"]


@pytest.fixture(params=ISAS)
def isa(request, cs):
    """Runs the test on one ISA path (skipped where the CPU lacks it), restoring the path afterwards."""
    _, lib = cs
    want = ISAS.index(request.param)
    if not lib.csimd_isa_runs(want):
        pytest.skip(f"this CPU does not run the {request.param} path")
    before = lib.csimd_get_isa()
    assert lib.csimd_set_isa(want) == 0
    yield request.param
    lib.csimd_set_isa(before)


def _ptr(ffi, arr: np.ndarray):
    return ffi.cast("void *", ffi.from_buffer(arr))


def random_blocks(t: GT, nblocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random block bytes with finite scales: every bit pattern of the quants, scales in [-1, 1]."""
    _, size = _block(t)
    b = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        b[:, off:off + 2] = rng.uniform(-1, 1, nblocks).astype(np.float16).view(np.uint8).reshape(nblocks, 2)
    if t == GT.Q8_K:
        b[:, 0:4] = rng.uniform(-0.01, 0.01, nblocks).astype(np.float32).view(np.uint8).reshape(nblocks, 4)
    if t == GT.MXFP4:
        b[:, 0] = rng.integers(110, 140, nblocks)
    if t == GT.IQ1_M:  # the fp16 scale sits in the top nibbles of the four scale words
        d = rng.uniform(-1, 1, nblocks).astype(np.float16).view(np.uint16)
        w = b[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for k in range(4):
            w[:, k] |= ((d >> np.uint16(4 * k)) & np.uint16(15)) << np.uint16(12)
        b[:, 48:56] = w.view(np.uint8)
    return b


def hand_dequant(blocks: np.ndarray, t: GT) -> np.ndarray:
    """The two activation formats gguf.quants does not dequantize: Q8_1 = d*q, Q8_K = d(float32)*q."""
    if t == GT.Q8_1:
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        return (d * blocks[:, 4:].view(np.int8).astype(np.float32)).reshape(-1)
    d = blocks[:, 0:4].copy().view(np.float32)
    return (d * blocks[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)


def dequant(blocks: np.ndarray, t: GT) -> np.ndarray:
    if t in (GT.Q8_1, GT.Q8_K):
        return hand_dequant(blocks, t)
    return gq.dequantize(blocks, t).reshape(-1)


def c_dequant(cs, blocks: np.ndarray, t: GT, nth: int = 1) -> np.ndarray:
    ffi, lib = cs
    be, _ = _block(t)
    out = np.full(blocks.shape[0] * be, np.nan, dtype=np.float32)
    assert lib.csimd_q_dequantize(int(t), _ptr(ffi, np.ascontiguousarray(blocks)), ffi.from_buffer("float[]", out),
                                  out.size, nth) == 0
    return out


def c_quant(cs, x: np.ndarray, t: GT, mode: int) -> np.ndarray:
    ffi, lib = cs
    be, size = _block(t)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.zeros((x.size // be, size), dtype=np.uint8)
    assert lib.csimd_q_quantize(int(t), mode, ffi.from_buffer("float[]", x), _ptr(ffi, out), x.size, 1) == 0
    return out


def test_block_geometry_matches_gguf(cs):
    ffi, lib = cs
    be, bb, hq = ffi.new("int *"), ffi.new("int *"), ffi.new("int *")
    for t in FORMATS:
        assert lib.csimd_q_info(int(t), be, bb, hq) == 0, t.name
        assert (be[0], bb[0]) == _block(t), t.name
    assert lib.csimd_q_info(int(GT.F32), be, bb, hq) == -1
    assert lib.csimd_q_info(int(GT.F16), be, bb, hq) == -1


@pytest.mark.parametrize("t", FORMATS, ids=lambda t: t.name)
def test_dequantize_bit_exact(cs, isa, t):
    rng = np.random.default_rng(int(t) * 7 + len(isa))
    blocks = random_blocks(t, 37, rng)  # odd count, > one 16 KiB chunk for the 256-element formats
    want = dequant(blocks, t)
    got = c_dequant(cs, blocks, t)
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(c_dequant(cs, blocks, t, nth=2), got)


def test_dequantize_hand_values(cs):
    # Q4_0 block: d = 0.5, nibbles j -> element j (low) and j+16 (high): y = (q - 8) * d
    blk = np.zeros(18, dtype=np.uint8)
    blk[0:2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    blk[2] = 0x0F | (0x00 << 4)  # element 0: q=15 -> 3.5, element 16: q=0 -> -4
    blk[3:18] = 0x88  # q = 8 -> 0
    y = c_dequant(cs, blk.reshape(1, -1), GT.Q4_0)
    assert y[0] == 3.5 and y[16] == -4.0 and np.all(y[1:16] == 0) and np.all(y[17:] == 0)
    # Q6_K: all q6 = 32 + 1 (ql low nibble 1, qh 2), scales 2, d = 0.25 -> every value 0.25*2*1 = 0.5
    blk = np.zeros(210, dtype=np.uint8)
    blk[0:128] = 0x11
    blk[128:192] = 0xAA
    blk[192:208] = 2
    blk[208:210] = np.array([0.25], dtype=np.float16).view(np.uint8)
    assert np.all(c_dequant(cs, blk.reshape(1, -1), GT.Q6_K) == 0.5)


def test_dequantize_refuses_partial_blocks(cs):
    ffi, lib = cs
    out = np.zeros(64, dtype=np.float32)
    src = np.zeros(64, dtype=np.uint8)
    assert lib.csimd_q_dequantize(int(GT.Q4_0), _ptr(ffi, src), ffi.from_buffer("float[]", out), 33, 1) == -1
    assert lib.csimd_q_dequantize(int(GT.F32), _ptr(ffi, src), ffi.from_buffer("float[]", out), 32, 1) == -1


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows with the corners: zeros, constants, one outlier, negative-only, exact ties."""
    x = rng.standard_normal(n).astype(np.float32)
    x[0:32] = 0.0
    x[32:64] = 1.5
    x[64:96] = rng.standard_normal(32) * 0.01
    x[70] = -40.0
    x[96:128] = -np.abs(x[96:128])
    x[128:160] = np.arange(-16, 16, dtype=np.float32) * 0.5  # values on the quantization ties
    return x


@pytest.mark.parametrize("t", REF_QUANTIZERS, ids=lambda t: t.name)
def test_reference_quantizers_match_gguf(cs, t):
    rng = np.random.default_rng(int(t))
    x = _rows(rng, 512 * 3)
    want = gq.quantize(x.reshape(3, 512), t).reshape(-1, _block(t)[1])
    np.testing.assert_array_equal(c_quant(cs, x, t, mode=1), want)


@pytest.mark.parametrize("t", (GT.Q2_K, GT.Q4_K, GT.Q5_K, GT.Q6_K), ids=lambda t: t.name)
def test_k_quantizers_match_prism_core(cs, t):
    """ggml's searching reference quantizers in C against prism_core.quant's NumPy port (bit for bit)."""
    from prism_core.quant import quantize
    rng = np.random.default_rng(int(t) + 31)
    x = np.concatenate([_rows(rng, 1024), rng.standard_normal(2048).astype(np.float32) * 3,
                        np.zeros(256, np.float32), np.abs(rng.standard_normal(512)).astype(np.float32) + 0.5,
                        (rng.standard_normal(4096) * np.exp(rng.uniform(-8, 8, 4096))).astype(np.float32),
                        np.repeat(rng.standard_normal(64), 16).astype(np.float32)]).reshape(-1, 256)
    x[5, 17] = 1e-20  # a group that is zero but for a denormal-size value
    np.testing.assert_array_equal(c_quant(cs, x, t, mode=1), quantize(x, GGMLType(int(t))).reshape(-1, _block(t)[1]))


def _np_q8_0_cpu(x: np.ndarray, with_sum: bool) -> np.ndarray:
    """ggml's CPU Q8_0/Q8_1 activation quantizer written out: d = amax/127, id = 127/amax, ties to even."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
    q = np.rint(xb * idv).astype(np.int8)
    parts = [d.astype(np.float16).view(np.uint8)]
    if with_sum:
        parts.append((d * q.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32)).astype(np.float16)
                     .view(np.uint8))
    return np.concatenate(parts + [q.view(np.uint8)], axis=1)


def _np_q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's Q8_K reference: iscale = -127/max (max: the first value of largest magnitude), nearest, d = 1/iscale."""
    xb = x.reshape(-1, 256).astype(np.float32)
    out = np.zeros((xb.shape[0], 292), dtype=np.uint8)
    for i, row in enumerate(xb):
        j = int(np.argmax(np.abs(row)))
        if row[j] == 0:
            continue
        iscale = np.float32(-127) / row[j]
        q = np.minimum(127, np.rint(iscale * row)).astype(np.int8)
        out[i, 0:4] = np.array([np.float32(1) / iscale], dtype=np.float32).view(np.uint8)
        out[i, 4:260] = q.view(np.uint8)
        out[i, 260:292] = q.reshape(16, 16).astype(np.int16).sum(axis=1).astype(np.int16).view(np.uint8)
    return out


def test_activation_quantizers_as_ggml_cpu(cs):
    rng = np.random.default_rng(5)
    x = _rows(rng, 1024)
    np.testing.assert_array_equal(c_quant(cs, x, GT.Q8_0, mode=0), _np_q8_0_cpu(x, False))
    np.testing.assert_array_equal(c_quant(cs, x, GT.Q8_1, mode=0), _np_q8_0_cpu(x, True))
    np.testing.assert_array_equal(c_quant(cs, x, GT.Q8_K, mode=0), _np_q8_k(x))
    # the tie 0.5 * 127/amax: with amax = 127 the products are exact halves; CPU: to even, reference: away from zero
    t = np.zeros(32, dtype=np.float32)
    t[0], t[1], t[2] = 127.0, 2.5, -3.5
    cpu = c_quant(cs, t, GT.Q8_0, mode=0)[0, 2:].view(np.int8)
    ref = c_quant(cs, t, GT.Q8_0, mode=1)[0, 2:].view(np.int8)
    assert (cpu[1], cpu[2]) == (2, -4) and (ref[1], ref[2]) == (3, -4)


@pytest.mark.parametrize("at", (GT.Q8_0, GT.Q8_1, GT.Q8_K), ids=lambda t: t.name)
def test_activation_quantizers_match_prism_core(cs, at):
    """Against prism_core.quant.quantize_activations, written separately from the same ggml (x86) rules."""
    from prism_core.quant import quantize_activations
    rng = np.random.default_rng(int(at) + 21)
    x = _rows(rng, 2048).reshape(2, 1024)
    want = quantize_activations(x, GGMLType(int(at))).reshape(-1, _block(at)[1])
    np.testing.assert_array_equal(c_quant(cs, x, at, mode=0), want)


def test_vec_dot_types_are_the_traits(cs):
    """The weight -> activation pairing these tests assume is the one the core declares (ggml's)."""
    for t in FORMATS:
        if t not in (GT.Q8_1, GT.Q8_K):
            assert int(TRAITS[GGMLType(int(t))].vec_dot_type) == int(VEC_DOT[t]), t.name


def _vec_dot(cs, wt: GT, w: np.ndarray, at: GT, a: np.ndarray, k: int, rows: int) -> np.ndarray:
    ffi, lib = cs
    out = np.full(rows, np.nan, dtype=np.float32)
    assert lib.csimd_q_vec_dot(int(wt), _ptr(ffi, w), int(at), _ptr(ffi, a), k, rows,
                               ffi.from_buffer("float[]", out)) == 0
    return out


def q8_1_sum_correction(w: np.ndarray, t: GT, a: np.ndarray, at: GT, rows_w: int, rows_a: int) -> np.ndarray:
    """ggml's Q4_1/Q5_1 x Q8_1 dot products pair each weight block's min m with the activation block's
    stored F16 s = d * sum(q), not with the sum of its decoded values: what that changes in each
    product of weight row i with activation row j, [rows_a, rows_w] (0 for other pairs)."""
    if at != GT.Q8_1:
        return np.zeros((rows_a, rows_w))
    m = w[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(rows_w, -1)
    s = a[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(rows_a, -1)
    decoded = dequant(a, at).astype(np.float64).reshape(rows_a, -1, 32).sum(axis=2)
    return (s - decoded) @ m.T


@pytest.mark.parametrize("t", FORMATS, ids=lambda t: t.name)
def test_vec_dot_against_float64(cs, isa, t):
    rng = np.random.default_rng(int(t) + 100)
    k, rows = 512, 5
    w = random_blocks(t, rows * k // _block(t)[0], rng)
    at = VEC_DOT[t]
    x = rng.standard_normal(rows * k).astype(np.float32)
    a = c_quant(cs, x, at, mode=0)
    wf = dequant(w, t).astype(np.float64).reshape(rows, k)
    af = dequant(a, at).astype(np.float64).reshape(rows, k)
    want = (wf * af).sum(axis=1) + np.diag(q8_1_sum_correction(w, t, a, at, rows, rows))
    got = _vec_dot(cs, t, w, at, a, k, rows)
    scale = (np.abs(wf) * np.abs(af)).sum(axis=1)
    assert np.all(np.abs(got - want) <= 2e-6 * scale + 1e-30), (got, want)


def _desc(ffi, arr: np.ndarray, ne, nb, typ: int):
    return ffi.new("csimd_tensor *", (ffi.cast("char *", ffi.from_buffer(arr)), tuple(ne), tuple(nb), typ))


def c_mul_mat(cs, t: GT, wblocks: np.ndarray, ne_w, b: np.ndarray, nth: int, at: GT | None = None) -> np.ndarray:
    """d = mul_mat(w, b): w [K, M, w2, w3] of type t (rows of blocks), b F32 given as a NumPy array of shape
    (b3, b2, N, K) possibly strided; d F32 (b3, b2, N, M)."""
    ffi, lib = cs
    K, M, w2, w3 = ne_w
    be, bb = _block(t)
    row = K // be * bb
    wd = _desc(ffi, wblocks, (K, M, w2, w3), (bb, row, row * M, row * M * w2), QBASE + int(t))
    b3, b2, N, _ = b.shape
    root = b  # b may be a strided view: hand C its first element and its byte strides
    while isinstance(root.base, np.ndarray):
        root = root.base
    ptr = ffi.cast("char *", ffi.from_buffer(root)) + (b.ctypes.data - root.ctypes.data)
    bdesc = ffi.new("csimd_tensor *", (ptr, (K, N, b2, b3), tuple(reversed(b.strides)), 0))
    d = np.full((b3, b2, N, M), np.nan, dtype=np.float32)
    dd = _desc(ffi, d, (M, N, b2, b3), (4, 4 * M, 4 * M * N, 4 * M * N * b2), 0)
    assert lib.csimd_q_mul_mat(wd, bdesc, dd, int(at or VEC_DOT[t]), nth) == 0
    return d


def _mul_mat_case(cs, t: GT, K: int, M: int, N: int, w23, b23, nth: int, permuted: bool, rng):
    w2, w3 = w23
    b2, b3 = b23
    be, _ = _block(t)
    w = random_blocks(t, w3 * w2 * M * K // be, rng)
    if permuted:  # b stored as (b3, b2, K, N) and viewed as (b3, b2, N, K): non-contiguous rows
        b = rng.standard_normal((b3, b2, K, N)).astype(np.float32).transpose(0, 1, 3, 2)
    else:
        b = rng.standard_normal((b3, b2, N, K)).astype(np.float32)
    if N > 1:
        b[..., 0, :] = 0.0  # a row of zeros
    got = c_mul_mat(cs, t, w, (K, M, w2, w3), b, nth)
    at = VEC_DOT[t]
    ab = c_quant(cs, np.ascontiguousarray(b), at, mode=0)
    bq = dequant(ab, at).astype(np.float64).reshape(b.shape)
    ab = ab.reshape(b3, b2, N * K // _block(at)[0], -1)
    wf = dequant(w, t).astype(np.float64).reshape(w3, w2, M, K)
    wb = w.reshape(w3, w2, M * K // be, -1)
    want = np.empty((b3, b2, N, M))
    wabs = np.empty_like(want)
    for i3 in range(b3):
        for i2 in range(b2):
            wm = wf[i3 // (b3 // w3), i2 // (b2 // w2)]
            want[i3, i2] = bq[i3, i2] @ wm.T + q8_1_sum_correction(
                wb[i3 // (b3 // w3), i2 // (b2 // w2)], t, ab[i3, i2], at, M, N)
            wabs[i3, i2] = np.abs(bq[i3, i2]) @ np.abs(wm).T
    assert np.all(np.abs(got - want) <= 2e-6 * wabs + 1e-30), np.max(np.abs(got - want) / (wabs + 1e-30))
    assert N == 1 or np.all(got[..., 0, :] == 0.0)


PRIORITY = (GT.Q4_0, GT.Q8_0, GT.Q4_K, GT.Q6_K, GT.Q5_0)


@pytest.mark.parametrize("t", PRIORITY, ids=lambda t: t.name)
@pytest.mark.parametrize("nth", (1, 2))
def test_mul_mat_priority_formats(cs, isa, t, nth):
    rng = np.random.default_rng(int(t) * 3 + nth)
    _mul_mat_case(cs, t, 512, 13, 7, (1, 1), (1, 1), nth, False, rng)  # odd M and N
    _mul_mat_case(cs, t, 256, 9, 1, (1, 1), (1, 1), nth, False, rng)  # matrix-vector (weights read from blocks)
    for m in (6, 7, 19):  # the fused kernels' passes of 4 weight rows, a remainder of 2 or 3, rows prefetched ahead
        _mul_mat_case(cs, t, 320 if _block(t)[0] == 32 else 512, m, 1, (1, 1), (1, 1), nth, False, rng)
    if _block(t)[0] == 32:
        _mul_mat_case(cs, t, 96, 5, 1, (1, 1), (1, 1), nth, False, rng)  # K not a multiple of 64
    for n in (2, 9, 16):  # batched decoding: up to 8 rows per pass over a weight row (csimd_quant_batch.h)
        _mul_mat_case(cs, t, 640 if _block(t)[0] == 32 else 768, 21, n, (1, 1), (1, 1), nth, False, rng)
    _mul_mat_case(cs, t, 256, 5, 70, (2, 1), (4, 3), nth, True, rng)  # broadcast over dims 2/3, > one tile, permuted


def _identity_blocks(t: GT, k: int) -> np.ndarray:
    """k rows of k weights of type t (Q8_0 or Q6_K): row j is 1 at j and 0 elsewhere (d = 1, scales 1)."""
    be, size = _block(t)
    b = np.zeros((k, k // be, size), dtype=np.uint8)
    one = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)
    if t == GT.Q8_0:
        b[:, :, 0:2] = one
        for j in range(k):
            b[j, j // 32, 2 + j % 32] = 1
        return b.reshape(k, -1)
    b[:, :, 208:210] = one  # Q6_K: d = 1, the 16 scales 1, stored values q + 32 (low 4 bits in ql, high 2 in qh)
    b[:, :, 192:208] = 1
    b[:, :, 0:128] = 0x00
    b[:, :, 128:192] = 0xAA  # q + 32 = 32 everywhere: high bits 2 in each 2-bit field
    for j in range(k):
        e, blk = j % 256, b[j, j // 256]
        h, r = divmod(e, 128)
        quarter, lane = divmod(r, 32)  # elements l, l + 32, l + 64, l + 96 of a half: ql[l] low, ql[l+32] low, high...
        byte = 64 * h + lane + (32 if quarter % 2 else 0)
        blk[byte] |= 1 << (4 if quarter >= 2 else 0)  # q + 32 = 33
    return b.reshape(k, -1)


def _activation_rows(rng: np.random.Generator, k: int) -> list[np.ndarray]:
    """F32 rows with the quantizers' corners: ties, equal magnitudes of both signs, zero and tiny blocks, a
    NaN and an infinity in one block (their rows alone)."""
    x = _rows(rng, k)
    x[256:288] = 0.0
    x[256], x[257], x[258], x[259], x[260] = -127.0, 2.5, -3.5, 0.5, -1.5  # Q8_K scale 1 and Q8_0 127/127: exact ties
    x[300], x[310] = -9.0, 9.0  # the first of equal magnitudes sets Q8_K's sign
    x[520], x[530] = 9.0, -9.0
    x[600:632] = 1e-41  # subnormal
    nan, inf = x.copy(), x.copy()
    nan[700] = np.nan
    inf[800] = -np.inf
    return [x, -x, nan, inf]


@pytest.mark.parametrize("t", (GT.Q8_0, GT.Q6_K), ids=lambda t: t.name)
@pytest.mark.parametrize("n", (1, 4))
def test_mul_mat_sees_activations_as_quantized(cs, isa, t, n):
    """With identity weights, mul_mat returns the activations as quantized (to Q8_0 / Q8_K), exactly: the
    vectorised quantizers of the product paths against NumPy's versions of ggml's CPU ones (and C's scalar
    quantizer where a block holds a NaN or an infinity)."""
    k = 1024
    at = VEC_DOT[t]
    w = _identity_blocks(t, k)
    np.testing.assert_array_equal(dequant(w, t).reshape(k, k), np.eye(k, dtype=np.float32))
    rows = _activation_rows(np.random.default_rng(int(t) + n), k)
    for i in range(0, len(rows), n):
        b = np.stack(rows[i:i + n]).reshape(1, 1, n, k)
        got = c_mul_mat(cs, t, w, (k, k, 1, 1), b, 1).reshape(n, k)
        for r, x in zip(got, rows[i:i + n]):
            if np.isfinite(x).all():
                q = _np_q8_0_cpu(x, False) if at == GT.Q8_0 else _np_q8_k(x)
            else:
                q = c_quant(cs, x, at, mode=0)
            with np.errstate(invalid="ignore"):  # the infinity's block: inf * 0
                bq = dequant(q, at)
                want = bq if np.isfinite(bq).all() else (np.eye(k) @ bq.astype(np.float64)).astype(np.float32)
            np.testing.assert_array_equal(r, want)


@pytest.mark.parametrize("t", [t for t in FORMATS if t not in PRIORITY], ids=lambda t: t.name)
def test_mul_mat_other_formats(cs, isa, t):
    rng = np.random.default_rng(int(t) * 5)
    _mul_mat_case(cs, t, 512, 6, 3, (1, 1), (2, 1), 2, False, rng)


def test_mul_mat_result_close_to_f32_product(cs):
    """Against the unquantized activations: the Q8 rounding of b costs little (ggml's 5e-4 NMSE bound)."""
    rng = np.random.default_rng(11)
    K, M, N = 1024, 32, 9
    for t in PRIORITY:
        w = random_blocks(t, M * K // _block(t)[0], rng)
        b = rng.standard_normal((1, 1, N, K)).astype(np.float32)
        got = c_mul_mat(cs, t, w, (K, M, 1, 1), b, 2).astype(np.float64)
        want = b[0, 0].astype(np.float64) @ dequant(w, t).astype(np.float64).reshape(M, K).T
        nmse = np.sum((got[0, 0] - want) ** 2) / np.sum(want ** 2)
        assert nmse < 5e-4, (t.name, nmse)


def test_mul_mat_refuses_bad_descriptors(cs):
    ffi, lib = cs
    w = np.zeros((4, 18), dtype=np.uint8)
    b = np.zeros((2, 32), dtype=np.float32)
    d = np.zeros((2, 4), dtype=np.float32)
    wd = _desc(ffi, w, (32, 4, 1, 1), (18, 18, 72, 72), QBASE + int(GT.Q4_0))
    bd = _desc(ffi, b, (32, 2, 1, 1), (4, 128, 256, 256), 0)
    dd = _desc(ffi, d, (4, 2, 1, 1), (4, 16, 32, 32), 0)
    assert lib.csimd_q_mul_mat(wd, bd, dd, int(GT.Q8_0), 1) == 0
    assert lib.csimd_q_mul_mat(wd, bd, dd, int(GT.Q4_0), 1) == -1  # not an activation type
    assert lib.csimd_q_mul_mat(wd, bd, dd, int(GT.Q8_K), 1) == -1  # K = 32 is not a multiple of 256
    wbad = _desc(ffi, w, (32, 4, 1, 1), (18, 18, 72, 72), 0)  # weights not quantized
    assert lib.csimd_q_mul_mat(wbad, bd, dd, int(GT.Q8_0), 1) == -1
    wpart = _desc(ffi, w, (16, 4, 1, 1), (18, 18, 72, 72), QBASE + int(GT.Q4_0))  # half a block
    assert lib.csimd_q_mul_mat(wpart, bd, dd, int(GT.Q8_0), 1) == -1


def _qdesc(ffi, blocks: np.ndarray, t: GT, ne):
    """A contiguous quantized tensor [ne0, ne1, ne2, ne3] over blocks."""
    be, bb = _block(t)
    row = ne[0] // be * bb
    return _desc(ffi, blocks, ne, (bb, row, row * ne[1], row * ne[1] * ne[2]), QBASE + int(t))


def _fdesc(ffi, arr: np.ndarray, typ: int = 0):
    """An F32 (or I32 with typ=3) C-contiguous NumPy array of shape (ne3, ne2, ne1, ne0) as a descriptor."""
    shape = (1,) * (4 - arr.ndim) + arr.shape
    return _desc(ffi, arr, tuple(reversed(shape)), tuple(reversed(np.empty(shape, arr.dtype).strides)), typ)


@pytest.mark.parametrize("t", (GT.Q4_0, GT.Q4_K, GT.Q6_K, GT.IQ2_XS), ids=lambda t: t.name)
def test_mul_mat_id_against_float64(cs, isa, t):
    ffi, lib = cs
    rng = np.random.default_rng(int(t) + 7)
    K, M, E, n_used, n_tok, nb1 = 256, 6, 4, 2, 5, 2
    w = random_blocks(t, E * M * K // _block(t)[0], rng)
    b = rng.standard_normal((n_tok, nb1, K)).astype(np.float32)
    ids = rng.integers(0, E, (n_tok, n_used)).astype(np.int32)
    ids[0] = [3, 3]  # one expert twice for a token
    d = np.full((n_tok, n_used, M), np.nan, dtype=np.float32)
    rc = lib.csimd_q_mul_mat_id(_qdesc(ffi, w, t, (K, M, E, 1)), _fdesc(ffi, b), _fdesc(ffi, ids, 3), _fdesc(ffi, d),
                                int(VEC_DOT[t]), 2)
    assert rc == 0
    at = VEC_DOT[t]
    bq = dequant(c_quant(cs, b, at, 0), at).astype(np.float64).reshape(b.shape)
    wf = dequant(w, t).astype(np.float64).reshape(E, M, K)
    for tk in range(n_tok):
        for e in range(n_used):
            want = wf[ids[tk, e]] @ bq[tk, e % nb1]
            scale = np.abs(wf[ids[tk, e]]) @ np.abs(bq[tk, e % nb1])
            assert np.all(np.abs(d[tk, e] - want) <= 2e-6 * scale + 1e-30)
    bad = ids.copy()
    bad[1, 1] = E
    assert lib.csimd_q_mul_mat_id(_qdesc(ffi, w, t, (K, M, E, 1)), _fdesc(ffi, b), _fdesc(ffi, bad, 3),
                                  _fdesc(ffi, d), int(at), 1) == -1


@pytest.mark.parametrize("t", (GT.Q8_0, GT.Q5_K, GT.IQ3_S, GT.TQ1_0), ids=lambda t: t.name)
def test_get_rows_dequantizes_chosen_rows(cs, isa, t):
    ffi, lib = cs
    rng = np.random.default_rng(int(t) + 9)
    K, R, B = 512, 7, 2
    w = random_blocks(t, B * R * K // _block(t)[0], rng)
    idx = np.array([[6, 0, 6], [1, 2, 5]], dtype=np.int32)  # per batch matrix, a repeat included
    d = np.full((B, 3, K), np.nan, dtype=np.float32)
    assert lib.csimd_q_get_rows(_qdesc(ffi, w, t, (K, R, B, 1)), _fdesc(ffi, idx, 3), _fdesc(ffi, d), 2) == 0
    wf = dequant(w, t).reshape(B, R, K)
    for j in range(B):
        np.testing.assert_array_equal(d[j], wf[j][idx[j]])
    before = d.copy()
    for bad in (R, -1):  # an index out of range: refused before any row is written
        idx[1, 2] = bad
        assert lib.csimd_q_get_rows(_qdesc(ffi, w, t, (K, R, B, 1)), _fdesc(ffi, idx, 3), _fdesc(ffi, d), 1) == -1
        np.testing.assert_array_equal(d, before)


@pytest.mark.parametrize("t", REF_QUANTIZERS + (GT.Q8_1, GT.Q8_K), ids=lambda t: t.name)
def test_cpy_both_ways(cs, isa, t):
    ffi, lib = cs
    rng = np.random.default_rng(int(t) + 11)
    x = _rows(rng, 3 * 512).reshape(3, 512)
    q = np.zeros((3 * 512 // _block(t)[0], _block(t)[1]), dtype=np.uint8)
    assert lib.csimd_q_cpy(_fdesc(ffi, x), _qdesc(ffi, q, t, (512, 3, 1, 1)), 1, 2) == 0
    np.testing.assert_array_equal(q, c_quant(cs, x, t, 1))
    # quantized [512, 3] -> F32 [256, 6]: the same elements in row-major order
    y = np.full((6, 256), np.nan, dtype=np.float32)
    assert lib.csimd_q_cpy(_qdesc(ffi, q, t, (512, 3, 1, 1)), _fdesc(ffi, y), 0, 2) == 0
    np.testing.assert_array_equal(y.reshape(-1), dequant(q, t))
    # a transposed F32 source: logical order, not memory order
    xt = np.ascontiguousarray(x.T)  # memory (512, 3); view it as [3, 512]^T
    src = _desc(ffi, xt, (512, 3, 1, 1), (12, 4, 4 * 1536, 4 * 1536), 0)
    q2 = np.zeros_like(q)
    assert lib.csimd_q_cpy(src, _qdesc(ffi, q2, t, (512, 3, 1, 1)), 1, 1) == 0
    np.testing.assert_array_equal(q2, q)


def test_cpy_refuses_types_without_quantizer(cs):
    ffi, lib = cs
    x = np.zeros((1, 256), dtype=np.float32)
    q = np.zeros((1, 66), dtype=np.uint8)  # IQ2_XXS: ggml's quantizer needs an importance matrix
    assert lib.csimd_q_cpy(_fdesc(ffi, x), _qdesc(ffi, q, GT.IQ2_XXS, (256, 1, 1, 1)), 1, 1) == -1
    assert not q.any()


@pytest.mark.parametrize("t", (GT.Q4_0, GT.Q8_0, GT.Q5_1), ids=lambda t: t.name)
def test_set_rows_quantizes_into_rows(cs, isa, t):
    ffi, lib = cs
    rng = np.random.default_rng(int(t) + 13)
    K, R = 64, 5
    dst = random_blocks(t, R * K // 32, rng)
    before = dst.copy().reshape(R, -1)
    b = rng.standard_normal((3, K)).astype(np.float32)
    idx = np.array([4, 1, 4], dtype=np.int64)  # row 4 twice: the last one stays
    assert lib.csimd_q_set_rows(_fdesc(ffi, b), _fdesc(ffi, idx, 4), _qdesc(ffi, dst, t, (K, R, 1, 1)), 1, 2) == 0
    rows = dst.reshape(R, -1)
    np.testing.assert_array_equal(rows[1], c_quant(cs, b[1], t, 1).reshape(-1))
    np.testing.assert_array_equal(rows[4], c_quant(cs, b[2], t, 1).reshape(-1))
    for r in (0, 2, 3):
        np.testing.assert_array_equal(rows[r], before[r])
    idx[0] = R
    assert lib.csimd_q_set_rows(_fdesc(ffi, b), _fdesc(ffi, idx, 4), _qdesc(ffi, dst, t, (K, R, 1, 1)), 1, 1) == -1
    np.testing.assert_array_equal(dst.reshape(R, -1)[4], c_quant(cs, b[2], t, 1).reshape(-1))  # nothing written


@pytest.mark.parametrize("t", (GT.Q4_K, GT.Q8_0), ids=lambda t: t.name)
def test_out_prod_dequantizes_a(cs, isa, t):
    ffi, lib = cs
    rng = np.random.default_rng(int(t) + 15)
    n0, K, n1 = 256, 5, 3  # a [n0, K], b [n1, K] -> d [n0, n1]
    a = random_blocks(t, K * n0 // _block(t)[0], rng)
    b = rng.standard_normal((K, n1)).astype(np.float32)
    d = np.full((n1, n0), np.nan, dtype=np.float32)
    assert lib.csimd_q_out_prod(_qdesc(ffi, a, t, (n0, K, 1, 1)), _fdesc(ffi, b), _fdesc(ffi, d), 2) == 0
    af = dequant(a, t).astype(np.float64).reshape(K, n0)
    want = b.astype(np.float64).T @ af
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("t", (GT.Q4_0, GT.Q8_0), ids=lambda t: t.name)
def test_add_dequantizes_adds_requantizes(cs, isa, t):
    ffi, lib = cs
    rng = np.random.default_rng(int(t) + 17)
    K, R = 64, 4
    a = random_blocks(t, R * K // 32, rng)
    b = rng.standard_normal((1, K)).astype(np.float32)  # broadcast over a's rows
    s = (dequant(a, t).reshape(R, K) + b).astype(np.float32)
    d = np.zeros_like(a)
    assert lib.csimd_q_add(_qdesc(ffi, a, t, (K, R, 1, 1)), _fdesc(ffi, b), _qdesc(ffi, d, t, (K, R, 1, 1)), 1, 2) == 0
    np.testing.assert_array_equal(d, c_quant(cs, s, t, 1))
    f = np.full((R, K), np.nan, dtype=np.float32)
    assert lib.csimd_q_add(_qdesc(ffi, a, t, (K, R, 1, 1)), _fdesc(ffi, b), _fdesc(ffi, f), 1, 1) == 0
    np.testing.assert_array_equal(f, s)


NONFINITE = -3  # csrc/csimd_quant_api.h: Q_NONFINITE


@pytest.mark.parametrize("t", (GT.Q8_0, GT.Q4_K), ids=lambda t: t.name)
@pytest.mark.parametrize("bad", (np.nan, np.inf, -np.inf))
def test_quantizing_kernels_refuse_non_finite_floats_writing_nothing(cs, t, bad):
    """CPY, SET_ROWS and ADD into a block type return Q_NONFINITE for a NaN or inf among the floats to
    quantize (ADD: a sum made non-finite by a's scale too), with the destination as it was; on 2 threads,
    the bad value in the last row (a thread's second half) and in the first."""
    ffi, lib = cs
    rng = np.random.default_rng(int(t) + 19)
    K, R = 512, 64
    be, bb = _block(t)
    for row in (R - 1, 0):
        x = rng.standard_normal((R, K)).astype(np.float32)
        x[row, K - 3] = bad
        q = random_blocks(t, R * K // be, rng)
        before = q.copy()
        assert lib.csimd_q_cpy(_fdesc(ffi, x), _qdesc(ffi, q, t, (K, R, 1, 1)), 1, 2) == NONFINITE
        xt = np.ascontiguousarray(x.T)  # a strided source
        src = _desc(ffi, xt, (K, R, 1, 1), (4 * R, 4, 4 * K * R, 4 * K * R), 0)
        assert lib.csimd_q_cpy(src, _qdesc(ffi, q, t, (K, R, 1, 1)), 1, 2) == NONFINITE
        idx = np.arange(R, dtype=np.int64)[::-1].copy()
        assert lib.csimd_q_set_rows(_fdesc(ffi, x), _fdesc(ffi, idx, 4), _qdesc(ffi, q, t, (K, R, 1, 1)), 1,
                                    2) == NONFINITE
        a = random_blocks(t, R * K // be, rng)
        assert lib.csimd_q_add(_qdesc(ffi, a, t, (K, R, 1, 1)), _fdesc(ffi, x), _qdesc(ffi, q, t, (K, R, 1, 1)),
                               1, 2) == NONFINITE
        np.testing.assert_array_equal(q, before)
        x[row, K - 3] = 0  # finite again: all four write
        for rc in (lib.csimd_q_cpy(_fdesc(ffi, x), _qdesc(ffi, q, t, (K, R, 1, 1)), 1, 2),
                   lib.csimd_q_add(_qdesc(ffi, a, t, (K, R, 1, 1)), _fdesc(ffi, x), _qdesc(ffi, q, t, (K, R, 1, 1)),
                                   1, 2)):
            assert rc == 0
        assert not np.array_equal(q, before)
    if t == GT.Q8_0:  # finite floats, but a block of a scaled by fp16 +inf: its sums are inf and NaN
        a = random_blocks(t, R * K // be, rng).reshape(R, -1, bb)
        a[R // 2, 3, :2] = (0x00, 0x7C)
        q = random_blocks(t, R * K // be, rng)
        before = q.copy()
        assert lib.csimd_q_add(_qdesc(ffi, a, t, (K, R, 1, 1)), _fdesc(ffi, np.ones((R, K), np.float32)),
                               _qdesc(ffi, q, t, (K, R, 1, 1)), 1, 2) == NONFINITE
        np.testing.assert_array_equal(q, before)


@pytest.mark.parametrize("t", (GT.Q8_0, GT.Q4_0, GT.Q5_1), ids=lambda t: t.name)
def test_lora_gradient_through_frozen_quantized_weight(cs, t):
    """The gradients of the F32 input and of a LoRA adapter beside a frozen quantized weight, on csimd,
    against the reference's (which computes on the exact dequantized weight). The backward products
    (OUT_PROD with the quantized weight) are exact on csimd; only the forward's activation rounding
    differs, and it does not enter these gradients (the loss is linear in the product)."""
    k, m, n = 64, 5, 3
    grads = {}
    for name in ("numpy", "csimd"):
        rng = np.random.default_rng(3)
        ctx = pc.Context()
        w = ctx.from_numpy(rng.standard_normal((m, k)).astype(np.float32), type=GGMLType(int(t)))
        x = ctx.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).set_param()
        lo_a = ctx.from_numpy(rng.standard_normal((2, k)).astype(np.float32) * 0.1).set_param()
        lo_b = ctx.from_numpy(rng.standard_normal((m, 2)).astype(np.float32) * 0.1).set_param()
        weight = ctx.from_numpy(rng.standard_normal((n, m)).astype(np.float32))
        out = pc.add(pc.mul_mat(w, x), pc.mul_mat(lo_b, pc.mul_mat(lo_a, x)))
        loss = pc.sum(pc.mul(out, weight)).set_loss()
        g = pc.Graph(capacity=256).expand(loss)
        pc.build_backward(g)
        pc.reset(g)
        be = pc.backend(name)
        assert all(be.supports(nd) for nd in g.nodes if nd.opdef is not None and not nd.opdef.view_only)
        pc.plan(g, be, strict=True).compute()
        grads[name] = [g.grad(p).numpy().astype(np.float64) for p in (x, lo_a, lo_b)]
    for ref, got in zip(grads["numpy"], grads["csimd"]):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("wt", [GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K])
def test_mul_mat_rows_do_not_depend_on_the_rows_beside_them(wt):
    """Up to 16 activation rows (csrc QM_DIRECT: batched decoding, each weight row unpacked once for up to 8
    rows in csimd_quant_batch.h), each row's products are bit for bit those of that row alone, whatever rows
    share the call; expected values: the single-row calls."""
    if "csimd" not in {b.name for b in pc.backends() if b.available}:
        pytest.skip("the csimd extension is not built")
    rng = np.random.default_rng(5)
    k, m = 512, 36  # 36 weight rows: passes of 4 and a remainder; K = 4 * 128
    ctx = pc.Context(mem_size=1 << 26)
    w = ctx.from_numpy(rng.standard_normal((m, k)).astype(np.float32), type=wt)
    x = rng.standard_normal((16, k)).astype(np.float32)

    def product(rows: np.ndarray) -> np.ndarray:
        y = pc.mul_mat(w, ctx.from_numpy(rows))
        pc.compute(y, "csimd")
        return y.numpy().reshape(-1, m).copy()
    alone = np.concatenate([product(x[i:i + 1]) for i in range(16)])
    for n in (2, 3, 5, 8, 16):
        np.testing.assert_array_equal(product(x[:n]), alone[:n], err_msg=f"{n} rows")


# The formats with fused matrix-vector kernels on AVX2 (csrc/csimd_quant_avx2.h) and AVX-512 (csimd_quant_impl.h,
# csimd_quant_avx512.h): read straight from their blocks for up to 16 activation rows per weight tile (csrc
# QM_DIRECT), decoded first beyond (except Q4_0, Q5_0, Q8_0, Q4_K and Q6_K on AVX2: batched kernels for any tile).
FUSED = (GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K, GT.IQ4_NL,
              GT.IQ4_XS, GT.MXFP4)


def _with_isa(cs, name: str, fn):
    """fn() computed on csimd's path `name`, the path in force restored afterwards."""
    _, lib = cs
    before = lib.csimd_get_isa()
    assert lib.csimd_set_isa(ISAS.index(name)) == 0
    try:
        return fn()
    finally:
        lib.csimd_set_isa(before)


def _exact_case(t: GT, k: int, m: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Weights and activations whose products are exact in float32 on every path: random quant bits, every
    weight scale 2^-6 (Q4_1/Q5_1's min a multiple of it, MXFP4's exponent 2^-6), activations integers in [-3, 3]
    with -127 at the start of each block of 32, so the activation quantizers keep them as they are (scale 1).
    Every partial sum is then a multiple of 2^-8 below 2^15: exact whatever the order of the sums."""
    be, _ = _block(t)
    w = random_blocks(t, m * k // be, rng)
    d = np.frombuffer(np.float16(2.0 ** -6).tobytes(), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        w[:, off:off + 2] = d
    if t in (GT.Q4_1, GT.Q5_1):
        w[:, 2:4] = (rng.integers(-8, 9, len(w)) * 2.0 ** -6).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if t == GT.MXFP4:
        w[:, 0] = 122  # 2^(e - 128): the half of 2^-5, the scale its doubled values are stored against
    x = rng.integers(-3, 4, (n, k)).astype(np.float32)
    x[:, ::32] = -127.0
    return w, x


@pytest.mark.parametrize("t", FUSED, ids=lambda t: t.name)
def test_fused_kernels_exact_where_the_sums_are(cs, isa, t):
    """Where every product and partial sum is exact in float32, each path gives the exact product (float64 on the
    dequantized operands), bit for bit, for 1 and 3 activation rows (fused kernels on AVX2 and AVX-512) and 20
    (decoded rows first), with passes of 4 weight rows and a remainder of 3."""
    rng = np.random.default_rng(int(t) + 900)
    be, _ = _block(t)
    m = 7
    # K in whole groups of 128, with 64 left (the AVX-512 32-value kernel's last pair of blocks) and with 32 left
    # (csimd_quant_avx2.h's kernels in the AVX-512 copy); 2 and 3 super-blocks
    for k in ((512, 576, 544) if be == 32 else (512, 768)):
        w, x = _exact_case(t, k, m, 20, rng)
        wf = dequant(w, t).astype(np.float64).reshape(m, k)
        for n in (1, 3, 20):
            got = c_mul_mat(cs, t, w, (k, m, 1, 1), x[:n].reshape(1, 1, n, k), 1).reshape(n, m)
            want = x[:n].astype(np.float64) @ wf.T
            assert np.all(np.abs(want) < 2.0 ** 15)
            np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=f"K={k}, {n} rows on {isa}")


def _extreme_blocks(t: GT, nblocks: int, rng: np.random.Generator) -> np.ndarray:
    """random_blocks with the scales at fp16's ends: the largest (+-65504), subnormal, tiny and ordinary ones."""
    b = random_blocks(t, nblocks, rng)
    picks = np.array([65504.0, -65504.0, 6e-8, -3e-5, 1e-3, 1.0, -7.5], dtype=np.float16)
    for off in F16_FIELDS[t]:
        b[:, off:off + 2] = rng.choice(picks, nblocks).view(np.uint8).reshape(nblocks, 2)
    if t == GT.MXFP4:
        b[:, 0] = rng.choice(np.array([0, 1, 2, 100, 127, 128, 160], dtype=np.uint8), nblocks)  # 2^-128 .. 2^32
    return b


@pytest.mark.parametrize("t", FUSED, ids=lambda t: t.name)
def test_fused_kernels_match_scalar_path_at_extreme_scales(cs, isa, t):
    """Random quant bits, scales at fp16's ends, activations spanning 1e-3..1e3: each path within float32 rounding
    of the float64 product of the quantized operands, and of the scalar path's result (plain integer loops)."""
    rng = np.random.default_rng(int(t) + 1900)
    be, _ = _block(t)
    for k in ((768,) if be == 256 else (320, 288)):  # 32-value blocks: 64 and 32 left past the groups of 128
        _extreme_case(cs, t, k, rng)


def _extreme_case(cs, t: GT, k: int, rng: np.random.Generator) -> None:
    be, _ = _block(t)
    m, n = 9, 2
    w = _extreme_blocks(t, m * k // be, rng)
    x = (rng.standard_normal((n, k)) * 10.0 ** rng.integers(-3, 4, (n, k))).astype(np.float32)
    got = c_mul_mat(cs, t, w, (k, m, 1, 1), x.reshape(1, 1, n, k), 1).reshape(n, m)
    scalar = _with_isa(cs, "scalar", lambda: c_mul_mat(cs, t, w, (k, m, 1, 1), x.reshape(1, 1, n, k), 1)).reshape(n, m)
    at = VEC_DOT[t]
    a = c_quant(cs, x, at, mode=0)
    af = dequant(a, at).astype(np.float64).reshape(n, k)
    wf = dequant(w, t).astype(np.float64).reshape(m, k)
    want = af @ wf.T + q8_1_sum_correction(w, t, a, at, m, n)
    wabs = np.abs(af) @ np.abs(wf).T
    assert np.isfinite(got).all() and np.isfinite(scalar).all()
    assert np.all(np.abs(got - want) <= 2e-6 * wabs), (k, np.max(np.abs(got - want) / wabs))
    assert np.all(np.abs(got - scalar) <= 4e-6 * wabs), (k, np.max(np.abs(got - scalar) / wabs))


@pytest.mark.parametrize("t", FUSED, ids=lambda t: t.name)
def test_fused_rows_do_not_depend_on_the_rows_beside_them(cs, isa, t):
    """Up to 16 activation rows (the fused kernels' range), each row's products on every path are bit for bit
    those of that row alone; expected values: the single-row calls."""
    rng = np.random.default_rng(int(t) + 2900)
    be, _ = _block(t)
    k, m = 512, 11
    w = random_blocks(t, m * k // be, rng)
    x = rng.standard_normal((16, k)).astype(np.float32)
    alone = np.concatenate([c_mul_mat(cs, t, w, (k, m, 1, 1), x[i:i + 1].reshape(1, 1, 1, k), 1).reshape(1, m)
                            for i in range(16)])
    for n in (2, 5, 16):
        got = c_mul_mat(cs, t, w, (k, m, 1, 1), x[:n].reshape(1, 1, n, k), 1).reshape(n, m)
        np.testing.assert_array_equal(got, alone[:n], err_msg=f"{n} rows on {isa}")


@pytest.mark.parametrize("t", FUSED, ids=lambda t: t.name)
@pytest.mark.parametrize("nth", (1, 2))
def test_batched_rows_bit_for_bit_as_alone_every_path(cs, isa, t, nth):
    """The same on every ISA path and thread count, straight through the C entry point, for the shapes the
    batched and fused kernels cut differently: K of 5 groups of 128 (Gemma 3's 640), K = 64 and 32 (mod 128) for
    the 32-value formats, 4 and 5 super-blocks for the K-quants (AVX2's Q6_K folds four at a time, the fifth
    alone); 1 to 16 rows (passes of 8 and a remainder), 4-row passes of weight rows and a remainder; rows of
    zeros and of one huge value beside ordinary ones."""
    rng = np.random.default_rng(int(t) + 11 * nth)
    be, _ = _block(t)
    for K in ((640, 576, 544) if be == 32 else (1024, 1280)):
        M = 23
        w = random_blocks(t, M * K // be, rng)
        x = rng.standard_normal((16, K)).astype(np.float32)
        x[3] = 0.0
        x[6, 5] = 1e4  # one block's scale far from the others'
        alone = np.concatenate([c_mul_mat(cs, t, w, (K, M, 1, 1), x[i:i + 1].reshape(1, 1, 1, K), nth).reshape(1, M)
                                for i in range(16)])
        for n in (2, 4, 7, 8, 9, 16):
            got = c_mul_mat(cs, t, w, (K, M, 1, 1), x[:n].reshape(1, 1, n, K), nth).reshape(n, M)
            np.testing.assert_array_equal(got, alone[:n], err_msg=f"K={K}, {n} rows")


@pytest.mark.parametrize("t", (GT.Q4_0, GT.Q5_0, GT.Q8_0, GT.Q4_K, GT.Q6_K), ids=lambda t: t.name)
@pytest.mark.parametrize("nth", (1, 2))
def test_prompt_rows_bit_for_bit_as_alone_on_avx2(cs, t, nth):
    """On the AVX2 path a prompt's tiles (more than 16 activation rows) go through the batched kernels as well
    (csrc/csimd_quant_batch_avx2.h: passes of 8 rows, the last 9 to 16 in one call), so each row of a prompt gets
    the bits it gets alone, as a decoded token: 83 rows are a tile of 64 (six passes of 8, then 16) and one of 19
    (8, then 11); a row of zeros and one huge value among them."""
    _, lib = cs
    if not lib.csimd_isa_runs(ISAS.index("avx2")):
        pytest.skip("this CPU does not run the avx2 path")
    rng = np.random.default_rng(int(t) + 37 * nth)
    be, _ = _block(t)
    K, M, N = (640 if be == 32 else 1024), 23, 83
    w = random_blocks(t, M * K // be, rng)
    x = rng.standard_normal((N, K)).astype(np.float32)
    x[40] = 0.0
    x[70, 9] = 1e4

    def rows(lo: int, hi: int) -> np.ndarray:
        return c_mul_mat(cs, t, w, (K, M, 1, 1), x[lo:hi].reshape(1, 1, hi - lo, K), nth).reshape(hi - lo, M)
    alone = _with_isa(cs, "avx2", lambda: np.concatenate([rows(i, i + 1) for i in range(N)]))
    np.testing.assert_array_equal(_with_isa(cs, "avx2", lambda: rows(0, N)), alone)
