"""Values a block cannot hold: a block whose stored scale would overflow F16 is refused, as NaN/inf are.

ggml's quantizers write such a block with a scale of inf, so every value of it dequantizes to inf or
NaN. Prism refuses it with InvalidArgument naming the row, its index and the block (columns), in
``prism_core.quant`` and in CPY / SET_ROWS / ADD into a block type on every backend alike, with the
destination's bytes as they were.

The thresholds below are derived from each format's scale, not read from the code: F16's largest value
is 65504 and a float32 rounds to F16 inf from 65520 (halfway to 65536, ties to even), so a scale
computed as ``s`` in float32 overflows iff ``|s| >= 65520``. Constant blocks make the searching
quantizers' scales simple (derivations beside each entry); the plain formats are tested at the
boundary itself, one float32 step apart.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import available_backend

import prism_core as pc
from prism_core import quant
from prism_core.errors import InvalidArgument
from prism_core.types import traits


def below(x: float) -> float:
    """The largest float32 under x."""
    return float(np.nextafter(np.float32(x), np.float32(0)))


LIMIT = 65520.0  # the least float32 that rounds to F16 inf

# format -> (largest block value accepted, least refused), for a block whose values all equal v > 0
CONSTANT_BLOCK = {
    "q4_0": (below(8 * LIMIT), 8 * LIMIT),  # d = max / -8: exact, so |d| >= 65520 iff v >= 524160
    "q5_0": (below(16 * LIMIT), 16 * LIMIT),  # d = max / -16
    "q8_0": (below(127 * LIMIT), 127 * LIMIT),  # d = amax / 127: 8321040 / 127 = 65520 exactly
    "tq1_0": (below(LIMIT), LIMIT),  # d = amax itself
    "tq2_0": (below(LIMIT), LIMIT),
    # s = d * sum(q) with d = v / 127 and every q = 127: s = 32 v, so 2047 gives 65504 and 2048 gives 65536
    "q8_1": (2047.0, 2048.0),
    # Q2_K: each 16's scale (max - min) / 3 with min clamped to 0: v / 3; d = max scale / 15 = v / 45
    "q2_K": (2.9e6, 3.0e6),  # 64444 and 66667
    # Q3_K: each 16's scale max / -4 (q = -4 fits v exactly), d = max scale / -32: v / 128
    "q3_K": (8.3e6, 8.5e6),  # 64844 and 66406
    # Q4_K: each 32's scale (max - 0) / 15, d = max scale / 63: v / 945
    "q4_K": (6.0e7, 6.4e7),  # 63492 and 67725
    # Q5_K: (max - 0) / 31, d = max scale / 63: v / 1953
    "q5_K": (1.25e8, 1.3e8),  # 64004 and 66564
    # Q6_K: each 16's scale max / -32, d = max scale / -128: v / 4096
    "q6_K": (2.6e8, 2.7e8),  # 63477 and 65918
    # IQ4_NL: d = max / -127 (the grid's -127 fits v exactly and no other candidate fits better)
    "iq4_nl": (8.2e6, 8.4e6),  # 64567 and 66142
    # IQ4_XS: each 32's scale settles on the grid's +113 (as exact as -127 there), d = max scale / 32:
    # v / 3616, so the limit is 236920320
    "iq4_xs": (2.3e8, 2.4e8),  # 63606 and 66372
}

# the asymmetric K-quants keep a block's minimum apart: a constant block of -v has scale 0 and minimum
# -v, stored as m = v against dmin = max m / 63 (Q4_K, Q5_K) or / 15 (Q2_K)
NEGATIVE_CONSTANT_BLOCK = {
    "q2_K": (9.7e5, 1.0e6),  # dmin = v / 15: 64667 and 66667
    "q4_K": (4.1e6, 4.2e6),  # dmin = v / 63: 65079 and 66667
    "q5_K": (4.1e6, 4.2e6),
}

QUANTIZERS = ["numpy", "default"]  # PRISM_QUANT=python, and the C quantizers when a backend offers them


@pytest.fixture(params=QUANTIZERS)
def quantizer(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setenv(quant.ENV_QUANT, "python")
    else:
        monkeypatch.delenv(quant.ENV_QUANT, raising=False)
    return request.param


def _rows(t: str, value: float) -> np.ndarray:
    """Six rows of two blocks, the value filling block 1 of row 5 (index (1, 2))."""
    be = traits(t).blck_size
    x = np.random.default_rng(3).standard_normal((2, 3, 2 * be)).astype(np.float32)
    x[1, 2, be:] = value
    return x


def _message(t: str, index: str = r"\(1, 2\)", row: int = 5) -> str:
    """The refusal's text as a regex; index: the row's index, a regex too."""
    be = traits(t).blck_size
    return (rf"quantizing to {t}: row {row} \(index {index}\), block 1 \(columns {be}\.\.{2 * be - 1}\) holds a "
            r"value of magnitude [0-9.e+]+, too large for the block: its scale overflows F16")


def _index_pattern(row: int) -> str:
    return rf"\((?:0, 0, )?{row},?\)"  # the reference's rows are 2-d in the ops ((2,)), the kernels' 4-d


@pytest.mark.parametrize("t", list(CONSTANT_BLOCK))
def test_a_block_whose_scale_overflows_is_refused_at_the_derived_limit(quantizer, t):
    positive = CONSTANT_BLOCK[t]
    negative = NEGATIVE_CONSTANT_BLOCK.get(t, positive)  # the symmetric formats: the same magnitude
    for ok, refused in (positive, [-v for v in negative]):
        blocks = quant.quantize(_rows(t, ok), t)
        assert np.isfinite(quant.dequantize(blocks, t)).all(), (t, ok)
        with pytest.raises(InvalidArgument, match=_message(t)) as info:
            quant.quantize(_rows(t, refused), t)
        assert info.type is InvalidArgument


@pytest.mark.parametrize("t, levels", [("q4_1", 15), ("q5_1", 31)])
def test_affine_formats_overflow_by_their_range_or_their_minimum(quantizer, t, levels):
    """Q4_1/Q5_1 store d = (max - min) / levels and m = min: either can overflow."""
    x = _rows(t, 0.0)
    x[1, 2, 32 + 7] = below(levels * LIMIT)  # min 0: d just under 65520
    assert np.isfinite(quant.dequantize(quant.quantize(x, t), t)).all()
    x[1, 2, 32 + 7] = levels * LIMIT
    with pytest.raises(InvalidArgument, match=_message(t)):
        quant.quantize(x, t)
    y = _rows(t, below(LIMIT))  # every value of the block: d = 0, m just under 65520
    assert np.isfinite(quant.dequantize(quant.quantize(y, t), t)).all()
    with pytest.raises(InvalidArgument, match=_message(t)):
        quant.quantize(_rows(t, LIMIT), t)


@pytest.mark.parametrize("t", ["q8_K", "mxfp4"])
def test_formats_whose_scale_cannot_overflow_take_any_finite_value(quantizer, t):
    """Q8_K keeps d in float32 (amax / 127); MXFP4's E8M0 exponent reaches at most 2^126 for the
    largest float32: both hold every finite block."""
    x = _rows(t, 3.0e38)
    back = quant.dequantize(quant.quantize(x, t), t)
    assert np.isfinite(back).all()
    assert back[1, 2, -1] > 1e38


@pytest.mark.parametrize("t", ["iq3_s", "iq2_s", "iq3_xxs"])
def test_the_lattice_formats_refuse_alike(t):
    """The C-only lattice formats (csimd) store an F16 super-block scale too: a block of 1e30 overflows it
    whatever the search picks, one of magnitude about 1 does not."""
    available_backend("csimd")
    assert np.isfinite(quant.dequantize(quant.quantize(_rows(t, 1.0), t), t)).all()
    with pytest.raises(InvalidArgument, match=_message(t)):
        quant.quantize(_rows(t, 1e30), t)
    with pytest.raises(InvalidArgument, match=_message(t)):
        quant.quantize_chunk(_rows(t, -1e30), t)


def test_quantize_chunk_refuses_too(quantizer):
    x = _rows("q4_K", 6.4e7)
    with pytest.raises(InvalidArgument, match=_message("q4_K")):
        quant.quantize_chunk(x, "q4_K")
    with pytest.raises(InvalidArgument, match=_message("q4_K")):
        quant.quantize_chunk(x, "q4_K", imatrix=np.ones(x.shape[-1], np.float32))


def test_ggmls_golden_huge_rows_are_refused_exactly_where_ggml_stored_an_inf_scale(quantizer):
    """tests/data/quant_golden.npz holds ggml's own bytes for rows up to float32's maximum: a row is refused
    iff one of ggml's blocks for it dequantizes to a non-finite value (or, Q8_1, has an inf s), and with
    overflow="ggml" every row's bytes are ggml's (tests/test_quant_golden.py)."""
    from pathlib import Path
    golden = np.load(Path(__file__).parent / "data" / "quant_golden.npz")
    x = golden["x_huge"]
    checked = 0
    for t in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K", "q4_K", "q6_K", "iq4_xs", "tq2_0"):
        if f"qh_{t}" not in golden:
            continue
        want = golden[f"qh_{t}"]
        tr = traits(t)
        with np.errstate(invalid="ignore", over="ignore"):
            inf_scale = ~np.isfinite(quant.dequantize(want, t)).all(axis=1)
        if t == "q8_1":
            s = np.ascontiguousarray(want.reshape(len(x), -1, tr.type_size)[:, :, 2:4]).view(np.float16)
            inf_scale |= ~np.isfinite(s).all(axis=(1, 2))
        for i in range(len(x)):
            if inf_scale[i]:
                with pytest.raises(InvalidArgument, match="its scale overflows F16"):
                    quant.quantize(x[i:i + 1], t)
            else:
                assert (quant.quantize(x[i:i + 1], t) == want[i:i + 1]).all(), (t, i)
        checked += int(inf_scale.sum())
    assert checked > 0


def test_the_issues_example():
    with pytest.raises(InvalidArgument, match=r"row 0 \(index \(0,\)\), block 0 \(columns 0\.\.31\) holds a value "
                       r"of magnitude 1e\+07"):
        quant.quantize(np.full((1, 32), 1e7, np.float32), "q8_0")


def test_from_numpy_refuses_and_f16_is_a_conversion_not_a_quantizer():
    ctx = pc.Context()
    with pytest.raises(InvalidArgument, match=_message("q8_0", r"\(0, 0, 5\)")):  # a 4-d tensor's row index
        ctx.from_numpy(_rows("q8_0", 127 * LIMIT).reshape(6, 64), type="q8_0")
    assert ctx.used == 0  # nothing half-built
    # F16 and BF16 have no block scale: a value past F16's range converts to inf, as ggml's conversion does
    t = ctx.from_numpy(np.array([1e5, -1e5, 1.0], np.float32), type="f16")
    assert t.numpy().tolist() == [np.inf, -np.inf, 1.0]


# ---------------------------------------------------------------- the ops that quantize, on every backend
BACKENDS = ("numpy", "numba", "csimd")
OP_TYPES = ("q8_0", "q4_K", "tq2_0", "q8_1")
K, R = 512, 4
BAD_ROW = 2


@pytest.fixture(params=BACKENDS)
def backend(request):
    return available_backend(request.param)


def _floats(t: str, value: float) -> np.ndarray:
    be = traits(t).blck_size
    x = np.random.default_rng(5).standard_normal((R, K)).astype(np.float32)
    x[BAD_ROW, be:2 * be] = value
    return x


def _block_tensor(ctx: pc.Context, t: str, rows: int) -> pc.Tensor:
    return ctx.from_numpy(np.random.default_rng(6).standard_normal((rows, K)).astype(np.float32), type=t)


def _refused_op(out: pc.Tensor, backend: str, watched: list[pc.Tensor], t: str) -> None:
    before = [bytes(w.raw()) for w in watched]
    with pytest.raises(InvalidArgument, match=_message(t, _index_pattern(BAD_ROW), BAD_ROW)) as info:
        pc.compute(out, backend, strict=True)
    assert info.type is InvalidArgument
    assert [bytes(w.raw()) for w in watched] == before, "the destination was written"


def _too_large(t: str) -> float:
    return CONSTANT_BLOCK[t][1]


@pytest.mark.parametrize("t", OP_TYPES)
def test_cpy_refuses(backend, t):
    ctx = pc.Context()
    dst = _block_tensor(ctx, t, R)
    _refused_op(pc.cpy(ctx.from_numpy(_floats(t, _too_large(t))), dst), backend, [dst], t)


@pytest.mark.parametrize("t", OP_TYPES)
def test_cpy_refuses_from_a_transposed_view(backend, t):
    ctx = pc.Context()
    dst = _block_tensor(ctx, t, R)
    xt = ctx.from_numpy(np.ascontiguousarray(_floats(t, _too_large(t)).T))  # read back as [R, K]
    _refused_op(pc.cpy(pc.transpose(xt), dst), backend, [dst], t)


@pytest.mark.parametrize("t", OP_TYPES)
def test_cpy_takes_the_largest_value_a_block_holds(backend, t):
    """Just under the limit the op computes, and its bytes are quantize()'s (no backend refuses early)."""
    ctx = pc.Context()
    x = _floats(t, CONSTANT_BLOCK[t][0])
    out = pc.cpy(ctx.from_numpy(x), _block_tensor(ctx, t, R))
    pc.compute(out, backend, strict=True)
    assert bytes(out.raw()) == quant.quantize(x, t).tobytes()


