"""Gradient mode: analytic gradients from a backend against finite differences.

For each differentiable op, a small graph is built with its float sources flagged as
parameters; the loss is ``sum(out * w)`` with a fixed random weight ``w`` (a plain sum
would give zero gradients for ops like softmax, whose rows sum to one). The backward
graph is built symbolically and computed on the backend; each parameter element is
then perturbed and the forward graph recomputed on the same backend, and the
four-point central difference ``(8 f(x+h/2) + f(x-h) - 8 f(x-h/2) - f(x+h)) / (6h)``
(in float64) is compared with the analytic gradient by the normalised squared error.
Inputs are kept away from the points where an op is not differentiable.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..autodiff import build_backward, reset
from ..context import Context
from ..errors import Unsupported
from ..graph import Graph
from ..ops import build as B
from ..ops.table import OPS, OpDef
from ..plan import plan
from ..plugin.base import Backend
from ..plugin.registry import REGISTRY
from ..tensor import Tensor
from ..types import F32, GGMLType, traits
from .cases import registrar
from .runner import FAIL, PASS, UNSUPPORTED, CaseResult, nmse, unsupported_message

DEFAULT_BOUND = 1e-4  # normalised squared error, i.e. about 1% in the L2 norm
DEFAULT_H = 1e-2


@dataclass(frozen=True)
class GradCase:
    key: str
    desc: str
    build: Callable[[Context, np.random.Generator], tuple[Tensor, list[Tensor]]] = field(repr=False)
    h: float = DEFAULT_H
    bound: float = DEFAULT_BOUND
    # Finite differences on the reference's forward instead of the backend's: for graphs whose
    # forward a backend may compute with quantized activations (a product with a block-type
    # weight), where nudging an input by h moves the result in quantization steps, not smoothly.
    numeric_on_reference: bool = False

    @property
    def name(self) -> str:
        return f"{self.key}({self.desc})"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())


def param(ctx: Context, rng: np.random.Generator, ne, lo: float = -1.0, hi: float = 1.0,
          avoid: tuple[float, ...] = (), margin: float = 0.1) -> Tensor:
    """An F32 parameter with uniform values in [lo, hi), none within ``margin`` of ``avoid``."""
    ne = tuple(ne)
    vals = rng.uniform(lo, hi, size=tuple(reversed(ne)))
    for p in avoid:
        near = np.abs(vals - p) < margin
        vals = np.where(near, p + np.copysign(margin, vals - p + 1e-12) * rng.uniform(1, 2, vals.shape), vals)
    return ctx.from_numpy(vals.astype(np.float32)).set_param()


def const(ctx: Context, rng: np.random.Generator, ne, lo: float = -1.0, hi: float = 1.0) -> Tensor:
    return ctx.from_numpy(rng.uniform(lo, hi, size=tuple(reversed(tuple(ne)))).astype(np.float32))


# ------------------------------------------------------------------ cases
GRAD_CASES: dict[str, Callable[[OpDef], Iterator[GradCase]]] = {}
grad_family = registrar(GRAD_CASES)


UNARY_GRAD = {  # key -> (lo, hi, kinks)
    "SQRT": (0.5, 2.0, ()), "LOG": (0.5, 2.0, ()), "SIN": (-3.0, 3.0, ()), "COS": (-3.0, 3.0, ()),
    "ABS": (-1.0, 1.0, (0.0,)), "RELU": (-1.0, 1.0, (0.0,)), "LEAKY_RELU": (-1.0, 1.0, (0.0,)),
    "CLAMP": (-1.0, 1.0, (-0.5, 0.5)), "EXP": (-2.0, 2.0, ()), "EXPM1": (-2.0, 2.0, ()),
    "SOFTPLUS": (-3.0, 3.0, ()), "TANH": (-2.0, 2.0, ()), "SIGMOID": (-3.0, 3.0, ()), "SILU": (-3.0, 3.0, ()),
    "GELU": (-3.0, 3.0, ()), "GELU_QUICK": (-3.0, 3.0, ()), "ELU": (-2.0, 2.0, (0.0,)),
    "HARDSIGMOID": (-4.0, 4.0, (-3.0, 3.0)), "HARDSWISH": (-4.0, 4.0, (-3.0, 3.0)),
}
UNARY_GRAD_PARAMS = {"SCALE": {"s": 0.75, "b": 0.25}, "CLAMP": {"min": -0.5, "max": 0.5},
                     "LEAKY_RELU": {"negative_slope": 0.1}}
# GELU and GELU_QUICK read F16 tables (ggml's CPU semantics): the forward steps by an F16 ulp (about
# 5e-4 relative), so a difference quotient over 1e-2 would measure the steps; over 0.25 they average
# out and the four-point formula's truncation error (h^4) stays far below the bound.
UNARY_GRAD_H = {"GELU": 0.25, "GELU_QUICK": 0.25}


@grad_family(*(k for k, d in OPS.items() if d.family == "unary" and d.differentiable))
def unary_grad(d: OpDef) -> Iterator[GradCase]:
    lo, hi, kinks = UNARY_GRAD.get(d.key, (-1.0, 1.0, ()))
    for ne in [(5, 3, 2, 1), (7, 1, 1, 1)]:
        def build(c, r, ne=ne):
            a = param(c, r, ne, lo, hi, kinks)
            return B.node(d.key, a, **UNARY_GRAD_PARAMS.get(d.key, {})), [a]
        yield GradCase(d.key, f"ne={list(ne)}", build, h=UNARY_GRAD_H.get(d.key, DEFAULT_H))


@grad_family("ADD", "SUB", "MUL", "DIV")
def binary_grad(d: OpDef) -> Iterator[GradCase]:
    lo, hi = (0.5, 1.5) if d.key == "DIV" else (-1.0, 1.0)
    for b_ne in [(4, 3, 2, 1), (4, 1, 2, 1), (1, 1, 1, 1)]:
        def build(c, r, b_ne=b_ne):
            a, b = param(c, r, (4, 3, 2, 1), lo, hi), param(c, r, b_ne, lo, hi)
            return B.node(d.key, a, b), [a, b]
        yield GradCase(d.key, f"a=[4,3,2,1],b={list(b_ne)}", build)


def _single(key: str, desc: str, ne, fn, lo=-1.0, hi=1.0, **kw) -> GradCase:
    def build(c, r):
        a = param(c, r, ne, lo, hi)
        return fn(a), [a]
    return GradCase(key, desc, build, **kw)


@grad_family("DUP", "SUM", "SUM_ROWS", "MEAN", "CONT", "TRANSPOSE")
def simple_grad(d: OpDef) -> Iterator[GradCase]:
    fn = {"DUP": B.dup, "SUM": B.sum, "SUM_ROWS": B.sum_rows, "MEAN": B.mean, "CONT": lambda a: B.cont(B.transpose(a)),
          "TRANSPOSE": B.transpose}[d.key]
    yield _single(d.key, "ne=[4,3,2,1]", (4, 3, 2, 1), fn)


@grad_family("ADD1")
def add1_grad(d):
    def build(c, r):
        a, b = param(c, r, (4, 3)), param(c, r, (1,))
        return B.add1(a, b), [a, b]
    yield GradCase(d.key, "a=[4,3],b=[1]", build)


def _region_grad(key: str):
    def build(c, r):
        a, b = param(c, r, (6, 4, 2, 1)), param(c, r, (3, 2, 1, 1))
        return B.node(key, a, b, nb1=a.nb[1], nb2=a.nb[2], nb3=a.nb[3], offset=a.nb[1] + 2 * a.nb[0]), [a, b]
    return GradCase(key, "a=[6,4,2],b=[3,2] at row 1 col 2", build)


@grad_family("ACC", "SET")
def region_grad(d):
    yield _region_grad(d.key)


@grad_family("REPEAT")
def repeat_grad(d):
    def build(c, r):
        a = param(c, r, (3, 2, 1, 1))
        return B.repeat(a, c.new_tensor(F32, (6, 4, 2, 1))), [a]
    yield GradCase(d.key, "[3,2]->[6,4,2]", build)


@grad_family("REPEAT_BACK")
def repeat_back_grad(d):
    def build(c, r):
        a = param(c, r, (6, 4, 2, 1))
        return B.repeat_back(a, c.new_tensor(F32, (3, 2, 1, 1))), [a]
    yield GradCase(d.key, "[6,4,2]->[3,2]", build)


@grad_family("CONCAT")
def concat_grad(d):
    for dim in range(3):
        def build(c, r, dim=dim):
            ne_b = [3, 2, 2, 1]
            ne_b[dim] = 1
            a, b = param(c, r, (3, 2, 2, 1)), param(c, r, ne_b)
            return B.node("CONCAT", a, b, dim=dim), [a, b]
        yield GradCase(d.key, f"dim={dim}", build)


@grad_family("RMS_NORM", "NORM")
def norm_grad(d):
    fn = B.rms_norm if d.key == "RMS_NORM" else B.norm
    yield _single(d.key, "ne=[8,3,2],eps=1e-6", (8, 3, 2, 1), lambda a: fn(a, 1e-6), -2.0, 2.0)


@grad_family("MUL_MAT")
def mul_mat_grad(d):
    for a_ne, b_ne in [((5, 3, 1, 1), (5, 4, 1, 1)), ((4, 3, 2, 1), (4, 2, 4, 1)), ((4, 2, 1, 2), (4, 3, 2, 4))]:
        def build(c, r, a_ne=a_ne, b_ne=b_ne):
            a, b = param(c, r, a_ne), param(c, r, b_ne)
            return B.mul_mat(a, b), [a, b]
        yield GradCase(d.key, f"a={list(a_ne)},b={list(b_ne)}", build)
    def build_t(c, r):
        a, b = param(c, r, (4, 3)), param(c, r, (2, 4))
        return B.mul_mat(a, B.transpose(b)), [a, b]
    yield GradCase(d.key, "b transposed", build_t)
    # a frozen quantized weight: the gradient reaches its f32 input (OUT_PROD with the block-type weight)
    for t, k in ((GGMLType.Q4_K, 256), (GGMLType.Q8_0, 32), (GGMLType.Q4_0, 32)):
        def build_q(c, r, t=t, k=k):
            w = c.from_numpy(r.standard_normal((5, k)).astype(np.float32), type=t)
            x = param(c, r, (k, 1))
            return B.mul_mat(w, x), [x]
        yield GradCase(d.key, f"frozen {traits(t).name} weight [{k},5], f32 input", build_q,
                       numeric_on_reference=True)


@grad_family("CPY")
def cpy_grad(d):
    def build(c, r):
        a = param(c, r, (4, 3))
        return B.cpy(a, c.new_tensor(F32, (6, 2))), [a]
    yield GradCase(d.key, "[4,3]->[6,2]", build)


@grad_family("RESHAPE", "VIEW", "PERMUTE")
def view_grad(d):
    fn = {"RESHAPE": lambda a: B.reshape(a, (6, 4)),
          "VIEW": lambda a: B.view_2d(a, 2, 3, a.nb[1], a.nb[0]),
          "PERMUTE": lambda a: B.permute(a, 2, 0, 1, 3)}[d.key]
    yield _single(d.key, "ne=[4,3,2]", (4, 3, 2, 1), fn)


@grad_family("GET_ROWS")
def get_rows_grad(d):
    def build(c, r):
        a = param(c, r, (4, 5))
        idx = c.from_numpy(np.array([3, 0, 3, 1], np.int32))
        return B.get_rows(a, idx), [a]
    yield GradCase(d.key, "rows [3,0,3,1] of [4,5]", build)


@grad_family("DIAG_MASK_INF", "DIAG_MASK_ZERO")
def diag_mask_grad(d):
    def build(c, r):
        a = param(c, r, (5, 5, 2, 1))
        out = B.node(d.key, a, n_past=1)
        return (B.soft_max(out) if d.key == "DIAG_MASK_INF" else out), [a]  # -inf needs a softmax after it
    yield GradCase(d.key, "ne=[5,5,2],n_past=1", build)


@grad_family("SOFT_MAX")
def soft_max_grad(d):
    def build(c, r):
        a = param(c, r, (6, 3, 2, 1), -2, 2)
        return B.soft_max_ext(a, const(c, r, (6, 3, 1, 1)), scale=0.7), [a]
    yield GradCase(d.key, "ne=[6,3,2],mask,scale=0.7", build)
    yield _single(d.key, "ne=[7,2],plain", (7, 2, 1, 1), B.soft_max, -2.0, 2.0)


@grad_family("CROSS_ENTROPY_LOSS")
def cross_entropy_grad(d):
    def build(c, r):
        a = param(c, r, (5, 3), -2, 2)
        labels = r.uniform(0, 1, (3, 5))
        labels /= labels.sum(axis=1, keepdims=True)  # distributions: the rule assumes rows sum to 1
        return B.cross_entropy_loss(a, c.from_numpy(labels.astype(np.float32))), [a]
    yield GradCase(d.key, "logits [5,3], label distributions", build)

    def build_ids(c, r):
        a = param(c, r, (5, 3), -2, 2)
        return B.cross_entropy_loss(a, c.from_numpy(r.integers(0, 5, 3).astype(np.int32))), [a]
    yield GradCase(d.key, "logits [5,3], class indices", build_ids)


@grad_family("SWIGLU")
def swiglu_grad(d):
    def build(c, r):
        a, b = param(c, r, (6, 2), -2, 2), param(c, r, (6, 2))
        return B.swiglu_split(a, b), [a, b]
    yield GradCase(d.key, "split [6,2]", build)


@grad_family("GEGLU")
def geglu_grad(d):
    def build(c, r):
        a, b = param(c, r, (6, 2), -3, 3), param(c, r, (6, 2))
        return B.geglu_split(a, b), [a, b]
    yield GradCase(d.key, "split [6,2]", build, h=UNARY_GRAD_H["GELU"])  # its GELU reads the F16 table


def grad_cases(ops: list[str] | None = None) -> list[GradCase]:
    keys = list(OPS) if not ops else [k.upper() for k in ops]
    return [c for k in keys if k in GRAD_CASES for c in GRAD_CASES[k](OPS[k])]


# ------------------------------------------------------------------ running
def _loss_value(loss: Tensor) -> float:
    return float(loss.numpy().reshape(-1)[0])


def run_grad_case(case: GradCase, backend: Backend) -> CaseResult:
    ctx = Context()
    rng = np.random.default_rng(case.seed)
    out, params = case.build(ctx, rng)
    weight = const(ctx, rng, out.ne)
    loss = B.sum(B.mul(out, weight)) if out.nelements > 1 else B.scale(out, 1.0)
    loss.set_loss()
    forward = Graph().expand(loss)
    graph = Graph(capacity=4096).expand(loss)
    try:
        build_backward(graph)
    except Unsupported as e:
        return CaseResult(case, backend.name, FAIL, f"no backward graph: {e}")
    missing = [n for n in graph.nodes if n.opdef is not None and not n.opdef.view_only and not backend.supports(n)]
    if missing:
        return CaseResult(case, backend.name, UNSUPPORTED, unsupported_message(backend, missing))
    try:
        reset(graph)
        plan(graph, backend, strict=True, reuse=False).compute()
        analytic = [graph.grad(p).numpy().astype(np.float64) if graph.grad(p) is not None else None
                    for p in params]
        numeric = []
        forward_plan = plan(forward, REGISTRY.reference() if case.numeric_on_reference else backend,
                            strict=True, reuse=False)
        for p in params:
            values = p.numpy().astype(np.float64)
            num = np.zeros_like(values)
            for idx in itertools.product(*map(range, values.shape)):
                f = {}
                for step in (-1.0, -0.5, 0.5, 1.0):
                    v = values.copy()
                    v[idx] += step * case.h
                    p.set(v)
                    forward_plan.compute()
                    f[step] = _loss_value(loss)
                num[idx] = (8 * f[0.5] + f[-1.0] - 8 * f[-0.5] - f[1.0]) / (6 * case.h)
            p.set(values)
            numeric.append(num)
    except Exception as e:  # noqa: BLE001 - a kernel's crash fails this case only
        return CaseResult(case, backend.name, FAIL, f"raised {type(e).__name__}: {e}")
    worst_err = 0.0
    for p, a, n in zip(params, analytic, numeric):
        if a is None:
            return CaseResult(case, backend.name, FAIL, f"no gradient for parameter {p.label}")
        if not np.all(np.isfinite(a)):
            return CaseResult(case, backend.name, FAIL, f"non-finite gradient for {p.label}")
        err = nmse(n.reshape(-1), a.reshape(-1))  # normalised by the finite differences
        worst_err = max(worst_err, err)
        if err > case.bound:
            i = int(np.argmax(np.abs(a - n)))
            return CaseResult(case, backend.name, FAIL, f"gradient of {p.label} differs from finite differences",
                              err, case.bound, (i, float(n.reshape(-1)[i]), float(a.reshape(-1)[i])))
    return CaseResult(case, backend.name, PASS, "", worst_err, case.bound)


def run_grad(backend: Backend, cases: list[GradCase]) -> list[CaseResult]:
    REGISTRY.reference()  # the reference must exist, as in forward mode
    return [run_grad_case(c, backend) for c in cases]



