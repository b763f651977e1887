"""Non-linear 4-bit formats IQ4_NL (blocks of 32) and IQ4_XS (256, with 6-bit sub-scales).

Quants index the 16-entry table ``KVALUES_IQ4NL`` (ggml-common.h's ``kvalues_iq4nl``,
data carried over as is). Both quantizers match ggml's reference entry points:
``quantize_row_iq4_nl_ref`` runs the shared search with ``ntry = -1`` (one scale, no
search), ``quantize_row_iq4_xs_ref`` with ``ntry = 7`` (15 candidate scales per 32).
"""

from __future__ import annotations

import numpy as np

from .numerics import F32, GROUP_MAX_EPS, Int8Table, fp16_bits, nearest_int, select, seq_sum, signed_absmax

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
_TABLE = Int8Table(KVALUES_IQ4NL)
_VALUES = _TABLE.f32
# ggml's reference leaves an all-zero IQ4_NL block's indices as its scratch buffer held them: the
# previous block's of the row (quantize_rows_iq4_nl repeats those), or uninitialised memory for a row's
# first block, where Prism writes the index nearest 0 (what ggml_quantize_chunk writes there). The scale
# is 0, so every choice decodes to 0.
_ZERO_INDEX = int(_TABLE.best_index(np.array([0], F32))[0][0])


def _errstate():
    return np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore")


def _scale_search(x: np.ndarray, ntry: int, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``quantize_row_iq4_nl_impl``'s per-32 search over columns ``(32, m)`` with weights w (None:
    ggml's default x²): returns (indices, scale, all-zero mask)."""
    amax, vmax = signed_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x if w is None else w
    d = (-vmax if ntry > 0 else vmax) / _VALUES[0]

    def trial(iscale):
        idx, q = _TABLE.best_index(iscale * x)
        wq = w * q
        return idx, seq_sum(wq * x), seq_sum(wq * q)

    L, sumqx, sumq2 = trial(F32(1) / d)
    d = select(sumq2 > 0, sumqx / sumq2, F32(0))
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        _, sqx, sq2 = trial(F32(itry + int(KVALUES_IQ4NL[0])) / vmax)
        take = (sq2 > 0) & (sqx * sqx > best * sq2)
        d = select(take, sqx / sq2, d)
        best = select(take, d * sqx, best)
    return L, select(zero, F32(0), d), zero


def _pack_nibbles(L: np.ndarray) -> np.ndarray:
    """Indices (nb, n) → (nb, n/2) bytes: byte 16·i + j = L[32i + j] | L[32i + 16 + j] << 4."""
    q = L.reshape(len(L), -1, 2, 16).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(len(L), -1)


def quantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    """Blocks on their own: an all-zero block gets the index nearest 0 (see repeat_zero_blocks)."""
    nb = len(blocks)
    with _errstate():
        x = np.ascontiguousarray(blocks.T)
        L, d, zero = _scale_search(x, -1)
    L = select(zero, _ZERO_INDEX, L).T
    return np.concatenate([fp16_bits(d).view(np.uint8).reshape(nb, 2), _pack_nibbles(L)], axis=1)


def quantize_iq4_xs(blocks: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """The reference, or with w (the per-element weights, (32, groups) as the search lays them out)
    ggml's quantize_iq4_xs with an importance matrix."""
    nb = len(blocks)
    with _errstate():
        x = np.ascontiguousarray(blocks.reshape(-1, 32).T)
        _, scales, _ = _scale_search(x, 7, w)
        scales = scales.reshape(nb, 8)
        amax, max_scale = signed_absmax(scales.T)
        d = -select(amax > 0, max_scale, F32(0)) / F32(32)  # ggml's scan starts from +0
        inv = select(d != 0, F32(1) / d, F32(0))
        ls = np.clip(nearest_int(inv[:, None] * scales), -32, 31)
        dl = (d[:, None] * ls.astype(F32)).reshape(-1)
        idl = select(dl != 0, F32(1) / dl, F32(0))
        L = _TABLE.best_index(idl * x)[0].T.reshape(nb, 256)
    ls = (ls + 32).astype(np.uint16)
    scales_l = ((ls[:, 0::2] & 0xF) | ((ls[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    scales_h = np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=1).astype(np.uint16)
    return np.concatenate([fp16_bits(d).view(np.uint8).reshape(nb, 2), scales_h.view(np.uint8).reshape(nb, 2),
                           scales_l, _pack_nibbles(L)], axis=1)


def repeat_zero_blocks(rows: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """IQ4_NL rows as ggml's reference writes them: each all-zero block (every |x| below the group
    threshold) takes the indices of the previous block of its row. rows: float (nrows, n); blocks: uint8
    (nrows, n/32 * 18), modified in place and returned."""
    nrows, n = rows.shape
    zero = np.abs(rows.reshape(nrows, n // 32, 32)).max(axis=2) < GROUP_MAX_EPS
    zero[:, 0] = False
    if zero.any():
        b = blocks.reshape(nrows, n // 32, 18)
        idx = np.where(zero, 0, np.arange(n // 32)[None, :])
        np.maximum.accumulate(idx, axis=1, out=idx)  # the last non-zero block at or before each
        b[:, :, 2:] = np.take_along_axis(b[:, :, 2:], idx[:, :, None], axis=1)
    return blocks
