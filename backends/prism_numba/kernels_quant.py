"""Node-level wrappers of the block (quantized) types (compiled kernels: :mod:`._jit_quant`).

Imported by the backend after :mod:`.kernels` and :mod:`.kernels_ext`: each op here is registered
again with block types added to the accepted ones, and hands float operands to the float wrapper.
What is compiled and what is not (README.md, "Block types"):

* compiled (numba): decoding blocks to float32 (``_jit_quant.decode_row``, bit for bit ggml's and
  gguf.quants' dequantizers) for every format with a quantizer, and on it MUL_MAT, MUL_MAT_ID,
  GET_ROWS, CPY/DUP/CONT to F32, OUT_PROD (decode once, then the F32 kernel) and ADD into F32;
  block-to-block copies of one type (a byte copy).
* through prism_core.quant, in NumPy, said here and refused to prepared calls (so a plan runs
  them afresh on every compute): quantizing (CPY/SET_ROWS into a block type, ADD into a block
  type), with ggml's reference quantizer as the reference backend stores block types; and
  decoding the formats without a compiled decoder (IQ1_S, IQ1_M, IQ2_*, IQ3_*, NVFP4), whose
  values prism_core.quant.dequantize provides before the F32 kernels run.
"""

from __future__ import annotations

import numpy as np

from prism_core import Tensor
from prism_core.errors import InvalidArgument, Unsupported
from prism_core.ops.semantics import checked_row_indices
from prism_core.ops.table import QUANT_WEIGHTS, QUANT_WRITABLE, QUANTIZED
from prism_core.quant import dequantize, quantize
from prism_core.types import F16, F32, I32, I64

from . import kernels as _k
from . import kernels_ext as _ext
from .kernels import _MODE, COPYABLE, FLOATS, INDICES, ONLY_F32, _jit, _run, arr, f32_operand, kernel, lut

#: ggml type ids with a compiled decoder (mirrors _jit_quant.DECODED, which needs numba to import)
DECODED = frozenset({2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 23, 34, 35, 39})
#: ggml type ids with the integer path (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL, IQ4_XS, MXFP4; mirrors
#: _jit_qdot.INT_FORMATS), taken at every activation row count: the path is chosen by the weight's format
#: alone, as ggml's CPU backend does, so that a row's product never depends on how many rows share its
#: MUL_MAT (README.md, "Block types")
INT_FORMATS = frozenset({2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 39})
BLOCK_TYPES = QUANTIZED


def is_block(t: Tensor) -> bool:
    return t.traits.is_quantized


def dense_rows_refusal(t: Tensor) -> str:
    """Why the kernels cannot read block tensor t ("" when they can): rows of contiguous blocks."""
    if is_block(t) and t.ne[0] != t.traits.blck_size and t.nb[0] != t.traits.type_size:
        return f"{t.label}: a {t.traits.name} view whose blocks are not contiguous within a row"
    return ""


def _python_step(what: str) -> None:
    """Work done in NumPy on the node's current values: never bound once into a prepared call."""
    if _MODE.calls is not None:
        raise Unsupported(f"{what} runs through prism_core.quant on every compute (not prepared)")


def _values(t: Tensor) -> np.ndarray:
    """t's values as a float32 4-dim array: decoded by the compiled kernel where a decoder
    exists (into a new buffer, refilled on every compute of a prepared call), else through
    prism_core.quant.dequantize (NumPy; see the module docstring)."""
    raw = t.raw()
    out = np.empty((*raw.shape[:3], t.ne[0]), np.float32)
    if int(t.type) in DECODED:
        _run("q_dequant", int(t.type), raw, out)
    else:
        _python_step(f"decoding {t.traits.name}")
        out[...] = dequantize(raw, t.type)
    return out


def _store_blocks(n: Tensor, values: np.ndarray) -> None:
    """Quantize float32 rows (n's NumPy shape) into n's blocks with ggml's reference quantizer."""
    _python_step(f"quantizing to {n.traits.name}")
    n.raw()[...] = quantize(np.ascontiguousarray(values, np.float32), n.type)


