"""Node-level wrappers around the compiled kernels, and what each of them supports.

This module does not import numba: the compiled kernels (:mod:`._jit`) are imported
on the first kernel call, so a missing or broken numba never breaks discovery.
"""

from __future__ import annotations

import glob
import math
import os
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from prism_core import GluOp, SortOrder, Tensor, UnaryOp
from prism_core.errors import InvalidArgument
from prism_core.ops.semantics import alibi_slopes, checked_row_indices, mul_mat_b_rounding
from prism_core.plugin.base import KernelTable
from prism_core.types import BF16, F16, F32, I32, I64, PLAIN_TYPES

TABLE = KernelTable()
KERNELS, SUPPORT, READS_VALUES, kernel = TABLE.kernels, TABLE.support, TABLE.reads_values, TABLE.kernel

FLOATS = frozenset({F32, F16, BF16})
ONLY_F32 = frozenset({F32})
INDICES = frozenset({I32})
COPYABLE = FLOATS | INDICES  # float -> I32 truncates as the reference (NaN, out of range: INT32_MIN)


_jit_module = None


def _jit():
    global _jit_module
    if _jit_module is None:
        from .compile_progress import install
        install()  # with a cold cache the kernels compile for seconds: report it (prism_core.progress)
        from . import _jit as j
        j.register_all()
        _jit_module = j
    return _jit_module


# ------------------------------------------------------------------ array access
def arr(t: Tensor) -> np.ndarray:
    """The strided host view; F16 and BF16 as their uint16 bits."""
    h = t.host()
    return h.view(np.uint16) if t.type in (F16, BF16) else h


def lut(t: Tensor) -> np.ndarray:
    j = _jit()
    return j.F16_LUT if t.type == F16 else j.BF16_LUT if t.type == BF16 else j.NO_LUT


def kind(t: Tensor) -> int:
    return 2 if t.type == BF16 else 1


class _Mode(threading.local):
    """How this Python thread's wrappers run their kernels: ``serial`` (the compilation without
    the thread pool, for nodes with little work), and ``calls`` (when a list: record the calls
    instead of making them; see record())."""

    def __init__(self) -> None:
        self.serial = False
        self.calls: list | None = None


_MODE = _Mode()


def _run(name: str, *args, stream: bool = False) -> None:
    """Call compiled kernel ``name``; ``stream``: it streams from memory (see _stream_threads)."""
    k = _jit().KERNELS[name]
    mode = _MODE
    if mode.serial:
        k = k.serial()
    if mode.calls is not None:
        mode.calls.append(BoundCall(k.entry_point(args), args, k.parallel, stream))
        return
    if stream and k.parallel:
        _stream_threads()
    k(*args)


# reductions whose source may be empty: ggml's loops then leave a sum at +0, an argmax at index 0 and
# REPEAT_BACK's accumulator at 0, all-zero bytes in every result type; written here, not compiled
EMPTY_SOURCE_ZEROS = frozenset({"SUM", "SUM_ROWS", "ARGMAX", "REPEAT_BACK"})


def _empty_source_zeros(n: Tensor) -> bool:
    """True when n's source is empty: n then holds zeros (written at compute time; while calls are
    recorded nothing is, so a prepared plan runs the wrapper on every compute)."""
    if n.src[0].nelements:
        return False
    if _MODE.calls is None:
        n.host()[...] = 0
    return True


class BoundCall(NamedTuple):
    """One recorded kernel call."""
    entry: Callable  # the compiled entry point
    args: tuple
    parallel: bool  # through numba's thread pool
    stream: bool  # streams from memory: half the threads (see _stream_threads)


def run_wrapper(n: Tensor, serial: bool) -> None:
    """Compute ``n`` with its wrapper; ``serial``: with the kernels' serial compilations."""
    mode = _MODE
    prev = mode.serial
    mode.serial = serial
    try:
        KERNELS[n.opdef.key](n)
    finally:
        mode.serial = prev


