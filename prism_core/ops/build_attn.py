"""Builders for rotary embeddings, fused attention, expert routing and row scatter."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..tensor import Tensor
from .build import _tensor_arg, node
from .codes import RopeMode


def rope_ext(a: Tensor, pos: Tensor, freq_factors: Tensor | None = None, n_dims: int = 0,
             mode: RopeMode | int = RopeMode.NORMAL, n_ctx_orig: int = 0, freq_base: float = 10000.0,
             freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
             beta_fast: float = 32.0, beta_slow: float = 1.0, sections: Sequence[int] = (0, 0, 0, 0),
             n_offs: int = 0, inplace: bool = False) -> Tensor:
    """Rotary position embedding of a [head_dim, n_head, n_tokens, B] (ggml order) at I32
    positions ``pos`` (one per token; four per token for the MROPE modes). ``n_dims`` = 0
    rotates the whole row (only the int 0: None or False go to the schema, which refuses them)."""
    whole_row = isinstance(n_dims, int | np.integer) and not isinstance(n_dims, bool) and n_dims == 0
    return node("ROPE", a, pos, freq_factors, inplace=inplace,
                n_dims=_tensor_arg("ROPE", "a", a).ne[0] if whole_row else n_dims, mode=mode,
                n_ctx_orig=n_ctx_orig, freq_base=freq_base, freq_scale=freq_scale, ext_factor=ext_factor,
                attn_factor=attn_factor, beta_fast=beta_fast, beta_slow=beta_slow, sections=sections,
                n_offs=n_offs)


def rope(a: Tensor, pos: Tensor, n_dims: int, mode: RopeMode | int = RopeMode.NORMAL) -> Tensor:
    """ggml_rope: base 10000, no scaling, no YaRN."""
    return rope_ext(a, pos, None, n_dims, mode, beta_fast=0.0, beta_slow=0.0)


def rope_multi(a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, sections: Sequence[int],
               mode: RopeMode | int = RopeMode.MROPE, **kw) -> Tensor:
    """Multi-section RoPE (MROPE, VISION, IMROPE): ``pos`` holds 4 * n_tokens positions
    (time, height, width, extra streams)."""
    return rope_ext(a, pos, freq_factors, n_dims, mode, sections=sections, **kw)


def rope_ext_back(g: Tensor, pos: Tensor, freq_factors: Tensor | None = None, **params) -> Tensor:
    """The inverse rotation of :func:`rope_ext` with the same parameters (its gradient)."""
    return node("ROPE_BACK", g, pos, freq_factors, **params)


def flash_attn_ext(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float = 1.0,
                   max_bias: float = 0.0, logit_softcap: float = 0.0, sinks: Tensor | None = None) -> Tensor:
    """Fused attention: q [D, n_q, H, B], k [D, n_kv, Hk, B], v [Dv, n_kv, Hv, B] (H % Hk == 0:
    grouped-query heads), optional F16 mask [n_kv, >= n_q, ...] -> F32 [Dv, H, n_q, B]."""
    return node("FLASH_ATTN_EXT", q, k, v, mask, sinks, scale=scale, max_bias=max_bias, logit_softcap=logit_softcap)


def mul_mat_id(as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Mixture-of-experts product: experts ``as_`` [K, M, n_exp], b [K, n_b, n_tok], I32 ids
    [n_used, n_tok] -> F32 [M, n_used, n_tok]."""
    return node("MUL_MAT_ID", as_, b, ids)


def set_rows(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write the rows of ``b`` into ``a`` at row indices ``c`` (I32/I64); the result is a's memory."""
    return node("SET_ROWS", b, c, a)


__all__ = ["rope_ext", "rope", "rope_multi", "rope_ext_back", "flash_attn_ext", "mul_mat_id", "set_rows"]
