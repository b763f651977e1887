"""Op-table declarations: conv ops (part of the one op table, :data:`prism_core.ops.table.OPS`).

IM2COL / IM2COL_BACK, CONV_TRANSPOSE_1D, CONV_2D (direct), POOL_1D, POOL_2D /
POOL_2D_BACK and UPSCALE, with ggml's parameters and output sizes. Shapes are ggml
order: the kernel is ``a`` ([KW, KH, IC, OC] in 2D), the input ``b`` ([W, H, IC, N]).
"""

from __future__ import annotations

import enum

from ..errors import InvalidArgument, ShapeMismatch, TypeMismatch
from ..types import F16, F32, GGMLType, traits
from .codes import Op
from .params import Param
from .table import (
    COPY_SPECIAL,
    FLOATS,
    IGNORE,
    INT32_MAX,
    ONLY_F32,
    REDUCE_SPECIAL,
    Out,
    Src,
    _fail,
    define,
    ex,
    f32,
    spec,
)


class PoolOp(enum.IntEnum):
    """ggml_op_pool (op param ``op`` of POOL_1D / POOL_2D / POOL_2D_BACK)."""

    MAX = 0
    AVG = 1


class ScaleMode(enum.IntEnum):
    """ggml_scale_mode (low byte of UPSCALE's op_params[0])."""

    NEAREST = 0
    BILINEAR = 1


F32_F16 = frozenset({F32, F16})
_BIG = INT32_MAX


def _tdiv(a: int, b: int) -> int:
    """C integer division (truncates toward zero), as ggml's int64 arithmetic."""
    q = abs(a) // b
    return q if a >= 0 else -q


def conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """ggml_calc_conv_output_size: (ins + 2p - d(ks - 1) - 1) / s + 1, C division."""
    return _tdiv(ins + 2 * p - d * (ks - 1) - 1, s) + 1


def pool_output_size(ins: int, ks: int, s: int, p: int) -> int:
    """ggml_calc_pool_output_size: (ins + 2p - ks) / s + 1 (in float, truncated)."""
    num = ins + 2 * p - ks
    return num // s + 1 if num >= 0 else 0


# ------------------------------------------------------------------ im2col
_IM2COL_PARAMS = (
    Param("s0", int, 1, min=1, max=_BIG, doc="stride along dim 0"),
    Param("s1", int, 1, min=0, max=_BIG, doc="stride along dim 1 (2D only)"),
    Param("p0", int, 0, min=0, max=_BIG, doc="zero padding on both sides of dim 0"),
    Param("p1", int, 0, min=0, max=_BIG, doc="zero padding on both sides of dim 1 (2D only; 0 in 1D)"),
    Param("d0", int, 1, min=1, max=_BIG, doc="dilation along dim 0"),
    Param("d1", int, 1, min=0, max=_BIG, doc="dilation along dim 1 (2D only)"),
    Param("is_2D", bool, True, doc="2D: kernel [KW, KH, IC, OC], input [W, H, IC, N]; "
                                   "1D: kernel [K, IC, OC], input [L, IC, N]"),
)
_CONV_PARAM_KEYS = ("s0", "s1", "p0", "p1", "d0", "d1")


def _out_size(d, what: str, ins: int, ks: int, s: int, p: int, dil: int) -> int:
    if ks < 1:
        _fail(d, f"the kernel has {ks} taps along {what}; it needs at least 1")
    if ins < 1:  # C's truncating division would still give an output of 1 for a large stride
        _fail(d, f"the input is empty along {what}: there is nothing to convolve")
    o = conv_output_size(ins, ks, s, p, dil)
    if o < 1:
        _fail(d, f"output size along {what} is {o} < 1: input {ins} (+ 2*padding {p}) is too small for "
                 f"kernel {ks} with dilation {dil}, stride {s}")
    return o


