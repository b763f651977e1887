"""The scale searches csimd runs in vector lanes (csrc/csimd_quant.h: make_qx_quants' 19 scales side by side,
make_qkx2_quants' scales four at a time with a restart after each winner that moves the min; the IQ3
neighbour scan four neighbours at a time) against ggml's own ggml_quantize_chunk, called through ctypes
(ggml-python's libggml-base or PRISM_GGML_BASE_LIB, as tests/test_csimd_quantize_k3iq4.py), on rows the
golden data do not hold: heavy tails, exact ties of the rounding, sparse and constant groups, tiny and
overflowing magnitudes, with and without importance weights, on every ISA path. Byte for byte."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import test_quant_chunk
from test_csimd_quantize_k3iq4 import _ggml_base
from test_quant_chunk import ISAS

from prism_core import quant
from prism_core.types import GGMLType, traits

N = 512  # two super-blocks per row
# make_qx_quants: Q4_0/Q5_0 with weights, Q3_K with weights (groups and their scales), Q6_K;
# make_qkx2_quants (make_qkx3 with weights): Q2_K, Q4_K, Q5_K, and Q4_1/Q5_1 with weights; IQ3: the scan
SEARCHES = ("Q4_0", "Q5_0", "Q3_K", "Q6_K", "Q2_K", "Q4_K", "Q5_K", "Q4_1", "Q5_1", "IQ3_XXS", "IQ3_S")
LATTICE = ("IQ3_XXS", "IQ3_S")  # ggml asserts on a point it cannot place: finite, moderate rows only


csimd_isa = test_quant_chunk.csimd_isa  # fixture: prism_core.quant through csimd on one ISA path per run


def _rows(rng: np.random.Generator, lattice: bool) -> np.ndarray:
    normal = rng.standard_normal((4, N))
    rows = [normal * 0.02,
            rng.standard_t(1.5, (4, N)) * 1e-3,
            np.where(rng.random((4, N)) < 0.7, 0.0, normal),
            np.round(normal * 4) / 8,  # every rounding meets its ties
            np.repeat(rng.standard_normal((4, N // 16)), 16, axis=1),  # constant groups of 16
            np.abs(normal)]
    if not lattice:
        huge = normal * 1e30
        huge[:, ::7] = 3e38  # weighted sums and second-level scales overflow to inf and NaN
        rows += [normal * 1e-30, huge]
    return np.concatenate(rows).astype(np.float32)


def _ggml_chunk(lib, x: np.ndarray, t: GGMLType, w: np.ndarray | None) -> np.ndarray:
    tr = traits(t)
    out = np.zeros((len(x), N // tr.blck_size * tr.type_size), np.uint8)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, len(x), N,
                            None if w is None else w.ctypes.data)
    return out


@pytest.mark.parametrize("csimd_isa", ISAS, indirect=True)
@pytest.mark.parametrize("name", SEARCHES)
def test_lane_searches_equal_ggml(csimd_isa, name):
    lib = _ggml_base()
    t = GGMLType[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = np.ascontiguousarray(_rows(rng, name in LATTICE))
    weights = [None, np.exp(rng.standard_normal(N) * 3).astype(np.float32),
               (rng.random(N) * (rng.random(N) < 0.5)).astype(np.float32)]  # half the columns weightless
    for w in weights:
        want = _ggml_chunk(lib, x, t, w)
        got = quant.quantize_chunk(x, t, w, threads=1, overflow="ggml")
        bad = np.flatnonzero((got != want).any(axis=1))
        assert not bad.size, (name, "weights" if w is not None else "none", bad[:8])
