"""Plan a graph once, compute it many times (ggml's graph allocator + backend scheduler).

Planning resolves each node's kernel (the backend's, or the reference's when the
backend does not support the node) and gives every intermediate result a place in one
shared arena: a buffer is reused once the last node reading it (directly or through a
view) has run, and an op that has an in-place variant writes over its first source when
that source dies at it. Offsets come from an online best-fit pass (as ggml's allocator) or,
when it needs less, an offline greedy-by-size placement over the known lifetimes; either way
no two results needed at the same time share bytes (``Plan.live_bound_bytes`` is the floor).
Tensors flagged input, output, param or loss, gradients,
accumulators and results that nothing in the graph reads are never reused (gradients may
be, with ``keep_grads=False``, once the optimizer nodes have read them). Computing a
plan then only calls kernels.

After a planned compute, only protected tensors hold meaningful values: intermediate
buffers have been overwritten by later nodes (flag a tensor with ``set_output`` to keep
it). A plan describes the graph as it was when planned; plan again after changing it.
Backends may prepare each node's call once (:meth:`Backend.prepare`), or one call for each
maximal run of consecutive nodes they claimed (:meth:`Backend.prepare_run`: a native graph
compute, a compiler; the reference's fallbacks run between the runs); a plan restores
the storage its calls were prepared with before computing, so several plans over shared
tensors stay correct.

Plans that never compute at the same time (a model's prefill and decode graphs) can share one
:class:`Workspace`: their arenas are the front of one buffer sized to the largest, instead of one
buffer each. With ``io_in_arena`` the graph's inputs and outputs live in the arena too, as in
ggml-alloc's compute buffer: a caller sets the inputs before each compute and reads the outputs
before the next compute on that arena, and a model's many graphs then hold no memory of their own.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .context import Context
from .errors import InvalidArgument, Unsupported
from .graph import Graph
from .plugin.base import Backend, NodeRun
from .plugin.registry import REGISTRY
from .schedule import (
    Fallback,
    as_graph,
    computes_nothing,
    contexts_of,
    flag_arg,
    holding,
    refuse_read_only_writes,
    resolve_backend,
    strict_refusal,
    why_not,
)
from .tensor import Flag, Tensor

ALIGN = 64
_PROTECTED_FLAGS = Flag.INPUT | Flag.OUTPUT | Flag.PARAM | Flag.LOSS


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Arena:
    """Best-fit allocator over one growing range of offsets, merging freed neighbours."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self.size = 0

    def alloc(self, n: int) -> int:
        best = None
        for i, (_off, size) in enumerate(self.free):
            if size >= n and (best is None or size < self.free[best][1]):
                best = i
        if best is None:
            if self.free and self.free[-1][0] + self.free[-1][1] == self.size:  # grow the last free block
                off, _ = self.free.pop()
                self.size = off + n
                return off
            off, self.size = self.size, self.size + n
            return off
        off, size = self.free.pop(best)
        if size > n:
            self.free.insert(best, (off + n, size - n))
        return off

    def release(self, off: int, n: int) -> None:
        self.free.append((off, n))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


GREEDY_MAX_BUFFERS = 1500  # the offline placement is quadratic in the number of buffers


def _greedy_by_size(blocks: list[list[int]]) -> tuple[list[int], int]:
    """Offline placement once every lifetime is known: the largest buffers first, each at the
    lowest offset where it overlaps no placed buffer alive at the same time ("greedy by size").
    Returns the offsets and the arena size; the planner keeps it when it beats the online best-fit."""
    order = sorted(range(len(blocks)), key=lambda k: (-blocks[k][0], blocks[k][1]))
    offs, placed, top = [0] * len(blocks), [], 0
    for k in order:
        size, start, end = blocks[k]
        busy = sorted((offs[j], offs[j] + blocks[j][0]) for j in placed
                      if blocks[j][1] <= end and start <= blocks[j][2])
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, hi)
        offs[k] = off
        placed.append(k)
        top = max(top, off + size)
    return offs, top


