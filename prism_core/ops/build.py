"""Graph-building functions (ggml's ``ggml_add``, ``ggml_mul_mat``, ...).

Every builder goes through :func:`node`, which reads the op table: it checks the
sources and parameters, applies the op's shape/type rule and only then creates the
result, so a refused call leaves the context untouched. Shapes are ggml order
(``ne[0]`` innermost) unless a docstring says NumPy order.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from ..context import Context
from ..errors import BoundExceeded, InvalidArgument
from ..tensor import MAX_SRC, Tensor, overlaps_itself
from ..types import traits
from .codes import GluOp, Op, SortOrder, UnaryOp
from .params import check_params
from .table import OPS, OpDef, Out, ViewOut, infer, opdef


def node(key: str | Op | UnaryOp | GluOp, *srcs: Tensor | None, inplace: bool = False,
         ctx: Context | None = None, **params: Any) -> Tensor:
    """Build a node of op ``key`` on ``srcs`` (in the table's source order).

    With ``inplace=True`` the result is a view of the first source (ggml's ``*_inplace``).
    The result is created in the sources' context; an op without source tensors
    (ARANGE) takes that context as ``ctx=``. When both are given they must agree.
    """
    d = opdef(key)
    if len(srcs) > len(d.srcs) or len(srcs) > MAX_SRC:
        raise InvalidArgument(f"{d.key}: takes at most {len(d.srcs)} sources, got {len(srcs)}")
    if ctx is not None and not isinstance(ctx, Context):
        raise InvalidArgument(f"{d.key}: ctx must be a Context, got {type(ctx).__name__}")
    named: dict[str, Tensor | None] = {}
    for spec, t in zip(d.srcs, srcs):
        if t is not None and not isinstance(t, Tensor):
            raise InvalidArgument(f"{d.key}: source {spec.name!r} must be a Tensor, got {type(t).__name__}")
        if t is not None:
            if ctx is None:
                ctx = t.ctx
            elif t.ctx is not ctx:
                raise InvalidArgument(f"{d.key}: source {spec.name!r} belongs to another context")
        named[spec.name] = t
    if ctx is None:
        if not d.srcs:
            raise InvalidArgument(f"{d.key}: has no source tensors; pass the context as ctx=")
        raise InvalidArgument(f"{d.key}: needs at least one source tensor")
    if not isinstance(inplace, (bool, np.bool_)):
        raise InvalidArgument(f"{d.key}: inplace must be a bool, got {inplace!r}")
    if inplace and not d.inplace:
        raise InvalidArgument(f"{d.key}: has no in-place variant")
    for k in d.fixed:
        if k in params:
            raise InvalidArgument(f"{d.key}: parameter {k!r} is fixed by the op")
    checked = check_params(d.key, d.params, params)
    out = infer(d, named, checked)
    checked.update(d.fixed)
    if d.sub is not None:
        checked["unary_op" if d.op == Op.UNARY else "glu_op"] = d.sub

    if inplace:
        a = srcs[0]
        assert isinstance(out, Out) and out.ne == a.ne and out.type == a.type, d.key
        out = ViewOut(a, a.type, a.ne, a.nb)
    if isinstance(out, ViewOut) and not d.view_only and overlaps_itself(out.type, out.ne, out.nb):
        # several result elements in one place (a stride-0 view): which write lands last is each
        # backend's own loop order, so the op table refuses it for every op that writes into memory
        raise InvalidArgument(f"{d.key}: the result is written into {out.of.label} with strides "
                              f"{list(out.nb)} for ne={list(out.ne)}, whose elements overlap in memory; "
                              "write into a contiguous tensor (cont) instead")
    if isinstance(out, ViewOut) and not d.view_only:  # the result's memory is out.of's: it writes there
        out.of.check_writable(f"{d.key}{' (in place)' if inplace else ''}")
    try:
        if isinstance(out, ViewOut):
            result = ctx.new_view(out.of, out.type, out.ne, out.nb, out.offset)
        else:
            result = ctx.new_tensor(out.type, out.ne)
    except BoundExceeded as e:  # name the op whose result does not fit
        raise BoundExceeded(f"{d.key}: {e}") from None
    result.op = d.op
    result.opdef = d
    result.params = MappingProxyType(checked)
    result.src = tuple(srcs)
    return result


def _tensor_arg(who: str, name: str, x: Any) -> Tensor:
    """``x`` when it is a Tensor: for builders that read a source's metadata before :func:`node`."""
    if not isinstance(x, Tensor):
        raise InvalidArgument(f"{who}: {name} must be a Tensor, got {type(x).__name__}")
    return x


def _int_arg(who: str, name: str, x: Any) -> int:
    """``x`` when it is an int: for builders that compute with an argument before :func:`node`."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise InvalidArgument(f"{who}: {name} must be an int, got {x!r}")
    return int(x)


def _n(key: str, *srcs: Tensor | None, inplace: bool = False, **params: Any) -> Tensor:
    return node(key, *srcs, inplace=inplace, **params)


# ------------------------------------------------------------------ elementwise
def dup(a: Tensor) -> Tensor: return _n("DUP", a)
def dup_inplace(a: Tensor) -> Tensor: return _n("DUP", a, inplace=True)
def add(a: Tensor, b: Tensor) -> Tensor:
    """a + b; b broadcasts into a (each of a's extents a multiple of b's)."""
    return _n("ADD", a, b)
def add_inplace(a: Tensor, b: Tensor) -> Tensor: return _n("ADD", a, b, inplace=True)
def sub(a: Tensor, b: Tensor) -> Tensor: return _n("SUB", a, b)
def sub_inplace(a: Tensor, b: Tensor) -> Tensor: return _n("SUB", a, b, inplace=True)
def mul(a: Tensor, b: Tensor) -> Tensor: return _n("MUL", a, b)
def mul_inplace(a: Tensor, b: Tensor) -> Tensor: return _n("MUL", a, b, inplace=True)
def div(a: Tensor, b: Tensor) -> Tensor: return _n("DIV", a, b)
def div_inplace(a: Tensor, b: Tensor) -> Tensor: return _n("DIV", a, b, inplace=True)
def add1(a: Tensor, b: Tensor) -> Tensor: return _n("ADD1", a, b)
def add1_inplace(a: Tensor, b: Tensor) -> Tensor: return _n("ADD1", a, b, inplace=True)
def sqr(a: Tensor) -> Tensor: return _n("SQR", a)
def sqr_inplace(a: Tensor) -> Tensor: return _n("SQR", a, inplace=True)
def sqrt(a: Tensor) -> Tensor: return _n("SQRT", a)
def sqrt_inplace(a: Tensor) -> Tensor: return _n("SQRT", a, inplace=True)
def log(a: Tensor) -> Tensor: return _n("LOG", a)
def log_inplace(a: Tensor) -> Tensor: return _n("LOG", a, inplace=True)
def sin(a: Tensor) -> Tensor: return _n("SIN", a)
def sin_inplace(a: Tensor) -> Tensor: return _n("SIN", a, inplace=True)
def cos(a: Tensor) -> Tensor: return _n("COS", a)
def cos_inplace(a: Tensor) -> Tensor: return _n("COS", a, inplace=True)
def scale(a: Tensor, s: float) -> Tensor: return _n("SCALE", a, s=s)
def scale_inplace(a: Tensor, s: float) -> Tensor: return _n("SCALE", a, s=s, inplace=True)
def scale_bias(a: Tensor, s: float, b: float) -> Tensor: return _n("SCALE", a, s=s, b=b)
def clamp(a: Tensor, min: float, max: float) -> Tensor:
    """min(max(x, min), max). Unlike ggml, not in place: use clamp_inplace for that."""
    return _n("CLAMP", a, min=min, max=max)
def clamp_inplace(a: Tensor, min: float, max: float) -> Tensor:
    return _n("CLAMP", a, min=min, max=max, inplace=True)
def leaky_relu(a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    return _n("LEAKY_RELU", a, negative_slope=negative_slope, inplace=inplace)
def silu_back(grad: Tensor, x: Tensor) -> Tensor: return _n("SILU_BACK", grad, x)


def unary(a: Tensor, op: UnaryOp | str, inplace: bool = False, **params: Any) -> Tensor:
    """Apply unary sub-op ``op`` (a UnaryOp or its name) elementwise."""
    key = op.name if isinstance(op, UnaryOp) else str(op).upper()
    if key not in UnaryOp.__members__:
        raise InvalidArgument(f"unknown unary op {op!r}; known: {', '.join(UnaryOp.__members__)}")
    return _n(key, a, inplace=inplace, **params)


def _unary_builder(u: UnaryOp, inplace: bool):
    def f(a: Tensor) -> Tensor:
        return _n(u.name, a, inplace=inplace)
    f.__name__ = u.name.lower() + ("_inplace" if inplace else "")
    f.__doc__ = f"UNARY {u.name}: {OPS[u.name].doc}" + (" (in place: the result aliases a)" if inplace else "")
    return f


for _u in UnaryOp:
    if _u is not UnaryOp.XIELU:
        for _ip in (False, True):
            _f = _unary_builder(_u, _ip)
            globals()[_f.__name__] = _f


def xielu(a: Tensor, alpha_n: float = 0.8, alpha_p: float = 0.8, beta: float = 0.5, eps: float = -1e-6) -> Tensor:
    return _n("XIELU", a, alpha_n=alpha_n, alpha_p=alpha_p, beta=beta, eps=eps)


# ------------------------------------------------------------------ regions
def acc(a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool = False) -> Tensor:
    """Copy of a with b added into the region of a's memory with byte strides
    (nb1, nb2, nb3) starting at byte ``offset``."""
    return _n("ACC", a, b, nb1=nb1, nb2=nb2, nb3=nb3, offset=offset, inplace=inplace)


def set(a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool = False) -> Tensor:
    """Copy of a with b written into the region (byte strides nb1..nb3, byte offset)."""
    return _n("SET", a, b, nb1=nb1, nb2=nb2, nb3=nb3, offset=offset, inplace=inplace)


def set_1d(a: Tensor, b: Tensor, offset: int, inplace: bool = False) -> Tensor:
    a = _tensor_arg("SET", "a", a)
    return set(a, b, a.nb[1], a.nb[2], a.nb[3], offset, inplace)


def set_2d(a: Tensor, b: Tensor, nb1: int, offset: int, inplace: bool = False) -> Tensor:
    a = _tensor_arg("SET", "a", a)
    return set(a, b, nb1, a.nb[2], a.nb[3], offset, inplace)


# ------------------------------------------------------------------ reductions
def sum(a: Tensor) -> Tensor: return _n("SUM", a)
def sum_rows(a: Tensor) -> Tensor: return _n("SUM_ROWS", a)
def mean(a: Tensor) -> Tensor:
    """Mean over dim 0 (each row), not a global mean: result ne = [1, ne1, ne2, ne3]."""
    return _n("MEAN", a)
def argmax(a: Tensor) -> Tensor: return _n("ARGMAX", a)
def count_equal(a: Tensor, b: Tensor) -> Tensor: return _n("COUNT_EQUAL", a, b)
def repeat(a: Tensor, b: Tensor) -> Tensor: return _n("REPEAT", a, b)
def repeat_back(a: Tensor, b: Tensor) -> Tensor: return _n("REPEAT_BACK", a, b)
def concat(a: Tensor, b: Tensor, dim: int) -> Tensor:
    """a and b (same type) joined along ``dim`` (0..3, ggml order); all other extents must match."""
    return _n("CONCAT", a, b, dim=dim)


def argsort(a: Tensor, order: SortOrder | str | int = SortOrder.ASC) -> Tensor:
    """I32 tensor of a's shape: per row, the indices that sort the row ascending (``"ASC"``)
    or descending (``"DESC"``). ggml leaves the order of equal values unspecified; the
    reference sorts stably (equal values keep their index order)."""
    if isinstance(order, str):
        if order.upper() not in SortOrder.__members__:
            raise InvalidArgument(f"ARGSORT: unknown sort order {order!r}; known: {', '.join(SortOrder.__members__)}")
        order = SortOrder[order.upper()]
    return _n("ARGSORT", a, order=order)


def argsort_top_k(a: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest values of each row, largest first: a DESC argsort and a
    view of its first ``k`` columns (ggml_argsort_top_k). Needs 1 <= k <= a.ne[0]."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidArgument(f"argsort_top_k: k must be an int, got {k!r}")
    if not isinstance(a, Tensor):
        raise InvalidArgument(f"argsort_top_k: a must be a Tensor, got {type(a).__name__}")
    if not 1 <= k <= a.ne[0]:
        raise InvalidArgument(f"argsort_top_k: k={k} must be in [1, a.ne[0]={a.ne[0]}]")
    with a.ctx.transaction():
        s = argsort(a, SortOrder.DESC)
        return view_4d(s, int(k), s.ne[1], s.ne[2], s.ne[3], s.nb[1], s.nb[2], s.nb[3], 0)


# ------------------------------------------------------------------ normalisation
def norm(a: Tensor, eps: float = 0.0, inplace: bool = False) -> Tensor: return _n("NORM", a, eps=eps, inplace=inplace)
def rms_norm(a: Tensor, eps: float = 0.0, inplace: bool = False) -> Tensor:
    return _n("RMS_NORM", a, eps=eps, inplace=inplace)
def rms_norm_back(dz: Tensor, x: Tensor, eps: float = 0.0) -> Tensor: return _n("RMS_NORM_BACK", dz, x, eps=eps)
def group_norm(a: Tensor, n_groups: int, eps: float = 1e-6, inplace: bool = False) -> Tensor:
    """Normalise groups of ceil(ne2 / n_groups) consecutive channels (dim 2): mean and
    population variance over ne0 * ne1 * channels elements, separately for each i3."""
    return _n("GROUP_NORM", a, n_groups=n_groups, eps=eps, inplace=inplace)


def l2_norm(a: Tensor, eps: float = 0.0, inplace: bool = False) -> Tensor:
    """Each row divided by max(its Euclidean norm, eps)."""
    return _n("L2_NORM", a, eps=eps, inplace=inplace)


# ------------------------------------------------------------------ matrices
def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """ggml's matrix product: a [K, M, A2, A3], b [K, N, B2, B3] (ggml order) ->
    F32 [M, N, B2, B3] with out[m, n] = sum_k a[k, m] * b[k, n]. In NumPy order this is
    ``b @ a.T`` per batch; a's batch dims broadcast blockwise (B2 % A2 == 0)."""
    return _n("MUL_MAT", a, b)


def out_prod(a: Tensor, b: Tensor) -> Tensor:
    """a [I, T, ...], b [J, T, ...] -> F32 [I, J, ...], out[i, j] = sum_t a[i, t] * b[j, t]."""
    return _n("OUT_PROD", a, b)


# ------------------------------------------------------------------ copies and views
def cpy(a: Tensor, b: Tensor) -> Tensor:
    """Copy a's elements (row-major order) into b, converting types; the result is b's memory."""
    return _n("CPY", a, b)


def cast(a: Tensor, type: Any) -> Tensor:
    """A new tensor of ``type`` holding a's values (ggml_cast)."""
    from ..types import as_type
    a = _tensor_arg("cast", "a", a)
    with a.ctx.transaction():
        return cpy(a, a.ctx.new_tensor(as_type(type), a.ne))


def cont(a: Tensor, ne: Sequence[int] = ()) -> Tensor:
    """Contiguous copy of a, optionally with new extents ``ne`` (ggml order)."""
    return _n("CONT", a, ne=ne)


def cont_2d(a: Tensor, ne0: int, ne1: int) -> Tensor: return cont(a, (ne0, ne1))
def cont_3d(a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor: return cont(a, (ne0, ne1, ne2))
def cont_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor: return cont(a, (ne0, ne1, ne2, ne3))


def reshape(a: Tensor, ne: Sequence[int] | Tensor) -> Tensor:
    """View of contiguous a with extents ``ne`` (ggml order) or another tensor's extents."""
    return _n("RESHAPE", a, ne=ne.ne if isinstance(ne, Tensor) else ne)


def reshape_1d(a: Tensor, ne0: int) -> Tensor: return reshape(a, (ne0,))
def reshape_2d(a: Tensor, ne0: int, ne1: int) -> Tensor: return reshape(a, (ne0, ne1))
def reshape_3d(a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor: return reshape(a, (ne0, ne1, ne2))
def reshape_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor: return reshape(a, (ne0, ne1, ne2, ne3))


def view(a: Tensor, ne: Sequence[int], nb: Sequence[int], offset: int = 0) -> Tensor:
    """View of a's memory: extents ``ne`` (ggml order, 1-4 dims), byte strides
    ``nb`` = (nb1, nb2, nb3), byte ``offset`` from a's first element."""
    return _n("VIEW", a, ne=ne, nb=nb, offset=offset)


def view_1d(a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    ts = traits(_tensor_arg("VIEW", "a", a).type).type_size
    return view(a, (ne0,), (ts * _int_arg("VIEW", "ne0", ne0),) * 3, offset)


def view_2d(a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    nb1, ne1 = _int_arg("VIEW", "nb1", nb1), _int_arg("VIEW", "ne1", ne1)
    return view(a, (ne0, ne1), (nb1, nb1 * ne1, nb1 * ne1), offset)


def view_3d(a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int = 0) -> Tensor:
    nb2, ne2 = _int_arg("VIEW", "nb2", nb2), _int_arg("VIEW", "ne2", ne2)
    return view(a, (ne0, ne1, ne2), (nb1, nb2, nb2 * ne2), offset)


def view_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
            offset: int = 0) -> Tensor:
    return view(a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


def permute(a: Tensor, ax0: int, ax1: int, ax2: int, ax3: int) -> Tensor:
    """View in which source dim k moves to position ax_k (ggml's convention, the
    inverse of NumPy's ``transpose(axes)``)."""
    return _n("PERMUTE", a, axes=(ax0, ax1, ax2, ax3))


def transpose(a: Tensor) -> Tensor: return _n("TRANSPOSE", a)


# ------------------------------------------------------------------ indexing and masks
def get_rows(a: Tensor, b: Tensor) -> Tensor:
    """Rows of a picked by I32 indices b: out[:, i, j, k] = a[:, b[i, j, k], j, k]."""
    return _n("GET_ROWS", a, b)


def get_rows_back(a: Tensor, b: Tensor, c: Tensor) -> Tensor: return _n("GET_ROWS_BACK", a, b, c)
def diag_mask_inf(a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    return _n("DIAG_MASK_INF", a, n_past=n_past, inplace=inplace)
def diag_mask_zero(a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    return _n("DIAG_MASK_ZERO", a, n_past=n_past, inplace=inplace)
def diag(a: Tensor) -> Tensor:
    """a [n, 1, ne2, ne3] -> [n, n, ne2, ne3]: each row vector placed on a matrix's diagonal."""
    return _n("DIAG", a)


# ------------------------------------------------------------------ padding and generators
def pad_ext(a: Tensor, lp0: int, rp0: int, lp1: int = 0, rp1: int = 0, lp2: int = 0, rp2: int = 0,
            lp3: int = 0, rp3: int = 0, circular: bool = False) -> Tensor:
    """a with ``lp_i`` elements added before and ``rp_i`` after dim i: zeros, or with
    ``circular=True`` a's values wrapped around (out[i] = a[(i - lp) mod ne])."""
    return _n("PAD", a, lp0=lp0, rp0=rp0, lp1=lp1, rp1=rp1, lp2=lp2, rp2=rp2, lp3=lp3, rp3=rp3, circular=circular)


def pad(a: Tensor, p0: int, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """a with ``p_i`` zeros appended after dim i (ggml_pad)."""
    return pad_ext(a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_circular(a: Tensor, p0: int, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """a with ``p_i`` elements appended after dim i, taken from its start (wrapping around)."""
    return pad_ext(a, 0, p0, 0, p1, 0, p2, 0, p3, circular=True)


def pad_ext_circular(a: Tensor, lp0: int, rp0: int, lp1: int = 0, rp1: int = 0, lp2: int = 0, rp2: int = 0,
                     lp3: int = 0, rp3: int = 0) -> Tensor:
    return pad_ext(a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular=True)


def pad_reflect_1d(a: Tensor, p0: int, p1: int) -> Tensor:
    """Contiguous F32 a with each row mirrored: p0 elements before, p1 after, the edge
    element not repeated (each p must be less than ne0)."""
    return _n("PAD_REFLECT_1D", a, p0=p0, p1=p1)


def arange(ctx: Context, start: float, stop: float, step: float = 1.0) -> Tensor:
    """F32 vector start, start + step, ... below stop: ceil((stop - start) / step) elements,
    counted in float32 as ggml does. ggml's ranges increase: stop > start and step > 0."""
    if not isinstance(ctx, Context):
        raise InvalidArgument(f"ARANGE: ctx must be a Context, got {type(ctx).__name__}")
    return node("ARANGE", ctx=ctx, start=start, stop=stop, step=step)


def timestep_embedding(timesteps: Tensor, dim: int, max_period: int = 10000) -> Tensor:
    """Sinusoidal embedding of an F32 vector of N timesteps: F32 [dim, N] with
    cos(t * f_j) in column j and sin(t * f_j) in column j + dim // 2, where
    f_j = exp(-ln(max_period) * j / (dim // 2)); for odd ``dim`` the last column is 0."""
    return _n("TIMESTEP_EMBEDDING", timesteps, dim=dim, max_period=max_period)


# ------------------------------------------------------------------ softmax
def soft_max(a: Tensor, inplace: bool = False) -> Tensor: return _n("SOFT_MAX", a, inplace=inplace)


def soft_max_ext(a: Tensor, mask: Tensor | None = None, scale: float = 1.0, max_bias: float = 0.0,
                 sinks: Tensor | None = None, inplace: bool = False) -> Tensor:
    """Row softmax of a*scale + slope*mask; ``max_bias`` > 0 gives ALiBi slopes per head (dim 2)."""
    return _n("SOFT_MAX", a, mask, sinks, scale=scale, max_bias=max_bias, inplace=inplace)


def soft_max_ext_back(dy: Tensor, y: Tensor, scale: float = 1.0, max_bias: float = 0.0) -> Tensor:
    return _n("SOFT_MAX_BACK", dy, y, scale=scale, max_bias=max_bias)


# ------------------------------------------------------------------ loss and optimizers
def cross_entropy_loss(a: Tensor, b: Tensor) -> Tensor: return _n("CROSS_ENTROPY_LOSS", a, b)
def cross_entropy_loss_back(grad: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return _n("CROSS_ENTROPY_LOSS_BACK", grad, a, b)
def opt_step_adamw(a: Tensor, grad: Tensor, m: Tensor, v: Tensor, params: Tensor) -> Tensor:
    return _n("OPT_STEP_ADAMW", a, grad, m, v, params)
def opt_step_sgd(a: Tensor, grad: Tensor, params: Tensor) -> Tensor: return _n("OPT_STEP_SGD", a, grad, params)


# ------------------------------------------------------------------ gated linear units
def _glu_key(op: GluOp | str) -> str:
    key = op.name if isinstance(op, GluOp) else str(op).upper()
    if key not in GluOp.__members__:
        raise InvalidArgument(f"unknown GLU op {op!r}; known: {', '.join(GluOp.__members__)}")
    return key


def glu(a: Tensor, op: GluOp | str, swapped: bool = False, **params: Any) -> Tensor:
    """GLU sub-op ``op`` on the halves of each row of a: x = first half, g = second half
    (exchanged when ``swapped``); result ne0 = a.ne0 / 2, out = act(x) * g."""
    return _n(_glu_key(op), a, swapped=swapped, **params)


def glu_split(a: Tensor, b: Tensor, op: GluOp | str, **params: Any) -> Tensor:
    """GLU sub-op ``op`` with x = a and g = b (same shape and type): out = act(a) * b."""
    return _n(_glu_key(op), a, b, **params)


def _glu_builder(g: GluOp, form: str):
    doc = OPS[g.name].doc.split(";")[0]
    if form == "split":
        def f(a: Tensor, b: Tensor) -> Tensor:
            return _n(g.name, a, b)
        f.__doc__ = f"GLU {g.name} with x = a, g = b (same shape): {doc}"
    else:
        swapped = form == "swapped"

        def f(a: Tensor) -> Tensor:
            return _n(g.name, a, swapped=swapped)
        halves = "g = first half, x = second half" if swapped else "x = first half, g = second half"
        f.__doc__ = f"GLU {g.name} on each row of a ({halves}; result ne0 = a.ne0 / 2): {doc}"
    f.__name__ = g.name.lower() + ("" if form == "plain" else "_" + form)
    return f


for _g in GluOp:
    if _g is not GluOp.SWIGLU_OAI:
        for _form in ("plain", "swapped", "split"):
            _f = _glu_builder(_g, _form)
            globals()[_f.__name__] = _f


def swiglu_oai(a: Tensor, b: Tensor | None, alpha: float, limit: float) -> Tensor:
    """GLU SWIGLU_OAI (gpt-oss): x' = min(x, limit), g' = clamp(g, -limit, limit),
    out = x' * sigmoid(alpha * x') * (g' + 1), with x = a and g = b, or the halves
    of a's rows when b is None."""
    return _n("SWIGLU_OAI", a, b, alpha=alpha, limit=limit)


def builders_for(d: OpDef) -> list[str]:
    """Names of the public builders of op ``d`` (for docs)."""
    stem = d.key.lower()
    suffixes = ("", "_inplace", "_swapped", "_split", "_ext", "_circular", "_ext_circular", "_top_k")
    return [stem + x for x in suffixes if stem + x in globals()]


__all__ = [n for n, v in list(globals().items())
           if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == __name__
           and n not in ("builders_for",)]

from .build_attn import *  # noqa: E402,F403 - attention builders are part of the public API
from .build_attn import __all__ as _attn_all  # noqa: E402

__all__ += _attn_all

from .build_conv import *  # noqa: E402,F403 - convolution/pooling/upscale builders are part of the public API
from .build_conv import __all__ as _conv_all  # noqa: E402

__all__ += _conv_all
