"""Node-level wrappers around the C kernels of ``prism_csimd._csimd``, and what each supports.

Every call goes through :func:`desc`, which checks on the Python side, before any pointer
reaches C, that the tensor's view (offset, extents, byte strides) lies inside its buffer and
is aligned to its element size. The module itself is loaded lazily by :func:`lib`, so a
missing or broken extension never breaks discovery.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from prism_core import Tensor
from prism_core.errors import InvalidArgument, Unsupported
from prism_core.ops.semantics import checked_row_indices
from prism_core.ops.table import QUANTIZED
from prism_core.plugin.base import KernelTable
from prism_core.types import BF16, F16, F32, I32, I64, PLAIN_TYPES

TABLE = KernelTable()
KERNELS, SUPPORT, READS_VALUES, kernel = TABLE.kernels, TABLE.support, TABLE.reads_values, TABLE.kernel

FLOATS = frozenset({F32, F16, BF16})
ONLY_F32 = frozenset({F32})
INDICES = frozenset({I32})
TYPE_CODES = {F32: 0, F16: 1, BF16: 2, I32: 3, I64: 4}  # I64: COUNT_EQUAL's result and SET_ROWS indices
# block types: csrc/csimd.h's CSIMD_QBASE (64) + the ggml type id
TYPE_CODES.update({t: 64 + int(t) for t in QUANTIZED})


# set by the backend: (ffi, lib) of the loaded extension and the thread count to use
_state: dict[str, object] = {}


# ------------------------------------------------------------------ prepared calls
class _Recorder:
    """Stands in for the C library while a node is prepared: the wrapper runs once, its C calls
    are recorded (not made) with their validated arguments, and the buffers behind them kept."""

    def __init__(self, lib) -> None:
        self.lib, self.calls, self.keep = lib, [], []

    def __getattr__(self, name: str):
        fn = getattr(self.lib, name)

        def record(*args):
            self.calls.append((fn, args))
            return 0
        return record


_recording = threading.local()  # conformance runs kernels in worker threads: one recorder per thread
# Kernels whose C entry points check every index before writing anything (and whose Python wrappers
# name a bad one): prepared all the same (a model's KV cache writes and embedding lookup cost 40-500 us
# of Python per call otherwise), the general path running only when C refuses, to say what was wrong.
RECHECKED = frozenset({"SET_ROWS", "GET_ROWS", "CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK"})


def check_row_indices(op: str, idx: Tensor, n_rows: int) -> None:
    """The range check of a RECHECKED kernel's indices, in Python, except while its node is prepared: a
    plan's inputs are not written yet then (a range check on whatever the buffer held refused to prepare
    a model's KV-cache writes whenever it failed, leaving them on the general path, ~15 us a call); the C
    entry point checks the values of every call and the general path then names a bad one."""
    if getattr(_recording, "rec", None) is None:
        checked_row_indices(op, idx, n_rows)


def prepare(n: Tensor) -> Callable[[], None] | None:
    """A callable making ``n``'s C call(s) with arguments validated and built once (see
    ``Backend.prepare``), or None where the general path must run every time."""
    key = n.opdef.key if n.opdef is not None else None
    if key not in KERNELS or (key in READS_VALUES and key not in RECHECKED) or "lib" not in _state:
        return None
    rec = _Recorder(_state["lib"])
    _recording.rec = rec
    try:
        KERNELS[key](n)
    except Exception:  # noqa: BLE001 - the general path raises the same error, at compute time
        return None
    finally:
        _recording.rec = None
    calls, keep = rec.calls, rec.keep
    if len(calls) == 1 and key in RECHECKED:
        (fn, args), = calls

        def call() -> None:
            if fn(*args):  # refused before writing: the general path says what was wrong
                KERNELS[key](n)
    elif len(calls) == 1:
        (fn, args), = calls

        def call() -> None:
            rc = fn(*args)
            if rc:
                _check(rc, key)
    elif calls:
        def call() -> None:
            for fn, args in calls:
                rc = fn(*args)
                if rc:
                    _check(rc, key)
    else:
        return None
    call.keep = keep  # type: ignore[attr-defined] - the buffers the recorded pointers point into
    return call


# ------------------------------------------------------------------ validated descriptors
def view_extent(t: Tensor) -> tuple[int, int]:
    """(first byte, one past the last byte) that t's view addresses in its buffer."""
    return _extent(t.view_offs, _units(t, t.ne), t.nb, t.traits.type_size)