class Workspace:
    """Scratch memory that several plans take turns using. Each plan's arena is the front of one
    buffer grown to the largest arena; when it grows, or shrinks because the plan that needed the
    most was released, every plan on it moves to the new buffer (and its backend prepares its
    calls again), so the old one is freed. Plans sharing a
    workspace compute one at a time: they hold its lock while computing."""

    def __init__(self) -> None:
        self.buffer = np.zeros(1, dtype=np.uint8)
        self.lock = threading.RLock()
        self._plans: list[weakref.ref[Plan]] = []

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    def _attach(self, p: Plan) -> None:
        with self.lock:
            self._plans = [r for r in self._plans if r() is not None]
            if p.arena_bytes > self.buffer.size:
                self.buffer = np.zeros(p.arena_bytes, dtype=np.uint8)
                for r in self._plans:
                    r()._bind_arena(self.buffer, prepare=True)
            self._plans.append(weakref.ref(p))
            p._bind_arena(self.buffer, prepare=False)

    def _detach(self, p: Plan) -> None:
        with self.lock:
            self._plans = [r for r in self._plans if r() is not None and r() is not p]
            need = max((r().arena_bytes for r in self._plans), default=0)
            if need < self.buffer.size:  # the largest plan left: give back what only it needed
                self.buffer = np.zeros(max(need, 1), dtype=np.uint8)
                for r in self._plans:
                    r()._bind_arena(self.buffer, prepare=True)

    def __repr__(self) -> str:
        return f"Workspace({self.nbytes} bytes, {len([r for r in self._plans if r() is not None])} plans)"


@dataclass
class Plan:
    graph: Graph
    backend: Backend
    steps: list[tuple[Callable[[Tensor], None], Tensor]]
    fallbacks: list[Fallback] = field(default_factory=list)
    arena_bytes: int = 0  # the shared buffer holding every reusable intermediate
    protected_bytes: int = 0  # results that keep their own memory
    naive_bytes: int = 0  # what giving every result its own buffer takes
    live_bound_bytes: int = 0  # the most bytes alive at once in this node order: no allocator needs less
    inplace_reuses: int = 0
    arena: np.ndarray | None = None
    calls: list[Callable[[], None]] = field(default_factory=list)  # one per step, prepared
    bindings: list[tuple[Tensor, np.ndarray]] = field(default_factory=list)  # storage each tensor must have
    contexts: list[Context] = field(default_factory=list)  # whose compute locks a compute holds
    workspace: Workspace | None = None  # where the arena lives when shared with other plans
    offsets: list[tuple[Tensor, int]] = field(default_factory=list)  # each arena tensor's place in it
    owners: list[Backend] = field(default_factory=list)  # the backend computing each step
    runs: list[NodeRun] = field(default_factory=list)  # the steps computed by one call each (Backend.prepare_run)

    @property
    def peak_bytes(self) -> int:
        return self.arena_bytes + self.protected_bytes

    def compute(self) -> Plan:
        """Run every kernel. Safe from several threads: computes over one context's tensors (this
        plan, another plan of the same graph, an eager compute) take turns on the context's lock,
        since they share the tensors' storage and this plan's arena."""
        if len(self.contexts) == 1:  # the usual case, without the generic context manager's cost
            with self.contexts[0].compute_lock:
                self._run()
        else:
            with holding(self.contexts):
                self._run()
        return self

    def _run(self) -> None:
        if self.workspace is not None:
            with self.workspace.lock:
                self._run_calls()
        else:
            self._run_calls()

    def _run_calls(self) -> None:
        for t, storage in self.bindings:  # another plan over the same tensors may have moved them
            if t._storage is not storage:
                t._storage = storage
        for call in self.calls:
            call()

    def release(self) -> None:
        """Give back the memory of the plan's results and arena (leaves keep theirs, except inputs
        planned into the arena); the plan cannot compute afterwards."""
        for n in self.graph.nodes:
            if n.view_src is None and n.opdef is not None:
                n._storage = None
                n.ctx._raw.pop(id(n), None)
        for n, _ in self.offsets:
            n._storage = None
        if self.workspace is not None:
            self.workspace._detach(self)
        self.arena, self.calls, self.bindings, self.offsets, self.runs = None, [], [], [], []

    def _bind_arena(self, buffer: np.ndarray, *, prepare: bool) -> None:
        self.arena = buffer[:max(self.arena_bytes, 1)]
        for n, off in self.offsets:
            slot = self.arena[off: off + n.nbytes]
            if n.opdef is None and n._storage is not None and not prepare:  # an input set before planning
                slot[:] = n._storage
                n.ctx._raw.pop(id(n), None)
            n._storage = slot
        moved = {id(n) for n, _ in self.offsets}
        for t in (*self.graph.nodes, *self.graph.leafs):  # a cached host view would keep the old buffer alive
            if t._host is not None and id(t.base) in moved:
                t._host = None
        if prepare:
            self.bindings, self.calls = [], []
            _prepare_calls(self, self.owners)

    def summary(self) -> str:
        ratio = self.peak_bytes / self.naive_bytes if self.naive_bytes else 1.0
        runs = (f", {sum(len(r.nodes) for r in self.runs)} of them in {len(self.runs)} "
                f"run{'s' if len(self.runs) != 1 else ''} of one call each" if self.runs else "")
        return (f"plan on {self.backend.name}: {len(self.steps)} kernels{runs}, "
                f"{len(self.fallbacks)} on the reference; "
                f"result memory {self.peak_bytes} bytes vs {self.naive_bytes} unplanned ({ratio:.0%}; "
                f"live at once at most {self.live_bound_bytes}), "
                f"{self.inplace_reuses} in-place reuses")


