"""ggml's block formats: quantize and dequantize rows, byte for byte as ggml does.

``quantize(rows, type)`` takes float rows (any leading dims, last dim a multiple of the
block size) and returns uint8 with the same leading dims and a last dim of that row's
bytes; ``dequantize(blocks, type)`` is its inverse up to the format's precision. Both
follow gguf.quants' array conventions. Quantizers match ggml's ``quantize_row_*_ref``
(no importance matrix); ``quantize_activations`` is what ggml's CPU backend does to
the other operand of a quantized dot product.

Where gguf.quants is exact it does the work (its quantizers for Q4_0..Q8_0, MXFP4,
TQ1_0, TQ2_0, with ``legacy``'s signed-zero corrections; its dequantizers for every
format but Q8_1 and Q8_K); the rest is in ``legacy``, ``kquants`` and ``iquants``.

``quantize_chunk(rows, type, imatrix)`` is ggml_quantize_chunk, what llama-quantize writes: the
reference quantizers, except that IQ4_NL tries 15 candidate scales, with importance-weighted
searches when an importance matrix is given (``weighted``), and the lattice searches of IQ1_S,
IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S.

Both run in C when a backend offers ggml's quantizers (``Backend.quantize_rows``: csimd does),
bit for bit as the NumPy code here; ``PRISM_QUANT=python`` (or ``numpy``) keeps them in NumPy,
``PRISM_QUANT=NAME`` asks backend NAME. The lattice searches are C only (:data:`C_ONLY`): a NumPy
port of their per-group neighbour searches would run at a few kB/s, so without such a backend
they are refused with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from ..errors import InvalidArgument, ShapeMismatch, TypeMismatch, Unsupported
from ..types import GGMLType, TypeTraits, as_type, traits
from . import iquants, kquants, legacy, weighted

__all__ = ["quantize", "quantize_chunk", "dequantize", "can_quantize", "can_dequantize", "quantize_activations",
           "row_quantizer", "NEEDS_IMPORTANCE_MATRIX", "GRID_SEARCH_NOT_PORTED", "C_ONLY", "OUT_OF_SCOPE"]

G = GGMLType
Codec = Callable[[np.ndarray], np.ndarray]


def _gguf_dequantizer(t: GGMLType) -> Codec:
    return lambda blocks: legacy.gguf_dequantize(blocks, t.name)


def _gguf_quantizer(t: GGMLType) -> Codec:
    return lambda blocks: legacy.gguf_quantize(blocks, t.name)


_QUANTIZERS: dict[GGMLType, Codec] = {
    G.Q4_0: legacy.quantize_symmetric("Q4_0"), G.Q5_0: legacy.quantize_symmetric("Q5_0"),
    G.Q4_1: legacy.quantize_affine("Q4_1"), G.Q5_1: legacy.quantize_affine("Q5_1"),
    G.Q8_0: _gguf_quantizer(G.Q8_0), G.Q8_1: legacy.quantize_q8_1,
    G.MXFP4: _gguf_quantizer(G.MXFP4), G.TQ1_0: _gguf_quantizer(G.TQ1_0), G.TQ2_0: _gguf_quantizer(G.TQ2_0),
    G.Q2_K: kquants.quantize_q2_K, G.Q3_K: kquants.quantize_q3_K, G.Q4_K: kquants.quantize_q4_K,
    G.Q5_K: kquants.quantize_q5_K, G.Q6_K: kquants.quantize_q6_K, G.Q8_K: kquants.quantize_q8_K,
    G.IQ4_NL: iquants.quantize_iq4_nl, G.IQ4_XS: iquants.quantize_iq4_xs,
}

_DEQUANTIZERS: dict[GGMLType, Codec] = {
    **{t: _gguf_dequantizer(t) for t in (
        G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K, G.IQ2_XXS, G.IQ2_XS,
        G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ1_S, G.IQ1_M, G.IQ4_NL, G.IQ4_XS, G.TQ1_0, G.TQ2_0, G.MXFP4, G.NVFP4)},
    G.Q8_1: legacy.dequantize_q8_1, G.Q8_K: kquants.dequantize_q8_K,
}

_ACTIVATIONS: dict[GGMLType, Codec] = {
    G.Q8_0: legacy.activations_q8_0, G.Q8_1: legacy.activations_q8_1,
    G.Q8_K: kquants.quantize_q8_K,  # ggml-cpu's x86 quantize_row_q8_K is the reference one
}

#: ggml's quantize_iq* for these assert an importance matrix (ggml_quantize_requires_imatrix): no
#: reference quantizer; quantize_chunk writes them given one.
NEEDS_IMPORTANCE_MATRIX = frozenset({G.IQ2_XXS, G.IQ2_XS, G.IQ1_S})
#: ggml quantizes these without an importance matrix too, by a search over the lattice grids that
#: ggml_quantize_init builds (IQ1_M in ggml_quantize_chunk only: it has no reference entry point).
GRID_SEARCH_NOT_PORTED = frozenset({G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ1_M})
#: The lattice searches, written in C only (csrc/csimd_quantize_grid.h): without a backend offering
#: them (csimd), quantizing to these is refused.
C_ONLY = NEEDS_IMPORTANCE_MATRIX | GRID_SEARCH_NOT_PORTED
#: ggml's reference entry points (quantize_row_*_ref) among them: IQ1_M has none.
_C_REFERENCE = frozenset({G.IQ2_S, G.IQ3_XXS, G.IQ3_S})
ENV_QUANT = "PRISM_QUANT"
#: Formats Prism does not quantize (NVFP4: dequantize only, via gguf) or handle at all (Q1_0, Q2_0).
OUT_OF_SCOPE = frozenset({G.NVFP4, G.Q1_0, G.Q2_0})

# Elements per call of a format's codec: bounds the temporaries of the vectorised searches
# (kept near the L2 cache). Q3_K's search walks the 16 positions of a sub-block one at a
# time, 80 steps of small operations, so it does better with many blocks per call.
_CHUNK_ELEMENTS = 1 << 16
_CHUNK_ELEMENTS_OF = {G.Q3_K: 1 << 19}


def _quant_traits(t: GGMLType | int | str) -> TypeTraits:
    tr = traits(as_type(t))
    if not tr.is_quantized:
        raise TypeMismatch(f"{tr.name} is not a quantized block type; quantize/dequantize take one of "
                           + ", ".join(traits(x).name for x in _DEQUANTIZERS))
    return tr


def can_quantize(type: GGMLType | int | str) -> bool:
    """Whether ``quantize`` writes ``type`` in NumPy (the op table's writable block types); the C-only
    lattice formats are not among them."""
    return as_type(type) in _QUANTIZERS


_ROW_QUANTIZER: dict[tuple[str, int], object] = {}  # (choice, registry generation) -> backend or None


def row_quantizer():
    """The backend whose ``quantize_rows`` runs ggml's quantizers for this module, or None (NumPy):
    ``$PRISM_QUANT`` names one (``python``/``numpy``: none), else the best available backend offering them
    among those the default is chosen from (:meth:`~prism_core.plugin.registry.Registry.candidates`). Kept
    until the registry changes: asking every backend costs more than quantizing a small tensor."""
    from ..plugin.registry import REGISTRY
    choice = os.environ.get(ENV_QUANT, "").strip()
    key = (choice, REGISTRY.generation)
    if key not in _ROW_QUANTIZER:
        _ROW_QUANTIZER.clear()
        _ROW_QUANTIZER[key] = _find_row_quantizer(choice, REGISTRY)
    return _ROW_QUANTIZER[key]


def _find_row_quantizer(choice: str, registry):
    if choice.lower() in ("python", "numpy"):
        return None
    from ..plugin.base import Backend
    if choice:
        return registry.get(choice)
    for info in registry.candidates():  # as the default is chosen: a third party's backend only when named
        if info.available and type(info.backend).quantize_rows is not Backend.quantize_rows:
            return info.backend
    return None


def _accelerated(rows: np.ndarray, tr: TypeTraits, mode: str, imatrix: np.ndarray | None,
                 threads: int | None) -> np.ndarray | None:
    """rows (.., n) quantized by the row-quantizing backend, shaped as quantize returns; None without one."""
    b = row_quantizer()
    if b is None:
        return None
    flat = rows.reshape(-1, rows.shape[-1])
    out = b.quantize_rows(flat, tr.type, mode, imatrix, threads)
    return None if out is None else out.reshape(*rows.shape[:-1], out.shape[-1])


def can_dequantize(type: GGMLType | int | str) -> bool:
    return as_type(type) in _DEQUANTIZERS


def _refuse_quantize(tr: TypeTraits) -> None:
    if tr.type in NEEDS_IMPORTANCE_MATRIX:
        raise Unsupported(f"quantizing to {tr.name} needs an importance matrix (ggml's quantize_{tr.name} "
                          "requires one and has no reference quantizer without it): use "
                          "prism_core.quant.quantize_chunk(rows, type, imatrix)")
    if tr.type == G.IQ1_M:
        raise Unsupported("IQ1_M has no reference quantizer in ggml (only ggml_quantize_chunk's search): use "
                          "prism_core.quant.quantize_chunk")
    if tr.type in C_ONLY:
        _refuse_c_only(tr)
    if tr.type in _DEQUANTIZERS:
        raise Unsupported(f"quantizing to {tr.name} is out of scope in Prism; it can only be dequantized")
    raise Unsupported(f"{tr.name} is out of scope in Prism: it can be neither quantized nor dequantized")


def _float_rows(rows: np.ndarray, tr: TypeTraits, what: str) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.dtype.kind != "f":
        raise TypeMismatch(f"{what} to {tr.name} takes float rows, got dtype {rows.dtype}")
    if rows.ndim == 0:
        raise ShapeMismatch(f"{what} to {tr.name} takes rows (at least 1-d), got a scalar")
    if rows.shape[-1] % tr.blck_size:
        raise ShapeMismatch(f"{what} to {tr.name}: row length {rows.shape[-1]} is not a multiple of "
                            f"{tr.name}'s block size {tr.blck_size}")
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    flat = rows.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.dot(flat, flat)  # inf/NaN anywhere makes it non-finite (overflow may too); faster than a sum
    if not np.isfinite(total) and not (finite := np.isfinite(rows)).all():
        flat = finite.reshape(-1, rows.shape[-1]).all(axis=1)
        bad = int(np.argmin(flat))
        col = int(np.argmin(finite.reshape(-1, rows.shape[-1])[bad]))
        raise InvalidArgument(
            f"{what} to {tr.name}: {_row_at(rows, bad)} holds the non-finite value "
            f"{rows.reshape(-1, rows.shape[-1])[bad, col]} at column {col}; ggml's quantizers give "
            "position-dependent garbage for NaN/inf (its absmax scan skips a NaN or the scale becomes inf/NaN)")
    return rows


#: Below this magnitude no block of any format can overflow a scale it stores (F16's largest is 65504):
#: the largest field is Q8_1's s = d * sum(q) <= 32 * amax (d = amax / 127, |q| <= 127); every other
#: scale is at most about twice the block's largest magnitude. csrc/csimd_quant_api.h uses the same bound.
SAFE_AMAX = 1024.0


def _row_at(rows: np.ndarray, flat_row: int) -> str:
    where = np.unravel_index(flat_row, rows.shape[:-1]) if rows.ndim > 1 else ()
    return f"row {flat_row} (index {tuple(int(i) for i in where)})"


def _refuse_overflowing_scales(rows: np.ndarray, out: np.ndarray, tr: TypeTraits, what: str) -> None:
    """Refuse rows whose quantized block stores a scale that overflowed (F16 inf: every value of the
    block then dequantizes to inf or NaN), as non-finite input is refused. ggml writes such blocks;
    the thresholds follow from each format's scale (Q8_0: d = amax / 127 overflows from amax =
    65520 * 127, Q4_0: d = max / -8 from 65520 * 8, ...; docs/quantize.md). Checked on what the
    quantizer wrote, exact for every format: the blocks holding a value above SAFE_AMAX are
    dequantized, and Q8_1's s (which dequantizing does not read) is read directly."""
    if not rows.size or max(float(rows.max()), -float(rows.min())) <= SAFE_AMAX:  # whole-array passes: no suspect
        return
    blocks = rows.reshape(-1, tr.blck_size)
    amax = np.maximum(blocks.max(axis=1), -blocks.min(axis=1))
    suspect = np.flatnonzero(amax > SAFE_AMAX)  # not empty: some value passed SAFE_AMAX above
    q = out.reshape(-1, tr.type_size)[suspect]
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(dequantize(q, tr.type)).all(axis=1)
    if tr.type == G.Q8_1:  # s = d * sum(q), F16 at byte 2
        bad |= ~np.isfinite(np.ascontiguousarray(q[:, 2:4]).view(np.float16).reshape(-1))
    if not bad.any():
        return
    k = int(suspect[np.argmax(bad)])
    per_row = rows.shape[-1] // tr.blck_size
    row, blk = divmod(k, per_row)
    c0 = blk * tr.blck_size
    raise InvalidArgument(
        f"{what} to {tr.name}: {_row_at(rows, row)}, block {blk} (columns {c0}..{c0 + tr.blck_size - 1}) holds "
        f"a value of magnitude {float(amax[k]):g}, too large for the block: its scale overflows F16 (largest "
        f"65504) and ggml would store inf, every value of the block coming back inf or NaN; scale the data "
        "down, or keep it in F32")


