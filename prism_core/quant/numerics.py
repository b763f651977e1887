"""Scalar arithmetic of ggml's reference quantizers, element-wise over NumPy arrays.

ggml computes in float32, one operation at a time, accumulating sums sequentially in
the in-block order. The quantizers here keep the in-block index on axis 0 so that such
a sum is a short Python loop over contiguous rows, every step a float32 operation on
the whole batch of blocks (``np.sum`` would add pairwise and round differently).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)  # below this absolute maximum a group counts as all zero (ggml-quants.c)
_MAGIC = F32(12582912.0)  # 1.5 * 2**23: adding it leaves round-half-even(x) in the low mantissa bits


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: the mantissa trick, so ties go to even. Out of its
    ±4194303 range (ggml only asserts it in debug builds) the trick's bits are kept as
    they are, so even those values come out as ggml computes them."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.asarray(x, F32) + _MAGIC
    return (v.view(np.int32) & 0x007FFFFF) - 0x00400000


def seq_sum(terms: np.ndarray) -> np.ndarray:
    """Σ over axis 0 from 0.0, in index order, in float32 (a C ``for`` loop with ``+=``)."""
    acc = np.zeros(terms.shape[1:], F32)
    for t in terms:
        acc += t
    return acc


def fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → IEEE half bits, round to nearest even; overflow gives ±inf as in ggml."""
    with np.errstate(over="ignore"):
        return np.asarray(x, F32).astype(np.float16).view(np.uint16)


def fp16_value(bits: np.ndarray) -> np.ndarray:
    """IEEE half bits → float32 (exact)."""
    return np.asarray(bits, np.uint16).view(np.float16).astype(F32)


def fp16_round(x: np.ndarray) -> np.ndarray:
    """What a float32 becomes after a trip through fp16 (ggml stores d, dmin as fp16)."""
    return fp16_value(fp16_bits(x))


def signed_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max |x|, the signed x it came from) over axis 0; the first one wins a tie, as
    ggml's ``if (ax > amax)`` scan does."""
    ax = np.abs(x)
    i = np.argmax(ax, axis=0)[None]
    return np.take_along_axis(ax, i, 0)[0], np.take_along_axis(x, i, 0)[0]


def positive_max(x: np.ndarray, axis: int) -> np.ndarray:
    """max(0, max over ``axis``) as ggml's ``m = 0; if (v > m) m = v`` scan: +0 when nothing is positive."""
    m = x.max(axis=axis)
    return np.where(m > 0, m, F32(0))


def best_index_int8(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8``: index of the nearest entry of the sorted table
    ``values``; a tie between two entries goes to the upper one."""
    n = len(values)
    vals = values.astype(F32)
    mu = np.clip(np.searchsorted(vals, x, side="right"), 1, n - 1)
    lo, hi = vals[mu - 1], vals[mu]
    idx = np.where(x - lo < hi - x, mu - 1, mu)
    idx = np.where(x <= vals[0], 0, idx)
    return np.where(x >= vals[-1], n - 1, idx)


def pack_2bit_128(L: np.ndarray) -> np.ndarray:
    """Quants 0..3 of 256-element blocks (nb, 256) → (nb, 64) bytes, ggml's order:
    byte 32·h + l holds elements 128·h + l + 32·k at bits 2k."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)
