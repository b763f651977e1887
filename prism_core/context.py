"""A context creates tensors within a memory budget (ggml_init / ggml_new_tensor).

The budget counts what ggml's arena would: each tensor's metadata overhead plus,
for tensors that own memory, their bytes rounded up to the alignment. Tensors mapped
over external memory (:meth:`Context.map_tensor`, a GGUF file's weights) cost only
their overhead; their bytes are counted apart, in :attr:`Context.mapped_bytes`. The check
happens before anything is stored, so a refused tensor leaves the context as it was.
Host memory is allocated lazily, on a tensor's first data access.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .errors import BoundExceeded, InvalidArgument, ShapeMismatch
from .tensor import Tensor, as_array, check_name, check_ne, contiguous_strides, nbytes_of
from .types import GGMLType, as_type, from_numpy_dtype, traits

TENSOR_OVERHEAD = 368  # bytes of metadata per tensor in ggml's arena (ggml_tensor_overhead)
MEM_ALIGN = 16
DEFAULT_MEM_SIZE = 1 << 30


def _align(n: int) -> int:
    return (n + MEM_ALIGN - 1) // MEM_ALIGN * MEM_ALIGN


class Context:
    """Owns tensors and their host memory, within ``mem_size`` bytes.

    ``guard_bytes`` > 0 surrounds every allocation with that many bytes of a known
    pattern, which :meth:`check_guards` verifies (the conformance suite uses it to
    catch kernels that write outside their output).
    """

    GUARD_PATTERN = 0xA5

    def __init__(self, mem_size: int = DEFAULT_MEM_SIZE, *, guard_bytes: int = 0) -> None:
        if isinstance(mem_size, bool) or not isinstance(mem_size, (int, np.integer)) or mem_size <= 0:
            raise InvalidArgument(f"Context: mem_size must be a positive int of bytes, got {mem_size!r}")
        if isinstance(guard_bytes, bool) or not isinstance(guard_bytes, (int, np.integer)) or guard_bytes < 0:
            raise InvalidArgument(f"Context: guard_bytes must be an int >= 0, got {guard_bytes!r}")
        self.mem_size = int(mem_size)
        self.guard_bytes = int(guard_bytes)
        self.used = 0
        self.tensors: list[Tensor] = []
        self._raw: dict[int, np.ndarray] = {}  # id(base tensor) -> buffer with guards
        # held while a graph over this context's tensors is planned or computed (see schedule.holding)
        self.compute_lock = threading.RLock()

    # ---------------------------------------------------------- creation
    def cost(self, t: GGMLType, ne: tuple[int, ...], *, owns_memory: bool) -> int:
        nbytes = traits(t).type_size * (ne[0] // traits(t).blck_size) * ne[1] * ne[2] * ne[3]
        return TENSOR_OVERHEAD + (_align(nbytes) if owns_memory else 0)

    def _admit(self, tensor: Tensor, cost: int) -> Tensor:
        if self.used + cost > self.mem_size:
            what = (f"'{tensor.name}'" if tensor.name else "a new view" if tensor.view_src is not None
                    else "a new tensor")
            raise BoundExceeded(f"context memory budget exceeded: {what} ({tensor.traits.name}, "
                                f"ne={list(tensor.ne)}) needs {cost} bytes, "
                                f"{self.mem_size - self.used} of {self.mem_size} are left")
        self.used += cost
        self.tensors.append(tensor)
        return tensor

    def new_tensor(self, type: GGMLType | int | str, ne: Any, name: str = "") -> Tensor:
        """A new zero-filled tensor. ``ne`` is in ggml order (innermost first)."""
        t = as_type(type)
        full = check_ne(ne)
        tr = traits(t)
        if full[0] % tr.blck_size:
            raise InvalidArgument(f"ne[0]={full[0]} must be a multiple of {tr.name}'s block size {tr.blck_size}")
        tensor = Tensor(self, t, full, contiguous_strides(t, full), name=check_name(name))
        return self._admit(tensor, self.cost(t, full, owns_memory=True))

    def map_tensor(self, type: GGMLType | int | str, ne: Any, buffer: np.ndarray, name: str = "") -> Tensor:
        """A read-only tensor over ``buffer`` (a 1-dim uint8 array of exactly the tensor's bytes,
        e.g. a slice of a read-only ``np.memmap``), with no copy. Its bytes do not count against
        ``mem_size`` (only its metadata overhead does); :attr:`mapped_bytes` sums them."""
        t = as_type(type)
        full = check_ne(ne)
        tr = traits(t)
        if full[0] % tr.blck_size:
            raise InvalidArgument(f"ne[0]={full[0]} must be a multiple of {tr.name}'s block size {tr.blck_size}")
        if not isinstance(buffer, np.ndarray) or buffer.dtype != np.uint8 or buffer.ndim != 1:
            raise InvalidArgument(f"map_tensor: buffer must be a 1-dim uint8 ndarray, got "
                                  f"{buffer.dtype if isinstance(buffer, np.ndarray) else buffer.__class__.__name__}")
        if not buffer.flags.c_contiguous:
            raise InvalidArgument("map_tensor: buffer must be contiguous")
        strides = contiguous_strides(t, full)
        need = nbytes_of(t, full, strides)
        if buffer.nbytes != need:
            raise ShapeMismatch(f"map_tensor: {tr.name} ne={list(full)} needs {need} bytes, the buffer has "
                                f"{buffer.nbytes}")
        tensor = Tensor(self, t, full, strides, name=check_name(name))
        tensor._storage = buffer
        tensor._read_only = True
        return self._admit(tensor, self.cost(t, full, owns_memory=False))

    @property
    def mapped_bytes(self) -> int:
        """Bytes of external memory this context's mapped tensors span (not counted in ``used``)."""
        return sum(t.nbytes for t in self.tensors if t._read_only)

    def new_tensor_1d(self, type: GGMLType | int | str, ne0: int, name: str = "") -> Tensor:
        return self.new_tensor(type, (ne0,), name)

    def new_tensor_2d(self, type: GGMLType | int | str, ne0: int, ne1: int, name: str = "") -> Tensor:
        return self.new_tensor(type, (ne0, ne1), name)

    def new_tensor_3d(self, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int, name: str = "") -> Tensor:
        return self.new_tensor(type, (ne0, ne1, ne2), name)

    def new_tensor_4d(self, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int, ne3: int,
                      name: str = "") -> Tensor:
        return self.new_tensor(type, (ne0, ne1, ne2, ne3), name)

    def from_numpy(self, array: Any, type: GGMLType | int | str | None = None, name: str = "") -> Tensor:
        """A new tensor holding ``array`` (NumPy order, at most 4 dims); the type is
        taken from the array's dtype unless given (float64 arrays become F32 by default)."""
        arr = as_array(array, "from_numpy")
        if arr.ndim > 4:
            raise BoundExceeded(f"from_numpy: array has {arr.ndim} dims; Prism tensors have at most 4")
        if type is None:
            t = GGMLType.F32 if arr.dtype == np.float64 else from_numpy_dtype(arr.dtype)
        else:
            t = as_type(type)
        ne = tuple(reversed(arr.shape)) or (1,)
        with self.transaction():
            tensor = self.new_tensor(t, ne, name)
            tensor.set(arr.reshape(tensor.shape) if arr.ndim else arr)
        return tensor

    def new_view(self, src: Tensor, type: GGMLType, ne: tuple[int, int, int, int],
                 nb: tuple[int, int, int, int], offset: int) -> Tensor:
        """A tensor sharing ``src``'s memory (used by view ops and in-place results)."""
        tr = traits(type)
        if tr.is_quantized and (ne[0] % tr.blck_size or nb[0] != tr.type_size or offset % tr.type_size
                                or any(ne[i] > 1 and nb[i] % tr.type_size for i in (1, 2, 3))):
            raise InvalidArgument(f"view of {src.label}: a {tr.name} view must keep whole blocks of "
                                  f"{tr.blck_size} elements along dim 0 (ne[0] a multiple of {tr.blck_size}, "
                                  f"nb[0] = {tr.type_size}, offset and strides multiples of {tr.type_size} bytes); "
                                  f"got ne={list(ne)}, nb={list(nb)}, offset={offset}")
        view = Tensor(self, type, ne, nb, view_src=src, view_offs=offset)
        base = view.base
        end = view.view_offs + view.nbytes
        if view.view_offs < 0 or end > base.nbytes:
            raise BoundExceeded(f"view of {src.label} spans bytes [{view.view_offs}, {end}) "
                                f"but its storage has {base.nbytes} bytes")
        return self._admit(view, self.cost(type, ne, owns_memory=False))

    def discard(self, tensors: list[Tensor]) -> None:
        """Forget ``tensors`` (a graph no longer needed): their memory is freed and their budget
        returned. Refused, with nothing changed, if a tensor kept would still view one of them."""
        gone = {id(t) for t in tensors if t.ctx is self}
        kept = [t for t in self.tensors if id(t) not in gone]
        viewer = next((t for t in kept if t.view_src is not None and id(t.view_src) in gone), None)
        if viewer is not None:
            raise InvalidArgument(f"discard: {viewer.label} is kept but views {viewer.view_src.label}, "
                                  "which would be discarded")
        for t in self.tensors:
            if id(t) in gone:
                self.used -= self.cost(t.type, t.ne, owns_memory=t.view_src is None and not t._read_only)
                self._raw.pop(id(t), None)
                t._storage = None
        self.tensors = kept

    def mark(self) -> tuple[int, int]:
        """A point to :meth:`rollback` to: the tensors created after it are dropped."""
        return len(self.tensors), self.used

    def rollback(self, mark: tuple[int, int]) -> None:
        n, used = mark
        for t in self.tensors[n:]:
            self._raw.pop(id(t), None)
        del self.tensors[n:]
        self.used = used

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Every tensor created inside is dropped again if the block raises."""
        mark = self.mark()
        try:
            yield
        except BaseException:
            self.rollback(mark)
            raise

    # ------------------------------------------------------------ memory
    def _allocate(self, base: Tensor) -> np.ndarray:
        n = base.nbytes
        g = self.guard_bytes
        try:
            raw = np.zeros(n + 2 * g, dtype=np.uint8)
        except MemoryError:  # the budget allowed it, the host cannot give it
            raise BoundExceeded(f"{base.label}: the host cannot allocate its {n} bytes "
                                f"(the context's budget is {self.mem_size})") from None
        if g:
            raw[:g] = self.GUARD_PATTERN
            raw[g + n:] = self.GUARD_PATTERN
        self._raw[id(base)] = raw
        return raw[g:g + n]

    def check_guards(self) -> list[Tensor]:
        """Tensors whose guard bytes were overwritten (empty when all are intact)."""
        g = self.guard_bytes
        if not g:
            return []
        bad = []
        for t in self.tensors:
            raw = self._raw.get(id(t))
            if raw is not None and (np.any(raw[:g] != self.GUARD_PATTERN) or np.any(raw[-g:] != self.GUARD_PATTERN)):
                bad.append(t)
        return bad

    def __repr__(self) -> str:
        return f"Context({len(self.tensors)} tensors, {self.used}/{self.mem_size} bytes)"
