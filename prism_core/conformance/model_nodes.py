"""Which node of a model's graph a backend gets wrong: the graph run node by node against the reference.

The model computes one batched pass of the prompt (or one decode step after it) on the backend with every
result kept (a tap flags
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
from .model_cert import TAIL
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
    step: str = "a batched pass"  # or "a decode step": which graph of the model

    def __str__(self) -> str:
        v = self.verdict
        err = f"nmse {v.err:.3g} (bound {v.bound:.3g})" if v.err is not None else ""
        worst = f"; worst element {list(v.worst[0]) if isinstance(v.worst[0], tuple) else v.worst[0]}: " \
                f"expected {v.worst[1]:.6g}, got {v.worst[2]:.6g}" if v.worst else ""
        return (f"{self.op} node #{self.index} of {self.n_nodes} {self.node} in {self.step}, before {self.where}: "
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
            if not v.ok and backend.activation_precision == "q8" and _q8_product(node):
                v = q8_product_verdict(node, got, expected)
        node.storage()[...] = saved
        if not v.ok:
            findings.append(NodeFinding(i, n, node.opdef.key, where[i], node.label, v))
    return findings


# A Q8 activation value is off by at most half its step, its block's max / 254: uniform rounding, rms that
# over sqrt(3), independent from value to value, so a product's element is off by about
# sqrt(sum_k (step_k w_k)^2 / 3) and by at most TAIL times that; the block scale's fp16 rounding (2^-11,
# the same for a whole block), Q8_1's rounded block sums and the float32 accumulation stay under
# 2^-10 of sum_k |x_k w_k|.
SCALE_ROUNDING = 2.0**-10
_ROWS = 16384  # weight rows dequantized at once


def _q8_product(node: Tensor) -> bool:
    w = node.src[0]
    from ..types import GGMLType
    return (node.opdef.key == "MUL_MAT" and w.traits.is_quantized and w.ne[2] == w.ne[3] == 1
            and w.traits.vec_dot_type in (GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K))


def q8_product_verdict(node: Tensor, got, ref) -> Verdict:
    """A block-weight product of a backend quantizing its activations (``activation_precision`` "q8"):
    every element within the error quantizing the activations allows (see above), instead of the op's NMSE
    bound (on a model's heavy-tailed activations the rounding alone can exceed it)."""
    import numpy as np

    from ..quant import dequantize
    from ..types import traits
    w, x = node.src[0], node.src[1]
    k, n = w.ne[0], w.ne[1]
    blk = traits(w.traits.vec_dot_type).blck_size
    xs = np.asarray(x.numpy(), np.float64).reshape(-1, k)
    half_step = np.repeat(np.abs(xs).reshape(len(xs), -1, blk).max(axis=2), blk, axis=1) / 254
    err = np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64)).reshape(-1, n)
    raw = w.raw().reshape(n, -1)
    worst = (0.0, 0, 0)
    for lo in range(0, n, _ROWS):
        wd = np.abs(dequantize(raw[lo:lo + _ROWS], w.type).astype(np.float64))
        bound = TAIL * np.sqrt((half_step**2 / 3) @ (wd**2).T) + SCALE_ROUNDING * (np.abs(xs) @ wd.T)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bound > 0, err[:, lo:lo + _ROWS] / bound, np.where(err[:, lo:lo + _ROWS] > 0, np.inf, 0))
        j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        if ratio[j] > worst[0]:
            worst = (float(ratio[j]), int(j[0]), lo + int(j[1]))
    r, (row, col) = worst[0], worst[1:]
    idx = (col, row, 0, 0)
    el = (idx, float(np.asarray(ref).reshape(-1, n)[row, col]), float(np.asarray(got).reshape(-1, n)[row, col]))
    if r > 1:
        return Verdict(False, f"element {list(idx)} is {r:.3g} times the error quantizing the activations to "
                       f"{traits(w.traits.vec_dot_type).name} allows", None, 0.0, el, None, False)
    return Verdict(True, "", None, 0.0, el, None, False)


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


def sweep(model, ids: Sequence[int], reference: Backend, *, decode: bool = False) -> list[NodeFinding]:
    """One batched pass of ``ids`` through ``model`` (on its backend), swept node by node against
    ``reference`` (see the module doc); with ``decode``, the last token's decode step after the others are
    prefilled (the prefill's cache is the backend's, and both sides compute each node from it alike)."""
    tap = _EveryNode(model.backend, reference)
    ids = list(ids)
    with model.new_sequence("certification: node sweep") as seq:
        if decode and len(ids) > 1:
            seq.eval(ids[:-1])
            ids = ids[-1:]
        model.tap(tap)
        try:
            seq.eval(ids)
        finally:
            model.tap(None)
    for f in tap.findings or []:
        f.step = "a decode step" if decode else "a batched pass"
    return tap.findings or []
