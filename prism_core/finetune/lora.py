"""Trainable LoRA adapters: for each chosen matrix W (ne [n_in, n_out]) of each layer, A (ne [n_in, r],
NumPy (r, n_in)) drawn uniformly from +-1/sqrt(n_in) (PEFT's kaiming-uniform default for lora_A) and B
(ne [r, n_out]) zero, so that the adapted model starts as the base model exactly; the product gains
``alpha / r * B A x``. A and B are F32 parameters beside the frozen weights, which stay as loaded
(quantized, memory-mapped): only the gradient to the activations passes through them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument
from ..gguf import lora as lora_file
from ..models.blocks import LoraProduct
from ..models.model import Model
from ..tensor import Tensor
from ..types import F32

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
DEFAULT_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output")


def parse_targets(targets: str | Sequence[str]) -> tuple[str, ...]:
    """``"attn_q,attn_v"`` or a sequence of names -> a tuple, in the given order, without repeats. Names are
    a layer's matrix names as GGUF spells them (``blk.N.NAME.weight``); :func:`new_lora` checks that the
    model has them."""
    names = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else list(targets)
    if not names or any(not isinstance(t, str) or not t or "." in t or t != t.strip() for t in names):
        raise InvalidArgument(f"lora targets must be a non-empty list of a layer's matrix names (such as "
                              f"{', '.join(TARGETS)}), got {targets!r}")
    return tuple(dict.fromkeys(names))


def layer_matrices(model: Model, il: int = 0) -> list[str]:
    """The names of layer ``il``'s matrices (the 2-d weights LoRA can adapt), as targets."""
    prefix = f"blk.{il}."
    return [n[len(prefix):-len(".weight")] for n, t in model.weights.tensors.items()
            if n.startswith(prefix) and n.endswith(".weight") and t.n_dims == 2]


@dataclass
class TrainableLora:
    """A, B parameter pairs by matrix name, with their rank and alpha (scale alpha / rank)."""

    rank: int
    alpha: float
    pairs: dict[str, tuple[Tensor, Tensor]]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def products(self) -> dict[str, list[LoraProduct]]:
        return {name: [LoraProduct(a, b, self.scale)] for name, (a, b) in self.pairs.items()}

    @property
    def params(self) -> list[Tensor]:
        return [t for pair in self.pairs.values() for t in pair]

    def save(self, path: str, arch: str, metadata: dict | None = None) -> None:
        """Write the adapter in llama.cpp's LoRA GGUF format (:mod:`prism_core.gguf.lora`)."""
        lora_file.write(path, arch, self.alpha, self.pairs, metadata)


def new_lora(model: Model, targets: Sequence[str], rank: int, alpha: float, seed: int) -> TrainableLora:
    """Fresh adapters on ``targets`` of every layer of ``model``, in its context, A seeded by ``seed``."""
    targets = parse_targets(targets)
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise InvalidArgument(f"lora rank must be a positive int, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise InvalidArgument(f"lora alpha must be a positive finite number, got {alpha!r}")
    hp, tensors = model.hparams, model.weights.tensors
    chosen: list[tuple[str, Tensor]] = []
    for il in range(hp.n_layer):
        for t in targets:
            name = f"blk.{il}.{t}.weight"
            w = tensors.get(name)
            if w is None or w.n_dims != 2:
                raise InvalidArgument(f"lora target {t!r}: this {hp.arch} model has no matrix {name!r}; its "
                                      f"layers' matrices are {', '.join(layer_matrices(model, il))}")
            if rank > min(w.ne[0], w.ne[1]):
                raise InvalidArgument(f"lora rank {rank} exceeds the size of {name} (ne={list(w.ne[:2])}): a rank "
                                      f"must be at most {min(w.ne[0], w.ne[1])}")
            chosen.append((name, w))
    rng = np.random.default_rng(seed)
    ctx = model.ctx
    pairs: dict[str, tuple[Tensor, Tensor]] = {}
    with ctx.transaction():
        for name, w in chosen:
            n_in, n_out = w.ne[0], w.ne[1]
            a = ctx.new_tensor(F32, (n_in, rank), name + lora_file.SUFFIX_A).set_param()
            bound = 1.0 / math.sqrt(n_in)
            a.set(rng.uniform(-bound, bound, (rank, n_in)).astype(np.float32))
            b = ctx.new_tensor(F32, (rank, n_out), name + lora_file.SUFFIX_B).set_param()
            pairs[name] = (a, b)
    return TrainableLora(int(rank), float(alpha), pairs)
