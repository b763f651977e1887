"""prism_core.quant against golden blocks written by ggml's own C code (tests/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prism_core import quant
from prism_core.types import GGMLType, traits

GOLDEN = np.load(Path(__file__).parent / "data" / "quant_golden.npz")
X = GOLDEN["x"]
NAMES = GOLDEN["names"]
QUANTIZING = sorted(traits(t).name for t in GGMLType if quant.can_quantize(t))
GOLDEN_DEQUANT = sorted(k[3:] for k in GOLDEN.files if k.startswith("dq_") and quant.can_dequantize(k[3:]))


def _differences(got: np.ndarray, want: np.ndarray) -> list[str]:
    rows = np.nonzero((got != want).any(axis=-1))[0]
    return [f"row {i} ({NAMES[i]}): bytes {np.nonzero(got[i] != want[i])[0][:8].tolist()}" for i in rows[:5]]


def _ignore_iq4_nl_zero_block_indices(t: str, got: np.ndarray, want: np.ndarray) -> None:
    """ggml leaves an all-zero IQ4_NL block's indices as its scratch buffer held them (the previous
    block's, or uninitialised memory); only the scale (0) is defined, so compare that alone there."""
    if t != "iq4_nl":
        return
    zero = np.abs(X.reshape(len(X), -1, 32)).max(axis=2) < 1e-15
    assert zero.any()  # the golden rows do hold such blocks
    g, w = got.reshape(len(X), -1, 18), want.reshape(len(X), -1, 18)
    assert (g[zero][:, :2] == w[zero][:, :2]).all()
    g[zero] = w[zero]


def test_golden_covers_every_quantizing_format():
    assert QUANTIZING and all(f"q_{t}" in GOLDEN.files for t in QUANTIZING)
    assert {"zeros", "outlier", "tiny", "ties_q8", "neg_only", "const_pos", "huge", "signed_zeros"} <= set(NAMES)


@pytest.mark.parametrize("t", QUANTIZING)
def test_quantize_matches_ggml_reference_bytes(t):
    got = quant.quantize(X, t, overflow="ggml")  # ggml's bytes, inf scales included (refused by default)
    want = GOLDEN[f"q_{t}"]
    assert got.dtype == np.uint8 and got.shape == want.shape
    _ignore_iq4_nl_zero_block_indices(t, got, want)
    assert not _differences(got, want), _differences(got, want)


@pytest.mark.parametrize("t", QUANTIZING)
def test_quantize_matches_ggml_on_huge_rows(t):
    """Rows with values from 1e5 to float32's maximum (tests/data/README.md: x_huge): group scales and
    weighted sums overflow to inf and NaN there, and ggml's comparisons decide where each NaN goes
    (its absmax scans skip one, its nearest-entry search gives one the last index)."""
    x, want = GOLDEN["x_huge"], GOLDEN[f"qh_{t}"]
    got = quant.quantize(x, t, overflow="ggml")
    assert got.shape == want.shape
    if t == "iq4_nl":  # as _ignore_iq4_nl_zero_block_indices, for these rows
        zero = np.abs(x.reshape(len(x), -1, 32)).max(axis=2) < 1e-15
        got.reshape(len(x), -1, 18)[zero] = want.reshape(len(x), -1, 18)[zero]
    bad = np.nonzero((got != want).any(axis=-1))[0]
    assert not len(bad), [f"row {i} ({GOLDEN['names_huge'][i]})" for i in bad[:5]]


def test_huge_rows_cover_overflow():
    """Every huge row is finite (quantize refuses anything else) and holds at least one value of 1e5 or
    more; one value of 1e13 (IQ4_XS's NaN index), one of 1e19 (the NaN group scales of Q3_K, Q6_K and
    IQ4_XS) and values up to float32's maximum are among them."""
    x = GOLDEN["x_huge"]
    assert np.isfinite(x).all() and np.abs(x).max() > 3e38 and (np.abs(x).max(axis=1) >= 1e5).all()
    assert {"one_1e+13", "one_1e+19", "near_fmax"} <= set(GOLDEN["names_huge"])


@pytest.mark.parametrize("t", GOLDEN_DEQUANT)
def test_dequantize_matches_ggml_dequantize_row(t):
    want = GOLDEN[f"dq_{t}"]
    got = quant.dequantize(GOLDEN[f"q_{t}"][:len(want)], t)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{t}: {np.count_nonzero(~same)} values differ"


def test_every_dequantizable_format_has_golden_values_or_is_q8_1():
    # ggml has no dequantize_row_q8_1 (Q8_1 is only ever a dot-product operand); tests/test_quant_hand.py covers it
    missing = {traits(t).name for t in GGMLType if quant.can_dequantize(t)} - set(GOLDEN_DEQUANT)
    assert missing == {"q8_1"}


@pytest.mark.parametrize("t", ["q8_0", "q8_1"])
def test_activation_quantizer_matches_ggml_cpu_x86(t):
    got = quant.quantize_activations(X, t)
    want = GOLDEN[f"act_{t}"]
    assert not _differences(got, want), _differences(got, want)


def test_activation_and_reference_q8_0_really_differ_on_ties():
    """The golden rows hold exact ties (ties_q8); ggml's two Q8_0 quantizers disagree there and only there
    (and on subnormal blocks, whose 127/amax multiplier overflows)."""
    ref, act = GOLDEN["q_q8_0"], GOLDEN["act_q8_0"]
    differing = {str(NAMES[i]) for i in np.nonzero((ref != act).any(axis=1))[0]}
    assert "ties_q8" in differing
    assert differing <= {"ties_q8", "ties_q4", "ties_q5", "halves", "tiny", "small_ints", "pow2_edges", "random"}
    ours = quant.quantize_activations(X, "q8_0") != quant.quantize(X, "q8_0", overflow="ggml")
    assert ours.any(axis=1).tolist() == (ref != act).any(axis=1).tolist()


@pytest.mark.parametrize("t", QUANTIZING)
def test_golden_row_by_row_equals_whole_batch(t):
    """Leading dims and chunking do not change a row's bytes."""
    rows = X[: len(X) // 6 * 6]
    whole = quant.quantize(rows.reshape(6, -1, 256), t, overflow="ggml").reshape(len(rows), -1)
    one = np.stack([quant.quantize(r, t, overflow="ggml") for r in rows])
    assert (whole == one).all() and whole.shape[-1] == len(X[0]) // traits(t).blck_size * traits(t).type_size
