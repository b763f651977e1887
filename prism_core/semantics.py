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


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """YaRN's correction range [low, high] of RoPE pair indices (ggml_rope_yarn_corr_dims), as the
    reference computes it: the pair index at which a dimension completes ``n_rot`` rotations over
    ``n_ctx_orig`` positions is n_dims * log(n_ctx_orig / (2 pi n_rot)) / (2 log(freq_base));
    low = max(0, floor(at beta_fast)), high = min(n_dims - 1, ceil(at beta_slow)). ``n_rot`` = 0
    gives +inf, a negative ``n_rot`` or ``n_ctx_orig`` = 0 gives -inf, and floor/ceil of an
    infinity raise OverflowError, as in the reference (freq_base = 1 raises ZeroDivisionError)."""
    def corr_dim(n_rot: float) -> float:
        if n_rot > 0 and n_ctx_orig > 0:
            return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))
        return math.inf if n_rot == 0 else -math.inf
    return max(0.0, math.floor(corr_dim(beta_fast))), min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
