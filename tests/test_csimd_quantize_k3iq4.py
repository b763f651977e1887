"""csimd's C quantizers of Q3_K, IQ4_NL and IQ4_XS (csrc/csimd_quantize_k3iq4.h), and those of Q8_1 and
Q8_K that CPY/SET_ROWS/ADD now call too, byte for byte: against the golden blocks ggml's own C code
wrote (tests/data/quant_golden.npz), against prism_core.quant's NumPy port on random and edge rows,
against ggml's quantize_row_*_ref called through ctypes where PRISM_GGML_BASE_LIB names a libggml-base
(as tests/test_gguf_vs_ggml.py), and through the op entry points on every ISA path."""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import test_csimd_quant
from gguf import GGMLQuantizationType as GT
from test_csimd_quant import _block, _desc, _fdesc, _qdesc, c_quant

from prism_core import quant
from prism_core.types import GGMLType, traits

GOLDEN = np.load(Path(__file__).parent / "data" / "quant_golden.npz")
NEW = (GT.Q3_K, GT.IQ4_NL, GT.IQ4_XS)
WIRED = NEW + (GT.Q8_1, GT.Q8_K)  # the types csimd's CPY/SET_ROWS/ADD refused before these quantizers
REFERENCE = 1  # csimd_q_quantize's mode: ggml's reference quantizer
cs, isa = test_csimd_quant.cs, test_csimd_quant.isa  # fixtures: the loaded extension, one ISA path per run


def _name(t: GT) -> str:
    return {GT.Q3_K: "q3_K", GT.Q8_K: "q8_K"}.get(t, t.name.lower())


def _iq4_nl_zero_blocks(x: np.ndarray) -> np.ndarray:
    """The IQ4_NL blocks (of 32) whose largest magnitude is below ggml's 1e-15 group threshold."""
    return np.abs(x.reshape(-1, 32)).max(axis=1) < 1e-15


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    rows = np.nonzero((got != want).any(axis=-1))[0]
    if not len(rows):
        return ""
    i = rows[0]
    return f"{len(rows)} blocks differ, first block {i}: bytes {np.nonzero(got[i] != want[i])[0][:8].tolist()}"


@pytest.mark.parametrize("t", WIRED, ids=lambda t: t.name)
def test_golden_blocks_of_ggml(cs, t):
    x = GOLDEN["x"]
    got = c_quant(cs, x, t, REFERENCE)
    want = GOLDEN[f"q_{_name(t)}"].reshape(got.shape).copy()
    if t == GT.IQ4_NL:
        # ggml leaves an all-zero block's indices as its scratch buffer held them; its d (0) is defined.
        # csimd writes the index of the entry nearest 0 there: kvalues_iq4nl[8] = 1 (|1 - 0| < |-10 - 0|),
        # so every byte is 0x88
        zero = _iq4_nl_zero_blocks(x)
        assert zero.sum() > 8 and not got[zero][:, :2].any() and not want[zero][:, :2].any()
        assert (got[zero][:, 2:] == 0x88).all()
        want[zero] = got[zero]
    assert not _first_difference(got, want), _first_difference(got, want)