def _bound_kernel(be: Backend, node: Tensor) -> Callable[[Tensor], None]:
    """The cheapest callable computing ``node`` on ``be``: the kernel itself when the
    backend uses the default compute, else the backend's compute."""
    if type(be).compute is Backend.compute:
        return be.kernels[node.opdef.key]
    return be.compute


def _prepare_calls(p: Plan, owners: list[Backend]) -> None:
    """Fix every tensor's storage, then let each backend prepare its calls: one per run of
    consecutive nodes for a backend with :meth:`Backend.prepare_run`, else one per node."""
    seen: set[int] = set()
    for _, node in p.steps:
        for t in (node, *node.src):
            if t is not None and id(t.base) not in seen:
                seen.add(id(t.base))
                p.bindings.append((t.base, t.storage()))
    p.runs = []
    readers: _Readers | None = None
    i = 0
    while i < len(p.steps):
        be, end, call = owners[i], i + 1, None
        if type(be).prepare_run is not Backend.prepare_run:
            while end < len(p.steps) and owners[end] is be:
                end += 1
            readers = readers or _Readers(p)
            run = NodeRun(tuple(node for _, node in p.steps[i:end]), readers.internal(i, end))
            try:
                call = be.prepare_run(run)
            except Unsupported:
                call = None
            if call is not None:
                p.calls.append(call)
                p.runs.append(run)
        if call is None:  # no run capability, or the run declined: one call per node
            p.calls.extend(be.prepare(node) or partial(fn, node) for fn, node in p.steps[i:end])
        i = end


