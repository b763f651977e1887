"""ggml's CPU semantics of the GELU family on float32 values: lookup tables over F16 inputs.

ggml's CPU backend does not evaluate the tanh GELU or the quick GELU of an F32 element directly:
it rounds the element to F16 (to nearest even) and reads a 65536-entry table holding, for every
F16 value h, the function at h computed in float32 and rounded to F16. The tanh GELU clamps
first: x <= -10 gives 0 and x >= 10 gives x itself (no table); the quick GELU has no clamp (an
input beyond F16's range reads the table at +-inf). GEGLU and GEGLU_QUICK multiply the table
value by g in float32 (GEGLU's clamp gives 0 or x * g). Prism's op semantics are these, so that a
model's feed-forward layers round as llama.cpp's do (about 5e-4 relative, an F16 ulp, off the
exact formula). Every backend takes the table values from here. The entries are ggml's float32
evaluations, step by step in float32 as its compiled C expressions are: ``1 + a x x`` fused into
one multiply-add (the compilers contract it; llama.cpp 0.3.36's and ggml-python's libraries agree
on it), the rest rounded after each operation, with the C library's own tanhf and expf (as ggml
calls them; NumPy's float32 functions where the C library cannot be loaded). The details matter:
for x near -2 to -3.5 the tanh GELU's 1 + tanh(...) cancels, and a float64 evaluation differs from
ggml's table in 269 of the 63,488 finite entries; an unfused 1 + a x x, in one more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np

GELU_CLAMP = 10.0  # the tanh GELU's table covers -10 < x < 10
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_COEF_A = 0.044715
_GELU_QUICK_COEF = 1.702


F32 = np.float32


@functools.cache
def _libm_f32(name: str):
    """The C library's float32 function ``name`` (tanhf, expf) over an array, or None."""
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6"), name)
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.frompyfunc(fn, 1, 1)


def _f32_call(name: str, numpy_fn, x: np.ndarray) -> np.ndarray:
    fn = _libm_f32(name)
    return numpy_fn(x) if fn is None else fn(x).astype(F32)


def _fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c rounded once to float32: the product is exact in float64, the sum's float64
    rounding error (TwoSum) decides the float32 rounding where the float64 sum is a float32 tie."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        r = s.astype(F32)
        toward = np.nextafter(r, np.where(s > r, F32(np.inf), F32(-np.inf)).astype(F32))
        tie = (s != r) & (np.abs(s - r.astype(np.float64)) == np.abs(toward.astype(np.float64) - s))
        # the exact sum lies past the tie, nearer `toward`
        past_tie = tie & np.isfinite(s) & ((toward.astype(np.float64) - s) * err > 0)
    return np.where(past_tie, toward, r).astype(F32)


def gelu_tanh_f32(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x x))) in float32 steps as ggml's compiled
    ``0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)))`` (the inner sum fused)."""
    x = np.asarray(x, dtype=F32)
    arg = F32(_SQRT_2_OVER_PI) * x * _fma_f32(F32(_GELU_COEF_A) * x, x, F32(1.0))
    th = _f32_call("tanhf", np.tanh, arg)
    return F32(0.5) * x * (F32(1.0) + th)


def gelu_quick_f32(x: np.ndarray) -> np.ndarray:
    """x * (1 / (1 + exp(-1.702 x))) in float32 steps, as ggml's ``x*(1.0f/(1.0f+expf(GELU_QUICK_COEF*x)))``."""
    x = np.asarray(x, dtype=F32)
    e = _f32_call("expf", np.exp, F32(-_GELU_QUICK_COEF) * x)  # overflows to inf
    return x * (F32(1.0) / (F32(1.0) + e))


def _table(fn) -> np.ndarray:
    h = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        return fn(h).astype(np.float16).astype(F32)


@functools.cache
def gelu_f16_table() -> np.ndarray:
    """float32[65536]: entry h (an F16 bit pattern) is f16(gelu_tanh_f32(value of h)), read-only."""
    t = _table(gelu_tanh_f32)
    t.flags.writeable = False
    return t


@functools.cache
def gelu_quick_f16_table() -> np.ndarray:
    """float32[65536]: entry h is f16(gelu_quick_f32(value of h)), read-only."""
    t = _table(gelu_quick_f32)
    t.flags.writeable = False
    return t


def f16_bits(x: np.ndarray) -> np.ndarray:
    """The F16 bit patterns of float values (rounded to nearest even, overflow to +-inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def apply_gelu(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU (tanh form) of float32 values ``x``, as float64 values of float32 numbers."""
    x = np.asarray(x, dtype=np.float64)
    y = gelu_f16_table()[f16_bits(x)].astype(np.float64)
    return np.where(x <= -GELU_CLAMP, 0.0, np.where(x >= GELU_CLAMP, x, y))


def apply_gelu_quick(x: np.ndarray) -> np.ndarray:
    """ggml's CPU quick GELU of float32 values ``x`` (the table, no clamp)."""
    return gelu_quick_f16_table()[f16_bits(x)].astype(np.float64)