def im2col_ne(d, kne, bne, p) -> tuple[int, int, int, int]:
    """Extents of im2col(kernel of extents ``kne``, input of extents ``bne``), checked."""
    if p["is_2D"]:
        if p["s1"] < 1 or p["d1"] < 1:
            _fail(d, f"2D: s1={p['s1']} and d1={p['d1']} must be >= 1", InvalidArgument)
        if kne[2] != bne[2]:
            _fail(d, f"kernel channels a.ne[2]={kne[2]} differ from input channels b.ne[2]={bne[2]}")
        oh = _out_size(d, "dim 1", bne[1], kne[1], p["s1"], p["p1"], p["d1"])
        ow = _out_size(d, "dim 0", bne[0], kne[0], p["s0"], p["p0"], p["d0"])
        return (kne[2] * kne[1] * kne[0], ow, oh, bne[3])
    if p["p1"] != 0:
        _fail(d, f"1D (is_2D=False): p1={p['p1']} must be 0, there is no dim 1 to pad", InvalidArgument)
    if kne[1] != bne[1]:
        _fail(d, f"1D: kernel channels a.ne[1]={kne[1]} differ from input channels b.ne[1]={bne[1]}")
    if bne[3] != 1:
        _fail(d, f"1D: the input must be [L, IC, N] (ne[3] = 1), has ne={list(bne)}")
    ow = _out_size(d, "dim 0", bne[0], kne[0], p["s0"], p["p0"], p["d0"])
    return (kne[1] * kne[0], ow, bne[2], 1)


def _im2col_rule(d, s, p):
    t = p["dst_type"]
    if t not in (F32, F16):
        _fail(d, f"dst_type must be f32 or f16, got {traits(t).name}", TypeMismatch)
    return Out(t, im2col_ne(d, s["a"].ne, s["b"].ne, p))


def _im2col_back_rule(d, s, p):
    g, k, ne = s["grad"], s["kernel"], p["ne"]
    if any(x < 1 for x in ne):
        _fail(d, f"input extents ne={list(ne)} must all be >= 1", InvalidArgument)
    want = im2col_ne(d, k.ne, ne, p)
    if g.ne != want:
        _fail(d, f"grad has ne={list(g.ne)} but im2col of an input ne={list(ne)} with this kernel "
                 f"(ne={list(k.ne)}) and these params has ne={list(want)}")
    return Out(F32, tuple(ne))


def _im2col_grad(B, n, g):
    p = {k: n.params[k] for k in (*_CONV_PARAM_KEYS, "is_2D")}
    return B.im2col_back(g, n.src[0], n.src[1].ne, **p)


define("IM2COL", Op.IM2COL, (Src("a", FLOATS), Src("b", FLOATS)), _im2col_rule,
       "patches of b for a convolution with kernel a (shape only): 2D -> [IC*KH*KW, OW, OH, N], "
       "1D -> [IC*K, OL, N, 1]; column index ic*KH*KW + kh*KW + kw; taps outside b read 0",
       params=_IM2COL_PARAMS + (Param("dst_type", GGMLType, F32, doc="result type, f32 or f16"),),
       grad={"a": IGNORE, "b": _im2col_grad})  # the kernel a only supplies its shape
spec("IM2COL", "dst_type (F32 or F16); 2D: [IC*KH*KW, OW, OH, N] for kernel a [KW, KH, IC, OC] and b "
     "[W, H, IC, N]; 1D: [IC*K, OL, N, 1] for a [K, IC, OC] and b [L, IC, N]; "
     "O = (in + 2p - d(k - 1) - 1) / s + 1", COPY_SPECIAL,
     ex((1.0, 2.0, 2.0, 3.0), a=f32((2,), 0, 0), b=f32((3,), 1, 2, 3), is_2D=False,
        note="1D, kernel of 2 taps: the two windows [1, 2] and [2, 3]"),
     "2D: out[ic*KH*KW + kh*KW + kw, ow, oh, n] = b[ow*s0 + kw*d0 - p0, oh*s1 + kh*d1 - p1, ic, n], 0 outside b; "
     "1D the same without the kh / oh dims. The kernel's values are not read")
define("IM2COL_BACK", Op.IM2COL_BACK, (Src("grad", FLOATS), Src("kernel", FLOATS)), _im2col_back_rule,
       "adjoint of IM2COL: F32 of the input extents ne, each input element the sum of the grad columns "
       "that read it", params=_IM2COL_PARAMS[:6] + (Param("ne", tuple, length=4, doc="input extents"),
                                                     _IM2COL_PARAMS[6]),
       nograd="backward ops are not differentiated (as in ggml)")
