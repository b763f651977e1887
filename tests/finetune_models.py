"""Tiny GGUF models for the fine-tuning tests and docs: tests/test_models.py's tiny() weights with a
character vocabulary (SentencePiece-style: "▁" and single letters, so any lowercase text of letters and
spaces tokenizes without byte fallback), loadable by Prism and by llama.cpp."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import prism_core as pc
from prism_core.gguf.format import V
from prism_core.types import GGMLType as G

LETTERS = "abcdefghijklmnopqrstuvwxyz"
N_VOCAB = 50  # tiny()'s vocabulary size


def char_vocabulary() -> dict:
    """<unk>, <s>, </s>, the newline byte, "▁", the 26 letters, then unused pieces up to 50 tokens."""
    pieces = ["\u2581", *LETTERS]
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", *pieces] + [f"\u2581w{i}" for i in range(N_VOCAB - 4 - len(pieces))]
    types = [2, 3, 3, 6] + [1] * (N_VOCAB - 4)
    scores = [0.0] * 4 + [-float(i) for i in range(N_VOCAB - 4)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": (scores, V.FLOAT32), "tokenizer.ggml.token_type": (types, V.INT32),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_bos_token": True}


def write_tiny(path: str | os.PathLike[str], arch: str = "llama", seed: int = 0, weight_type: G = G.F32,
               head_dim: int = 32) -> Path:
    """tiny(arch, seed) as a GGUF file with the character vocabulary; matrices in ``weight_type``."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_models import tiny, to_tensors
    meta, w = tiny(arch, seed, head_dim=head_dim)
    file_type = {G.F32: 0, G.F16: 1, G.Q8_0: 7, G.Q4_0: 2}[weight_type]
    meta = {"general.architecture": arch, "general.name": f"prism-tiny-{arch}", "general.file_type": file_type,
            **{k: v for k, v in meta.items() if k != "general.architecture"}, **char_vocabulary()}
    pc.gguf.save(path, to_tensors(w, weight_type), meta)
    return Path(path)


def text(n_words: int, seed: int = 0) -> str:
    """Lowercase words with a little structure (repeated phrases), for a loss that can fall."""
    r = np.random.default_rng(seed)
    phrases = ["the cat sat on the mat", "a dog ran in the park", "we like green tea", "birds sing at dawn"]
    return " ".join(phrases[i] for i in r.integers(0, len(phrases), n_words))
