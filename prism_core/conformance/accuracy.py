"""The per-element check beside NMSE, and the accuracy grade of an op.

NMSE averages over the whole output, so one wrong element in a long row, or a formula that is
off by 1e-4 everywhere (the tanh GELU where erf was meant), passes ggml's bounds. Beside it each
element's error is measured in **ulp at the output's scale**:

    err_i = |got_i - expected_i| / (2^(1-p) * max(|expected_i|, rms(expected)))

with p the result type's significand bits (F32 24, F16 11, BF16 8). The rms floor keeps
elements near zero in an output of larger values (cancellation in a sum) from counting as
relative errors of their own size. A value's true ulp is between 1 and 2 of these units, so
"within 4 ulp" is never generous. The worst element must be within the op's bound for its
result type (:func:`element_bound`, printed on each op's page):

- exact ops (copies, views, gathers, masks, ADD/SUB/MUL, sign and rounding functions): 1 ulp;
- elementwise math (transcendental unary and GLU ops, DIV, SQRT, SCALE, ...): 8 ulp in F32,
  2 in F16/BF16 (a float32 computation rounded to F16 may be one F16 ulp off: double rounding);
- row ops (softmax, norms, RoPE, losses' gradients, optimizer steps): 8 ulp in F32, 4 in F16;
- accumulations (sums, matrix products, convolutions, attention): 2048 ulp in F32, 32 in F16
  (float32 accumulation over thousands of terms);
- a block-type source or result: NMSE only (quantizing activations, as ggml's CPU does for its
  dot products, moves elements far more than any per-element bound could allow).

Integer results are held to NMSE 0, exactness. The grade of an op on a backend is the worst over
its passed cases: ``exact`` (every element bit-equal to the reference), ``within 4 ulp``, or
``within the bound``.
"""

from __future__ import annotations

import numpy as np

from ..ops.table import OpDef
from ..types import BF16, F16, F32, GGMLType, traits

SIGNIFICAND_BITS = {F32: 24, F16: 11, BF16: 8}
EXACT, WITHIN_4_ULP, WITHIN_BOUND = "exact", "within 4 ulp", "within the bound"
GRADES = (EXACT, WITHIN_4_ULP, WITHIN_BOUND)

_EXACT_OPS = frozenset({
    "DUP", "ADD", "ADD1", "SUB", "MUL", "ACC", "SET", "CPY", "CONT", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE",
    "GET_ROWS", "SET_ROWS", "REPEAT", "CONCAT", "PAD", "PAD_REFLECT_1D", "DIAG", "DIAG_MASK_INF", "DIAG_MASK_ZERO",
    "CLAMP", "ABS", "SGN", "NEG", "STEP", "RELU", "FLOOR", "CEIL", "ROUND", "TRUNC", "ARGMAX", "ARGSORT",
    "COUNT_EQUAL", "IM2COL", "POOL_1D", "POOL_2D", "SQR",
})
_ROW_OPS = frozenset({
    "SOFT_MAX", "SOFT_MAX_BACK", "NORM", "RMS_NORM", "RMS_NORM_BACK", "L2_NORM", "ROPE", "ROPE_BACK",
    "CROSS_ENTROPY_LOSS_BACK", "OPT_STEP_ADAMW", "OPT_STEP_SGD", "UPSCALE",
})
_ACCUMULATING = frozenset({
    "SUM", "SUM_ROWS", "MEAN", "MUL_MAT", "MUL_MAT_ID", "OUT_PROD", "CONV_TRANSPOSE_1D", "CONV_2D", "IM2COL_BACK",
    "POOL_2D_BACK", "GET_ROWS_BACK", "REPEAT_BACK", "FLASH_ATTN_EXT", "GROUP_NORM", "CROSS_ENTROPY_LOSS",
})
_BOUNDS = {"exact": (1.0, 1.0), "elementwise": (8.0, 2.0), "row": (8.0, 4.0), "accumulating": (2048.0, 32.0)}


def op_class(d: OpDef) -> str:
    if d.key in _EXACT_OPS or d.view_only:
        return "exact"
    if d.key in _ROW_OPS:
        return "row"
    if d.key in _ACCUMULATING:
        return "accumulating"
    return "elementwise"


def element_bound(d: OpDef, result: GGMLType, reads_blocks: bool = False) -> float | None:
    """The op's bound on the worst element's error in ulp (see the module doc); None when only
    NMSE applies (a block-type source or result, or a non-float result)."""
    if reads_blocks or result not in SIGNIFICAND_BITS:
        return None
    f32_bound, narrow_bound = _BOUNDS[op_class(d)]
    return f32_bound if result == F32 else narrow_bound


def bound_text(d: OpDef) -> str:
    """The bounds of op ``d`` in words, for its page."""
    f32_bound, narrow_bound = _BOUNDS[op_class(d)]
    return (f"worst element within {f32_bound:g} ulp (F32 result) / {narrow_bound:g} ulp (F16, BF16) at the "
            f"output's scale ({op_class(d)} op); block types: NMSE only (prism_core.conformance.accuracy)")


def ulp_errors(got: np.ndarray, ref: np.ndarray, result: GGMLType) -> np.ndarray:
    """Each element's error in ulp at the output's scale (0 where both are equal or both NaN;
    elements where either is not finite are judged by compare() and count 0 here)."""
    got = np.asarray(got, np.float64).reshape(-1)
    ref = np.asarray(ref, np.float64).reshape(-1)
    ok = np.isfinite(got) & np.isfinite(ref)
    if not ok.any():
        return np.zeros(got.shape)
    rms = float(np.sqrt(np.mean(ref[ok] ** 2)))
    unit = 2.0 ** (1 - SIGNIFICAND_BITS.get(result, 24))
    scale = np.maximum(np.abs(ref), rms) * unit
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(ok, np.abs(got - ref) / np.where(scale > 0, scale, 1.0), 0.0)
    return np.where(ok & (scale == 0) & (got != ref), np.inf, err)


def grade(exact: bool, worst_ulp: float | None) -> str:
    if exact:
        return EXACT
    return WITHIN_4_ULP if worst_ulp is not None and worst_ulp <= 4.0 else WITHIN_BOUND


def worst_grade(grades: list[str]) -> str | None:
    return max(grades, key=GRADES.index) if grades else None


def reads_block_types(node) -> bool:
    return any(t is not None and traits(t.type).is_quantized for t in (node, *node.src))
