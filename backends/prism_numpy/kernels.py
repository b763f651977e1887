"""Reference kernels. Each takes the node and writes its result into the node's memory.

Arrays are 4-dim in NumPy order (ne3, ne2, ne1, ne0). Float math is done in float64
and rounded once to the result type, so the reference is at least as exact as any
float32 kernel it certifies.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from prism_core import SortOrder, Tensor, UnaryOp
from prism_core.errors import InvalidArgument
from prism_core.ops.gelu_tables import GELU_CLAMP, apply_gelu, apply_gelu_quick
from prism_core.ops.semantics import alibi_slopes, checked_row_indices, mul_mat_b_rounding
from prism_core.types import BF16, F16, F32, F64, I32, from_f32, to_f32

KERNELS: dict[str, Callable[[Tensor], None]] = {}


def kernel(*keys: str):
    def deco(f):
        for k in keys:
            KERNELS[k] = f
        return f
    return deco


def val(t: Tensor) -> np.ndarray:
    """Values of ``t`` as a 4-dim array: float64 for float and block types (dequantized exactly),
    int64 for integers."""
    if t.traits.is_quantized:
        return to_f32(t.raw(), t.type).astype(np.float64)
    h = t.host()
    if t.type in (F32, F16, BF16, F64):
        return to_f32(h, t.type).astype(np.float64) if t.type != F64 else h.astype(np.float64)
    return h.astype(np.int64)


def store(node: Tensor, values: np.ndarray) -> None:
    """Write values (NumPy order, broadcast to the node's shape) in the node's type; a block
    type is quantized row by row with ggml's reference quantizer (from float32, as ggml)."""
    full = tuple(reversed(node.ne))
    values = np.broadcast_to(values, full)
    if node.traits.is_quantized:
        node.raw()[...] = from_f32(values.astype(np.float32), node.type)
        return
    node.host()[...] = from_f32(values, node.type)


def elements(t: Tensor) -> np.ndarray:
    """The tensor's storage units as a 4-dim array: elements of a plain type, the block-byte
    rows (last axis: a row's bytes) of a block type."""
    return t.raw() if t.traits.is_quantized else t.host()


def f32_round(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to float32 and back: where ggml keeps an intermediate in float32 and its
    overflow to inf (not the double's finite value) decides the result."""
    return x.astype(np.float32).astype(np.float64)


def tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml's modulo broadcast: b repeated along each dim until it has ``shape``."""
    if 0 in shape:
        return np.empty(shape, b.dtype)
    return np.tile(b, tuple(s // n for s, n in zip(shape, b.shape)))


def repeat_blocks(a: np.ndarray, shape01: tuple[int, int]) -> np.ndarray:
    """mul_mat/out_prod's block broadcast of a's dims 3, 2 (NumPy axes 0, 1): each
    a matrix serves a run of consecutive b matrices."""
    if 0 in shape01:
        return np.empty((*shape01, *a.shape[2:]), a.dtype)
    return np.repeat(np.repeat(a, shape01[0] // a.shape[0], axis=0), shape01[1] // a.shape[1], axis=1)


# ---------------------------------------------------------------- copies
@kernel("DUP")
def _dup(n: Tensor) -> None:
    elements(n)[...] = elements(n.src[0])


@kernel("CPY", "CONT")
def _cpy(n: Tensor) -> None:
    a = n.src[0]
    if a.type == n.type:  # same type: the storage units (elements or blocks) in row-major order
        flat = np.ascontiguousarray(elements(a)).reshape(-1)
        elements(n)[...] = flat.reshape(elements(n).shape)
        return
    if n.traits.is_quantized or a.traits.is_quantized:  # f32 <-> blocks, through values
        store(n, val(a).reshape(-1).reshape(tuple(reversed(n.ne))))
        return
    flat = np.ascontiguousarray(a.host()).reshape(-1)  # logical row-major order
    values = to_f32(flat, a.type) if a.type == BF16 else flat
    n.host()[...] = from_f32(values, n.type).reshape(n.host().shape)


# ---------------------------------------------------------------- elementwise
_BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}


@kernel(*_BINARY)
def _binary(n: Tensor) -> None:
    a, b = val(n.src[0]), val(n.src[1])
    with np.errstate(divide="ignore", invalid="ignore"):
        store(n, _BINARY[n.opdef.key](a, tile_to(b, a.shape)))


@kernel("ADD1")
def _add1(n: Tensor) -> None:
    store(n, val(n.src[0]) + val(n.src[1]).reshape(-1)[0])


def _region(n: Tensor, b: Tensor) -> np.ndarray:
    p = n.params
    ts = n.traits.type_size
    return np.ndarray(shape=tuple(reversed(b.ne)), dtype=n.traits.host_dtype, buffer=n.storage(),
                      offset=n.view_offs + p["offset"], strides=(p["nb3"], p["nb2"], p["nb1"], ts))


@kernel("ACC")
def _acc(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    base = val(a)  # read before writing: in place, n and a share memory
    n.host()[...] = from_f32(base, n.type)
    region = _region(n, b)
    region[...] = from_f32(region.astype(np.float64) + val(b), n.type)


@kernel("SET")
def _set(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    n.host()[...] = a.host().copy()
    _region(n, b)[...] = b.host()


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: half away from zero, the sign kept (-0.4 and -0.0 give -0.0)."""
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


# Where IEEE leaves a choice (NaN, -0.0), the reference follows ggml's CPU expressions:
# a comparison with NaN is false, so "x > 0 ? x : 0" maps NaN and -0.0 to +0.0, and
# fminf/fmaxf return their non-NaN operand.
def _sgn(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, 1.0, np.where(x < 0, -1.0, 0.0))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, 0.0)


def _hardsigmoid(x: np.ndarray) -> np.ndarray:
    return np.fmin(1.0, np.fmax(0.0, (x + 3) / 6))


def _softplus(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


_erf = np.frompyfunc(math.erf, 1, 1)


def _xielu(x: np.ndarray, p) -> np.ndarray:
    an = p["beta"] + _softplus(np.float64(p["alpha_n"]))
    ap = _softplus(np.float64(p["alpha_p"]))
    neg = (np.expm1(np.minimum(x, p["eps"])) - x) * an + p["beta"] * x
    return np.where(x > 0, ap * x * x + p["beta"] * x, neg)


U = UnaryOp
_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    U.ABS.name: np.abs, U.SGN.name: _sgn, U.NEG.name: np.negative,
    U.STEP.name: lambda x: (x > 0).astype(np.float64), U.TANH.name: np.tanh,
    U.ELU.name: lambda x: np.where(x > 0, x, np.expm1(np.where(x > 0, 0.0, x))),
    U.RELU.name: _relu, U.SIGMOID.name: _sigmoid, U.GELU.name: apply_gelu,  # ggml's F16 tables
    U.GELU_QUICK.name: apply_gelu_quick, U.SILU.name: lambda x: x * _sigmoid(x),
    U.HARDSWISH.name: lambda x: x * _hardsigmoid(x),
    U.HARDSIGMOID.name: _hardsigmoid,
    U.EXP.name: np.exp, U.EXPM1.name: np.expm1, U.SOFTPLUS.name: _softplus,
    U.GELU_ERF.name: lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64)),
    U.FLOOR.name: np.floor, U.CEIL.name: np.ceil, U.ROUND.name: _round_half_away, U.TRUNC.name: np.trunc,
    "SQR": np.square, "SQRT": np.sqrt, "LOG": np.log, "SIN": np.sin, "COS": np.cos,
}


@kernel(*_UNARY)
def _unary(n: Tensor) -> None:
    with np.errstate(all="ignore"):
        store(n, _UNARY[n.opdef.key](val(n.src[0])))


@kernel("XIELU")
def _xielu_kernel(n: Tensor) -> None:
    with np.errstate(over="ignore"):
        store(n, _xielu(val(n.src[0]), n.params))


@kernel("SCALE")
def _scale(n: Tensor) -> None:
    x, b = val(n.src[0]) * n.params["s"], n.params["b"]
    store(n, x if b == 0 else x + b)  # ggml skips a zero bias, so -0.0 * s keeps its sign


@kernel("CLAMP")
def _clamp(n: Tensor) -> None:
    lo, hi = n.params["min"], n.params["max"]
    x = val(n.src[0])
    x = np.where(x < hi, x, hi)  # ggml's MAX(MIN(x, max), min): NaN becomes max
    store(n, np.where(x > lo, x, lo))


@kernel("LEAKY_RELU")
def _leaky_relu(n: Tensor) -> None:
    x = val(n.src[0])
    store(n, np.where(x > 0, x, 0.0) + n.params["negative_slope"] * np.where(x < 0, x, 0.0))


@kernel("SILU_BACK")
def _silu_back(n: Tensor) -> None:
    g, x = val(n.src[0]), val(n.src[1])
    s = _sigmoid(x)
    store(n, g * s * (1 + x * (1 - s)))


# ---------------------------------------------------------------- reductions
@kernel("SUM")
def _sum(n: Tensor) -> None:
    store(n, val(n.src[0]).sum())


@kernel("SUM_ROWS")
def _sum_rows(n: Tensor) -> None:
    store(n, val(n.src[0]).sum(axis=-1, keepdims=True))


@kernel("MEAN")
def _mean(n: Tensor) -> None:
    with np.errstate(invalid="ignore"):  # an empty row's mean is 0/0 = NaN, as ggml's sum / ne0
        x = val(n.src[0])
        store(n, x.sum(axis=-1, keepdims=True) / x.shape[-1])


@kernel("ARGMAX")
def _argmax(n: Tensor) -> None:
    x = val(n.src[0])[0, 0]  # a matrix: (ne1, ne0)
    if x.shape[1] == 0:
        idx = np.zeros(x.shape[0], np.int64)  # ggml's loop never runs: index 0
    elif not np.isnan(x).any():
        idx = x.shape[1] - 1 - np.argmax(x[:, ::-1], axis=1)  # ties: the last index wins, as ggml's CPU
    else:
        idx = _argmax_ggml_loop(x)
    n.host()[...] = idx.astype(np.int32).reshape(n.host().shape)


def _argmax_ggml_loop(x: np.ndarray) -> np.ndarray:
    """ggml's loop ``max = MAX(max, x[i]); if (max == x[i]) idx = i`` with MAX(a, b) = a > b ? a : b,
    run over every row at once: a NaN makes the running max NaN without taking the index, and
    the element after it then becomes the running max."""
    mx = np.full(x.shape[0], -np.inf)
    idx = np.zeros(x.shape[0], np.int64)
    for i in range(x.shape[1]):
        col = x[:, i]
        mx = np.where(mx > col, mx, col)
        idx = np.where(mx == col, i, idx)
    return idx


@kernel("COUNT_EQUAL")
def _count_equal(n: Tensor) -> None:
    n.host()[...] = np.int64(np.count_nonzero(n.src[0].host() == n.src[1].host()))


@kernel("REPEAT")
def _repeat(n: Tensor) -> None:
    n.host()[...] = tile_to(n.src[0].host(), n.host().shape)


@kernel("REPEAT_BACK")
def _repeat_back(n: Tensor) -> None:
    a = val(n.src[0])
    small = n.host().shape
    split = []
    for big, s in zip(a.shape, small):
        split += [big // s, s]  # index = tile * s + j, so tiles are the outer factor
    store(n, a.reshape(split).sum(axis=(0, 2, 4, 6)))


# ---------------------------------------------------------------- normalisation
@kernel("NORM")
def _norm(n: Tensor) -> None:
    x = val(n.src[0])
    c = x - x.mean(axis=-1, keepdims=True)
    store(n, c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + n.params["eps"]))


@kernel("RMS_NORM")
def _rms_norm(n: Tensor) -> None:
    x = val(n.src[0])
    store(n, x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + n.params["eps"]))


@kernel("RMS_NORM_BACK")
def _rms_norm_back(n: Tensor) -> None:
    dz, x = val(n.src[0]), val(n.src[1])
    eps, ne0 = n.params["eps"], x.shape[-1]
    sum_xx = (x * x).sum(axis=-1, keepdims=True)
    sum_xdz = (x * dz).sum(axis=-1, keepdims=True)
    rrms = 1.0 / np.sqrt(sum_xx / ne0 + eps)
    store(n, (dz - x * sum_xdz / (sum_xx + ne0 * eps)) * rrms)


# ---------------------------------------------------------------- matrices
def val_rows(t: Tensor, lo: int, hi: int) -> np.ndarray:
    """:func:`val` of rows ``lo:hi`` (dim 1) only: a large (quantized) weight is read a chunk at a time."""
    if t.traits.is_quantized:
        return to_f32(t.raw()[:, :, lo:hi], t.type).astype(np.float64)
    h = t.host()[:, :, lo:hi]
    return to_f32(h, t.type).astype(np.float64) if t.type != F64 else h.astype(np.float64)


MUL_MAT_CHUNK = 1 << 22  # elements of a converted to float64 at a time (32 MiB)


def mul_mat_b(n: Tensor) -> np.ndarray:
    """MUL_MAT/MUL_MAT_ID's b as the products see it: rounded to an F16/BF16 a's type (ggml's CPU)."""
    b = val(n.src[1])
    t = mul_mat_b_rounding(n.src[0].type, n.src[1].type)
    return b if t is None else to_f32(from_f32(b, t), t).astype(np.float64)


@kernel("MUL_MAT")
def _mul_mat(n: Tensor) -> None:
    a, b = n.src[0], mul_mat_b(n)  # a (A3, A2, M, K), b (B3, B2, N, K)
    out = np.empty((*b.shape[:3], a.ne[1]))
    rows = max(1, MUL_MAT_CHUNK // max(1, a.ne[0] * a.ne[2] * a.ne[3]))
    for lo in range(0, a.ne[1], rows):
        chunk = val_rows(a, lo, lo + rows)
        out[..., lo:lo + rows] = b @ np.swapaxes(repeat_blocks(chunk, b.shape[:2]), -1, -2)
    store(n, out)


@kernel("OUT_PROD")
def _out_prod(n: Tensor) -> None:
    a, b = val(n.src[0]), val(n.src[1])  # a (A3, A2, T, I), b (B3, B2, T, J)
    store(n, np.swapaxes(b, -1, -2) @ repeat_blocks(a, b.shape[:2]))


# ---------------------------------------------------------------- indexing and masks
@kernel("GET_ROWS")
def _get_rows(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    idx = checked_row_indices("GET_ROWS", b, a.ne[1])[0]  # (A3, A2, m)
    src = elements(a)  # gather the rows first: only they are converted (a quantized table may be huge)
    out = np.empty((*n.host().shape[:3], src.shape[3]), dtype=src.dtype)
    for k in range(a.ne[3]):
        for j in range(a.ne[2]):
            out[k, j] = src[k, j, idx[k, j]]
    if a.type == n.type:  # I32 rows are copied exactly
        n.host()[...] = out
    else:
        n.host()[...] = from_f32(to_f32(out, a.type).astype(np.float64), n.type)


@kernel("GET_ROWS_BACK")
def _get_rows_back(n: Tensor) -> None:
    grad, idx = val(n.src[0])[0, 0], checked_row_indices("GET_ROWS_BACK", n.src[1], n.ne[1]).reshape(-1)
    out = np.zeros((n.ne[1], n.ne[0]))
    np.add.at(out, idx, grad)
    store(n, out)


def _upper_mask(n: Tensor) -> np.ndarray:
    rows = np.arange(n.ne[1])[:, None]
    cols = np.arange(n.ne[0])[None, :]
    return cols > n.params["n_past"] + rows


@kernel("DIAG_MASK_INF", "DIAG_MASK_ZERO")
def _diag_mask(n: Tensor) -> None:
    fill = -np.inf if n.opdef.key == "DIAG_MASK_INF" else 0.0
    store(n, np.where(_upper_mask(n), fill, val(n.src[0])))


# ---------------------------------------------------------------- softmax and loss
@kernel("SOFT_MAX")
def _soft_max(n: Tensor) -> None:
    a, mask, sinks = n.src[0], n.src[1] if len(n.src) > 1 else None, n.src[2] if len(n.src) > 2 else None
    with np.errstate(over="ignore"):  # ggml scales (and adds the mask) in float32: overflow gives inf there
        x = f32_round(val(a) * n.params["scale"])
        if mask is not None:
            m = val(mask)[:, :, : a.ne[1], :]
            slope = alibi_slopes(a.ne[2], n.params["max_bias"]).reshape(1, -1, 1, 1)
            x = f32_round(x + slope * tile_to(m, x.shape))
    mx = x.max(axis=-1, keepdims=True)
    if sinks is not None:
        s = val(sinks).reshape(-1)[None, :, None, None]
        mx = np.maximum(mx, s)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - mx)
        den = e.sum(axis=-1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(s - mx)
        store(n, e / den)


@kernel("SOFT_MAX_BACK")
def _soft_max_back(n: Tensor) -> None:
    dy, y = val(n.src[0]), val(n.src[1])
    store(n, n.params["scale"] * y * (dy - (y * dy).sum(axis=-1, keepdims=True)))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _class_ids(a: Tensor, b: Tensor, what: str) -> np.ndarray:
    """An I32 b's class index per row of a (rows in a's order), each checked to lie in [0, a.ne0)."""
    ids = val(b).reshape(-1).astype(np.int64)
    bad = (ids < 0) | (ids >= a.ne[0])
    if bad.any():
        raise InvalidArgument(f"{what}: class index {int(ids[bad][0])} of row {int(np.argmax(bad))} is outside "
                              f"[0, {a.ne[0]})")
    return ids


@kernel("CROSS_ENTROPY_LOSS")
def _cross_entropy_loss(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    ls = _log_softmax(val(a))
    if b.type == I32:
        rows = ls.reshape(-1, a.ne[0])
        store(n, -rows[np.arange(len(rows)), _class_ids(a, b, "CROSS_ENTROPY_LOSS")].sum() / a.nrows)
        return
    store(n, -(val(b) * ls).sum() / a.nrows)


@kernel("CROSS_ENTROPY_LOSS_BACK")
def _cross_entropy_loss_back(n: Tensor) -> None:
    g, a, b = val(n.src[0]).reshape(-1)[0], val(n.src[1]), n.src[2]
    p = np.exp(_log_softmax(a))
    if b.type == I32:
        rows = p.reshape(-1, a.shape[-1])
        rows[np.arange(len(rows)), _class_ids(n.src[1], b, "CROSS_ENTROPY_LOSS_BACK")] -= 1.0
        store(n, p * g / n.src[1].nrows)
        return
    store(n, (p - val(b)) * g / n.src[1].nrows)


# ---------------------------------------------------------------- optimizer steps
@kernel("OPT_STEP_ADAMW")
def _adamw(n: Tensor) -> None:
    a, g, m_t, v_t, p_t = n.src
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = val(p_t).reshape(-1)
    g = val(g)
    m = beta1 * val(m_t) + (1 - beta1) * g
    v = beta2 * val(v_t) + (1 - beta2) * g * g
    w = val(a) * (1 - alpha * wd) - alpha * (m * beta1h) / (np.sqrt(v * beta2h) + eps)
    store(m_t, m)
    store(v_t, v)
    store(n, w)


@kernel("OPT_STEP_SGD")
def _sgd(n: Tensor) -> None:
    a, g, p_t = n.src
    alpha, wd = val(p_t).reshape(-1)
    store(n, val(a) * (1 - alpha * wd) - alpha * val(g))


# ---------------------------------------------------------------- joins, padding, generators
@kernel("CONCAT")
def _concat(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    axis = 3 - n.params["dim"]  # NumPy order reverses ggml's dims
    n.host()[...] = np.concatenate([a.host(), b.host()], axis=axis)  # same type: an exact copy


@kernel("DIAG")
def _diag(n: Tensor) -> None:
    x = val(n.src[0])[:, :, 0, :]  # (ne3, ne2, ne0)
    on_diag = np.eye(n.ne[0], dtype=bool)
    store(n, np.where(on_diag, x[:, :, None, :], 0.0))  # out[i3, i2, i1, i0] = x[i3, i2, i0] if i0 == i1


@kernel("PAD")
def _pad(n: Tensor) -> None:
    p = n.params
    widths = [(p[f"lp{i}"], p[f"rp{i}"]) for i in (3, 2, 1, 0)]
    x = val(n.src[0])
    store(n, np.pad(x, widths, mode="wrap" if p["circular"] else "constant"))


@kernel("PAD_REFLECT_1D")
def _pad_reflect_1d(n: Tensor) -> None:
    p = n.params
    x = val(n.src[0])
    store(n, np.pad(x, [(0, 0), (0, 0), (0, 0), (p["p0"], p["p1"])], mode="reflect"))


@kernel("ARANGE")
def _arange(n: Tensor) -> None:
    p = n.params
    store(n, p["start"] + np.arange(n.ne[0], dtype=np.float64) * p["step"])


@kernel("TIMESTEP_EMBEDDING")
def _timestep_embedding(n: Tensor) -> None:
    dim, max_period = n.params["dim"], n.params["max_period"]
    half = dim // 2
    t = val(n.src[0]).reshape(-1)[:, None]  # (N, 1)
    freqs = np.exp(-math.log(max_period) * np.arange(half) / half) if half else np.zeros(0)
    out = np.zeros((t.shape[0], dim))
    out[:, :half] = np.cos(t * freqs)
    out[:, half:2 * half] = np.sin(t * freqs)  # odd dim: the last column stays 0
    store(n, out)


@kernel("ARGSORT")
def _argsort(n: Tensor) -> None:
    x = val(n.src[0])
    if n.params["order"] == SortOrder.DESC:
        x = -x
    # stable: equal values keep their index order (ggml leaves it unspecified)
    n.host()[...] = np.argsort(x, axis=-1, kind="stable").astype(np.int32)


# ---------------------------------------------------------------- normalisation (more)
@kernel("L2_NORM")
def _l2_norm(n: Tensor) -> None:
    x = val(n.src[0])
    norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):  # a zero row with eps 0 gives NaN, as in ggml
        store(n, x / np.fmax(norm, n.params["eps"]))  # ggml's fmaxf: a NaN norm gives eps


@kernel("GROUP_NORM")
def _group_norm(n: Tensor) -> None:
    x = val(n.src[0])  # (ne3, ne2, ne1, ne0): channels are axis 1
    out = np.empty_like(x)
    channels = x.shape[1]
    per = -(-channels // n.params["n_groups"])  # groups of ceil(ne2 / n_groups) channels; the last may be short
    if x.size == 0:
        return
    with np.errstate(invalid="ignore", divide="ignore"):
        for start in range(0, channels, per):
            g = x[:, start:start + per]
            mean = g.mean(axis=(1, 2, 3), keepdims=True)
            c = g - mean
            var = (c * c).mean(axis=(1, 2, 3), keepdims=True)
            out[:, start:start + per] = c / np.sqrt(var + n.params["eps"])
    store(n, out)


# ---------------------------------------------------------------- gated linear units
_GLU_ACT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "REGLU": _UNARY[U.RELU.name], "GEGLU": apply_gelu, "SWIGLU": _UNARY[U.SILU.name],
    "GEGLU_ERF": _UNARY[U.GELU_ERF.name], "GEGLU_QUICK": _UNARY[U.GELU_QUICK.name],
}


@kernel(*_GLU_ACT, "SWIGLU_OAI")
def _glu(n: Tensor) -> None:
    a = val(n.src[0])
    b = n.src[1] if len(n.src) > 1 else None
    if b is None:
        half = a.shape[-1] // 2
        x, g = a[..., :half], a[..., half:2 * half]
        if n.params["swapped"]:
            x, g = g, x
    else:
        x, g = a, val(b)
    key = n.opdef.key
    with np.errstate(over="ignore", invalid="ignore"):  # inf * 0 is NaN, as in ggml (or a branch np.where drops)
        if key == "SWIGLU_OAI":
            limit = n.params["limit"]
            xc = np.where(limit < x, limit, x)  # std::min(x, limit) and std::clamp(g, -limit, limit), as
            gc = np.where(g < -limit, -limit, np.where(limit < g, limit, g))  # ggml: NaN and zero signs kept
            store(n, xc * _sigmoid(n.params["alpha"] * xc) * (gc + 1.0))
        elif key == "GEGLU":  # ggml: 0 below the table's range, whatever g is
            store(n, np.where(x <= -GELU_CLAMP, 0.0, apply_gelu(x) * g))
        else:
            store(n, _GLU_ACT[key](x) * g)


from . import kernels_attn, kernels_conv  # noqa: E402,F401 - register their kernels

# ---------------------------------------------------------------- prepared calls
# For F32 operands these NumPy float32 operations are correctly rounded, so they give
# bit for bit what the float64 kernels above give after their single rounding; a plan
# binds them once per node (Backend.prepare) to avoid the per-call conversions.
_EXACT_F32_BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply}
_EXACT_F32_UNARY = {"NEG": np.negative, "ABS": np.abs, "SQR": np.square}


def prepare(n: Tensor):
    if n.opdef is None or n.type != F32 or any(s is not None and s.type != F32 for s in n.src):
        return None
    key, out = n.opdef.key, n.host()
    if key in _EXACT_F32_BINARY:
        a, b = n.src[0].host(), n.src[1].host()
        if any(nb not in (1, na) for nb, na in zip(b.shape, a.shape)):
            return None  # ggml's modulo broadcast of a b extent > 1: the general kernel tiles it
        f = _EXACT_F32_BINARY[key]
        return lambda: f(a, b, out=out)
    a = n.src[0].host() if n.src else None
    if key in _EXACT_F32_UNARY:
        f = _EXACT_F32_UNARY[key]
        return lambda: f(a, out=out)
    if key == "RELU":
        return lambda: _relu_into(a, out)
    if key in ("DUP", "CONT", "CPY") and a.shape == out.shape:
        return lambda: np.copyto(out, a)
    return None


def _relu_into(a: np.ndarray, out: np.ndarray) -> None:
    """ggml's ``x > 0 ? x : 0`` into ``out`` (which may be ``a``): NaN and -0.0 give +0.0."""
    keep = np.greater(a, 0)
    np.copyto(out, a, where=keep)
    np.copyto(out, np.float32(0), where=~keep)
