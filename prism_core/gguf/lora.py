"""LoRA adapters in llama.cpp's GGUF format (what its llama_adapter_lora_init and export-lora read).

An adapter file is a GGUF file with

* ``general.type`` = "adapter", ``adapter.type`` = "lora", ``general.architecture`` = the base model's;
* ``adapter.lora.alpha``: FLOAT32 (llama.cpp reads it with gguf_get_val_f32, which aborts the process on
  any other type); 0 means "no alpha": the scale is then the user's scale alone;
* for each adapted matrix ``W`` of the base model (ne [n_in, n_out]) two tensors, ``<W's name>.lora_a``
  with ne [n_in, r] and ``<W's name>.lora_b`` with ne [r, n_out] (PEFT's lora_A.weight and lora_B.weight,
  whose NumPy shapes are (r, n_in) and (n_out, r)), so that the adapted product is
  ``mul_mat(W, x) + scale * mul_mat(lora_b, mul_mat(lora_a, x))`` with ``scale = user_scale * alpha / r``,
  r read per tensor pair as lora_b's ne[0] (llama.cpp's llama_adapter_lora_weight::get_scale).

llama.cpp also accepts ``*_norm.weight`` tensors in an adapter (and ignores them); Prism reads and writes
only the lora_a / lora_b pairs and refuses any other tensor, naming it. The token embeddings' special
orientation (llama.cpp transposes token_embd's pair) is refused too: Prism adapts matrices, not the
embedding table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..context import Context
from ..errors import InvalidArgument, TypeMismatch
from ..tensor import Tensor
from ..types import F16, F32, traits
from .file import GGUFFile, load
from .format import V
from .writer import save

SUFFIX_A, SUFFIX_B = ".lora_a", ".lora_b"
ADAPTER_TYPES = (F32, F16)  # llama.cpp's export-lora refuses quantized adapters; its loader computes with any


class AdapterError(InvalidArgument):
    """An adapter file that is not a LoRA adapter llama.cpp would load, or one made for another model."""


@dataclass
class LoraFile:
    """A loaded adapter: the base architecture, alpha, the (lora_a, lora_b) tensor pair of each adapted
    matrix by the matrix's name, and the file's other metadata (mapped, read-only tensors)."""

    path: str
    arch: str
    alpha: float
    pairs: dict[str, tuple[Tensor, Tensor]]
    meta: Mapping[str, Any] = field(default_factory=dict)
    source: GGUFFile | None = None

    def rank(self, name: str) -> int:
        return self.pairs[name][1].ne[0]

    def scale(self, name: str, user_scale: float = 1.0) -> float:
        """llama.cpp's applied scale for matrix ``name``: user_scale * alpha / r (user_scale when alpha is 0)."""
        return user_scale * self.alpha / self.rank(name) if self.alpha else user_scale

    def close(self) -> None:
        if self.source is not None:
            self.source.close()

    def __repr__(self) -> str:
        ranks = sorted({self.rank(n) for n in self.pairs})
        return (f"LoraFile({self.path!r}, {self.arch}, alpha {self.alpha:g}, {len(self.pairs)} matrices, "
                f"rank {'/'.join(map(str, ranks))})")


def read(path: str | os.PathLike[str], ctx: Context | None = None) -> LoraFile:
    """Open the adapter at ``path`` (tensors mapped into ``ctx``) and check it as llama.cpp's loader does:
    the three type keys, alpha's FLOAT32 type, complete pairs, ranks that agree within each pair."""
    f = load(path, ctx)
    try:
        return _check(f)
    except BaseException:
        f.close()
        raise


def _str_key(f: GGUFFile, key: str, want: str | None) -> str:
    if key not in f.meta:
        raise AdapterError(f"{f.path}: not a LoRA adapter: the metadata key {key!r} is missing"
                           + (f" (expected {want!r})" if want else ""))
    v = f.meta[key]
    if f.meta_types[key] != V.STRING:
        raise AdapterError(f"{f.path}: {key} must be a string, has type {f.meta_types[key].name}")
    if want is not None and v != want:
        raise AdapterError(f"{f.path}: not a LoRA adapter: {key} is {v!r}, expected {want!r}")
    return str(v)