class _Readers:
    """Who reads each result of a plan, to tell a run which of its results Prism never reads."""

    def __init__(self, p: Plan) -> None:
        self.steps = p.steps
        self.span: dict[int, tuple[int, int]] = {}  # id(storage owner) -> (first, last) step reading it
        for k, (_, node) in enumerate(p.steps):
            for s in node.src:
                if s is not None:
                    self.span[id(s.base)] = (self.span.get(id(s.base), (k, k))[0], k)
        g = p.graph
        self.kept = {id(t.base) for t in (*g.nodes, *g.leafs) if t.flags & _PROTECTED_FLAGS}
        self.kept |= {id(t.base) for t in (*g.grads.values(), *g.grad_accs.values())}

    def internal(self, start: int, end: int) -> frozenset[int]:
        """The results of steps ``start..end-1`` that only those steps read (see :class:`NodeRun`)."""
        found = set()
        for _, node in self.steps[start:end]:
            span = self.span.get(id(node))
            if (node.view_src is None and id(node) not in self.kept and span is not None
                    and start <= span[0] and span[1] < end):
                found.add(id(node))
        return frozenset(found)


def plan(graph: Graph | Tensor, backend: Backend | str | None = None, *, strict: bool = False,
         reuse: bool = True, keep_grads: bool = True, workspace: Workspace | None = None,
         io_in_arena: bool = False) -> Plan:
    """Resolve kernels and assign memory for ``graph`` on ``backend`` (see module doc).

    ``keep_grads=False`` lets gradients that are not accumulators share memory once read
    (a training step whose optimizer nodes consume them needs no copy of them afterwards).
    ``workspace``: put the arena in this :class:`Workspace`, shared with the other plans on it.
    ``io_in_arena``: place the leafs flagged input and the results flagged output in the arena
    (inputs live until their last reader, outputs to the end): set the inputs before every
    compute (a value set before planning is carried over once) and read the outputs before the
    next compute on the same arena or workspace. Inputs that are mapped, read-only or
    parameters keep their own memory."""
    graph = as_graph(graph, "plan")
    be = resolve_backend(backend, "plan")
    strict, reuse, keep_grads, io_in_arena = (
        flag_arg("plan", k, v) for k, v in
        (("strict", strict), ("reuse", reuse), ("keep_grads", keep_grads), ("io_in_arena", io_in_arena)))
    if workspace is not None and not isinstance(workspace, Workspace):
        raise InvalidArgument(f"plan: workspace must be a prism_core.Workspace, got {type(workspace).__name__}")
    refuse_read_only_writes(graph)
    with holding(contexts_of(graph)):  # planning rebinds the intermediates' storage
        return _plan(graph, be, strict, reuse, keep_grads, workspace, io_in_arena)


def _plan(graph: Graph, be: Backend, strict: bool, reuse: bool, keep_grads: bool,
          workspace: Workspace | None = None, io_in_arena: bool = False) -> Plan:
    steps, fallbacks, owners = [], [], []
    reference: Backend | None = None
    for node in graph.nodes:
        if computes_nothing(node):
            continue
        if be.supports(node):
            steps.append((_bound_kernel(be, node), node))
            owners.append(be)
            continue
        if strict:
            raise strict_refusal(be, node)
        reference = reference or REGISTRY.reference()
        if not reference.supports(node):
            raise Unsupported(f"neither {be.name!r} nor the reference can compute {node.label}")
        steps.append((_bound_kernel(reference, node), node))
        owners.append(reference)
        fallbacks.append(Fallback(node, why_not(be, node)))
    p = Plan(graph, be, steps, fallbacks, contexts=contexts_of(graph), owners=owners)
    _assign_memory(p, reuse, keep_grads, workspace, io_in_arena)
    _prepare_calls(p, owners)
    return p


def _arena_io(graph: Graph) -> tuple[list[Tensor], list[Tensor]]:
    """The inputs and outputs ``io_in_arena`` places: plain input leafs read by the graph, and
    output results that own their memory."""
    inputs = [t for t in graph.leafs if t.flags & Flag.INPUT and not t.flags & Flag.PARAM and t.view_src is None
              and not t.read_only and t.nbytes]
    kept = {id(t) for t in (*graph.grads.values(), *graph.grad_accs.values())}  # gradients keep their memory
    outputs = [n for n in graph.nodes if n.flags & Flag.OUTPUT and n.view_src is None and n.opdef is not None
               and not n.flags & (Flag.PARAM | Flag.LOSS) and id(n) not in kept]
    return inputs, outputs


