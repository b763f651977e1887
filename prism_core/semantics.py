"""Formulas of ggml's op semantics that every backend needs in the same form.

Backends import them from here (the core's public interface) rather than writing them
again or importing another backend.
"""

from __future__ import annotations

import math

import numpy as np


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
