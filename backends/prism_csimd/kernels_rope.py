"""Node-level wrappers of the C kernels in ``csrc/csimd_rope.h``: ROPE, ROPE_BACK, UPSCALE,
IM2COL_BACK. Registered in :data:`prism_csimd.kernels.KERNELS` / ``SUPPORT`` by the same
``kernel`` decorator (imported at the bottom of ``kernels.py``); every tensor reaches C through
the validated :func:`~prism_csimd.kernels.desc`.
"""

from __future__ import annotations

from prism_core import Tensor
from prism_core.ops import RopeMode
from prism_core.ops.semantics import rope_yarn_corr_dims
from prism_core.ops.table_conv import ScaleMode
from prism_core.types import F16, F32

from .kernels import FLOATS, INDICES, ONLY_F32, _check, _lib, _nth, _state, desc, im2col_args, kernel

F32_F16 = frozenset({F32, F16})


def _corr_dims(n: Tensor) -> tuple[float, float]:
    """YaRN's correction range when ext_factor != 0 (else unused); raises where the reference raises."""
    p = n.params
    if float(p["ext_factor"]) == 0.0:
        return 0.0, 0.0
    low, high = rope_yarn_corr_dims(int(p["n_dims"]), int(p["n_ctx_orig"]), float(p["freq_base"]),
                                    float(p["beta_fast"]), float(p["beta_slow"]))
    return float(low), float(high)


def rope_supported(n: Tensor) -> bool:
    """The ROPE/ROPE_BACK nodes the C kernel computes as the reference does. Refused (the reference
    decides, and raises): YaRN parameters whose correction range is not finite (beta 0 or negative,
    n_ctx_orig 0, freq_base 1 with ext_factor != 0), and VISION with fewer freq factors than its
    n_dims pairs (the reference slices ff[:n_dims] and broadcasts)."""
    try:
        _corr_dims(n)
    except (ArithmeticError, ValueError):
        return False
    ff = n.src[2] if len(n.src) > 2 else None
    if ff is not None and n.params["mode"] == RopeMode.VISION and ff.nelements < int(n.params["n_dims"]):
        return False
    return True


@kernel((F32_F16, INDICES, ONLY_F32), F32_F16, "ROPE", "ROPE_BACK")
def _rope(n: Tensor) -> None:
    keep: list = []
    ffi = _state["ffi"]
    p = n.params
    a, pos = n.src[0], n.src[1]
    ff = n.src[2] if len(n.src) > 2 else None
    low, high = _corr_dims(n)
    sections = ffi.new("int64_t[4]", [int(x) for x in p["sections"]])
    n_pairs = int(p["n_dims"]) // (1 if p["mode"] == RopeMode.VISION else 2)
    work = 4 * n.nelements + 64 * a.ne[2] * n_pairs
    _check(_lib().csimd_rope(int(n.opdef.key == "ROPE_BACK"), int(p["mode"]), int(p["n_dims"]), int(p["n_offs"]),
                             sections, float(p["freq_base"]), float(p["freq_scale"]), float(p["ext_factor"]),
                             float(p["attn_factor"]), low, high, desc(a, keep), desc(pos, keep),
                             desc(ff, keep) if ff is not None else ffi.NULL, desc(n, keep), _nth(work)),
           n.opdef.key)


@kernel((ONLY_F32,), ONLY_F32, "UPSCALE")
def _upscale(n: Tensor) -> None:
    keep: list = []
    bilinear = n.params["mode"] == ScaleMode.BILINEAR
    _check(_lib().csimd_upscale(int(bilinear), int(bool(n.params["align_corners"])), desc(n.src[0], keep),
                                desc(n, keep), _nth(n.nelements * (8 if bilinear else 1))), "UPSCALE")


@kernel((FLOATS, FLOATS), ONLY_F32, "IM2COL_BACK")
def _im2col_back(n: Tensor) -> None:
    keep: list = []
    args = im2col_args(n, n.src[1])
    _check(_lib().csimd_im2col_back(*args, desc(n.src[0], keep), desc(n, keep), _nth(n.nelements * args[7] * args[8])),
           "IM2COL_BACK")
