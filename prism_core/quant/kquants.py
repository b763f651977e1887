"""K-quants (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.

Each ``quantize_*`` takes blocks ``(nb, 256)`` float32 and returns ``(nb, type_size)``
uint8, byte for byte what ggml's ``quantize_row_*_ref`` writes (no importance matrix).
Inside, the element index of a sub-block sits on axis 0 (see ``numerics``), and the
searches over candidate scales run for every sub-block at once.
"""

from __future__ import annotations

import numpy as np

from .numerics import (
    F32,
    GROUP_MAX_EPS,
    fp16_bits,
    fp16_value,
    nearest_f32,
    nearest_int,
    pack_2bit_128,
    positive_max,
    select,
    seq_sum,
    signed_absmax,
)

QK_K = 256


def _by_position(blocks: np.ndarray, n: int) -> np.ndarray:
    """(nb, 256) → (n, nb·256/n): sub-blocks of n elements, element index first."""
    return np.ascontiguousarray(blocks.reshape(-1, n).T)


def _from_position(a: np.ndarray, nb: int) -> np.ndarray:
    return a.T.reshape(nb, QK_K)


def _errstate():
    return np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore")


# ------------------------------------------------------------------ shared searches

def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
                     use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's ``make_qkx2_quants`` over columns: x, w ``(n, m)``; returns (L (n, m) int32,
    scale (m,), the_min (m,)) for x ≈ scale·L − the_min, searching nstep+1 scales.
    Candidates' quants are kept in float32; the winner's are rebuilt at the end from the
    (iscale, min) that produced them."""
    mn, mx = x[0].copy(), x[0].copy()  # ggml's scans: the first of equal extremes (a zero keeps its sign)
    sum_w = w[0].copy()
    sum_x = sum_w * x[0]
    for i in range(1, len(x)):
        mn = select(x[i] < mn, x[i], mn)
        mx = select(x[i] > mx, x[i], mx)
        sum_w += w[i]
        sum_x += w[i] * x[i]
    mn = select(mn > 0, F32(0), mn)
    flat = mx == mn
    fnmax = F32(nmax)

    def quants(iscale, m):
        return np.clip(nearest_f32(iscale * (x - m)), F32(0), fnmax)

    def cost(scale, lf, m):
        d = scale * lf
        d += m
        d -= x
        if use_mad:
            np.abs(d, out=d)
        else:
            d *= d
        d *= w
        return seq_sum(d)

    iscale = fnmax / (mx - mn)
    scale = F32(1) / iscale
    best = cost(scale, quants(iscale, mn), mn)
    win_iscale, win_min = iscale, mn
    for step in range(nstep + 1):
        # ggml updates min whenever a candidate wins, and later candidates start from it
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + fnmax) / (mx - mn)
        lf = quants(iscale, mn)
        wl = w * lf
        sum_l = seq_sum(wl)
        wl *= lf
        sum_l2 = seq_sum(wl)
        np.multiply(w, lf, out=wl)
        wl *= x
        sum_xl = seq_sum(wl)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        clamp = this_min > 0
        this_min = select(clamp, F32(0), this_min)
        this_scale = select(clamp, sum_xl / sum_l2, this_scale)
        cur = cost(this_scale, lf, this_min)
        take = (D > 0) & (cur < best)
        win_iscale, win_min = select(take, iscale, win_iscale), select(take, mn, win_min)
        best = select(take, cur, best)
        scale = select(take, this_scale, scale)
        mn = select(take, this_min, mn)
    L = np.clip(nearest_int(win_iscale * (x - win_min)), 0, nmax)
    L = select(flat, 0, L)
    scale = select(flat, F32(0), scale)
    return L, scale, -mn


def make_qx_quants_rmse1(x: np.ndarray, nmax: int, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qx_quants`` with rmse_type 1 over columns ``(n, m)``, weights w (None: ggml's
    default x²): returns (L in 0..2·nmax−1 (n, m), scale (m,)), 18 scales tried."""
    amax, vmax = signed_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x if w is None else w
    wx = w * x
    fnmax = F32(nmax)

    def trial(iscale):
        lf = np.clip(nearest_f32(iscale * x), -fnmax, fnmax - 1)
        slx = seq_sum(wx * lf)
        wl = w * lf
        wl *= lf  # (w·l)·l, ggml's order
        return slx, seq_sum(wl)

    win = -fnmax / vmax
    sumlx, suml2 = trial(win)
    scale = select(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + F32(0.1) * F32(step)) / vmax
        slx, sl2 = trial(iscale)
        take = (sl2 > 0) & (slx * slx > best * sl2)
        win = select(take, iscale, win)
        scale = select(take, slx / sl2, scale)
        best = select(take, scale * slx, best)
    lv = np.clip(nearest_int(win * x), -nmax, nmax - 1)
    return select(zero, 0, lv + nmax), select(zero, F32(0), scale)


