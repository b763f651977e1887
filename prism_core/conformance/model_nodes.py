"""Which node of a model's graph a backend gets wrong: the graph run node by node against the reference.

The model computes one batched pass of the prompt on the backend with every result kept (a tap flags
them all as outputs, so no memory is reused). Then, in graph order, each node is computed by the
reference (its sources hold the reference's values by then), that result is saved, the backend computes
the same node from the same sources, and its result is judged against the saved one with the op's own
conformance bounds (:func:`.runner.judge`: NMSE and the per-element ulp bound) before the reference's
value is put back for the nodes after it. Every node thus sees exactly the reference's inputs, so an op
that is wrong shows up at its own nodes and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from ..graph import Graph
from ..plugin.base import Backend
from ..schedule import computes_nothing
from ..tensor import Tensor
from .runner import Verdict, judge, quiet_reference


@dataclass
class NodeFinding:
    """A node whose result on the backend leaves its op's bounds, from the reference's inputs."""

    index: int  # in the graph's node order
    n_nodes: int
    op: str
    where: str  # the weight the node's result goes into next, e.g. blk.3.ffn_norm.weight
    node: str  # the node's label (its name when it has one)
    verdict: Verdict

    def __str__(self) -> str:
        v = self.verdict
        err = f"nmse {v.err:.3g} (bound {v.bound:.3g})" if v.err is not None else ""
        worst = f"; worst element {list(v.worst[0]) if isinstance(v.worst[0], tuple) else v.worst[0]}: " \
                f"expected {v.worst[1]:.6g}, got {v.worst[2]:.6g}" if v.worst else ""
        return (f"{self.op} node #{self.index} of {self.n_nodes} {self.node}, before {self.where}: "
                f"{v.message or 'exceeds the bound'}{'; ' + err if err else ''}{worst}")


def _next_weights(graph: Graph) -> list[str]:
    """For each node, the first model weight read at or after it in graph order (where in the model it is)."""
    out, nxt = [""] * len(graph.nodes), "the logits"
    for i in range(len(graph.nodes) - 1, -1, -1):
        for s in graph.nodes[i].src:
            name = s.base.name if s is not None else ""
            if s is not None and s.base.opdef is None and name.endswith(".weight"):
                nxt = name
        out[i] = nxt
    return out


def sweep_graph(graph: Graph, backend: Backend, reference: Backend) -> list[NodeFinding]:
    """Every node of ``graph`` (computed, every result kept) on ``backend`` from the reference's values of
    its sources, judged against the reference's result; the nodes out of bounds, in graph order."""
    where = _next_weights(graph)
    findings = []
    n = len(graph.nodes)
    for i, node in enumerate(graph.nodes):
        if computes_nothing(node):
            continue
        with quiet_reference():
            _call(reference, node)
        expected, saved = node.numpy(), node.storage().copy()
        if not backend.supports(node):
            continue  # the reference computes it in the model too
        try:
            _call(backend, node)
            got = node.numpy()
        except Exception as e:  # noqa: BLE001 - a kernel that raises is that node's finding
            v = Verdict(False, f"raised {type(e).__name__}: {e}", None, 0.0, None, None, False)
        else:
            v = judge(node, node, got, expected)
        node.storage()[...] = saved
        if not v.ok:
            findings.append(NodeFinding(i, n, node.opdef.key, where[i], node.label, v))
    return findings


def _call(backend: Backend, node: Tensor) -> None:
    (backend.prepare(node) or partial(backend.compute, node))()


class _EveryNode:
    """A model tap (:meth:`prism_core.models.Model.tap`) keeping every result and sweeping the graph once
    the model has computed it."""

    def __init__(self, backend: Backend, reference: Backend) -> None:
        self.backend, self.reference = backend, reference
        self.findings: list[NodeFinding] | None = None

    def select(self, graph: Graph) -> Graph:
        from ..ops.build import view_1d
        from ..tensor import Flag
        for node in graph.nodes:
            if node.view_src is None and node.opdef is not None:
                node.set_output()
        for leaf in list(graph.leafs):  # a view read last keeps each input's memory to the end of the graph
            if leaf.flags & Flag.INPUT and leaf.is_contiguous():
                graph.expand(view_1d(leaf, leaf.nelements))
        return graph

    def collect(self, graph: Graph) -> None:
        if self.findings is None:
            self.findings = sweep_graph(graph, self.backend, self.reference)


def sweep(model, ids: Sequence[int], reference: Backend) -> list[NodeFinding]:
    """One batched pass of ``ids`` through ``model`` (on its backend), swept node by node against
    ``reference`` (see the module doc)."""
    tap = _EveryNode(model.backend, reference)
    model.tap(tap)
    try:
        with model.new_sequence("certification: node sweep") as seq:
            seq.eval(list(ids), all_logits=False)
    finally:
        model.tap(None)
    return tap.findings or []
