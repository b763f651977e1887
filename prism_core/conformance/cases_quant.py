"""Conformance cases of the ops that read or write block (quantized) types, for every block type
each op accepts in the op table: odd row counts, a GEMV and a GEMM, ggml's batch broadcast, a
permuted src1, rows of zeros, a constant row and an outlier, in-place ADD and quantized views.

Weights of a type with a quantizer are quantized from float rows (ggml's reference quantizer);
those of the dequantize-only types (IQ1/IQ2/IQ3) are random block bytes with a sane scale, since
no quantizer exists for them without an importance matrix.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..context import Context
from ..ops import build as B
from ..ops.table import QUANT_WEIGHTS, QUANT_WRITABLE, QUANTIZED, OpDef
from ..tensor import Tensor
from ..types import F32, I32, I64, GGMLType, traits
from .cases import Built, Case, dims, extra, leaf, tname


def _ordered(types: frozenset[GGMLType]) -> list[GGMLType]:
    return sorted(types, key=int)


def edge_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal rows, with (along the last-but-one axis) a row of zeros, a constant row, a row with
    one large outlier and a negative-only row: the corners of every block quantizer."""
    v = rng.standard_normal(shape).astype(np.float32)
    rows = v.reshape(-1, shape[-1])
    specials = [np.zeros(shape[-1]), np.full(shape[-1], 0.37), None, -np.abs(rows[3 % len(rows)])]
    for i, s in enumerate(specials):
        if i >= len(rows):
            break
        if s is None:
            rows[i] = rng.standard_normal(shape[-1]) * 0.1
            rows[i, shape[-1] // 3] = 50.0
        else:
            rows[i] = s
    return v


def random_blocks(rng: np.random.Generator, t: GGMLType, shape: tuple[int, ...]) -> np.ndarray:
    """Random block bytes of a dequantize-only type (``shape`` ends with a row's bytes) whose
    fp16 scale is small and finite (random bits there would give infinities and NaNs)."""
    raw = rng.integers(0, 256, size=shape, dtype=np.uint8)
    size = traits(t).type_size
    blocks = raw.reshape(-1, size)
    d = rng.uniform(0.002, 0.02, size=len(blocks)).astype(np.float16).view(np.uint16)
    if t == GGMLType.IQ1_M:  # the scale's 16 bits sit in the top nibble of the four trailing uint16 words
        words = blocks[:, size - 8:].copy().view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12).astype(np.uint16)
        blocks[:, size - 8:] = words.view(np.uint8)
    else:  # fp16 d leads the block
        blocks[:, :2] = d.reshape(-1, 1).view(np.uint8)
    return raw


def qleaf(c: Context, r: np.random.Generator, t: GGMLType, ne, layout: str = "contiguous") -> Tensor:
    """A leaf of block type ``t`` (layouts: contiguous, or ``rowgap``: rows followed by an unused
    block, a view) holding :func:`edge_rows` quantized, or random blocks of a dequantize-only type."""
    ne = tuple(ne) + (1,) * (4 - len(ne))
    blck = traits(t).blck_size
    if layout == "rowgap":
        base = c.new_tensor(t, (ne[0] + blck, *ne[1:]))
        view = B.view_4d(base, *ne, base.nb[1], base.nb[2], base.nb[3], 0)
    else:
        base = view = c.new_tensor(t, ne)
    if t in QUANT_WRITABLE:
        base.set(edge_rows(r, tuple(reversed(base.ne))))
    else:
        base.set_raw(random_blocks(r, t, base.raw().shape))
    return view


# ------------------------------------------------------------------ matrix products
@extra("MUL_MAT")
def mul_mat_quant(d: OpDef) -> Iterator[Case]:
    for t in _ordered(QUANT_WEIGHTS):
        k = max(256, traits(t).blck_size)
        for m, n in ((15, 1), (15, 9)):
            yield Case(d.key, f"{tname(t, F32)},m={m},n={n},k={k}", lambda c, r, t=t, k=k, m=m, n=n: Built(
                B.mul_mat(qleaf(c, r, t, (k, m)), leaf(c, r, F32, (k, n)))))
        a_ne, b_ne = (k, 7, 2, 1), (k, 5, 4, 3)
        yield Case(d.key, f"{tname(t, F32)},a={dims(a_ne)},b={dims(b_ne)} (broadcast)",
                   lambda c, r, t=t, a_ne=a_ne, b_ne=b_ne: Built(
                       B.mul_mat(qleaf(c, r, t, a_ne), leaf(c, r, F32, b_ne))))
        yield Case(d.key, f"{tname(t, F32)},a rowgap,b permuted", lambda c, r, t=t, k=k: Built(
            B.mul_mat(qleaf(c, r, t, (k, 6, 2), layout="rowgap"), leaf(c, r, F32, (k, 3, 4), layout="permuted3"))))


