"""Kernel mutations: near-misses a backend author could make, applied to the reference one at a
time, which the suite must catch (tests/test_mutations.py; ``mutation_score`` reports the share).

Each mutation replaces one kernel of the reference with a subtly wrong one: a formula variant
that differs by 1e-4 (tanh GELU for erf GELU), a single wrongly masked element, eps outside the
square root, a missing ALiBi slope, an off-by-one causal mask, RoPE's pairs in the NEOX layout,
F16 results truncated instead of rounded, ties rounded to even. A mutant runs only the cases of
the op it changes, so the whole list runs in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from ..ops.codes import RopeMode
from ..plugin.base import Backend, Kernel
from ..plugin.registry import REGISTRY
from ..tensor import Tensor
from ..types import F16, from_f32, to_f32

Mutator = Callable[[Kernel, Tensor], None]  # (the reference's kernel, node): writes the node's result


@dataclass(frozen=True)
class Mutation:
    name: str
    key: str  # the op whose kernel is replaced
    what: str
    kernel: Mutator


def _values(t: Tensor) -> np.ndarray:
    return to_f32(t.host(), t.type).astype(np.float64)


def _store(node: Tensor, x: np.ndarray) -> None:
    node.host()[...] = from_f32(np.asarray(x, np.float32), node.type)


def _with_params(node: Tensor, **changed) -> Callable[[Kernel], None]:
    def run(ref: Kernel) -> None:
        saved = node.params
        node.params = MappingProxyType({**saved, **changed})
        try:
            ref(node)
        finally:
            node.params = saved
    return run


def _gelu_tanh(ref: Kernel, n: Tensor) -> None:
    x = _values(n.src[0])
    _store(n, 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x))))


def _one_masked_element(ref: Kernel, n: Tensor) -> None:
    ref(n)
    y = _values(n).reshape(-1, n.ne[0])
    last = y[-1].copy()
    last[-1] = 0.0  # the last element of the last row treated as masked, the row renormalised
    y[-1] = last / last.sum() if last.sum() > 0 else last
    _store(n, y.reshape(tuple(reversed(n.ne))))


def _eps_outside_sqrt(ref: Kernel, n: Tensor) -> None:
    x = _values(n.src[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        _store(n, x / (np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) + n.params["eps"]))


def _no_alibi(ref: Kernel, n: Tensor) -> None:
    _with_params(n, max_bias=0.0)(ref)  # slope 1 for every head


def _mask_off_by_one(ref: Kernel, n: Tensor) -> None:
    _with_params(n, n_past=n.params["n_past"] + 1)(ref)


def _rope_neox_pairs(ref: Kernel, n: Tensor) -> None:
    mode = n.params["mode"]
    _with_params(n, mode=RopeMode.NEOX if mode == RopeMode.NORMAL else mode)(ref)


def _f16_truncated(ref: Kernel, n: Tensor) -> None:
    ref(n)
    if n.type != F16:
        return
    exact = _values(n.src[0]) + np.broadcast_to(_tile(_values(n.src[1]), n.src[0].ne), _values(n.src[0]).shape)
    h = exact.astype(np.float16)
    toward_zero = np.where(np.abs(h.astype(np.float64)) > np.abs(exact), np.nextafter(h, np.float16(0)), h)
    n.host()[...] = toward_zero


def _tile(b: np.ndarray, ne_a: tuple[int, ...]) -> np.ndarray:
    shape = tuple(reversed(ne_a))
    return np.tile(b, tuple(s // m for s, m in zip(shape, b.shape)))


def _round_half_even(ref: Kernel, n: Tensor) -> None:
    _store(n, np.rint(_values(n.src[0])))


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("gelu-tanh-for-erf", "GELU_ERF", "the tanh approximation where erf GELU is meant", _gelu_tanh),
    Mutation("softmax-one-masked", "SOFT_MAX", "one element of one row wrongly masked (the row renormalised)",
             _one_masked_element),
    Mutation("rms-norm-eps-outside-sqrt", "RMS_NORM", "x / (sqrt(mean(x^2)) + eps) for x / sqrt(mean(x^2) + eps)",
             _eps_outside_sqrt),
    Mutation("softmax-missing-alibi-slope", "SOFT_MAX", "the mask added without the ALiBi slope", _no_alibi),
    Mutation("diag-mask-off-by-one", "DIAG_MASK_INF", "the causal mask one column late", _mask_off_by_one),
    Mutation("rope-neox-pairs-for-normal", "ROPE", "NORMAL mode rotating NEOX's pairs (k, k + n/2)",
             _rope_neox_pairs),
    Mutation("f16-rounding-by-truncation", "ADD", "F16 results rounded toward zero, not to nearest even",
             _f16_truncated),
    Mutation("round-half-to-even", "ROUND", "ties to even (rint) where C's roundf rounds half away from zero",
             _round_half_even),
)


def mutant(m: Mutation, reference: Backend | None = None) -> Backend:
    """The reference backend with ``m``'s kernel in place of its own (no prepared fast paths)."""
    ref = reference or REGISTRY.reference()
    original = ref.kernels[m.key]

    class Mutant(Backend):
        name = f"mutant-{m.name}"
        kernels = {**ref.kernels, m.key: lambda node: m.kernel(original, node)}
        block_types = ref.block_types

    return Mutant()


def caught(m: Mutation) -> tuple[bool, str]:
    """Whether the suite fails at least one of the op's cases on the mutant, and the first
    failure (or why not)."""
    from .cases import cases_for
    from .runner import run
    results = run(mutant(m), cases_for(m.key), timeout=None)
    failed = [r for r in results if r.failed]
    return (bool(failed), failed[0].describe() if failed else f"all {len(results)} {m.key} cases passed")


def mutation_score() -> tuple[int, int, list[str]]:
    """(mutations caught, mutations, names of those that slipped through)."""
    missed = [m.name for m in MUTATIONS if not caught(m)[0]]
    return len(MUTATIONS) - len(missed), len(MUTATIONS), missed
