"""Node-level wrappers for RoPE, fused attention, expert routing, row scatter and the
convolution / pooling / resize family (compiled kernels: :mod:`._jit_ext`).

Per-node tables that cost O(row length) (RoPE's per-pair frequencies, UPSCALE's source
indices) come from prism_core.ops.semantics, the same functions the reference uses; the
per-element work runs in the compiled kernels.
"""

from __future__ import annotations

import numpy as np

from prism_core import Tensor
from prism_core.errors import InvalidArgument
from prism_core.ops.semantics import alibi_slopes, checked_row_indices, mul_mat_b_rounding, rope_tables, upscale_tables
from prism_core.ops.table_conv import PoolOp, ScaleMode
from prism_core.types import F16, F32, I32, I64

from .kernels import FLOATS, INDICES, ONLY_F32, _jit, _run, arr, kernel, kind, lut, rounded_operand

F32_F16 = frozenset({F32, F16})


# ------------------------------------------------------------------ rope
@kernel((F32_F16, INDICES, ONLY_F32), F32_F16, "ROPE", "ROPE_BACK", reads_values=True)
def _rope(n: Tensor) -> None:
    a = n.src[0]
    pos = n.src[1].host().reshape(-1)
    ffs = n.src[2] if len(n.src) > 2 and n.src[2] is not None else None
    p = n.params
    t = rope_tables(p, pos, n.ne[2])
    ff = (np.ascontiguousarray(ffs.host().reshape(-1)[:t.n_pairs], np.float64) if ffs is not None
          else np.ones(t.n_pairs))
    sign = -1.0 if n.opdef.key == "ROPE_BACK" else 1.0
    _run("rope", arr(a), lut(a), arr(n), kind(n), np.ascontiguousarray(t.streams, np.float64),
         np.ascontiguousarray(t.which, np.int64), np.ascontiguousarray(t.inv_freq, np.float64), ff,
         np.ascontiguousarray(t.mix, np.float64), np.ascontiguousarray(t.first, np.int64),
         np.ascontiguousarray(t.second, np.int64), float(p["freq_scale"]), t.mscale, sign)


# ------------------------------------------------------------------ attention
@kernel((ONLY_F32, FLOATS, FLOATS, frozenset({F16}), ONLY_F32), ONLY_F32, "FLASH_ATTN_EXT")
def _flash_attn_ext(n: Tensor) -> None:
    j = _jit()
    q, k, v = n.src[:3]
    mask = n.src[3] if len(n.src) > 3 else None
    sinks = n.src[4] if len(n.src) > 4 else None
    p = n.params
    slopes = np.ascontiguousarray(alibi_slopes(q.ne[2], float(p["max_bias"])), np.float64)
    _run("flash_attn", arr(q), arr(k), lut(k), arr(v), lut(v),
         arr(mask) if mask is not None else j.DUMMY16, lut(mask) if mask is not None else j.F16_LUT,
         arr(sinks) if sinks is not None else j.DUMMY, arr(n), slopes, float(p["scale"]),
         float(p["logit_softcap"]), int(mask is not None), int(sinks is not None))


@kernel((FLOATS, FLOATS, INDICES), ONLY_F32, "MUL_MAT_ID", reads_values=True)
def _mul_mat_id(n: Tensor) -> None:
    w, b, ids = n.src[0], n.src[1], n.src[2]
    idh = ids.host()
    if idh.size and (idh.min() < 0 or idh.max() >= w.ne[2]):
        raise InvalidArgument(f"MUL_MAT_ID: expert id out of range [0, {w.ne[2]})")
    to = mul_mat_b_rounding(w.type, b.type)  # ggml's CPU: an F16/BF16 w's products take b in w's type
    if to is None:
        _run("mul_mat_id", arr(w), lut(w), arr(b), lut(b), idh, arr(n))
    else:
        _run("mul_mat_id", arr(w), lut(w), rounded_operand(b, to), _jit().NO_LUT, idh, arr(n))


@kernel((F32_F16, frozenset({I32, I64}), FLOATS), FLOATS, "SET_ROWS", reads_values=True)
def _set_rows(n: Tensor) -> None:
    b, c = n.src[0], n.src[1]
    rows = checked_row_indices("SET_ROWS", c, n.ne[1])
    _run("set_rows", arr(b), lut(b), rows, arr(n), kind(n))


