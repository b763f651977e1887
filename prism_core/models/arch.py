"""The architecture registry: an architecture reads its hyper-parameters from the metadata and builds
one transformer layer from the shared blocks; everything else (embedding, output head, cache,
planning, sampling) is common. Adding an architecture is one small module that calls
:func:`register`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..tensor import Tensor
from .blocks import Step, Weights
from .hparams import HParams, ModelConfigError
from .kv_cache import KVCache

LayerFn = Callable[[HParams, Weights, int, Tensor, Step, KVCache], Tensor]


@dataclass(frozen=True)
class Arch:
    name: str
    hparams: Callable[[Mapping[str, Any], int], HParams]  # (metadata, n_vocab) -> HParams
    layer: LayerFn


ARCHITECTURES: dict[str, Arch] = {}


def register(arch: Arch) -> Arch:
    ARCHITECTURES[arch.name] = arch
    return arch


def arch_for(meta: Mapping[str, Any]) -> Arch:
    name = meta.get("general.architecture")
    if name is None:
        raise ModelConfigError("model metadata lacks the required key 'general.architecture'")
    if name not in ARCHITECTURES:
        raise ModelConfigError(f"general.architecture {name!r} is not supported; Prism runs: "
                               f"{', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[name]
