"""The quantizers llama-quantize runs with an importance matrix (ggml_quantize_chunk with quant_weights), in
NumPy: Q4_0, Q4_1, Q5_0, Q5_1 (row-level), Q2_K..Q6_K, IQ4_XS, and IQ4_NL's chunk path (15 candidate scales,
with or without weights). Byte for byte ggml's (llama.cpp 0.3.36's ggml-quants.c); the C copies in
csrc/csimd_quantize_weighted.h are what runs when the csimd backend is there.

Layout as in :mod:`.kquants`: each search keeps the element index of a group on axis 0 and runs over every
group at once; ``qw`` arrays are shaped like the blocks they weight.
"""

from __future__ import annotations

import numpy as np

from .iquants import _TABLE, _pack_nibbles, _scale_search
from .kquants import (
    QK_K,
    _by_position,
    _errstate,
    _k4_head,
    _q2_K_store,
    _q3_K_store,
    make_qkx2_quants,
    make_qx_quants_rmse1,
    quantize_q6_K,
)
from .numerics import F32, GROUP_MAX_EPS, fp16_bits, nearest_int, select, seq_sum


def make_qp_quants(x: np.ndarray, nmax: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qp_quants`` over columns of non-negative x ``(n, m)`` with weights w: (L (n, m) uint8, scale
    (m,)). The rounding against nmax/max, the best of 8 further scales by weighted squared error, then up to
    five passes moving one L at a time; quants kept in uint8 as ggml keeps them (negative ones wrap)."""
    n = len(x)
    mx = np.zeros(x.shape[1], F32)
    for i in range(n):  # ggml's MAX(max, x): a NaN max is replaced by the next value
        mx = select(mx > x[i], mx, x[i])
    zero = mx < GROUP_MAX_EPS
    fnmax = F32(nmax)

    def wsq(scale, lf):
        d = x - scale * lf
        return seq_sum(w * d * d)

    iscale = fnmax / mx
    lf0 = (nearest_int(iscale * x) & 0xFF).astype(F32)
    best = wsq(F32(1) / iscale, lf0)
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (F32(0.1) * F32(step) + fnmax) / mx
        lf = np.minimum(nearest_int(iscale_is * x), nmax).astype(F32)
        mse = wsq(F32(1) / iscale_is, lf)
        take = mse < best
        best = select(take, mse, best)
        iscale = select(take, iscale_is, iscale)
    li = np.minimum(nearest_int(iscale * x), nmax)
    lf = li.astype(F32)
    sumlx, suml2 = seq_sum(w * x * lf), seq_sum(w * lf * lf)
    L = (li & 0xFF).astype(np.int32)
    for _ in range(5):
        for i in range(n):
            Li = L[i].astype(F32)
            slx = sumlx - w[i] * x[i] * Li
            sl2 = suml2 - w[i] * Li * Li
            new = np.minimum(nearest_int(x[i] * sl2 / slx), nmax)
            nf = new.astype(F32)
            slx2, sl22 = slx + w[i] * x[i] * nf, sl2 + w[i] * nf * nf
            take = (slx > 0) & (sl2 > 0) & (new != L[i]) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[i] = select(take, new & 0xFF, L[i])
            sumlx, suml2 = select(take, slx2, sumlx), select(take, sl22, suml2)
    scale = select(suml2 > 0, sumlx / suml2, F32(0))
    return select(zero, 0, L).astype(np.uint8), select(zero, F32(0), scale)


def _sigma_weights(x: np.ndarray, qw: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """ggml's importance weights qw * sqrt(sigma2 + x^2)."""
    return qw * np.sqrt(sigma2 + x * x)


def _block_sumsq(blocks: np.ndarray) -> np.ndarray:
    """Each row's sum of squares in element order, float32."""
    t = np.ascontiguousarray(blocks.T)
    return seq_sum(t * t)


def _columns_of(per_block: np.ndarray, groups: int) -> np.ndarray:
    """A value per block -> one per group column of _by_position's layout (groups per block)."""
    return np.repeat(per_block, groups)


# ------------------------------------------------------------------ Q2_K .. Q6_K

def quantize_q2_K_w(blocks: np.ndarray, qw: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        x, wq = _by_position(blocks, 16), _by_position(qw, 16)
        sigma2 = _columns_of(_block_sumsq(blocks) / F32(QK_K), 16)
        w = _sigma_weights(x, wq, sigma2)
        sw = seq_sum(w).reshape(nb, 16).T
        L, scales, mins = make_qkx2_quants(x, w, 3, -0.9, 0.05, 36, False)
        Ls, dm = make_qp_quants(np.ascontiguousarray(scales.reshape(nb, 16).T), 15, sw)
        Lm, mm = make_qp_quants(np.ascontiguousarray(mins.reshape(nb, 16).T), 15, sw)
        sc = (Ls.T | (Lm.T << 4)).astype(np.uint8)
        return _q2_K_store(x, L, sc, fp16_bits(dm), fp16_bits(mm))


def quantize_q3_K_w(blocks: np.ndarray, qw: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        x, wq = _by_position(blocks, 16), _by_position(qw, 16)
        sigma2 = _columns_of(F32(2) * _block_sumsq(blocks) / F32(QK_K), 16)
        w = _sigma_weights(x, wq, sigma2)
        sw = seq_sum(w).reshape(nb, 16).T
        L, scales = make_qx_quants_rmse1(x, 4, w)
        Ls, d_block = make_qx_quants_rmse1(np.ascontiguousarray(scales.reshape(nb, 16).T), 32, np.ascontiguousarray(sw))
        return _q3_K_store(x, L, Ls.T.astype(np.int64), fp16_bits(d_block))


def _k4_scales_w(blocks: np.ndarray, qw: np.ndarray, nmax: int, clamp63: bool) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K with weights: 8 groups of 32 by make_qkx3_quants, 6-bit scales and mins by make_qp_quants
    weighted by each group's total weight, requantized against the scales as the block stores them."""
    nb = len(blocks)
    x, wq = _by_position(blocks, 32), _by_position(qw, 32)
    sigma2 = _columns_of(F32(2) * _block_sumsq(blocks) / F32(QK_K), 8)
    w = _sigma_weights(x, wq, sigma2)
    sw = np.ascontiguousarray(seq_sum(w).reshape(nb, 8).T)
    L, scales, mins = make_qkx2_quants(x, w, nmax, -0.9, 0.05, 36, False)
    Ls, d_block = make_qp_quants(np.ascontiguousarray(scales.reshape(nb, 8).T), 63, sw)
    Lm, m_block = make_qp_quants(np.ascontiguousarray(mins.reshape(nb, 8).T), 63, sw)
    ls, lm = Ls.T.copy(), Lm.T.copy()
    if clamp63:
        ls, lm = np.minimum(ls, 63), np.minimum(lm, 63)
    return _k4_head(x, L, ls, lm, fp16_bits(d_block), fp16_bits(m_block), nmax)


def quantize_q4_K_w(blocks: np.ndarray, qw: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        head, L = _k4_scales_w(blocks, qw, 15, False)
    q = L.reshape(nb, 4, 2, 32).astype(np.uint8)
    return np.concatenate([head, (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)], axis=1)


def quantize_q5_K_w(blocks: np.ndarray, qw: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        head, L = _k4_scales_w(blocks, qw, 31, True)
    q = L.reshape(nb, 4, 2, 32).astype(np.uint8)
    ql = (q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)
    hbits = (q >> 4).reshape(nb, 8, 32)
    qh = np.bitwise_or.reduce(hbits << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    return np.concatenate([head, qh, ql.reshape(nb, 128)], axis=1)


def quantize_q6_K_w(blocks: np.ndarray, qw: np.ndarray) -> np.ndarray:
    return quantize_q6_K(blocks, qw)


# ------------------------------------------------------------------ Q4_0, Q5_0, Q4_1, Q5_1 (whole rows)

def _legacy_weights(rows: np.ndarray, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of 32 in position-first layout and their weights, sigma2 being each row's mean square."""
    nrows, n = rows.shape
    sigma2 = _block_sumsq(rows) / F32(n)
    x = _by_position(rows.reshape(-1, 32), 32)
    wq = _by_position(np.broadcast_to(qw, rows.shape).reshape(-1, 32), 32)
    return x, _sigma_weights(x, wq, np.repeat(sigma2, n // 32))


def _nibbles_and_high(L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quants (nb, 32) 0..31 -> 16 bytes of low nibbles (element j low, j + 16 high) and the uint32 of high bits."""
    q = L.astype(np.uint32)
    qs = ((q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)).astype(np.uint8)
    qh = np.bitwise_or.reduce(((q >> 4) & 1) << np.arange(32, dtype=np.uint32), axis=1).astype(np.uint32)
    return qs, qh.astype("<u4").view(np.uint8).reshape(-1, 4)


def quantize_q4q5_0_rows_w(rows: np.ndarray, qw: np.ndarray, nbits: int) -> np.ndarray:
    with _errstate():
        x, w = _legacy_weights(rows, qw)
        L, d = make_qx_quants_rmse1(x, 8 if nbits == 4 else 16, w)
    L = L.T
    qs, qh = _nibbles_and_high(L)
    head = fp16_bits(d).view(np.uint8).reshape(-1, 2)
    blocks = np.concatenate([head, qs] if nbits == 4 else [head, qh, qs], axis=1)
    return blocks.reshape(len(rows), -1)


def quantize_q4q5_1_rows_w(rows: np.ndarray, qw: np.ndarray, nbits: int) -> np.ndarray:
    with _errstate():
        x, w = _legacy_weights(rows, qw)
        L, d, the_min = make_qkx2_quants(x, w, 15 if nbits == 4 else 31, -0.9, 0.05, 36, False)
    L = L.T
    qs, qh = _nibbles_and_high(L)
    head = np.concatenate([fp16_bits(d).view(np.uint8).reshape(-1, 2),
                           fp16_bits(-the_min).view(np.uint8).reshape(-1, 2)], axis=1)
    blocks = np.concatenate([head, qs] if nbits == 4 else [head, qh, qs], axis=1)
    return blocks.reshape(len(rows), -1)


# ------------------------------------------------------------------ IQ4_NL (chunk path), IQ4_XS

def quantize_iq4_nl_chunk(blocks: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """ggml's quantize_iq4_nl: the search with 15 candidate scales (ntry 7), weights qw * sqrt(sigma2 + x^2)
    (sigma2 = 2/32 of the block's sum of squares; x^2 without qw), indices found again against the scale
    before fp16 rounding (an all-zero block: the index nearest 0 everywhere)."""
    nb = len(blocks)
    with _errstate():
        x = np.ascontiguousarray(blocks.T)
        w = None
        if qw is not None:
            sigma2 = _block_sumsq(blocks) * (F32(2) / F32(32))
            w = _sigma_weights(x, np.ascontiguousarray(qw.T), sigma2)
        _, d, _ = _scale_search(x, 7, w)
        id_ = select(d != 0, F32(1) / d, F32(0))
        L = _TABLE.best_index(id_ * x)[0].T
    return np.concatenate([fp16_bits(d).view(np.uint8).reshape(nb, 2), _pack_nibbles(L)], axis=1)


def quantize_iq4_xs_w(blocks: np.ndarray, qw: np.ndarray) -> np.ndarray:
    from .iquants import quantize_iq4_xs
    with _errstate():
        sigma2 = np.repeat(_block_sumsq(blocks) * (F32(2) / F32(QK_K)), 8)
        x = np.ascontiguousarray(blocks.reshape(-1, 32).T)
        w = _sigma_weights(x, np.ascontiguousarray(qw.reshape(-1, 32).T), sigma2)
    return quantize_iq4_xs(blocks, w)
