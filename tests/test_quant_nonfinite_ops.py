"""CPY, SET_ROWS and ADD into a block type refuse a NaN or inf among the floats they would quantize, on
every backend alike: InvalidArgument naming the row, its index and the column (prism_core.quant's message:
ggml's quantizers would write position-dependent garbage), with the destination's bytes as they were."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import available_backend

import prism_core as pc
from prism_core.errors import InvalidArgument
from prism_core.types import GGMLType as G
from prism_core.types import traits

BACKENDS = ("numpy", "numba", "csimd")
TYPES = (G.Q8_0, G.Q4_K)
K, R = 256, 4
BAD_ROW, BAD_COL = 2, 37


@pytest.fixture(params=BACKENDS)
def backend(request):
    return available_backend(request.param)


def _rows(bad: float) -> np.ndarray:
    x = np.random.default_rng(5).standard_normal((R, K)).astype(np.float32)
    x[BAD_ROW, BAD_COL] = bad
    return x


def _block_tensor(ctx: pc.Context, t: G, rows: int) -> pc.Tensor:
    return ctx.from_numpy(np.random.default_rng(6).standard_normal((rows, K)).astype(np.float32), type=t)


def _refused(out: pc.Tensor, backend: str, watched: list[pc.Tensor], t: G, value: str, index: str) -> None:
    """Computing ``out`` on ``backend`` raises exactly InvalidArgument naming the value, and every tensor
    in ``watched`` keeps its bytes."""
    before = [bytes(w.raw()) for w in watched]
    want = (rf"quantizing to {traits(t).name}: row {BAD_ROW} \(index {re.escape(index)}\) "
            rf"holds the non-finite value {value} at column {BAD_COL}")
    with pytest.raises(InvalidArgument, match=want) as info:
        pc.compute(out, backend, strict=True)
    assert info.type is InvalidArgument
    assert [bytes(w.raw()) for w in watched] == before, "the destination was written"


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("bad, value", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_cpy_refuses(backend, t, bad, value):
    ctx = pc.Context()
    dst = _block_tensor(ctx, t, R)
    out = pc.cpy(ctx.from_numpy(_rows(bad)), dst)
    _refused(out, backend, [dst], t, value, "(0, 0, 2)")


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_cpy_refuses_from_a_transposed_view(backend, t):
    ctx = pc.Context()
    dst = _block_tensor(ctx, t, R)
    xt = ctx.from_numpy(np.ascontiguousarray(_rows(np.nan).T))  # [R, K] in memory, read as [K, R]
    _refused(pc.cpy(pc.transpose(xt), dst), backend, [dst], t, "nan", "(0, 0, 2)")


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_set_rows_refuses(backend, t):
    ctx = pc.Context()
    cache = _block_tensor(ctx, t, 6)
    out = pc.set_rows(cache, ctx.from_numpy(_rows(np.nan)), ctx.from_numpy(np.array([5, 0, 3, 1], np.int64)))
    with pytest.raises(InvalidArgument, match=rf"row {BAD_ROW} \(index \((0, 0, )?2,?\)\) holds the non-finite "
                       rf"value nan at column {BAD_COL}") as info:  # the reference names (2,), the others (0, 0, 2)
        before = bytes(cache.raw())
        pc.compute(out, backend, strict=True)
    assert info.type is InvalidArgument and bytes(cache.raw()) == before


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_add_refuses_a_non_finite_b(backend, t):
    ctx = pc.Context()
    a = _block_tensor(ctx, t, R)
    out = pc.add(a, ctx.from_numpy(_rows(np.nan)))
    out.raw()[...] = 0xA5  # a pattern in the result's own storage, which must stay too
    _refused(out, backend, [a, out], t, "nan", "(0, 0, 2)")
    a2 = _block_tensor(ctx, t, R)
    _refused(pc.add_inplace(a2, ctx.from_numpy(_rows(-np.inf))), backend, [a2], t, "-inf", "(0, 0, 2)")


def test_add_refuses_a_sum_made_infinite_by_a_q8_0_scale(backend):
    """Every float operand finite, but one Q8_0 block of a has the fp16 scale +inf (bits 0x7c00): its
    dequantized quants are ±inf (0·inf: NaN), so the sums to quantize are not finite."""
    ctx = pc.Context()
    a = _block_tensor(ctx, G.Q8_0, R)
    raw = a.raw().reshape(R, -1, 34)
    raw[BAD_ROW, 1, :2] = np.frombuffer(np.uint16(0x7C00).tobytes(), np.uint8)
    raw[BAD_ROW, 1, 2 + BAD_COL - 32] = 5  # quant 5 → +inf at column 37; the block's earlier columns too
    raw[BAD_ROW, 1, 2:2 + BAD_COL - 32] = 0  # 0·inf = NaN at columns 32..36: the first bad one is 32
    b = ctx.from_numpy(np.ones((R, K), np.float32))
    with pytest.raises(InvalidArgument, match=rf"quantizing to q8_0: row {BAD_ROW} \(index \(0, 0, 2\)\) holds "
                       r"the non-finite value nan at column 32") as info:
        before = bytes(a.raw())
        pc.compute(pc.add_inplace(a, b), backend, strict=True)
    assert info.type is InvalidArgument and bytes(a.raw()) == before
