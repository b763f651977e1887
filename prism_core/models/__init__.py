"""GGUF language models (Gemma 3, Llama, Qwen 2/3) built from Prism ops, with a KV cache and samplers.

    model = prism_core.models.load(path)             # or "gemma3-270m" for the PyPI test model
    for tok in model.generate("The capital of France is", max_tokens=16):
        print(tok.text, end="")
"""

from __future__ import annotations

from . import arch_gemma3, arch_llama  # noqa: F401 - architectures register themselves
from .arch import ARCHITECTURES, Arch, register
from .hparams import HParams, ModelConfigError
from .kv_cache import KVCache
from .model import Model, Token
from .sampling import Sampler

__all__ = ["ARCHITECTURES", "Arch", "HParams", "KVCache", "Model", "ModelConfigError", "Sampler", "Token",
           "register"]