@extra("MUL_MAT_ID")
def mul_mat_id_quant(d: OpDef) -> Iterator[Case]:
    for t in _ordered(QUANT_WEIGHTS):
        k = max(256, traits(t).blck_size)
        def build(c, r, t=t, k=k):
            ids = c.from_numpy(np.array([[0, 3], [2, 2], [1, 0]], np.int32))  # 3 tokens x 2 used experts
            return Built(B.mul_mat_id(qleaf(c, r, t, (k, 7, 4)), leaf(c, r, F32, (k, 2, 3)), ids))
        yield Case(d.key, f"{tname(t, F32)},experts=4,used=2,tokens=3,k={k}", build)


@extra("OUT_PROD")
def out_prod_quant(d: OpDef) -> Iterator[Case]:
    for t in _ordered(QUANT_WEIGHTS):
        k = max(256, traits(t).blck_size)
        yield Case(d.key, f"{tname(t, F32)},a=[{k},6,2],b=[5,6,4]", lambda c, r, t=t, k=k: Built(
            B.out_prod(qleaf(c, r, t, (k, 6, 2)), leaf(c, r, F32, (5, 6, 4)))))


# ------------------------------------------------------------------ rows and conversions
@extra("GET_ROWS")
def get_rows_quant(d: OpDef) -> Iterator[Case]:
    for t in _ordered(QUANTIZED):
        k = traits(t).blck_size * 2
        yield Case(d.key, f"{tname(t)},n={k},rows=9,m=5,b=2", lambda c, r, t=t, k=k: Built(
            B.get_rows(qleaf(c, r, t, (k, 9, 2)), leaf(c, r, I32, (5, 2), 0, 9))))


@extra("CPY")
def cpy_quant(d: OpDef) -> Iterator[Case]:
    for t in _ordered(QUANT_WRITABLE):
        k = traits(t).blck_size
        yield Case(d.key, f"f32->{tname(t)},ne=[{2 * k},5,3]", lambda c, r, t=t, k=k: Built(B.cpy(
            c.from_numpy(edge_rows(r, (3, 5, 2 * k))), c.new_tensor(t, (2 * k, 5, 3)))))
        yield Case(d.key, f"f32 permuted->{tname(t)},[{k},6]", lambda c, r, t=t, k=k: Built(B.cpy(
            leaf(c, r, F32, (6, k), layout="permuted"), c.new_tensor(t, (k, 6)))))
    for t in _ordered(QUANTIZED):
        k = traits(t).blck_size
        yield Case(d.key, f"{tname(t)}->f32,ne=[{2 * k},5,3]", lambda c, r, t=t, k=k: Built(B.cpy(
            qleaf(c, r, t, (2 * k, 5, 3)), c.new_tensor(F32, (2 * k, 5, 3)))))
        yield Case(d.key, f"{tname(t)}->{tname(t)} reshaped,[{2 * k},3]->[{k},6]", lambda c, r, t=t, k=k: Built(
            B.cpy(qleaf(c, r, t, (2 * k, 3)), c.new_tensor(t, (k, 6)))))


@extra("DUP", "CONT")
def copy_quant(d: OpDef) -> Iterator[Case]:
    fn = B.dup if d.key == "DUP" else B.cont
    for t in _ordered(QUANTIZED):
        k = traits(t).blck_size
        yield Case(d.key, f"{tname(t)},rowgap [{k},4,2]", lambda c, r, t=t, k=k: Built(
            fn(qleaf(c, r, t, (k, 4, 2), layout="rowgap"))))


@extra("SET_ROWS")
def set_rows_quant(d: OpDef) -> Iterator[Case]:
    for t, it in ((t, I64 if i % 2 else I32) for i, t in enumerate(_ordered(QUANT_WRITABLE))):
        k = traits(t).blck_size
        def build(c, r, t=t, it=it, k=k):
            dst = qleaf(c, r, t, (k, 10, 2))
            idx = c.from_numpy(np.array([[7, 0, 3]], {I32: np.int32, I64: np.int64}[it]))
            return Built(B.set_rows(dst, c.from_numpy(edge_rows(r, (2, 3, k))), idx))
        yield Case(d.key, f"{tname(t)} destination [{k},10,2],rows=3,{tname(it)} indices", build)


@extra("ADD")
def add_quant(d: OpDef) -> Iterator[Case]:
    for t in _ordered(QUANT_WRITABLE):
        k = traits(t).blck_size
        yield Case(d.key, f"{tname(t)}+f32,ne=[{k},5,2]", lambda c, r, t=t, k=k: Built(
            B.add(qleaf(c, r, t, (k, 5, 2)), leaf(c, r, F32, (k, 5, 2)))))
    yield Case(d.key, "q8_0+f32 in place,ne=[64,3]", lambda c, r: Built(
        B.add_inplace(qleaf(c, r, GGMLType.Q8_0, (64, 3)), leaf(c, r, F32, (64, 3)))))


