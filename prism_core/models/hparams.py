"""Hyper-parameters of a transformer language model, read from GGUF metadata (``{arch}.*`` keys).

Every key is read once here, with its type checked and llama.cpp's default where the converter
may omit it; a missing required key or a value out of range is refused with the key named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..ops.codes import RopeMode

REQUIRED = object()


class ModelConfigError(InvalidArgument):
    """A model file's metadata is missing a key, or a key holds a value the architecture cannot use."""


def meta_value(meta: Mapping[str, Any], key: str, kind: type, default: Any = REQUIRED) -> Any:
    """``meta[key]`` as ``kind`` (int, float, str, bool), ``default`` when absent."""
    if key not in meta:
        if default is REQUIRED:
            raise ModelConfigError(f"model metadata lacks the required key {key!r}")
        return default
    v = meta[key]
    if isinstance(v, np.generic):
        v = v.item()
    ok = (isinstance(v, bool) if kind is bool else isinstance(v, str) if kind is str
          else isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float
          else isinstance(v, int) and not isinstance(v, bool))
    if not ok:
        raise ModelConfigError(f"model metadata key {key!r} must be {kind.__name__}, got {type(v).__name__} {v!r}")
    return kind(v)


def _positive(key: str, v: int | float) -> int | float:
    if not v > 0 or (isinstance(v, float) and not math.isfinite(v)):
        raise ModelConfigError(f"model metadata key {key!r} must be positive and finite, got {v!r}")
    return v


@dataclass(frozen=True)
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key_length
    head_dim_v: int  # value_length
    n_ff: int
    eps: float  # RMS norm epsilon
    rope_dims: int
    rope_mode: RopeMode
    rope_base: float  # full-attention layers
    rope_base_swa: float  # sliding-window layers
    rope_scale: float  # freq_scale = 1 / linear factor
    sliding_window: int  # 0: none
    swa_layers: tuple[bool, ...]  # which layers attend through the sliding window
    attn_scale: float  # the KQ scale
    embed_scale: float  # token embeddings are multiplied by it (sqrt(n_embd) for Gemma)
    final_softcap: float  # 0: none

    @property
    def n_embd_k(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def n_embd_v(self) -> int:
        return self.head_dim_v * self.n_head_kv


def read_hparams(meta: Mapping[str, Any], *, rope_mode: RopeMode, n_vocab: int, swa_pattern: int = 0,
                 head_count_kv_default: int | None = None, rope_base_default: float = 10000.0,
                 rope_base_swa_default: float | None = None, embed_scale: float | None = None,
                 eps_default: float | None = None) -> HParams:
    """Read the hyper-parameters every supported architecture shares; ``swa_pattern`` n > 0:
    layer il uses the sliding window unless il % n == n - 1 (llama.cpp's pattern for Gemma 3)."""
    arch = meta_value(meta, "general.architecture", str)

    def k(name: str, kind: type, default: Any = REQUIRED) -> Any:
        return meta_value(meta, f"{arch}.{name}", kind, default)
    n_embd = _positive(f"{arch}.embedding_length", k("embedding_length", int))
    n_layer = _positive(f"{arch}.block_count", k("block_count", int))
    n_head = _positive(f"{arch}.attention.head_count", k("attention.head_count", int))
    n_head_kv = _positive(f"{arch}.attention.head_count_kv",
                          k("attention.head_count_kv", int, head_count_kv_default or n_head))
    if n_head % n_head_kv:
        raise ModelConfigError(f"{arch}.attention.head_count ({n_head}) must be a multiple of "
                               f"{arch}.attention.head_count_kv ({n_head_kv})")
    if n_embd % n_head and f"{arch}.attention.key_length" not in meta:
        raise ModelConfigError(f"{arch}.embedding_length ({n_embd}) is not a multiple of the head count ({n_head}) "
                               f"and {arch}.attention.key_length is absent")
    head_dim = _positive(f"{arch}.attention.key_length", k("attention.key_length", int, n_embd // n_head))
    head_dim_v = _positive(f"{arch}.attention.value_length", k("attention.value_length", int, head_dim))
    rope_dims = k("rope.dimension_count", int, head_dim)
    if not 0 < rope_dims <= head_dim or rope_dims % 2:
        raise ModelConfigError(f"{arch}.rope.dimension_count must be even and in (0, {head_dim}], got {rope_dims}")
    scaling = k("rope.scaling.type", str, "none")
    factor = k("rope.scaling.factor", float, 1.0) if scaling in ("linear", "none") else None
    if factor is None:
        raise ModelConfigError(f"{arch}.rope.scaling.type {scaling!r} is not supported (none and linear are)")
    factor = factor or 1.0  # converters write 0 for "no scaling"
    _positive(f"{arch}.rope.scaling.factor", factor)
    window = k("attention.sliding_window", int, 0) if swa_pattern else 0
    if swa_pattern and window <= 0:
        raise ModelConfigError(f"{arch}.attention.sliding_window must be positive, got {window}")
    eps = k("attention.layer_norm_rms_epsilon", float, REQUIRED if eps_default is None else eps_default)
    _positive(f"{arch}.attention.layer_norm_rms_epsilon", eps)
    rope_base = _positive(f"{arch}.rope.freq_base", k("rope.freq_base", float, rope_base_default))
    rope_base_swa = k("rope.freq_base_swa", float, rope_base_swa_default or rope_base)
    n_ctx_train = _positive(f"{arch}.context_length", k("context_length", int))
    softcap = k("final_logit_softcapping", float, 0.0)
    return HParams(
        arch=arch, n_vocab=n_vocab, n_ctx_train=n_ctx_train, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
        n_head_kv=n_head_kv, head_dim=head_dim, head_dim_v=head_dim_v, n_ff=_positive(
            f"{arch}.feed_forward_length", k("feed_forward_length", int)), eps=eps, rope_dims=rope_dims,
        rope_mode=rope_mode, rope_base=rope_base, rope_base_swa=rope_base_swa, rope_scale=1.0 / factor,
        sliding_window=window,
        swa_layers=tuple(bool(swa_pattern) and il % swa_pattern != swa_pattern - 1 for il in range(n_layer)),
        attn_scale=1.0 / math.sqrt(head_dim), embed_scale=embed_scale or 1.0, final_softcap=softcap)