spec("IM2COL_BACK", "F32 of extents ne (the input's); grad of IM2COL's result shape for that input and kernel",
     REDUCE_SPECIAL, ex((1.0, 2.0, 1.0), grad=f32((2, 2), 1, 1, 1, 1), kernel=f32((2,), 0, 0), ne=(3, 1, 1, 1),
                        is_2D=False, note="the middle element is read by both windows"),
     "out[x] = sum of grad[column, position] over every (column, position) whose IM2COL tap reads input element x")


# ------------------------------------------------------------------ convolutions
def _conv_transpose_1d_rule(d, s, p):
    a, b = s["a"], s["b"]
    if p["p0"] != 0:
        _fail(d, f"p0={p['p0']}: only p0 = 0 is supported (as in ggml)", InvalidArgument)
    if p["d0"] != 1:
        _fail(d, f"d0={p['d0']}: only d0 = 1 is supported (as in ggml)", InvalidArgument)
    if b.ne[2] != 1 or b.ne[3] != 1:
        _fail(d, f"b must be a matrix [L, IC], has ne={list(b.ne)}")
    if a.ne[3] != 1:
        _fail(d, f"a must be [K, OC, IC] (ne[3] = 1), has ne={list(a.ne)}")
    if a.ne[2] != b.ne[1]:
        _fail(d, f"input channels differ: a.ne[2]={a.ne[2]}, b.ne[1]={b.ne[1]}")
    if a.ne[0] < 1 or b.ne[0] < 1:
        _fail(d, f"kernel (ne0={a.ne[0]}) and input (ne0={b.ne[0]}) must be non-empty")
    return Out(F32, ((b.ne[0] - 1) * p["s0"] + a.ne[0], a.ne[1], b.ne[2], 1))


def _conv_2d_rule(d, s, p):
    a, b = s["a"], s["b"]
    if a.ne[2] != b.ne[2]:
        _fail(d, f"kernel channels a.ne[2]={a.ne[2]} differ from input channels b.ne[2]={b.ne[2]}")
    ow = _out_size(d, "dim 0", b.ne[0], a.ne[0], p["s0"], p["p0"], p["d0"])
    oh = _out_size(d, "dim 1", b.ne[1], a.ne[1], p["s1"], p["p1"], p["d1"])
    return Out(b.type, (ow, oh, a.ne[3], b.ne[3]))


define("CONV_TRANSPOSE_1D", Op.CONV_TRANSPOSE_1D, (Src("a", FLOATS), Src("b", FLOATS)), _conv_transpose_1d_rule,
       "a [K, OC, IC], b [L, IC] -> F32 [(L-1)*s0 + K, OC]: out[l*s0 + k, oc] += sum_ic a[k, oc, ic] b[l, ic]",
       params=(Param("s0", int, 1, min=1, max=_BIG), Param("p0", int, 0, min=0, max=_BIG, doc="must be 0"),
               Param("d0", int, 1, min=1, max=_BIG, doc="must be 1")),
       nograd="derivative rule not written (ggml has none)")
spec("CONV_TRANSPOSE_1D", "F32 [(L - 1) * s0 + K, OC] for a [K, OC, IC], b [L, IC]; p0 = 0, d0 = 1", REDUCE_SPECIAL,
     ex((3.0, 10.0, 8.0), a=f32((2,), 1, 2), b=f32((2,), 3, 4)),
     "out[l*s0 + k, oc] = sum over (l, k) landing there and ic of a[k, oc, ic] * b[l, ic]")
define("CONV_2D", Op.CONV_2D, (Src("a", FLOATS), Src("b", F32_F16)), _conv_2d_rule,
       "direct 2D convolution: a [KW, KH, IC, OC], b [W, H, IC, N] -> b's type [OW, OH, OC, N], "
       "out = sum_{ic,kh,kw} a[kw,kh,ic,oc] b[ow*s0 + kw*d0 - p0, oh*s1 + kh*d1 - p1, ic, n] (outside b: 0)",
       params=tuple(Param(k, int, 1 if k[0] in "sd" else 0, min=1 if k[0] in "sd" else 0, max=_BIG)
                    for k in _CONV_PARAM_KEYS),
       nmse=5e-4, nograd="derivative rule not written (ggml has none)")
