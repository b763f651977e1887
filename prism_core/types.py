"""Element types with ggml's numbering (``enum ggml_type``).

Every ggml type is declared with its block size and bytes per block; plain types
also carry the NumPy dtype used to hold them on the host. BF16 has no NumPy dtype:
its host storage is ``uint16`` and :func:`to_f32` / :func:`from_f32` convert it with
ggml's rounding (round to nearest even, NaN kept quiet).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgument, TypeMismatch


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


@dataclass(frozen=True)
class TypeTraits:
    type: GGMLType
    name: str  # ggml's lowercase name
    blck_size: int  # elements per block (1 for plain types)
    type_size: int  # bytes per block
    is_quantized: bool
    host_dtype: np.dtype | None  # NumPy dtype holding one element (plain types only)
    # What ggml's CPU backend converts the other operand of a dot product to
    # (type_traits_cpu[...].vec_dot_type in ggml-cpu.c); types that leave it unset there get F32.
    vec_dot_type: GGMLType = GGMLType.F32

    @property
    def usable(self) -> bool:
        """Plain types, and block types whose values Prism can decode (see :mod:`prism_core.quant`)."""
        if not self.is_quantized:
            return True
        from .quant import can_dequantize
        return can_dequantize(self.type)


# ggml-cpu.c's type_traits_cpu[...].vec_dot_type; every type not listed leaves it unset (GGML_TYPE_F32).
_VEC_DOT_TYPE: dict[GGMLType, GGMLType] = {
    GGMLType.F16: GGMLType.F16, GGMLType.BF16: GGMLType.BF16,
    **{t: GGMLType.Q8_0 for t in (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.IQ4_NL,
                                  GGMLType.MXFP4, GGMLType.NVFP4, GGMLType.Q1_0, GGMLType.Q2_0)},
    **{t: GGMLType.Q8_1 for t in (GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.Q8_1)},
    **{t: GGMLType.Q8_K for t in (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                                  GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS,
                                  GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.IQ4_XS,
                                  GGMLType.TQ1_0, GGMLType.TQ2_0)},
}


def _plain(t: GGMLType, dtype: str) -> TypeTraits:
    d = np.dtype(dtype)
    return TypeTraits(t, t.name.lower(), 1, d.itemsize, False, d, _VEC_DOT_TYPE.get(t, GGMLType.F32))


def _quant(t: GGMLType, blck: int, size: int) -> TypeTraits:
    name = t.name.lower() if not t.name.endswith("_K") else t.name[:-2].lower() + "_K"
    return TypeTraits(t, name, blck, size, True, None, _VEC_DOT_TYPE.get(t, GGMLType.F32))


G = GGMLType
TRAITS: dict[GGMLType, TypeTraits] = {
    t.type: t
    for t in (
        _plain(G.F32, "float32"), _plain(G.F16, "float16"), _plain(G.BF16, "uint16"),
        _plain(G.I8, "int8"), _plain(G.I16, "int16"), _plain(G.I32, "int32"),
        _plain(G.I64, "int64"), _plain(G.F64, "float64"),
        _quant(G.Q4_0, 32, 18), _quant(G.Q4_1, 32, 20), _quant(G.Q5_0, 32, 22),
        _quant(G.Q5_1, 32, 24), _quant(G.Q8_0, 32, 34), _quant(G.Q8_1, 32, 36),
        _quant(G.Q2_K, 256, 84), _quant(G.Q3_K, 256, 110), _quant(G.Q4_K, 256, 144),
        _quant(G.Q5_K, 256, 176), _quant(G.Q6_K, 256, 210), _quant(G.Q8_K, 256, 292),
        _quant(G.IQ2_XXS, 256, 66), _quant(G.IQ2_XS, 256, 74), _quant(G.IQ3_XXS, 256, 98),
        _quant(G.IQ1_S, 256, 50), _quant(G.IQ4_NL, 32, 18), _quant(G.IQ3_S, 256, 110),
        _quant(G.IQ2_S, 256, 82), _quant(G.IQ4_XS, 256, 136), _quant(G.IQ1_M, 256, 56),
        _quant(G.TQ1_0, 256, 54), _quant(G.TQ2_0, 256, 66), _quant(G.MXFP4, 32, 17),
        _quant(G.NVFP4, 64, 36), _quant(G.Q1_0, 128, 18), _quant(G.Q2_0, 64, 18),
    )
}

F32, F16, BF16, F64 = G.F32, G.F16, G.BF16, G.F64
I8, I16, I32, I64 = G.I8, G.I16, G.I32, G.I64
FLOAT_TYPES = frozenset({F32, F16, BF16, F64})
INT_TYPES = frozenset({I8, I16, I32, I64})
PLAIN_TYPES = FLOAT_TYPES | INT_TYPES


def as_type(t: GGMLType | int | str) -> GGMLType:
    """Accept a GGMLType, its number or its (case-insensitive) name."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, str):
        try:
            return GGMLType[t.upper()]
        except KeyError:
            raise InvalidArgument(f"unknown type name {t!r}; known: "
                                  f"{', '.join(x.name.lower() for x in GGMLType)}") from None
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        try:
            return GGMLType(int(t))
        except ValueError:
            raise InvalidArgument(f"unknown type number {t} (removed or never assigned in ggml)") from None
    raise InvalidArgument(f"type must be a GGMLType, int or str, got {type(t).__name__}")


