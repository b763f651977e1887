"""A GGUF file opened memory-mapped: :class:`GGUFFile` and :func:`load` (no tensor data is copied or read).

::

    f = prism_core.gguf.load("model.gguf")
    f.meta["general.architecture"], f.meta_types["general.architecture"]
    w = f.tensors["token_embd.weight"]          # a read-only Prism tensor over the file
    prism_core.gguf.save("copy.gguf", f.tensors, f.meta)   # the same bytes again

The file is mapped copy-on-write: pages are read from disk only when a kernel reads
them, and the kernels of every backend (which take writable arrays) can read them; Prism
itself refuses every write into a mapped tensor (see :attr:`Tensor.read_only`), and the
file on disk can never change through the mapping. The header is validated completely
before any tensor is created (:mod:`prism_core.gguf.reader`); a malformed file raises
:class:`~prism_core.errors.MalformedFile` and leaves a caller's context as it was.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping

import numpy as np

from ..context import Context
from ..errors import InvalidArgument
from ..tensor import Tensor
from .format import V
from .reader import Metadata, TensorInfo, parse_header
from .writer import save

GGUFValueType = V

__all__ = ["GGUFFile", "GGUFValueType", "Metadata", "TensorInfo", "load", "save"]


class GGUFFile:
    """A loaded GGUF file: header fields, metadata and its tensors (read-only, mapped)."""

    def __init__(self, path: str, version: int, alignment: int, data_offset: int, meta: Metadata,
                 tensor_info: dict[str, TensorInfo], tensors: dict[str, Tensor], ctx: Context,
                 mapping: mmap.mmap | None) -> None:
        self.path = path
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.meta = meta
        self.tensor_info = tensor_info
        self.tensors = tensors
        self.ctx = ctx
        self._mapping = mapping

    @property
    def meta_types(self) -> Mapping[str, GGUFValueType]:
        """Each key's GGUF value type (ARRAY for arrays; ``meta.element_types`` has their items')."""
        return self.meta.types

    @property
    def file_size(self) -> int:
        return os.path.getsize(self.path)

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The bytes of tensor ``name`` as stored, a read-only uint8 view of the mapping (nothing is read yet)."""
        ti = self.tensor_info.get(name)
        if ti is None:
            raise InvalidArgument(f"{self.path}: no tensor {name!r}")
        if self._mapping is None:
            return np.zeros(0, np.uint8)
        v = np.frombuffer(self._mapping, dtype=np.uint8, count=ti.nbytes, offset=ti.file_offset)
        v.flags.writeable = False
        return v

    def drop_pages(self, name: str) -> None:
        """Let the OS drop tensor ``name``'s pages from memory (they are read from disk again if touched): a
        pass over a file larger than memory then holds about one tensor of it resident, not all it has read.
        Best effort: where the platform has no madvise this does nothing."""
        ti = self.tensor_info.get(name)
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if ti is None or self._mapping is None or advice is None or not ti.nbytes:
            return
        start = ti.file_offset // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(len(self._mapping), ti.file_offset + ti.nbytes)
        try:
            self._mapping.madvise(advice, start, end - start)
        except (OSError, ValueError):  # pages still shared with a view, or an unsupported range: keep them
            pass

    def close(self) -> None:
        """Drop this object's hold on the mapping. Tensors still referenced elsewhere keep it
        (and stay valid) until they are gone: a mapped tensor never points at unmapped memory."""
        self.tensors = {}
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # tensors or lazy metadata still use it; it closes with them
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, v{self.version}, {len(self.meta)} keys, "
                f"{len(self.tensor_info)} tensors, data at {self.data_offset})")


def load(path: str | os.PathLike[str], ctx: Context | None = None) -> GGUFFile:
    """Open ``path``, validate its header and map its tensors into ``ctx`` (a new context
    with the default budget when None). Tensors keep the file's names, ggml types and ``ne``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidArgument(f"{path}: the GGUF file does not exist" if not os.path.exists(path)
                              else f"{path}: not a regular file")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
    buf = memoryview(mapping) if mapping is not None else memoryview(b"")
    try:
        h = parse_header(buf, path)
    except BaseException:
        try:
            buf.release()
            if mapping is not None:
                mapping.close()
        except BufferError:  # slices of it live on in the traceback's frames; it closes with them
            pass
        raise
    if ctx is None:  # the default budget: mapped tensors cost only their overhead, leaving room for compute
        ctx = Context()
    data = np.frombuffer(mapping, dtype=np.uint8) if mapping is not None else np.zeros(0, np.uint8)
    tensors: dict[str, Tensor] = {}
    with ctx.transaction():
        for ti in h.tensors:
            tensors[ti.name] = ctx.map_tensor(ti.type, ti.ne4, data[ti.file_offset:ti.file_offset + ti.nbytes],
                                              ti.name)
    meta = Metadata(h.values, h.types, h.element_types)
    return GGUFFile(path, h.version, h.alignment, h.data_offset, meta, {t.name: t for t in h.tensors},
                    tensors, ctx, mapping)

