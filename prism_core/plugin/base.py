"""The base class of every backend (the contract plugins implement).

A backend computes graph nodes on host NumPy memory. It declares its kernels in
``kernels`` (op-table key -> callable taking the node); the default :meth:`supports`
accepts a node when a kernel exists for its key and every source type is one the
kernel's op accepts in the op table (narrow it by overriding ``supports``). Optional
capabilities (threads, a whole-graph compiler) are optional members with defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import Unsupported
from ..tensor import Tensor
from ..types import GGMLType
from .hookspecs import INTERFACE_VERSION

Kernel = Callable[[Tensor], None]


@dataclass(frozen=True, eq=False)
class NodeRun:
    """Consecutive computing nodes of a plan that one backend claimed, in graph order, handed to
    :meth:`Backend.prepare_run` (views between them compute nothing and are left out).

    ``internal`` holds the ``id`` of each result (a storage owner, never a view) that Prism never
    reads: only nodes of this run read it, directly or through views, and it is no graph output,
    input, parameter, loss or gradient. Every other result of the run, and everything a node writes
    through a view (SET_ROWS or CPY into a cache), Prism reads: the callable must leave it in its
    planned memory. An internal result may live wherever the backend likes (or nowhere, when it
    fuses the nodes reading it); the plan still holds room for it at its planned place."""

    nodes: tuple[Tensor, ...]
    internal: frozenset[int]

    def is_internal(self, t: Tensor) -> bool:
        """Whether ``t``'s storage (a view's: its owner's) is a result only this run reads."""
        return id(t.base) in self.internal


class Backend:
    name: ClassVar[str] = ""
    version: ClassVar[str] = "0"
    priority: ClassVar[int] = 0  # higher wins when no backend is named
    device: ClassVar[str] = "cpu"
    interface_version: ClassVar[int] = INTERFACE_VERSION
    is_reference: ClassVar[bool] = False  # the ground truth that others fall back to
    kernels: Mapping[str, Kernel] = {}
    # Block (quantized) types the kernels in ``kernels`` read and write. The default supports()
    # refuses a node with any other block type among its sources or result, so a backend written
    # before the op table accepted block types never claims them by accident.
    block_types: ClassVar[frozenset[GGMLType]] = frozenset()
    # How the activations (float inputs) of this backend's products are rounded, which sets the
    # model-level certification's bounds (prism_core.conformance.model_cert): "f64" (exact, the
    # reference), "f32" (float32 products), "f16" or "bf16" (activations rounded to that type), or "q8"
    # (quantized to the weight's vec_dot type, Q8_0/Q8_1/Q8_K, as ggml's CPU backend does).
    activation_precision: ClassVar[str] = "f32"

    def availability(self) -> tuple[bool, str]:
        """(usable here, reason when not)."""
        return True, ""

    @property
    def threads(self) -> int:
        return 1

    def compile_seconds(self) -> float:
        """Optional: the seconds this process has spent compiling kernels so far (a JIT backend's first
        graphs); the model's timings report them apart from the prompt and decode speeds."""
        return 0.0

    def quantize_rows(self, rows: np.ndarray, type: GGMLType, mode: str, imatrix: np.ndarray | None = None,
                      threads: int | None = None) -> np.ndarray | None:
        """Optional: ggml's quantizers on host rows, for :mod:`prism_core.quant` (which uses the first available
        backend offering them, else its own NumPy ones). ``rows``: float32 (nrows, n_per_row), C-contiguous;
        ``mode``: "ref" (ggml's ``quantize_row_*_ref``), "chunk" (``ggml_quantize_chunk``: llama-quantize's
        quantizers, with the importance weights ``imatrix``, float32 (n_per_row,), or None). Returns uint8
        (nrows, row bytes), bit for bit ggml's, or None when this backend has no quantizer for ``type`` in
        that mode (the default: none). Inputs are finite and checked by the caller."""
        return None

    def refusal(self, node: Tensor) -> str | None:
        """Optional: why this backend does not compute ``node``, in a few words ("" when it
        does). Override it to write each refusal once: :meth:`supports` and
        :meth:`why_unsupported` derive from it. None (the default): supports() decides alone."""
        return None

    def supports(self, node: Tensor) -> bool:
        try:
            refused = self.refusal(node)
        except Exception:  # noqa: BLE001 - supports() must not raise
            return False
        if refused is None:
            d = node.opdef
            return d is not None and d.key in self.kernels and not self._block_type_refusal(node)
        return not refused

    def why_unsupported(self, node: Tensor) -> str:
        """Why ``supports(node)`` is False, for reports and errors ("" when there is nothing to
        add to "not supported"). Must not raise."""
        try:
            refused = self.refusal(node)
            return refused if refused is not None else self._block_type_refusal(node)
        except Exception as e:  # noqa: BLE001
            return f"the refusal check raised {type(e).__name__}: {e}"

    def _block_type_refusal(self, node: Tensor) -> str:
        for t in (node, *node.src):
            if t is not None and t.traits.is_quantized and t.type not in self.block_types:
                return f"{t.traits.name} data (the backend's block_types do not include it)"
        return ""

    def prepare(self, node: Tensor) -> Callable[[], None] | None:
        """Optional: a zero-argument callable computing ``node`` with everything resolved
        (arrays bound, branches taken), or None for the general ``compute(node)``.

        A plan calls it once per node after assigning memory and keeps the node and its
        sources in that memory for as long as the callable is used."""
        return None

    def prepare_run(self, run: NodeRun) -> Callable[[], None] | None:
        """Optional (a whole-graph compiler, one native graph compute): a zero-argument callable
        computing every node of ``run`` in order, or None to have each node prepared alone
        (:meth:`prepare`, else :meth:`compute`).

        A plan calls it after assigning memory, once per maximal run of consecutive nodes this
        backend claimed (the whole plan when it claims every node); the nodes it refused fall back
        to the reference one by one between runs. The same rules as :meth:`prepare` hold: bind
        memory, not values, and compute each node with its own semantics. Raising Unsupported here
        is as returning None."""
        return None

    def compute(self, node: Tensor) -> None:
        """Compute one node, writing into its memory. Raises Unsupported if it cannot."""
        kernel = self.kernels.get(node.opdef.key) if node.opdef is not None else None
        if kernel is None:
            raise Unsupported(f"backend {self.name!r} has no kernel for {node.label}")
        kernel(node)

    def __repr__(self) -> str:
        return f"<backend {self.name} {self.version}>"


