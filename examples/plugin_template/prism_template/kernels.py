"""The template's kernels. Each takes the graph node and writes its result into the
node's memory, ``node.host()``: a strided NumPy view in NumPy order (ne3, ne2, ne1, ne0)
with byte strides (nb3, nb2, nb1, nb0). Sources may be non-contiguous (permuted,
transposed, with row gaps or offsets); in-place nodes share memory with their first
source, so every kernel computes into a temporary before it writes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from prism_core import F16, F32, Tensor, Unsupported

KERNELS: dict[str, Callable[[Tensor], None]] = {}
_DTYPE = {F32: np.float32, F16: np.float16}


def kernel(*keys: str):
    def deco(f):
        for k in keys:
            KERNELS[k] = f
        return f
    return deco


def broadcast_view(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``b`` repeated to ``shape`` (ggml's modulo broadcast: out[i] = b[i % len]) without a copy.

    Each axis of extent ``n`` becomes two axes (n // len, len), the first with stride 0;
    the result has 2 * ndim axes."""
    new_shape, new_strides = [], []
    for n, m, s in zip(shape, b.shape, b.strides):
        if n % m:
            raise Unsupported(f"cannot broadcast extent {m} to {n}")
        new_shape += [n // m, m]
        new_strides += [0, s]
    return as_strided(b, shape=new_shape, strides=new_strides, writeable=False)


def split_view(a: np.ndarray, like: tuple[int, ...], writeable: bool = False) -> np.ndarray:
    """``a`` with each axis split as broadcast_view splits it (a view, no copy)."""
    new_shape, new_strides = [], []
    for n, m, s in zip(a.shape, like, a.strides):
        new_shape += [n // m, m]
        new_strides += [m * s, s]
    return as_strided(a, shape=new_shape, strides=new_strides, writeable=writeable)


_UFUNC = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}


@kernel(*_UFUNC)
def binary(node: Tensor) -> None:
    a, b = node.src[0].host(), node.src[1].host()  # F32 or F16 views (supports() checked the types)
    out = node.host()
    if a.shape != out.shape:  # what a kernel must check rather than assume
        raise Unsupported(f"{node.label}: source 0 has shape {a.shape}, the result {out.shape}")
    bb = broadcast_view(b, a.shape)
    aa = split_view(a, b.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        res = _UFUNC[node.opdef.key](aa.astype(np.float32), bb.astype(np.float32))  # a fresh array
    split_view(out, b.shape, writeable=True)[...] = res.astype(_DTYPE[node.type])  # rounds to F16 if needed


@kernel("MUL_MAT")
def mul_mat(node: Tensor) -> None:
    """out[i3, i2, n, m] = sum_k a[i3 // r3, i2 // r2, m, k] * b[i3, i2, n, k] (NumPy order)."""
    a, b, out = node.src[0].host(), node.src[1].host(), node.host()
    if node.src[0].type == F16:  # ggml's CPU semantics: an F16 a's products take b rounded to F16
        b = b.astype(np.float16)
    (a3, a2, m, k), (b3, b2, n, kb) = a.shape, b.shape
    if kb != k or b3 % a3 or b2 % a2 or out.shape != (b3, b2, n, m):
        raise Unsupported(f"{node.label}: unexpected shapes a {a.shape}, b {b.shape}, out {out.shape}")
    r3, r2 = b3 // a3, b2 // a2
    # a's batch dims broadcast blockwise (each a matrix serves r consecutive b matrices): stride 0 on r
    a6 = as_strided(a, shape=(a3, r3, a2, r2, m, k),
                    strides=(a.strides[0], 0, a.strides[1], 0, a.strides[2], a.strides[3]), writeable=False)
    b6 = b.reshape(a3, r3, a2, r2, n, k)  # splitting axes is always a view
    res = np.einsum("wxyzmk,wxyznk->wxyznm", a6.astype(np.float32), b6.astype(np.float32))
    out.reshape(a3, r3, a2, r2, n, m)[...] = res  # node.type is F32 for MUL_MAT