spec("CONV_2D", "b's type, [OW, OH, OC, N] for a [KW, KH, IC, OC], b [W, H, IC, N]; "
     "O = (in + 2p - d(k - 1) - 1) / s + 1 >= 1", REDUCE_SPECIAL,
     ex((-3.0, -5.0), a=f32((2,), 1, -1), b=f32((3,), 1, 4, 9)),
     "out[ow, oh, oc, n] = sum_{ic, kh, kw} a[kw, kh, ic, oc] * b[ow*s0 + kw*d0 - p0, oh*s1 + kh*d1 - p1, ic, n] "
     "(0 outside b); a F16 kernel is converted exactly")


# ------------------------------------------------------------------ pooling
def _pool_size(d, what: str, ins: int, k: int, s: int, p: int) -> int:
    if p > ins:  # decided here for every backend: it bounds the window (k <= ins + 2p) by the input
        _fail(d, f"padding {p} along {what} is larger than the input's {ins} elements", InvalidArgument)
    o = pool_output_size(ins, k, s, p)
    if o < 1:
        _fail(d, f"output size along {what} is {o} < 1: input {ins} + 2*padding {p} is smaller than "
                 f"the window {k}")
    return o


def _pool_1d_rule(d, s, p):
    a = s["a"]
    if p["p0"] >= p["k0"]:
        _fail(d, f"p0={p['p0']} must be less than k0={p['k0']}: every window must cover an input element",
              InvalidArgument)
    return Out(F32, (_pool_size(d, "dim 0", a.ne[0], p["k0"], p["s0"], p["p0"]), *a.ne[1:]))


def pool_2d_ne(d, ne, p) -> tuple[int, int, int, int]:
    return (_pool_size(d, "dim 0", ne[0], p["k0"], p["s0"], p["p0"]),
            _pool_size(d, "dim 1", ne[1], p["k1"], p["s1"], p["p1"]), ne[2], ne[3])


def _pool_2d_rule(d, s, p):
    return Out(F32, pool_2d_ne(d, s["a"].ne, p))


def _pool_2d_back_rule(d, s, p):
    g, af = s["grad"], s["af"]
    want = pool_2d_ne(d, af.ne, p)
    if g.ne != want:
        _fail(d, f"grad has ne={list(g.ne)} but pool_2d of af (ne={list(af.ne)}) gives ne={list(want)}")
    return Out(F32, af.ne)


_POOL_KEYS = ("op", "k0", "k1", "s0", "s1", "p0", "p1")
_POOL_2D_PARAMS = (Param("op", PoolOp, doc="MAX or AVG"),
                   Param("k0", int, min=1, max=_BIG), Param("k1", int, min=1, max=_BIG),
                   Param("s0", int, min=1, max=_BIG), Param("s1", int, min=1, max=_BIG),
                   Param("p0", int, 0, min=0, max=_BIG), Param("p1", int, 0, min=0, max=_BIG))

define("POOL_1D", Op.POOL_1D, (Src("a", F32_F16),), _pool_1d_rule,
       "F32 pooling along dim 0 over windows of k0 taps, stride s0, padding p0 (< k0): MAX or the AVG "
       "of the taps inside a (ggml HEAD); out size (ne0 + 2p0 - k0)/s0 + 1",
       params=(Param("op", PoolOp, doc="MAX or AVG"), Param("k0", int, min=1, max=_BIG),
               Param("s0", int, min=1, max=_BIG), Param("p0", int, 0, min=0, max=_BIG)),
       nograd="derivative rule not written (ggml has none)")
spec("POOL_1D", "F32 [(ne0 + 2 p0 - k0) / s0 + 1, ne1, ne2, ne3]; p0 < k0",
     "MAX: as POOL_2D (res = v < res ? res : v from -FLT_MAX over the taps inside a); AVG: IEEE",
     ex((3.0, 5.0), a=f32((4,), 1, 3, 2, 5), op="MAX", k0=2, s0=2),
     "window o covers taps i = o*s0 - p0 .. o*s0 - p0 + k0 - 1; taps outside a are ignored; MAX: their maximum; "
     "AVG: their sum / the number of taps inside a")
