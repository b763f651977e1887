"""Blocks whose bytes are worked out by hand from ggml's quantization rules (ties, zero blocks,
single outliers, constant blocks), so the formats are checked without the golden file too."""

from __future__ import annotations

import numpy as np

from prism_core import quant
from prism_core.quant.iquants import KVALUES_IQ4NL

F32 = np.float32


def half(v: float) -> list[int]:
    return list(np.array([v], np.float16).view(np.uint8))


def nibbles(q: list[int]) -> list[int]:
    """ggml's 4-bit packing of 32 quants: byte j = q[j] | q[j + 16] << 4."""
    return [q[j] | (q[j + 16] << 4) for j in range(16)]


def qbytes(x: np.ndarray, t: str) -> list[int]:
    return quant.quantize(np.asarray(x, F32), t).tolist()


# ---------------------------------------------------------------- Q8_0 / Q8_1

def _q8_tie_block() -> np.ndarray:
    x = np.zeros(32, F32)
    x[:5] = [127, 2.5, -2.5, 0.5, -63.5]  # amax 127: d = 1, every x/d is exact, four of them ties
    return x


def test_q8_0_reference_rounds_ties_away_from_zero():
    q = [127, 3, -3, 1, -64] + [0] * 27
    assert qbytes(_q8_tie_block(), "q8_0") == half(1.0) + list(np.array(q, np.int8).view(np.uint8))


def test_q8_0_activations_round_ties_to_even():
    q = [127, 2, -2, 0, -64] + [0] * 27
    assert quant.quantize_activations(_q8_tie_block(), "q8_0").tolist() == \
        half(1.0) + list(np.array(q, np.int8).view(np.uint8))


def test_q8_1_reference_and_activations_with_their_sums():
    ref = [127, 3, -3, 1, -64] + [0] * 27  # Σ = 64
    act = [127, 2, -2, 0, -64] + [0] * 27  # Σ = 63
    assert qbytes(_q8_tie_block(), "q8_1") == half(1.0) + half(64.0) + list(np.array(ref, np.int8).view(np.uint8))
    assert quant.quantize_activations(_q8_tie_block(), "q8_1").tolist() == \
        half(1.0) + half(63.0) + list(np.array(act, np.int8).view(np.uint8))
    # y = q·d, s is only a dot-product helper
    assert quant.dequantize(quant.quantize(_q8_tie_block(), "q8_1"), "q8_1").tolist() == \
        [127.0, 3.0, -3.0, 1.0, -64.0] + [0.0] * 27


def test_q8_0_zero_block():
    assert qbytes(np.zeros(32), "q8_0") == [0] * 34


# ---------------------------------------------------------------- Q4_0 / Q4_1 / Q5_0 / Q5_1

def test_q4_0_ties_round_up_through_trunc_plus_8_5():
    x = np.zeros(32, F32)
    x[:5] = [-8, 7, 0.5, -0.5, -1.5]  # max |x| is the -8: d = -8/-8 = 1; q = trunc(x + 8.5), max 15
    x[16] = 3
    q = [0, 15, 9, 8, 7] + [8] * 11 + [11] + [8] * 15
    assert qbytes(x, "q4_0") == half(1.0) + nibbles(q)


def test_q4_0_zero_block_keeps_ggmls_negative_zero_scale():
    # ggml's scan starts from max = +0, so d = +0 / -8 = -0 even for a block of -0.0 (gguf.quants gives +0 there)
    assert qbytes(np.zeros(32), "q4_0") == [0x00, 0x80] + [0x88] * 16
    assert qbytes(-np.zeros(32), "q4_0") == [0x00, 0x80] + [0x88] * 16


def test_q4_1_affine_block():
    x = np.zeros(32, F32)
    x[:4] = [-1, 14, 0.5, -0.5]  # min -1, max 14: d = 1, m = -1, q = trunc(x + 1 + 0.5)
    q = [0, 15, 2, 1] + [1] * 28
    assert qbytes(x, "q4_1") == half(1.0) + half(-1.0) + nibbles(q)


def test_q4_1_signed_zero_min_is_the_first_zero():
    x = np.zeros(32, F32)
    x[1:] = -0.0  # ggml's min is x[0] = +0
    assert qbytes(x, "q4_1")[:4] == [0, 0, 0, 0]
    assert qbytes(-x, "q4_1")[:4] == [0, 0, 0x00, 0x80]


def test_q5_0_block_with_high_bits():
    x = np.zeros(32, F32)
    x[:3] = [-16, 15, 0.5]  # d = 1; q = trunc(x + 16.5): 0, 31, 17; zeros → 16
    x[17] = -0.5  # 16
    q = [0, 31, 17] + [16] * 29
    qh = sum(1 << j for j in range(32) if q[j] >> 4)
    lo = [(q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16)]
    assert qh == 0xFFFFFFFE
    assert qbytes(x, "q5_0") == half(1.0) + list(np.array([qh], "<u4").view(np.uint8)) + lo


