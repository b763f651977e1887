"""``std::mt19937`` and libstdc++'s ``std::shuffle`` / ``uniform_int_distribution``, bit for bit.

ggml-opt shuffles dataset shards with ``std::shuffle(first, last, rng)`` where ``rng`` is
the optimizer context's default-constructed ``std::mt19937`` (seed 5489). The shuffle
result depends on the C++ standard library; this module reproduces libstdc++ (GCC),
which is what ggml gets on Linux. libc++ and MSVC give different permutations.

Pure Python: drawing a few hundred thousand numbers takes well under a second.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import Any

from ..errors import InvalidArgument

_N, _M = 624, 397
_MATRIX_A = 0x9908B0DF
_UPPER, _LOWER = 0x80000000, 0x7FFFFFFF
_MASK32 = 0xFFFFFFFF
DEFAULT_SEED = 5489  # std::mt19937::default_seed


class MT19937:
    """The 32-bit Mersenne Twister exactly as ``std::mt19937`` (same seeding, same outputs).

    Calling the object returns the next 32-bit output, like ``rng()`` in C++.
    """

    __slots__ = ("_mt", "_i")

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidArgument(f"MT19937: seed must be an int, got {seed!r}")
        self.seed(seed)

    def seed(self, seed: int = DEFAULT_SEED) -> None:
        """Re-seed as ``rng.seed(value)`` does (the value is taken modulo 2**32)."""
        mt = [0] * _N
        mt[0] = seed & _MASK32
        for i in range(1, _N):
            prev = mt[i - 1]
            mt[i] = (1812433253 * (prev ^ (prev >> 30)) + i) & _MASK32
        self._mt = mt
        self._i = _N

    def _twist(self) -> None:
        mt = self._mt
        for k in range(_N):
            y = (mt[k] & _UPPER) | (mt[(k + 1) % _N] & _LOWER)
            mt[k] = mt[(k + _M) % _N] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
        self._i = 0

    def __call__(self) -> int:
        if self._i >= _N:
            self._twist()
        y = self._mt[self._i]
        self._i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y

    def discard(self, n: int) -> None:
        """Advance by ``n`` outputs (``rng.discard(n)``)."""
        for _ in range(n):
            self()

    def getstate(self) -> tuple[tuple[int, ...], int]:
        return tuple(self._mt), self._i

    def setstate(self, state: tuple[tuple[int, ...], int]) -> None:
        mt, i = state
        if len(mt) != _N or not 0 <= i <= _N:
            raise InvalidArgument("MT19937.setstate: expected (624 words, index in [0, 624])")
        self._mt, self._i = [int(x) & _MASK32 for x in mt], int(i)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MT19937) and self.getstate() == other.getstate()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"MT19937(position {self._i} of {_N})"


def uniform_int(rng: MT19937, lo: int, hi: int) -> int:
    """``std::uniform_int_distribution<>(lo, hi)(rng)`` as libstdc++ computes it for a
    32-bit engine and a range below 2**32 (Lemire's nearly-divisionless method)."""
    if hi < lo:
        raise InvalidArgument(f"uniform_int: empty range [{lo}, {hi}]")
    r = hi - lo + 1
    if r > _MASK32:  # libstdc++ would combine several draws; never needed for shuffles below 2**32 items
        raise InvalidArgument(f"uniform_int: range of {r} values is not supported (at most 2**32 - 1)")
    if r == 1:
        return lo
    x = rng() * r
    low = x & _MASK32
    if low < r:
        t = ((1 << 32) - r) % r
        while low < t:
            x = rng() * r
            low = x & _MASK32
    return lo + (x >> 32)


def shuffle(seq: MutableSequence[Any], rng: MT19937, start: int = 0, stop: int | None = None) -> None:
    """``std::shuffle(seq.begin() + start, seq.begin() + stop, rng)`` in place, as libstdc++ does it.

    Works on lists and 1-dim NumPy arrays (anything with item get/set).
    """
    if stop is None:
        stop = len(seq)
    n = stop - start
    if n <= 1:
        return

    def swap(i: int, j: int) -> None:
        if i != j:
            a, b = start + i, start + j
            seq[a], seq[b] = seq[b], seq[a]

    if _MASK32 // n >= n:  # two swap positions from one draw
        i = 1
        if n % 2 == 0:
            swap(1, uniform_int(rng, 0, 1))
            i = 2
        while i < n:
            r = i + 1
            x = uniform_int(rng, 0, r * (r + 1) - 1)
            swap(i, x // (r + 1))
            swap(i + 1, x % (r + 1))
            i += 2
    else:
        for i in range(1, n):
            swap(i, uniform_int(rng, 0, i))