def type_refusal(node: Tensor, src_types: tuple, out_types) -> str:
    """Why a backend whose kernel for ``node`` takes ``src_types[i]`` for source i (a source past
    the tuple must be absent) and writes ``out_types`` refuses the node's types ("" if it does
    not): a helper for ``supports``/``why_unsupported`` of backends keeping such a table."""
    def names(types) -> str:
        return ", ".join(sorted(t.name for t in types)) or "none"
    if node.type not in out_types:
        return f"result type {node.type.name} (kernel: {names(out_types)})"
    for i, s in enumerate(node.src):
        if s is not None and (i >= len(src_types) or s.type not in src_types[i]):
            return f"source {i} of type {s.type.name} (kernel: {names(src_types[i] if i < len(src_types) else ())})"
    return ""


class KernelTable:
    """A backend's kernels by op key, with the types each accepts (``support[key]`` = (types of
    each source, result types); a source past the tuple must be absent) and the keys whose
    wrapper reads tensor values, so that a prepared call must not be bound once."""

    def __init__(self) -> None:
        self.kernels: dict[str, Kernel] = {}
        self.support: dict[str, tuple[tuple[frozenset, ...], frozenset]] = {}
        self.reads_values: set[str] = set()

    def kernel(self, srcs: tuple[frozenset, ...], out: frozenset, *keys: str, reads_values: bool = False):
        """Decorator: register f as the kernel of ``keys``; ``reads_values=True`` for a wrapper
        whose arguments depend on tensor values (not only on shapes, params and memory)."""
        def deco(f):
            for k in keys:
                self.kernels[k] = f
                self.support[k] = (srcs, out)
                if reads_values:
                    self.reads_values.add(k)
            return f
        return deco

    def refusal(self, node: Tensor) -> str:
        """"" when a kernel takes the node's op and types, else why not (see type_refusal)."""
        d = node.opdef
        if d is None or d.key not in self.support:
            return "no kernel for this op"
        return type_refusal(node, *self.support[d.key])
