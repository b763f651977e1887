"""GELU, GELU_QUICK, GEGLU and GEGLU_QUICK on F32 data follow ggml's CPU backend: the input rounded to
F16, the function read from a table of F16 values (prism_core.ops.gelu_tables). Checked on every backend
against hand-derived values (the tanh GELU's clamps at +-10) and, where ggml-python is installed, bit
for bit against ggml's own CPU kernels over every finite F16 value."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import prism_core as pc

BACKENDS = [b.name for b in pc.backends() if b.available]


def _compute(backend: str, build, *arrays: np.ndarray) -> np.ndarray:
    ctx = pc.Context(mem_size=1 << 24)
    y = build(*(ctx.from_numpy(a) for a in arrays)).set_output()
    pc.compute(y, backend)
    return y.numpy().astype(np.float64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_tanh_gelu_clamps_at_ten_and_reads_f16_values_inside(backend):
    x = np.array([-10.5, -10.0, -9.99, 9.99, 10.0, 12.3, 1.0005], np.float32)
    got = _compute(backend, pc.gelu, x)
    # outside (-10, 10): 0 and x itself (12.3 keeps its float32 value, no F16 rounding); inside: F16
    # values: f16(9.99) = 9.9921875 (2^-7 steps), gelu of it rounds back to it; gelu(-9.99) ~ -1e-22
    # rounds to -0.0; f16(1.0005) = 1 + 2^-10 (1.0005 lies past the midpoint 1 + 2^-11), gelu of it =
    # 0.8422497 is 1724.93 steps of 2^-11 (F16's step in [0.5, 1)), so 1725 * 2^-11 = 0.84228515625
    assert got.tolist() == [0.0, 0.0, -0.0, 9.9921875, 10.0, float(np.float32(12.3)), 0.84228515625]
    g = np.array([np.inf, 2.0, 3.0, 1.0, 0.5, 2.0, 1.0], np.float32)
    glu = _compute(backend, pc.geglu_split, x, g)
    # GEGLU: x <= -10 gives 0 even for an infinite g; else the GELU value times g in float32
    assert glu.tolist() == [0.0, 0.0, -0.0, 9.9921875, 5.0, float(np.float32(np.float32(12.3) * 2)), 0.84228515625]


@pytest.mark.parametrize("backend", BACKENDS)
def test_quick_gelu_has_no_clamp(backend):
    x = np.array([1.0, 12.3, -12.3], np.float32)
    # quick gelu(1) = 1/(1 + e^-1.702) = 0.8457958 -> 1732.19 steps of 2^-11 -> 1732 * 2^-11; f16(12.3) =
    # 12.296875 (2^-7 steps), its quick gelu rounds back to it; quick gelu(-12.296875) = -1.0e-8 -> -0.0
    # in F16 (below its smallest subnormal 6e-8 by more than half)
    assert _compute(backend, pc.gelu_quick, x).tolist() == [1732 / 2048, 12.296875, -0.0]


def _ggml_outputs(x: np.ndarray, g: np.ndarray) -> dict[str, np.ndarray]:
    ggml = pytest.importorskip("ggml", reason="ggml-python (ggml's own CPU kernels) is not installed")
    n = x.size
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None, no_alloc=False))
    try:
        tx = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, n)
        tg = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, n)
        ctypes.memmove(ggml.ggml_get_data(tx), x.ctypes.data, x.nbytes)
        ctypes.memmove(ggml.ggml_get_data(tg), g.ctypes.data, g.nbytes)
        outs = {"GELU": ggml.ggml_gelu(ctx, tx), "GELU_QUICK": ggml.ggml_gelu_quick(ctx, tx),
                "GEGLU": ggml.ggml_geglu_split(ctx, tx, tg), "GEGLU_QUICK": ggml.ggml_geglu_quick_split(ctx, tx, tg)}
        graph = ggml.ggml_new_graph(ctx)
        for o in outs.values():
            ggml.ggml_build_forward_expand(graph, o)
        ggml.ggml_graph_compute_with_ctx(ctx, graph, 1)
        def values(t) -> np.ndarray:
            data = ctypes.cast(ggml.ggml_get_data(t), ctypes.POINTER(ctypes.c_float))
            return np.ctypeslib.as_array(data, shape=(n,)).astype(np.float64)
        return {k: values(o) for k, o in outs.items()}
    finally:
        ggml.ggml_free(ctx)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_family_is_ggmls_bit_for_bit_on_every_f16_value(backend):
    x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = np.concatenate([x[np.isfinite(x)], np.array([9.999, 10.0, -10.0, -10.001, 65519.0, 65520.0, 1e5, -1e5,
                                                     1e-8, 0.3333333], np.float32)])
    g = np.random.default_rng(0).uniform(-3, 3, x.size).astype(np.float32)
    want = _ggml_outputs(x, g)
    got = {"GELU": _compute(backend, pc.gelu, x), "GELU_QUICK": _compute(backend, pc.gelu_quick, x),
           "GEGLU": _compute(backend, pc.geglu_split, x, g),
           "GEGLU_QUICK": _compute(backend, pc.geglu_quick_split, x, g)}
    for key, w in want.items():
        same = (got[key] == w) | (np.isnan(got[key]) & np.isnan(w))
        assert same.all(), (f"{key} on {backend}: {np.count_nonzero(~same)} of {x.size} values differ from ggml's, "
                            f"first at x = {x[~same][:4]}: {got[key][~same][:4]} instead of {w[~same][:4]}")