def edge_rows(rng: np.random.Generator, n_random: int = 48) -> np.ndarray:
    """256-element rows (one Q3_K/IQ4_XS block, 8 IQ4_NL blocks each) with the corners of the searches."""
    normal = lambda: rng.standard_normal(256)  # noqa: E731
    rows = [np.zeros(256), np.full(256, -0.0), np.tile([0.0, -0.0], 128), np.full(256, 1.5), np.full(256, -3.0),
            np.repeat(rng.standard_normal(16), 16),  # constant groups of 16
            np.tile(np.arange(-8, 8) * 0.5, 16),  # values on rounding ties
            *(rng.integers(-8, 8, (32, 256)) * 0.5),  # more of them: ties between IQ4 table entries
            -np.abs(normal()), np.abs(normal()) + 0.25,  # one sign only
            normal() * (rng.random(256) < 0.05),  # sparse: mostly zero groups
            rng.uniform(-1, 1, 256) * 1e-40,  # subnormal values
            np.where(rng.random(256) < 0.5, 2e-15, -5e-16),  # around the 1e-15 all-zero threshold
            np.concatenate([np.zeros(128), normal()[:128] * 1e-20])]
    for big in (40.0, 1e6, 1e12):  # one huge value (x^3 stays finite: see test_as_ggml_on_overflowing_rows)
        for sign in (1, -1):
            r = normal()
            r[rng.integers(256)] = sign * big
            rows.append(r)
    # random rows of mixed distributions and scales: enough of them that rare paths are taken (a tie
    # between two IQ4 table entries, Q3_K's fifth pass moving a quant)
    k = np.arange(n_random) % 4
    r = np.where(k[:, None] == 0, rng.standard_normal((n_random, 256)),
                 np.where(k[:, None] == 1, rng.uniform(-1, 1, (n_random, 256)),
                          np.where(k[:, None] == 2, rng.laplace(size=(n_random, 256)),
                                   rng.standard_t(2, (n_random, 256)))))
    return np.concatenate([np.stack(rows), r * np.exp(rng.uniform(-8, 8, (n_random, 1)))]).astype(np.float32)


@pytest.mark.parametrize("t", WIRED, ids=lambda t: t.name)
def test_as_prism_core_on_random_and_edge_rows(cs, t):
    x = edge_rows(np.random.default_rng(int(t) + 101), 6000)
    got = c_quant(cs, x, t, REFERENCE)
    # csimd_q_quantize works block by block: for IQ4_NL each block is a row of its own (an all-zero one gets
    # the index nearest 0, as the first block of a row does; csimd_q_quantize_rows repeats the previous one)
    rows = x.reshape(-1, 32) if t == GT.IQ4_NL else x
    want = quant.quantize(rows, GGMLType(int(t)), overflow="ggml").reshape(got.shape)  # edge rows: inf scales too
    assert not _first_difference(got, want), _first_difference(got, want)


def _ggml_base():
    """ggml's base library: PRISM_GGML_BASE_LIB, else ggml-python's build (the test extra installs it; its
    reference quantizers have no FMA contraction and reproduce every golden block)."""
    path = os.environ.get("PRISM_GGML_BASE_LIB")
    if not path:
        spec = importlib.util.find_spec("ggml")
        lib = Path(spec.origin).parent / "lib" / "libggml-base.so" if spec and spec.origin else None
        if lib is None or not lib.exists():
            pytest.skip("neither PRISM_GGML_BASE_LIB nor ggml-python's libggml-base.so: no ggml library to "
                        "compare the reference quantizers with (pip install ggml-python)")
        path = str(lib)
    return ctypes.CDLL(path)


