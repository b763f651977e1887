"""The compute graph: forward expansion into a topological order (ggml_build_forward_expand).

Sources are visited depth-first, left to right, and each tensor is appended after its
sources, once. Tensors with op NONE that are not parameters are *leafs* (inputs and
constants); everything else is a *node* that a backend computes. Both lists share a
capacity bound; an expansion that would exceed it raises and adds nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import BoundExceeded, InvalidArgument
from .ops.codes import Op
from .tensor import Flag, Tensor

DEFAULT_GRAPH_SIZE = 2048


class Graph:
    def __init__(self, capacity: int = DEFAULT_GRAPH_SIZE) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise InvalidArgument(f"Graph: capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._seen: set[int] = set()
        self.grads: dict[Tensor, Tensor] = {}  # filled by build_backward
        self.grad_accs: dict[Tensor, Tensor] = {}

    def grad(self, tensor: Tensor) -> Tensor | None:
        """The gradient of the loss w.r.t. ``tensor`` (None if it needs none)."""
        return self.grads.get(tensor)

    def grad_acc(self, tensor: Tensor) -> Tensor | None:
        """``tensor``'s gradient accumulator, if it has one (losses always do)."""
        return self.grad_accs.get(tensor)

    def _state(self) -> tuple:
        return list(self.nodes), list(self.leafs), set(self._seen), dict(self.grads), dict(self.grad_accs)

    def _restore(self, state: tuple) -> None:
        nodes, leafs, seen, grads, accs = state
        self.nodes[:], self.leafs[:] = nodes, leafs
        self._seen, self.grads, self.grad_accs = seen, grads, accs

    def expand(self, tensor: Tensor) -> Graph:
        """Add ``tensor`` and every tensor it depends on (sources first)."""
        if not isinstance(tensor, Tensor):
            raise InvalidArgument(f"Graph.expand: expected a Tensor, got {type(tensor).__name__}")
        new_nodes: list[Tensor] = []
        new_leafs: list[Tensor] = []
        seen = set(self._seen)
        stack: list[tuple[Tensor, int]] = [(tensor, 0)]
        while stack:  # iterative post-order DFS, so deep chains do not hit the recursion limit
            t, i = stack.pop()
            if i == 0 and id(t) in seen:
                continue
            if i == 0:
                seen.add(id(t))
            if i < len(t.src):
                stack.append((t, i + 1))
                s = t.src[i]
                if s is not None and id(s) not in seen:
                    stack.append((s, 0))
                continue
            if t.op == Op.NONE and not t.flags & Flag.PARAM:
                new_leafs.append(t)
            else:
                new_nodes.append(t)
        if len(self.nodes) + len(new_nodes) > self.capacity or len(self.leafs) + len(new_leafs) > self.capacity:
            raise BoundExceeded(f"graph capacity {self.capacity} exceeded: expanding {tensor.label} needs "
                                f"{len(self.nodes) + len(new_nodes)} nodes and "
                                f"{len(self.leafs) + len(new_leafs)} leafs")
        self.nodes += new_nodes
        self.leafs += new_leafs
        self._seen = seen
        return self

    def __contains__(self, tensor: Tensor) -> bool:
        return id(tensor) in self._seen

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"Graph({len(self.nodes)} nodes, {len(self.leafs)} leafs, capacity {self.capacity})"


def build_forward(tensor: Tensor, capacity: int = DEFAULT_GRAPH_SIZE) -> Graph:
    """A new graph holding ``tensor`` and its dependencies."""
    return Graph(capacity).expand(tensor)
