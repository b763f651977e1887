"""Run a graph on a backend, sending each node it does not support to the reference.

View ops (RESHAPE, VIEW, PERMUTE, TRANSPOSE) compute nothing: their result shares
memory with the source. All built-in backends use host memory, so a fallback moves
no data. ``strict=True`` turns any fallback into an :class:`Unsupported` error, raised
before any node is computed when the backend's ``supports`` already refuses a node.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from .context import Context
from .errors import InvalidArgument, Unsupported
from .graph import Graph
from .plugin.base import Backend
from .plugin.registry import REGISTRY
from .tensor import Tensor


@dataclass
class Fallback:
    node: Tensor
    reason: str


@dataclass
class ComputeReport:
    backend: str
    computed: int = 0
    fallbacks: list[Fallback] = field(default_factory=list)

    @property
    def fell_back(self) -> list[str]:
        return [f.node.opdef.key for f in self.fallbacks]


def backend_reason(be: Backend, node: Tensor) -> str:
    """The backend's own words on why it refuses ``node`` (``Backend.why_unsupported``), or ""."""
    try:
        return be.why_unsupported(node) if hasattr(be, "why_unsupported") else ""
    except Exception as e:  # noqa: BLE001 - a report must not fail because a plugin's explanation did
        return f"why_unsupported() raised {type(e).__name__}"


def why_not(be: Backend, node: Tensor) -> str:
    """"not supported", with the backend's reason when it gives one."""
    why = backend_reason(be, node)
    return f"not supported: {why}" if why else "not supported"


def strict_refusal(be: Backend, node: Tensor) -> Unsupported:
    why = backend_reason(be, node)
    return Unsupported(f"backend {be.name!r} does not support {node.label} ({why + '; ' if why else ''}strict mode)")


def refuse_read_only_writes(graph: Graph) -> None:
    """Raise before anything runs if a node of ``graph`` would write into a read-only tensor.
    Every computing node writes its own storage, which is its base's (a view writes through)."""
    for node in graph.nodes:
        if node.opdef is not None and not node.opdef.view_only:
            node.check_writable(f"computing {node.opdef.key}")


def as_graph(graph: Graph | Tensor, who: str) -> Graph:
    """``graph`` itself, or the graph ending at a tensor; anything else is refused."""
    if isinstance(graph, Tensor):
        return Graph(capacity=1 << 20).expand(graph)
    if not isinstance(graph, Graph):
        raise InvalidArgument(f"{who}: expected a Graph or a Tensor, got {type(graph).__name__}")
    return graph


def resolve_backend(backend: Backend | str | None, who: str) -> Backend:
    """A Backend instance, a registered backend's name, or None (the default backend)."""
    if isinstance(backend, Backend):
        return backend
    if backend is not None and not isinstance(backend, str):
        raise InvalidArgument(f"{who}: backend must be a Backend, a backend name or None, "
                              f"got {type(backend).__name__}")
    return REGISTRY.get(backend)


def flag_arg(who: str, name: str, value: object) -> bool:
    """A keyword flag that must be a bool (a truthy string or number is a mistake, not True)."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{who}: {name} must be a bool, got {value!r}")
    return value


def computes_nothing(node: Tensor) -> bool:
    """Leafs, views, and results with no elements: ggml's CPU backend skips empty nodes too, so
    every op defines an empty result and no kernel ever sees one."""
    return node.opdef is None or node.opdef.view_only or node.nelements == 0


def contexts_of(graph: Graph) -> list[Context]:
    """The contexts owning ``graph``'s nodes, in a fixed order (locks are taken in it)."""
    found = {id(n.ctx): n.ctx for n in graph.nodes}
    return [found[k] for k in sorted(found)]


@contextmanager
def holding(contexts: list[Context]) -> Iterator[None]:
    """Each context's compute lock, for the duration of one compute.

    Computing rebinds and writes the storage of a context's tensors (a plan points its
    intermediates at its own arena), so two computes over one context's tensors must not
    interleave: they take turns, whichever graph or plan each runs."""
    if len(contexts) == 1:
        with contexts[0].compute_lock:
            yield
        return
    with ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c.compute_lock)
        yield


def compute(graph: Graph | Tensor, backend: Backend | str | None = None, *, strict: bool = False) -> ComputeReport:
    """Compute every node of ``graph`` (or of the graph ending at a tensor) in order.

    Safe to call from several threads: computes over one context's tensors take turns."""
    graph = as_graph(graph, "compute")
    be = resolve_backend(backend, "compute")
    strict = flag_arg("compute", "strict", strict)
    with holding(contexts_of(graph)):
        return _compute(graph, be, strict)


def _compute(graph: Graph, be: Backend, strict: bool) -> ComputeReport:
    report = ComputeReport(be.name)
    refuse_read_only_writes(graph)
    reference: Backend | None = None
    if strict:  # refuse before computing anything, so a refused graph leaves every tensor as it was
        for node in graph.nodes:
            if not computes_nothing(node) and not be.supports(node):
                raise strict_refusal(be, node)
    for node in graph.nodes:
        if computes_nothing(node):
            continue
        if be.supports(node):
            try:
                be.compute(node)
                report.computed += 1
                continue
            except Unsupported as e:
                if strict:
                    raise
                reason = f"claimed support, then raised Unsupported: {e}"
        else:
            if strict:
                raise strict_refusal(be, node)
            reason = why_not(be, node)
        if reference is None:
            reference = REGISTRY.reference()
        if reference is be:
            raise Unsupported(f"the reference backend {be.name!r} cannot compute {node.label}: {reason}")
        reference.compute(node)
        report.computed += 1
        report.fallbacks.append(Fallback(node, reason))
    return report
