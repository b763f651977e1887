"""numba's integer matrix-vector path (backends/prism_numba/_jit_qdot.py, _qvec.py): the activation
quantizer against prism_core.quant.quantize_activations byte for byte (ggml's x86 Q8_0 rounding,
the reference Q8_K, their edge cases), the products against float64 on gguf-dequantized weights
and the activations so quantized (odd block counts, row groups with tails, several tasks, batch
broadcast, a permuted b, serial and thread-pool compilations), non-finite activations, every lower
vector ISA this CPU runs (PRISM_NUMBA_ISA: AVX-VNNI, AVX2) against the best one's code, bit for bit,
a generic CPU's float path and fp16 conversions; the setting's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import test_numba_quant
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq
from test_csimd_quant import random_blocks
from test_numba_quant import _gguf_values, _qtensor, activation_values, int_path, stored_sum_part

import prism_core as pc
from prism_core.quant import quantize_activations
from prism_core.types import TRAITS, GGMLType

nb, mode = test_numba_quant.nb, test_numba_quant.mode  # the numba backend and serial/parallel fixtures

CODE_BOOK_FORMATS = (GT.IQ4_NL, GT.IQ4_XS, GT.MXFP4)
INT_FORMATS = (GT.Q4_0, GT.Q5_0, GT.Q8_0, GT.Q4_K, GT.Q6_K, GT.Q4_1, GT.Q5_1, GT.Q5_K, GT.Q2_K, GT.Q3_K,
               *CODE_BOOK_FORMATS)
try:
    from prism_numba._qvec import (
        INT_PATH,  # taken on AVX-512 VNNI, AVX-VNNI, AVX2 CPUs
        MODE,
        Q8_0_BIAS,
    )
except ImportError:  # numba missing: the fixture skips every test
    INT_PATH, MODE, Q8_0_BIAS = False, "portable", 128
# the vector code's byte offsets (Q8_0's is 0 on AVX2, which takes the sign trick instead; so do IQ4_NL's and
# IQ4_XS's code-book values -127..113 there, raised by 128 elsewhere; MXFP4's -12..12 are raised by 12)
IQ4_OFFSET = 0 if MODE == "avx2" else 128
OFFSET = {GT.Q4_0: 8, GT.Q5_0: 16, GT.Q8_0: Q8_0_BIAS, GT.Q4_K: 0, GT.Q6_K: 32, GT.Q4_1: 0, GT.Q5_1: 0, GT.Q5_K: 0,
          GT.Q2_K: 0, GT.Q3_K: 4, GT.IQ4_NL: IQ4_OFFSET, GT.IQ4_XS: IQ4_OFFSET, GT.MXFP4: 12}


def _edge_row(rng: np.random.Generator) -> np.ndarray:
    """768 values: a super-block of normal values with 32-value blocks of zeros, of ties after
    scaling (amax 127: the multiplier is 1), of subnormals (an infinite multiplier), a constant and
    an outlier; then a super-block of zeros and one of subnormals."""
    x = rng.standard_normal(768).astype(np.float32)
    x[0:32] = 0.0
    x[64:96] = np.linspace(-126, 126, 32).round() + 0.5
    x[64] = -127.0  # the largest magnitude of the first super-block too: Q8_K's scale is 1
    x[96:128] = np.float32(1e-41)
    x[128:160] = 0.37
    x[200] = 40.0
    x[256:512] = 0.0
    x[512:768] = np.float32(1e-41) * np.sign(rng.standard_normal(256)).astype(np.float32)
    return x


@pytest.mark.parametrize("t", INT_FORMATS, ids=lambda t: t.name)
def test_activations_match_quantize_activations(nb, t):
    from prism_numba._jit_qdot import quantize_row
    rng = np.random.default_rng(int(t))
    x = _edge_row(rng)
    k = len(x)
    sums = 16 if t == GT.Q2_K else 32  # values per activation sum (Q2_K's mins are per 16 values)
    xq, xc = np.empty(k, np.int8), np.empty(k // 4, np.int32)
    xb = np.empty(k // sums, np.int32)
    vt = TRAITS[GGMLType(int(t))].vec_dot_type
    per = 256 if vt == GGMLType.Q8_K else 32
    xd = np.empty(k // per * (2 if vt == GGMLType.Q8_1 else 1), np.float32)
    assert quantize_row(int(t), x, xq, xc, xd, xb, 0)
    ref = quantize_activations(x, vt).reshape(k // per, -1)
    if vt == GGMLType.Q8_0:  # fp16 d, 32 int8
        want_q = ref[:, 2:].view(np.int8).reshape(-1)
        want_d = ref[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
    elif vt == GGMLType.Q8_1:  # fp16 d, fp16 s (the block sum), 32 int8: xd holds (d, s) per block
        want_q = ref[:, 4:].view(np.int8).reshape(-1)
        want_d = ref[:, :4].copy().view(np.float16).astype(np.float32).reshape(-1)
    else:  # Q8_K: float32 d, 256 int8, 16 int16 sums
        want_q = ref[:, 4:260].view(np.int8).reshape(-1)
        want_d = ref[:, :4].copy().view(np.float32).reshape(-1)
    assert np.array_equal(xq, want_q)
    assert np.array_equal(xd.view(np.uint32), want_d.view(np.uint32))
    q = want_q.astype(np.int64)
    assert np.array_equal(xb, q.reshape(-1, sums).sum(axis=1))
    assert np.array_equal(xc, -OFFSET[t] * q.reshape(-1, 4).sum(axis=1))


def test_non_finite_activations_are_not_quantized(nb):
    from prism_numba._jit_qdot import quantize_row
    x = np.ones(64, np.float32)
    x[40] = np.nan
    bufs = (np.zeros(64, np.int8), np.zeros(16, np.int32), np.zeros(2, np.float32), np.zeros(2, np.int32))
    assert not quantize_row(int(GT.Q8_0), x, *bufs, 0)
    assert not any(b.any() for b in bufs)


def _check(got: np.ndarray, xv: np.ndarray, av: np.ndarray, extra: np.ndarray | float = 0.0) -> None:
    """got[..., n, m] against sum_k xv[..., n, k] av[..., m, k] (+ extra: stored_sum_part) in float64,
    relative to the sum of the products' magnitudes (float32 sums of exact integer dot products)."""
    want = np.einsum("...nk,...mk->...nm", xv, av) + extra
    scale = np.einsum("...nk,...mk->...nm", np.abs(xv), np.abs(av)) + 1e-30
    assert np.max(np.abs(got - want) / scale) < 1e-5


