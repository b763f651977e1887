"""The 32-element formats: Q8_1 (written here), Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 (gguf.quants,
with the signed-zero cases where it differs from ggml corrected), and the activation
quantizers of ggml's CPU backend (Q8_0 and Q8_1 rounded ties-to-even).

gguf.quants' legacy quantizers reproduce ggml's ``quantize_row_*_ref`` except where a
block's extreme is a zero: ggml scans for it with ``if (v < min)`` / ``if (amax < |v|)``
from a fixed start, so the *first* zero (or ggml's own +0 start) decides the sign that
ends up in the fp16 ``d``/``m`` bits, while NumPy's reductions pick either zero.
"""

from __future__ import annotations

import numpy as np

from .numerics import F32, fp16_bits, fp16_value

_NEG_ZERO_HALF = np.uint16(0x8000)


def _errstate():
    return np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore")


def _gguf_quants():
    """gguf.quants, imported on first use: ``import prism_core`` does not pay for the gguf package."""
    from gguf import quants
    return quants


def gguf_quantize(blocks: np.ndarray, name: str) -> np.ndarray:
    """gguf.quants' quantizer on (nb, block) → (nb, type_size). Passed as one row:
    gguf works through rows 16 at a time, so many short rows would cost a call each."""
    gq = _gguf_quants()
    with _errstate():
        return gq.quantize(blocks.reshape(1, -1), gq.GGMLQuantizationType[name]).reshape(len(blocks), -1)


def gguf_dequantize(blocks: np.ndarray, name: str) -> np.ndarray:
    gq = _gguf_quants()
    with _errstate():  # inf scales (fp16 overflow) decode to inf/NaN as in ggml
        return gq.dequantize(blocks.reshape(1, -1), gq.GGMLQuantizationType[name]).reshape(len(blocks), -1)


def _zero_half(out: np.ndarray, at: int) -> np.ndarray:
    """Blocks whose fp16 field at byte ``at`` is +0 or -0."""
    return ((out[:, at] == 0) & ((out[:, at + 1] & 0x7F) == 0))


def _set_half(out: np.ndarray, at: int, where: np.ndarray, bits: np.ndarray | np.uint16) -> None:
    half = np.ascontiguousarray(out[:, at:at + 2]).view(np.uint16)[:, 0]
    out[:, at:at + 2] = np.where(where, bits, half).astype(np.uint16).view(np.uint8).reshape(-1, 2)


def quantize_symmetric(name: str):
    """Q4_0 / Q5_0: d = max/−2^(b−1) with max the signed value of largest |x|; for an
    all-zero block ggml keeps its initial max = +0, so d = −0."""
    def quantize(blocks: np.ndarray) -> np.ndarray:
        out = gguf_quantize(blocks, name)
        maybe = _zero_half(out, 0)  # an all-zero block has d = ±0; look only at those
        if maybe.any():
            b = blocks[maybe]
            sub = out[maybe]
            _set_half(sub, 0, (b.max(axis=1) == 0) & (b.min(axis=1) == 0), _NEG_ZERO_HALF)
            out[maybe] = sub
        return out
    return quantize


def quantize_affine(name: str):
    """Q4_1 / Q5_1: m = the block's min as ggml's scan finds it (the first of equal
    values, so the first zero's sign when the min is a zero); d = (max − min)/(2^b − 1),
    +0 for an all-zero block."""
    def quantize(blocks: np.ndarray) -> np.ndarray:
        out = gguf_quantize(blocks, name)
        maybe = _zero_half(out, 2)  # a zero min is stored as m = ±0; look only at those
        if maybe.any():
            b = blocks[maybe]
            zero_min = b.min(axis=1) == 0
            first_zero = np.take_along_axis(b, np.argmax(b == 0, axis=1)[:, None], 1)[:, 0]
            sub = out[maybe]
            _set_half(sub, 2, zero_min, np.where(np.signbit(first_zero), _NEG_ZERO_HALF, np.uint16(0)))
            _set_half(sub, 0, zero_min & (b.max(axis=1) == 0), np.uint16(0))
            out[maybe] = sub
        return out
    return quantize


def quantize_q8_1(blocks: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_1_ref: d = amax/127, q = roundf(x/d) (ties away from zero),
    s = fp16(Σq · d) with the float32 d, not the stored fp16 one."""
    with _errstate():
        d = np.abs(blocks).max(axis=1) / F32(127)
        inv = np.where(d != 0, F32(1) / d, F32(0))
        q = _gguf_quants().np_roundf(blocks * inv[:, None]).astype(np.int8)
    return _q8_1_block(d, q)


def _q8_1_block(d: np.ndarray, q: np.ndarray, qsum: np.ndarray | None = None) -> np.ndarray:
    if qsum is None:
        qsum = q.astype(np.int32).sum(axis=1)
    with np.errstate(over="ignore"):  # d near float32's maximum: s is inf, as in ggml (fp16 of it too)
        s = qsum.astype(F32) * d
    return np.concatenate([fp16_bits(d).view(np.uint8).reshape(-1, 2), fp16_bits(s).view(np.uint8).reshape(-1, 2),
                           q.view(np.uint8)], axis=1)


def dequantize_q8_1(blocks: np.ndarray) -> np.ndarray:
    """y = q·d (s is metadata for dot products)."""
    d = fp16_value(np.ascontiguousarray(blocks[:, :2]).view(np.uint16))
    return blocks[:, 4:].view(np.int8).astype(F32) * d


# ------------------------------------------------------------------ activations

def _activation_q8(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml-cpu's x86 (AVX/AVX2) quantize_row_q8_0/_q8_1: d = amax/127 stored, the
    multiplier is 127/amax (not 1/d), and _mm256_round_ps rounds ties to even. For a
    block with amax < 127/FLT_MAX (subnormal data) that multiplier is inf; cvtps_epi32
    turns the resulting inf/NaN into 0x80000000, packing saturates that to -128, and
    Q8_1's Σq is taken over the int32 lanes before packing (wrapping as int32 does).
    Returns (d, q, Σq)."""
    with _errstate():
        amax = np.abs(blocks).max(axis=1)
        d = amax / F32(127)
        mul = np.where(amax != 0, F32(127) / amax, F32(0))
        v = np.rint(blocks * mul[:, None])
        lanes = np.where(np.abs(v) < F32(2 ** 31), v, F32(-2 ** 31)).astype(np.int64)
    q = np.clip(lanes, -128, 127).astype(np.int8)
    qsum = lanes.sum(axis=1).astype(np.uint32).view(np.int32)
    return d, q, qsum


def activations_q8_0(blocks: np.ndarray) -> np.ndarray:
    d, q, _ = _activation_q8(blocks)
    return np.concatenate([fp16_bits(d).view(np.uint8).reshape(-1, 2), q.view(np.uint8)], axis=1)


def activations_q8_1(blocks: np.ndarray) -> np.ndarray:
    return _q8_1_block(*_activation_q8(blocks))
