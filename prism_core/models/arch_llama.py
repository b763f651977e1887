"""Llama (Llama 2/3, Mistral, TinyLlama): RMS norms, RoPE in NORMAL mode (the converter permutes
q/k rows for it), SwiGLU, optional q/k/v/o biases; and Qwen 2 / Qwen 3, the same layer with NEOX
RoPE, q/k/v biases (Qwen 2) or per-head q/k RMS norms (Qwen 3)."""

from __future__ import annotations

from functools import partial

from ..ops import build as B
from ..ops.codes import RopeMode
from .arch import Arch, register
from .blocks import attention, feed_forward, rms_norm
from .hparams import read_hparams


def layer(hp, w, il, x, step, cache, *, qk_norm: bool = False):
    h = rms_norm(x, w.layer(il, "attn_norm.weight", (hp.n_embd,)), hp.eps)
    x = B.add(x, attention(hp, w, il, h, step, cache, qk_norm=qk_norm, biases=True))
    h = rms_norm(x, w.layer(il, "ffn_norm.weight", (hp.n_embd,)), hp.eps)
    return B.add(x, feed_forward(hp, w, il, h, "silu"))


register(Arch("llama", lambda meta, n_vocab: read_hparams(meta, rope_mode=RopeMode.NORMAL, n_vocab=n_vocab),
              layer))
register(Arch("qwen2", lambda meta, n_vocab: read_hparams(meta, rope_mode=RopeMode.NEOX, n_vocab=n_vocab,
                                                          rope_base_default=1e6), layer))
register(Arch("qwen3", lambda meta, n_vocab: read_hparams(meta, rope_mode=RopeMode.NEOX, n_vocab=n_vocab,
                                                          rope_base_default=1e6), partial(layer, qk_norm=True)))