@pytest.mark.parametrize("t", INT_FORMATS, ids=lambda t: t.name)
def test_products(nb, mode, t):
    """Rows: 37 (a task of 32 and one of 5: groups of four and single rows); k: an odd number of
    32-value blocks (the scalar tail), two (one pair), and eight plus some (a chunk and pairs)."""
    rng = np.random.default_rng(200 + int(t))
    blck = TRAITS[GGMLType(int(t))].blck_size
    ks = (256, 768) if blck == 256 else (32, 96, 64, 352)
    for k in ks:
        for n in (1, 2):
            ctx = pc.Context()
            a, av = _qtensor(ctx, t, k, 37, rng, zero_rows=(3,))
            bv = rng.standard_normal((n, k)).astype(np.float32)
            bv[n - 1, : min(k, 64)] = 0.0  # a zero activation block
            out = pc.mul_mat(a, ctx.from_numpy(bv))
            pc.compute(pc.Graph().expand(out), nb, strict=True)
            assert int_path(out) == INT_PATH
            got = out.numpy().reshape(n, 37)
            assert not got[:, 3].any()
            if INT_PATH:
                _check(got, activation_values(bv, t), av, stored_sum_part(bv, t, a.raw()))
            else:
                _check(got, bv.astype(np.float64), av)


def _ggml_product(t: GT, blocks: np.ndarray, x: np.ndarray) -> np.ndarray:
    """mul_mat(w, x) on ggml's own CPU backend (ggml-python), w the (m, row bytes) blocks of type t."""
    pytest.importorskip("ggml", reason="ggml-python (ggml's own CPU kernels) is not installed")
    from data.make_ggml_mulmat_golden import ggml_mul_mat
    return ggml_mul_mat(GGMLType(int(t)), blocks, x)