def _chunked(codec: Codec, blocks: np.ndarray, blck_size: int, out_width: int, chunk: int = _CHUNK_ELEMENTS
             ) -> np.ndarray:
    """codec over (nb, ...) blocks, a bounded number at a time (the searches' temporaries
    stay in cache); one chunk is returned as the codec made it, with no extra copy."""
    if not len(blocks):
        return np.empty((0, out_width), np.uint8 if blocks.dtype != np.uint8 else np.float32)
    step = max(1, chunk // blck_size)
    if len(blocks) <= step:
        return codec(blocks)
    return np.concatenate([codec(blocks[i:i + step]) for i in range(0, len(blocks), step)])


def _run(codec: Codec, rows: np.ndarray, tr: TypeTraits) -> np.ndarray:
    out = _chunked(codec, rows.reshape(-1, tr.blck_size), tr.blck_size, tr.type_size,
                   _CHUNK_ELEMENTS_OF.get(tr.type, _CHUNK_ELEMENTS))
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // tr.blck_size * tr.type_size)


def _refuse_c_only(tr: TypeTraits) -> None:
    raise Unsupported(f"quantizing to {tr.name} needs ggml's lattice search, which Prism has in C only (the "
                      "csimd backend; a NumPy port would take hours per model), and no backend offering it is "
                      f"available here ({ENV_QUANT}={os.environ.get(ENV_QUANT, '')!r}; `prism info` says why csimd "
                      "is not)")


def _python_rows(codec: Codec, rows: np.ndarray, tr: TypeTraits) -> np.ndarray:
    out = _run(codec, rows, tr)
    if tr.type == G.IQ4_NL and rows.size:
        flat = out.reshape(-1, out.shape[-1])
        iquants.repeat_zero_blocks(rows.reshape(-1, rows.shape[-1]), flat)
    return out


OVERFLOW_MODES = ("refuse", "ggml")


def _overflow_mode(overflow: str) -> str:
    if overflow not in OVERFLOW_MODES:
        raise InvalidArgument(f"overflow must be one of {', '.join(map(repr, OVERFLOW_MODES))} (what to do with a "
                              f"block whose scale overflows F16), got {overflow!r}")
    return overflow


def quantize(rows: np.ndarray, type: GGMLType | int | str, *, threads: int | None = None,
             overflow: str = "refuse") -> np.ndarray:
    """float rows → ggml blocks (uint8), as ggml's quantize_row_*_ref writes them (each row's last dim
    one ggml row). IQ2_S, IQ3_XXS and IQ3_S (ggml's reference lattice searches) need the C quantizers.
    A block whose scale overflows F16 is refused (InvalidArgument naming the row and block);
    ``overflow="ggml"`` writes it as ggml does instead, with a scale of inf."""
    _overflow_mode(overflow)
    tr = _quant_traits(type)
    if tr.type not in _QUANTIZERS and tr.type not in _C_REFERENCE:
        _refuse_quantize(tr)
    rows = _float_rows(rows, tr, "quantizing")
    out = _accelerated(rows, tr, "ref", None, threads) if rows.size else None
    if out is None:
        if tr.type not in _QUANTIZERS:
            _refuse_c_only(tr)
        out = _python_rows(_QUANTIZERS[tr.type], rows, tr)
    if overflow == "refuse":
        _refuse_overflowing_scales(rows, out, tr, "quantizing")
    return out


# ggml_quantize_chunk with importance weights, in NumPy: per-block codecs (blocks, weights) and row codecs
_WEIGHTED_BLOCKS: dict[GGMLType, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    G.Q2_K: weighted.quantize_q2_K_w, G.Q3_K: weighted.quantize_q3_K_w, G.Q4_K: weighted.quantize_q4_K_w,
    G.Q5_K: weighted.quantize_q5_K_w, G.Q6_K: weighted.quantize_q6_K_w, G.IQ4_XS: weighted.quantize_iq4_xs_w,
    G.IQ4_NL: weighted.quantize_iq4_nl_chunk,
}
_WEIGHTED_ROWS = {G.Q4_0: (weighted.quantize_q4q5_0_rows_w, 4), G.Q5_0: (weighted.quantize_q4q5_0_rows_w, 5),
                  G.Q4_1: (weighted.quantize_q4q5_1_rows_w, 4), G.Q5_1: (weighted.quantize_q4q5_1_rows_w, 5)}
_ROWS_PER_CALL = 64  # bounds the row codecs' temporaries


def _imatrix_of(imatrix: np.ndarray | None, n: int, tr: TypeTraits) -> np.ndarray | None:
    if imatrix is None:
        return None
    im = np.asarray(imatrix)
    if im.dtype.kind != "f":
        raise TypeMismatch(f"quantize_chunk to {tr.name}: imatrix must be float, got dtype {im.dtype}")
    im = np.ascontiguousarray(im, np.float32).reshape(-1)
    if im.size != n:
        raise ShapeMismatch(f"quantize_chunk to {tr.name}: imatrix has {im.size} values, the rows {n} columns "
                            "(one importance per column)")
    if not np.isfinite(im).all():
        raise InvalidArgument(f"quantize_chunk to {tr.name}: imatrix holds a non-finite value at column "
                              f"{int(np.argmin(np.isfinite(im)))} (llama-quantize refuses such a matrix too)")
    return im


def quantize_chunk(rows: np.ndarray, type: GGMLType | int | str, imatrix: np.ndarray | None = None, *,
                   threads: int | None = None, overflow: str = "refuse") -> np.ndarray:
    """float rows → ggml blocks as ggml_quantize_chunk writes them (llama-quantize's quantizers): the
    reference quantizers, IQ4_NL with its 15-scale search, and given ``imatrix`` (float, one importance
    per column: the rows' last dim) the importance-weighted searches; the lattice formats (:data:`C_ONLY`)
    need a backend offering them, and IQ2_XXS, IQ2_XS, IQ1_S an imatrix. ``threads``: the C quantizers'
    thread count (default: the backend's). ``overflow``: as :func:`quantize`'s."""
    _overflow_mode(overflow)
    tr = _quant_traits(type)
    rows = _float_rows(rows, tr, "quantizing")
    im = _imatrix_of(imatrix, rows.shape[-1], tr)
    if tr.type in NEEDS_IMPORTANCE_MATRIX and im is None:
        raise Unsupported(f"quantizing to {tr.name} needs an importance matrix (ggml_quantize_requires_imatrix): "
                          "pass imatrix=")
    if tr.type not in _QUANTIZERS and tr.type not in C_ONLY:
        _refuse_quantize(tr)
    if tr.type in (G.Q8_1, G.Q8_K):
        raise Unsupported(f"{tr.name} is an activation format: ggml_quantize_chunk does not write it")
    out = _accelerated(rows, tr, "chunk", im, threads) if rows.size else None
    if out is None:
        out = _chunk_in_numpy(rows, tr, im)
    if overflow == "refuse":
        _refuse_overflowing_scales(rows, out, tr, "quantizing")
    return out


def _chunk_in_numpy(rows: np.ndarray, tr: TypeTraits, im: np.ndarray | None) -> np.ndarray:
    if tr.type in C_ONLY:
        _refuse_c_only(tr)
    if tr.type == G.IQ4_NL:
        return _run_weighted(weighted.quantize_iq4_nl_chunk, rows, im, tr)
    if im is None or tr.type in (G.Q8_0, G.MXFP4, G.TQ1_0, G.TQ2_0):  # ggml ignores the weights of these
        return _run(_QUANTIZERS[tr.type], rows, tr)
    if tr.type in _WEIGHTED_ROWS:
        codec, nbits = _WEIGHTED_ROWS[tr.type]
        flat = rows.reshape(-1, rows.shape[-1])
        out = [codec(flat[i:i + _ROWS_PER_CALL], im, nbits) for i in range(0, len(flat), _ROWS_PER_CALL)]
        out = np.concatenate(out) if out else np.empty((0, rows.shape[-1] // 32 * tr.type_size), np.uint8)
        return out.reshape(*rows.shape[:-1], out.shape[-1])
    return _run_weighted(_WEIGHTED_BLOCKS[tr.type], rows, im, tr)


def _run_weighted(codec, rows: np.ndarray, im: np.ndarray | None, tr: TypeTraits) -> np.ndarray:
    """A per-block codec taking (blocks, weights or None), over chunks of blocks with their weights."""
    n = rows.shape[-1]
    blocks = rows.reshape(-1, tr.blck_size)
    qw = None if im is None else np.broadcast_to(im.reshape(1, n), (blocks.size // n, n)).reshape(-1, tr.blck_size)
    step = max(1, _CHUNK_ELEMENTS // tr.blck_size)
    parts = [codec(blocks[i:i + step], None if qw is None else qw[i:i + step]) for i in range(0, len(blocks), step)]
    out = np.concatenate(parts) if parts else np.empty((0, tr.type_size), np.uint8)
    return out.reshape(*rows.shape[:-1], n // tr.blck_size * tr.type_size)


def dequantize(blocks: np.ndarray, type: GGMLType | int | str) -> np.ndarray:
    """ggml blocks (uint8, last dim a multiple of the type size) → float32 rows."""
    tr = _quant_traits(type)
    if tr.type not in _DEQUANTIZERS:
        raise Unsupported(f"{tr.name} is out of scope in Prism: it can be neither quantized nor dequantized")
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8:
        raise TypeMismatch(f"dequantizing {tr.name} takes uint8 blocks, got dtype {blocks.dtype}")
    if blocks.ndim == 0 or blocks.shape[-1] % tr.type_size:
        n = "a scalar" if blocks.ndim == 0 else f"a last dim of {blocks.shape[-1]} bytes"
        raise ShapeMismatch(f"dequantizing {tr.name}: got {n}, not a multiple of its {tr.type_size}-byte block")
    blocks = np.ascontiguousarray(blocks)
    out = _chunked(_DEQUANTIZERS[tr.type], blocks.reshape(-1, tr.type_size), tr.blck_size, tr.blck_size)
    return out.reshape(*blocks.shape[:-1], blocks.shape[-1] // tr.type_size * tr.blck_size)


def quantize_activations(rows: np.ndarray, vec_dot_type: GGMLType | int | str) -> np.ndarray:
    """What ggml's CPU backend (x86, AVX/AVX2 build) turns the float operand of a
    quantized dot product into: Q8_0 and Q8_1 round ties to even and scale by 127/amax
    (the reference quantizers round ties away from zero and scale by 1/d); Q8_K is the
    reference quantizer. Other targets differ in details (ARM NEON rounds ties to even
    but scales by 1/d, and has its own Q8_K); Prism follows x86."""
    tr = _quant_traits(vec_dot_type)
    if tr.type not in _ACTIVATIONS:
        raise InvalidArgument(f"{tr.name} is not an activation type of ggml's CPU backend; vec_dot types are "
                              + ", ".join(traits(t).name for t in _ACTIVATIONS))
    return _run(_ACTIVATIONS[tr.type], _float_rows(rows, tr, "quantizing activations"), tr)
