"""Formulas of ggml's op semantics that every backend needs in the same form.

Backends import them from here (the core's public interface) rather than writing them
again or importing another backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument
from ..tensor import Tensor
from ..types import GGMLType


def mul_mat_b_rounding(a: GGMLType, b: GGMLType) -> GGMLType | None:
    """The type whose values an F32 ``b`` of MUL_MAT/MUL_MAT_ID(a, b) takes before the products, or None:
    ggml's CPU converts b to a's ``vec_dot_type``, which for F16 and BF16 weights is their own type
    (an F16 KV cache times F32 queries multiplies F16-rounded queries). Block types' partners
    (Q8_0/Q8_K...) are the backends' concern: the reference stays exact there."""
    return a if a in (GGMLType.F16, GGMLType.BF16) and b == GGMLType.F32 else None


def checked_row_indices(op: str, index: Tensor, n_rows: int) -> np.ndarray:
    """The row indices of GET_ROWS, GET_ROWS_BACK or SET_ROWS (``index``'s values, host side), refused with
    InvalidArgument naming the op, the range and what was given when any lies outside [0, n_rows): ggml reads
    or writes outside the tensor there, so every backend checks before it touches a row."""
    idx = index.host()
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise InvalidArgument(f"{op}: row index out of range [0, {n_rows}): min {idx.min()}, max {idx.max()}")
    return idx


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Per-head ALiBi slopes as ggml computes them (float64; all 1 when max_bias is 0):
    with L = 2^floor(log2 n_head), head h < L gets m0^(h+1), m0 = 2^(-max_bias/L), and
    head h >= L gets m1^(2(h-L)+1), m1 = 2^(-max_bias/2/L)."""
    if max_bias <= 0:
        return np.ones(n_head)
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-max_bias / 2 / n_log2)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1))


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """YaRN's correction range [low, high] of RoPE pair indices (ggml_rope_yarn_corr_dims), as the
    reference computes it: the pair index at which a dimension completes ``n_rot`` rotations over
    ``n_ctx_orig`` positions is n_dims * log(n_ctx_orig / (2 pi n_rot)) / (2 log(freq_base));
    low = max(0, floor(at beta_fast)), high = min(n_dims - 1, ceil(at beta_slow)). ``n_rot`` = 0
    gives +inf, a negative ``n_rot`` or ``n_ctx_orig`` = 0 gives -inf, and floor/ceil of an
    infinity raise OverflowError (freq_base = 1 raises ZeroDivisionError): the op table refuses
    those parameters when ext_factor != 0, the only case that uses the range."""
    def corr_dim(n_rot: float) -> float:
        if n_rot > 0 and n_ctx_orig > 0:
            return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))
        return math.inf if n_rot == 0 else -math.inf
    return max(0.0, math.floor(corr_dim(beta_fast))), min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))


@dataclass(frozen=True)
class RopeTables:
    """What RoPE rotates and by which angle, per pair k of rotated elements (ggml's modes):
    element ``first[k]`` with ``second[k]``; angle at token t = freq_scale * streams[which[k], t]
    * inv_freq[k] / freq_factor[k], blended with the unscaled angle by ``mix[k]`` (YaRN) and
    cos/sin scaled by ``mscale``."""
    n_pairs: int
    first: np.ndarray
    second: np.ndarray
    streams: np.ndarray  # (number of position streams, n_tok) float64: 4 for the multi-section modes
    which: np.ndarray  # the position stream of each pair
    inv_freq: np.ndarray
    mix: np.ndarray
    mscale: float


def rope_tables(p, pos: np.ndarray, n_tok: int) -> RopeTables:
    """The per-pair tables of a ROPE/ROPE_BACK node with params ``p`` and positions ``pos``."""
    from .codes import RopeMode

    mode, n_dims, offs = p["mode"], p["n_dims"], p["n_offs"]
    if mode == RopeMode.VISION:
        n_pairs, first, second = n_dims, np.arange(n_dims), np.arange(n_dims) + n_dims
    elif mode == RopeMode.NORMAL:
        n_pairs = n_dims // 2
        first, second = offs + 2 * np.arange(n_pairs), offs + 2 * np.arange(n_pairs) + 1
    else:
        n_pairs = n_dims // 2
        first, second = offs + np.arange(n_pairs), offs + np.arange(n_pairs) + n_pairs
    k = np.arange(n_pairs)
    inv_freq = p["freq_base"] ** (-2.0 * k / n_dims)
    if mode in (RopeMode.MROPE, RopeMode.VISION, RopeMode.IMROPE):
        streams = pos.reshape(4, n_tok).astype(np.float64)  # time, height, width, extra
        sections = p["sections"]
        sect = k % sum(sections)
        s0, s1, s2 = sections[0], sections[1], sections[2]
        if mode == RopeMode.IMROPE:
            which = np.where((sect % 3 == 1) & (sect < 3 * s1), 1,
                             np.where((sect % 3 == 2) & (sect < 3 * s2), 2,
                                      np.where((sect % 3 == 0) & (sect < 3 * s0), 0, 3)))
        else:
            which = np.select([sect < s0, sect < s0 + s1, sect < s0 + s1 + s2], [0, 1, 2], 3)
        if mode == RopeMode.VISION:  # each section restarts its frequencies
            starts = np.array([0, s0, s0 + s1, s0 + s1 + s2])
            inv_freq = p["freq_base"] ** (-2.0 * (sect - starts[which]) / n_dims)
    else:
        streams = pos.astype(np.float64).reshape(1, n_tok)
        which = np.zeros(n_pairs, np.int64)
    mscale = float(p["attn_factor"])
    mix = np.zeros(n_pairs)
    if p["ext_factor"] != 0.0:
        low, high = rope_yarn_corr_dims(n_dims, p["n_ctx_orig"], p["freq_base"], p["beta_fast"], p["beta_slow"])
        mix = (1 - np.clip((k - low) / max(0.001, high - low), 0, 1)) * p["ext_factor"]
        mscale *= 1.0 + 0.1 * math.log(1.0 / p["freq_scale"])
    return RopeTables(n_pairs, first, second, streams, which, inv_freq, mix, mscale)


@dataclass(frozen=True)
class UpscaleTables:
    """Source indices of UPSCALE along each dim (ggml's float32 arithmetic): dims 3, 2 by
    nearest index; dims 1, 0 as the lower/upper source (y0/y1, x0/x1) and the weight of the
    upper one (dy, dx), which is 0 with y1 = y0 (x1 = x0) in nearest mode."""
    i3: np.ndarray
    i2: np.ndarray
    y0: np.ndarray
    y1: np.ndarray
    dy: np.ndarray
    x0: np.ndarray
    x1: np.ndarray
    dx: np.ndarray


def upscale_tables(out_ne, in_ne, bilinear: bool, align_corners: bool) -> UpscaleTables:
    f32 = np.float32
    sf = [f32(out_ne[i]) / f32(in_ne[i]) for i in range(4)]

    def nearest(i: int) -> np.ndarray:  # int64(i / sf) in float32, as ggml
        idx = np.floor(np.arange(out_ne[i], dtype=f32) / sf[i]).astype(np.int64)
        return np.minimum(idx, in_ne[i] - 1)

    if not bilinear:
        y0, x0 = nearest(1), nearest(0)
        return UpscaleTables(nearest(3), nearest(2), y0, y0, np.zeros(len(y0)), x0, x0, np.zeros(len(x0)))
    off = f32(0.5)
    if align_corners:
        off = f32(0.0)
        for i in (0, 1):
            if out_ne[i] > 1 and in_ne[i] > 1:
                sf[i] = f32(out_ne[i] - 1) / f32(in_ne[i] - 1)

    def lerp_axis(i: int):
        pos = (np.arange(out_ne[i], dtype=f32) + off) / sf[i] - off
        lo = np.floor(pos).astype(np.int64)
        lo, hi = np.clip(lo, 0, in_ne[i] - 1), np.clip(lo + 1, 0, in_ne[i] - 1)
        return lo, hi, np.clip(pos - lo.astype(f32), f32(0), f32(1)).astype(np.float64)

    return UpscaleTables(nearest(3), nearest(2), *lerp_axis(1), *lerp_axis(0))
