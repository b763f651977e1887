"""Random conformance cases (``prism conformance --random N --seed S``).

For the elementwise (unary and binary), matmul, softmax and norm families, each op
gets ``n`` cases whose shapes, types, memory layouts (any permutation of the 4 dims,
row gaps, leading offset rows), broadcasts and params are drawn from a NumPy generator
seeded by ``(seed, op key)``: the same seed gives the same cases on every machine and
whichever other ops are selected. The case's name spells out what was drawn, and the
values come from the case's own seed, as for the fixed cases, so a failure is reported
(and can be reproduced) like any other case. Every drawn case is built once when it is
drawn; a draw the op's builder refuses is drawn again.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from ..context import Context
from ..ops import build as B
from ..ops.table import OPS, OpDef
from ..tensor import Tensor
from ..types import BF16, F16, F32, GGMLType
from .cases import UNARY_PARAMS, UNARY_RANGE, Built, Case, dims, tname

Layout = tuple[tuple[int, int, int, int], int, int]  # (axes, row gap, leading rows)
IDENTITY = (0, 1, 2, 3)


def random_layout(g: np.random.Generator) -> Layout:
    """Half contiguous; otherwise a random permutation, row gap and/or leading offset."""
    if g.random() < 0.4:
        return IDENTITY, 0, 0
    axes = tuple(int(x) for x in g.permutation(4)) if g.random() < 0.6 else IDENTITY
    return axes, int(g.choice([0, 0, 1, 3])), int(g.choice([0, 1]))


def layout_name(lay: Layout) -> str:
    axes, gap, lead = lay
    parts = []
    if axes != IDENTITY:
        parts.append("perm" + "".join(map(str, axes)))
    if gap:
        parts.append(f"gap{gap}")
    if lead:
        parts.append(f"off{lead}row")
    return "+".join(parts) or "contiguous"


def strided_leaf(c: Context, r: np.random.Generator, t: GGMLType, ne, lay: Layout,
                 lo: float = -1.0, hi: float = 1.0) -> Tensor:
    """A tensor of extents ``ne`` (4 dims) over memory laid out as ``lay``: base dims in
    the order ``axes`` (ggml's permute: base dim k becomes dim axes[k]), ``gap`` unused
    elements after each base row, ``lead`` unused rows before the first."""
    axes, gap, lead = lay
    ne = tuple(ne) + (1,) * (4 - len(ne))
    bne = [ne[axes[k]] for k in range(4)]
    base = c.new_tensor(t, (bne[0] + gap, bne[1] + lead, bne[2], bne[3]))
    vals = r.uniform(lo, hi, size=tuple(reversed(base.ne))).astype(np.float32)
    base.set(vals)
    v = base
    if gap or lead:
        v = B.view_4d(base, *bne, base.nb[1], base.nb[2], base.nb[3], lead * base.nb[1])
    if axes != IDENTITY:
        v = B.permute(v, *axes)
    return v


def _ne(g: np.random.Generator, max0: int = 40, max_rest: tuple[int, int, int] = (6, 4, 3)) -> tuple[int, ...]:
    return (int(g.integers(1, max0 + 1)), *(int(g.integers(1, m + 1)) for m in max_rest))


def _float_types(d: OpDef, src: int = 0) -> list[GGMLType]:
    return [t for t in (F32, F16, BF16) if t in d.srcs[src].types]


Drawn = tuple[str, Callable[[Context, np.random.Generator], Built]]


def _unary(d: OpDef, g: np.random.Generator) -> Drawn:
    lo, hi = UNARY_RANGE.get(d.key, (-2.0, 2.0))
    if d.key in ("SQRT", "LOG"):
        lo = max(lo, 1e-3)
    params = dict(UNARY_PARAMS.get(d.key, {}))
    if d.key == "SCALE":
        params = {"s": round(float(g.uniform(-2, 2)), 3), "b": round(float(g.uniform(-1, 1)), 3)}
    elif d.key == "CLAMP":
        a, b = sorted(round(float(x), 3) for x in g.uniform(-1, 1, 2))
        params = {"min": a, "max": b}
    elif d.key == "LEAKY_RELU":
        params = {"negative_slope": round(float(g.uniform(0, 0.5)), 3)}
    t = _float_types(d)[int(g.integers(len(_float_types(d))))]
    ne, lay = _ne(g), random_layout(g)
    inplace = bool(d.inplace and lay == (IDENTITY, 0, 0) and g.random() < 0.3)
    desc = (f"ne={dims(ne)},{tname(t)},{layout_name(lay)}" + "".join(f",{k}={v}" for k, v in params.items())
            + (",inplace" if inplace else ""))
    return desc, lambda c, r: Built(B.node(d.key, strided_leaf(c, r, t, ne, lay, lo, hi), inplace=inplace, **params))


BINARY_TYPES = [(F32, F32), (F16, F32), (F16, F16), (BF16, F32)]


def _binary(d: OpDef, g: np.random.Generator) -> Drawn:
    lo, hi = (0.5, 2.0) if d.key == "DIV" else (-1.0, 1.0)
    types = [p for p in BINARY_TYPES if p[0] in d.srcs[0].types and p[1] in d.srcs[1].types]
    ta, tb = types[int(g.integers(len(types)))] if g.random() < 0.5 else (F32, F32)
    ne = _ne(g)
    b_ne = tuple(n if g.random() < 0.6 else (1 if g.random() < 0.7 else _divisor(g, n)) for n in ne)
    la, lb = random_layout(g), random_layout(g)
    inplace = bool(d.inplace and la == (IDENTITY, 0, 0) and g.random() < 0.3)
    desc = (f"a={dims(ne)} {layout_name(la)},b={dims(b_ne)} {layout_name(lb)},{tname(ta, tb)}"
            + (",inplace" if inplace else ""))
    return desc, lambda c, r: Built(B.node(d.key, strided_leaf(c, r, ta, ne, la, lo, hi),
                                           strided_leaf(c, r, tb, b_ne, lb, lo, hi), inplace=inplace))


def _divisor(g: np.random.Generator, n: int) -> int:
    divs = [k for k in range(1, n + 1) if n % k == 0]
    return int(divs[int(g.integers(len(divs)))])


def _mul_mat(d: OpDef, g: np.random.Generator) -> Drawn:
    k, m, n = int(g.integers(1, 97)), int(g.integers(1, 17)), int(g.integers(1, 10))
    a2, a3 = int(g.integers(1, 4)), int(g.integers(1, 3))
    r2, r3 = int(g.integers(1, 3)), int(g.integers(1, 3))
    types = _float_types(d)
    ta = types[int(g.integers(len(types)))]
    a_ne, b_ne = (k, m, a2, a3), (k, n, a2 * r2, a3 * r3)
    la, lb = random_layout(g), random_layout(g)
    desc = f"a={dims(a_ne)} {layout_name(la)},b={dims(b_ne)} {layout_name(lb)},{tname(ta, F32)}"
    return desc, lambda c, r: Built(B.mul_mat(strided_leaf(c, r, ta, a_ne, la), strided_leaf(c, r, F32, b_ne, lb)))


def _soft_max(d: OpDef, g: np.random.Generator) -> Drawn:
    ne = _ne(g, 64)
    lay = random_layout(g)
    scale = float(g.choice([1.0, 0.5, 0.125, 2.0]))
    max_bias = float(g.choice([0.0, 0.0, 8.0]))
    mask = g.random() < 0.6
    tm = F32 if g.random() < 0.5 else F16
    m_ne = (ne[0], ne[1] + int(g.integers(0, 3)), ne[2] if g.random() < 0.5 else 1, ne[3] if g.random() < 0.5 else 1)
    desc = (f"ne={dims(ne)} {layout_name(lay)},scale={scale},max_bias={max_bias}"
            + (f",mask={dims(m_ne)} {tname(tm)}" if mask else ",no mask"))

    def build(c: Context, r: np.random.Generator) -> Built:
        a = strided_leaf(c, r, F32, ne, lay, -3.0, 3.0)
        mk = strided_leaf(c, r, tm, m_ne, (IDENTITY, 0, 0)) if mask else None
        return Built(B.soft_max_ext(a, mk, scale=scale, max_bias=max_bias))
    return desc, build


def _norm(d: OpDef, g: np.random.Generator) -> Drawn:
    ne = _ne(g, 64)
    lay = random_layout(g)
    eps = float(g.choice([0.0, 1e-6, 1e-3, 0.1]))
    if d.key == "GROUP_NORM":
        ng = int(g.integers(1, ne[2] + 2))
        eps = max(eps, 1e-6)
        desc = f"ne={dims(ne)} {layout_name(lay)},n_groups={ng},eps={eps}"
        return desc, lambda c, r: Built(B.group_norm(strided_leaf(c, r, F32, ne, lay), ng, eps))
    desc = f"ne={dims(ne)} {layout_name(lay)},eps={eps}"
    return desc, lambda c, r: Built(B.node(d.key, strided_leaf(c, r, F32, ne, lay), eps=eps))


RANDOM: dict[str, Callable[[OpDef, np.random.Generator], Drawn]] = {}
for _d in OPS.values():
    if _d.family == "unary":
        RANDOM[_d.key] = _unary
RANDOM.update({k: _binary for k in ("ADD", "SUB", "MUL", "DIV")})
RANDOM["MUL_MAT"] = _mul_mat
RANDOM["SOFT_MAX"] = _soft_max
RANDOM.update({k: _norm for k in ("NORM", "RMS_NORM", "L2_NORM", "GROUP_NORM")})

MAX_DRAWS = 50


def random_cases_for(key: str, n: int, seed: int) -> list[Case]:
    """``n`` random cases of op ``key`` (none if its family has no random generator)."""
    gen = RANDOM.get(key)
    if gen is None or n <= 0:
        return []
    d = OPS[key]
    g = np.random.default_rng([seed, zlib.crc32(key.encode())])
    out: list[Case] = []
    for i in range(n):
        for _ in range(MAX_DRAWS):
            desc, build = gen(d, g)
            case = Case(key, f"random {i} seed={seed}: {desc}", build)
            try:  # a draw the builder refuses (a layout the op does not accept) is drawn again
                build(Context(), np.random.default_rng(0))
            except Exception:  # noqa: BLE001
                continue
            out.append(case)
            break
    return out


def random_cases(ops: list[str] | None, n: int, seed: int) -> list[Case]:
    keys = list(OPS) if not ops else [k.upper() for k in ops]
    return [c for k in keys for c in random_cases_for(k, n, seed)]
