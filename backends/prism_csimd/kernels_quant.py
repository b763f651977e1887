"""csimd wrappers of the quantized C kernels (csrc/csimd_quant*.h): the op cases of block types.

Imported at the bottom of :mod:`prism_csimd.kernels`, after the float wrappers: each op here is
registered again with its block types added to the accepted ones, and calls the float wrapper
for float operands. Block-type tensors reach C as descriptors of type ``CSIMD_QBASE + ggml id``
(rows of whole blocks, ``nb[0]`` the block's bytes), validated like every other view.

* MUL_MAT / MUL_MAT_ID: b's rows are quantized once to the weight's ``vec_dot_type`` (its traits) as ggml's CPU
  backend does (Q8_0/Q8_1 with ties to even, Q8_K), then integer dot products; results differ
  from the reference's exact dequantized product by that rounding (within the op's nmse bound).
* GET_ROWS, CPY/DUP/CONT to F32: dequantized exactly as gguf.quants (bit for bit).
* CPY/SET_ROWS into a block type, ADD with a quantized a: ggml's reference quantizer (as the
  reference backend stores block types), so the bytes equal the reference's; every type the op
  table writes has one in C (a type added to the table without one is refused with the reason).
  A NaN or inf among the floats to quantize, or a block whose scale would overflow F16, is refused
  as the reference refuses it, with the destination untouched: the C kernel checks them all before
  writing (``Q_UNQUANTIZABLE``) and prism_core.quant names the row and block.
* OUT_PROD with a quantized a: a dequantized once, then the F32 kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prism_core import Tensor
from prism_core.errors import InvalidArgument
from prism_core.ops.table import QUANT_WEIGHTS, QUANT_WRITABLE, QUANTIZED
from prism_core.quant import quantize
from prism_core.types import F32, GGMLType, traits

from . import kernels as _k
from .kernels import FLOATS, INDICES, ONLY_F32, _check, _lib, _nth, _state, desc, kernel

G = GGMLType
QBASE = 64  # csrc/csimd.h: CSIMD_QBASE
REFERENCE = 1  # csimd_q_quantize's mode: ggml's reference quantizer (mode 0: its CPU from_float)
UNQUANTIZABLE = -3  # csrc/csimd_quant_api.h: Q_UNQUANTIZABLE, a NaN/inf or an overflowing block scale (nothing written)

# block types csrc/csimd_quant.h can write (ggml's reference quantizers, the searching ones of Q2_K..Q6_K,
# IQ4_NL and IQ4_XS included: csrc/csimd_quantize_k3iq4.h): any other type the op table writes is refused
# here and the reference computes it
C_QUANTIZERS = frozenset({G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0, G.Q8_1, G.Q8_K, G.MXFP4, G.TQ1_0, G.TQ2_0,
                          G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K, G.IQ4_NL, G.IQ4_XS})
C_WRITABLE = QUANT_WRITABLE & C_QUANTIZERS

def _check_quantized(rc: int, n: Tensor, what: str, rows: Callable[[], np.ndarray]) -> None:
    """_check, and for Q_UNQUANTIZABLE the reference's error naming the row: prism_core.quant checks the
    float rows C refused (only on this error path are they gathered in NumPy) as it quantizes them."""
    if rc == UNQUANTIZABLE:
        quantize(rows(), n.type)
        raise InvalidArgument(f"{what}: a value to quantize to {n.traits.name} is NaN or inf, or a block's scale "
                              "overflows")  # C saw one, NumPy not
    _check(rc, what)


def _numpy_rows(t: Tensor) -> np.ndarray:
    return np.asarray(t.numpy(), np.float32).reshape(tuple(reversed(t.ne)))


def is_block(t: Tensor) -> bool:
    return t.traits.is_quantized


def quantizer_refusal(node: Tensor) -> str:
    """Why csimd cannot write node's block type ("" when it can): quantizing needs a C quantizer (a copy
    between tensors of one block type moves blocks and needs none)."""
    if is_block(node) and node.type not in C_QUANTIZERS and any(
            s is not None and s.type != node.type for s in node.src):
        return f"no C quantizer for {node.traits.name} (csimd has ggml's reference ones for " \
               f"{', '.join(sorted(traits(t).name for t in C_QUANTIZERS))})"
    return ""


def dense_rows_refusal(t: Tensor) -> str:
    """Why the C kernels cannot read block tensor t ("" when they can): rows of contiguous blocks."""
    if is_block(t) and t.nb[0] != t.traits.type_size:
        return f"{t.label}: a {t.traits.name} view whose blocks are not contiguous within a row"
    return ""


@kernel((FLOATS | QUANT_WEIGHTS, FLOATS), ONLY_F32, "MUL_MAT")
def _mul_mat(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if not is_block(a):
        return _k._mul_mat(n)
    keep: list = []
    _check(_lib().csimd_q_mul_mat(desc(a, keep), desc(b, keep), desc(n, keep), int(a.traits.vec_dot_type),
                                  int(_state.get("threads", 1))), "MUL_MAT")


@kernel((FLOATS | QUANT_WEIGHTS, FLOATS, INDICES), ONLY_F32, "MUL_MAT_ID", reads_values=True)
def _mul_mat_id(n: Tensor) -> None:
    w, b, ids = n.src[0], n.src[1], n.src[2]
    if not is_block(w):
        return _k._mul_mat_id(n)
    keep: list = []
    idx = ids.host()
    if idx.size and (idx.min() < 0 or idx.max() >= w.ne[2]):
        raise InvalidArgument(f"MUL_MAT_ID: expert id out of range [0, {w.ne[2]})")
    _check(_lib().csimd_q_mul_mat_id(desc(w, keep), desc(b, keep), desc(ids, keep), desc(n, keep),
                                     int(w.traits.vec_dot_type), _nth(n.nelements * w.ne[0])), "MUL_MAT_ID")


@kernel((FLOATS | INDICES | QUANTIZED, INDICES), ONLY_F32 | INDICES, "GET_ROWS", reads_values=True)
def _get_rows(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if not is_block(a):
        return _k._get_rows(n)
    keep: list = []
    _k.check_row_indices("GET_ROWS", b, a.ne[1])
    _check(_lib().csimd_q_get_rows(desc(a, keep), desc(b, keep), desc(n, keep), _nth(n.nelements)), "GET_ROWS")


@kernel((FLOATS | INDICES | QUANTIZED,), FLOATS | INDICES | QUANTIZED, "DUP", "CONT")
@kernel((FLOATS | INDICES | QUANTIZED, FLOATS | INDICES | QUANTIZED), FLOATS | INDICES | QUANTIZED, "CPY")
def _cpy(n: Tensor) -> None:
    a = n.src[0]
    if not (is_block(a) or is_block(n)):
        return _k._cpy(n)
    keep: list = []
    rc = _lib().csimd_q_cpy(desc(a, keep), desc(n, keep), REFERENCE, _nth(n.nelements))
    _check_quantized(rc, n, n.opdef.key, lambda: _numpy_rows(a).reshape(tuple(reversed(n.ne))))


@kernel((frozenset({F32, _k.F16}), frozenset({_k.I32, _k.I64}), FLOATS | C_WRITABLE), FLOATS | C_WRITABLE,
        "SET_ROWS", reads_values=True)
def _set_rows(n: Tensor) -> None:
    if not is_block(n):
        return _k._set_rows(n)
    keep: list = []
    b, c, a = n.src[0], n.src[1], n.src[2]
    if n.type != a.type:
        raise InvalidArgument("SET_ROWS: the result must have the destination's type")
    _k.check_row_indices("SET_ROWS", c, n.ne[1])
    rc = _lib().csimd_q_set_rows(desc(b, keep), desc(c, keep), desc(n, keep), REFERENCE, _nth(b.nelements))
    _check_quantized(rc, n, "SET_ROWS", lambda: _numpy_rows(b))


@kernel((FLOATS | QUANT_WEIGHTS, FLOATS), ONLY_F32, "OUT_PROD")
def _out_prod(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if not is_block(a):
        return _k._out_prod(n)
    keep: list = []
    _check(_lib().csimd_q_out_prod(desc(a, keep), desc(b, keep), desc(n, keep), int(_state.get("threads", 1))),
           "OUT_PROD")


@kernel((FLOATS | C_WRITABLE, FLOATS), FLOATS | C_WRITABLE, "ADD")
def _add(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if not is_block(a):
        return _k._binary(n)
    keep: list = []
    rc = _lib().csimd_q_add(desc(a, keep), desc(b, keep), desc(n, keep), REFERENCE, _nth(8 * n.nelements))
    _check_quantized(rc, n, "ADD", lambda: _numpy_rows(a) + _numpy_rows(b))


# ---------------------------------------------------------------- row quantizers for prism_core.quant
ROW_MODES = {"ref": 1, "chunk": 2}  # csrc/csimd.h: csimd_q_quantize_rows' modes
NEEDS_IMATRIX = -2  # csimd_q_quantize_rows: the type needs an importance matrix and got none


def quantize_rows(rows: np.ndarray, type: GGMLType, mode: str, imatrix: np.ndarray | None,
                  threads: int | None) -> np.ndarray | None:
    """ggml's quantizers in C (csrc/csimd_quantize_rows.h) on float32 rows (nrows, n_per_row); None when C has
    none for ``type`` in ``mode`` (see prism_core.plugin.base.Backend.quantize_rows)."""
    if "lib" not in _state or mode not in ROW_MODES:
        return None
    lib, ffi = _state["lib"], _state["ffi"]
    t, m = int(type), ROW_MODES[mode]
    avail = lib.csimd_q_row_quantizer(t, m)
    if avail == 0 or (avail == 2 and imatrix is None):
        return None
    tr = traits(type)
    nrows, n = rows.shape
    out = np.empty((nrows, n // tr.blck_size * tr.type_size), np.uint8)
    if nrows == 0:
        return out
    qw = ffi.NULL if imatrix is None else ffi.from_buffer("float[]", imatrix)
    nth = int(_state.get("threads", 1)) if threads is None else max(1, int(threads))
    rc = lib.csimd_q_quantize_rows(t, m, ffi.from_buffer("float[]", rows), ffi.from_buffer("uint8_t[]", out),
                                   nrows, n, qw, nth)
    if rc == NEEDS_IMATRIX:
        return None
    _check(rc, f"quantizing to {tr.name}")
    return out
