"""The training forward of a model: its own architecture module's layers over a batch of token windows.

One graph takes ``n_windows`` windows of ``n_ctx`` tokens (I32 [n_ctx, n_windows], the optimizer
context's inputs) and gives the logits of every position (F32 [n_vocab, n_ctx * n_windows], its
outputs); ggml-opt's cross-entropy against the next tokens is the mean next-token loss. The layers
are the inference ones (:attr:`Arch.layer`), called without a KV cache, so attention is causal inside
each window (with the sliding window on the layers that have one) and reads the window's own keys and
values: the gradient reaches every projection. Adapters are added through :class:`Weights`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument
from ..models.blocks import LoraProduct, Step, Weights, rms_norm
from ..models.model import Model
from ..ops import build as B
from ..tensor import Tensor
from ..types import F16, I32

_VISIBLE, _HIDDEN = np.float16(0.0), np.float16(-np.inf)


@dataclass
class TrainingForward:
    """The forward graph's ends: ``tokens`` (fit's inputs), ``logits`` (fit's outputs), and the constant
    inputs (positions, masks) set once."""

    tokens: Tensor
    logits: Tensor
    step: Step
    n_ctx: int
    n_windows: int


def window_mask(n_ctx: int, window: int = 0) -> np.ndarray:
    """F16 (n_ctx queries, n_ctx keys) in NumPy order: 0 where query i sees key j (j <= i, and i - j < window
    when there is a window), -inf elsewhere."""
    i, j = np.arange(n_ctx)[:, None], np.arange(n_ctx)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    return np.where(visible, _VISIBLE, _HIDDEN)


def build_forward(model: Model, n_ctx: int, n_windows: int,
                  adapters: Mapping[str, Sequence[LoraProduct]] | None = None,
                  weights: Mapping[str, Tensor] | None = None) -> TrainingForward:
    """The training forward of ``model`` in its context; ``adapters`` (by matrix name) are added to their
    products, ``weights`` replaces some of the model's tensors (full fine-tuning's trainable copies)."""
    hp = model.hparams
    for name, v in (("n_ctx", n_ctx), ("n_windows", n_windows)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidArgument(f"training forward: {name} must be a positive int, got {v!r}")
    if n_ctx > hp.n_ctx_train:
        raise InvalidArgument(f"training forward: n_ctx={n_ctx} exceeds the model's training context "
                              f"{hp.n_ctx_train}")
    ctx, n_tok = model.ctx, n_ctx * n_windows
    tensors = dict(model.weights.tensors)
    tensors.update(weights or {})
    w = Weights(tensors, model.arch.name, adapters)
    with ctx.transaction():
        tokens = ctx.new_tensor(I32, (n_ctx, n_windows), "tokens")
        pos = ctx.new_tensor(I32, (n_tok,), "positions").set_input()
        pos.set(np.tile(np.arange(n_ctx, dtype=np.int32), n_windows))
        mask = ctx.new_tensor(F16, (n_ctx, n_ctx), "causal mask").set_input()
        mask.set(window_mask(n_ctx))
        mask_swa = None
        if hp.sliding_window:
            mask_swa = ctx.new_tensor(F16, (n_ctx, n_ctx), "sliding-window mask").set_input()
            mask_swa.set(window_mask(n_ctx, hp.sliding_window))
        step = Step(tokens=tokens, pos=pos, cells=None, mask=mask, cells_swa=None, mask_swa=mask_swa,
                    out_rows=None, n_kv=n_ctx, n_kv_swa=n_ctx, flash_attn=False, n_windows=n_windows)
        x = B.get_rows(w.get("token_embd.weight"), B.reshape(tokens, (n_tok,)))
        if hp.embed_scale != 1.0:
            x = B.scale(x, hp.embed_scale)
        for il in range(hp.n_layer):
            x = model.arch.layer(hp, w, il, x, step, None)
        x = rms_norm(x, w.get("output_norm.weight"), hp.eps)
        head = w.get("output.weight", required=False) or w.get("token_embd.weight")
        logits = w.linear(x, head)
        if hp.final_softcap:
            logits = B.scale(B.tanh(B.scale(logits, 1.0 / hp.final_softcap)), hp.final_softcap)
        logits.set_name("logits")
    return TrainingForward(tokens, logits, step, int(n_ctx), int(n_windows))
