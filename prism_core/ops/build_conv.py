"""Graph-building functions for the conv ops (ggml's ``ggml_im2col``, ``ggml_conv_2d``,
``ggml_pool_2d``, ``ggml_upscale_ext``...). Re-exported by :mod:`prism_core.ops.build`.

Shapes are ggml order (``ne[0]`` innermost): a 2D kernel is [KW, KH, IC, OC], a 2D
input [W, H, IC, N]; 1D kernels are [K, IC, OC] and inputs [L, IC, N].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from ..tensor import Tensor, check_ne
from ..types import F16, F32, as_type
from .build import _tensor_arg, mul_mat, node, permute, reshape
from .build import cont as _cont
from .table_conv import PoolOp, ScaleMode


def _enum(cls, value: Any, what: str):
    if isinstance(value, str):
        if value.upper() not in cls.__members__:
            raise InvalidArgument(f"{what}: unknown {cls.__name__} {value!r}; known: {', '.join(cls.__members__)}")
        return cls[value.upper()]
    return value


# ------------------------------------------------------------------ im2col
def im2col(a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int, is_2D: bool = True,
           dst_type: Any = F32) -> Tensor:
    """The patches of input ``b`` that a convolution with kernel ``a`` reads (``a`` only
    supplies its shape). 2D: a [KW, KH, IC, OC], b [W, H, IC, N] -> [IC*KH*KW, OW, OH, N];
    1D (``is_2D=False``): a [K, IC, OC], b [L, IC, N] -> [IC*K, OL, N, 1], with s1/d1 unused
    and p1 = 0. Element (ic*KH*KW + kh*KW + kw, ow, oh, n) is
    b[ow*s0 + kw*d0 - p0, oh*s1 + kh*d1 - p1, ic, n], or 0 outside b. Output sizes
    O = (I + 2p - d(k-1) - 1)/s + 1; the result has type ``dst_type`` (f32 or f16)."""
    return node("IM2COL", a, b, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1, is_2D=is_2D,
                dst_type=as_type(dst_type))


def im2col_back(grad: Tensor, kernel: Tensor, ne: Sequence[int], s0: int, s1: int, p0: int, p1: int, d0: int,
                d1: int, is_2D: bool = True) -> Tensor:
    """Adjoint of :func:`im2col`: F32 tensor of the input extents ``ne`` in which each
    element is the sum of the entries of ``grad`` (im2col's result shape) that read it."""
    ne = check_ne(ne, "IM2COL_BACK: ne")
    return node("IM2COL_BACK", grad, kernel, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1, ne=ne, is_2D=is_2D)


# ------------------------------------------------------------------ convolutions
def conv_transpose_1d(a: Tensor, b: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
    """Transposed 1D convolution: kernel a [K, OC, IC], input b [L, IC] -> F32
    [(L-1)*s0 + K, OC] with out[l*s0 + k, oc] += sum_ic a[k, oc, ic] * b[l, ic].
    As in ggml, only p0 = 0 and d0 = 1 are supported."""
    return node("CONV_TRANSPOSE_1D", a, b, s0=s0, p0=p0, d0=d0)


def conv_2d(a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0, d0: int = 1,
            d1: int = 1) -> Tensor:
    """Direct 2D convolution (one CONV_2D node, ggml_conv_2d_direct): kernel
    a [KW, KH, IC, OC], input b [W, H, IC, N] -> b's type [OW, OH, OC, N] with
    out[ow, oh, oc, n] = sum_{ic,kh,kw} a[kw, kh, ic, oc] * b[ow*s0 + kw*d0 - p0, oh*s1 + kh*d1 - p1, ic, n]
    (zero outside b). See :func:`conv_2d_im2col` for ggml_conv_2d's im2col + mul_mat form."""
    return node("CONV_2D", a, b, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1)


def conv_2d_direct(a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0, d0: int = 1,
                   d1: int = 1) -> Tensor:
    """Same as :func:`conv_2d` (ggml's name for the direct op)."""
    return conv_2d(a, b, s0, s1, p0, p1, d0, d1)


def conv_2d_im2col(a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0, d0: int = 1,
                   d1: int = 1) -> Tensor:
    """ggml_conv_2d: the 2D convolution as im2col (result type = a's type) + mul_mat +
    reshape/permute/cont. Kernel a [KW, KH, IC, OC] (contiguous), input b [W, H, IC, N]
    -> F32 [OW, OH, OC, N]; same values as :func:`conv_2d`."""
    a = _tensor_arg("conv_2d_im2col", "a", a)
    with a.ctx.transaction():
        cols = im2col(a, b, s0, s1, p0, p1, d0, d1, True, a.type if a.type in (F32, F16) else F32)
        r = mul_mat(reshape(cols, (cols.ne[0], cols.ne[3] * cols.ne[2] * cols.ne[1])),
                    reshape(a, (a.ne[0] * a.ne[1] * a.ne[2], a.ne[3])))          # [N*OH*OW, OC]
        r = reshape(r, (cols.ne[1], cols.ne[2], cols.ne[3], a.ne[3]))            # [OW, OH, N, OC]
        return _cont(permute(r, 0, 1, 3, 2))                                     # [OW, OH, OC, N]


def conv_1d(a: Tensor, b: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
    """1D convolution as im2col (1D, result type = a's type) + mul_mat, like ggml_conv_1d:
    kernel a [K, IC, OC] (contiguous), input b [L, IC, N] -> F32 [OL, OC, N] with
    out[ol, oc, n] = sum_{ic,k} a[k, ic, oc] * b[ol*s0 + k*d0 - p0, ic, n] (zero outside b).
    ggml_conv_1d reshapes the [N*OL, OC] product straight to [OL, OC, N], which orders the
    batch correctly only for N = 1; here it is permuted (and made contiguous) instead."""
    a = _tensor_arg("conv_1d", "a", a)
    with a.ctx.transaction():
        cols = im2col(a, b, s0, 0, p0, 0, d0, 0, False, a.type if a.type in (F32, F16) else F32)  # [IC*K, OL, N]
        r = mul_mat(reshape(cols, (cols.ne[0], cols.ne[2] * cols.ne[1])),
                    reshape(a, (a.ne[0] * a.ne[1], a.ne[2])))                                # [N*OL, OC]
        r = reshape(r, (cols.ne[1], cols.ne[2], a.ne[2]))                                    # [OL, N, OC]
        return _cont(permute(r, 0, 2, 1, 3))                                                 # [OL, OC, N]


# ------------------------------------------------------------------ pooling
def pool_1d(a: Tensor, op: PoolOp | str, k0: int, s0: int, p0: int = 0) -> Tensor:
    """F32 pooling along dim 0: windows of ``k0`` taps every ``s0``, ``p0`` padding on both
    sides (p0 < k0); ``op`` MAX, or AVG over the taps that fall inside a (ggml HEAD).
    Result ne0 = (ne0 + 2*p0 - k0) / s0 + 1, other extents kept."""
    return node("POOL_1D", a, op=_enum(PoolOp, op, "POOL_1D"), k0=k0, s0=s0, p0=p0)


def pool_2d(a: Tensor, op: PoolOp | str, k0: int, k1: int, s0: int, s1: int, p0: int = 0, p1: int = 0) -> Tensor:
    """F32 pooling over dims 0 and 1 with a k0 x k1 window, strides s0, s1 and padding
    p0, p1 on both sides: MAX of the taps inside a (-FLT_MAX if there are none), or AVG =
    (sum of the taps inside a) / (k0*k1), so padding counts as zeros. Output extents
    (ne + 2p - k) / s + 1 along dims 0 and 1."""
    return node("POOL_2D", a, op=_enum(PoolOp, op, "POOL_2D"), k0=k0, k1=k1, s0=s0, s1=s1, p0=p0, p1=p1)


def pool_2d_back(grad: Tensor, af: Tensor, op: PoolOp | str, k0: int, k1: int, s0: int, s1: int, p0: int = 0,
                 p1: int = 0) -> Tensor:
    """Adjoint of :func:`pool_2d` at forward input ``af``: F32 of af's extents. MAX adds each
    grad element to the first maximal tap of its window (scan order dim 1, then dim 0),
    AVG adds grad / (k0*k1) to every tap inside af."""
    return node("POOL_2D_BACK", grad, af, op=_enum(PoolOp, op, "POOL_2D_BACK"), k0=k0, k1=k1, s0=s0, s1=s1,
                p0=p0, p1=p1)


# ------------------------------------------------------------------ upscale
def upscale_ext(a: Tensor, ne0: int, ne1: int, ne2: int | None = None, ne3: int | None = None,
                mode: ScaleMode | str = ScaleMode.NEAREST, align_corners: bool = False) -> Tensor:
    """F32 a resized to [ne0, ne1, ne2, ne3] (ne2, ne3 default to a's). With sf_i = ne_i / a.ne_i:
    NEAREST reads a[floor(i / sf_i)] in every dim; BILINEAR interpolates dims 0 and 1 at
    src = (i + 0.5) / sf - 0.5 (clamped at the edges; offset 0 and sf = (ne - 1)/(a.ne - 1) with
    ``align_corners``) and uses nearest along dims 2, 3 (ggml_interpolate)."""
    a = _tensor_arg("UPSCALE", "a", a)
    ne = (ne0, ne1, a.ne[2] if ne2 is None else ne2, a.ne[3] if ne3 is None else ne3)
    return node("UPSCALE", a, ne=ne, mode=_enum(ScaleMode, mode, "UPSCALE"), align_corners=align_corners)


def upscale(a: Tensor, scale_factor: int, mode: ScaleMode | str = ScaleMode.NEAREST) -> Tensor:
    """ggml_upscale: dims 0 and 1 multiplied by the integer ``scale_factor``."""
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, int) or scale_factor < 1:
        raise InvalidArgument(f"UPSCALE: scale_factor must be an int >= 1, got {scale_factor!r}")
    a = _tensor_arg("UPSCALE", "a", a)
    return upscale_ext(a, a.ne[0] * scale_factor, a.ne[1] * scale_factor, mode=mode)


def interpolate(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: ScaleMode | str = ScaleMode.NEAREST,
                align_corners: bool = False) -> Tensor:
    """ggml_interpolate: :func:`upscale_ext` with all four target extents given."""
    return upscale_ext(a, ne0, ne1, ne2, ne3, mode, align_corners)


__all__ = ["PoolOp", "ScaleMode", "im2col", "im2col_back", "conv_transpose_1d", "conv_2d", "conv_2d_direct",
           "conv_2d_im2col", "conv_1d", "pool_1d", "pool_2d", "pool_2d_back", "upscale", "upscale_ext",
           "interpolate"]
