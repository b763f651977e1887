"""Symbolic backward expansion (ggml_build_backward_expand), gradient lookup and reset.

Gradients are ordinary graph nodes built by the derivative rules in the op table, so
every backend computes them with its forward kernels. A graph needs a scalar F32 loss
(``set_loss``) and at least one parameter (``set_param``). Nodes that do not lead
from a parameter to the loss get no gradient. Gradients of a tensor used several times
add up. Accumulators, one per loss always and one per node when the caller supplies
it, keep summing across evaluations until :func:`reset`.

A failed expansion (unsupported derivative, bad accumulator, in-place op on the
gradient path...) raises and rolls back every tensor and graph edit it made.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from .errors import InvalidArgument, PrismError, ShapeMismatch, TypeMismatch, Unsupported
from .graph import Graph
from .ops import build as B
from .ops.codes import Op
from .ops.table import IGNORE
from .tensor import Flag, Tensor
from .types import F16, F32, I32

# ops whose result may be a view of a source and still be differentiated
_VIEW_OPS = frozenset({Op.CPY, Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})


def build_backward(graph: Graph, grad_accs: Mapping[Tensor, Tensor] | None = None) -> Graph:
    """Expand ``graph`` in place with the gradients of its loss w.r.t. every node on a
    path from a parameter. ``grad_accs`` maps forward nodes to F32 accumulators of
    their extents; the loss always gets one."""
    if not isinstance(graph, Graph):
        raise InvalidArgument(f"build_backward: expected a Graph, got {type(graph).__name__}")
    if grad_accs is not None and not isinstance(grad_accs, Mapping):
        raise InvalidArgument(f"build_backward: grad_accs must map tensors to accumulators, "
                              f"got {type(grad_accs).__name__}")
    saved = graph._state()
    contexts = {id(t.ctx): t.ctx for t in graph.nodes}
    marks = {k: c.mark() for k, c in contexts.items()}
    try:
        _expand(graph, dict(grad_accs or {}))
    except BaseException:
        for k, c in contexts.items():
            c.rollback(marks[k])
        graph._restore(saved)
        raise
    return graph


def _needs_grad_source(node: Tensor, i: int) -> bool:
    d = node.opdef
    if d is None:
        return False
    name = d.srcs[i].name if i < len(d.srcs) else None
    return d.grad.get(name) is not IGNORE


def _expand(graph: Graph, accs: dict[Tensor, Tensor]) -> None:
    forward = list(graph.nodes)
    params = [n for n in forward if n.flags & Flag.PARAM]
    losses = [n for n in forward if n.flags & Flag.LOSS]
    if not params or not losses:
        raise InvalidArgument("build_backward: the graph needs at least one parameter (set_param) and a loss "
                              f"(set_loss); it has {len(params)} parameters and {len(losses)} losses")
    in_graph = set(map(id, forward))
    for node, acc in accs.items():
        if not isinstance(node, Tensor) or id(node) not in in_graph:
            raise InvalidArgument(f"build_backward: accumulator given for {getattr(node, 'label', node)!r}, "
                                  "which is not a node of the graph")
        if not isinstance(acc, Tensor):
            raise InvalidArgument(f"build_backward: the accumulator of {node.label} must be a Tensor")
        if acc.type != F32:
            raise TypeMismatch(f"build_backward: the accumulator of {node.label} must be f32, "
                               f"is {acc.traits.name}")
        if acc.ne != node.ne:
            raise ShapeMismatch(f"build_backward: the accumulator of {node.label} has ne={list(acc.ne)}, "
                                f"the node has ne={list(node.ne)}")
        if acc.ctx is not node.ctx:
            raise InvalidArgument(f"build_backward: the accumulator of {node.label} belongs to another context")
        # gradients are added into it in place and reset() zeroes it: it must be memory of its own
        if acc.op != Op.NONE or acc.view_src is not None or acc.flags & Flag.PARAM or id(acc) in in_graph:
            raise InvalidArgument(f"build_backward: the accumulator of {node.label} must be a leaf tensor of its "
                                  f"own (not a view, a node or a parameter of the graph), got {acc.label}")
    shared = [a for a, n in Counter(accs.values()).items() if n > 1]  # tensors hash by identity
    if shared:
        raise InvalidArgument(f"build_backward: one accumulator ({shared[0].label}) is given for several nodes")
    graph.grads.clear()
    graph.grad_accs.clear()

    needed: set[int] = set()
    for node in forward:
        if node.type == I32:
            continue
        needs = bool(node.flags & (Flag.PARAM | Flag.LOSS))
        for i, s in enumerate(node.src):
            if s is not None and id(s) in needed and _needs_grad_source(node, i):
                if s.type not in (F32, F16):
                    frozen = ("; quantization is not differentiable: keep block-type weights frozen and train "
                              "f32 tensors beside them (a LoRA-style adapter)") if s.traits.is_quantized else ""
                    raise TypeMismatch(f"build_backward: {s.label} needs a gradient but has type "
                                       f"{s.traits.name}; only f32 and f16 tensors are differentiable{frozen}")
                needs = True
        if not needs:
            continue
        if node.view_src is not None and node.op not in _VIEW_OPS:
            raise InvalidArgument(f"build_backward: {node.label} is an in-place result (a view of "
                                  f"{node.view_src.label}) on the gradient path; build it without _inplace")
        if node.flags & Flag.LOSS and (node.type != F32 or node.nelements != 1):
            raise InvalidArgument(f"build_backward: the loss {node.label} must be a scalar f32")
        acc = accs.get(node)
        if acc is None and node.flags & Flag.LOSS:
            acc = node.ctx.new_tensor(F32, node.ne, _grad_name(node))
        if acc is not None:
            graph.grads[node] = acc
            graph.grad_accs[node] = acc
        needed.add(id(node))

    for node in reversed(forward):
        g = graph.grads.get(node)
        if g is None:
            continue
        d = node.opdef
        for i, s in enumerate(node.src):
            if s is None or id(s) not in needed or not _needs_grad_source(node, i):
                continue
            rule = d.grad.get(d.srcs[i].name) if d is not None else None
            if rule is None:
                reason = (d.nograd if d is not None else "") or "no derivative rule"
                raise Unsupported(f"build_backward: cannot differentiate {node.label} with respect to its source "
                                  f"{d.srcs[i].name if d else i!r} ({s.label}): {reason}")
            _add_or_set(graph, s, rule(B, node, g))


def _grad_name(t: Tensor) -> str:
    name = f"grad for {t.name}" if t.name else "grad"
    return name.encode()[:63].decode(errors="ignore")


def _add_or_set(graph: Graph, src: Tensor, contribution: Tensor) -> None:
    if contribution.ne != src.ne:
        raise PrismError(f"internal: the gradient contribution for {src.label} has ne={list(contribution.ne)}, "
                         f"expected {list(src.ne)}")
    old = graph.grads.get(src)
    if old is None:
        new = contribution
    elif src in graph.grad_accs:
        new = B.add_inplace(old, contribution)  # accumulators sum across evaluations until reset
    else:
        new = B.add(old, contribution)
    if not new.name:
        new.name = _grad_name(src)
    graph.grads[src] = new
    graph.expand(new)


def reset(graph: Graph) -> None:
    """Loss gradients to 1; other accumulators and AdamW moments to 0 (ggml_graph_reset)."""
    if not isinstance(graph, Graph):
        raise InvalidArgument(f"reset: expected a Graph, got {type(graph).__name__}")
    for node in graph.nodes:
        if node.op == Op.OPT_STEP_ADAMW:
            node.src[2].set(0.0)
            node.src[3].set(0.0)
        acc = graph.grad_accs.get(node)
        if acc is not None:
            acc.set(1.0 if node.flags & Flag.LOSS else 0.0)