@pytest.mark.parametrize("t", CODE_BOOK_FORMATS, ids=lambda t: t.name)
def test_products_agree_with_ggml(nb, t):
    """The integer path against ggml's own product on the same bytes (ggml-python's CPU backend, which quantizes
    the activations the same way): equal but for the order of the float32 sums of the exact per-block integer
    dot products, a few float32 roundings of the products' magnitude. MXFP4's first rows have one E8M0 scale
    each: 2**-128 and 2**-127 (with the code book's halving; subnormal), 2**-126, 2**-125, 1/2, 1, 2**52."""
    rng = np.random.default_rng(300 + int(t))
    k, m, n = 768, 21, 5
    blocks = random_blocks(t, m * k // TRAITS[GGMLType(int(t))].blck_size, rng).reshape(m, -1)
    if t == GT.MXFP4:
        blocks.reshape(m, -1, 17)[:7, :, 0] = np.array([0, 1, 2, 3, 127, 128, 180], np.uint8)[:, None]
    x = rng.standard_normal((n, k)).astype(np.float32)
    ctx = pc.Context()
    a = ctx.new_tensor(GGMLType(int(t)), (k, m))
    a.set_raw(blocks)
    out = pc.mul_mat(a, ctx.from_numpy(x))
    pc.compute(pc.Graph().expand(out), nb, strict=True)
    assert int_path(out) == INT_PATH
    got, want = out.numpy().reshape(n, m), _ggml_product(t, blocks, x)
    xv = activation_values(x, t) if INT_PATH else x.astype(np.float64)
    scale = np.abs(xv) @ np.abs(_gguf_values(blocks, t).reshape(m, k).astype(np.float64)).T
    assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-44), np.max(np.abs(got - want) / (scale + 1e-44))
    if t == GT.MXFP4:  # the subnormal-scaled rows are not all zeros on either side
        assert np.count_nonzero(want[:, :7]) > 0 and np.count_nonzero(got[:, :7]) > 0


@pytest.mark.parametrize("t", (GT.Q8_0, GT.Q4_K, GT.Q2_K), ids=lambda t: t.name)
def test_broadcast_and_permuted(nb, mode, t):
    """a (2 matrices) broadcast onto b (3 x 4 matrices of 2 rows, permuted in memory): 2 * 3 * 2 = 12
    activation rows per weight matrix, the integer path."""
    rng = np.random.default_rng(17)
    ctx = pc.Context()
    k = 256
    per = TRAITS[GGMLType(int(t))].blck_size
    raw = random_blocks(t, 2 * 9 * k // per, rng).reshape(1, 2, 9, -1)
    a = ctx.new_tensor(GGMLType(int(t)), (k, 9, 2))
    a.set_raw(raw)
    av = gq.dequantize(raw, t).astype(np.float64)
    bv = rng.standard_normal((3, 4, 2, k)).astype(np.float32)
    b = pc.permute(ctx.from_numpy(np.ascontiguousarray(bv.transpose(0, 2, 1, 3))), 0, 2, 1, 3)
    out = pc.mul_mat(a, b)
    assert int_path(out) == INT_PATH
    pc.compute(pc.Graph().expand(out), nb, strict=True)
    xv = activation_values(bv.reshape(-1, k), t).reshape(bv.shape) if INT_PATH else bv.astype(np.float64)
    _check(out.numpy(), xv, np.repeat(np.repeat(av, 3, 0), 2, 1))


def test_non_finite_rows_take_the_float_path(nb, mode):
    """A row with a NaN gives NaN, one with an infinity gives what the float product gives; the
    finite row beside them still takes the integer path."""
    rng = np.random.default_rng(5)
    t, k, m = GT.Q4_0, 128, 9
    ctx = pc.Context()
    a, av = _qtensor(ctx, t, k, m, rng)
    bv = rng.standard_normal((3, k)).astype(np.float32)
    bv[0, 7] = np.nan
    bv[1, 100] = np.inf
    out = pc.mul_mat(a, ctx.from_numpy(bv))
    pc.compute(pc.Graph().expand(out), nb, strict=True)
    got = out.numpy().reshape(3, m)
    assert int_path(out) == INT_PATH
    assert np.isnan(got[0]).all()
    with np.errstate(invalid="ignore"):
        want1 = bv[1].astype(np.float64) @ av.T
    assert np.array_equal(np.isnan(got[1]), np.isnan(want1)) and np.array_equal(got[1][np.isinf(want1)],
                                                                                  want1[np.isinf(want1)])
    _check(got[2:], activation_values(bv[2:], t) if INT_PATH else bv[2:].astype(np.float64), av)


_GENERIC_RUN = """
import json, sys
import numpy as np
from numba import njit
from prism_numba import _qvec as V
from prism_numba._jit import _serial_dispatcher
from prism_numba._jit_qdot import q_mul_mat_int

# compiled without parallel (its prange loops as range): the same quantize_row and _task code, the same bits per
# row; the thread pool's lowering would add a third of the compile's CPU and no vector code to compare
q_mul_mat_int = _serial_dispatcher(q_mul_mat_int)
products = json.loads(sys.argv[3])  # False: the fp16 conversions only (a CPU without an integer path)

@njit
def halves(raw, out):
    for i in range(out.shape[0]):
        out[i] = V.half_at(raw, 2 * i)

@njit
def rounded(x, out):
    for i in range(x.shape[0]):
        out[i] = V.f16_round(x[i])

cases = json.loads(sys.argv[1])
res = {"mode": V.MODE, "f16c": V.F16C, "int_path": V.INT_PATH, "out": []}
for fmt, k, m, seed in cases if products else ():
    a = np.load(sys.argv[2] + f"/a{fmt}_{k}.npy")
    b = np.random.default_rng(seed).standard_normal((1, 1, 6, k)).astype(np.float32)
    o = np.empty((1, 1, 6, m), np.float32)
    q_mul_mat_int(fmt, a, b, o)
    res["out"].append(o.view(np.uint32).reshape(-1).tolist())
h = np.empty(65536, np.float32)
halves(np.arange(65536, dtype=np.uint16).view(np.uint8), h)
res["halves"] = h.view(np.uint32).tolist()
x = np.load(sys.argv[2] + "/x.npy")
r = np.empty_like(x)
rounded(x, r)
res["rounded"] = r.view(np.uint32).tolist()
print(json.dumps(res))
"""


def _round_cases(rng: np.random.Generator) -> np.ndarray:
    """float32 values around every fp16 rounding edge: ties between neighbours (normal and
    subnormal), the largest fp16 and the overflow threshold, the normal/subnormal boundary."""
    h = np.arange(0, 0x7C00, 7, dtype=np.uint16).view(np.float16).astype(np.float32)
    nxt = (np.arange(0, 0x7C00, 7, dtype=np.uint16) + 1).view(np.float16).astype(np.float32)
    mid = (h.astype(np.float64) + nxt) / 2
    edges = np.array([65504, 65519.996, 65520, 65536, 1e6, np.inf, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
                      3 * 2.0 ** -26, 1e-41, 0.0], np.float64)
    x = np.concatenate([h, mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf), edges,
                        rng.standard_normal(1000) * 1e-3]).astype(np.float32)
    return np.concatenate([x, -x])