def test_q5_1_block():
    x = np.zeros(32, F32)
    x[:4] = [0, 31, 16.5, 2.5]  # min 0, max 31: d = 1, m = 0, q = trunc(x + 0.5): 0, 31, 17, 3
    q = [0, 31, 17, 3] + [0] * 28
    qh = sum(1 << j for j in range(32) if q[j] >> 4)
    lo = [(q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16)]
    assert qbytes(x, "q5_1") == half(1.0) + half(0.0) + list(np.array([qh], "<u4").view(np.uint8)) + lo


# ---------------------------------------------------------------- K-quants

def _outlier(n: int = 256) -> np.ndarray:
    x = np.zeros(n, F32)
    x[0] = 1.0
    return x


def test_k_quant_zero_blocks_are_all_zero_bytes():
    for t, size in (("q2_K", 84), ("q3_K", 110), ("q4_K", 144), ("q5_K", 176), ("q6_K", 210), ("q8_K", 292)):
        assert qbytes(np.zeros(256), t) == [0] * size, t


def test_q2_K_constant_negative_block():
    # every sub-block is flat: scale 0, min 1; only mins are stored: 4-bit min 15 (15/max_min · 1), dmin = 1/15
    assert qbytes(np.full(256, -1.0), "q2_K") == [0xF0] * 16 + [0] * 64 + half(0.0) + half(float(F32(1) / F32(15)))


def test_q2_K_single_outlier():
    # sub-block 0: min 0, max 1 → iscale 3, scale 1/3 reproduces x exactly (error 0, no candidate wins);
    # super-scale d = (1/3)/15, 4-bit scale 15; requantised x[0]: nearest_int(1/(d·15)) = 3
    d = float(F32(1) / F32(3) / F32(15))
    assert qbytes(_outlier(), "q2_K") == [15] + [0] * 15 + [3] + [0] * 63 + half(d) + half(0.0)


def test_q3_K_single_outlier():
    # sub-block 0: iscale -4/1, l = -4, rmse passes change nothing (the other weights x² are 0): scale -4/16;
    # super: iscale -32/-0.25 = 128, 6-bit scales: -32 (+32 = 0) for sub-block 0, 0 (+32 = 32) elsewhere;
    # d = 1/128; requantised x[0]: -4 → L 0 (no high bit), zeros of sub-block 0: L 4 (high bit set, low 0);
    # other sub-blocks have scale 0 and keep make_q3_quants' L = 0.
    hmask = [0] + [1] * 15 + [0] * 16
    hi = [0] + [2] * 15  # 6-bit scale >> 4 per sub-block
    sc_hi = [hi[m] | hi[m + 4] << 2 | hi[m + 8] << 4 | hi[m + 12] << 6 for m in range(4)]
    assert sc_hi == [168, 170, 170, 170]
    assert qbytes(_outlier(), "q3_K") == hmask + [0] * 64 + [0] * 8 + sc_hi + half(1 / 128)
    y = quant.dequantize(quant.quantize(_outlier(), "q3_K"), "q3_K")
    assert y.tolist() == _outlier().tolist()


def test_q4_K_and_q5_K_constant_negative_block():
    # flat sub-blocks: scale 0, min 1 → 6-bit mins 63 (stored with their high bits in bytes 4..7), dmin = 1/63
    for t, tail in (("q4_K", [0] * 128), ("q5_K", [0] * 32 + [0] * 128)):
        got = qbytes(np.full(256, -1.0), t)
        assert got == half(0.0) + half(float(F32(1) / F32(63))) + [0] * 4 + [255] * 4 + [0xF0] * 4 + tail, t


def test_q4_K_single_outlier():
    # sub-block 0: min 0, max 1 → scale 1/15 reproduces x exactly, so the search keeps it; 6-bit scale
    # nearest_int(63/(1/15) · (1/15)) = 63, d = (1/15)/63, x[0] requantised to nearest_int(1/(d·63)) = 15
    s = F32(1) / F32(15)
    d = float(s / F32(63))
    qs = [15] + [0] * 127
    assert qbytes(_outlier(), "q4_K") == half(d) + half(0.0) + [63] + [0] * 11 + qs


def test_q6_K_single_outlier():
    # sub-block 0: iscale -32, l = -32 → L 0, zeros → L 32; scale -1/32 (no candidate does better);
    # super: iscale -128/(-1/32) = 4096, 8-bit scale nearest_int(4096 · -1/32) = -128, d = 1/4096;
    # requantised: x[0]/(d·-128) = -32 → L 0; zeros → L 32, whose high bits (2) land in qh[1..15].
    assert qbytes(_outlier(), "q6_K") == [0] * 128 + [0] + [2] * 15 + [0] * 48 + [0x80] + [0] * 15 + half(2 ** -12)