def _assign_memory(p: Plan, reuse: bool, keep_grads: bool, workspace: Workspace | None,
                   io_in_arena: bool = False) -> None:
    nodes = p.graph.nodes
    protected = {id(t) for t in (list(p.graph.grads.values()) if keep_grads else []) + list(p.graph.grad_accs.values())}
    last_read: dict[int, int] = {}  # id(storage owner) -> index of the last node reading it
    for i, n in enumerate(nodes):
        for s in n.src:
            if s is not None:
                last_read[id(s.base)] = i
        if n.view_src is not None:  # writing through a view keeps the owner alive
            last_read[id(n.base)] = max(last_read.get(id(n.base), i), i)
    owners = [n for n in nodes if n.view_src is None and n.opdef is not None]
    p.naive_bytes = sum(n.nbytes for n in owners)
    inputs, outputs = _arena_io(p.graph) if io_in_arena else ([], [])
    for n in outputs:
        last_read[id(n)] = len(nodes)  # read by the caller after the last node
    output_ids = {id(n) for n in outputs}
    shared = [n for n in owners if id(n) in output_ids or (reuse and not n.flags & _PROTECTED_FLAGS
                                                          and id(n) not in protected and id(n) in last_read)]
    shared_ids = {id(n) for n in shared}
    p.protected_bytes = p.naive_bytes - sum(n.nbytes for n in shared)

    arena = _Arena()
    live: dict[int, tuple[int, int]] = {}  # id(owner) -> (offset, size) while its value is needed
    offset: dict[int, int] = {}
    dies_at: dict[int, list[Tensor]] = {}
    for n in shared + inputs:
        dies_at.setdefault(last_read[id(n)] if reuse else len(nodes), []).append(n)
    blocks: list[list[int]] = []  # [size, first step, last step] of each buffer (an in-place chain shares one)
    block_of: dict[int, int] = {}

    def place(n: Tensor, first: int) -> None:
        size = _align(max(n.nbytes, 1))
        live[id(n)] = (arena.alloc(size), size)
        block_of[id(n)] = len(blocks)
        blocks.append([size, first, last_read[id(n)]])
        offset[id(n)] = live[id(n)][0]

    for t in inputs:  # set before the first node runs
        place(t, -1)
    input_ids = {id(t) for t in inputs}
    most_live = sum(size for _, size in live.values())
    for i, n in enumerate(nodes):
        if id(n) in shared_ids:
            src0 = n.src[0] if n.src else None
            if (n.opdef.inplace and src0 is not None and id(src0) in live and last_read[id(src0)] == i
                    and id(src0) not in input_ids and (src0.ne, src0.nb, src0.type) == (n.ne, n.nb, n.type)):
                live[id(n)] = live.pop(id(src0))  # write over the dying first source, as ggml does
                dies_at[i].remove(src0)
                p.inplace_reuses += 1
                block_of[id(n)] = block_of[id(src0)]
                blocks[block_of[id(n)]][2] = last_read[id(n)]
                offset[id(n)] = live[id(n)][0]
            else:
                place(n, i)
        most_live = max(most_live, sum(size for _, size in live.values()))
        for dead in dies_at.get(i, []):
            arena.release(*live.pop(id(dead)))
    p.arena_bytes = arena.size
    if len(blocks) <= GREEDY_MAX_BUFFERS:
        offs, top = _greedy_by_size(blocks)
        if top < arena.size:
            p.arena_bytes = top
            offset = {k: offs[b] for k, b in block_of.items()}
    p.live_bound_bytes = p.protected_bytes + most_live
    p.offsets = [(n, offset[id(n)]) for n in shared + inputs]
    if workspace is None:
        p._bind_arena(np.zeros(max(p.arena_bytes, 1), dtype=np.uint8), prepare=False)
    else:
        p.workspace = workspace
        workspace._attach(p)