# ------------------------------------------------------------------ convolution family
def _geometry(n: Tensor, a: Tensor) -> tuple[int, ...]:
    p = n.params
    if p["is_2D"]:
        return a.ne[1], a.ne[0], p["s0"], p["s1"], p["p0"], p["p1"], p["d0"], p["d1"]
    return 1, a.ne[0], p["s0"], 1, p["p0"], 0, p["d0"], 1


def _as_2d(x: np.ndarray, is_2d: bool) -> np.ndarray:
    """A 1D layout (1, N, C, L) seen as (N, C, 1, L)."""
    return x if is_2d else x[0][:, :, None, :]


@kernel((FLOATS, FLOATS), F32_F16, "IM2COL")
def _im2col(n: Tensor) -> None:
    b = n.src[1]
    is_2d = bool(n.params["is_2D"])
    geo = [int(v) for v in _geometry(n, n.src[0])]
    _run("im2col", _as_2d(arr(b), is_2d), lut(b), _as_2d_out(arr(n), is_2d), kind(n), *geo)


def _as_2d_out(o: np.ndarray, is_2d: bool) -> np.ndarray:
    """A 1D IM2COL layout (1, N, OL, C*K) seen as (N, 1, OL, C*K)."""
    return o if is_2d else o[0][:, None, :, :]


@kernel((FLOATS, FLOATS), ONLY_F32, "IM2COL_BACK")
def _im2col_back(n: Tensor) -> None:
    g = n.src[0]
    is_2d = bool(n.params["is_2D"])
    geo = [int(v) for v in _geometry(n, n.src[1])]
    _run("im2col_back", _as_2d_out(arr(g), is_2d), lut(g), _as_2d(arr(n), is_2d), *geo)


@kernel((FLOATS, F32_F16), F32_F16, "CONV_2D")
def _conv_2d(n: Tensor) -> None:
    a, b, p = n.src[0], n.src[1], n.params
    _run("conv_2d", arr(a), lut(a), arr(b), lut(b), arr(n), kind(n),
         *(int(p[k]) for k in ("s0", "s1", "p0", "p1", "d0", "d1")))


@kernel((FLOATS, FLOATS), ONLY_F32, "CONV_TRANSPOSE_1D")
def _conv_transpose_1d(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    _run("conv_transpose_1d", arr(a), lut(a), arr(b), lut(b), arr(n), int(n.params["s0"]))


@kernel((F32_F16,), ONLY_F32, "POOL_1D")
def _pool_1d(n: Tensor) -> None:
    a, p = n.src[0], n.params
    _run("pool", arr(a), lut(a), arr(n), int(p["op"] == PoolOp.MAX), 1, int(p["k0"]), 1, int(p["s0"]), 1,
         int(p["p0"]), 0)


@kernel((F32_F16,), ONLY_F32, "POOL_2D")
def _pool_2d(n: Tensor) -> None:
    a, p = n.src[0], n.params
    _run("pool", arr(a), lut(a), arr(n), int(p["op"] == PoolOp.MAX), 0,
         *(int(p[k]) for k in ("k0", "k1", "s0", "s1", "p0", "p1")))


@kernel((F32_F16, F32_F16), ONLY_F32, "POOL_2D_BACK")
def _pool_2d_back(n: Tensor) -> None:
    g, x, p = n.src[0], n.src[1], n.params
    _run("pool_2d_back", arr(g), lut(g), arr(x), lut(x), arr(n), int(p["op"] == PoolOp.MAX),
         *(int(p[k]) for k in ("k0", "k1", "s0", "s1", "p0", "p1")))


@kernel((ONLY_F32,), ONLY_F32, "UPSCALE")
def _upscale(n: Tensor) -> None:
    a = n.src[0]
    bilinear = int(n.params["mode"] != ScaleMode.NEAREST)
    t = upscale_tables(n.ne, a.ne, bool(bilinear), bool(n.params["align_corners"]))
    c = np.ascontiguousarray
    _run("upscale", arr(a), arr(n), c(t.i3, np.int64), c(t.i2, np.int64), c(t.y0, np.int64), c(t.y1, np.int64),
         c(t.dy, np.float64), c(t.x0, np.int64), c(t.x1, np.int64), c(t.dx, np.float64), bilinear)
