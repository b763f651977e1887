"""csimd wrappers of the C kernels in csrc/csimd_attn.h: FLASH_ATTN_EXT, CONV_2D, CONV_TRANSPOSE_1D.

Registered in the same KERNELS/SUPPORT tables as the rest (imported at the bottom of
:mod:`prism_csimd.kernels`); every tensor reaches C through :func:`desc` (so its values, the sinks
included, are read at call time and a prepared call stays valid), and the ALiBi slopes, which
depend on the params only, are built here with one value per head.
"""

from __future__ import annotations

import numpy as np

from prism_core import Tensor
from prism_core.errors import InvalidArgument
from prism_core.ops.semantics import alibi_slopes
from prism_core.types import F16, F32

from .kernels import FLOATS, ONLY_F32, _check, _lib, _nth, _state, desc, kernel

F32_F16 = frozenset({F32, F16})


# mask: the op table accepts F16; the C kernel also reads F32
@kernel((ONLY_F32, FLOATS, FLOATS, F32_F16, ONLY_F32), ONLY_F32, "FLASH_ATTN_EXT")
def _flash_attn_ext(n: Tensor) -> None:
    keep: list = []
    ffi = _state["ffi"]
    q, k, v = n.src[0], n.src[1], n.src[2]
    mask = n.src[3] if len(n.src) > 3 else None
    sinks = n.src[4] if len(n.src) > 4 else None
    p = n.params
    n_head = q.ne[2]
    slopes = np.ascontiguousarray(alibi_slopes(n_head, float(p["max_bias"])), np.float32)  # one per head
    keep.append(slopes)
    if sinks is not None and sinks.nelements != n_head:  # the op table's rule; C checks it again
        raise InvalidArgument(f"csimd FLASH_ATTN_EXT: sinks needs {n_head} values (one per head), has "
                              f"{sinks.nelements}")
    sp = desc(sinks, keep) if sinks is not None else ffi.NULL
    md = desc(mask, keep) if mask is not None else ffi.NULL
    work = q.ne[3] * n_head * q.ne[1] * k.ne[1] * (q.ne[0] + v.ne[0])
    _check(_lib().csimd_flash_attn_ext(desc(q, keep), desc(k, keep), desc(v, keep), md, sp,
                                       ffi.from_buffer("float[]", slopes), float(p["scale"]),
                                       float(p["logit_softcap"]), desc(n, keep), _nth(work)), "FLASH_ATTN_EXT")


@kernel((FLOATS, F32_F16), F32_F16, "CONV_2D")
def _conv_2d(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    p = n.params
    work = n.nelements * a.ne[0] * a.ne[1] * a.ne[2]
    _check(_lib().csimd_conv_2d(int(p["s0"]), int(p["s1"]), int(p["p0"]), int(p["p1"]), int(p["d0"]), int(p["d1"]),
                                desc(a, keep), desc(b, keep), desc(n, keep), _nth(work)), "CONV_2D")


@kernel((FLOATS, FLOATS), ONLY_F32, "CONV_TRANSPOSE_1D")
def _conv_transpose_1d(n: Tensor) -> None:
    keep: list = []
    a, b = n.src[0], n.src[1]
    p = n.params
    if int(p["p0"]) != 0 or int(p["d0"]) != 1:  # the op table refuses these already (as ggml)
        raise InvalidArgument("csimd CONV_TRANSPOSE_1D: only p0 = 0 and d0 = 1")
    work = a.nelements * b.ne[0]
    _check(_lib().csimd_conv_transpose_1d(int(p["s0"]), desc(a, keep), desc(b, keep), desc(n, keep), _nth(work)),
           "CONV_TRANSPOSE_1D")
