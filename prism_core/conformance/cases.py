"""Conformance cases: for every op in the table, a family of small graphs.

A case builds its graph from a seed, so the reference and the backend under test
get identical inputs in separate contexts. Families follow ggml's test-backend-ops:
several shapes, each type the op accepts, non-contiguous (row-gap views and permuted)
inputs, broadcasting where the op allows it, in-place variants, edge values.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..context import Context
from ..ops import build as B
from ..ops.codes import GluOp, SortOrder, UnaryOp
from ..ops.table import OPS, OpDef
from ..tensor import Tensor
from ..types import BF16, F16, F32, I32, GGMLType, traits


@dataclass(frozen=True)
class Built:
    out: Tensor
    extra: tuple[Tensor, ...] = ()  # other tensors the op writes (e.g. AdamW moments)


@dataclass(frozen=True)
class Case:
    key: str
    desc: str
    build: Callable[[Context, np.random.Generator], Built] = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.key}({self.desc})"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())


_RANDOM_DESC = re.compile(r"random (\d+) seed=(\d+):")


def case_id(case: Any) -> str:
    """A case's stable id (see :mod:`.replay`): ``KEY:xxxxxxxx`` (a CRC-32 of the description) for
    a fixed case, ``KEY:gxxxxxxxx`` for a gradient case, ``KEY:r<seed>.<i>`` for random case i."""
    m = _RANDOM_DESC.match(case.desc)
    if m and isinstance(case, Case):
        return f"{case.key}:r{m.group(2)}.{m.group(1)}"
    tag = "" if isinstance(case, Case) else "g"
    return f"{case.key}:{tag}{zlib.crc32(case.desc.encode()):08x}"


def replay_command(backend: str, case: Any) -> str:
    """The one command that re-runs exactly ``case`` on ``backend``."""
    return f"prism conformance --backend {backend} --case {case_id(case)}"


# ------------------------------------------------------------------ inputs
def leaf(ctx: Context, rng: np.random.Generator, t: GGMLType, ne, lo: float = -1.0, hi: float = 1.0,
         layout: str = "contiguous") -> Tensor:
    """A leaf of extents ``ne`` filled with uniform values in [lo, hi).

    layout ``rowgap``: a view whose rows are followed by unused elements;
    ``permuted``: dims 0 and 1 swapped in memory (a transposed view);
    ``permuted3``: a view through permute(2, 0, 1, 3)."""
    ne = tuple(ne) + (1,) * (4 - len(ne))
    if layout == "contiguous":
        base = ctx.new_tensor(t, ne)
        view = base
    elif layout == "rowgap":
        base = ctx.new_tensor(t, (ne[0] + 3, *ne[1:]))
        view = B.view_4d(base, *ne, base.nb[1], base.nb[2], base.nb[3], 0)
    elif layout in ("permuted", "permuted3"):
        axes = (1, 0, 2, 3) if layout == "permuted" else (2, 0, 1, 3)
        base_ne = [0] * 4
        for k, ax in enumerate(axes):  # permute moves base dim k to position ax
            base_ne[k] = ne[ax]
        base = ctx.new_tensor(t, base_ne)
        view = B.permute(base, *axes)
    else:
        raise ValueError(layout)
    if t in (F32, F16, BF16):
        base.set(rng.uniform(lo, hi, size=tuple(reversed(base.ne))).astype(np.float32))
    else:
        base.set(rng.integers(int(lo), int(hi), size=tuple(reversed(base.ne))))
    return view


def _types(d: OpDef, src: int = 0) -> list[GGMLType]:
    return [t for t in (F32, F16, BF16) if t in d.srcs[src].types]


def dims(ne) -> str:
    return "[" + ",".join(str(int(x)) for x in ne) + "]"


def tname(*ts: GGMLType) -> str:
    return "/".join(traits(t).name for t in ts)


# ------------------------------------------------------------------ families
CASES: dict[str, Callable[[OpDef], Iterator[Case]]] = {}


def registrar(table: dict) -> Callable:
    """A decorator factory filing a case generator under op keys in ``table``."""
    def register(*keys: str):
        def deco(f):
            for k in keys:
                table[k] = f
            return f
        return deco
    return register


family = registrar(CASES)

# More generators per op, beside its family (edge values, zero extents: cases_edges.py)
EXTRA: dict[str, list[Callable[[OpDef], Iterator[Case]]]] = {}


def extra(*keys: str):
    def deco(f):
        for k in keys:
            EXTRA.setdefault(k, []).append(f)
        return f
    return deco


UNARY_RANGE = {"SQRT": (0.1, 4.0), "LOG": (0.1, 4.0), "EXP": (-3.0, 3.0), "EXPM1": (-3.0, 3.0),
               "SOFTPLUS": (-25.0, 25.0), "FLOOR": (-4.0, 4.0), "CEIL": (-4.0, 4.0), "ROUND": (-4.0, 4.0),
               "TRUNC": (-4.0, 4.0), "HARDSWISH": (-5.0, 5.0), "HARDSIGMOID": (-5.0, 5.0),
               "ELU": (-3.0, 3.0), "GELU": (-4.0, 4.0), "GELU_ERF": (-4.0, 4.0)}
# zeros, halves (rounding ties), thresholds (softplus at 20, gelu tails), large and tiny magnitudes
EDGE_VALUES = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 1.0, -1.0, 3.0, -3.0, 6.0, 20.0, 21.0, -20.0,
                        1e-4, -1e-4, 10.0, -10.0, 30.0, -30.0, 1e-30, 80.0], np.float32)
UNARY_PARAMS = {"SCALE": {"s": 0.75, "b": 0.25}, "CLAMP": {"min": -0.5, "max": 0.5},
                "LEAKY_RELU": {"negative_slope": 0.1}}


@family(*(d.key for d in OPS.values() if d.family == "unary"))
def unary_cases(d: OpDef) -> Iterator[Case]:
    lo, hi = UNARY_RANGE.get(d.key, (-2.0, 2.0))
    params = UNARY_PARAMS.get(d.key, {})
    for ne, t, layout in itertools.product([(128, 2, 2, 2), (5, 7, 11, 13)], _types(d), ("contiguous", "rowgap")):
        yield Case(d.key, f"ne={dims(ne)},{tname(t)},{layout}",
                   lambda c, r, ne=ne, t=t, layout=layout: Built(B.node(d.key, leaf(c, r, t, ne, lo, hi, layout),
                                                                        **params)))
    yield Case(d.key, "ne=[7,5,3,2],f32,permuted",
               lambda c, r: Built(B.node(d.key, leaf(c, r, F32, (7, 5, 3, 2), lo, hi, "permuted"), **params)))
    edge = EDGE_VALUES[(EDGE_VALUES > 0) if d.key in ("SQRT", "LOG") else slice(None)]
    for t in _types(d):
        yield Case(d.key, f"edge values {edge.size},{tname(t)}",
                   lambda c, r, t=t: Built(B.node(d.key, c.from_numpy(edge, t), **params)))
    if d.inplace:
        yield Case(d.key, "ne=[16,3,2,1],f32,inplace",
                   lambda c, r: Built(B.node(d.key, leaf(c, r, F32, (16, 3, 2, 1), lo, hi), inplace=True, **params)))


@family("ADD", "SUB", "MUL", "DIV")
def binary_cases(d: OpDef) -> Iterator[Case]:
    lo, hi = (0.5, 2.0) if d.key == "DIV" else (-1.0, 1.0)
    a_ne = (10, 5, 4, 3)
    for b_ne in [(10, 5, 4, 3), (1, 1, 1, 1), (10, 1, 1, 1), (10, 5, 1, 1), (5, 5, 2, 3), (1, 5, 4, 1)]:
        for ta, tb in [(F32, F32), (F16, F32), (F16, F16), (BF16, F32)]:
            if (ta, tb) != (F32, F32) and b_ne not in [(10, 5, 4, 3), (10, 1, 1, 1)]:
                continue
            yield Case(d.key, f"a={dims(a_ne)},b={dims(b_ne)},{tname(ta, tb)}",
                       lambda c, r, b_ne=b_ne, ta=ta, tb=tb: Built(B.node(
                           d.key, leaf(c, r, ta, a_ne, lo, hi), leaf(c, r, tb, b_ne, lo, hi))))
    yield Case(d.key, "a=[6,4,3,2] permuted,b=[6,1,3,1] rowgap",
               lambda c, r: Built(B.node(d.key, leaf(c, r, F32, (6, 4, 3, 2), lo, hi, "permuted"),
                                         leaf(c, r, F32, (6, 1, 3, 1), lo, hi, "rowgap"))))
    yield Case(d.key, "a=[16,5],b=[16],inplace",
               lambda c, r: Built(B.node(d.key, leaf(c, r, F32, (16, 5), lo, hi), leaf(c, r, F32, (16,), lo, hi),
                                         inplace=True)))


@family("ADD1")
def add1_cases(d: OpDef) -> Iterator[Case]:
    for t in (F32, F16):
        yield Case(d.key, f"ne=[10,5,4,3],{tname(t)}",
                   lambda c, r, t=t: Built(B.add1(leaf(c, r, t, (10, 5, 4, 3)), leaf(c, r, t, (1,)))))
    yield Case(d.key, "inplace", lambda c, r: Built(B.add1_inplace(leaf(c, r, F32, (8, 3)), leaf(c, r, F32, (1,)))))


@family("DUP")
def dup_cases(d: OpDef) -> Iterator[Case]:
    yield Case(d.key, "ne=[7,3],f32,inplace", lambda c, r: Built(B.dup_inplace(leaf(c, r, F32, (7, 3)))))
    for t, layout in itertools.product((F32, F16, BF16, I32), ("contiguous", "permuted")):
        lo, hi = (-100, 100) if t == I32 else (-1, 1)
        yield Case(d.key, f"ne=[10,5,4,3],{tname(t)},{layout}",
                   lambda c, r, t=t, layout=layout, lo=lo, hi=hi: Built(B.dup(leaf(c, r, t, (10, 5, 4, 3), lo, hi,
                                                                                layout))))


def _region_case(key: str, t: GGMLType, inplace: bool) -> Case:
    def build(c: Context, r: np.random.Generator) -> Built:
        lo, hi = (-50, 50) if t == I32 else (-1, 1)
        a = leaf(c, r, t, (20, 8, 3, 1), lo, hi)
        b = leaf(c, r, t, (5, 3, 2, 1), lo, hi)
        off = 2 * a.nb[1] + 3 * a.nb[0]
        return Built(B.node(key, a, b, nb1=a.nb[1], nb2=a.nb[2], nb3=a.nb[3], offset=off, inplace=inplace))
    return Case(key, f"a=[20,8,3],b=[5,3,2],offset=2 rows+3,{tname(t)}" + (",inplace" if inplace else ""), build)


@family("ACC")
def acc_cases(d: OpDef) -> Iterator[Case]:
    yield _region_case("ACC", F32, False)
    yield _region_case("ACC", F32, True)


@family("SET")
def set_cases(d: OpDef) -> Iterator[Case]:
    for t in (F32, F16, I32):
        yield _region_case("SET", t, False)
    yield _region_case("SET", F32, True)


@family("SUM", "SUM_ROWS", "MEAN")
def reduce_cases(d: OpDef) -> Iterator[Case]:
    for ne, t, layout in [((10, 5, 4, 3), F32, "contiguous"), ((33, 1, 1, 1), F32, "contiguous"),
                          ((10, 5, 4, 3), F16, "contiguous"), ((9, 6, 4, 1), F32, "permuted"),
                          ((9, 6, 4, 1), F32, "rowgap")]:
        yield Case(d.key, f"ne={dims(ne)},{tname(t)},{layout}",
                   lambda c, r, ne=ne, t=t, layout=layout: Built(B.node(d.key, leaf(c, r, t, ne, layout=layout))))


@family("ARGMAX")
def argmax_cases(d: OpDef) -> Iterator[Case]:
    for ne in [(8, 16), (100, 10), (1, 7)]:
        def build(c, r, ne=ne):
            a = c.new_tensor(F32, ne)
            a.set(np.stack([r.permutation(ne[0]) for _ in range(ne[1])]).astype(np.float32))  # unique per row
            return Built(B.argmax(a))
        yield Case(d.key, f"ne={dims(ne)}", build)


@family("COUNT_EQUAL")
def count_equal_cases(d: OpDef) -> Iterator[Case]:
    for ne in [(4, 500), (37, 3, 2)]:
        yield Case(d.key, f"ne={dims(ne)}", lambda c, r, ne=ne: Built(
            B.count_equal(leaf(c, r, I32, ne, 0, 4), leaf(c, r, I32, ne, 0, 4))))


@family("REPEAT")
def repeat_cases(d: OpDef) -> Iterator[Case]:
    for t in (F32, F16, I32):
        yield Case(d.key, f"a=[5,2,1,3]->[10,4,3,6],{tname(t)}", lambda c, r, t=t: Built(
            B.repeat(leaf(c, r, t, (5, 2, 1, 3), -9, 9), c.new_tensor(t, (10, 4, 3, 6)))))
    yield Case(d.key, "a permuted", lambda c, r: Built(
        B.repeat(leaf(c, r, F32, (4, 3, 1, 1), layout="permuted"), c.new_tensor(F32, (8, 3, 2, 1)))))


@family("REPEAT_BACK")
def repeat_back_cases(d: OpDef) -> Iterator[Case]:
    for small in [(5, 2, 1, 3), (1, 1, 1, 1), (10, 1, 3, 1)]:
        yield Case(d.key, f"[10,4,3,6]->{dims(small)}", lambda c, r, small=small: Built(
            B.repeat_back(leaf(c, r, F32, (10, 4, 3, 6)), c.new_tensor(F32, small))))


@family("SILU_BACK")
def silu_back_cases(d: OpDef) -> Iterator[Case]:
    for t in (F32, F16):
        yield Case(d.key, f"ne=[10,5,4,3],{tname(t)}", lambda c, r, t=t: Built(
            B.silu_back(leaf(c, r, t, (10, 5, 4, 3)), leaf(c, r, t, (10, 5, 4, 3), -3, 3))))


@family("NORM", "RMS_NORM")
def norm_cases(d: OpDef) -> Iterator[Case]:
    for eps, layout in itertools.product((0.0, 1e-6, 1e-4, 0.1), ("contiguous", "rowgap")):
        yield Case(d.key, f"ne=[64,5,4,3],eps={eps},{layout}", lambda c, r, eps=eps, layout=layout: Built(
            B.node(d.key, leaf(c, r, F32, (64, 5, 4, 3), layout=layout), eps=eps)))
    yield Case(d.key, "ne=[64,5],inplace", lambda c, r: Built(
        B.node(d.key, leaf(c, r, F32, (64, 5)), eps=1e-6, inplace=True)))


@family("RMS_NORM_BACK")
def rms_norm_back_cases(d: OpDef) -> Iterator[Case]:
    for eps in (1e-6, 0.1):
        yield Case(d.key, f"ne=[64,5,4,3],eps={eps}", lambda c, r, eps=eps: Built(
            B.rms_norm_back(leaf(c, r, F32, (64, 5, 4, 3)), leaf(c, r, F32, (64, 5, 4, 3)), eps=eps)))


@family("MUL_MAT")
def mul_mat_cases(d: OpDef) -> Iterator[Case]:
    k, m = 256, 16
    for n, ta in itertools.product((1, 9), (F32, F16, BF16)):
        yield Case(d.key, f"m={m},n={n},k={k},{tname(ta, F32)}", lambda c, r, n=n, ta=ta: Built(
            B.mul_mat(leaf(c, r, ta, (k, m)), leaf(c, r, F32, (k, n)))))
    for bs, nr in [((1, 1), (2, 1)), ((3, 2), (1, 1)), ((2, 1), (2, 3)), ((1, 2), (3, 2))]:
        a_ne, b_ne = (k // 4, m, bs[0], bs[1]), (k // 4, 5, bs[0] * nr[0], bs[1] * nr[1])
        yield Case(d.key, f"a={dims(a_ne)},b={dims(b_ne)} (broadcast)", lambda c, r, a_ne=a_ne, b_ne=b_ne: Built(
            B.mul_mat(leaf(c, r, F32, a_ne), leaf(c, r, F32, b_ne))))
    yield Case(d.key, "b permuted,a rowgap", lambda c, r: Built(
        B.mul_mat(leaf(c, r, F32, (32, 7, 2), layout="rowgap"), leaf(c, r, F32, (32, 6, 4), layout="permuted3"))))


@family("OUT_PROD")
def out_prod_cases(d: OpDef) -> Iterator[Case]:
    for ta, a_ne, b_ne in [(F32, (16, 32, 1, 1), (12, 32, 1, 1)), (F32, (16, 32, 2, 1), (12, 32, 4, 2)),
                           (F16, (16, 32, 2, 1), (12, 32, 2, 1))]:
        yield Case(d.key, f"a={dims(a_ne)},b={dims(b_ne)},{tname(ta)}", lambda c, r, ta=ta, a_ne=a_ne, b_ne=b_ne:
                   Built(B.out_prod(leaf(c, r, ta, a_ne), leaf(c, r, F32, b_ne))))


@family("CPY")
def cpy_cases(d: OpDef) -> Iterator[Case]:
    pairs = [(F32, F16), (F16, F32), (F32, BF16), (BF16, F32), (F16, BF16), (F32, I32), (I32, F32), (F32, F32)]
    for ts, td in pairs:
        lo, hi = (-5, 5) if I32 in (ts, td) else (-1, 1)
        yield Case(d.key, f"{tname(ts)}->{tname(td)},ne=[10,5,4,3]", lambda c, r, ts=ts, td=td, lo=lo, hi=hi:
                   Built(B.cpy(leaf(c, r, ts, (10, 5, 4, 3), lo, hi), c.new_tensor(td, (10, 5, 4, 3)))))
    yield Case(d.key, "f32 permuted->f16 [20,30]", lambda c, r: Built(
        B.cpy(leaf(c, r, F32, (6, 10, 5, 2), layout="permuted"), c.new_tensor(F16, (20, 30)))))


@family("CONT")
def cont_cases(d: OpDef) -> Iterator[Case]:
    for t, layout in itertools.product((F32, F16, BF16), ("permuted", "permuted3", "rowgap")):
        yield Case(d.key, f"ne=[10,5,4,3],{tname(t)},{layout}", lambda c, r, t=t, layout=layout: Built(
            B.cont(leaf(c, r, t, (10, 5, 4, 3), layout=layout))))
    yield Case(d.key, "permuted to ne=[50,12]", lambda c, r: Built(
        B.cont(leaf(c, r, F32, (10, 5, 4, 3), layout="permuted"), (50, 12))))


# View ops compute nothing: their cases check that values read through the view.
@family("RESHAPE")
def reshape_cases(d: OpDef) -> Iterator[Case]:
    yield Case(d.key, "[10,5,4,3]->[20,30]", lambda c, r: Built(B.reshape(leaf(c, r, F32, (10, 5, 4, 3)), (20, 30))))


@family("VIEW")
def view_cases(d: OpDef) -> Iterator[Case]:
    def build(c, r):
        a = leaf(c, r, F32, (10, 5, 4, 3))
        return Built(B.view_3d(a, 4, 3, 2, a.nb[1], a.nb[2], a.nb[1] + 8))
    yield Case(d.key, "3d window at offset", build)


@family("PERMUTE")
def permute_cases(d: OpDef) -> Iterator[Case]:
    for axes in [(0, 2, 1, 3), (3, 1, 0, 2), (1, 2, 3, 0)]:
        yield Case(d.key, f"axes={axes}", lambda c, r, axes=axes: Built(
            B.permute(leaf(c, r, F32, (10, 5, 4, 3)), *axes)))


@family("TRANSPOSE")
def transpose_cases(d: OpDef) -> Iterator[Case]:
    yield Case(d.key, "ne=[10,5,4,3]", lambda c, r: Built(B.transpose(leaf(c, r, F32, (10, 5, 4, 3)))))


@family("GET_ROWS")
def get_rows_cases(d: OpDef) -> Iterator[Case]:
    n, m, rows = 32, 5, 8
    for t, bsz in itertools.product((F32, F16, BF16, I32), (1, 3)):
        def build(c, r, t=t, bsz=bsz):
            a = leaf(c, r, t, (n, rows, bsz), -50, 50) if t == I32 else leaf(c, r, t, (n, rows, bsz))
            return Built(B.get_rows(a, leaf(c, r, I32, (m, bsz), 0, rows)))
        yield Case(d.key, f"n={n},rows={rows},m={m},b={bsz},{tname(t)}", build)


@family("GET_ROWS_BACK")
def get_rows_back_cases(d: OpDef) -> Iterator[Case]:
    yield Case(d.key, "grad=[10,7],rows=4 (repeated indices)", lambda c, r: Built(
        B.get_rows_back(leaf(c, r, F32, (10, 7)), leaf(c, r, I32, (7,), 0, 4), c.new_tensor(F32, (10, 4)))))


@family("DIAG_MASK_INF", "DIAG_MASK_ZERO")
def diag_mask_cases(d: OpDef) -> Iterator[Case]:
    for n_past in (0, 2, 5):
        yield Case(d.key, f"ne=[10,10,3,2],n_past={n_past}", lambda c, r, n_past=n_past: Built(
            B.node(d.key, leaf(c, r, F32, (10, 10, 3, 2)), n_past=n_past)))
    yield Case(d.key, "inplace", lambda c, r: Built(B.node(d.key, leaf(c, r, F32, (6, 4)), n_past=1, inplace=True)))


@family("SOFT_MAX")
def soft_max_cases(d: OpDef) -> Iterator[Case]:
    yield Case(d.key, "ne=[16,16,4,2],no mask", lambda c, r: Built(B.soft_max(leaf(c, r, F32, (16, 16, 4, 2)))))
    yield Case(d.key, "ne=[1024,4],scale=0.1", lambda c, r: Built(
        B.soft_max_ext(leaf(c, r, F32, (1024, 4)), scale=0.1)))
    grid = itertools.product(((16, 16, 4, 2), (31, 7, 3, 1)), (F32, F16), (1.0, 0.1), (0.0, 8.0), (False, True))
    for ne, tm, sc, mb, bcast in grid:
        m_ne = (ne[0], ne[1] + 3, 1 if bcast else ne[2], 1 if bcast else ne[3])
        yield Case(d.key, f"ne={dims(ne)},mask={dims(m_ne)} {tname(tm)},scale={sc},max_bias={mb}",
                   lambda c, r, ne=ne, tm=tm, sc=sc, mb=mb, m_ne=m_ne: Built(B.soft_max_ext(
                       leaf(c, r, F32, ne, -3, 3), leaf(c, r, tm, m_ne), scale=sc, max_bias=mb)))
    yield Case(d.key, "ne=[16,5,4,1],mask,sinks", lambda c, r: Built(B.soft_max_ext(
        leaf(c, r, F32, (16, 5, 4, 1)), leaf(c, r, F32, (16, 5, 1, 1)), scale=0.5, sinks=leaf(c, r, F32, (4,)))))
    yield Case(d.key, "inplace,mask", lambda c, r: Built(B.soft_max_ext(
        leaf(c, r, F32, (12, 4, 2)), leaf(c, r, F32, (12, 4)), scale=0.7, inplace=True)))


@family("SOFT_MAX_BACK")
def soft_max_back_cases(d: OpDef) -> Iterator[Case]:
    for sc in (1.0, 0.5):
        yield Case(d.key, f"ne=[16,16,4,2],scale={sc}", lambda c, r, sc=sc: Built(B.soft_max_ext_back(
            leaf(c, r, F32, (16, 16, 4, 2)), leaf(c, r, F32, (16, 16, 4, 2), 0.0, 1.0), scale=sc)))


@family("CROSS_ENTROPY_LOSS")
def cross_entropy_cases(d: OpDef) -> Iterator[Case]:
    for ne in [(10, 5, 4, 3), (3000, 2, 1, 1)]:
        yield Case(d.key, f"ne={dims(ne)}", lambda c, r, ne=ne: Built(B.cross_entropy_loss(
            leaf(c, r, F32, ne, -3, 3), leaf(c, r, F32, ne, 0, 1))))
        yield Case(d.key, f"ne={dims(ne)},class indices", lambda c, r, ne=ne: Built(B.cross_entropy_loss(
            leaf(c, r, F32, ne, -3, 3), leaf(c, r, I32, ne[1:], 0, ne[0]))))


@family("CROSS_ENTROPY_LOSS_BACK")
def cross_entropy_back_cases(d: OpDef) -> Iterator[Case]:
    for ne in [(10, 5, 4, 3), (3000, 2, 1, 1)]:
        yield Case(d.key, f"ne={dims(ne)}", lambda c, r, ne=ne: Built(B.cross_entropy_loss_back(
            leaf(c, r, F32, (1,), 0.5, 2), leaf(c, r, F32, ne, -3, 3), leaf(c, r, F32, ne, 0, 1))))
        yield Case(d.key, f"ne={dims(ne)},class indices", lambda c, r, ne=ne: Built(B.cross_entropy_loss_back(
            leaf(c, r, F32, (1,), 0.5, 2), leaf(c, r, F32, ne, -3, 3), leaf(c, r, I32, ne[1:], 0, ne[0]))))


@family("CONCAT")
def concat_cases(d: OpDef) -> Iterator[Case]:
    base = (10, 5, 4, 3)
    for dim, t in itertools.product(range(4), (F32, I32, F16)):
        if t == F16 and dim not in (0, 2):
            continue
        b_ne = tuple(3 if i == dim else n for i, n in enumerate(base))
        lo, hi = (-100, 100) if t == I32 else (-1, 1)
        yield Case(d.key, f"a={dims(base)},b={dims(b_ne)},dim={dim},{tname(t)}",
                   lambda c, r, dim=dim, t=t, b_ne=b_ne, lo=lo, hi=hi: Built(B.concat(
                       leaf(c, r, t, base, lo, hi), leaf(c, r, t, b_ne, lo, hi), dim)))
    for dim in (0, 1):
        yield Case(d.key, f"a=[6,4,3,2] permuted,b rowgap,dim={dim}", lambda c, r, dim=dim: Built(B.concat(
            leaf(c, r, F32, (6, 4, 3, 2), layout="permuted"),
            leaf(c, r, F32, (6 if dim else 2, 4 if dim == 0 else 5, 3, 2), layout="rowgap"), dim)))


@family("DIAG")
def diag_cases(d: OpDef) -> Iterator[Case]:
    for ne, layout in [((10, 1, 3, 2), "contiguous"), ((1, 1, 1, 1), "contiguous"), ((7, 1, 1, 1), "contiguous"),
                       ((6, 1, 4, 2), "rowgap")]:
        yield Case(d.key, f"ne={dims(ne)},{layout}", lambda c, r, ne=ne, layout=layout: Built(
            B.diag(leaf(c, r, F32, ne, layout=layout))))


@family("PAD")
def pad_cases(d: OpDef) -> Iterator[Case]:
    grid = [((10, 5, 4, 3), (0, 1, 0, 2, 0, 0, 0, 1), False), ((10, 5, 4, 3), (2, 1, 1, 2, 3, 0, 1, 1), False),
            ((16, 3), (0, 0, 4, 4, 0, 0, 0, 0), False), ((10, 5, 4, 3), (2, 1, 1, 2, 3, 0, 1, 1), True),
            ((5, 3, 2, 1), (7, 12, 4, 0, 0, 3, 1, 0), True)]
    for ne, pads, circ in grid:
        kw = dict(zip(("lp0", "rp0", "lp1", "rp1", "lp2", "rp2", "lp3", "rp3"), pads))
        yield Case(d.key, f"ne={dims(ne)},pads={dims(pads)}" + (",circular" if circ else ""),
                   lambda c, r, ne=ne, kw=kw, circ=circ: Built(B.pad_ext(leaf(c, r, F32, ne), circular=circ, **kw)))
    for circ in (False, True):
        yield Case(d.key, "ne=[6,4,3,2],permuted" + (",circular" if circ else ""), lambda c, r, circ=circ: Built(
            B.pad_ext(leaf(c, r, F32, (6, 4, 3, 2), layout="permuted"), 1, 2, 3, 0, 0, 1, 1, 0, circular=circ)))
    yield Case(d.key, "ne=[7,3,2],rowgap,pad(3,1)", lambda c, r: Built(
        B.pad(leaf(c, r, F32, (7, 3, 2), layout="rowgap"), 3, 1)))


@family("PAD_REFLECT_1D")
def pad_reflect_cases(d: OpDef) -> Iterator[Case]:
    for ne, p0, p1 in [((512, 34, 2, 1), 10, 9), ((10, 5, 4, 3), 0, 0), ((10, 5, 4, 3), 9, 9), ((2, 3), 1, 0),
                       ((5, 2), 0, 4)]:
        yield Case(d.key, f"ne={dims(ne)},p0={p0},p1={p1}", lambda c, r, ne=ne, p0=p0, p1=p1: Built(
            B.pad_reflect_1d(leaf(c, r, F32, ne), p0, p1)))


@family("ARANGE")
def arange_cases(d: OpDef) -> Iterator[Case]:
    for start, stop, step in [(0.0, 10.0, 1.0), (-3.0, 3.0, 0.25), (0.5, 100.0, 0.7), (0.0, 1.0, 0.1),
                              (-1e3, 1e3, 3.0), (2.0, 2.5, 5.0)]:
        yield Case(d.key, f"start={start},stop={stop},step={step}", lambda c, r, start=start, stop=stop, step=step:
                   Built(B.arange(c, start, stop, step)))


@family("TIMESTEP_EMBEDDING")
def timestep_embedding_cases(d: OpDef) -> Iterator[Case]:
    for n, dim, max_period, hi in [(2, 320, 10000, 1.0), (5, 15, 10000, 100.0), (3, 64, 100, 1000.0),
                                   (4, 1, 10000, 10.0), (7, 2, 5, 10.0)]:
        yield Case(d.key, f"N={n},dim={dim},max_period={max_period},t in [0,{hi})",
                   lambda c, r, n=n, dim=dim, max_period=max_period, hi=hi: Built(B.timestep_embedding(
                       leaf(c, r, F32, (n,), 0.0, hi), dim, max_period)))


def _distinct_rows(c: Context, r: np.random.Generator, ne, layout: str = "contiguous") -> Tensor:
    """An F32 leaf whose rows hold distinct values (a permutation of quarter steps), so that
    sorting has no ties: ggml leaves the order of equal values unspecified."""
    t = leaf(c, r, F32, ne, layout=layout)
    base = t.base
    rows = base.ne[1] * base.ne[2] * base.ne[3]
    vals = np.stack([r.permutation(base.ne[0]) for _ in range(rows)]) - base.ne[0] / 2
    base.set((vals / 4).astype(np.float32).reshape(tuple(reversed(base.ne))))
    return t


@family("ARGSORT")
def argsort_cases(d: OpDef) -> Iterator[Case]:
    for ne, order in itertools.product([(8, 16), (16, 10, 3, 2), (1, 5), (100, 3)], SortOrder):
        yield Case(d.key, f"ne={dims(ne)},{order.name}", lambda c, r, ne=ne, order=order: Built(
            B.argsort(_distinct_rows(c, r, ne), order)))
    yield Case(d.key, "ne=[9,4,2],DESC,rowgap", lambda c, r: Built(
        B.argsort(_distinct_rows(c, r, (9, 4, 2), "rowgap"), SortOrder.DESC)))
    yield Case(d.key, "top_k k=3 of ne=[12,5,2]", lambda c, r: Built(
        B.argsort_top_k(_distinct_rows(c, r, (12, 5, 2)), 3)))


@family("L2_NORM")
def l2_norm_cases(d: OpDef) -> Iterator[Case]:
    for eps, layout in itertools.product((0.0, 1e-6, 1e-2, 10.0), ("contiguous", "rowgap")):
        yield Case(d.key, f"ne=[64,5,4,3],eps={eps},{layout}", lambda c, r, eps=eps, layout=layout: Built(
            B.l2_norm(leaf(c, r, F32, (64, 5, 4, 3), layout=layout), eps=eps)))
    yield Case(d.key, "ne=[64,5],eps=1e-6,permuted", lambda c, r: Built(
        B.l2_norm(leaf(c, r, F32, (64, 5), layout="permuted"), eps=1e-6)))
    yield Case(d.key, "ne=[64,5],inplace", lambda c, r: Built(B.l2_norm(leaf(c, r, F32, (64, 5)), 1e-6, inplace=True)))


@family("GROUP_NORM")
def group_norm_cases(d: OpDef) -> Iterator[Case]:
    for ng, eps in itertools.product((1, 3, 4, 5, 12, 20), (1e-6, 0.1)):
        yield Case(d.key, f"ne=[8,6,12,2],n_groups={ng},eps={eps}", lambda c, r, ng=ng, eps=eps: Built(
            B.group_norm(leaf(c, r, F32, (8, 6, 12, 2)), ng, eps)))
    yield Case(d.key, "ne=[64,64,32,1],n_groups=8", lambda c, r: Built(
        B.group_norm(leaf(c, r, F32, (64, 64, 32, 1)), 8, 1e-6)))
    yield Case(d.key, "ne=[7,5,6,2],n_groups=4,rowgap", lambda c, r: Built(
        B.group_norm(leaf(c, r, F32, (7, 5, 6, 2), layout="rowgap"), 4, 1e-5)))
    yield Case(d.key, "ne=[7,5,6,2],n_groups=3,permuted", lambda c, r: Built(
        B.group_norm(leaf(c, r, F32, (7, 5, 6, 2), layout="permuted"), 3, 1e-5)))
    yield Case(d.key, "ne=[8,3,6],inplace", lambda c, r: Built(
        B.group_norm(leaf(c, r, F32, (8, 3, 6)), 2, 1e-6, inplace=True)))


@family(*(g.name for g in GluOp))
def glu_cases(d: OpDef) -> Iterator[Case]:
    oai = d.sub == GluOp.SWIGLU_OAI
    variants = [{"alpha": a, "limit": lim} for a in (0.5, 1.702) for lim in (2.0, 7.0)] if oai else [{}]
    lo, hi = (-3.0, 3.0) if not oai else (-9.0, 9.0)
    for ne, t, kw in itertools.product([(128, 2, 2, 2), (10, 7, 11, 13)], _types(d), variants):
        p = "".join(f",{k}={v}" for k, v in kw.items())
        for swapped in (False, True):
            yield Case(d.key, f"ne={dims(ne)},{tname(t)}{p},swapped={int(swapped)}",
                       lambda c, r, ne=ne, t=t, kw=kw, swapped=swapped: Built(B.node(
                           d.key, leaf(c, r, t, ne, lo, hi), swapped=swapped, **kw)))
        half = (ne[0] // 2, *ne[1:])
        yield Case(d.key, f"split,ne={dims(half)},{tname(t)}{p}", lambda c, r, half=half, t=t, kw=kw: Built(
            B.node(d.key, leaf(c, r, t, half, lo, hi), leaf(c, r, t, half, lo, hi), **kw)))
    kw = variants[-1]
    yield Case(d.key, "ne=[12,5,3,2],f32,rowgap,swapped=1", lambda c, r: Built(B.node(
        d.key, leaf(c, r, F32, (12, 5, 3, 2), lo, hi, "rowgap"), swapped=True, **kw)))
    yield Case(d.key, "split,ne=[6,5,3,2],f32,a rowgap,b rowgap", lambda c, r: Built(B.node(
        d.key, leaf(c, r, F32, (6, 5, 3, 2), lo, hi, "rowgap"), leaf(c, r, F32, (6, 5, 3, 2), lo, hi, "rowgap"), **kw)))


def _param(c: Context, r: np.random.Generator, ne) -> Tensor:
    return leaf(c, r, F32, ne).set_param()


@family("OPT_STEP_ADAMW")
def adamw_cases(d: OpDef) -> Iterator[Case]:
    for wd, it in [(0.0, 1), (0.1, 7)]:
        def build(c, r, wd=wd, it=it):
            a = _param(c, r, (10, 5, 4, 3))
            g, m, v = leaf(c, r, F32, a.ne), leaf(c, r, F32, a.ne), leaf(c, r, F32, a.ne, 0.0, 1.0)
            b1, b2 = 0.9, 0.999
            p = c.from_numpy(np.array([1e-3, b1, b2, 1e-8, wd, 1 / (1 - b1**it), 1 / (1 - b2**it)], np.float32))
            return Built(B.opt_step_adamw(a, g, m, v, p), (m, v))
        yield Case(d.key, f"ne=[10,5,4,3],wd={wd},iter={it}", build)


@family("OPT_STEP_SGD")
def sgd_cases(d: OpDef) -> Iterator[Case]:
    for wd in (0.0, 0.1):
        def build(c, r, wd=wd):
            a = _param(c, r, (10, 5, 4, 3))
            return Built(B.opt_step_sgd(a, leaf(c, r, F32, a.ne), c.from_numpy(np.array([1e-2, wd], np.float32))))
        yield Case(d.key, f"ne=[10,5,4,3],wd={wd}", build)


def cases_for(key: str) -> list[Case]:
    d = OPS[key]
    gen = CASES.get(key)
    return (list(gen(d)) if gen is not None else []) + [c for g in EXTRA.get(key, ()) for c in g(d)]


def all_cases(ops: list[str] | None = None) -> list[Case]:
    keys = list(OPS) if not ops else [k.upper() for k in ops]
    return [c for k in keys for c in cases_for(k)]


assert {u.name for u in UnaryOp} <= set(CASES), "every unary sub-op needs conformance cases"
assert {g.name for g in GluOp} <= set(CASES), "every GLU sub-op needs conformance cases"
