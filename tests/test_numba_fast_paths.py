"""The numba backend's bandwidth paths, on shapes the conformance cases do not reach:
streaming (non-temporal) stores for large flat binary ops, the eight-row GEMV of MUL_MAT
(row blocks and their tails, half-precision a, rows with gaps), and OUT_PROD through the
cache-blocked MUL_MAT kernel. Expected values come from the NumPy reference backend or from
NumPy's float32 arithmetic directly."""

from __future__ import annotations

import numpy as np
import pytest

import prism_core as pc
from prism_core.conformance.runner import compare

pytest.importorskip("numba")


def _ref(build, seed: int):
    """(numba result, reference result) of the graph ``build(ctx, rng)`` returns."""
    outs = []
    for name in ("numba", "numpy"):
        ctx = pc.Context()
        y = build(ctx, np.random.default_rng(seed)).set_output()
        if name == "numba":
            pc.plan(y, name, strict=True).compute()
        else:
            pc.compute(y, name)
        outs.append(y.numpy())
    return outs


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_streaming_stores_give_numpys_float32_results(op, monkeypatch):
    from prism_numba import _jit, kernels
    monkeypatch.setattr(kernels, "STREAM_STORES", 0)  # every flat binary op of equal lengths streams
    rng = np.random.default_rng(0)
    f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
    for n in (1, 15, 16, 17, 100, 16 * 4096 * 2 + 37):  # shorter than a line, lines, several parallel blocks
        for shift in (0, 1, 7, 15):  # the result starts at every alignment to a 64-byte line
            ctx = pc.Context()
            av = rng.standard_normal(n).astype(np.float32)
            bv = rng.standard_normal(n).astype(np.float32) + 2
            buf = ctx.from_numpy(np.concatenate([np.full(shift, 7, np.float32), av, np.full(32, 7, np.float32)]))
            b = ctx.from_numpy(bv)
            y = getattr(pc, op + "_inplace")(pc.view_1d(buf, n, 4 * shift), b)  # result at every line alignment
            calls = kernels.record(y, serial=False)
            stream = _jit.KERNELS["binary_stream"]
            assert len(calls) == 1 and calls[0].entry is stream.entry_point(calls[0].args)
            pc.plan(y, "numba", strict=True).compute()
            want = f(av, bv)
            got = buf.numpy()
            np.testing.assert_array_equal(got[shift:shift + n], want)
            assert np.all(got[:shift] == 7) and np.all(got[shift + n:] == 7)
            o = y.host().reshape(-1)
            for k in (stream, stream.serial()):  # the kernel itself, through the pool and serial
                o[:] = 0
                k(av, bv, o, kernels.BINARY_CODES[op.upper()])
                np.testing.assert_array_equal(o, want)
            assert np.all(got[:shift] == 7) and np.all(got[shift + n:] == 7)


@pytest.mark.parametrize("ta", [pc.F32, pc.F16, pc.BF16])
@pytest.mark.parametrize("layout", ["contiguous", "rowgap"])
def test_gemv_row_blocks_and_tails(ta, layout):
    from prism_core.conformance.cases import leaf
    for m in (1, 7, 8, 9, 15, 17, 23, 70, 600):
        for n in (1, 2, 3):
            k = 40 if layout != "contiguous" else 257
            got, want = _ref(lambda c, r, m=m, n=n, k=k: pc.mul_mat(leaf(c, r, ta, (k, m), layout=layout),
                                                                     leaf(c, r, pc.F32, (k, n, 2))), seed=m * 10 + n)
            ok, msg, err, _ = compare(got, want, 1e-6)
            assert ok, (m, n, msg, err)


@pytest.mark.parametrize("a_ne,b_ne,ta", [
    ((70, 300, 1, 1), (67, 300, 1, 1), pc.F32),    # several 64 x 64 tiles, k in two blocks
    ((130, 40, 2, 1), (3, 40, 4, 3), pc.F32),      # j < 4: the GEMV path on a transposed a, broadcast
    ((16, 33, 2, 1), (12, 33, 2, 1), pc.F16),
    ((20, 30, 2, 1), (70, 30, 2, 1), pc.F16),      # j > 64: a copied transposed (F16 bits)
    ((90, 30, 1, 1), (66, 30, 1, 1), pc.BF16),
    ((784, 64, 1, 1), (500, 64, 1, 1), pc.F32),    # the MLP's weight gradient shape (batch 64)
])
def test_out_prod_through_the_blocked_gemm(a_ne, b_ne, ta):
    from prism_core.conformance.cases import leaf
    got, want = _ref(lambda c, r: pc.out_prod(leaf(c, r, ta, a_ne), leaf(c, r, pc.F32, b_ne)), seed=4)
    ok, msg, err, _ = compare(got, want, 1e-6)
    assert ok, (msg, err)


@pytest.mark.parametrize("k,m,n,ta", [(1100, 70, 9, pc.F32), (1030, 66, 67, pc.F16), (513, 5, 4, pc.BF16)])
def test_gemm_over_several_k_blocks_and_partial_tiles(k, m, n, ta):
    from prism_core.conformance.cases import leaf
    got, want = _ref(lambda c, r: pc.mul_mat(leaf(c, r, ta, (k, m)), leaf(c, r, pc.F32, (k, n))), seed=k)
    ok, msg, err, _ = compare(got, want, 1e-6)
    assert ok, (msg, err)