define("POOL_2D", Op.POOL_2D, (Src("a", F32_F16),), _pool_2d_rule,
       "F32 pooling over dims 0, 1 with windows k0 x k1, strides s0, s1, padding p0, p1: MAX of the taps "
       "inside a (-FLT_MAX if none), or AVG = their sum / (k0*k1) (padding counts)",
       params=_POOL_2D_PARAMS,
       grad={"a": lambda B, n, g: B.pool_2d_back(g, n.src[0], **{k: n.params[k] for k in _POOL_KEYS})})
spec("POOL_2D", "F32 [(ne0 + 2 p0 - k0) / s0 + 1, (ne1 + 2 p1 - k1) / s1 + 1, ne2, ne3]",
     "MAX: res = v < res ? res : v from -FLT_MAX, padding skipped: a NaN tap makes res NaN and the next tap "
     "replaces it (v < NaN is false), so NaN survives only as a window's last tap; AVG: IEEE",
     ex((2.5,), a=f32((2, 2), 1, 2, 3, 4), op="AVG", k0=2, k1=2, s0=2, s1=2),
     "window (o0, o1) covers taps (o0*s0 - p0 + i, o1*s1 - p1 + j), i < k0, j < k1; MAX: the maximum of the taps "
     "inside a (-FLT_MAX if none); AVG: the sum of the taps inside a divided by k0*k1 (padding counts)")
define("POOL_2D_BACK", Op.POOL_2D_BACK, (Src("grad", F32_F16), Src("af", F32_F16)), _pool_2d_back_rule,
       "adjoint of POOL_2D: F32 of af's extents; MAX sends each grad to the first maximal tap of its window, "
       "AVG spreads grad / (k0*k1) over the taps inside af",
       params=_POOL_2D_PARAMS, nograd="backward ops are not differentiated (as in ggml)")
spec("POOL_2D_BACK", "F32 of af's shape; grad of POOL_2D's result shape for af", REDUCE_SPECIAL,
     ex((0.0, 0.0, 0.0, 4.0), grad=f32((1,), 4.0), af=f32((2, 2), 1, 2, 3, 4), op="MAX", k0=2, k1=2, s0=2, s1=2),
     "MAX: each grad element is added to the first maximal tap of its window (in row-major tap order); AVG: "
     "grad / (k0*k1) is added to every tap of its window inside af")


# ------------------------------------------------------------------ upscale
def _upscale_rule(d, s, p):
    a, ne = s["a"], p["ne"]
    if any(x < 1 for x in ne):
        _fail(d, f"target extents ne={list(ne)} must all be >= 1", InvalidArgument)
    if any(x < 1 for x in a.ne):
        _fail(d, f"a must be non-empty, has ne={list(a.ne)}", ShapeMismatch)
    if p["align_corners"] and p["mode"] != ScaleMode.BILINEAR:
        _fail(d, "align_corners applies to BILINEAR only", InvalidArgument)
    return Out(F32, tuple(ne))


define("UPSCALE", Op.UPSCALE, (Src("a", ONLY_F32),), _upscale_rule,
       "a resized to ne (sf_i = ne_i / a.ne_i in f32): NEAREST reads a[floor(i / sf_i)] per dim; BILINEAR "
       "interpolates dims 0, 1 at (i + 0.5) / sf - 0.5 (edges clamped; offset 0 and sf = (ne-1)/(a.ne-1) "
       "with align_corners), nearest along dims 2, 3",
       params=(Param("ne", tuple, length=4, doc="result extents"), Param("mode", ScaleMode, ScaleMode.NEAREST),
               Param("align_corners", bool, False, doc="GGML_SCALE_FLAG_ALIGN_CORNERS (BILINEAR only)")),
       nograd="derivative rule not written (ggml has none)")
spec("UPSCALE", "F32 of extents ne (every extent >= 1; a non-empty)", COPY_SPECIAL + " (NEAREST); BILINEAR: IEEE",
     ex((1.0, 1.0, 2.0, 2.0), a=f32((2,), 1, 2), ne=(4, 1, 1, 1)),
     "sf_i = ne_i / a.ne_i (float32). NEAREST: out[i] = a[floor(i_k / sf_k) per dim]. BILINEAR (dims 0, 1; "
     "nearest along 2, 3): source coordinate x = (i + 0.5) / sf - 0.5, clamped at the edges, weights from the two "
     "neighbours; align_corners: x = i * (a.ne - 1) / (ne - 1)")