def make_q3_quants_rmse(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_q3_quants`` with do_rmse: start from the plain rounding, then up to
    five passes that move one quant at a time when that lowers the weighted error.
    A pass that changes nothing leaves the state as it was, so blocks that stopped early
    in ggml are unaffected by the passes run here for the others."""
    amax, vmax = signed_absmax(x)
    zero = amax < GROUP_MAX_EPS
    L = np.clip(nearest_int((-F32(nmax) / vmax) * x), -nmax, nmax - 1)
    w = x * x
    wx = w * x
    sumlx = seq_sum(wx * L.astype(F32))
    suml2 = seq_sum(w * L.astype(F32) * L.astype(F32))
    for _ in range(5):
        for i in range(len(x)):
            li = L[i].astype(F32)
            slx = sumlx - wx[i] * li
            sl2 = suml2 - w[i] * li * li
            new_l = np.clip(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1)
            nf = new_l.astype(F32)
            slx2 = slx + wx[i] * nf
            sl22 = sl2 + w[i] * nf * nf
            take = (slx > 0) & (new_l != L[i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[i] = select(take, new_l, L[i])
            sumlx = select(take, slx2, sumlx)
            suml2 = select(take, sl22, suml2)
    scale = select(suml2 > 0, sumlx / suml2, F32(0))
    return select(zero, 0, L + nmax), select(zero, F32(0), scale)


def _requant(x: np.ndarray, L: np.ndarray, d: np.ndarray, dm: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Second pass of every K-quantizer: quants from the stored (fp16-rounded) scales,
    ``nearest_int((x + dm)/d)`` clamped; sub-blocks whose scale is 0 keep their first quants."""
    q = np.clip(nearest_int((x + dm) / d), lo, hi)
    return select(d != 0, q, L)


# ------------------------------------------------------------------ Q2_K

def quantize_q2_K(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        x = _by_position(blocks, 16)
        L, scales, mins = make_qkx2_quants(x, np.abs(x), 3, -0.5, 0.1, 15, True)
        scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
        max_scale, max_min = positive_max(scales, 1), positive_max(mins, 1)
        q4 = F32(15)
        has_s, has_m = max_scale > 0, max_min > 0
        ls = select(has_s[:, None], nearest_int((q4 / max_scale)[:, None] * scales), 0)
        lm = select(has_m[:, None], nearest_int((q4 / max_min)[:, None] * mins), 0)
        sc = ((ls & 0xFF) | (lm << 4)) & 0xFF
        d = fp16_bits(select(has_s, max_scale / q4, F32(0)))
        dmin = fp16_bits(select(has_m, max_min / q4, F32(0)))
        return _q2_K_store(x, L, sc, d, dmin)


def _q2_K_store(x: np.ndarray, L: np.ndarray, sc: np.ndarray, d: np.ndarray, dmin: np.ndarray) -> np.ndarray:
    """Q2_K blocks once the 4-bit scale and min codes ``sc`` (nb, 16) and the F16 bits ``d``/``dmin`` are
    chosen (both Q2_K quantizers): each value (x and its levels L by position) requantized against its
    group's stored scale and min, then packed."""
    nb = len(sc)
    dl = (fp16_value(d)[:, None] * (sc & 0xF).astype(F32)).reshape(-1)
    ml = (fp16_value(dmin)[:, None] * (sc >> 4).astype(F32)).reshape(-1)
    L = _from_position(_requant(x, L, dl, ml, 0, 3), nb)
    out = np.empty((nb, 84), np.uint8)
    out[:, :16] = sc
    out[:, 16:80] = pack_2bit_128(L)
    out[:, 80:82] = d.view(np.uint8).reshape(nb, 2)
    out[:, 82:84] = dmin.view(np.uint8).reshape(nb, 2)
    return out


# ------------------------------------------------------------------ Q3_K

def quantize_q3_K(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        x = _by_position(blocks, 16)
        L, scales = make_q3_quants_rmse(x, 4)
        scales = scales.reshape(nb, 16)
        amax, max_scale = signed_absmax(scales.T)
        has = max_scale != 0
        iscale = F32(-32) / max_scale
        ls = ((nearest_int(iscale[:, None] * scales) + 128) & 0xFF) - 128  # ggml keeps it in an int8_t
        ls = select(has[:, None], np.clip(ls, -32, 31) + 32, 0)
        return _q3_K_store(x, L, ls, fp16_bits(select(has, F32(1) / iscale, F32(0))))


def _q3_K_store(x: np.ndarray, L: np.ndarray, ls: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The blocks once the 6-bit group scales ls ((nb, 16), 0..63 for -32..31) and d (fp16 bits) are chosen
    (both Q3_K quantizers): each value (x and its levels L by position) requantized against its group's
    scale d * (ls - 32), a group of scale 0 keeping its levels, then packed."""
    nb = len(ls)
    sc = np.zeros((nb, 12), np.uint8)
    sc[:, :8] = (ls[:, :8] & 0xF) | ((ls[:, 8:] & 0xF) << 4)
    hi = ls >> 4
    sc[:, 8:] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    dl = (fp16_value(d)[:, None] * (ls - 32).astype(F32)).reshape(-1)
    q = np.clip(nearest_int(x / dl), -4, 3) + 4
    L = _from_position(select(dl != 0, q, L), nb)
    out = np.empty((nb, 110), np.uint8)
    high = (L > 3).reshape(nb, 8, 32)
    out[:, :32] = np.bitwise_or.reduce(high.astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    out[:, 32:96] = pack_2bit_128(L & 3)
    out[:, 96:108] = sc
    out[:, 108:110] = d.view(np.uint8).reshape(nb, 2)
    return out


# ------------------------------------------------------------------ Q4_K, Q5_K

def _k4_scales(blocks: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The shared first half of Q4_K and Q5_K: 8 sub-blocks of 32 with a weighted
    scale/min search, 6-bit scales and mins packed as get_scale_min_k4 reads them."""
    nb = len(blocks)
    x = _by_position(blocks, 32)
    av = np.sqrt(seq_sum(x * x) / F32(32))
    L, scales, mins = make_qkx2_quants(x, av + np.abs(x), nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale, max_min = positive_max(scales, 1), positive_max(mins, 1)
    inv_s = select(max_scale > 0, F32(63) / max_scale, F32(0))
    inv_m = select(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(nearest_int(inv_s[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_m[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    return _k4_head(x, L, ls, lm, fp16_bits(max_scale / F32(63)), fp16_bits(max_min / F32(63)), nmax)


def _k4_head(x: np.ndarray, L: np.ndarray, ls: np.ndarray, lm: np.ndarray, d: np.ndarray, dmin: np.ndarray,
             nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K once the group scales ls and mins lm ((nb, 8) uint8) and d, dmin (fp16 bits) are chosen:
    the 16 head bytes (d, dmin, the 6-bit scales and mins packed as get_scale_min_k4 reads them) and the
    levels (x and L by position) requantized against the scales and mins as stored (a value above 63 keeps
    only what its bits there hold, as in ggml)."""
    nb = len(ls)
    sc = np.empty((nb, 12), np.uint8)
    sc[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    sc[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    sc[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    s_dec = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 0xF) | ((sc[:, 0:4] >> 6) << 4)], axis=1)
    m_dec = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], axis=1)
    dl = (fp16_value(d)[:, None] * s_dec.astype(F32)).reshape(-1)
    ml = (fp16_value(dmin)[:, None] * m_dec.astype(F32)).reshape(-1)
    L = _from_position(_requant(x, L, dl, ml, 0, nmax), nb)
    head = np.empty((nb, 16), np.uint8)
    head[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    head[:, 2:4] = dmin.view(np.uint8).reshape(nb, 2)
    head[:, 4:16] = sc
    return head, L


def quantize_q4_K(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        head, L = _k4_scales(blocks, 15, -1.0, 20)
    q = L.reshape(nb, 4, 2, 32).astype(np.uint8)
    return np.concatenate([head, (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)], axis=1)


def quantize_q5_K(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        head, L = _k4_scales(blocks, 31, -0.5, 15)
    q = L.reshape(nb, 4, 2, 32).astype(np.uint8)
    ql = (q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)
    hbits = (q >> 4).reshape(nb, 8, 32)  # bit 2k+j of qh[l] is the high bit of element 64k + 32j + l
    qh = np.bitwise_or.reduce(hbits << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    return np.concatenate([head, qh, ql.reshape(nb, 128)], axis=1)


# ------------------------------------------------------------------ Q6_K

def quantize_q6_K(blocks: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """The reference, or with importance weights qw (shaped like blocks) ggml's quantize_q6_K, which
    hands them to the group search as they are."""
    nb = len(blocks)
    with _errstate():
        x = _by_position(blocks, 16)
        L, scales = make_qx_quants_rmse1(x, 32, None if qw is None else _by_position(qw, 16))
        scales = scales.reshape(nb, 16)
        amax, max_scale = signed_absmax(scales.T)
        zero = amax < GROUP_MAX_EPS
        iscale = F32(-128) / max_scale
        d = fp16_bits(select(zero, F32(0), F32(1) / iscale))
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales))
        sc = select(zero[:, None], 0, sc).astype(np.int8)
        dl = (fp16_value(d)[:, None] * sc.astype(F32)).reshape(-1)
        q = np.clip(nearest_int(x / dl), -32, 31) + 32
        L = _from_position(select(dl != 0, q, L), nb)
        L = select(zero[:, None], 0, L)
    q = L.reshape(nb, 2, 4, 32).astype(np.uint8)
    ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
                         (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8),
                           d.view(np.uint8).reshape(nb, 2)], axis=1)


# ------------------------------------------------------------------ Q8_K

def quantize_q8_K(blocks: np.ndarray) -> np.ndarray:
    nb = len(blocks)
    with _errstate():
        amax, vmax = signed_absmax(blocks.T)
        zero = amax == 0
        iscale = F32(-127) / vmax
        q = np.minimum(127, nearest_int(iscale[:, None] * blocks))
        q = select(zero[:, None], 0, q).astype(np.int8)
        d = select(zero, F32(0), F32(1) / iscale).astype(F32)
    bsums = q.reshape(nb, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
    return np.concatenate([d.view(np.uint8).reshape(nb, 4), q.view(np.uint8), bsums.view(np.uint8)], axis=1)


def dequantize_q8_K(blocks: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(blocks[:, :4]).view(F32)
    q = blocks[:, 4:260].view(np.int8).astype(F32)
    return d * q
