"""Block formats (ggml's quantized types): quantize float32 rows to blocks and back.

Array conventions are those of ``gguf.quants``: float32 rows in (the last axis a multiple of the
block size), uint8 blocks out (the last axis the row's bytes), and back. This first version
covers the formats that ``gguf.quants`` (ggml-org's exact NumPy port) implements; the others are
refused with the reason until Prism's own quantizers land.
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf import quants as _gq

from ..errors import Unsupported
from ..types import GGMLType, as_type, traits

G = GGMLType
_GGUF_QUANTIZE = frozenset({G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0, G.MXFP4, G.TQ1_0, G.TQ2_0})
_GGUF_DEQUANTIZE = _GGUF_QUANTIZE | {G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K, G.IQ4_NL, G.IQ4_XS, G.IQ2_XXS,
                                     G.IQ2_XS, G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ1_S, G.IQ1_M}


def can_quantize(t: GGMLType | int | str) -> bool:
    return as_type(t) in _GGUF_QUANTIZE


def can_dequantize(t: GGMLType | int | str) -> bool:
    return as_type(t) in _GGUF_DEQUANTIZE


def quantize(rows: np.ndarray, t: GGMLType | int | str) -> np.ndarray:
    t = as_type(t)
    if t not in _GGUF_QUANTIZE:
        raise Unsupported(f"quantizing to {traits(t).name} is not available in this version")
    return _gq.quantize(np.asarray(rows, np.float32), gguf.GGMLQuantizationType(int(t)))


def dequantize(blocks: np.ndarray, t: GGMLType | int | str) -> np.ndarray:
    t = as_type(t)
    if t not in _GGUF_DEQUANTIZE:
        raise Unsupported(f"dequantizing {traits(t).name} is not available in this version")
    return _gq.dequantize(np.asarray(blocks, np.uint8), gguf.GGMLQuantizationType(int(t))).astype(np.float32)
