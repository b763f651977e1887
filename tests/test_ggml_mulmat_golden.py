"""Every backend's quantized MUL_MAT against ggml's own CPU backend (tests/data/ggml_mulmat_golden.npz,
written by tests/data/make_ggml_mulmat_golden.py; provenance in tests/data/README.md): ggml's weight
blocks, ggml's output for 1 activation row (the matrix-vector path) and for 5 and 37 (matrix-matrix).

Errors are measured per output element relative to its row magnitude sum_k |x_k w_k| (in float64 on
the dequantized weights). Kernels that quantize the activations to the weight's vec_dot_type as ggml's
x86 code does (csimd; numba's integer path) must agree to float32 summation order; the float kernels
(the numpy reference, numba's float path) multiply the exact activations, so they differ from ggml by
its activation quantization, bounded here from the Q8 formats' rounding rather than measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import prism_core as pc
from prism_core import quant
from prism_core.types import GGMLType, traits

GOLDEN = np.load(Path(__file__).parent / "data" / "ggml_mulmat_golden.npz")
TYPES = [str(t) for t in GOLDEN["types"]]
NS = [int(n) for n in GOLDEN["ns"]]
W = GOLDEN["w"]
BACKENDS = [i.name for i in pc.backends()]
# Kernels that quantize the activations as ggml does: measured max error / row magnitude over the 19
# formats at 1, 5 and 37 rows: csimd 9e-9..1.3e-7 (Q4_K/Q5_K at 5 and 37 rows the largest), IQ4_NL and
# MXFP4 0 (bit-identical), TQ1_0/TQ2_0 9.1e-8 (1 row), 2.0e-7 (5), 5.4e-7 (37); numba's integer path
# (Q4_0, Q5_0, Q8_0, Q4_K, Q6_K under its row threshold: here 1 and 5 rows) 2.3e-8..7.6e-8; since it serves
# every row count, Q4_1 1.5e-7, Q5_1 1.3e-7, Q2_K 8.4e-8, Q3_K 4.0e-8, Q5_K 8.2e-8 (1, 5, 37 rows; the AVX-512
# VNNI and the AVX2 code alike).
SAME_ROUNDING = 3e-7
SAME_ROUNDING_TERNARY = 8e-7  # TQ1_0, TQ2_0: ggml itself is 5.4e-7 off the float64 emulation at 37 rows
# numpy reference against the float64 product of the dequantized weights: measured 3.3e-8. Against
# ggml it stays within 0.10..0.17 of _activation_error_bound (TQ1_0/TQ2_0 0.27..0.40), 8e-4..3.7e-3 of
# the magnitude.
REFERENCE_F64 = 2e-7
# ggml's x86 Q4_1 and Q5_1 dot products add m_w * s_x with s_x the block's stored fp16 d*sum(q); csimd
# does too (5.4e-8..1.8e-7 of the magnitude); taking d*sum(q) in float instead put it 9e-7..4.2e-6 off
# here (8e-5 on all-normal rows), past SAME_ROUNDING.


def _weights(ctx: pc.Context, t: str) -> pc.Tensor:
    q = GOLDEN[f"q_{t}"]
    return ctx.new_tensor(GGMLType[t.upper()], (W.shape[1], W.shape[0])).set_raw(q)


def _dequantized(t: str) -> np.ndarray:
    return quant.dequantize(GOLDEN[f"q_{t}"], t).astype(np.float64)


def _magnitude(x: np.ndarray, wd: np.ndarray) -> np.ndarray:
    return np.abs(x.astype(np.float64)) @ np.abs(wd).T


def _activation_error_bound(t: str, x: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """|float product - ggml's| from ggml's activation rounding: each value of a Q8 block is off by at
    most half its step amax/127 plus the fp16 rounding of the scale (2^-11 of amax; Q8_K keeps a float32
    scale, counted the same); a Q8_1 block's stored sum d*sum(q), which ggml multiplies by the weight
    block's min, is rounded to fp16 too (2^-11 of |sum|, plus the values' own error in it)."""
    vt = traits(t).vec_dot_type
    blk = traits(vt).blck_size
    xb = np.abs(x.astype(np.float64)).reshape(len(x), -1, blk)
    step = xb.max(axis=2, keepdims=True) * (1 / 254 + 2.0 ** -11)  # per value, per block
    per_value = np.broadcast_to(step, xb.shape).reshape(x.shape)
    bound = per_value @ np.abs(wd).T
    if vt == GGMLType.Q8_1:
        mins = GOLDEN[f"q_{t}"].reshape(len(wd), -1, traits(t).type_size)[..., 2:4].copy().view(np.float16)
        mins = np.abs(mins[..., 0].astype(np.float64))  # [M, blocks]
        sums = np.abs(x.astype(np.float64).reshape(len(x), -1, blk).sum(axis=2)) + blk * step[..., 0]
        bound += (sums * 2.0 ** -11) @ mins.T
    return bound


def _prism(backend: str, t: str, x: np.ndarray) -> tuple[np.ndarray, pc.Tensor]:
    ctx = pc.Context(mem_size=1 << 24)
    y = pc.mul_mat(_weights(ctx, t), ctx.from_numpy(x)).set_output()
    pc.plan(y, pc.backend(backend), strict=True).compute()
    return y.numpy().reshape(len(x), -1).copy(), y


def _quantizes_activations(backend: str, node: pc.Tensor) -> bool:
    if backend in ("csimd", "ggml"):  # ggml: ggml's own CPU kernels, through ggml-python
        return True
    if backend == "numba":
        from prism_numba.kernels_quant import int_path
        return int_path(node)
    return False


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    info = next(i for i in pc.backends() if i.name == request.param)
    if not info.available:
        pytest.skip(f"{info.name} unavailable here: {info.reason}")
    return info.name


def test_golden_covers_the_formats_and_paths():
    assert {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl",
            "iq4_xs"} <= set(TYPES)
    assert 1 in NS and max(NS) > 1 and W.shape[1] % 256 == 0


def test_float_weights_and_activations_come_from_the_seed():
    """The generator drew w, then x for each row count, from one NumPy Generator of the stored seed."""
    rng = np.random.default_rng(int(GOLDEN["seed"]))
    assert np.array_equal(rng.standard_normal(W.shape, dtype=np.float32), W)
    for n in NS:
        x = rng.standard_normal((n, W.shape[1]), dtype=np.float32)
        ties = rng.integers(-253, 254, (n, 256)).astype(np.float32) / 2
        ties[:, ::32] = np.where(rng.integers(0, 2, (n, 8)) == 1, 127.0, -127.0)
        x[:, :256] = ties
        assert np.array_equal(x, GOLDEN[f"x{n}"])


def _same_rounding(t: str) -> float:
    return SAME_ROUNDING_TERNARY if t in ("tq1_0", "tq2_0") else SAME_ROUNDING


def _stored_sum_correction(t: str, xa: np.ndarray) -> np.ndarray:
    """For Q8_1 activations: sum over blocks of the weight's min times (stored fp16 sum - d*sum(q)),
    the part of ggml's Q4_1/Q5_1 dot product a float product of the dequantized blocks leaves out."""
    if traits(t).vec_dot_type != GGMLType.Q8_1:
        return 0.0
    b = xa.reshape(len(xa), -1, traits(GGMLType.Q8_1).type_size)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    s = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    q = b[..., 4:].view(np.int8).astype(np.float64).sum(axis=2)
    wb = GOLDEN[f"q_{t}"].reshape(W.shape[0], -1, traits(t).type_size)
    mins = wb[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return (s - d * q) @ mins.T


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", TYPES)
def test_ggml_output_is_prisms_quantized_activations_product(t, n):
    """ggml's semantics in float64: Prism's quantize_activations (ggml's x86 rounding) of x,
    dequantized, times the dequantized weights, plus for Q8_1 the stored fp16 block sums' part."""
    x, wd = GOLDEN[f"x{n}"], _dequantized(t)
    vt = traits(t).vec_dot_type
    xa = quant.quantize_activations(x, vt)
    emulated = quant.dequantize(xa, vt).astype(np.float64) @ wd.T + _stored_sum_correction(t, xa)
    err = np.abs(GOLDEN[f"y_{t}_{n}"] - emulated) / _magnitude(x, wd)
    assert err.max() <= _same_rounding(t), f"{t} n={n}: {err.max():.2e} of the row magnitude"


@pytest.mark.parametrize("t", [t for t in TYPES if quant.can_quantize(t)])
def test_ggml_weight_bytes_are_prisms_quantization(t):
    got, want = quant.quantize(W, t), GOLDEN[f"q_{t}"]
    bad = np.nonzero(got != want)
    assert not bad[0].size, f"{t}: {bad[0].size} bytes differ, first at row {bad[0][0]} byte {bad[1][0]}"


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", TYPES)
def test_reference_matches_float64_product(t, n):
    x, wd = GOLDEN[f"x{n}"], _dequantized(t)
    got, _ = _prism("numpy", t, x)
    err = np.abs(got - x.astype(np.float64) @ wd.T) / _magnitude(x, wd)
    assert err.max() <= REFERENCE_F64, f"{t} n={n}: {err.max():.2e}"


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("t", TYPES)
def test_backend_matches_ggml(backend, t, n, request):
    x, wd, want = GOLDEN[f"x{n}"], _dequantized(t), GOLDEN[f"y_{t}_{n}"]
    got, node = _prism(backend, t, x)
    diff = np.abs(got.astype(np.float64) - want)
    if _quantizes_activations(backend, node):
        err = diff / _magnitude(x, wd)
        assert err.max() <= _same_rounding(t), f"{backend} {t} n={n}: {err.max():.2e} of the row magnitude"
    else:
        bound = _activation_error_bound(t, x, wd) + SAME_ROUNDING * _magnitude(x, wd)
        ratio = diff / bound
        assert ratio.max() <= 1, f"{backend} {t} n={n}: {ratio.max():.2f} of the activation-rounding bound"
        # and ggml did quantize its activations: the float product is not ggml's to summation order
        assert (diff / _magnitude(x, wd)).max() > 10 * SAME_ROUNDING
