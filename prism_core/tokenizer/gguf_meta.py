"""A GGUF file's metadata as a plain dict, read through :func:`prism_core.gguf.load` (which validates
the header against hostile files and maps, rather than reads, everything else)."""

from __future__ import annotations

import os
from typing import Any


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every key of the file at ``path``: strings as str, string arrays as lists, numeric arrays as NumPy arrays."""
    from ..gguf.file import load
    f = load(path)
    try:
        return {k: f.meta[k] for k in f.meta}
    finally:
        f.close()
