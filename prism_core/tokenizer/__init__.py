"""Tokenizers built from a GGUF file's ``tokenizer.ggml.*`` metadata, identical to llama.cpp's.

``from_gguf(path_or_loaded_file)`` or ``from_metadata(mapping)`` -> :class:`Tokenizer`, with
``encode(text, add_special=True, parse_special=False)``, ``decode(ids)`` and ``piece(id)``.
SPM (``llama``), BPE (``gpt2``, ``gemma4``, with every pre-tokenizer of llama.cpp's test
vocabularies), WPM (``bert``) and UGM (``t5``) vocabularies are supported. Only metadata is read, never tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgument
from .gguf_meta import read_metadata
from .tokenizer import Tokenizer

__all__ = ["Tokenizer", "from_gguf", "from_metadata", "read_metadata"]


def from_metadata(meta: Mapping[str, Any]) -> Tokenizer:
    """A tokenizer from GGUF metadata: strings as str, string arrays as lists of str, numeric arrays
    as sequences or numpy arrays (the shape ``prism_core.gguf``'s loader gives as ``f.meta``)."""
    return Tokenizer.from_metadata(meta)


def from_gguf(src: str | os.PathLike[str] | Any) -> Tokenizer:
    """A tokenizer from a GGUF file's path, or from an already loaded file (any object with ``.meta``)."""
    meta = getattr(src, "meta", None)
    if meta is not None:
        return from_metadata(meta)
    if isinstance(src, str | os.PathLike):
        return from_metadata(read_metadata(src))
    raise InvalidArgument(f"from_gguf expects a path or a loaded GGUF file (with .meta), got {type(src).__name__}")
