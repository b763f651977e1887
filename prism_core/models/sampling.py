"""Token samplers over a logits vector, in llama.cpp's chain order: repetition penalty, top-k,
top-p, min-p, temperature, then a draw (or the argmax when the temperature is 0).

A :class:`Sampler` is reproducible: its own NumPy generator, seeded once. It is immutable (a frozen
dataclass, every field checked at construction): ``dataclasses.replace(s, temperature=0.5)`` makes a
changed copy, with a fresh generator from its seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument


def _check(name: str, v: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < lo or v > hi or (lo_open and v == lo):
        raise InvalidArgument(f"sampler: {name} must be a number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Sampler:
    """temperature 0: greedy. top_k 0: off; top_p 1: off; min_p 0: off; repeat_penalty 1: off
    (over the last ``repeat_last_n`` tokens, as llama.cpp: positive logits divided, negative multiplied).
    Assigning a field raises ``dataclasses.FrozenInstanceError``; use ``dataclasses.replace``."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check("temperature", self.temperature, 0.0, 1e6)
        _check("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _check("min_p", self.min_p, 0.0, 1.0)
        _check("repeat_penalty", self.repeat_penalty, 0.0, 1e6, lo_open=True)  # 1.0 is off; 0 would divide by 0
        for name in ("top_k", "repeat_last_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidArgument(f"sampler: {name} must be an int >= 0, got {v!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidArgument(f"sampler: seed must be an int >= 0 or None, got {self.seed!r}")
        object.__setattr__(self, "rng", np.random.default_rng(self.seed))  # frozen: the one write, here

    @classmethod
    def greedy(cls) -> Sampler:
        return cls(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        z = np.asarray(logits, dtype=np.float64).reshape(-1).copy()
        if self.repeat_penalty != 1.0 and history:
            seen = np.unique(np.asarray(history[-self.repeat_last_n:] if self.repeat_last_n else [], np.int64))
            seen = seen[(seen >= 0) & (seen < z.size)]
            z[seen] = np.where(z[seen] > 0, z[seen] / self.repeat_penalty, z[seen] * self.repeat_penalty)
        if self.temperature == 0.0:
            return int(np.argmax(z))  # the first maximum, as llama.cpp's greedy sampler
        order = np.argsort(-z, kind="stable")
        if self.top_k:
            order = order[: self.top_k]
        p = _softmax(z[order])
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)  # the smallest prefix reaching top_p
            order, p = order[:keep], p[:keep]
        if self.min_p > 0.0:
            keep = p >= self.min_p * p[0]
            order = order[keep]
        p = _softmax(z[order] / self.temperature)
        return int(order[self.rng.choice(len(order), p=p)])


SamplerLike = Callable[[np.ndarray, Sequence[int]], int]


def checked_sampler(sampler: SamplerLike | None) -> SamplerLike:
    """``sampler`` for a generation: None is greedy; otherwise a :class:`Sampler` or any callable
    ``(logits, history) -> token id``; anything else (a name such as ``"greedy"``) is refused."""
    if sampler is None:
        return Sampler.greedy()
    if not callable(sampler):
        raise InvalidArgument(f"sampler must be a Sampler (or a callable (logits, history) -> token id) or None, "
                              f"got {sampler!r:.60} ({type(sampler).__name__}); e.g. Sampler.greedy()")
    return sampler


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()