# ------------------------------------------------------------------ products
@kernel((FLOATS | QUANT_WEIGHTS, FLOATS), ONLY_F32, "MUL_MAT")
def _mul_mat(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if not is_block(a):
        return _k._mul_mat(n)
    if int(a.type) not in DECODED:
        _run("mul_mat", _values(a), _jit().NO_LUT, f32_operand(b), arr(n))
        return
    _run("q_mul_mat_int" if int_path(n) else "q_mul_mat", int(a.type), a.raw(), f32_operand(b), arr(n))


def int_path(n: Tensor) -> bool:
    """Whether MUL_MAT node n takes the integer path: a format that has one, on a CPU with AVX-512 VNNI,
    AVX-VNNI or AVX2 (isa.py; the portable vector code of other CPUs measured 2-10x slower than the
    float path). Not the number of activation rows: a decode row batched with a prompt chunk then gets
    the bits it gets alone."""
    if int(n.src[0].type) not in INT_FORMATS:
        return False
    from . import _qvec  # numba is imported by now: the kernels are
    return _qvec.INT_PATH


@kernel((FLOATS | QUANT_WEIGHTS, FLOATS, INDICES), ONLY_F32, "MUL_MAT_ID", reads_values=True)
def _mul_mat_id(n: Tensor) -> None:
    w, b, ids = n.src[0], n.src[1], n.src[2]
    if not is_block(w):
        return _ext._mul_mat_id(n)
    idh = ids.host()
    if idh.size and (idh.min() < 0 or idh.max() >= w.ne[2]):
        raise InvalidArgument(f"MUL_MAT_ID: expert id out of range [0, {w.ne[2]})")
    if int(w.type) not in DECODED:
        vals = _values(w)
        _run("mul_mat_id", vals, _jit().NO_LUT, arr(b), lut(b), idh, arr(n))
        return
    _run("q_mul_mat_id", int(w.type), w.raw(), f32_operand(b), idh, arr(n))


@kernel((FLOATS | QUANT_WEIGHTS, FLOATS), ONLY_F32, "OUT_PROD")
def _out_prod(n: Tensor) -> None:
    a = n.src[0]
    if not is_block(a):
        return _k._out_prod(n)
    _k.out_prod_arrays(n, _values(a), _jit().NO_LUT)  # decoded once, then the F32 kernel


# ------------------------------------------------------------------ rows and copies
@kernel((FLOATS | INDICES | QUANTIZED, INDICES), ONLY_F32 | INDICES, "GET_ROWS", reads_values=True)
def _get_rows(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if not is_block(a):
        return _k._get_rows(n)
    idx = checked_row_indices("GET_ROWS", b, a.ne[1])
    if int(a.type) in DECODED:
        _run("q_get_rows", int(a.type), a.raw(), idx, arr(n))
    else:
        _run("get_rows", _values(a), _jit().NO_LUT, idx, arr(n))


@kernel((COPYABLE | QUANTIZED,), COPYABLE | QUANTIZED, "DUP", "CONT")
@kernel((COPYABLE | QUANTIZED, COPYABLE | QUANTIZED), COPYABLE | QUANTIZED, "CPY")
def _cpy(n: Tensor) -> None:
    a = n.src[0]
    if not (is_block(a) or is_block(n)):
        return _k._cpy(n)
    if a.type == n.type:  # the blocks themselves, in row-major order
        src, out = a.raw(), n.raw()
        _run("cpy", src, _jit().NO_LUT, out, 1, 1, int(src.shape == out.shape))
        return
    if not is_block(n):  # blocks -> F32, the op table's only plain destination of blocks (_conversion_rule)
        out, raw = arr(n), a.raw()
        if int(a.type) in DECODED and out.shape == (*raw.shape[:3], a.ne[0]):  # row for row: decode in place
            _run("q_dequant", int(a.type), raw, out)
            return
        vals = _values(a)
        _run("cpy", vals, _jit().NO_LUT, out, 1, 1, int(vals.shape == out.shape))
        return
    vals = _values(a) if is_block(a) else a.numpy().astype(np.float32)
    _store_blocks(n, np.ascontiguousarray(vals).reshape(tuple(reversed(n.ne))))


@kernel((frozenset({F32, F16}), frozenset({I32, I64}), FLOATS | QUANT_WRITABLE), FLOATS | QUANT_WRITABLE,
        "SET_ROWS", reads_values=True)
def _set_rows(n: Tensor) -> None:
    if not is_block(n):
        return _ext._set_rows(n)
    b, c, a = n.src[0], n.src[1], n.src[2]
    if n.type != a.type:
        raise InvalidArgument("SET_ROWS: the result must have the destination's type")
    rows = checked_row_indices("SET_ROWS", c, n.ne[1])
    _python_step(f"quantizing to {n.traits.name}")
    if not a.same_view(n) or a.base is not n.base:
        n.raw()[...] = a.raw()
    dst = n.raw()
    blocks = quantize(b.numpy().astype(np.float32).reshape(tuple(reversed(b.ne))), n.type)
    n3, n2, nm = blocks.shape[0], blocks.shape[1], blocks.shape[2]
    c2, c1 = rows.shape[1], rows.shape[2]
    for k in range(n3):  # rows in order: the last duplicate wins, as ggml
        for j in range(n2):
            for i in range(nm):
                dst[k, j, int(rows[0, k % c2, j % c1, i])] = blocks[k, j, i]


@kernel((FLOATS | QUANT_WRITABLE, FLOATS), FLOATS | QUANT_WRITABLE, "ADD")
def _add(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if not is_block(a):
        return _k._binary(n)
    vals = _values(a)
    out = arr(n) if not is_block(n) else np.empty((*vals.shape[:3], n.ne[0]), np.float32)
    _run("binary", vals, _jit().NO_LUT, arr(b), lut(b), out, 1, 0, 0.0, 0.0)
    if is_block(n):
        _store_blocks(n, out)