@pytest.mark.parametrize("t", OP_TYPES)
def test_set_rows_refuses(backend, t):
    ctx = pc.Context()
    cache = _block_tensor(ctx, t, 6)
    rows = ctx.from_numpy(_floats(t, -_too_large(t)))
    _refused_op(pc.set_rows(cache, rows, ctx.from_numpy(np.array([5, 0, 3, 1], np.int64))), backend, [cache], t)


@pytest.mark.parametrize("t", ["q8_0", "q4_K"])
def test_add_refuses_a_sum_too_large_for_a_block(backend, t):
    ctx = pc.Context()
    a = _block_tensor(ctx, t, R)
    out = pc.add(a, ctx.from_numpy(_floats(t, _too_large(t))))
    out.raw()[...] = 0xA5  # the result's own storage must keep its bytes too
    _refused_op(out, backend, [a, out], t)


def test_ggml_writes_the_overflowing_scale_as_ggml_does():
    """The ggml backend is ggml itself, a peer: it stores the inf scale (docs/backends/ggml.md)."""
    info = next((i for i in pc.backends() if i.name == "ggml"), None)
    if info is None or not info.available:
        pytest.skip("the ggml backend is unavailable here")
    ctx = pc.Context()
    out = pc.cpy(ctx.from_numpy(_floats("q8_0", _too_large("q8_0"))), _block_tensor(ctx, "q8_0", R))
    pc.compute(out, "ggml", strict=True)
    back = quant.dequantize(np.frombuffer(bytes(out.raw()), np.uint8).reshape(R, -1), "q8_0")
    assert not np.isfinite(back[BAD_ROW, 32:64]).any() and np.isfinite(back[BAD_ROW, 64:]).all()
