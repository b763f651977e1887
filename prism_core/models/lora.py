"""LoRA adapters applied to a model unmerged (llama.cpp's build_lora_mm): every adapted matrix's product
gains ``scale * mul_mat(lora_b, mul_mat(lora_a, x))``, so adapters can be swapped or rescaled without
touching the weights. The file format is :mod:`prism_core.gguf.lora`.

    model = prism_core.models.load("base.gguf", lora=[("adapter.gguf", 1.0)])
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..context import Context
from ..errors import InvalidArgument, ShapeMismatch
from ..gguf.lora import AdapterError, LoraFile, read
from ..tensor import Tensor
from .blocks import LoraProduct

AdapterSpec = tuple[Any, float]  # (a path or a LoraFile, the user's scale)


def _spec(i: int, item: Any) -> tuple[Any, float]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InvalidArgument(f"lora[{i}] must be an (adapter, scale) pair, got {item!r:.80}")
    src, scale = item
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise InvalidArgument(f"lora[{i}]: the scale must be a finite number, got {scale!r}")
    if not isinstance(src, (LoraFile, str, os.PathLike)):
        raise InvalidArgument(f"lora[{i}]: the adapter must be a path or a LoraFile, got {type(src).__name__}")
    return src, float(scale)


def open_adapters(lora: Sequence[AdapterSpec], ctx: Context) -> list[tuple[LoraFile, float]]:
    """Each (path or LoraFile, scale) of ``lora`` as a loaded adapter mapped into ``ctx``."""
    if isinstance(lora, (str, bytes, os.PathLike)) or not isinstance(lora, Sequence):
        raise InvalidArgument(f"lora must be a list of (adapter, scale) pairs, got {type(lora).__name__}")
    specs = [_spec(i, item) for i, item in enumerate(lora)]
    opened: list[tuple[LoraFile, float]] = []
    try:
        for src, scale in specs:
            f = src if isinstance(src, LoraFile) else read(src, ctx)
            opened.append((f, scale))
    except BaseException:
        for (f, _), (src, _) in zip(opened, specs):
            if not isinstance(src, LoraFile):
                f.close()
        raise
    return opened


def products(adapters: Sequence[tuple[LoraFile, float]], tensors: Mapping[str, Tensor],
             arch: str) -> dict[str, list[LoraProduct]]:
    """The LoRA products for :class:`~prism_core.models.blocks.Weights`, by base matrix name. Refuses, naming
    the tensor, an adapter of another architecture, a matrix the model does not have, shapes that do not fit
    the model's matrix, and an adapter in another context than the model's tensors."""
    out: dict[str, list[LoraProduct]] = {}
    for f, scale in adapters:
        if f.arch != arch:
            raise AdapterError(f"{f.path}: the adapter is for a {f.arch!r} model, this model is {arch!r}")
        for name, (a, b) in f.pairs.items():
            w = tensors.get(name)
            if w is None:
                raise AdapterError(f"{f.path}: the adapter adapts {name!r}, which this model does not have "
                                   "(an adapter made for another model?)")
            if w.ne[0] != a.ne[0] or w.ne[1] != b.ne[1] or w.ne[2:] != (1, 1):
                raise ShapeMismatch(f"{f.path}: {name}: the model's matrix has ne={list(w.ne[:2])} but the adapter "
                                    f"has lora_a ne={list(a.ne[:2])}, lora_b ne={list(b.ne[:2])} (expected "
                                    f"[{w.ne[0]}, r] and [r, {w.ne[1]}]: an adapter made for another model?)")
            if a.ctx is not w.ctx or b.ctx is not w.ctx:
                raise InvalidArgument(f"{f.path}: {name}: the adapter's tensors must be mapped into the model's "
                                      "context (read it with ctx=model.ctx)")
            out.setdefault(name, []).append(LoraProduct(a, b, f.scale(name, scale)))
    return out