def _check(f: GGUFFile) -> LoraFile:
    _str_key(f, "general.type", "adapter")
    _str_key(f, "adapter.type", "lora")
    arch = _str_key(f, "general.architecture", None)
    alpha = 0.0
    if "adapter.lora.alpha" in f.meta:
        t = f.meta_types["adapter.lora.alpha"]
        if t != V.FLOAT32:  # llama.cpp aborts (GGML_ASSERT in gguf_get_val_f32) on any other type
            raise AdapterError(f"{f.path}: adapter.lora.alpha must be FLOAT32 (llama.cpp aborts on anything "
                               f"else), has type {t.name}")
        alpha = float(f.meta["adapter.lora.alpha"])
        if not math.isfinite(alpha):
            raise AdapterError(f"{f.path}: adapter.lora.alpha must be finite, got {alpha}")
    halves: dict[str, dict[str, Tensor]] = {}
    for name, t in f.tensors.items():
        for suffix in (SUFFIX_A, SUFFIX_B):
            if name.endswith(suffix):
                halves.setdefault(name[:-len(suffix)], {})[suffix] = t
                break
        else:
            raise AdapterError(f"{f.path}: tensor {name!r} is neither a .lora_a nor a .lora_b tensor; Prism reads "
                               "LoRA pairs only")
    pairs: dict[str, tuple[Tensor, Tensor]] = {}
    for base, h in halves.items():
        if len(h) != 2:
            missing = SUFFIX_B if SUFFIX_A in h else SUFFIX_A
            raise AdapterError(f"{f.path}: the LoRA pair of {base!r} lacks {base}{missing}")
        a, b = h[SUFFIX_A], h[SUFFIX_B]
        for t in (a, b):
            if t.type not in ADAPTER_TYPES:
                raise TypeMismatch(f"{f.path}: {t.name} has type {t.traits.name}; adapters hold F32 or F16 "
                                   "tensors (llama.cpp's export-lora refuses quantized ones too)")
            if t.n_dims > 2:
                raise AdapterError(f"{f.path}: {t.name} has ne={list(t.ne)}; LoRA tensors are matrices")
        if base.startswith("token_embd"):
            raise AdapterError(f"{f.path}: {base!r} is adapted; Prism applies adapters to matrix products, not to "
                               "the token embeddings")
        if a.ne[1] != b.ne[0]:
            raise AdapterError(f"{f.path}: {base}: lora_a has ne={list(a.ne[:2])} and lora_b ne={list(b.ne[:2])}; "
                               "lora_a's ne[1] must equal lora_b's ne[0] (the rank; a lora_a that is not "
                               "transposed comes from llama.cpp's old finetune example)")
        pairs[base] = (a, b)
    if not pairs:
        raise AdapterError(f"{f.path}: the adapter holds no LoRA tensor pairs")
    meta = {k: f.meta[k] for k in f.meta}
    return LoraFile(f.path, arch, alpha, pairs, meta, f)


def write(path: str | os.PathLike[str], arch: str, alpha: float, pairs: Mapping[str, tuple[Tensor, Tensor]],
          metadata: Mapping[str, Any] | None = None) -> None:
    """Write an adapter llama.cpp loads: ``pairs`` maps each base matrix's name to its (lora_a [n_in, r],
    lora_b [r, n_out]) tensors (F32 or F16); ``metadata`` adds keys (e.g. general.name). Atomic."""
    if not isinstance(arch, str) or not arch:
        raise InvalidArgument(f"lora write: arch must be the base model's general.architecture, got {arch!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise InvalidArgument(f"lora write: alpha must be a finite number, got {alpha!r}")
    if not pairs:
        raise InvalidArgument("lora write: no tensor pairs to write")
    tensors: dict[str, Tensor] = {}
    for base, pair in pairs.items():
        if not isinstance(pair, tuple) or len(pair) != 2 or not all(isinstance(t, Tensor) for t in pair):
            raise InvalidArgument(f"lora write: the pair of {base!r} must be a (lora_a, lora_b) tuple of Tensors")
        a, b = pair
        for t in pair:
            if t.type not in ADAPTER_TYPES:
                raise TypeMismatch(f"lora write: {base}: {t.label} has type {traits(t.type).name}; adapters "
                                   "hold F32 or F16")
        if a.ne[2:] != (1, 1) or b.ne[2:] != (1, 1) or a.ne[1] != b.ne[0]:
            raise InvalidArgument(f"lora write: {base}: lora_a ne={list(a.ne)} and lora_b ne={list(b.ne)} are not "
                                  "[n_in, r] and [r, n_out]")
        tensors[base + SUFFIX_A], tensors[base + SUFFIX_B] = a, b
    meta: dict[str, Any] = {"general.architecture": arch, "general.type": "adapter", "adapter.type": "lora",
                            "adapter.lora.alpha": (float(alpha), V.FLOAT32)}
    for k, v in (metadata or {}).items():
        if k in meta:
            raise InvalidArgument(f"lora write: metadata key {k!r} is set by the format itself")
        meta[k] = v
    save(path, tensors, meta)


__all__ = ["ADAPTER_TYPES", "AdapterError", "LoraFile", "read", "write"]