def traits(t: GGMLType) -> TypeTraits:
    return TRAITS[as_type(t)]


def row_size(t: GGMLType, ne0: int) -> int:
    """Bytes of one row of ``ne0`` elements (ggml_row_size)."""
    tr = traits(t)
    if ne0 % tr.blck_size:
        raise InvalidArgument(f"row length {ne0} is not a multiple of {tr.name}'s block size {tr.blck_size}")
    return tr.type_size * (ne0 // tr.blck_size)


def from_numpy_dtype(dtype: np.dtype) -> GGMLType:
    dtype = np.dtype(dtype)
    for t in (F32, F16, F64, I8, I16, I32, I64):
        if TRAITS[t].host_dtype == dtype:
            return t
    raise TypeMismatch(f"NumPy dtype {dtype} has no Prism type (BF16 data: pass type=BF16 explicitly)")


# ---------------------------------------------------------------- conversions

def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """ggml's rounding: round to nearest even; NaNs become quiet NaNs."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    quiet = ((u >> 16) | 64).astype(np.uint16)
    return np.where(nan, quiet, rounded)


def to_f32(host: np.ndarray, t: GGMLType) -> np.ndarray:
    """Host storage of type ``t`` as float32 values (copy). For a block type the storage is
    uint8 rows of blocks (last axis: the row's bytes) and the values are dequantized."""
    if t == BF16:
        return bf16_to_f32(host)
    if traits(t).is_quantized:  # host storage of a block type: uint8 rows, the row's bytes last
        from .quant import dequantize
        return dequantize(host, t)
    return np.asarray(host, dtype=np.float32)


def from_f32(values: np.ndarray, t: GGMLType) -> np.ndarray:
    """float values converted to the host storage of type ``t`` as ggml converts them:
    F16 and BF16 round to nearest even (values past the largest finite one become
    infinities, silently, as in ggml); integer types truncate toward zero; block types are
    quantized row by row with ggml's reference quantizer (last axis: the row)."""
    if t == BF16:
        with np.errstate(over="ignore"):
            return f32_to_bf16(np.asarray(values, dtype=np.float32))
    tr = traits(t)
    if tr.is_quantized:  # float rows (last axis a multiple of the block size) -> uint8 block rows
        from .quant import quantize
        return quantize(np.asarray(values, dtype=np.float32), t)
    values = np.asarray(values)
    if t in INT_TYPES and values.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.trunc(values).astype(tr.host_dtype)
    with np.errstate(over="ignore"):
        return values.astype(tr.host_dtype)
