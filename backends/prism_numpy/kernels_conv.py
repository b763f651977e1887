"""Reference kernels: conv ops (IM2COL, IM2COL_BACK, CONV_TRANSPOSE_1D, CONV_2D, POOL_1D,
POOL_2D, POOL_2D_BACK, UPSCALE).

Arrays are NumPy order (ne3, ne2, ne1, ne0); values are read logically (any layout) in
float64 and rounded once to the result type. Spatial loops run over kernel taps; each tap
is a strided gather of the input with out-of-range positions masked to zero.
"""

from __future__ import annotations

import numpy as np

from prism_core import Tensor
from prism_core.ops.semantics import upscale_tables
from prism_core.ops.table_conv import PoolOp, ScaleMode

from .kernels import kernel, store, val

FLT_MAX = float(np.finfo(np.float32).max)


def _axis(n_out: int, tap: int, s: int, p: int, d: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Input positions o*s + tap*d - p for o < n_out, clipped into range, and their validity."""
    pos = np.arange(n_out) * s + tap * d - p
    ok = (pos >= 0) & (pos < n_in)
    return np.clip(pos, 0, max(n_in - 1, 0)), ok


def _gather(x: np.ndarray, ys: np.ndarray, vy: np.ndarray, xs: np.ndarray, vx: np.ndarray) -> np.ndarray:
    """x[..., ys, xs] with the positions outside x set to 0 (x: (..., H, W))."""
    g = x[..., ys, :][..., xs]
    return np.where(vy[:, None] & vx[None, :], g, 0.0)


def _geometry(n: Tensor):
    """(x as (N, IC, IH, IW), KH, KW, OH, OW, s0, s1, p0, p1, d0, d1) of an IM2COL-like node."""
    p = n.params
    a = n.src[0] if n.opdef.key == "IM2COL" else n.src[1]
    if p["is_2D"]:
        kh, kw = a.ne[1], a.ne[0]
        return kh, kw, (p["s0"], p["s1"], p["p0"], p["p1"], p["d0"], p["d1"])
    return 1, a.ne[0], (p["s0"], 1, p["p0"], 0, p["d0"], 1)


@kernel("IM2COL")
def _im2col(n: Tensor) -> None:
    b = n.src[1]
    kh_n, kw_n, (s0, s1, p0, p1, d0, d1) = _geometry(n)
    x = val(b)  # 2D: (N, IC, IH, IW); 1D: (1, N, IC, L)
    if not n.params["is_2D"]:
        x = x[0][:, :, None, :]  # (N, IC, 1, L)
    nb, ic, ih, iw = x.shape
    ow, oh = n.ne[1], (n.ne[2] if n.params["is_2D"] else 1)
    out = np.zeros((nb, oh, ow, ic, kh_n, kw_n))
    for kh in range(kh_n):
        ys, vy = _axis(oh, kh, s1, p1, d1, ih)
        for kw in range(kw_n):
            xs, vx = _axis(ow, kw, s0, p0, d0, iw)
            out[:, :, :, :, kh, kw] = _gather(x, ys, vy, xs, vx).transpose(0, 2, 3, 1)
    store(n, out.reshape(tuple(reversed(n.ne))))


@kernel("IM2COL_BACK")
def _im2col_back(n: Tensor) -> None:
    kh_n, kw_n, (s0, s1, p0, p1, d0, d1) = _geometry(n)
    ne = n.params["ne"]
    is_2d = n.params["is_2D"]
    nb, ic, ih, iw = (ne[3], ne[2], ne[1], ne[0]) if is_2d else (ne[2], ne[1], 1, ne[0])
    g = val(n.src[0])  # (N, OH, OW, IC*KH*KW) in 2D; (1, N, OL, IC*K) in 1D
    if not is_2d:
        g = g[0][:, None]
    oh, ow = g.shape[1], g.shape[2]
    g = g.reshape(nb, oh, ow, ic, kh_n, kw_n)
    res = np.zeros((nb, ic, ih, iw))
    for kh in range(kh_n):
        ys, vy = _axis(oh, kh, s1, p1, d1, ih)
        for kw in range(kw_n):
            xs, vx = _axis(ow, kw, s0, p0, d0, iw)
            part = g[:, vy][:, :, vx][..., kh, kw].transpose(0, 3, 1, 2)  # (N, IC, oh', ow')
            # positions are distinct along each axis (stride >= 1), so += does not lose terms
            res[:, :, ys[vy][:, None], xs[vx][None, :]] += part
    store(n, res.reshape(tuple(reversed(n.ne))))


@kernel("CONV_2D")
def _conv_2d(n: Tensor) -> None:
    a, b, p = n.src[0], n.src[1], n.params
    k = val(a)  # (OC, IC, KH, KW)
    x = val(b)  # (N, IC, IH, IW)
    ow, oh = n.ne[0], n.ne[1]
    out = np.zeros((x.shape[0], k.shape[0], oh, ow))
    for kh in range(k.shape[2]):
        ys, vy = _axis(oh, kh, p["s1"], p["p1"], p["d1"], x.shape[2])
        for kw in range(k.shape[3]):
            xs, vx = _axis(ow, kw, p["s0"], p["p0"], p["d0"], x.shape[3])
            out += np.einsum("nchw,oc->nohw", _gather(x, ys, vy, xs, vx), k[:, :, kh, kw])
    store(n, out)


@kernel("CONV_TRANSPOSE_1D")
def _conv_transpose_1d(n: Tensor) -> None:
    k = val(n.src[0])[0]  # (IC, OC, K)
    x = val(n.src[1])[0, 0]  # (IC, L)
    s0 = n.params["s0"]
    out = np.zeros((k.shape[1], n.ne[0]))
    pos = np.arange(x.shape[1]) * s0
    for t in range(k.shape[2]):
        out[:, pos + t] += k[:, :, t].T @ x  # distinct positions for one tap
    store(n, out)


# ---------------------------------------------------------------- pooling
def _pool_taps(x: np.ndarray, n: Tensor, dims2: bool):
    """Yield (values, valid) for each tap of the window: values (..., OH, OW)."""
    p = n.params
    oh, ow = (n.ne[1], n.ne[0]) if dims2 else (1, n.ne[0])
    k1, s1, p1 = (p["k1"], p["s1"], p["p1"]) if dims2 else (1, 1, 0)
    for ky in range(k1):
        ys, vy = _axis(oh, ky, s1, p1, 1, x.shape[-2])
        for kx in range(p["k0"]):
            xs, vx = _axis(ow, kx, p["s0"], p["p0"], 1, x.shape[-1])
            yield x[..., ys, :][..., xs], vy[:, None] & vx[None, :]


def _max_taps(taps) -> np.ndarray:
    """ggml's running ``res = std::max(v, res)`` from -FLT_MAX (also an all-padding window's
    result), taps in row-major order: std::max(v, res) is ``v < res ? res : v``, so a NaN tap
    replaces res and the next tap replaces the NaN; an -inf tap leaves -FLT_MAX."""
    res = np.full(taps[0][0].shape, -FLT_MAX)
    for v, ok in taps:
        res = np.where(ok & ~(v < res), v, res)
    return res


@kernel("POOL_1D")
def _pool_1d(n: Tensor) -> None:
    x = val(n.src[0])[..., None, :]  # (ne3, ne2, ne1, 1, ne0)
    taps = list(_pool_taps(x, n, False))
    if n.params["op"] == PoolOp.MAX:
        res = _max_taps(taps)
    else:  # the mean of the taps inside the input (ggml HEAD)
        total = sum(np.where(ok, v, 0.0) for v, ok in taps)
        count = sum(ok.astype(np.float64) for _, ok in taps)
        res = total / count
    store(n, res[..., 0, :])


@kernel("POOL_2D")
def _pool_2d(n: Tensor) -> None:
    x = val(n.src[0])
    taps = list(_pool_taps(x, n, True))
    if n.params["op"] == PoolOp.MAX:
        res = _max_taps(taps)
    else:
        res = sum(np.where(ok, v, 0.0) for v, ok in taps) / (n.params["k0"] * n.params["k1"])
    store(n, res)


@kernel("POOL_2D_BACK")
def _pool_2d_back(n: Tensor) -> None:
    p = n.params
    g = val(n.src[0])  # (ne3, ne2, OH, OW)
    x = val(n.src[1])  # (ne3, ne2, H, W)
    h, w = x.shape[-2:]
    oh, ow = g.shape[-2:]
    lead = x.shape[:-2]
    res = np.zeros(lead + (h * w,))
    flat_res = res.reshape(-1, h * w)
    plane = np.arange(int(np.prod(lead)))[:, None, None]
    if p["op"] == PoolOp.MAX:
        best = np.full(lead + (oh, ow), -FLT_MAX)
        where = np.full(lead + (oh, ow), -1, np.int64)
        for ky in range(p["k1"]):
            ys, vy = _axis(oh, ky, p["s1"], p["p1"], 1, h)
            for kx in range(p["k0"]):
                xs, vx = _axis(ow, kx, p["s0"], p["p0"], 1, w)
                v = x[..., ys, :][..., xs]
                take = (vy[:, None] & vx[None, :]) & (v > best)  # strictly greater: the first maximum wins
                best = np.where(take, v, best)
                where = np.where(take, (ys[:, None] * w + xs[None, :]), where)
        where = where.reshape(-1, oh, ow)
        hit = where >= 0
        idx = np.broadcast_to(plane, where.shape)
        np.add.at(flat_res, (idx[hit], where[hit]), g.reshape(-1, oh, ow)[hit])
    else:
        share = g.reshape(-1, oh, ow) / (p["k0"] * p["k1"])
        for ky in range(p["k1"]):
            ys, vy = _axis(oh, ky, p["s1"], p["p1"], 1, h)
            for kx in range(p["k0"]):
                xs, vx = _axis(ow, kx, p["s0"], p["p0"], 1, w)
                ok = np.broadcast_to(vy[:, None] & vx[None, :], share.shape)
                pos = np.broadcast_to(ys[:, None] * w + xs[None, :], share.shape)
                idx = np.broadcast_to(plane, share.shape)
                np.add.at(flat_res, (idx[ok], pos[ok]), share[ok])
    store(n, res.reshape(x.shape))


# ---------------------------------------------------------------- upscale
@kernel("UPSCALE")
def _upscale(n: Tensor) -> None:
    a = n.src[0]
    bilinear = n.params["mode"] != ScaleMode.NEAREST
    t = upscale_tables(n.ne, a.ne, bilinear, bool(n.params["align_corners"]))
    x = val(a)[t.i3][:, t.i2]
    if not bilinear:
        store(n, x[:, :, t.y0][..., t.x0])
        return
    top = x[:, :, t.y0] * (1 - t.dy)[:, None] + x[:, :, t.y1] * t.dy[:, None]
    store(n, top[..., t.x0] * (1 - t.dx) + top[..., t.x1] * t.dx)
