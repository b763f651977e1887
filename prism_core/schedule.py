"""Run a graph on a backend, sending each node it does not support to the reference.

View ops (RESHAPE, VIEW, PERMUTE, TRANSPOSE) compute nothing: their result shares
memory with the source. All built-in backends use host memory, so a fallback moves
no data. ``strict=True`` turns any fallback into an :class:`Unsupported` error, raised
before any node is computed when the backend's ``supports`` already refuses a node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .backend import Backend
from .errors import Unsupported
from .graph import Graph
from .registry import REGISTRY
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


def compute(graph: Graph | Tensor, backend: Backend | str | None = None, *, strict: bool = False) -> ComputeReport:
    """Compute every node of ``graph`` (or of the graph ending at a tensor) in order."""
    if isinstance(graph, Tensor):
        graph = Graph(capacity=1 << 20).expand(graph)
    be = backend if isinstance(backend, Backend) else REGISTRY.get(backend)
    report = ComputeReport(be.name)
    refuse_read_only_writes(graph)
    reference: Backend | None = None
    if strict:  # refuse before computing anything, so a refused graph leaves every tensor as it was
        for node in graph.nodes:
            if node.opdef is not None and not node.opdef.view_only and not be.supports(node):
                raise strict_refusal(be, node)
    for node in graph.nodes:
        d = node.opdef
        if d is None or d.view_only:
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