def record(n: Tensor, serial: bool) -> list[BoundCall] | None:
    """The kernel calls that computing ``n`` makes, with their entry points resolved (compiled
    now if need be) and their arguments bound (host views of the node's memory, lookup tables,
    scalars from its params), or None when the wrapper reads tensor values (READS_VALUES) and
    must run on every compute. Valid while the node and its sources keep their memory."""
    if n.opdef is None or n.opdef.key in READS_VALUES or n.opdef.key not in KERNELS:
        return None
    mode = _MODE
    prev = mode.serial, mode.calls
    mode.serial, mode.calls = serial, []
    try:
        KERNELS[n.opdef.key](n)
        calls = mode.calls
    finally:
        mode.serial, mode.calls = prev
    return calls or None


STREAMING = 1 << 22  # elements: a flat op this large streams from memory, past the caches


def _last_level_cache_bytes(default: int = 32 << 20) -> int:
    """The largest CPU cache of cpu0 (Linux sysfs), else ``default``."""
    best = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(d, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMmGg")
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or default


# A flat binary result at least this large (and never smaller than 16 MiB) is written with
# non-temporal stores (_jit_fast.binary_stream): it would not stay in the caches for its reader
# anyway, and skipping the read of each destination line saves a third of the memory traffic.
STREAM_STORES = max(16 << 20, _last_level_cache_bytes())


def _stream_threads() -> None:
    """A streaming elementwise op is bound by memory bandwidth, which about half the cores
    already saturate: more threads only contend (measured: 2 threads on 2 cores run a 16M
    add 15% slower than 1). Use half the configured threads, at least 1."""
    import numba
    n = numba.get_num_threads()
    if n > 1:
        numba.set_num_threads(max(1, n // 2))


def _flat(h: np.ndarray) -> np.ndarray | None:
    """A C-contiguous host view as one flat array (a view), else None."""
    return h.reshape(-1) if h.flags.c_contiguous else None


# ------------------------------------------------------------------ elementwise
U = UnaryOp
UNARY_CODES = {
    U.ABS.name: 0, U.SGN.name: 1, U.NEG.name: 2, U.STEP.name: 3, U.TANH.name: 4, U.ELU.name: 5,
    U.RELU.name: 6, U.SIGMOID.name: 7, U.GELU.name: 8, U.GELU_QUICK.name: 9, U.SILU.name: 10,
    U.HARDSWISH.name: 11, U.HARDSIGMOID.name: 12, U.EXP.name: 13, U.EXPM1.name: 14, U.SOFTPLUS.name: 15,
    U.GELU_ERF.name: 16, U.FLOOR.name: 17, U.CEIL.name: 18, U.ROUND.name: 19, U.TRUNC.name: 20,
    "SQR": 21, "SQRT": 22, "LOG": 23, "SIN": 24, "COS": 25, "SCALE": 26, "CLAMP": 27, "LEAKY_RELU": 28,
    U.XIELU.name: 29,
}


def _softplus(x: float) -> float:
    return x if x > 20 else math.log1p(math.exp(x))


def _unary_params(n: Tensor) -> tuple[float, float, float, float]:
    p, key = n.params, n.opdef.key
    if key == "SCALE":
        return float(p["s"]), float(p["b"]), 0.0, 0.0
    if key == "CLAMP":
        return float(p["min"]), float(p["max"]), 0.0, 0.0
    if key == "LEAKY_RELU":
        return float(p["negative_slope"]), 0.0, 0.0, 0.0
    if key == "XIELU":
        beta = float(p["beta"])
        return beta + _softplus(float(p["alpha_n"])), _softplus(float(p["alpha_p"])), beta, float(p["eps"])
    return 0.0, 0.0, 0.0, 0.0


@kernel((FLOATS,), FLOATS, *UNARY_CODES)
def _unary(n: Tensor) -> None:
    x = n.src[0]
    if x.type == n.type == F32 and x.ne == n.ne:
        fx, fo = _flat(x.host()), _flat(n.host())
        if fx is not None and fo is not None:
            _run("unary_flat", fx, fo, UNARY_CODES[n.opdef.key], *_unary_params(n))
            return
    _run("unary", arr(x), lut(x), arr(n), kind(n), UNARY_CODES[n.opdef.key], *_unary_params(n))


BINARY_CODES = {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3, "ADD1": 0}


@kernel((FLOATS, FLOATS), FLOATS, *BINARY_CODES)
def _binary(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if a.type == b.type == n.type == F32 and a.ne == n.ne and (b.ne == n.ne or b.ne[1:] == (1, 1, 1)):
        fa, fb, fo = _flat(a.host()), _flat(b.host()), _flat(n.host())
        if fa is not None and fb is not None and fo is not None and b.ne[0] == n.ne[0]:
            code = BINARY_CODES[n.opdef.key]
            if fb.size == fo.size and fo.nbytes >= STREAM_STORES:
                _run("binary_stream", fa, fb, fo, code, stream=True)  # non-temporal stores
            else:
                _run("binary_flat", fa, fb, fo, code, stream=fo.size >= STREAMING and fb.size == fo.size)
            return
    _run("binary", arr(a), lut(a), arr(b), lut(b), arr(n), kind(n), BINARY_CODES[n.opdef.key], 0.0, 0.0)


@kernel((FLOATS, FLOATS), FLOATS, "SILU_BACK")
def _silu_back(n: Tensor) -> None:
    g, x = n.src[0], n.src[1]
    _run("binary", arr(g), lut(g), arr(x), lut(x), arr(n), kind(n), 4, 0.0, 0.0)


@kernel((ONLY_F32,) * 3, ONLY_F32, "OPT_STEP_SGD", reads_values=True)
def _sgd(n: Tensor) -> None:
    a, g, p = n.src
    alpha, wd = (float(v) for v in p.host().reshape(-1))
    _run("binary", arr(a), lut(a), arr(g), lut(g), arr(n), kind(n), 5, alpha, wd)


@kernel((ONLY_F32,) * 5, ONLY_F32, "OPT_STEP_ADAMW", reads_values=True)
def _adamw(n: Tensor) -> None:
    a, g, m, v, p = n.src
    vals = [float(x) for x in p.host().reshape(-1)]
    _run("adamw", arr(a), arr(g), arr(m), arr(v), arr(n), *vals)


# ------------------------------------------------------------------ copies
@kernel((COPYABLE,), COPYABLE, "DUP", "CONT")
@kernel((COPYABLE, COPYABLE), COPYABLE, "CPY")
def _cpy(n: Tensor) -> None:
    s = n.src[0]
    src, out = arr(s), arr(n)
    # equal shapes: element-wise (the tile mode); otherwise row-major order to row-major order
    _run("cpy", src, lut(s), out, kind(n), int(s.type == n.type), int(src.shape == out.shape))


@kernel((COPYABLE, PLAIN_TYPES), COPYABLE, "REPEAT")
def _repeat(n: Tensor) -> None:
    s = n.src[0]
    _run("cpy", arr(s), lut(s), arr(n), kind(n), 1, 1)


@kernel((FLOATS, PLAIN_TYPES), FLOATS, "REPEAT_BACK")
def _repeat_back(n: Tensor) -> None:
    if _empty_source_zeros(n):
        return
    x = n.src[0]
    _run("repeat_back", arr(x), lut(x), arr(n), kind(n))


def _region(n: Tensor, b: Tensor) -> np.ndarray:
    """The strided region (params nb1, nb2, nb3, offset) of n's memory that b is written into."""
    p = n.params
    h = np.ndarray(shape=tuple(reversed(b.ne)), dtype=n.traits.host_dtype, buffer=n.storage(),
                   offset=n.view_offs + p["offset"], strides=(p["nb3"], p["nb2"], p["nb1"], n.traits.type_size))
    return h.view(np.uint16) if n.type in (F16, BF16) else h


@kernel((COPYABLE, COPYABLE), COPYABLE, "SET")
def _set(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]  # same type (the op's rule)
    out = arr(n)
    _run("cpy", arr(a), lut(a), out, kind(n), 1, 1)  # a no-op in place
    _run("cpy", arr(b), lut(b), _region(n, b), kind(n), 1, 1)


@kernel((ONLY_F32, ONLY_F32), ONLY_F32, "ACC")
def _acc(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    _run("cpy", arr(a), lut(a), arr(n), kind(n), 1, 1)
    region = _region(n, b)
    _run("binary", region, lut(n), arr(b), lut(b), region, kind(n), BINARY_CODES["ADD"], 0.0, 0.0)


# ------------------------------------------------------------------ rows
ROW_CODES = {"SUM_ROWS": 0, "MEAN": 1, "NORM": 2, "RMS_NORM": 3, "RMS_NORM_BACK": 4, "SOFT_MAX_BACK": 5,
             "DIAG_MASK_INF": 6, "DIAG_MASK_ZERO": 7, "L2_NORM": 8}


FAST_ROWS = {"RMS_NORM": 0, "NORM": 1}


def _rows2d(t: Tensor) -> np.ndarray | None:
    """A C-contiguous F32 host view as (rows, ne0), else None."""
    h = t.host()
    return h.reshape(-1, t.ne[0]) if t.type == F32 and h.flags.c_contiguous else None


def _rows(n: Tensor) -> None:
    key = n.opdef.key
    if key in EMPTY_SOURCE_ZEROS and _empty_source_zeros(n):
        return
    x = n.src[0]
    if key in FAST_ROWS:
        x2, o2 = _rows2d(x), _rows2d(n)
        if x2 is not None and o2 is not None:
            _run("rows_fast", x2, o2, FAST_ROWS[key], float(n.params["eps"]))
            return
    y = n.src[1] if len(n.src) > 1 else x
    if key in ("NORM", "RMS_NORM", "RMS_NORM_BACK", "L2_NORM"):
        p0 = float(n.params["eps"])
    elif key == "SOFT_MAX_BACK":
        p0 = float(n.params["scale"])
    elif key.startswith("DIAG_MASK"):
        p0 = float(n.params["n_past"])
    else:
        p0 = 0.0
    _run("rows", arr(x), lut(x), arr(y), lut(y), arr(n), kind(n), ROW_CODES[key], p0)


kernel((FLOATS,), FLOATS, "SUM_ROWS")(_rows)
kernel((FLOATS,), ONLY_F32, "MEAN")(_rows)
kernel((ONLY_F32,), ONLY_F32, "NORM", "RMS_NORM", "L2_NORM", "DIAG_MASK_INF", "DIAG_MASK_ZERO")(_rows)


@kernel((ONLY_F32,), ONLY_F32, "GROUP_NORM")
def _group_norm(n: Tensor) -> None:
    _run("group_norm", arr(n.src[0]), arr(n), int(n.params["n_groups"]), float(n.params["eps"]))
kernel((ONLY_F32, ONLY_F32), ONLY_F32, "RMS_NORM_BACK", "SOFT_MAX_BACK")(_rows)


@kernel((ONLY_F32, frozenset({F32, F16}), ONLY_F32), ONLY_F32, "SOFT_MAX")
def _soft_max(n: Tensor) -> None:
    j = _jit()
    a = n.src[0]
    mask = n.src[1] if len(n.src) > 1 else None
    sinks = n.src[2] if len(n.src) > 2 else None
    if mask is None and sinks is None:
        x2, o2 = _rows2d(a), _rows2d(n)
        if x2 is not None and o2 is not None:
            _run("rows_fast", x2, o2, 2, float(n.params["scale"]))
            return
    slopes = np.ascontiguousarray(alibi_slopes(a.ne[2], float(n.params["max_bias"])), np.float64)
    _run("soft_max", arr(a), arr(mask) if mask is not None else j.DUMMY, lut(mask) if mask is not None else j.NO_LUT,
         arr(sinks) if sinks is not None else j.DUMMY, arr(n), slopes, float(n.params["scale"]),
         int(mask is not None), int(sinks is not None))


def _class_ids(a: Tensor, b: Tensor, what: str) -> np.ndarray:
    """An I32 b's class indices, [ne3, ne2, ne1] of a, each checked to lie in [0, a.ne0)."""
    ids = b.host().reshape(a.ne[3], a.ne[2], a.ne[1])
    if ids.size and (ids.min() < 0 or ids.max() >= a.ne[0]):
        bad = ids.reshape(-1)[(ids.reshape(-1) < 0) | (ids.reshape(-1) >= a.ne[0])][0]
        raise InvalidArgument(f"{what}: class index {int(bad)} is outside [0, {a.ne[0]})")
    return ids


@kernel((ONLY_F32, ONLY_F32 | INDICES), ONLY_F32, "CROSS_ENTROPY_LOSS", reads_values=True)
def _cross_entropy_loss(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    if b.type == I32:
        return _run("cross_entropy_ids", arr(a), _class_ids(a, b, "CROSS_ENTROPY_LOSS"), arr(n), 1.0, 0)
    _run("cross_entropy", arr(a), arr(b), arr(n), 1.0, 0)


@kernel((ONLY_F32, ONLY_F32, ONLY_F32 | INDICES), ONLY_F32, "CROSS_ENTROPY_LOSS_BACK", reads_values=True)
def _cross_entropy_loss_back(n: Tensor) -> None:
    g, a, b = n.src[0], n.src[1], n.src[2]
    gv = float(g.host().reshape(-1)[0])
    if b.type == I32:
        return _run("cross_entropy_ids", arr(a), _class_ids(a, b, "CROSS_ENTROPY_LOSS_BACK"), arr(n), gv, 1)
    _run("cross_entropy", arr(a), arr(b), arr(n), gv, 1)


# ------------------------------------------------------------------ matrices and indexing
def f32_operand(t: Tensor) -> np.ndarray:
    """t's host view as float32: F32 as is; F16/BF16 converted (exactly) into a new buffer by the
    compiled copy kernel (a prepared call keeps the buffer and refills it on every compute)."""
    if t.type == F32:
        return t.host()
    out = np.empty(tuple(reversed(t.ne)), np.float32)
    _run("cpy", arr(t), lut(t), out, 1, 0, 1)
    return out


def rounded_operand(t: Tensor, to) -> np.ndarray:
    """F32 t's values rounded to F16/BF16 ``to`` and back, in a new float32 buffer (two compiled copies)."""
    j = _jit()
    bits = np.empty(tuple(reversed(t.ne)), np.uint16)
    _run("cpy", t.host(), j.NO_LUT, bits, 2 if to == BF16 else 1, 0, 1)
    out = np.empty(bits.shape, np.float32)
    _run("cpy", bits, j.BF16_LUT if to == BF16 else j.F16_LUT, out, 1, 0, 1)
    return out


@kernel((FLOATS, FLOATS), ONLY_F32, "MUL_MAT")
def _mul_mat(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    to = mul_mat_b_rounding(a.type, b.type)  # ggml's CPU: an F16/BF16 a's products take b in a's type
    _run("mul_mat", arr(a), lut(a), f32_operand(b) if to is None else rounded_operand(b, to), arr(n))


@kernel((FLOATS, FLOATS), ONLY_F32, "OUT_PROD")
def _out_prod(n: Tensor) -> None:
    a = n.src[0]
    out_prod_arrays(n, arr(a), lut(a))


def out_prod_arrays(n: Tensor, a: np.ndarray, la: np.ndarray) -> None:
    """OUT_PROD of node n with its first source given as the host array ``a`` (F16/BF16 bits
    with lookup table ``la``, or float32 values)."""
    _jit()  # imports _jit_fast after it (importing _jit_fast first would be circular)
    from ._jit_fast import TILE_M, TILE_N
    # out[j, i] = sum_t a[t, i] b[t, j] (NumPy order) is MUL_MAT of the transposed operands:
    # the same cache-blocked, register-tiled kernel. An operand that the kernel would pack
    # for several tiles (a for each TILE_N rows of the result, b for each TILE_M columns) is
    # first copied row-major, once: cheaper than packing its transposed panels every time.
    _run("mul_mat", _transposed(a, n.ne[1] > TILE_N), la, _transposed(f32_operand(n.src[1]), n.ne[0] > TILE_M),
         arr(n))


def _transposed(h: np.ndarray, copy: bool) -> np.ndarray:
    """Host array h with its two inner axes swapped; with ``copy``, as a C-contiguous array:
    a new one filled by the compiled transpose kernel (a prepared call keeps the array it
    was recorded with and refills it on every compute)."""
    v = h.swapaxes(2, 3)
    if not copy or v.flags.c_contiguous:
        return v
    out = np.empty(v.shape, v.dtype)
    _run("transpose", h, out)  # bit for bit
    return out


@kernel((FLOATS | INDICES, INDICES), ONLY_F32 | INDICES, "GET_ROWS", reads_values=True)
def _get_rows(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    idx = checked_row_indices("GET_ROWS", b, a.ne[1])
    _run("get_rows", arr(a), lut(a), idx, arr(n))


@kernel((FLOATS, INDICES, PLAIN_TYPES), ONLY_F32, "GET_ROWS_BACK", reads_values=True)
def _get_rows_back(n: Tensor) -> None:
    g, b = n.src[0], n.src[1]
    idx = checked_row_indices("GET_ROWS_BACK", b, n.ne[1])
    _run("get_rows_back", arr(g), lut(g), idx, arr(n))


# ------------------------------------------------------------------ whole-tensor reductions
@kernel((FLOATS,), FLOATS, "SUM")
def _sum(n: Tensor) -> None:
    if _empty_source_zeros(n):
        return
    x = n.src[0]
    _run("reduce_all", arr(x), lut(x), arr(x), lut(x), arr(n), kind(n), 0)


@kernel((INDICES, INDICES), frozenset({I64}), "COUNT_EQUAL")
def _count_equal(n: Tensor) -> None:
    a, b = n.src[0], n.src[1]
    _run("reduce_all", arr(a), lut(a), arr(b), lut(b), arr(n), kind(n), 1)


@kernel((ONLY_F32,), INDICES, "ARGMAX")
def _argmax(n: Tensor) -> None:
    if _empty_source_zeros(n):
        return
    _run("argmax", arr(n.src[0]), arr(n))


# ------------------------------------------------------------------ gated linear units
GLU_ACT = {GluOp.REGLU.name: UNARY_CODES["RELU"], GluOp.GEGLU.name: UNARY_CODES["GELU"],
           GluOp.SWIGLU.name: UNARY_CODES["SILU"], GluOp.GEGLU_ERF.name: UNARY_CODES["GELU_ERF"],
           GluOp.GEGLU_QUICK.name: UNARY_CODES["GELU_QUICK"], GluOp.SWIGLU_OAI.name: -1}


@kernel((FLOATS, FLOATS), FLOATS, *GLU_ACT)
def _glu(n: Tensor) -> None:
    a = n.src[0]
    b = n.src[1] if len(n.src) > 1 else None
    p = n.params
    alpha, limit = (float(p["alpha"]), float(p["limit"])) if n.opdef.key == "SWIGLU_OAI" else (0.0, 0.0)
    _run("glu", arr(a), lut(a), arr(b) if b is not None else arr(a), lut(b) if b is not None else lut(a), arr(n),
         kind(n), GLU_ACT[n.opdef.key], int(b is None), int(bool(p["swapped"])), alpha, limit)


# ------------------------------------------------------------------ joins, padding, sorting
@kernel((COPYABLE, COPYABLE), COPYABLE, "CONCAT")
def _concat(n: Tensor) -> None:
    _run("concat", arr(n.src[0]), arr(n.src[1]), arr(n), 3 - int(n.params["dim"]))


@kernel((ONLY_F32,), ONLY_F32, "PAD")
def _pad(n: Tensor) -> None:
    p = n.params
    _run("index_map", arr(n.src[0]), arr(n), 0, int(p["lp3"]), int(p["lp2"]), int(p["lp1"]), int(p["lp0"]),
         int(bool(p["circular"])))


@kernel((ONLY_F32,), ONLY_F32, "PAD_REFLECT_1D")
def _pad_reflect_1d(n: Tensor) -> None:
    _run("index_map", arr(n.src[0]), arr(n), 1, 0, 0, 0, int(n.params["p0"]), 0)


@kernel((ONLY_F32,), ONLY_F32, "DIAG")
def _diag(n: Tensor) -> None:
    _run("index_map", arr(n.src[0]), arr(n), 2, 0, 0, 0, 0, 0)


@kernel((ONLY_F32,), INDICES, "ARGSORT")
def _argsort(n: Tensor) -> None:
    _run("argsort", arr(n.src[0]), arr(n), int(n.params["order"] == SortOrder.DESC))


# ------------------------------------------------------------------ generators
@kernel((), ONLY_F32, "ARANGE")
def _arange(n: Tensor) -> None:
    out = arr(n)
    _run("generate", out, out, 0, float(n.params["start"]), float(n.params["step"]))


@kernel((ONLY_F32,), ONLY_F32, "TIMESTEP_EMBEDDING")
def _timestep_embedding(n: Tensor) -> None:
    _run("generate", arr(n.src[0]), arr(n), 1, float(n.params["max_period"]), 0.0)