def _variant(tmp_path, env_extra: dict, products: bool = True) -> tuple[dict, list, np.ndarray]:
    """Compile q_mul_mat_int afresh (its serial form: the vector code compared is the same) in a subprocess with
    env_extra (its own cache) and run it on the integer-path formats (unless not ``products``: then only the
    fp16 conversions are compiled and run); (its results, the cases, the fp16 rounding inputs). Every format,
    although one compilation serves them all (fmt is a run-time argument): each format's walk is vector code of
    its own, and running it costs little beside the compile."""
    rng = np.random.default_rng(3)
    cases = []
    for t, k in ((GT.Q4_0, 352), (GT.Q5_0, 288), (GT.Q8_0, 96), (GT.Q4_K, 512), (GT.Q6_K, 256), (GT.Q4_1, 352),
                 (GT.Q5_1, 288), (GT.Q5_K, 512), (GT.Q2_K, 512), (GT.Q3_K, 512), (GT.IQ4_NL, 352), (GT.IQ4_XS, 512),
                 (GT.MXFP4, 288)):
        m = 6
        raw = random_blocks(t, m * k // TRAITS[GGMLType(int(t))].blck_size, rng).reshape(1, 1, m, -1)
        np.save(tmp_path / f"a{int(t)}_{k}.npy", raw)
        cases.append((int(t), k, m, int(t)))
    x = _round_cases(rng)
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if k != "PRISM_NUMBA_ISA"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "cache"), **env_extra)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(here, "..", "backends"), os.path.join(here, ".."),
                                         env.get("PYTHONPATH", "")])
    run = [sys.executable, "-c", _GENERIC_RUN, json.dumps(cases), str(tmp_path), json.dumps(products)]
    proc = subprocess.run(run, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1]), cases, x


