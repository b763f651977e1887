"""Gemma 3 (details: shared/reference/gemma3.md): embeddings times sqrt(n_embd); four RMS norms per
layer whose stored weights already hold Gemma's +1; per-head q/k RMS norms; NEOX RoPE with base
10000 on sliding-window layers and rope.freq_base (1e6) on the global ones (every 6th layer);
window 512; GeGLU with the tanh GELU; the output head tied to the token embeddings; the roped
queries scaled by 1/sqrt(head_dim) before the attention (llama.cpp's order)."""

from __future__ import annotations

import math

from ..ops import build as B
from ..ops.codes import RopeMode
from .arch import Arch, register
from .blocks import attention, feed_forward, rms_norm
from .hparams import meta_value, read_hparams

SWA_PATTERN = 6


def hparams(meta, n_vocab):
    n_embd = meta_value(meta, "gemma3.embedding_length", int)
    return read_hparams(meta, rope_mode=RopeMode.NEOX, n_vocab=n_vocab, swa_pattern=SWA_PATTERN,
                        head_count_kv_default=4, rope_base_default=1e6, rope_base_swa_default=10000.0,
                        embed_scale=math.sqrt(n_embd), eps_default=1e-6)


def layer(hp, w, il, x, step, cache):
    e = hp.n_embd
    h = rms_norm(x, w.layer(il, "attn_norm.weight", (e,)), hp.eps)
    a = attention(hp, w, il, h, step, cache, qk_norm=True, scale_queries=True)
    x = B.add(x, rms_norm(a, w.layer(il, "post_attention_norm.weight", (e,)), hp.eps))
    h = rms_norm(x, w.layer(il, "ffn_norm.weight", (e,)), hp.eps)
    f = feed_forward(hp, w, il, h, "gelu")
    return B.add(x, rms_norm(f, w.layer(il, "post_ffw_norm.weight", (e,)), hp.eps))


register(Arch("gemma3", hparams, layer))
