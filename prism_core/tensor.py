"""The tensor model: ggml's 4-dim metadata over host storage.

``ne[i]`` is the number of elements along dim ``i`` with dim 0 innermost (the row);
``nb[i]`` is the byte stride of dim ``i``. Everything user-facing in NumPy terms
(:attr:`Tensor.shape`, :meth:`Tensor.numpy`, :meth:`Tensor.set`) uses NumPy order,
i.e. ``reversed(ne)``, trimmed to :attr:`Tensor.n_dims` dims.

Views (``view_src`` / ``view_offs``) share the storage of their base tensor; a view
of a view points at the base directly, as in ggml.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import BoundExceeded, InvalidArgument, ReadOnlyTensor, ShapeMismatch, TypeMismatch, Unsupported
from .ops.codes import Op
from .types import BF16, F32, GGMLType, from_f32, to_f32, traits

if TYPE_CHECKING:
    from .context import Context
    from .ops.table import OpDef

MAX_DIMS = 4
MAX_SRC = 10
MAX_NAME = 63  # bytes of UTF-8, as ggml's 64-byte name field with its NUL
MAX_NE = 2**62  # bound on any extent and on the element count


class Flag(enum.IntFlag):
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8


def contiguous_strides(t: GGMLType, ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    tr = traits(t)
    nb0 = tr.type_size
    nb1 = nb0 * (ne[0] // tr.blck_size)
    nb2 = nb1 * ne[1]
    return (nb0, nb1, nb2, nb2 * ne[2])


def nbytes_of(t: GGMLType, ne: tuple[int, ...], nb: tuple[int, ...]) -> int:
    """ggml_nbytes: bytes spanned by a tensor of extents ``ne`` and strides ``nb``."""
    if any(n <= 0 for n in ne):
        return 0
    tr = traits(t)
    if tr.blck_size == 1:
        return tr.type_size + sum((ne[i] - 1) * nb[i] for i in range(MAX_DIMS))
    return ne[0] * nb[0] // tr.blck_size + sum((ne[i] - 1) * nb[i] for i in range(1, MAX_DIMS))


def overlaps_itself(t: GGMLType, ne: tuple[int, ...], nb: tuple[int, ...]) -> bool:
    """Whether two elements (blocks, for quantized types) of the layout ``ne``/``nb`` may share
    bytes: taken from the smallest stride up, each stride must clear the span of the dims inside
    it (a stride-0 view, a region whose rows overlap). Layouts of ggml's views pass."""
    tr = traits(t)
    counts = (ne[0] // tr.blck_size, *ne[1:MAX_DIMS])
    if any(n == 0 for n in counts):
        return False
    span = tr.type_size
    for stride, n in sorted((nb[i], counts[i]) for i in range(MAX_DIMS) if counts[i] > 1):
        if stride < span:
            return True
        span += stride * (n - 1)
    return False


def check_ne(ne: Any, what: str = "ne") -> tuple[int, int, int, int]:
    """Validate extents given in ggml order (1 to 4 ints) and pad them to 4 dims."""
    try:
        dims = tuple(ne)
    except TypeError:
        raise InvalidArgument(f"{what} must be a sequence of 1 to {MAX_DIMS} ints, got {ne!r}") from None
    if not 1 <= len(dims) <= MAX_DIMS:
        raise BoundExceeded(f"{what} has {len(dims)} dims; Prism tensors have 1 to {MAX_DIMS}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise InvalidArgument(f"{what} must hold ints, got {d!r} in {dims}")
        if d < 0:
            raise InvalidArgument(f"{what} must be non-negative, got {dims}")
        if d > MAX_NE:
            raise BoundExceeded(f"{what} extent {d} exceeds the bound 2**62")
    full = tuple(int(d) for d in dims) + (1,) * (MAX_DIMS - len(dims))
    if math.prod(full) > MAX_NE:
        raise BoundExceeded(f"{what}={full} has {math.prod(full)} elements, over the bound 2**62")
    return full  # type: ignore[return-value]


def as_array(values: Any, who: str) -> np.ndarray:
    """``np.asarray(values)``, with what NumPy cannot make an array of (ragged nested lists,
    objects) refused as an InvalidArgument naming ``who``."""
    try:
        return np.asarray(values)
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"{who}: values must form a rectangular numeric array: {e}") from None


def check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise InvalidArgument(f"tensor name must be str, got {type(name).__name__}")
    try:
        n = len(name.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate has no UTF-8 form (ggml names are UTF-8 bytes)
        raise InvalidArgument(f"tensor name {name!r} is not valid Unicode text: {e.reason} at {e.start}") from None
    if n > MAX_NAME:
        raise BoundExceeded(f"tensor name {name[:20]!r}... is {n} bytes; the bound is {MAX_NAME}")
    return name


class Tensor:
    """Metadata of one tensor (or graph node) and access to its host storage.

    Create tensors through a :class:`~prism_core.context.Context` or the builders in
    :mod:`prism_core.ops.build`, never directly.
    """

    __slots__ = ("ctx", "type", "ne", "nb", "op", "opdef", "params", "src", "view_src",
                 "view_offs", "flags", "_name", "_storage", "_host", "_read_only", "__weakref__")

    def __init__(self, ctx: Context, type: GGMLType, ne: tuple[int, int, int, int],
                 nb: tuple[int, int, int, int] | None = None, *, view_src: Tensor | None = None,
                 view_offs: int = 0, name: str = "") -> None:
        self.ctx = ctx
        self.type = type
        self.ne = ne
        self.nb = nb if nb is not None else contiguous_strides(type, ne)
        self.op = Op.NONE
        self.opdef: OpDef | None = None
        self.params: Mapping[str, Any] = MappingProxyType({})
        self.src: tuple[Tensor | None, ...] = ()
        if view_src is not None and view_src.view_src is not None:  # collapse view chains
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        self.view_src = view_src
        self.view_offs = view_offs
        self.flags = Flag(0)
        self._name = name
        self._storage: np.ndarray | None = None
        self._host: tuple[np.ndarray, np.ndarray] | None = None  # (storage it views, the view)
        self._read_only = False  # set by Context.map_tensor; views inherit it through their base

    # ------------------------------------------------------------ metadata
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = check_name(value)

    def set_name(self, name: str) -> Tensor:
        self.name = name
        return self

    @property
    def traits(self):
        return traits(self.type)

    @property
    def n_dims(self) -> int:
        """ggml_n_dims: 1 + the highest dim with more than one element."""
        for i in range(MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy-order shape: ``reversed(ne)`` trimmed to :attr:`n_dims` dims (an empty tensor keeps
        every dim up to its last zero extent, so the shape still holds no elements)."""
        n = self.n_dims
        if self.nelements == 0:
            n = max(n, max(i for i in range(MAX_DIMS) if self.ne[i] == 0) + 1)
        return tuple(reversed(self.ne[:n]))

    @property
    def nelements(self) -> int:
        return math.prod(self.ne)

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.type, self.ne, self.nb)

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def read_only(self) -> bool:
        """True for tensors over external read-only memory (a mapped file) and views of them:
        nothing may write into them (``set``, in-place ops, CPY/SET_ROWS targets, optimizers)."""
        return self.base._read_only

    def check_writable(self, what: str) -> None:
        """Raise :class:`ReadOnlyTensor` if ``what`` would write into this read-only tensor."""
        if self.base._read_only:
            whose = self.label if self.view_src is None else f"{self.label}, a view of {self.base.label}"
            raise ReadOnlyTensor(f"{what}: {whose} is read-only (mapped from a file); "
                                 "write into a copy instead (e.g. cpy or cont into a new tensor)")

    @property
    def is_leaf(self) -> bool:
        return self.op == Op.NONE

    def is_contiguous(self) -> bool:
        """Rows dense and dims packed; dims of extent 1 are ignored (ggml_is_contiguous)."""
        return self.is_contiguous_n(0)

    def is_contiguous_n(self, n: int) -> bool:
        """ggml_is_contiguous_n: dense, except that a gap may follow dims below ``n``+1."""
        tr = self.traits
        expected = tr.type_size
        if self.ne[0] != tr.blck_size and self.nb[0] != expected:
            return False
        expected = expected * self.ne[0] // tr.blck_size
        for i in range(1, MAX_DIMS):
            if self.ne[i] != 1:
                if i > n:
                    if self.nb[i] != expected:
                        return False
                    expected *= self.ne[i]
                else:
                    expected = self.ne[i] * self.nb[i]
        return True

    def is_contiguous_rows(self) -> bool:
        return self.ne[0] == self.traits.blck_size or self.nb[0] == self.traits.type_size

    def is_transposed(self) -> bool:
        return self.nb[0] > self.nb[1]

    def is_permuted(self) -> bool:
        return self.nb[0] > self.nb[1] or self.nb[1] > self.nb[2] or self.nb[2] > self.nb[3]

    def same_shape(self, other: Tensor) -> bool:
        return self.ne == other.ne

    def is_element_aligned(self) -> bool:
        """Offset and strides are whole elements (what typed kernels can index)."""
        size = self.traits.type_size
        return self.view_offs % size == 0 and all(nb % size == 0 for nb in self.nb)

    def same_view(self, other: Tensor) -> bool:
        """Same type, extents, strides and offset: the same elements when the bases agree."""
        return (self.view_offs, self.ne, self.nb, self.type) == (other.view_offs, other.ne, other.nb, other.type)

    # --------------------------------------------------------------- flags
    def set_input(self) -> Tensor:
        self.flags |= Flag.INPUT
        return self

    def set_output(self) -> Tensor:
        self.flags |= Flag.OUTPUT
        if self.view_src is not None:
            self.view_src.flags |= Flag.OUTPUT
        return self

    def set_param(self) -> Tensor:
        """Mark a trainable parameter: it must be a leaf of a float type (ggml_set_param)."""
        if self.op != Op.NONE:
            raise InvalidArgument(f"set_param: {self.label} is the result of {self.op.name}; "
                                  "only leaf tensors (op NONE) can be parameters")
        self.check_writable("set_param (an optimizer would update it)")
        if self.type not in (F32,):
            raise TypeMismatch(f"set_param: {self.label} has type {self.traits.name}; parameters must be f32")
        self.flags |= Flag.PARAM
        return self

    def set_loss(self) -> Tensor:
        """Mark the scalar F32 loss (ggml_set_loss)."""
        if self.nelements != 1:
            raise ShapeMismatch(f"set_loss: {self.label} must be a scalar (one element), has ne={list(self.ne)}")
        if self.type != F32:
            raise TypeMismatch(f"set_loss: {self.label} has type {self.traits.name}; the loss must be f32")
        self.flags |= Flag.LOSS
        return self

    # ------------------------------------------------------------- storage
    @property
    def base(self) -> Tensor:
        return self.view_src if self.view_src is not None else self

    def storage(self) -> np.ndarray:
        """The base tensor's raw bytes (uint8, allocated on first use, zero-filled)."""
        base = self.base
        if base._storage is None:
            base._storage = base.ctx._allocate(base)
        return base._storage

    def host(self) -> np.ndarray:
        """A strided 4-dim NumPy view (ne3, ne2, ne1, ne0) over this tensor's memory,
        in its host dtype (uint16 bits for BF16). Writing to it writes the tensor."""
        buf = self.storage()
        cached = self._host
        if cached is not None and cached[0] is buf:  # kernels ask for it on every call: build it once
            return cached[1]
        tr = self.traits
        if tr.is_quantized:
            raise Unsupported(f"{self.label}: {tr.name} is a block type with no per-element storage; "
                              "use raw() for its block bytes or numpy() for its values")
        view = np.ndarray(shape=tuple(reversed(self.ne)), dtype=tr.host_dtype, buffer=buf,
                          offset=self.view_offs, strides=tuple(reversed(self.nb)))
        self._host = (buf, view)
        return view

    def raw(self) -> np.ndarray:
        """A strided 4-dim uint8 view (ne3, ne2, ne1, row bytes) over this tensor's rows: for a
        block type, its blocks as ggml stores them (the layout of :mod:`prism_core.quant`).
        Writing to it writes the tensor. Needs dense rows (``nb[0]`` = the block's bytes)."""
        tr = self.traits
        if self.ne[0] != tr.blck_size and self.nb[0] != tr.type_size:
            raise Unsupported(f"{self.label}: raw() needs dense rows, nb[0]={self.nb[0]} != {tr.type_size}")
        buf = self.storage()
        shape = (*reversed(self.ne[1:]), tr.type_size * (self.ne[0] // tr.blck_size))
        return np.ndarray(shape=shape, dtype=np.uint8, buffer=buf, offset=self.view_offs,
                          strides=(*reversed(self.nb[1:]), 1))

    def set_raw(self, data: Any) -> Tensor:
        """Write raw bytes (a bytes-like object or uint8 array of exactly ``raw().shape`` or
        :attr:`nbytes` of a dense tensor) into this tensor's rows, unchanged."""
        self.check_writable("set_raw")
        dst = self.raw()
        try:
            arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
                else np.asarray(data)
        except (TypeError, ValueError) as e:
            raise TypeMismatch(f"set_raw: {self.label}: data must be bytes or a uint8 array ({e})") from None
        if arr.dtype != np.uint8:
            raise TypeMismatch(f"set_raw: {self.label}: data must be uint8 bytes, got dtype {arr.dtype}")
        if arr.shape != dst.shape:
            if arr.size != dst.size:
                raise ShapeMismatch(f"set_raw: {self.label} ({self.traits.name}, ne={list(self.ne)}) holds "
                                    f"{dst.size} bytes of rows, got {arr.size} (truncated or too long)")
            arr = arr.reshape(dst.shape)
        dst[...] = arr
        return self

    def numpy(self) -> np.ndarray:
        """A copy of the values in NumPy order with :attr:`shape`. BF16 values come back
        as float32 (NumPy has no bfloat16); block types (Q4_K, ...) as their dequantized
        float32 values; other plain types in their own dtype."""
        copy_bytes = self.nelements * (4 if self.traits.is_quantized or self.type == BF16 else self.traits.type_size)
        if copy_bytes > self.ctx.mem_size:  # a stride-0 view of a few bytes can stand for a huge array
            raise BoundExceeded(f"numpy: the copy of {self.label} needs {copy_bytes} bytes, more than its "
                                f"context's budget of {self.ctx.mem_size}; copy a smaller view of it")
        if self.traits.is_quantized:
            return to_f32(self.raw(), self.type).reshape(self.shape)
        h = self.host()
        vals = to_f32(h, self.type) if self.type == BF16 else h.copy()
        return vals.reshape(self.shape)

    def set(self, values: Any) -> Tensor:
        """Write values given in NumPy order (shape equal to :attr:`shape` or to the full
        4-dim shape, or a scalar) into this tensor's memory, converting to its type (block
        types: quantized row by row with ggml's reference quantizer)."""
        self.check_writable("set")
        arr = as_array(values, "set")
        full = tuple(reversed(self.ne))
        if arr.shape not in (self.shape, full, ()):
            raise ShapeMismatch(f"set: {self.label} has shape {self.shape} (NumPy order), "
                                f"got values of shape {arr.shape}")
        if arr.dtype.kind not in "biuf":
            raise TypeMismatch(f"set: values must be numeric, got dtype {arr.dtype}")
        if self.traits.is_quantized:
            self.raw()[...] = from_f32(np.broadcast_to(arr, full), self.type)
            return self
        self.host()[...] = from_f32(np.broadcast_to(arr, full), self.type)
        return self

    # ---------------------------------------------------------------- misc
    @property
    def label(self) -> str:
        what = self.op.name if self.op != Op.NONE else "leaf"
        if self.opdef is not None and self.opdef.key != self.op.name:
            what = f"{self.op.name}({self.opdef.key})"
        return f"'{self._name}' ({what})" if self._name else f"<{what} ne={list(self.ne)}>"

    def __repr__(self) -> str:
        return (f"Tensor({self._name!r}, {self.traits.name}, ne={list(self.ne)}, nb={list(self.nb)}, "
                f"op={self.opdef.key if self.opdef else self.op.name}"
                + (f", view of {self.view_src.label}+{self.view_offs}" if self.view_src is not None else "")
                + (f", flags={self.flags!r}" if self.flags else "") + ")")

    # Python operators map to ggml's asymmetric builders (b broadcasts into a).
    def __add__(self, other: Tensor) -> Tensor:
        from .ops import build
        return build.add(self, other)

    def __sub__(self, other: Tensor) -> Tensor:
        from .ops import build
        return build.sub(self, other)

    def __mul__(self, other: Tensor) -> Tensor:
        from .ops import build
        return build.mul(self, other)

    def __truediv__(self, other: Tensor) -> Tensor:
        from .ops import build
        return build.div(self, other)

    def __matmul__(self, other: Tensor) -> Tensor:
        """``w @ x`` is ``mul_mat(w, x)``: ggml's convention, result[m, n] = Σ_k w[k, m]·x[k, n]."""
        from .ops import build
        return build.mul_mat(self, other)
