"""The vector copies of Q4_0, Q5_0, Q4_1, Q5_1 and MXFP4's quantizers (csrc/csimd_quantize_x86.h) on every csimd
path, bit for bit against ggml's reference quantizers written out here in float32 NumPy (each product and sum
rounded on its own, as ggml's C compiled without FMA; C's (int8_t) of a float as x86 converts it), on blocks
made to meet their edge cases: values whose quotient lands within a rounding of a level boundary (where a fused
multiply-add would round the other way), the largest magnitude held by both signs, a minimum or maximum of zero
held by both signed zeros, scales whose reciprocal overflows, and MXFP4 maxima next to powers of two, where its
exponent comes from log2f."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from prism_core import quant
from prism_core.types import GGMLType as G

sys.path.insert(0, str(Path(__file__).parent))
from test_csimd_quant import ISAS  # noqa: E402
from test_quant_chunk import csimd_isa  # noqa: E402, F401  (the fixture: one csimd path per case)

F32 = np.float32
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], F32)


def _int8_of(t: np.ndarray) -> np.ndarray:
    """C's (int)(int8_t) of float32 values on x86: cvttss2si's int (INT_MIN for NaN, inf, out of range), low byte
    sign-extended."""
    ok = np.isfinite(t) & (np.abs(t) < 2.0**31)
    i = np.where(ok, np.trunc(np.where(ok, t, 0)), -(2**31)).astype(np.int64)
    return ((i & 0xFF) ^ 0x80) - 0x80


def _f16_bytes(v: float) -> bytes:
    with np.errstate(over="ignore"):  # beyond F16: inf, as ggml's conversion
        return np.array([v], F32).astype(np.float16).tobytes()


def _pack(q: np.ndarray, with_high: bool) -> bytes:
    qs = ((q[:16] & 15) | ((q[16:] & 15) << 4)).astype(np.uint8).tobytes()
    if not with_high:
        return qs
    qh = sum(int((q[j] >> 4) & 1) << j for j in range(32))
    return qh.to_bytes(4, "little") + qs


def ref_q_0(x: np.ndarray, nbits: int) -> bytes:
    """quantize_row_q4_0_ref / q5_0_ref on one block"""
    half, top = (8, 15) if nbits == 4 else (16, 31)
    amax, mx = F32(0), F32(0)
    for v in x:
        if amax < abs(v):
            amax, mx = abs(v), v
    with np.errstate(all="ignore"):
        d = F32(mx) / F32(-half)
        idv = F32(1) / d if d != 0 else F32(0)
        q = np.minimum(top, _int8_of(x * idv + F32(half + 0.5)))
    return _f16_bytes(d) + _pack(q, nbits == 5)


def ref_q_1(x: np.ndarray, nbits: int) -> bytes:
    """quantize_row_q4_1_ref / q5_1_ref on one block"""
    top = 15 if nbits == 4 else 31
    lo, hi = F32(np.inf), F32(-np.inf)
    for v in x:
        lo = v if v < lo else lo
        hi = v if v > hi else hi
    with np.errstate(all="ignore"):
        d = (hi - lo) / F32(top)
        idv = F32(1) / d if d != 0 else F32(0)
        q = np.minimum(top, _int8_of((x - lo) * idv + F32(0.5)))
    return _f16_bytes(d) + _f16_bytes(lo) + _pack(q, nbits == 5)


def ref_mxfp4(x: np.ndarray) -> bytes:
    """quantize_row_mxfp4_ref on one block: e = floor(log2f(amax)) - 2 + 127 as uint8, log2f taken as the
    float32 rounding of the exact log2 (near a power of two it rounds up to the integer, as glibc's does)"""
    amax = F32(np.max(np.abs(x)))
    e = (int(np.floor(F32(np.log2(np.float64(amax))))) + 125) & 0xFF if amax > 0 else 0
    d = F32(np.ldexp(1.0, e - 128))  # E8M0, halved
    err = np.abs(MXFP4_VALUES[None, :] * d - x[:, None])
    idx = np.argmin(err, axis=1)  # the first of equal errors
    return bytes([e]) + bytes(int(idx[j] | (idx[j + 16] << 4)) for j in range(16))


def _boundary_block(rng: np.random.Generator, nbits: int, offset: bool) -> np.ndarray:
    """32 values whose quotient x*id (+ the offset) falls within a few ulps of the .5 of a level: the first
    value fixes the block's scale (1/d inexact), the rest sit on level boundaries"""
    top = 15 if nbits == 4 else 31
    half = 8 if nbits == 4 else 16
    x = np.empty(32, F32)
    x[0] = F32(rng.uniform(0.3, 3.0))
    if offset:  # min 0 from x[1], max x[0]: d = x0/top
        x[1] = F32(0)
        d = x[0] / F32(top)
        base = 0.0
    else:  # max magnitude x[0] (negative: d > 0)
        x[0] = -x[0]
        x[1] = F32(0)
        d = x[0] / F32(-half)
        base = -half
    idv = F32(1) / d
    for j in range(2, 32):
        k = rng.integers(1, top) + 0.5 + base  # a level boundary of x*id (+8.5 / +0.5 shifts it to an integer)
        v = F32(k / np.float64(idv))
        steps = int(rng.integers(-3, 4))
        for _ in range(abs(steps)):
            v = np.nextafter(v, F32(np.inf) if steps > 0 else F32(-np.inf), dtype=F32)
        x[j] = v
    return x


def _cases(t: G) -> np.ndarray:
    rng = np.random.default_rng(int(t))
    nbits = 5 if t in (G.Q5_0, G.Q5_1) else 4
    blocks = [_boundary_block(rng, nbits, t in (G.Q4_1, G.Q5_1)) for _ in range(120)]
    z = np.zeros(32, F32)
    signed_zero = z.copy()
    signed_zero[[3, 9]] = -0.0
    blocks.append(signed_zero)  # all zeros, the first -0.0 at 3
    for i, j in ((5, 11), (11, 5), (3, 30), (30, 3), (8, 16), (16, 8), (0, 31), (31, 0)):
        pos = np.abs(rng.standard_normal(32)).astype(F32)
        pos[i], pos[j] = -0.0, 0.0  # min 0 held by both zeros: the first one's sign
        neg = -np.abs(rng.standard_normal(32)).astype(F32)
        neg[i], neg[j] = 0.0, -0.0  # max 0 likewise
        blocks += [pos, neg]
    tie = rng.standard_normal(32).astype(F32)
    tie[7], tie[19] = F32(-5), F32(5)  # the largest magnitude with both signs: the first (-5) wins
    blocks.append(tie)
    tie2 = tie.copy()
    tie2[7], tie2[19] = F32(5), F32(-5)
    blocks.append(tie2)
    tiny = (rng.standard_normal(32) * 1e-44).astype(F32)  # subnormal: 1/d overflows
    blocks.append(tiny)
    blocks.append(np.full(32, F32(1e-40)))
    for k in (-130, -20, -3, 0, 1, 5, 60, 126):  # MXFP4: maxima at, just below and just above 2^k
        p = F32(np.ldexp(1.0, k))
        for m in (p, np.nextafter(p, F32(0), dtype=F32), np.nextafter(p, F32(np.inf), dtype=F32)):
            b = (rng.uniform(-1, 1, 32) * m).astype(F32)
            b[rng.integers(0, 32)] = m
            blocks.append(np.clip(b, -m, m))
    wide = (rng.standard_normal((8, 32)) * 10.0 ** rng.uniform(-30, 30, (8, 1))).astype(F32)
    blocks += list(wide)
    while len(blocks) % 8:  # whole rows of 256
        blocks.append(rng.standard_normal(32).astype(F32))
    return np.asarray(blocks, F32)


REFS = {G.Q4_0: lambda b: ref_q_0(b, 4), G.Q5_0: lambda b: ref_q_0(b, 5), G.Q4_1: lambda b: ref_q_1(b, 4),
        G.Q5_1: lambda b: ref_q_1(b, 5), G.MXFP4: ref_mxfp4}


@pytest.mark.parametrize("csimd_isa", ISAS, indirect=True)
@pytest.mark.parametrize("t", list(REFS), ids=lambda t: t.name)
def test_vector_quantizers_equal_ggml_on_their_edge_cases(csimd_isa, t):  # noqa: F811 (the fixture)
    blocks = _cases(t)
    want = np.frombuffer(b"".join(REFS[t](b) for b in blocks), np.uint8).reshape(len(blocks), -1)
    rows = blocks.reshape(-1, 256)  # 8 blocks a row
    for got in (quant.quantize(rows, t, overflow="ggml"), quant.quantize_chunk(rows, t, threads=1, overflow="ggml")):
        got = got.reshape(len(blocks), -1)
        bad = [i for i in range(len(blocks)) if not np.array_equal(got[i], want[i])]
        assert not bad, (t.name, csimd_isa, bad[:5], got[bad[0]], want[bad[0]])


def test_boundary_blocks_do_meet_boundaries():
    """The boundary blocks are what they claim: a fused multiply-add would round some of them across a level
    (so a path that fused them fails the test above)."""
    hits = 0
    for t in (G.Q4_0, G.Q4_1):
        nbits, off = 4, t == G.Q4_1
        rng = np.random.default_rng(int(t))
        for _ in range(120):
            x = _boundary_block(rng, nbits, off)
            if off:
                d = x[0] / F32(15)
                shift, a = 0.5, x.astype(np.float64) * np.float64(F32(1) / d)
            else:
                d = x[0] / F32(-8)
                shift, a = 8.5, x.astype(np.float64) * np.float64(F32(1) / d)
            fused = np.trunc((a + shift).astype(F32))  # one rounding of the exact product plus the shift
            split = np.trunc((a.astype(F32) + F32(shift)).astype(F32))
            hits += int(np.sum(fused != split))
    assert hits > 0
