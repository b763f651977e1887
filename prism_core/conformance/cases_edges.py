"""Edge cases beside each op's family: NaN and signed zeros where IEEE leaves the result to the
implementation (the reference follows ggml's CPU expressions, so every backend must too), and
reductions over empty rows (ggml's value: sum 0, argmax 0). An empty result computes nothing on
any backend (the scheduler skips it, as ggml's CPU backend), so it needs no case here. The
comparison checks NaN positions both ways and the sign of zero results.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..ops import build as B
from ..ops.table import OPS, OpDef
from ..ops.table_conv import PoolOp
from ..types import F16, F32
from .cases import Built, Case, extra

NAN = np.float32("nan")
# NaN, both zeros, values whose result is a zero of either sign (-0.25 rounds to -0.0; -3 is
# hardsigmoid's lower knee), ties and tiny magnitudes
NAN_ZERO_VALUES = np.array([NAN, -0.0, 0.0, 1.0, -1.0, -0.25, 0.25, -3.0, 3.0, -1e-30, 1e-30, NAN, -2.5, 0.5],
                           np.float32)
# params chosen so that the bias is zero (ggml then skips adding it) or clamps at a signed zero
NAN_ZERO_PARAMS = {"SCALE": [{"s": 2.0}, {"s": -0.5}, {"s": 0.75, "b": 0.25}],
                   "CLAMP": [{"min": -0.5, "max": 0.5}, {"min": -0.0, "max": 0.0}],
                   "LEAKY_RELU": [{"negative_slope": 0.1}, {"negative_slope": -2.0}]}


def _label(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


@extra(*(d.key for d in OPS.values() if d.family == "unary"))
def nan_and_signed_zero_cases(d: OpDef) -> Iterator[Case]:
    for params in NAN_ZERO_PARAMS.get(d.key, [{}]):
        for t in [t for t in (F32, F16) if t in d.srcs[0].types]:
            name = "NaN and signed zeros," + ("f32" if t == F32 else "f16") + (f",{_label(params)}" if params else "")
            yield Case(d.key, name, lambda c, r, t=t, params=params: Built(
                B.node(d.key, c.from_numpy(NAN_ZERO_VALUES, t), **params)))


@extra("ARGMAX")
def argmax_nan_cases(d: OpDef) -> Iterator[Case]:
    rows = np.array([[NAN, 1, 5, 2, 0], [1, 5, NAN, 2, 0], [1, 5, 3, 2, NAN], [NAN, NAN, NAN, NAN, NAN],
                     [-0.0, 0.0, -0.0, -1, -2], [-np.inf] * 5, [3, NAN, NAN, 1, 2], [2, 2, NAN, 2, 1]], np.float32)
    yield Case(d.key, "rows with NaN, ties of +-0, all -inf", lambda c, r: Built(B.argmax(c.from_numpy(rows))))
    yield Case(d.key, "empty rows ne=[0,3]", lambda c, r: Built(B.argmax(c.new_tensor(F32, (0, 3)))))


def _nan_image(c, r, ne):
    x = r.uniform(-1, 1, size=tuple(reversed(ne))).astype(np.float32)
    x[..., 0, -1] = NAN  # a NaN as the last tap before the padding
    x[..., 1, 2] = NAN
    x[..., 2, :2] = -np.inf
    x[..., 3, 3] = -0.0
    return c.from_numpy(x)


@extra("POOL_1D")
def pool_1d_nan_cases(d: OpDef) -> Iterator[Case]:
    for k0, s0, p0 in [(2, 1, 1), (3, 2, 1), (3, 1, 0)]:
        yield Case(d.key, f"MAX,NaN and -inf taps,k0={k0},s0={s0},p0={p0}", lambda c, r, k=(k0, s0, p0): Built(
            B.pool_1d(_nan_image(c, r, (7, 5, 2)), PoolOp.MAX, *k)))


@extra("POOL_2D")
def pool_2d_nan_cases(d: OpDef) -> Iterator[Case]:
    for k, s, p in [(2, 1, 1), (3, 2, 1), (2, 2, 0)]:
        yield Case(d.key, f"MAX,NaN and -inf taps,k={k},s={s},p={p}", lambda c, r, k=k, s=s, p=p: Built(
            B.pool_2d(_nan_image(c, r, (7, 5, 2)), PoolOp.MAX, k, k, s, s, p, p)))


# ------------------------------------------------------------------ zero extents
@extra("REPEAT_BACK")
def repeat_back_empty_cases(d: OpDef) -> Iterator[Case]:
    yield Case(d.key, "empty a [0,2] -> b [3,2]: no tiles, zeros", lambda c, r: Built(
        B.repeat_back(c.new_tensor(F32, (0, 2)), c.new_tensor(F32, (3, 2)))))


@extra("SUM_ROWS", "SUM")
def sum_empty_cases(d: OpDef) -> Iterator[Case]:
    yield Case(d.key, "empty rows ne=[0,3]", lambda c, r: Built(B.node(d.key, c.new_tensor(F32, (0, 3)))))


@extra("L2_NORM")
def l2_norm_nan_cases(d: OpDef) -> Iterator[Case]:
    # ggml's scale = 1 / fmaxf(sqrtf(sum), eps): a NaN row's norm gives eps (x / 0 with eps 0), an
    # infinite row's gives 0 * x
    rows = np.array([[NAN, 1, -2, 0], [1, np.inf, -2, 0], [3, 4, 0, -0.0]], np.float32)
    for eps in (0.0, 1e-6):
        yield Case(d.key, f"rows with NaN and inf,eps={eps}", lambda c, r, eps=eps: Built(
            B.l2_norm(c.from_numpy(rows), eps)))


# ------------------------------------------------------------------ float32 intermediates
# ggml scales softmax logits and attention scores in float32: a finite scale whose product
# overflows there gives inf (then NaN rows), whatever a double would have held
@extra("SOFT_MAX")
def soft_max_overflow_cases(d: OpDef) -> Iterator[Case]:
    for scale in (3e38, -3e38):
        yield Case(d.key, f"scale={scale:g} overflowing float32", lambda c, r, scale=scale: Built(
            B.soft_max_ext(c.from_numpy(r.uniform(-2, 2, (3, 8)).astype(np.float32)), scale=scale)))


@extra("FLASH_ATTN_EXT")
def flash_attn_overflow_cases(d: OpDef) -> Iterator[Case]:
    def build(c, r):
        q, k, v = (c.from_numpy(r.uniform(-1, 1, s).astype(np.float32)) for s in ((1, 3, 8), (1, 5, 8), (1, 5, 8)))
        return Built(B.flash_attn_ext(q, k, v, scale=2e38))
    yield Case(d.key, "scale=2e38 overflowing float32", build)


@extra("SWIGLU_OAI")
def swiglu_oai_nan_cases(d: OpDef) -> Iterator[Case]:
    # std::min(x, limit) and std::clamp(g, -limit, limit) keep a NaN
    x = np.array([[NAN, 1.0, -0.0, 9.0], [2.0, NAN, 0.5, -9.0]], np.float32)
    yield Case(d.key, "NaN in x and g", lambda c, r: Built(B.node(d.key, c.from_numpy(x), c.from_numpy(x[::-1].copy()),
                                                                  alpha=1.702, limit=7.0)))
    z = np.array([[0.0, -0.0, 2.0, -3.0, 0.0, -0.0, 1.0, -1.0]], np.float32)
    yield Case(d.key, "signed zeros,limit=-0.0", lambda c, r: Built(B.node(d.key, c.from_numpy(z), alpha=1.0,
                                                                           limit=-0.0)))