def _units(t: Tensor, ne) -> tuple:
    """ne counted in storage units: a block type's dim 0 in blocks (nb[0] is a block's stride)."""
    blck = t.traits.blck_size
    return tuple(ne) if blck == 1 else (ne[0] // blck, *ne[1:])


def _extent(offs: int, ne, nb, size: int) -> tuple[int, int]:
    n0, n1, n2, n3 = ne
    if n0 <= 0 or n1 <= 0 or n2 <= 0 or n3 <= 0:
        return offs, offs
    s0, s1, s2, s3 = nb
    return offs, offs + (n0 - 1) * s0 + (n1 - 1) * s1 + (n2 - 1) * s2 + (n3 - 1) * s3 + size


def _check_region(t: Tensor, offs: int, ne, nb, limit: int | None = None) -> None:
    """Raise InvalidArgument unless the region lies inside ``limit`` bytes (default: t's buffer)."""
    if t.type not in TYPE_CODES:
        raise InvalidArgument(f"csimd: type {t.type!r} of {t.label} has no C kernel")
    size = t.traits.type_size
    if len(ne) != 4 or len(nb) != 4:
        raise InvalidArgument(f"csimd: {t.label}: need 4 extents and 4 strides")
    if min(ne) < 0 or min(nb) < 0 or offs < 0:
        raise InvalidArgument(f"csimd: {t.label}: negative extent, stride or offset")
    s0, s1, s2, s3 = nb
    blocks = t.traits.is_quantized  # block bytes are read bytewise: no alignment, dim 0 in whole blocks
    if blocks and ne[0] % t.traits.blck_size:
        raise InvalidArgument(f"csimd: {t.label}: ne[0]={ne[0]} is not a whole number of {t.traits.name} blocks")
    if not blocks and (offs % size or s0 % size or s1 % size or s2 % size or s3 % size):
        raise InvalidArgument(f"csimd: {t.label}: offset/strides not aligned to {size} bytes")
    lo, hi = _extent(offs, _units(t, ne), nb, size)
    limit = t.storage().nbytes if limit is None else limit
    if hi > limit:
        raise InvalidArgument(f"csimd: {t.label}: view [{lo}, {hi}) exceeds its buffer of {limit} bytes")


def check_view(t: Tensor, limit: int | None = None) -> None:
    """Raise InvalidArgument unless t's view lies inside its buffer (or ``limit`` bytes), aligned
    to its element size."""
    _check_region(t, t.view_offs, t.ne, t.nb, limit)


def desc(t: Tensor, keep: list, region: tuple[int, tuple, tuple] | None = None):
    """A validated csimd_tensor* for t (or for ``region`` = (byte offset from t's start,
    ne, nb) of t's buffer); the buffers it points into are kept alive in ``keep``."""
    offs, ne, nb = (t.view_offs, t.ne, t.nb) if region is None else (t.view_offs + region[0], *region[1:])
    ne, nb = tuple(ne), tuple(nb)
    buf = t.storage()
    _check_region(t, offs, ne, nb, buf.nbytes)
    if not buf.flags.writeable:
        raise InvalidArgument(f"csimd: {t.label}: read-only buffer")
    ffi = _state["ffi"]
    base = ffi.from_buffer("char[]", buf, require_writable=True)
    d = ffi.new("csimd_tensor *", (base + offs, ne, nb, TYPE_CODES[t.type]))
    keep.append(buf)
    keep.append(base)
    rec = getattr(_recording, "rec", None)
    if rec is not None:
        rec.keep += (buf, base)
    return d


def _lib():
    """The C library, or while a node is being prepared, the recorder standing in for it."""
    rec = getattr(_recording, "rec", None)
    return rec if rec is not None else _state["lib"]


# reductions whose source may be empty: ggml's loops then leave a sum at +0, an argmax at index 0 and
# REPEAT_BACK's accumulator at 0, all-zero bytes in every result type; written here, not in C
EMPTY_SOURCE_ZEROS = frozenset({"SUM", "SUM_ROWS", "ARGMAX", "REPEAT_BACK"})


def _empty_source_zeros(n: Tensor) -> bool:
    """True when n's source is empty: n then holds zeros (written at compute time; while the node is
    prepared nothing is recorded, so the plan calls the wrapper on every compute)."""
    if n.src[0].nelements:
        return False
    if getattr(_recording, "rec", None) is None:
        n.host()[...] = 0
    return True


def _nth(work: int) -> int:
    n = int(_state.get("threads", 1))
    return 1 if work < int(_state.get("serial_work", 1 << 15)) else n


def _check(rc: int, what: str) -> None:
    if rc == -2:
        raise MemoryError(f"csimd {what}: out of memory")
    if rc != 0:
        raise InvalidArgument(f"csimd {what}: the C kernel refused its arguments (code {rc})")


# ------------------------------------------------------------------ elementwise
BINARY_CODES = {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3, "ADD1": 0, "SILU_BACK": 4}


@kernel((FLOATS, FLOATS), FLOATS, *BINARY_CODES)
def _binary(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    _check(_lib().csimd_binary(BINARY_CODES[n.opdef.key], desc(a, keep), desc(b, keep), desc(n, keep),
                               _nth(n.nelements)), n.opdef.key)


UNARY_CODES = {
    "ABS": 0, "SGN": 1, "NEG": 2, "STEP": 3, "TANH": 4, "ELU": 5, "RELU": 6, "SIGMOID": 7, "GELU": 8,
    "GELU_QUICK": 9, "SILU": 10, "HARDSWISH": 11, "HARDSIGMOID": 12, "EXP": 13, "EXPM1": 14, "SOFTPLUS": 15,
    "GELU_ERF": 16, "FLOOR": 17, "CEIL": 18, "ROUND": 19, "TRUNC": 20, "SQR": 21, "SQRT": 22, "LOG": 23,
    "SIN": 24, "COS": 25, "SCALE": 26, "CLAMP": 27, "LEAKY_RELU": 28,
}


def _unary_params(n: Tensor) -> tuple[float, float]:
    p, key = n.params, n.opdef.key
    if key == "SCALE":
        return float(p["s"]), float(p["b"])
    if key == "CLAMP":
        return float(p["min"]), float(p["max"])
    if key == "LEAKY_RELU":
        return float(p["negative_slope"]), 0.0
    return 0.0, 0.0


@kernel((FLOATS,), FLOATS, *UNARY_CODES)
def _unary(n: Tensor) -> None:
    keep: list = []
    p0, p1 = _unary_params(n)
    work = n.nelements * (1 if n.opdef.key in ("NEG", "ABS", "SQR", "RELU", "SCALE") else 8)
    _check(_lib().csimd_unary(UNARY_CODES[n.opdef.key], p0, p1, desc(n.src[0], keep), desc(n, keep), _nth(work)),
           n.opdef.key)


# ------------------------------------------------------------------ copies
@kernel((FLOATS | INDICES,), FLOATS | INDICES, "DUP", "CONT")
@kernel((FLOATS | INDICES, FLOATS | INDICES), FLOATS | INDICES, "CPY")
def _cpy(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_cpy(desc(n.src[0], keep), desc(n, keep), _nth(n.nelements)), n.opdef.key)


# ------------------------------------------------------------------ rows
@kernel((ONLY_F32, frozenset({F32, F16}), ONLY_F32), ONLY_F32, "SOFT_MAX")
def _soft_max(n: Tensor) -> None:
    from prism_core.ops.semantics import alibi_slopes

    keep: list = []
    ffi = _state["ffi"]
    a = n.src[0]
    mask = n.src[1] if len(n.src) > 1 else None
    slopes = np.ascontiguousarray(alibi_slopes(a.ne[2], float(n.params["max_bias"])), np.float32)
    sl = ffi.from_buffer("float[]", slopes)
    keep.append(slopes)
    sinks = n.src[2] if len(n.src) > 2 else None
    md = desc(mask, keep) if mask is not None else ffi.NULL
    sd = desc(sinks, keep) if sinks is not None else ffi.NULL
    _check(_lib().csimd_soft_max(desc(a, keep), md, sd, desc(n, keep), sl, float(n.params["scale"]),
                                 _nth(4 * n.nelements)), "SOFT_MAX")


NORM_CODES = {"NORM": 0, "RMS_NORM": 1, "L2_NORM": 2}


@kernel((ONLY_F32,), ONLY_F32, *NORM_CODES)
def _norm(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_norm(NORM_CODES[n.opdef.key], float(n.params["eps"]), desc(n.src[0], keep), desc(n, keep),
                             _nth(2 * n.nelements)), n.opdef.key)


def _check_labels(rc: int, what: str, a: Tensor) -> None:
    if rc == -3:
        raise InvalidArgument(f"{what}: a class index of b is outside [0, {a.ne[0]})")
    _check(rc, what)


LABELS = ONLY_F32 | frozenset({I32})  # label rows, or one class index per row


@kernel((ONLY_F32, LABELS), ONLY_F32, "CROSS_ENTROPY_LOSS")
def _cross_entropy_loss(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    _check_labels(_lib().csimd_cross_entropy(desc(a, keep), desc(b, keep), desc(n, keep), _state["ffi"].NULL, 0,
                                             _nth(8 * a.nelements)), "CROSS_ENTROPY_LOSS", a)


@kernel((ONLY_F32, ONLY_F32, LABELS), ONLY_F32, "CROSS_ENTROPY_LOSS_BACK")
def _cross_entropy_loss_back(n: Tensor) -> None:
    keep: list = []
    g, a, b = n.src  # g's value is read by the C kernel at call time
    _check_labels(_lib().csimd_cross_entropy(desc(a, keep), desc(b, keep), desc(n, keep), desc(g, keep), 1,
                                             _nth(8 * a.nelements)), "CROSS_ENTROPY_LOSS_BACK", a)


# ------------------------------------------------------------------ optimizer steps
def _opt_params(p: Tensor, count: int, keep: list):
    """The parameter vector (read by the C kernel at call time: it changes between steps)."""
    if p.ne[0] < count:
        raise InvalidArgument(f"csimd: optimizer params {p.label} need {count} values along dim 0, got {p.ne[0]}")
    return desc(p, keep)


@kernel((ONLY_F32,) * 5, ONLY_F32, "OPT_STEP_ADAMW")
def _adamw(n: Tensor) -> None:
    keep: list = []
    a, g, m, v, p = n.src
    _check(_lib().csimd_opt_step(1, _opt_params(p, 7, keep), desc(a, keep), desc(g, keep), desc(m, keep),
                                 desc(v, keep), desc(n, keep), _nth(4 * n.nelements)), "OPT_STEP_ADAMW")


@kernel((ONLY_F32,) * 3, ONLY_F32, "OPT_STEP_SGD")
def _sgd(n: Tensor) -> None:
    keep: list = []
    a, g, p = n.src
    d = desc(n, keep)
    _check(_lib().csimd_opt_step(0, _opt_params(p, 2, keep), desc(a, keep), desc(g, keep), d, d, d,
                                 _nth(2 * n.nelements)), "OPT_STEP_SGD")


# ------------------------------------------------------------------ matrices and indexing
@kernel((FLOATS, FLOATS), ONLY_F32, "MUL_MAT")
def _mul_mat(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    rc = _lib().csimd_mul_mat(desc(a, keep), desc(b, keep), desc(n, keep), int(_state.get("threads", 1)))
    _check(rc, "MUL_MAT")


@kernel((FLOATS | INDICES, INDICES), ONLY_F32 | INDICES, "GET_ROWS", reads_values=True)
def _get_rows(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    check_row_indices("GET_ROWS", b, a.ne[1])
    _check(_lib().csimd_get_rows(desc(a, keep), desc(b, keep), desc(n, keep), _nth(n.nelements)), "GET_ROWS")


# ------------------------------------------------------------------ repeat, reductions, backward ops
@kernel((FLOATS | INDICES, PLAIN_TYPES), FLOATS | INDICES, "REPEAT")
def _repeat(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_repeat(desc(n.src[0], keep), desc(n, keep), _nth(n.nelements)), "REPEAT")


@kernel((FLOATS, PLAIN_TYPES), FLOATS, "REPEAT_BACK")
def _repeat_back(n: Tensor) -> None:
    if _empty_source_zeros(n):
        return
    keep: list = []
    _check(_lib().csimd_repeat_back(desc(n.src[0], keep), desc(n, keep)), "REPEAT_BACK")


REDUCE_CODES = {"SUM": 0, "SUM_ROWS": 1, "MEAN": 2}


@kernel((FLOATS,), FLOATS, "SUM", "SUM_ROWS")
@kernel((FLOATS,), ONLY_F32, "MEAN")
def _reduce(n: Tensor) -> None:
    if n.opdef.key in EMPTY_SOURCE_ZEROS and _empty_source_zeros(n):
        return
    keep: list = []
    a = n.src[0]
    _check(_lib().csimd_reduce(REDUCE_CODES[n.opdef.key], desc(a, keep), desc(n, keep), _nth(a.nelements)),
           n.opdef.key)


@kernel((ONLY_F32, ONLY_F32), ONLY_F32, "SOFT_MAX_BACK", "RMS_NORM_BACK")
def _rows_back(n: Tensor) -> None:
    keep: list = []
    key = n.opdef.key
    p = float(n.params["scale"]) if key == "SOFT_MAX_BACK" else float(n.params["eps"])
    a, b = n.src[0], n.src[1]
    _check(_lib().csimd_rows_back(int(key == "RMS_NORM_BACK"), p, desc(a, keep), desc(b, keep), desc(n, keep),
                                  _nth(4 * a.nelements)), key)


@kernel((ONLY_F32,), ONLY_F32, "DIAG_MASK_INF", "DIAG_MASK_ZERO")
def _diag_mask(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_diag_mask(int(n.opdef.key == "DIAG_MASK_INF"), int(n.params["n_past"]),
                                  desc(n.src[0], keep), desc(n, keep), _nth(n.nelements)), n.opdef.key)


@kernel((FLOATS, INDICES, PLAIN_TYPES), ONLY_F32, "GET_ROWS_BACK", reads_values=True)
def _get_rows_back(n: Tensor) -> None:
    keep: list = []
    g, b = n.src[0], n.src[1]
    checked_row_indices("GET_ROWS_BACK", b, n.ne[1])
    _check(_lib().csimd_get_rows_back(desc(g, keep), desc(b, keep), desc(n, keep)), "GET_ROWS_BACK")


@kernel((FLOATS, FLOATS), ONLY_F32, "OUT_PROD")
def _out_prod(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    _check(_lib().csimd_out_prod(desc(a, keep), desc(b, keep), desc(n, keep), int(_state.get("threads", 1))),
           "OUT_PROD")


# ------------------------------------------------------------------ gated linear units
GLU_ACT = {"REGLU": UNARY_CODES["RELU"], "GEGLU": UNARY_CODES["GELU"], "SWIGLU": UNARY_CODES["SILU"],
           "GEGLU_ERF": UNARY_CODES["GELU_ERF"], "GEGLU_QUICK": UNARY_CODES["GELU_QUICK"], "SWIGLU_OAI": -1}


@kernel((FLOATS, FLOATS), FLOATS, *GLU_ACT)
def _glu(n: Tensor) -> None:
    keep: list = []
    ffi = _state["ffi"]
    a = n.src[0]
    b = n.src[1] if len(n.src) > 1 else None
    p = n.params
    alpha, limit = (float(p["alpha"]), float(p["limit"])) if n.opdef.key == "SWIGLU_OAI" else (0.0, 0.0)
    bd = desc(b, keep) if b is not None else ffi.NULL
    _check(_lib().csimd_glu(GLU_ACT[n.opdef.key], int(bool(p["swapped"])), alpha, limit, desc(a, keep), bd,
                            desc(n, keep), _nth(8 * n.nelements)), n.opdef.key)


# ------------------------------------------------------------------ joins and regions (copies into views)
@kernel((FLOATS | INDICES, FLOATS | INDICES), FLOATS | INDICES, "CONCAT")
def _concat(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    dim = int(n.params["dim"])
    lib, nth = _lib(), _nth(n.nelements)
    _check(lib.csimd_cpy(desc(a, keep), desc(n, keep, (0, a.ne, n.nb)), nth), "CONCAT")
    _check(lib.csimd_cpy(desc(b, keep), desc(n, keep, (a.ne[dim] * n.nb[dim], b.ne, n.nb)), nth), "CONCAT")


def _region_of(n: Tensor, b: Tensor) -> tuple[int, tuple, tuple]:
    p = n.params
    return int(p["offset"]), b.ne, (n.traits.type_size, int(p["nb1"]), int(p["nb2"]), int(p["nb3"]))


@kernel((FLOATS | INDICES, FLOATS | INDICES), FLOATS | INDICES, "SET")
def _set(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    lib, nth = _lib(), _nth(n.nelements)
    if not (a.base is n.base and a.view_offs == n.view_offs and a.nb == n.nb):  # in place: a is already there
        _check(lib.csimd_cpy(desc(a, keep), desc(n, keep), nth), "SET")
    _check(lib.csimd_cpy(desc(b, keep), desc(n, keep, _region_of(n, b)), nth), "SET")


@kernel((ONLY_F32, ONLY_F32), ONLY_F32, "ACC")
def _acc(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    lib, nth = _lib(), _nth(n.nelements)
    if not (a.base is n.base and a.view_offs == n.view_offs and a.nb == n.nb):
        _check(lib.csimd_cpy(desc(a, keep), desc(n, keep), nth), "ACC")
    region = desc(n, keep, _region_of(n, b))
    _check(lib.csimd_binary(BINARY_CODES["ADD"], region, desc(b, keep), region, nth), "ACC")


# ------------------------------------------------------------------ padding, diagonals, generators, argmax
@kernel((ONLY_F32,), ONLY_F32, "PAD", "PAD_REFLECT_1D", "DIAG")
def _index_map(n: Tensor) -> None:
    keep: list = []
    ffi = _state["ffi"]
    key, p = n.opdef.key, n.params
    if key == "PAD":
        pads = [int(p[f"lp{i}"]) for i in range(4)]
    elif key == "PAD_REFLECT_1D":
        pads = [int(p["p0"]), 0, 0, 0]
    else:
        pads = [0, 0, 0, 0]
    pv = ffi.new("int64_t[4]", pads)
    mode = {"PAD": 0, "PAD_REFLECT_1D": 1, "DIAG": 2}[key]
    circular = int(bool(p["circular"])) if key == "PAD" else 0
    _check(_lib().csimd_index_map(mode, pv, circular, desc(n.src[0], keep), desc(n, keep), _nth(n.nelements)), key)


@kernel((), ONLY_F32, "ARANGE")
def _arange(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_arange(float(n.params["start"]), float(n.params["step"]), desc(n, keep)), "ARANGE")


@kernel((ONLY_F32,), INDICES, "ARGMAX")
def _argmax(n: Tensor) -> None:
    if _empty_source_zeros(n):
        return
    keep: list = []
    _check(_lib().csimd_argmax(desc(n.src[0], keep), desc(n, keep)), "ARGMAX")


@kernel((FLOATS,), FLOATS, "XIELU")
def _xielu(n: Tensor) -> None:
    keep: list = []
    p = n.params
    beta = float(p["beta"])
    an, ap = beta + _softplus(float(p["alpha_n"])), _softplus(float(p["alpha_p"]))
    _check(_lib().csimd_xielu(an, ap, beta, float(p["eps"]), desc(n.src[0], keep), desc(n, keep),
                              _nth(8 * n.nelements)), "XIELU")


def _softplus(x: float) -> float:
    return x if x > 20 else math.log1p(math.exp(x))


@kernel((ONLY_F32,), ONLY_F32, "TIMESTEP_EMBEDDING")
def _timestep_embedding(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_timestep_embedding(float(n.params["max_period"]), desc(n.src[0], keep), desc(n, keep),
                                           _nth(16 * n.nelements)), "TIMESTEP_EMBEDDING")


@kernel((ONLY_F32,), ONLY_F32, "GROUP_NORM")
def _group_norm(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_group_norm(int(n.params["n_groups"]), float(n.params["eps"]), desc(n.src[0], keep),
                                   desc(n, keep), _nth(3 * n.nelements)), "GROUP_NORM")


@kernel((ONLY_F32,), INDICES, "ARGSORT")
def _argsort(n: Tensor) -> None:
    keep: list = []
    descending = int(int(n.params["order"]) == 1)  # SortOrder.DESC
    _check(_lib().csimd_argsort(descending, desc(n.src[0], keep), desc(n, keep),
                                _nth(n.nelements * max(1, n.ne[0].bit_length()))), "ARGSORT")


@kernel((frozenset({F32, F16}), INDICES | {I64}, FLOATS), FLOATS, "SET_ROWS", reads_values=True)
def _set_rows(n: Tensor) -> None:
    keep: list = []
    b, c, a = n.src[0], n.src[1], n.src[2]
    if n.type != a.type:
        raise InvalidArgument("SET_ROWS: the result must have the destination's type")
    check_row_indices("SET_ROWS", c, n.ne[1])
    _check(_lib().csimd_set_rows(desc(b, keep), desc(c, keep), desc(n, keep), _nth(b.nelements)), "SET_ROWS")


@kernel((FLOATS, FLOATS, INDICES), ONLY_F32, "MUL_MAT_ID", reads_values=True)
def _mul_mat_id(n: Tensor) -> None:
    keep: list = []
    w, b, ids = n.src[0], n.src[1], n.src[2]
    idx = ids.host()
    if idx.size and (idx.min() < 0 or idx.max() >= w.ne[2]):
        raise InvalidArgument(f"MUL_MAT_ID: expert id out of range [0, {w.ne[2]})")
    _check(_lib().csimd_mul_mat_id(desc(w, keep), desc(b, keep), desc(ids, keep), desc(n, keep),
                                   _nth(n.nelements * w.ne[0])), "MUL_MAT_ID")


@kernel((INDICES, INDICES), frozenset({I64}), "COUNT_EQUAL")
def _count_equal(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_count_equal(desc(n.src[0], keep), desc(n.src[1], keep), desc(n, keep),
                                    _nth(n.src[0].nelements)), "COUNT_EQUAL")


@kernel((frozenset({F32, F16}),), ONLY_F32, "POOL_1D", "POOL_2D")
def _pool(n: Tensor) -> None:
    keep: list = []
    p = n.params
    dims2 = n.opdef.key == "POOL_2D"
    k1, s1, p1 = (int(p["k1"]), int(p["s1"]), int(p["p1"])) if dims2 else (1, 1, 0)
    _check(_lib().csimd_pool(int(dims2), int(int(p["op"]) == 0), int(p["k0"]), k1, int(p["s0"]), s1, int(p["p0"]), p1,
                             desc(n.src[0], keep), desc(n, keep), _nth(n.nelements * int(p["k0"]) * k1)),
           n.opdef.key)


def im2col_args(n: Tensor, kernel_shape: Tensor) -> tuple[int, ...]:
    """(is_2D, s0, s1, p0, p1, d0, d1, KH, KW) of an IM2COL or IM2COL_BACK node, KH = 1 in 1D."""
    p = n.params
    is2d = bool(p["is_2D"])
    kh, kw = (kernel_shape.ne[1], kernel_shape.ne[0]) if is2d else (1, kernel_shape.ne[0])
    return (int(is2d), *(int(p[k]) for k in ("s0", "s1", "p0", "p1", "d0", "d1")), int(kh), int(kw))


@kernel((FLOATS, FLOATS), frozenset({F32, F16}), "IM2COL")
def _im2col(n: Tensor) -> None:
    keep: list = []
    _check(_lib().csimd_im2col(*im2col_args(n, n.src[0]), desc(n.src[1], keep), desc(n, keep), _nth(n.nelements)),
           "IM2COL")


@kernel((frozenset({F32, F16}), frozenset({F32, F16})), ONLY_F32, "POOL_2D_BACK")
def _pool_2d_back(n: Tensor) -> None:
    keep: list = []
    p = n.params
    _check(_lib().csimd_pool_2d_back(int(int(p["op"]) == 0), int(p["k0"]), int(p["k1"]), int(p["s0"]), int(p["s1"]),
                                     int(p["p0"]), int(p["p1"]), desc(n.src[0], keep), desc(n.src[1], keep),
                                     desc(n, keep), _nth(n.src[0].nelements * int(p["k0"]) * int(p["k1"]))),
           "POOL_2D_BACK")


__all__ = ["KERNELS", "SUPPORT", "Unsupported", "check_view", "desc", "view_extent"]

# registering: FLASH_ATTN_EXT, CONV_2D, CONV_TRANSPOSE_1D (kernels_attn); ROPE, ROPE_BACK, UPSCALE,
# IM2COL_BACK (kernels_rope); kernels_quant registers MUL_MAT, MUL_MAT_ID, GET_ROWS, CPY, DUP, CONT,
# SET_ROWS, OUT_PROD and ADD again with block types accepted (calling the wrappers above for floats)
from . import kernels_attn, kernels_quant, kernels_rope  # noqa: E402,F401