def _same_products(tmp_path, cases, variant) -> None:
    """The variant's products equal this process's (the best vector ISA here) bit for bit: six activation
    rows, four of them through the four-row form. Through the backend's own kernel (its serial compilation,
    arrays typed as the backend types them), so that this process loads what the numba tests compiled into
    the shared cache instead of compiling the kernel once more for C-contiguous arrays."""
    from prism_numba.kernels import _jit
    q_mul_mat_int = _jit().KERNELS["q_mul_mat_int"].serial()
    for (fmt, k, m, seed), bits in zip(cases, variant["out"]):
        b = np.random.default_rng(seed).standard_normal((1, 1, 6, k)).astype(np.float32)
        o = np.empty((1, 1, 6, m), np.float32)
        q_mul_mat_int(fmt, np.load(tmp_path / f"a{fmt}_{k}.npy"), b, o)
        assert o.view(np.uint32).reshape(-1).tolist() == bits, GT(fmt).name


@pytest.mark.slow
def test_generic_cpu_takes_the_float_path_with_exact_fp16_conversions(nb, tmp_path):
    """For a generic CPU (NUMBA_CPU_NAME=generic: no AVX2, no F16C; compiled afresh in a subprocess) there is
    no integer path (the float path runs: its products are the conformance suite's), and the fp16 conversions,
    integer code there, equal NumPy's on every fp16 and on the rounding edges."""
    generic, cases, x = _variant(tmp_path, {"NUMBA_CPU_NAME": "generic"}, products=False)
    assert generic["mode"] == "portable" and generic["f16c"] is False and generic["int_path"] is False
    with np.errstate(over="ignore"):
        want_round = x.astype(np.float16).astype(np.float32)
    assert np.array_equal(np.array(generic["rounded"], np.uint32), want_round.view(np.uint32))
    want_halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    got_halves = np.array(generic["halves"], np.uint32).view(np.float32)
    nan = np.isnan(want_halves)
    assert np.array_equal(np.isnan(got_halves), nan)
    assert np.array_equal(got_halves[~nan].view(np.uint32), want_halves[~nan].view(np.uint32))


# An AVX2 CPU as LLVM sees one (Haswell's features named, so numba compiles nothing wider than ymm),
# and AVX-VNNI forced on this CPU through the setting.
_AVX2_CPU = {"NUMBA_CPU_NAME": "haswell",
             "NUMBA_CPU_FEATURES": "+avx2,+avx,+fma,+f16c,+sse4.2,+popcnt,+bmi,+bmi2,+lzcnt,+movbe"}


@pytest.mark.slow
@pytest.mark.parametrize("want", ["avxvnni", "avx2"])
def test_lower_vector_isa_equals_best(nb, tmp_path, want):
    """The AVX-VNNI code (vpdpbusd on ymm) and the AVX2 code (vpmaddubsw, vpmaddwd, Q8_0 by the sign
    trick) give the best code's bits: the same exact integer lanes, the same float32 operations."""
    from prism_numba import isa
    runs = isa.cpu_modes()
    if want not in runs:
        pytest.skip(f"this CPU does not run {want} (it runs {', '.join(runs)})")
    if want == runs[0]:
        pytest.skip(f"{want} is this CPU's best: every other test of this file runs it")
    extra = _AVX2_CPU if want == "avx2" else {"PRISM_NUMBA_ISA": want}
    variant, cases, _ = _variant(tmp_path, extra)
    assert variant["mode"] == want
    _same_products(tmp_path, cases, variant)


def test_isa_setting_refusals(monkeypatch):
    """PRISM_NUMBA_ISA takes auto or a mode the CPU runs; another word, or a mode beyond the CPU,
    makes numba unavailable with the reason naming the variable."""
    pytest.importorskip("numba")
    from prism_numba import NumbaBackend, isa
    monkeypatch.setenv("PRISM_NUMBA_ISA", "sse9")
    ok, why = NumbaBackend().availability()
    assert not ok and "PRISM_NUMBA_ISA='sse9'" in why and "avx2" in why
    monkeypatch.setenv("PRISM_NUMBA_ISA", "portable")
    assert isa.chosen() == "portable"
    beyond = [m for m in isa.MODES if m not in isa.cpu_modes()]
    if beyond:
        monkeypatch.setenv("PRISM_NUMBA_ISA", beyond[0])
        ok, why = NumbaBackend().availability()
        assert not ok and "asks for more than" in why
    monkeypatch.setenv("PRISM_NUMBA_ISA", "AUTO")
    assert isa.chosen() == isa.cpu_modes()[0]
