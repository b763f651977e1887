"""Scalar arithmetic of ggml's reference quantizers, element-wise over NumPy arrays.

ggml computes in float32, one operation at a time, accumulating sums sequentially in
the in-block order. The quantizers here keep the in-block index on axis 0: NumPy reduces
over a leading (non-contiguous) axis row after row, in order, so such a sum is one
``np.add.reduce`` (along the contiguous axis NumPy adds pairwise and rounds differently;
tests/test_quant_numerics.py pins the difference).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)  # below this absolute maximum a group counts as all zero (ggml-quants.c)
_MAGIC = F32(12582912.0)  # 1.5 * 2**23: adding it leaves round-half-even(x) in the low mantissa bits


_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def select(cond: np.ndarray, a, b) -> np.ndarray:
    """``np.where(cond, a, b)`` for same-width numbers, bit for bit (signed zeros, NaNs
    kept), as a mask blend: np.where branches per element and with an unpredictable
    condition is some ten times slower, which dominates the scale searches."""
    a, b = np.asarray(a), np.asarray(b)
    dt = a.dtype if a.ndim else b.dtype
    a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
    iv = _INT_OF_SIZE[dt.itemsize]
    m = np.asarray(cond).astype(iv)
    np.negative(m, out=m)
    ai, bi = a.view(iv), b.view(iv)
    return (bi ^ ((ai ^ bi) & m)).view(dt)


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: the mantissa trick, so ties go to even. Out of its
    ±4194303 range (ggml only asserts it in debug builds) the trick's bits are kept as
    they are, so even those values come out as ggml computes them."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.asarray(x, F32) + _MAGIC
    return (v.view(np.int32) & 0x007FFFFF) - 0x00400000


def nearest_small(x: np.ndarray) -> np.ndarray:
    """``nearest_int`` kept in float32, for |x| < 2**22 (the candidate quants of a scale
    search, which stay within a few units of nmax): the same mantissa trick, undone."""
    return (x + _MAGIC) - _MAGIC


def nearest_f32(x: np.ndarray) -> np.ndarray:
    """``nearest_int`` as float32 for any x: :func:`nearest_small` while every |x| < 2**22 (the common
    case, and the faster), else ggml's bits for the rest too (an inf becomes -2**22, a NaN 0)."""
    with np.errstate(invalid="ignore"):
        small = bool(np.abs(x).max(initial=0) < F32(1 << 22))
    return nearest_small(x) if small else nearest_int(x).astype(F32)


def seq_sum(terms: np.ndarray) -> np.ndarray:
    """Σ over axis 0 from +0.0, in index order, in float32 (a C ``for`` loop with ``+=``).

    NumPy adds row after row only while axis 0 is not the one it walks innermost: for a C-contiguous
    array with at least two elements per row. One column ((n, 1), as a single block's group scales
    make) or a non-contiguous view would be summed pairwise, so those are laid out first as rows of
    two (the column and zeros), which NumPy again sums row by row."""
    t = np.asarray(terms)
    if t.ndim >= 2 and t[0].size >= 2 and t.flags.c_contiguous:
        return np.add.reduce(t, axis=0, initial=F32(0))
    wide = np.zeros((len(t), max(1, t[0].size if t.ndim > 1 else 1), 2), t.dtype)
    wide[:, :, 0] = t.reshape(len(t), -1)
    return np.add.reduce(wide, axis=0, initial=F32(0))[:, 0].reshape(t.shape[1:])


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
    ggml's ``if (ax > amax)`` scan does. That scan never takes a NaN (a comparison with
    NaN is false), where np.argmax takes the first NaN as the largest: a column with a
    NaN (a group scale of huge inputs: inf/inf, 0·inf) is scanned again past its NaNs,
    and one of NaNs only gives ggml's starting (0, 0)."""
    ax = np.abs(x)
    i = np.argmax(ax, axis=0)[None]
    amax, vmax = np.take_along_axis(ax, i, 0)[0], np.take_along_axis(x, i, 0)[0]
    if np.isnan(amax).any():
        ax = np.fmax(ax, F32(-1))  # NaN → -1, below every |x|
        i = np.argmax(ax, axis=0)[None]
        amax, vmax = np.take_along_axis(ax, i, 0)[0], np.take_along_axis(x, i, 0)[0]
        none = amax < 0
        amax, vmax = select(none, F32(0), amax), select(none, F32(0), vmax)
    return amax, vmax


def positive_max(x: np.ndarray, axis: int) -> np.ndarray:
    """max(0, max over ``axis``) as ggml's ``m = 0; if (v > m) m = v`` scan: +0 when nothing is positive."""
    m = x.max(axis=axis)
    return np.where(m > 0, m, F32(0))


class Int8Table:
    """A sorted table of int8 values and ggml's ``best_index_int8`` over it: the index of
    the nearest entry, a tie between two entries going to the upper one, anything at or
    past an end going to that end."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, np.int8)
        self.f32 = self.values.astype(F32)
        v = self.values.astype(np.int32)
        # the bracket of x: mu = entries ≤ x (for integer entries, entries ≤ floor(x)), kept in 1..n-1
        self._mu = np.clip(np.searchsorted(v, np.arange(-128, 128), side="right"), 1, len(v) - 1).astype(np.int32)
        self._lo, self._hi = self.f32[self._mu - 1], self.f32[self._mu]

    def best_index(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index, table value) for each x. ggml's binary search leaves ``lo ≤ x < hi``
        for the two entries around x; x at or past an end needs no test of its own, since
        the end bracket's comparison already picks that end. A NaN x (zero blocks, or the
        scale searches of huge inputs) fails every one of ggml's comparisons and so goes
        to the last index: fmin before fmax puts it in the top bracket, whose test fails too."""
        fl = np.fmax(np.fmin(np.floor(x), F32(127)), F32(-128))
        k = fl.astype(np.intp)
        k += 128
        lo, hi = self._lo.take(k), self._hi.take(k)
        lower = x - lo < hi - x
        return self._mu.take(k) - lower, select(lower, lo, hi)


def pack_2bit_128(L: np.ndarray) -> np.ndarray:
    """Quants 0..3 of 256-element blocks (nb, 256) → (nb, 64) bytes, ggml's order:
    byte 32·h + l holds elements 128·h + l + 32·k at bits 2k."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)
