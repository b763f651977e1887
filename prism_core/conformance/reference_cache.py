"""The reference backend's logits for model certification, computed once and kept on disk.

The NumPy reference computes a model exactly, in float64: Gemma 3 270M at about a token a second in a
batch on one core, far slower decoding. Certifying a backend needs the reference's logits of a few short
token sequences per KV cache type; they are the same for every backend that generates the same tokens,
so each is kept as a ``.npy`` file named by the digest of what determines it: the model file's SHA-256,
the reference backend's name and version, Prism's version, the cache type, the context size and the
token ids. A file that cannot be read is computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..errors import PrismWarning
from ..plugin.base import Backend

FORMAT = 1  # bumped when what a cached file holds changes
_digests: dict[tuple[str, int, int], str] = {}


def default_dir() -> Path:
    """``$PRISM_CACHE_DIR/reference-logits``, else ``$XDG_CACHE_HOME/prism/...``, else ``~/.cache/prism/...``."""
    root = os.environ.get("PRISM_CACHE_DIR")
    if root:
        return Path(root) / "reference-logits"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "prism" / "reference-logits"


def file_digest(path: str) -> str:
    """SHA-256 of a file, remembered for this process while its size and modification time stay."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _digests[key] = h.hexdigest()
    return _digests[key]


class ReferenceLogits:
    """``logits(cache, ids)``: the reference model's float32 logits of every position of ``ids`` from an
    empty sequence, with KV cache type ``cache``; from ``directory`` when computed before."""

    def __init__(self, path: str, reference: Backend, directory: Path | None, load: Callable[[str], object],
                 n_ctx: int) -> None:
        self.path, self.reference, self.directory, self._load, self.n_ctx = path, reference, directory, load, n_ctx
        self._model: tuple[str, object] | None = None
        self.computed = 0  # sequences computed by the reference in this process (the rest came from disk)

    def _key(self, cache: str, ids: Sequence[int]) -> str:
        from .. import __version__
        what = {"format": FORMAT, "model": file_digest(self.path), "reference": self.reference.name,
                "reference_version": self.reference.version, "prism": __version__, "cache": cache,
                "n_ctx": self.n_ctx, "ids": [int(i) for i in ids]}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]

    def logits(self, cache: str, ids: Sequence[int]) -> np.ndarray:
        file = self.directory / f"{self._key(cache, ids)}.npy" if self.directory is not None else None
        if file is not None and file.is_file():
            try:
                z = np.load(file, allow_pickle=False)
                if z.ndim == 2 and z.shape[0] == len(ids):
                    return z
            except (OSError, ValueError):
                pass  # unreadable: computed again below
        if self._model is None or self._model[0] != cache:
            self._model = None  # one reference model at a time: each holds its own cache and plans
            self._model = (cache, self._load(cache))
        with self._model[1].new_sequence("certification: reference") as seq:
            z = seq.logits(list(ids))
        self.computed += 1
        if file is not None:
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
                tmp = file.with_suffix(f".{os.getpid()}.tmp")
                with open(tmp, "wb") as f:
                    np.save(f, z, allow_pickle=False)
                os.replace(tmp, file)
            except OSError as e:  # the run goes on; the next one computes them again
                warnings.warn(f"cannot keep the reference logits in {self.directory}: {e} (give another "
                              "directory with --reference-cache)", PrismWarning, stacklevel=2)
        return z