def test_q8_K_ties_to_even_and_bsums():
    x = np.zeros(256, F32)
    x[:5] = [-127, 2.5, 3.5, -2.5, 100]  # max is -127: iscale = -127/-127 = 1, d = 1.0 (float32)
    q = [-127, 2, 4, -2, 100] + [0] * 251
    bsums = [sum(q[16 * j:16 * j + 16]) for j in range(16)]
    want = list(np.array([1.0], "<f4").view(np.uint8)) + list(np.array(q, np.int8).view(np.uint8)) \
        + list(np.array(bsums, "<i2").view(np.uint8))
    assert qbytes(x, "q8_K") == want
    assert quant.quantize_activations(x, "q8_K").tolist() == want
    assert quant.dequantize(np.array(want, np.uint8), "q8_K").tolist() == [float(v) for v in q]


def test_q8_K_positive_max_flips_the_sign_of_d():
    x = np.zeros(256, F32)
    x[:2] = [127, -5]  # iscale = -127/127 = -1: q = -x, d = -1
    got = quant.quantize(x, "q8_K")
    assert got[:4].view("<f4")[0] == -1.0 and got[4:6].view(np.int8).tolist() == [-127, 5]


# ---------------------------------------------------------------- IQ4_NL / IQ4_XS

_TABLE_32 = np.tile(KVALUES_IQ4NL.astype(F32), 2)  # every value exactly on the table
_TABLE_NIBBLES = [j | (j << 4) for j in range(16)]


def test_iq4_nl_table_values_and_zero_block():
    # max is -127: d = -127/-127 = 1, indices exact, weighted fit sumqx/sumq2 = 1 exactly
    assert qbytes(_TABLE_32, "iq4_nl") == half(1.0) + _TABLE_NIBBLES
    # an all-zero block: scale 0; ggml leaves its indices undefined, Prism writes index 8 (value 1, nearest 0)
    assert qbytes(np.zeros(32), "iq4_nl") == [0, 0] + [0x88] * 16


def test_iq4_xs_table_values_and_zero_block():
    # each 32: scale 1 (the exact candidate id = (0 - 127)/-127 wins); super d = -1/32, 6-bit l = -32 (+32 = 0)
    assert qbytes(np.tile(_TABLE_32, 8), "iq4_xs") == half(-1 / 32) + [0, 0] + [0] * 4 + _TABLE_NIBBLES * 8
    # all zero: d = -(+0)/32 = -0; each l = 0 (+32 = 32: low nibble 0, high bits 2); indices nearest 0 = 8
    assert qbytes(np.zeros(256), "iq4_xs") == [0x00, 0x80] + [0xAA, 0xAA] + [0] * 4 + [0x88] * 128


# ---------------------------------------------------------------- MXFP4 / TQ1_0 / TQ2_0

def test_mxfp4_block():
    # amax 4: e = floor(log2 4) - 2 + 127 = 127, half-scale 2^(126-127) = 0.5; doubled e2m1 table · 0.5
    x = np.zeros(32, F32)
    x[:6] = [4, -4, 1.5, 3, 0, -0.5]
    q = [6, 14, 3, 5, 0, 9] + [0] * 26
    assert qbytes(x, "mxfp4") == [127] + nibbles(q)
    assert quant.dequantize(quant.quantize(x, "mxfp4"), "mxfp4").tolist() == x.tolist()


def test_tq2_0_block():
    x = np.zeros(256, F32)
    x[:2] = [2, 1]  # d = 2; q = roundf(x/d) + 1: 2, roundf(0.5) + 1 = 2, zeros 1; 2-bit fields at bits 2k
    qs = [2 | 1 << 2 | 1 << 4 | 1 << 6] * 2 + [85] * 62
    assert qbytes(x, "tq2_0") == qs + half(2.0)


def test_tq1_0_zero_block():
    # all ternary digits 1: 5 digits 11111 (base 3) = 121 → ceil(121·256/243) = 128; 4 digits 1111 = 120 → 127
    assert qbytes(np.zeros(256), "tq1_0") == [128] * 48 + [127] * 4 + [0, 0]


def test_iq4_nl_ties_between_table_entries_go_up():
    # max -127: d = -127/-127 = 1 and x/d = x. -4.5 sits halfway between -10 and 1 (indices 7, 8): up, 8;
    # 0 is nearer 1 than -10: 8; 101 is halfway between 89 and 113: up, 15. The reference path (ntry = -1)
    # keeps these indices; its scale is the weighted fit Σx²·q·x / Σx²·q² in float32, in element order.
    x = np.zeros(32, F32)
    x[:3] = [-127, -4.5, 101]
    idx = [0, 8, 15] + [8] * 29
    got = quant.quantize(x, "iq4_nl")
    assert got[2:].tolist() == [idx[j] | (idx[j + 16] << 4) for j in range(16)]
    q = KVALUES_IQ4NL[idx].astype(F32)
    w = x * x
    sumqx, sumq2 = F32(0), F32(0)
    for j in range(32):
        sumqx = F32(sumqx + w[j] * q[j] * x[j])
        sumq2 = F32(sumq2 + w[j] * q[j] * q[j])
    assert got[:2].tolist() == half(float(sumqx / sumq2))