def ggml_quant(lib, x: np.ndarray, t: GT) -> np.ndarray:
    be, bb = _block(t)
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.zeros((x.size // be, bb), np.uint8)
    fn = getattr(lib, f"quantize_row_{_name(t)}_ref")
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


@pytest.mark.parametrize("t", WIRED, ids=lambda t: t.name)
def test_as_ggml_on_overflowing_rows(cs, t):
    """Rows whose weighted sums overflow float32 (x^3 beyond 3.4e38) and whose group scales then become
    inf or NaN: ggml's own quantizers decide what the bytes are (test_huge_golden_rows checks the same
    without the library, on the huge rows of the golden data)."""
    lib = _ggml_base()
    rng = np.random.default_rng(int(t) + 103)
    x = edge_rows(rng)
    wild = rng.standard_normal((64, 256)) * np.exp(rng.uniform(-40, 40, (64, 1)))
    wild[::4, 7] = 3e37
    wild[1::4] = np.abs(wild[1::4]) * 1e20
    x = np.concatenate([x, wild.astype(np.float32)])
    got = c_quant(cs, x, t, REFERENCE)
    want = ggml_quant(lib, x, t)
    if t == GT.IQ4_NL:
        zero = _iq4_nl_zero_blocks(x)
        want[zero, 2:] = got[zero, 2:]
    assert not _first_difference(got, want), _first_difference(got, want)


@pytest.mark.parametrize("t", [GT(int(t)) for t in GGMLType if quant.can_quantize(t)], ids=lambda t: t.name)
def test_huge_golden_rows(cs, t):
    """The golden rows of values up to float32's maximum (tests/data/README.md: x_huge), whose scale
    searches meet inf and NaN: ggml's bytes, as prism_core.quant writes them (tests/test_quant_golden.py)."""
    x = GOLDEN["x_huge"]
    got = c_quant(cs, x, t, REFERENCE)
    want = GOLDEN[f"qh_{traits(GGMLType(int(t))).name}"].reshape(got.shape).copy()
    if t == GT.IQ4_NL:
        zero = _iq4_nl_zero_blocks(x)
        want[zero, 2:] = got[zero, 2:]
    assert not _first_difference(got, want), _first_difference(got, want)


@pytest.mark.parametrize("t", NEW, ids=lambda t: t.name)
def test_ops_write_the_reference_bytes(cs, isa, t):
    """CPY (from a transposed F32 view too), SET_ROWS and ADD into the type on this ISA path: the bytes of
    prism_core.quant.quantize of the same floats."""
    ffi, lib = cs
    be, bb = _block(t)
    K, R = 512, 3
    x = edge_rows(np.random.default_rng(int(t) + 107))[[3, 6, 10, 16, 25, 40]].reshape(R, K)
    want = quant.quantize(x, GGMLType(int(t))).reshape(-1, bb)
    q = np.zeros_like(want)
    assert lib.csimd_q_cpy(_fdesc(ffi, x), _qdesc(ffi, q, t, (K, R, 1, 1)), REFERENCE, 2) == 0
    assert not _first_difference(q, want), _first_difference(q, want)
    xt = np.ascontiguousarray(x.T)  # memory (K, R), read as the [K, R] tensor x
    q2 = np.zeros_like(want)
    src = _desc(ffi, xt, (K, R, 1, 1), (4 * R, 4, 4 * K * R, 4 * K * R), 0)
    assert lib.csimd_q_cpy(src, _qdesc(ffi, q2, t, (K, R, 1, 1)), REFERENCE, 1) == 0
    np.testing.assert_array_equal(q2, want)
    # SET_ROWS: rows 2 and 0 of a 4-row destination; the others keep their bytes
    dst = np.full((4 * K // be, bb), 0x5A, np.uint8)
    idx = np.array([2, 0], np.int64)
    assert lib.csimd_q_set_rows(_fdesc(ffi, x[:2]), _fdesc(ffi, idx, 4), _qdesc(ffi, dst, t, (K, 4, 1, 1)),
                                REFERENCE, 2) == 0
    rows, wrows = dst.reshape(4, -1), want.reshape(R, -1)
    np.testing.assert_array_equal(rows[2], wrows[0])
    np.testing.assert_array_equal(rows[0], wrows[1])
    assert (rows[[1, 3]] == 0x5A).all()
    # ADD: a (quantized) + b, requantized: the quantized sum of a's exact dequantized values and b
    a = want.copy()
    b = np.random.default_rng(int(t)).standard_normal((R, K)).astype(np.float32)
    s = (quant.dequantize(a.reshape(R, -1), GGMLType(int(t))).reshape(R, K) + b).astype(np.float32)
    d = np.zeros_like(a)
    assert lib.csimd_q_add(_qdesc(ffi, a, t, (K, R, 1, 1)), _fdesc(ffi, b), _qdesc(ffi, d, t, (K, R, 1, 1)),
                           REFERENCE, 2) == 0
    np.testing.assert_array_equal(d, quant.quantize(s, GGMLType(int(t))).reshape(-1, bb))
