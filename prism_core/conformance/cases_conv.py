"""Conformance cases (forward and gradient): conv ops.

Grids follow ggml's test-backend-ops: pool2d AVG/MAX x k {1,3} x s {1,2} x p {0,1} on
[10,10,3,1]; im2col 1D and 2D over stride/padding/dilation and kernel/result types;
conv_2d and conv_transpose_1d shape lists; upscale nearest/bilinear. Non-contiguous
inputs use layouts ggml's kernels read correctly (a channel slice, a row gap, a
permutation for UPSCALE).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ..context import Context
from ..ops import build as B
from ..ops.table import OpDef
from ..ops.table_conv import PoolOp, ScaleMode
from ..tensor import Tensor
from ..types import F16, F32, GGMLType
from .cases import Built, Case, dims, family, leaf, tname
from .gradcheck import GradCase, const, grad_family, param


def channel_slice(c: Context, r: np.random.Generator, t: GGMLType, ne, ch_dim: int = 2) -> Tensor:
    """A view of channels 1..ne[ch_dim] of a larger tensor: dense rows and planes with a gap
    between channel blocks (non-contiguous along dim ``ch_dim``)."""
    ne = tuple(ne) + (1,) * (4 - len(ne))
    big = list(ne)
    big[ch_dim] += 2
    base = leaf(c, r, t, big)
    return B.view_4d(base, *ne, base.nb[1], base.nb[2], base.nb[3], base.nb[ch_dim])


# ------------------------------------------------------------------ im2col
IM2COL_2D = [  # (input ne, kernel ne, s0, s1, p0, p1, d0, d1)
    ((10, 10, 3, 1), (3, 3, 3, 1), 1, 1, 1, 1, 1, 1),
    ((10, 10, 3, 2), (3, 3, 3, 4), 2, 2, 0, 0, 1, 1),
    ((12, 9, 2, 2), (3, 2, 2, 1), 2, 1, 1, 0, 2, 1),
    ((12, 12, 1, 4), (3, 3, 1, 2), 1, 2, 2, 1, 1, 3),
    ((5, 4, 3, 1), (5, 4, 3, 1), 1, 1, 0, 0, 1, 1),
    ((7, 7, 2, 1), (3, 3, 2, 1), 3, 3, 2, 2, 2, 2),
]
IM2COL_1D = [  # (input ne [L, IC, N], kernel ne [K, IC, OC], s0, p0, d0)
    ((30, 4, 2), (3, 4, 5), 1, 0, 1), ((30, 4, 2), (3, 4, 5), 2, 1, 1), ((30, 4, 2), (3, 4, 5), 1, 2, 2),
    ((300, 32, 1), (3, 32, 8), 1, 1, 1), ((9, 2, 3), (9, 2, 1), 3, 4, 1),
]


@family("IM2COL")
def im2col_cases(d: OpDef) -> Iterator[Case]:
    for (ine, kne, s0, s1, p0, p1, d0, d1), (tk, td) in itertools.product(
            IM2COL_2D, [(F32, F32), (F16, F32), (F16, F16)]):
        def build(c, r, ine=ine, kne=kne, p=(s0, s1, p0, p1, d0, d1), tk=tk, td=td):
            return Built(B.im2col(leaf(c, r, tk, kne), leaf(c, r, F32, ine), *p, True, td))
        yield Case(d.key, f"2D,in={dims(ine)},k={dims(kne)},s={s0},{s1},p={p0},{p1},d={d0},{d1},"
                          f"{tname(F32, tk, td)}", build)
    for (ine, kne, s0, p0, d0), td in itertools.product(IM2COL_1D, (F32, F16)):
        def build(c, r, ine=ine, kne=kne, s0=s0, p0=p0, d0=d0, td=td):
            return Built(B.im2col(leaf(c, r, F16, kne), leaf(c, r, F32, ine), s0, 0, p0, 0, d0, 0, False, td))
        yield Case(d.key, f"1D,in={dims(ine)},k={dims(kne)},s0={s0},p0={p0},d0={d0},{tname(F32, F16, td)}", build)
    yield Case(d.key, "2D,in=[9,8,3,2] channel slice,k=[3,3,3,2],s=2,1,p=1,1", lambda c, r: Built(B.im2col(
        leaf(c, r, F32, (3, 3, 3, 2)), channel_slice(c, r, F32, (9, 8, 3, 2)), 2, 1, 1, 1, 1, 1, True, F32)))
    yield Case(d.key, "1D,in=[20,3,2] channel slice,k=[4,3,2],s0=1,p0=2", lambda c, r: Built(B.im2col(
        leaf(c, r, F32, (4, 3, 2)), channel_slice(c, r, F32, (20, 3, 2), 1), 1, 0, 2, 0, 1, 0, False, F32)))
    yield Case(d.key, "2D,in=[8,8,2,1] f16,k=[3,3,2,1]", lambda c, r: Built(B.im2col(
        leaf(c, r, F32, (3, 3, 2, 1)), leaf(c, r, F16, (8, 8, 2, 1)), 1, 1, 1, 1, 1, 1, True, F32)))


@family("IM2COL_BACK")
def im2col_back_cases(d: OpDef) -> Iterator[Case]:
    for ine, kne, s0, s1, p0, p1, d0, d1 in IM2COL_2D[:4]:
        def build(c, r, ine=ine, kne=kne, p=(s0, s1, p0, p1, d0, d1)):
            k = leaf(c, r, F32, kne)
            fwd = B.im2col(k, c.new_tensor(F32, ine), *p, True)  # only for the gradient's extents
            return Built(B.im2col_back(leaf(c, r, F32, fwd.ne), k, ine, *p, True))
        yield Case(d.key, f"2D,in={dims(ine)},k={dims(kne)},s={s0},{s1},p={p0},{p1},d={d0},{d1}", build)
    for ine, kne, s0, p0, d0 in IM2COL_1D[:3]:
        def build(c, r, ine=ine, kne=kne, s0=s0, p0=p0, d0=d0):
            k = leaf(c, r, F32, kne)
            fwd = B.im2col(k, c.new_tensor(F32, ine), s0, 0, p0, 0, d0, 0, False)
            return Built(B.im2col_back(leaf(c, r, F32, fwd.ne), k, ine, s0, 0, p0, 0, d0, 0, False))
        yield Case(d.key, f"1D,in={dims(ine)},k={dims(kne)},s0={s0},p0={p0},d0={d0}", build)


# ------------------------------------------------------------------ convolutions
CONV_2D = [  # (input ne [W, H, IC, N], kernel ne [KW, KH, IC, OC], s0, s1, p0, p1, d0, d1)
    ((10, 8, 3, 2), (3, 3, 3, 4), 1, 1, 0, 0, 1, 1),
    ((10, 8, 3, 2), (3, 3, 3, 4), 1, 1, 1, 1, 1, 1),
    ((10, 8, 3, 2), (3, 3, 3, 4), 2, 2, 1, 1, 1, 1),
    ((13, 11, 4, 1), (3, 2, 4, 5), 2, 1, 1, 0, 1, 2),
    ((16, 16, 8, 1), (1, 1, 8, 6), 1, 1, 0, 0, 1, 1),
    ((9, 9, 2, 3), (5, 5, 2, 2), 3, 2, 2, 3, 2, 1),
    ((24, 20, 6, 1), (3, 3, 6, 16), 1, 1, 1, 1, 1, 1),
]


@family("CONV_2D")
def conv_2d_cases(d: OpDef) -> Iterator[Case]:
    for (ine, kne, *p), (tk, tb) in itertools.product(CONV_2D, [(F32, F32), (F16, F32)]):
        yield Case(d.key, f"in={dims(ine)},k={dims(kne)},s={p[0]},{p[1]},p={p[2]},{p[3]},d={p[4]},{p[5]},"
                          f"{tname(tk, tb)}", lambda c, r, ine=ine, kne=kne, p=p, tk=tk, tb=tb: Built(
                              B.conv_2d(leaf(c, r, tk, kne), leaf(c, r, tb, ine), *p)))
    yield Case(d.key, "in=[10,8,3,2] f16,k=[3,3,3,4] f16,p=1,1", lambda c, r: Built(
        B.conv_2d(leaf(c, r, F16, (3, 3, 3, 4)), leaf(c, r, F16, (10, 8, 3, 2)), 1, 1, 1, 1)))
    yield Case(d.key, "in=[9,7,3,2] channel slice,k=[3,3,3,2],s=2,1,p=1,1", lambda c, r: Built(
        B.conv_2d(leaf(c, r, F32, (3, 3, 3, 2)), channel_slice(c, r, F32, (9, 7, 3, 2)), 2, 1, 1, 1)))


CONV_T_1D = [  # (input ne [L, IC], kernel ne [K, OC, IC], s0), ggml's list
    ((197, 32), (16, 32, 32), 1), ((197, 32), (16, 32, 32), 2), ((3, 2), (2, 3, 2), 3), ((3, 2), (2, 3, 2), 2),
    ((3, 2), (2, 3, 2), 1), ((3, 2), (3, 2, 2), 2), ((3, 2), (3, 2, 2), 1), ((3, 1), (3, 1, 2), 1),
    ((2, 1), (3, 1, 1), 1),
]


@family("CONV_TRANSPOSE_1D")
def conv_transpose_1d_cases(d: OpDef) -> Iterator[Case]:
    for ine, kne, s0 in CONV_T_1D:
        ine = (ine[0], kne[2])  # input channels = kernel's ne[2]
        yield Case(d.key, f"in={dims(ine)},k={dims(kne)},s0={s0}", lambda c, r, ine=ine, kne=kne, s0=s0: Built(
            B.conv_transpose_1d(leaf(c, r, F32, kne), leaf(c, r, F32, ine), s0)))
    yield Case(d.key, "in=[20,4],k=[5,3,4] f16,s0=2", lambda c, r: Built(
        B.conv_transpose_1d(leaf(c, r, F16, (5, 3, 4)), leaf(c, r, F32, (20, 4)), 2)))
    yield Case(d.key, "in=[20,4] rowgap,k=[5,3,4],s0=3", lambda c, r: Built(
        B.conv_transpose_1d(leaf(c, r, F32, (5, 3, 4)), leaf(c, r, F32, (20, 4), layout="rowgap"), 3)))


# ------------------------------------------------------------------ pooling
POOL_IN = (10, 10, 3, 1)


@family("POOL_2D")
def pool_2d_cases(d: OpDef) -> Iterator[Case]:
    for op, k0, k1, s0, s1, p0, p1 in itertools.product(PoolOp, (1, 3), (1, 3), (1, 2), (1, 2), (0, 1), (0, 1)):
        yield Case(d.key, f"{op.name},in={dims(POOL_IN)},k={k0},{k1},s={s0},{s1},p={p0},{p1},f32",
                   lambda c, r, kw=dict(op=op, k0=k0, k1=k1, s0=s0, s1=s1, p0=p0, p1=p1): Built(
                       B.pool_2d(leaf(c, r, F32, POOL_IN), **kw)))
    for op, (k, s, p) in itertools.product(PoolOp, [(3, 2, 1), (2, 2, 0), (3, 1, 0)]):
        yield Case(d.key, f"{op.name},in={dims(POOL_IN)},k={k},s={s},p={p},f16", lambda c, r, op=op, k=k, s=s, p=p:
                   Built(B.pool_2d(leaf(c, r, F16, POOL_IN), op, k, k, s, s, p, p)))
        yield Case(d.key, f"{op.name},in=[11,9,2,2] rowgap,k={k},s={s},p={p}", lambda c, r, op=op, k=k, s=s, p=p:
                   Built(B.pool_2d(leaf(c, r, F32, (11, 9, 2, 2), layout="rowgap"), op, k, k, s, s, p, p)))
    yield Case(d.key, "MAX,in=[7,6,2,1],k=4,2,s=3,2,p=2,1", lambda c, r: Built(
        B.pool_2d(leaf(c, r, F32, (7, 6, 2, 1)), PoolOp.MAX, 4, 2, 3, 2, 2, 1)))


@family("POOL_1D")
def pool_1d_cases(d: OpDef) -> Iterator[Case]:
    for op, k0, s0, p0 in itertools.product(PoolOp, (1, 2, 3), (1, 2, 3), (0, 1, 2)):
        if p0 >= k0:
            continue
        yield Case(d.key, f"{op.name},in=[10,3,2],k0={k0},s0={s0},p0={p0},f32",
                   lambda c, r, op=op, k0=k0, s0=s0, p0=p0: Built(B.pool_1d(leaf(c, r, F32, (10, 3, 2)), op, k0, s0,
                                                                            p0)))
    for op in PoolOp:
        yield Case(d.key, f"{op.name},in=[16,4],k0=3,s0=2,p0=1,f16", lambda c, r, op=op: Built(
            B.pool_1d(leaf(c, r, F16, (16, 4)), op, 3, 2, 1)))
        yield Case(d.key, f"{op.name},in=[13,3,2] rowgap,k0=4,s0=3,p0=1", lambda c, r, op=op: Built(
            B.pool_1d(leaf(c, r, F32, (13, 3, 2), layout="rowgap"), op, 4, 3, 1)))


@family("POOL_2D_BACK")
def pool_2d_back_cases(d: OpDef) -> Iterator[Case]:
    grid = [(3, 3, 2, 2, 1, 1), (2, 2, 2, 2, 0, 0), (3, 3, 1, 1, 0, 0), (3, 2, 1, 2, 1, 0), (1, 1, 1, 1, 1, 1)]
    for op, (k0, k1, s0, s1, p0, p1) in itertools.product(PoolOp, grid):
        def build(c, r, op=op, ks=(k0, k1, s0, s1, p0, p1)):
            kw = dict(zip(("k0", "k1", "s0", "s1", "p0", "p1"), ks), op=op)
            af = leaf(c, r, F32, POOL_IN)
            fwd = B.pool_2d(af, **kw)  # only for the gradient's extents
            return Built(B.pool_2d_back(leaf(c, r, F32, fwd.ne), af, **kw))
        yield Case(d.key, f"{op.name},af={dims(POOL_IN)},k={k0},{k1},s={s0},{s1},p={p0},{p1}", build)


# ------------------------------------------------------------------ upscale
@family("UPSCALE")
def upscale_cases(d: OpDef) -> Iterator[Case]:
    for mode in ScaleMode:
        yield Case(d.key, f"{mode.name},[10,5,4,3] x2", lambda c, r, mode=mode: Built(
            B.upscale(leaf(c, r, F32, (10, 5, 4, 3)), 2, mode)))
        for src, dst in [((2, 5, 7, 11), (5, 7, 11, 13)), ((7, 5, 3, 2), (19, 13, 5, 3)), ((12, 9, 2, 1), (5, 4, 2, 1)),
                         ((6, 6, 1, 1), (6, 6, 1, 1)), ((1, 3, 2, 1), (4, 1, 2, 1))]:
            yield Case(d.key, f"{mode.name},{dims(src)}->{dims(dst)}", lambda c, r, mode=mode, src=src, dst=dst: Built(
                B.upscale_ext(leaf(c, r, F32, src), *dst, mode=mode)))
        yield Case(d.key, f"{mode.name},[6,5,3,2] permuted->[11,9,3,2]", lambda c, r, mode=mode: Built(
            B.upscale_ext(leaf(c, r, F32, (6, 5, 3, 2), layout="permuted"), 11, 9, mode=mode)))
    for src, dst in [((5, 4, 2, 1), (9, 7, 2, 1)), ((6, 6, 2, 1), (3, 4, 2, 1)), ((1, 4, 1, 1), (3, 8, 1, 1))]:
        yield Case(d.key, f"BILINEAR,align_corners,{dims(src)}->{dims(dst)}", lambda c, r, src=src, dst=dst: Built(
            B.upscale_ext(leaf(c, r, F32, src), *dst, mode=ScaleMode.BILINEAR, align_corners=True)))


# ------------------------------------------------------------------ gradients
@grad_family("IM2COL")
def im2col_grad(d: OpDef) -> Iterator[GradCase]:
    for ine, kne, p, is_2d in [((5, 4, 2, 1), (3, 2, 2, 1), (1, 2, 1, 0, 1, 1), True),
                               ((6, 5, 1, 2), (2, 2, 1, 3), (2, 1, 1, 1, 1, 2), True),
                               ((7, 2, 2, 1), (3, 2, 1, 1), (2, 0, 1, 0, 1, 0), False),
                               ((8, 1, 1, 1), (3, 1, 1, 1), (1, 0, 2, 0, 2, 0), False)]:
        def build(c, r, ine=ine, kne=kne, p=p, is_2d=is_2d):
            b = param(c, r, ine)
            return B.im2col(const(c, r, kne), b, *p, is_2d), [b]
        yield GradCase(d.key, f"{'2D' if is_2d else '1D'},in={dims(ine)},k={dims(kne)},s,p,d={p}", build)


def distinct_param(c: Context, r: np.random.Generator, ne, spacing: float = 0.05) -> Tensor:
    """An F32 parameter whose values are all at least ``spacing`` apart (a shuffled ladder),
    so a max does not change its argument under small perturbations."""
    n = int(np.prod(ne))
    vals = (r.permutation(n) - n / 2) * spacing
    return c.from_numpy(vals.astype(np.float32).reshape(tuple(reversed(tuple(ne))))).set_param()


@grad_family("POOL_2D")
def pool_2d_grad(d: OpDef) -> Iterator[GradCase]:
    for op, ne, kw in [(PoolOp.MAX, (6, 5, 2, 1), dict(k0=3, k1=3, s0=2, s1=2, p0=1, p1=1)),
                       (PoolOp.MAX, (5, 4, 2, 1), dict(k0=2, k1=2, s0=1, s1=1, p0=0, p1=0)),
                       (PoolOp.MAX, (7, 4, 1, 2), dict(k0=3, k1=2, s0=2, s1=1, p0=0, p1=1)),
                       (PoolOp.AVG, (6, 5, 2, 1), dict(k0=3, k1=3, s0=2, s1=2, p0=1, p1=1)),
                       (PoolOp.AVG, (7, 4, 1, 2), dict(k0=2, k1=3, s0=1, s1=2, p0=0, p1=1))]:
        def build(c, r, op=op, ne=ne, kw=kw):
            a = distinct_param(c, r, ne) if op == PoolOp.MAX else param(c, r, ne)
            return B.pool_2d(a, op, **kw), [a]
        desc = f"{op.name},in={dims(ne)},k={kw['k0']},{kw['k1']},s={kw['s0']},{kw['s1']},p={kw['p0']},{kw['p1']}"
        yield GradCase(d.key, desc, build, h=1e-3)
