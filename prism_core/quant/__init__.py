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
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import InvalidArgument, ShapeMismatch, TypeMismatch, Unsupported
from ..types import GGMLType, TypeTraits, as_type, traits
from . import iquants, kquants, legacy

__all__ = ["quantize", "dequantize", "can_quantize", "can_dequantize", "quantize_activations",
           "NEEDS_IMPORTANCE_MATRIX", "GRID_SEARCH_NOT_PORTED", "OUT_OF_SCOPE"]

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

#: ggml's quantize_iq* for these assert an importance matrix (ggml_quantize_requires_imatrix);
#: Prism dequantizes them only.
NEEDS_IMPORTANCE_MATRIX = frozenset({G.IQ2_XXS, G.IQ2_XS, G.IQ1_S})
#: ggml quantizes these without an importance matrix too, by a search over the lattice grids that
#: ggml_quantize_init builds; that search is not ported, Prism dequantizes them only.
GRID_SEARCH_NOT_PORTED = frozenset({G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ1_M})
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
    return as_type(type) in _QUANTIZERS


def can_dequantize(type: GGMLType | int | str) -> bool:
    return as_type(type) in _DEQUANTIZERS


def _refuse_quantize(tr: TypeTraits) -> None:
    if tr.type in NEEDS_IMPORTANCE_MATRIX:
        raise Unsupported(f"quantizing to {tr.name} needs an importance matrix (ggml's quantize_{tr.name} "
                          "requires one and has no reference quantizer without it); Prism only dequantizes it")
    if tr.type in GRID_SEARCH_NOT_PORTED:
        raise Unsupported(f"quantizing to {tr.name} is not implemented in Prism: ggml's quantize_{tr.name} searches "
                          "the lattice grids built by ggml_quantize_init (best with an importance matrix), which "
                          "Prism has not ported; Prism only dequantizes it")
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
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(rows, axis=None)  # inf/NaN anywhere makes it non-finite (overflow may too)
    if not np.isfinite(total) and not (finite := np.isfinite(rows)).all():
        flat = finite.reshape(-1, rows.shape[-1]).all(axis=1)
        bad = int(np.argmin(flat))
        where = np.unravel_index(bad, rows.shape[:-1]) if rows.ndim > 1 else ()
        col = int(np.argmin(finite.reshape(-1, rows.shape[-1])[bad]))
        raise InvalidArgument(
            f"{what} to {tr.name}: row {bad} (index {tuple(int(i) for i in where)}) holds the non-finite value "
            f"{rows.reshape(-1, rows.shape[-1])[bad, col]} at column {col}; ggml's quantizers give "
            "position-dependent garbage for NaN/inf (its absmax scan skips a NaN or the scale becomes inf/NaN)")
    return rows


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


def quantize(rows: np.ndarray, type: GGMLType | int | str) -> np.ndarray:
    """float rows → ggml blocks (uint8), as ggml's quantize_row_*_ref writes them."""
    tr = _quant_traits(type)
    if tr.type not in _QUANTIZERS:
        _refuse_quantize(tr)
    return _run(_QUANTIZERS[tr.type], _float_rows(rows, tr, "quantizing"), tr)


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
