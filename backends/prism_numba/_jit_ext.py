"""Compiled kernels for RoPE, fused attention, expert routing, row scatter and the
convolution / pooling / resize family (imports numba; see :mod:`._jit`).

Same conventions as :mod:`._jit`: strided 4-dim views in NumPy order, F16/BF16 as
uint16 bits read through a lookup table and stored with round-to-nearest-even,
values in float64, rounded once to the result type.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._fdot import dot1
from ._jit import _OPTS, ld, row_index, st
from ._jit_fast import cv32

FLT_MAX = float(np.finfo(np.float32).max)


# ------------------------------------------------------------------ rope
@njit(parallel=True, **_OPTS)
def rope(x, lx, o, kind, pos, which, inv_freq, ff, mix, first, second, freq_scale, mscale, sign):
    """o := x with pairs (first[k], second[k]) of every row rotated by theta[token, k]:
    theta_base = pos[which[k], token] * inv_freq[k] / ff[k]; theta = freq_scale * theta_base,
    mixed with theta_base by mix[k] (YaRN); cos, sin times mscale; sign -1 rotates backwards.
    x, o: (ne3, n_tok, n_head, ne0); pos: (streams, n_tok) float64."""
    n3, nt, nh, n0 = o.shape
    npairs = first.shape[0]
    cs = np.empty((nt, npairs), np.float64)
    sn = np.empty((nt, npairs), np.float64)
    for t in prange(nt):
        for k in range(npairs):
            tb = pos[which[k], t] * inv_freq[k] / ff[k]
            th = freq_scale * tb
            th = th * (1.0 - mix[k]) + tb * mix[k]
            cs[t, k] = np.cos(th) * mscale
            sn[t, k] = sign * (np.sin(th) * mscale)
    for r in prange(n3 * nt * nh):
        i3, i2, i1 = row_index(r, nh, nt)
        # dims outside the rotated pairs are copied (a no-op in place)
        for i0 in range(n0):
            st(o, kind, i3, i2, i1, i0, ld(x, lx, i3, i2, i1, i0))
        for k in range(npairs):
            a0 = ld(x, lx, i3, i2, i1, first[k])
            a1 = ld(x, lx, i3, i2, i1, second[k])
            c = cs[i2, k]
            s = sn[i2, k]
            st(o, kind, i3, i2, i1, first[k], a0 * c - a1 * s)
            st(o, kind, i3, i2, i1, second[k], a0 * s + a1 * c)


# ------------------------------------------------------------------ attention
@njit(inline="always", **_OPTS)
def _to_f32(src, lut, out):
    """out := the row src as float32 (F16/BF16 bits through lut); out is a row view (see flash_attn)."""
    for d in range(out.shape[0]):
        out[d] = cv32(src[d], lut)


@njit(parallel=True, **_OPTS)
def flash_attn(q, k, lk, v, lv, mask, lm, sinks, o, slopes, scale, softcap, has_mask, has_sinks):
    """o[b, iq, h, :] = softmax_kv(s) @ v with s = scale q.k (softcapped) + slope * mask, one
    query row at a time with an online softmax (float64). q: (B, H, n_q, D); k: (B, Hk, n_kv, D);
    v: (B, Hv, n_kv, Dv); mask: (m3, m2, >= n_q, n_kv); o: (B, n_q, H, Dv).

    Every K and V row is converted to float32 once, before the rows (a K/V head serves all its query
    heads, a key every query row; a key the mask hides from every row is not converted), and q.k is a
    float32 dot product in _fdot's fixed order: the per-element table lookups and float64 products of
    the query loop took 28% of a decode step after 512 tokens (Gemma 3 270M). A key the mask hides
    (-inf; ALiBi's slopes are positive) is skipped before its product, as ggml's CPU kernel does. Each
    row's value depends on its own query only (batch invariance)."""
    nb, nh, nq, nd = q.shape
    hk = k.shape[1]
    hv = v.shape[1]
    nkv = k.shape[2]
    ndv = v.shape[3]
    gk = nh // hk
    gv = nh // hv
    m3, m2 = mask.shape[0], mask.shape[1]
    # the keys some query row sees: a model's cache view holds cells the mask hides from every row (a
    # decode step's unused cells), whose conversion would cost more than the step's products
    live = np.ones(nkv, np.bool_)
    if has_mask:
        for j in prange(nkv):
            seen = False
            for r in range(m3 * m2 * nq):  # last rows first: a causal mask's later rows see the most keys
                i3, i2, iq = row_index(m3 * m2 * nq - 1 - r, nq, m2)
                if ld(mask, lm, i3, i2, iq, j) != -np.inf:
                    seen = True
                    break
            live[j] = seen
    kf = np.empty(nb * hk * nkv * nd, np.float32)
    vf = np.empty(nb * hv * nkv * ndv, np.float32)
    nkr = nb * hk * nkv
    for r in prange(nkr + nb * hv * nkv):  # K's rows, then V's
        if r < nkr:
            b, h, j = row_index(r, nkv, hk)
            if live[j]:
                _to_f32(k[b, h, j], lk, kf[r * nd:(r + 1) * nd])
        else:
            b, h, j = row_index(r - nkr, nkv, hv)
            if live[j]:
                _to_f32(v[b, h, j], lv, vf[(r - nkr) * ndv:(r - nkr + 1) * ndv])
    for r in prange(nb * nh * nq):
        b, h, iq = row_index(r, nq, nh)
        k0 = (b * hk + h // gk) * nkv
        v0 = (b * hv + h // gv) * nkv
        slope = slopes[h]
        qrow = np.empty(nd, np.float32)
        for d in range(nd):
            qrow[d] = q[b, h, iq, d]
        acc = np.zeros(ndv, np.float64)
        mx = -np.inf
        den = 0.0
        for j in range(nkv):
            mv = ld(mask, lm, b % m3, h % m2, iq, j) if has_mask else 0.0
            if mv == -np.inf:  # the test the liveness above made
                continue
            mv *= slope
            s = np.float64(dot1(qrow, 0, 0, kf, (k0 + j) * nd, 0, nd, nd))
            s = np.float64(np.float32(s * scale))  # ggml scales the score in float32
            if softcap != 0.0:
                s = softcap * np.tanh(s / softcap)
            s += mv
            if s == -np.inf:
                continue
            if s > mx:
                f = np.exp(mx - s) if mx != -np.inf else 0.0
                den *= f
                for d in range(ndv):
                    acc[d] *= f
                mx = s
            p = np.exp(s - mx)
            den += p
            vrow = vf[(v0 + j) * ndv:(v0 + j + 1) * ndv]  # a row view: indices from range(), so LLVM vectorises
            for d in range(ndv):
                acc[d] += p * vrow[d]
        if has_sinks:
            sk = np.float64(sinks[0, 0, 0, h])
            if sk > mx:
                f = np.exp(mx - sk) if mx != -np.inf else 0.0
                den *= f
                for d in range(ndv):
                    acc[d] *= f
                mx = sk
            den += np.exp(sk - mx)
        for d in range(ndv):
            o[b, iq, h, d] = acc[d] / den if den > 0 else 0.0


@njit(parallel=True, **_OPTS)
def mul_mat_id(w, lw, b, lb, ids, o):
    """o[0, t, e, m] = sum_k w[0, ids[0, 0, t, e], m, k] * b[0, t, e % n_b, k] (float64)."""
    nt, nu, nm = o.shape[1], o.shape[2], o.shape[3]
    nbb = b.shape[2]
    nk = w.shape[3]
    for r in prange(nt * nu):
        e = r % nu
        t = r // nu
        ex = ids[0, 0, t, e]
        be = e % nbb
        brow = np.empty(nk, np.float64)
        for kk in range(nk):
            brow[kk] = ld(b, lb, 0, t, be, kk)
        for m in range(nm):
            acc = 0.0
            for kk in range(nk):
                acc += ld(w, lw, 0, ex, m, kk) * brow[kk]
            o[0, t, e, m] = acc


@njit(parallel=True, **_OPTS)
def set_rows(b, lb, c, o, kind):
    """o[k, j, c[0, k % C2, j % C1, i], :] = b[k, j, i, :] (rows in order: the last duplicate wins)."""
    n3, n2 = o.shape[0], o.shape[1]
    nm, n0 = b.shape[2], b.shape[3]
    c2, c1 = c.shape[1], c.shape[2]
    for r in prange(n3 * n2):
        j = r % n2
        kk = r // n2
        for i in range(nm):
            row = c[0, kk % c2, j % c1, i]
            for i0 in range(n0):
                st(o, kind, kk, j, row, i0, ld(b, lb, kk, j, i, i0))


# ------------------------------------------------------------------ convolution family
@njit(parallel=True, **_OPTS)
def im2col(x, lx, o, kind, kh_n, kw_n, s0, s1, p0, p1, d0, d1):
    """o[n, oh, ow, (ic*KH + kh)*KW + kw] = x[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0] (0 outside)."""
    nb, oh_n, ow_n, ncol = o.shape
    ic_n, ih, iw = x.shape[1], x.shape[2], x.shape[3]
    for r in prange(nb * oh_n * ow_n):
        n, oh, ow = row_index(r, ow_n, oh_n)
        for ic in range(ic_n):
            for kh in range(kh_n):
                y = oh * s1 + kh * d1 - p1
                for kw in range(kw_n):
                    xx = ow * s0 + kw * d0 - p0
                    col = (ic * kh_n + kh) * kw_n + kw
                    if 0 <= y < ih and 0 <= xx < iw:
                        st(o, kind, n, oh, ow, col, ld(x, lx, n, ic, y, xx))
                    else:
                        st(o, kind, n, oh, ow, col, 0.0)


@njit(inline="always", **_OPTS)
def _strided_pos(t, s, n):
    """t // s when t is a non-negative multiple of the stride s and t // s < n, else -1: the window position
    whose tap lands t steps into the input (the transposed direction of a strided window)."""
    if t < 0 or t % s != 0:
        return -1
    q = t // s
    return q if q < n else -1


@njit(parallel=True, **_OPTS)
def im2col_back(g, lg, o, kh_n, kw_n, s0, s1, p0, p1, d0, d1):
    """o[n, ic, y, x] = sum over the taps (kh, kw) that read (y, x) of g[n, oh, ow, col]."""
    nb, ic_n, ih, iw = o.shape
    oh_n, ow_n = g.shape[1], g.shape[2]
    for r in prange(nb * ic_n * ih):
        n, ic, y = row_index(r, ih, ic_n)
        for xx in range(iw):
            acc = 0.0
            for kh in range(kh_n):
                oh = _strided_pos(y + p1 - kh * d1, s1, oh_n)
                if oh < 0:
                    continue
                for kw in range(kw_n):
                    ow = _strided_pos(xx + p0 - kw * d0, s0, ow_n)
                    if ow < 0:
                        continue
                    acc += ld(g, lg, n, oh, ow, (ic * kh_n + kh) * kw_n + kw)
            o[n, ic, y, xx] = acc


@njit(parallel=True, **_OPTS)
def conv_2d(a, la, x, lx, o, kind, s0, s1, p0, p1, d0, d1):
    """o[n, oc, oh, ow] = sum_{ic, kh, kw} a[oc, ic, kh, kw] x[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0]."""
    nb, oc_n, oh_n, ow_n = o.shape
    ic_n, kh_n, kw_n = a.shape[1], a.shape[2], a.shape[3]
    ih, iw = x.shape[2], x.shape[3]
    for r in prange(nb * oc_n * oh_n):
        n, oc, oh = row_index(r, oh_n, oc_n)
        acc = np.zeros(ow_n, np.float64)
        for ic in range(ic_n):
            for kh in range(kh_n):
                y = oh * s1 + kh * d1 - p1
                if y < 0 or y >= ih:
                    continue
                for kw in range(kw_n):
                    wv = ld(a, la, oc, ic, kh, kw)
                    for ow in range(ow_n):
                        xx = ow * s0 + kw * d0 - p0
                        if 0 <= xx < iw:
                            acc[ow] += wv * ld(x, lx, n, ic, y, xx)
        for ow in range(ow_n):
            st(o, kind, n, oc, oh, ow, acc[ow])


@njit(parallel=True, **_OPTS)
def conv_transpose_1d(a, la, x, lx, o, s0):
    """o[0, 0, oc, j] = sum_{t, l: l*s0 + t = j} sum_ic a[0, ic, oc, t] x[0, 0, ic, l]."""
    ic_n, oc_n, k_n = a.shape[1], a.shape[2], a.shape[3]
    nl = x.shape[3]
    nj = o.shape[3]
    for oc in prange(oc_n):
        for j in range(nj):
            acc = 0.0
            for t in range(k_n):
                ll = _strided_pos(j - t, s0, nl)
                if ll < 0:
                    continue
                for ic in range(ic_n):
                    acc += ld(a, la, 0, ic, oc, t) * ld(x, lx, 0, 0, ic, ll)
            o[0, 0, oc, j] = acc


@njit(parallel=True, **_OPTS)
def pool(x, lx, o, is_max, is_1d, k0, k1, s0, s1, p0, p1):
    """POOL_2D over NumPy axes 2, 3 (is_1d: POOL_1D along axis 3, k1 = 1). MAX: the largest tap inside
    x (POOL_2D: -FLT_MAX if none; POOL_1D: at least -FLT_MAX); AVG: the taps' sum / (k0*k1) (POOL_2D)
    or / the number of taps inside x (POOL_1D)."""
    n3, n2, oh_n, ow_n = o.shape
    ih, iw = x.shape[2], x.shape[3]
    for r in prange(n3 * n2 * oh_n):
        i3, i2, oh = row_index(r, oh_n, n2)
        for ow in range(ow_n):
            res = -FLT_MAX
            total = 0.0
            cnt = 0
            for ky in range(k1):
                y = oh if is_1d else oh * s1 + ky - p1
                if y < 0 or y >= ih:
                    continue
                for kx in range(k0):
                    xx = ow * s0 + kx - p0
                    if xx < 0 or xx >= iw:
                        continue
                    v = ld(x, lx, i3, i2, y, xx)
                    if is_max:
                        if not v < res:  # ggml's std::max(v, res): a NaN tap replaces res, the next the NaN
                            res = v
                    else:
                        total += v
                        cnt += 1
            if is_max:
                o[i3, i2, oh, ow] = res
            elif is_1d:
                o[i3, i2, oh, ow] = total / cnt
            else:
                o[i3, i2, oh, ow] = total / (k0 * k1)


@njit(parallel=True, **_OPTS)
def pool_2d_back(g, lg, x, lx, o, is_max, k0, k1, s0, s1, p0, p1):
    """The adjoint of POOL_2D, one (i3, i2) plane per task: MAX sends each grad to the first tap
    strictly above -FLT_MAX and all earlier taps; AVG spreads grad / (k0*k1) over the taps inside x."""
    n3, n2, ih, iw = o.shape
    oh_n, ow_n = g.shape[2], g.shape[3]
    for r in prange(n3 * n2):
        i2 = r % n2
        i3 = r // n2
        acc = np.zeros((ih, iw), np.float64)
        for oh in range(oh_n):
            for ow in range(ow_n):
                gv = ld(g, lg, i3, i2, oh, ow)
                if is_max:
                    best = -FLT_MAX
                    by = -1
                    bx = -1
                    for ky in range(k1):
                        y = oh * s1 + ky - p1
                        if y < 0 or y >= ih:
                            continue
                        for kx in range(k0):
                            xx = ow * s0 + kx - p0
                            if xx < 0 or xx >= iw:
                                continue
                            v = ld(x, lx, i3, i2, y, xx)
                            if v > best:
                                best = v
                                by = y
                                bx = xx
                    if by >= 0:
                        acc[by, bx] += gv
                else:
                    share = gv / (k0 * k1)
                    for ky in range(k1):
                        y = oh * s1 + ky - p1
                        if y < 0 or y >= ih:
                            continue
                        for kx in range(k0):
                            xx = ow * s0 + kx - p0
                            if 0 <= xx < iw:
                                acc[y, xx] += share
        for y in range(ih):
            for xx in range(iw):
                o[i3, i2, y, xx] = acc[y, xx]


@njit(parallel=True, **_OPTS)
def upscale(x, o, i3s, i2s, y0, y1, dy, x0, x1, dx, bilinear):
    """o[i3, i2, i1, i0] = x[i3s, i2s, y0, x0] (nearest) or the bilinear mix of the four
    neighbours (y0, y1, x0, x1) with weights dy, dx, interpolating dim 1 first."""
    n3, n2, n1, n0 = o.shape
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = row_index(r, n1, n2)
        j3 = i3s[i3]
        j2 = i2s[i2]
        ya = y0[i1]
        if not bilinear:
            for i0 in range(n0):
                o[i3, i2, i1, i0] = x[j3, j2, ya, x0[i0]]
        else:
            yb = y1[i1]
            wy = dy[i1]
            for i0 in range(n0):
                xa = x0[i0]
                xb = x1[i0]
                ta = np.float64(x[j3, j2, ya, xa]) * (1 - wy) + np.float64(x[j3, j2, yb, xa]) * wy
                tb = np.float64(x[j3, j2, ya, xb]) * (1 - wy) + np.float64(x[j3, j2, yb, xb]) * wy
                o[i3, i2, i1, i0] = ta * (1 - dx[i0]) + tb * dx[i0]


KERNELS = {f.py_func.__name__: f for f in (
    rope, flash_attn, mul_mat_id, set_rows, im2col, im2col_back, conv_2d, conv_transpose_1d, pool,
    pool_2d_back, upscale)}
