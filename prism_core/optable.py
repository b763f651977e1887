"""The op table: every op Prism implements is declared here, once.

A declaration (:class:`OpDef`) holds the op's key (ggml's ``op_desc``: the op name,
or the sub-op name for UNARY and GLU), its sources with the types each accepts, its
parameter schema, its shape/type rule, whether an in-place variant exists, its
conformance error bound and a one-line formula. The builders (:mod:`prism_core.build`),
backends' default ``supports``, the conformance suite and ``prism ops`` all read it.

Shapes in rules are ggml order: ``ne[0]`` is the row length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import BoundExceeded, InvalidArgument, ShapeMismatch, TypeMismatch
from .ops import GluOp, Op, SortOrder, UnaryOp
from .params import Param
from .quant import OUT_OF_SCOPE, can_quantize
from .tensor import MAX_NE, Flag, Tensor, check_ne, contiguous_strides, nbytes_of, overlaps_itself
from .types import BF16, F16, F32, I32, I64, PLAIN_TYPES, GGMLType, traits

FLOATS = frozenset({F32, F16, BF16})
ONLY_F32 = frozenset({F32})
ANY_PLAIN = PLAIN_TYPES
# Block types: those Prism decodes (NVFP4's values can be read, but no op takes it yet), those it
# also encodes (ggml's reference quantizer), and the weight types of ggml's quantized dot products
# (Q8_1 and Q8_K only ever hold activations there).
QUANTIZED = frozenset(t for t in GGMLType if traits(t).is_quantized and traits(t).usable and t not in OUT_OF_SCOPE)
QUANT_WRITABLE = frozenset(t for t in QUANTIZED if can_quantize(t))
QUANT_WEIGHTS = QUANTIZED - {GGMLType.Q8_1, GGMLType.Q8_K}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Src:
    name: str
    types: frozenset[GGMLType]
    optional: bool = False


@dataclass(frozen=True)
class Out:
    """Result metadata of an op that writes a new, contiguous tensor."""

    type: GGMLType
    ne: tuple[int, int, int, int]


@dataclass(frozen=True)
class ViewOut:
    """Result metadata of an op whose result shares ``of``'s memory."""

    of: Tensor
    type: GGMLType
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    offset: int = 0


Rule = Callable[["OpDef", Mapping[str, Tensor | None], Mapping[str, Any]], "Out | ViewOut"]


@dataclass(frozen=True)
class OpDef:
    key: str
    op: Op
    srcs: tuple[Src, ...]
    params: tuple[Param, ...]
    rule: Rule
    doc: str
    inplace: bool = False  # an ``<name>_inplace`` builder exists; its result aliases src 0
    sub: UnaryOp | GluOp | None = None
    view_only: bool = False  # result is a view and nothing is computed (RESHAPE, VIEW, ...)
    nmse: float = 1e-7  # conformance bound on the normalised mean squared error
    family: str = ""  # groups ops whose conformance cases share a generator
    fixed: Mapping[str, Any] = field(default_factory=dict)  # params implied by the key (sub-op)
    # Derivative rules: source name -> rule(B, node, g) giving that source's gradient
    # contribution (B = prism_core.build), or IGNORE for sources that only supply
    # indices/shapes and never receive a gradient. A source missing here cannot be
    # differentiated: asking for its gradient raises Unsupported with ``nograd``.
    grad: Mapping[str, Any] = field(default_factory=dict)
    nograd: str = ""

    @property
    def differentiable(self) -> bool:
        return any(r is not IGNORE for r in self.grad.values())

    @property
    def n_required(self) -> int:
        return sum(not s.optional for s in self.srcs)


def describe_types(types: frozenset[GGMLType]) -> str:
    """Type names for docs and ``prism ops``: plain types listed, block types named by group."""
    plain = sorted(traits(t).name for t in types if not traits(t).is_quantized)
    blocks = frozenset(t for t in types if traits(t).is_quantized)
    group = {QUANTIZED: "every block type", QUANT_WRITABLE: "block types with a quantizer",
             QUANT_WEIGHTS: "block weight types"}.get(blocks)
    if blocks and group is None:
        group = " ".join(sorted(traits(t).name for t in blocks))
    return " ".join(plain) + (f" + {group}" if blocks else "")


OPS: dict[str, OpDef] = {}
IGNORE = "ignore"  # a source used only for its indices or shape: it gets no gradient


def define(key: str, op: Op, srcs: tuple[Src, ...], rule: Rule, doc: str, *,
           params: tuple[Param, ...] = (), **kw: Any) -> OpDef:
    assert key not in OPS, f"op {key} declared twice"
    d = OpDef(key, op, srcs, params, rule, doc, **kw)
    OPS[key] = d
    return d


def opdef(key: str | Op | UnaryOp | GluOp) -> OpDef:
    """Look an op up by key (``"ADD"``, ``"ABS"``...) or enum member."""
    name = key.name if isinstance(key, (Op, UnaryOp, GluOp)) else str(key).upper()
    try:
        return OPS[name]
    except KeyError:
        raise InvalidArgument(f"unknown op {key!r}; the op table has: {', '.join(OPS)}") from None


# ------------------------------------------------------------------ rule helpers

def _fail(d: OpDef, msg: str, cls: type[Exception] = ShapeMismatch) -> None:
    raise cls(f"{d.key}: {msg}")


def can_repeat(small: Tensor, big: Tensor) -> bool:
    """ggml_can_repeat: every extent of ``big`` is a multiple of ``small``'s."""
    if small.nelements == 0:
        return big.nelements == 0
    return all(b % s == 0 for s, b in zip(small.ne, big.ne))


def divides(d: int, x: int) -> bool:
    """``x % d == 0``, with an extent of 0 dividing only 0 (no ZeroDivisionError)."""
    return x % d == 0 if d else x == 0


def same_as(name: str = "a") -> Rule:
    def rule(d, s, p):
        return Out(s[name].type, s[name].ne)
    return rule


def _same_shape(d: OpDef, s: Mapping[str, Tensor | None], *names: str) -> None:
    first = s[names[0]]
    for n in names[1:]:
        if s[n].ne != first.ne:
            _fail(d, f"{names[0]} has ne={list(first.ne)} but {n} has ne={list(s[n].ne)}; they must be equal")


def _rows(a: Tensor) -> tuple[int, int, int, int]:
    return (1, a.ne[1], a.ne[2], a.ne[3])


def _broadcast_rule(d, s, p):
    a, b = s["a"], s["b"]
    if not can_repeat(b, a):
        _fail(d, f"b (ne={list(b.ne)}) does not broadcast into a (ne={list(a.ne)}): "
                 "each of a's extents must be a multiple of b's")
    return Out(a.type, a.ne)


def _add_rule(d, s, p):
    """ggml's add_q_f32: a quantized a is dequantized, b (f32, same shape) added, the sum requantized."""
    if traits(s["a"].type).is_quantized:
        _quantized_needs_f32(d, s, "a", "b")
        _same_shape(d, s, "a", "b")
    return _broadcast_rule(d, s, p)


def _add1_rule(d, s, p):
    if s["b"].nelements != 1:
        _fail(d, f"b must hold one element, has ne={list(s['b'].ne)}")
    return Out(s["a"].type, s["a"].ne)


_REGION_KEYS = ("nb1", "nb2", "nb3", "offset")
_REGION = (Param("nb1", int, min=0), Param("nb2", int, min=0), Param("nb3", int, min=0),
           Param("offset", int, min=0))


def _region_rule(d, s, p):
    a, b = s["a"], s["b"]
    if d.op == Op.ACC and not a.is_contiguous():
        _fail(d, "a must be contiguous")
    if b.nelements > a.nelements:
        _fail(d, f"b has {b.nelements} elements, more than a's {a.nelements}")
    ts = traits(a.type).type_size
    for k in ("nb1", "nb2", "nb3", "offset"):
        if p[k] % ts:
            _fail(d, f"{k}={p[k]} is not a multiple of the element size {ts}", InvalidArgument)
    if overlaps_itself(a.type, b.ne, (ts, p["nb1"], p["nb2"], p["nb3"])):
        # several elements of b would land on one element of a: ggml's result then depends on its
        # thread split, and backends would disagree; refused once, here
        _fail(d, f"the region (strides {ts}/{p['nb1']}/{p['nb2']}/{p['nb3']}) for b ne={list(b.ne)} overlaps "
                 "itself: each stride must clear the span of the dims inside it", InvalidArgument)
    end = p["offset"] + nbytes_of(a.type, b.ne, (ts, p["nb1"], p["nb2"], p["nb3"]))
    if end > a.nbytes:
        _fail(d, f"the region (offset {p['offset']}, strides {p['nb1']}/{p['nb2']}/{p['nb3']}) for b "
                 f"ne={list(b.ne)} ends at byte {end}, past a's {a.nbytes} bytes", InvalidArgument)
    return Out(a.type, a.ne)


def _set_rule(d, s, p):
    if s["b"].type != s["a"].type:
        _fail(d, f"b has type {traits(s['b'].type).name} but a has {traits(s['a'].type).name}", TypeMismatch)
    return _region_rule(d, s, p)


def _argmax_rule(d, s, p):
    a = s["a"]
    if a.ne[2] != 1 or a.ne[3] != 1:
        _fail(d, f"a must be a matrix (ne[2] = ne[3] = 1), has ne={list(a.ne)}")
    return Out(I32, (a.ne[1], 1, 1, 1))


def _count_equal_rule(d, s, p):
    _same_shape(d, s, "a", "b")
    return Out(I64, (1, 1, 1, 1))


def _repeat_rule(d, s, p):
    a, b = s["a"], s["b"]
    if not can_repeat(a, b):
        _fail(d, f"a (ne={list(a.ne)}) cannot be tiled to b's ne={list(b.ne)}: "
                 "each of b's extents must be a multiple of a's")
    return Out(a.type, b.ne)


def _repeat_back_rule(d, s, p):
    a, b = s["a"], s["b"]
    if not can_repeat(b, a):
        _fail(d, f"a (ne={list(a.ne)}) is not a tiling of b's ne={list(b.ne)}: "
                 "each of a's extents must be a multiple of b's")
    return Out(a.type, b.ne)


def _pair_rule(first: str, second: str) -> Rule:
    def rule(d, s, p):
        _same_shape(d, s, first, second)
        return Out(s[first].type, s[first].ne)
    return rule


def _quantized_needs_f32(d: OpDef, s: Mapping[str, Tensor | None], q: str, other: str) -> None:
    """ggml's CPU backend computes a block-type source ``q`` only against F32 ``other``."""
    if traits(s[q].type).is_quantized and s[other].type != F32:
        _fail(d, f"source {q!r} is quantized ({traits(s[q].type).name}), so {other!r} must be f32, "
                 f"got {traits(s[other].type).name}", TypeMismatch)


def _mul_mat_rule(d, s, p):
    a, b = s["a"], s["b"]
    _quantized_needs_f32(d, s, "a", "b")
    if a.ne[0] != b.ne[0]:
        _fail(d, f"inner extents differ: a.ne[0]={a.ne[0]}, b.ne[0]={b.ne[0]} "
                 "(ggml convention: result[m, n] = sum_k a[k, m] * b[k, n])")
    if not (divides(a.ne[2], b.ne[2]) and divides(a.ne[3], b.ne[3])):
        _fail(d, f"a's batch dims {a.ne[2:]} must divide b's {b.ne[2:]} (block broadcast)")
    if a.is_transposed():
        _fail(d, "a must not be transposed (nb[0] > nb[1]); make it contiguous first", InvalidArgument)
    return Out(F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]))


def _out_prod_rule(d, s, p):
    a, b = s["a"], s["b"]
    _quantized_needs_f32(d, s, "a", "b")
    if a.ne[1] != b.ne[1]:
        _fail(d, f"a.ne[1]={a.ne[1]} must equal b.ne[1]={b.ne[1]} (the summed dim)")
    if not (divides(a.ne[2], b.ne[2]) and divides(a.ne[3], b.ne[3])):
        _fail(d, f"a's batch dims {a.ne[2:]} must divide b's {b.ne[2:]} (block broadcast)")
    if a.is_transposed():
        _fail(d, "a must not be transposed (nb[0] > nb[1])", InvalidArgument)
    return Out(F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]))


def _target_ne(d: OpDef, a: Tensor, ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    full = check_ne(ne, f"{d.key}: ne") if ne else a.ne
    if math.prod(full) != a.nelements:
        _fail(d, f"new ne={list(full)} has {math.prod(full)} elements, a has {a.nelements}")
    return full


def _conversion_rule(d: OpDef, a: Tensor, to: GGMLType) -> None:
    """Block types convert to and from F32 only (ggml's to_float / from_float); a copy between
    two tensors of one block type moves the blocks unchanged."""
    qa, qt = traits(a.type).is_quantized, traits(to).is_quantized
    if (qa or qt) and a.type != to and F32 not in (a.type, to):
        _fail(d, f"{traits(a.type).name} -> {traits(to).name}: block types convert to and from f32 only",
              TypeMismatch)
    if qt and a.type != to and to not in QUANT_WRITABLE:
        _fail(d, f"no quantizer for {traits(to).name}: Prism dequantizes it only", TypeMismatch)


def _cpy_rule(d, s, p):
    a, b = s["a"], s["b"]
    if a.nelements != b.nelements:
        _fail(d, f"a has {a.nelements} elements, the target b has {b.nelements}")
    _conversion_rule(d, a, b.type)
    return ViewOut(b, b.type, b.ne, b.nb)


def _cont_rule(d, s, p):
    a = s["a"]
    ne = _target_ne(d, a, p["ne"])
    blck = traits(a.type).blck_size
    if ne[0] % blck:
        _fail(d, f"new ne[0]={ne[0]} must be a multiple of {traits(a.type).name}'s block size {blck}")
    return Out(a.type, ne)


def _reshape_rule(d, s, p):
    a = s["a"]
    if not a.is_contiguous():
        _fail(d, "a must be contiguous; use cont() first", InvalidArgument)
    ne = _target_ne(d, a, p["ne"])
    return ViewOut(a, a.type, ne, contiguous_strides(a.type, ne))


def _view_rule(d, s, p):
    a = s["a"]
    ne = check_ne(p["ne"], f"{d.key}: ne")
    if len(p["nb"]) != 3:
        _fail(d, f"nb must hold the 3 strides nb1, nb2, nb3, got {p['nb']}", InvalidArgument)
    if any(x < 0 for x in p["nb"]):
        _fail(d, f"strides must be non-negative, got {p['nb']}", InvalidArgument)
    nb = (traits(a.type).type_size, *p["nb"])
    return ViewOut(a, a.type, ne, nb, p["offset"])  # the context checks the view fits in storage


def _permute_rule(d, s, p):
    a, axes = s["a"], p["axes"]
    if sorted(axes) != [0, 1, 2, 3]:
        _fail(d, f"axes must be a permutation of 0..3, got {axes}", InvalidArgument)
    ne, nb = [0] * 4, [0] * 4
    for k, ax in enumerate(axes):  # source dim k moves to position ax (ggml convention)
        ne[ax], nb[ax] = a.ne[k], a.nb[k]
    return ViewOut(a, a.type, tuple(ne), tuple(nb))


def _transpose_rule(d, s, p):
    a = s["a"]
    return ViewOut(a, a.type, (a.ne[1], a.ne[0], a.ne[2], a.ne[3]), (a.nb[1], a.nb[0], a.nb[2], a.nb[3]))


def _get_rows_rule(d, s, p):
    a, b = s["a"], s["b"]
    if b.ne[1] != a.ne[2] or b.ne[2] != a.ne[3] or b.ne[3] != 1:
        _fail(d, f"indices b ne={list(b.ne)} must be [m, a.ne[2]={a.ne[2]}, a.ne[3]={a.ne[3]}, 1]")
    return Out(I32 if a.type == I32 else F32, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]))


def _get_rows_back_rule(d, s, p):
    a, b, c = s["a"], s["b"], s["c"]
    if a.ne[2] != 1 or a.ne[3] != 1 or c.ne[2] != 1 or c.ne[3] != 1:
        _fail(d, f"a (ne={list(a.ne)}) and c (ne={list(c.ne)}) must be matrices")
    if b.ne[1:] != (1, 1, 1) or b.ne[0] != a.ne[1]:
        _fail(d, f"indices b must be a vector of a.ne[1]={a.ne[1]} entries, has ne={list(b.ne)}")
    if a.ne[0] != c.ne[0]:
        _fail(d, f"row lengths differ: a.ne[0]={a.ne[0]}, c.ne[0]={c.ne[0]}")
    return Out(F32, (c.ne[0], c.ne[1], 1, 1))


def _soft_max_rule(d, s, p):
    a, mask, sinks = s["a"], s.get("mask"), s.get("sinks")
    if mask is not None:
        if not mask.is_contiguous():
            _fail(d, "mask must be contiguous", InvalidArgument)
        if mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1]:
            _fail(d, f"mask ne={list(mask.ne)} must have ne[0]={a.ne[0]} and ne[1] >= {a.ne[1]}")
        if not (divides(mask.ne[2], a.ne[2]) and divides(mask.ne[3], a.ne[3])):
            _fail(d, f"mask dims 2,3 {mask.ne[2:]} must divide a's {a.ne[2:]}")
    elif p["max_bias"] > 0:
        _fail(d, "max_bias > 0 (ALiBi) needs a mask", InvalidArgument)
    if sinks is not None and (sinks.nelements != a.ne[2] or sinks.ne[0] != a.ne[2]):
        _fail(d, f"sinks must be a vector of a.ne[2]={a.ne[2]} entries, has ne={list(sinks.ne)}")
    return Out(F32, a.ne)


def _clamp_rule(d, s, p):
    if p["min"] > p["max"]:
        _fail(d, f"min={p['min']} is greater than max={p['max']}", InvalidArgument)
    return Out(s["a"].type, s["a"].ne)


def _loss_rule(d, s, p):
    _same_shape(d, s, "a", "b")
    if s["a"].nelements == 0:  # no class to distribute over, or no row to average over
        _fail(d, f"a has no elements (ne={list(s['a'].ne)}): the loss needs rows of at least one class")
    return Out(F32, (1, 1, 1, 1))


def _loss_back_rule(d, s, p):
    _same_shape(d, s, "a", "b")
    if s["grad"].nelements != 1:
        _fail(d, f"grad must be a scalar, has ne={list(s['grad'].ne)}")
    return Out(F32, s["a"].ne)


def _opt_step_rule(n_params: int, moments: tuple[str, ...]) -> Rule:
    def rule(d, s, p):
        a = s["a"]
        if not a.flags & Flag.PARAM:
            _fail(d, f"a ({a.label}) must be flagged as a parameter (set_param)", InvalidArgument)
        _same_shape(d, s, "a", "grad", *moments)
        if s["params"].nelements != n_params:
            _fail(d, f"params must hold {n_params} values, has {s['params'].nelements}")
        return ViewOut(a, a.type, a.ne, a.nb)
    return rule


def _concat_rule(d, s, p):
    a, b, dim = s["a"], s["b"], p["dim"]
    if a.type != b.type:
        _fail(d, f"a has type {traits(a.type).name} but b has {traits(b.type).name}; they must be equal",
              TypeMismatch)
    for i in range(4):
        if i != dim and a.ne[i] != b.ne[i]:
            _fail(d, f"a (ne={list(a.ne)}) and b (ne={list(b.ne)}) differ in dim {i}; "
                     f"only the concatenated dim {dim} may differ")
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return Out(a.type, tuple(ne))


def _diag_rule(d, s, p):
    a = s["a"]
    if a.ne[1] != 1:
        _fail(d, f"a must have ne[1] == 1 (a row vector per matrix), has ne={list(a.ne)}")
    return Out(a.type, (a.ne[0], a.ne[0], a.ne[2], a.ne[3]))


_PADS = ("lp0", "rp0", "lp1", "rp1", "lp2", "rp2", "lp3", "rp3")


def _pad_rule(d, s, p):
    a = s["a"]
    ne = tuple(a.ne[i] + p[_PADS[2 * i]] + p[_PADS[2 * i + 1]] for i in range(4))
    if p["circular"]:
        for i in range(4):
            if a.ne[i] == 0 and ne[i] > 0:
                _fail(d, f"circular padding of dim {i} needs a non-empty source, a has ne={list(a.ne)}")
    return Out(a.type, check_ne(ne, f"{d.key}: result ne"))


def _pad_reflect_rule(d, s, p):
    a = s["a"]
    if not a.is_contiguous():
        _fail(d, "a must be contiguous", InvalidArgument)
    for k in ("p0", "p1"):
        if p[k] >= a.ne[0]:
            _fail(d, f"{k}={p[k]} must be less than a.ne[0]={a.ne[0]} (the edge is not repeated)",
                  InvalidArgument)
    return Out(a.type, (a.ne[0] + p["p0"] + p["p1"], a.ne[1], a.ne[2], a.ne[3]))


def arange_count(start: float, stop: float, step: float) -> float:
    """ggml's element count ``ceilf((stop - start) / step)``, evaluated in float32 as ggml does."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        q = (np.float32(stop) - np.float32(start)) / np.float32(step)
    return float(np.ceil(q))


def _arange_rule(d, s, p):
    start, stop, step = p["start"], p["stop"], p["step"]
    if step == 0:
        _fail(d, "step must be non-zero", InvalidArgument)
    if not stop > start:
        _fail(d, f"stop={stop} must be greater than start={start} in float32 (ggml's ranges increase; "
                 "float params are kept in float32)", InvalidArgument)
    if step < 0:
        _fail(d, f"step={step} is negative, so [start={start}, stop={stop}) gives an empty range",
              InvalidArgument)
    n = arange_count(start, stop, step)
    if not math.isfinite(n) or n > MAX_NE:
        _fail(d, f"[{start}, {stop}) in steps of {step} has {n} elements, over the bound 2**62", BoundExceeded)
    if n < 1:
        _fail(d, f"[{start}, {stop}) in steps of {step} is empty in float32", InvalidArgument)
    return Out(F32, (int(n), 1, 1, 1))


def _timestep_rule(d, s, p):
    t = s["timesteps"]
    if t.ne[1:] != (1, 1, 1):
        _fail(d, f"timesteps must be a vector (ne[1] = ne[2] = ne[3] = 1), has ne={list(t.ne)}")
    if not t.is_contiguous():
        _fail(d, "timesteps must be contiguous", InvalidArgument)
    return Out(F32, (p["dim"], t.ne[0], 1, 1))


def _argsort_rule(d, s, p):
    a = s["a"]
    if a.ne[0] > INT32_MAX:
        _fail(d, f"rows of {a.ne[0]} elements cannot be indexed by int32", BoundExceeded)
    return Out(I32, a.ne)


def _glu_rule(d, s, p):
    a, b = s["a"], s.get("b")
    if not a.is_contiguous_n(1):
        _fail(d, "a must be contiguous apart from its rows' stride (ggml_is_contiguous_1)", InvalidArgument)
    if b is None:
        if a.ne[0] % 2:
            _fail(d, f"a.ne[0]={a.ne[0]} must be even: each row is split into halves x and g")
        return Out(a.type, (a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3]))
    if p["swapped"]:
        _fail(d, "swapped applies to the unsplit form only; with b, x = a and g = b", InvalidArgument)
    if not b.is_contiguous_n(1):
        _fail(d, "b must be contiguous apart from its rows' stride (ggml_is_contiguous_1)", InvalidArgument)
    if b.type != a.type:
        _fail(d, f"b has type {traits(b.type).name} but a has {traits(a.type).name}; they must be equal",
              TypeMismatch)
    _same_shape(d, s, "a", "b")
    return Out(a.type, a.ne)


# ------------------------------------------------------------------ derivative rules
# Each rule returns a gradient contribution with its source's extents, built from
# ordinary ops so that every backend computes gradients with its forward kernels.

def _contig(B, t: Tensor) -> Tensor:
    return t if t.is_contiguous() else B.cont(t)


def _like(B, g: Tensor, src: Tensor) -> Tensor:
    """g with src's extents (same element count)."""
    return g if g.ne == src.ne else B.reshape(_contig(B, g), src.ne)


def _unbroadcast(B, g: Tensor, src: Tensor) -> Tensor:
    """The gradient of a source that was broadcast into g: the sum over its tiles."""
    return g if g.ne == src.ne else B.repeat_back(g, src)


def _region_of(B, n: Tensor, g: Tensor) -> Tensor:
    """The part of g that ACC/SET's b was written to, with b's extents."""
    p, b = n.params, n.src[1]
    view = B.view(_contig(B, g), b.ne, (p["nb1"], p["nb2"], p["nb3"]), p["offset"])
    return _like(B, B.cont(view), b)


def _zeros(n: Tensor, ne) -> Tensor:
    return n.ctx.new_tensor(F32, ne)


def _unsupported(msg: str) -> None:
    from .errors import Unsupported
    raise Unsupported(msg)


def _mul_mat_grad_a(B, n: Tensor, g: Tensor) -> Tensor:
    a, b = n.src[0], n.src[1]
    full = B.out_prod(_contig(B, b), g)  # [K, M, B2, B3]: one gradient per b matrix
    if full.ne == a.ne:
        return full
    # a's matrix j served b's matrices j*r .. j*r + r - 1 (block broadcast): sum each run
    k, m, b2, b3 = full.ne
    r2, r3 = b2 // a.ne[2], b3 // a.ne[3]
    s = B.repeat_back(B.reshape(full, (k * m, r2, a.ne[2], b3)), _zeros(n, (k * m, 1, a.ne[2], b3)))
    s = B.repeat_back(B.reshape(s, (k * m * a.ne[2], r3, a.ne[3], 1)), _zeros(n, (k * m * a.ne[2], 1, a.ne[3], 1)))
    return B.reshape(s, a.ne)


def _view_grad(B, n: Tensor, g: Tensor) -> Tensor:
    a = n.src[0]
    if a.type != F32 or not a.is_contiguous():
        _unsupported(f"VIEW: the gradient of a view of a non-contiguous or non-f32 tensor ({a.label}) "
                     "is not supported; view a contiguous f32 tensor")
    nb = n.params["nb"]
    return B.acc(_zeros(n, a.ne), _contig(B, g), nb[0], nb[1], nb[2], n.params["offset"])


def _get_rows_grad(B, n: Tensor, g: Tensor) -> Tensor:
    a = n.src[0]
    if a.ne[2] != 1 or a.ne[3] != 1:
        _unsupported(f"GET_ROWS: the gradient needs a matrix source, {a.label} has ne={list(a.ne)}")
    return B.get_rows_back(_contig(B, g), n.src[1], a)


def _inverse_permute(B, n: Tensor, g: Tensor) -> Tensor:
    inv = [0] * 4
    for k, ax in enumerate(n.params["axes"]):
        inv[ax] = k
    return B.permute(g, *inv)


def _concat_part(which: int):
    def rule(B, n: Tensor, g: Tensor) -> Tensor:
        a, src, dim = n.src[0], n.src[which], n.params["dim"]
        g = _contig(B, g)
        offset = 0 if which == 0 else a.ne[dim] * g.nb[dim]
        return B.cont(B.view(g, src.ne, g.nb[1:], offset))
    return rule


def _glu_split_only(part: str):
    def rule(B, n: Tensor, g: Tensor) -> Tensor:
        a, b = n.src[0], n.src[1] if len(n.src) > 1 else None
        if b is None:
            _unsupported(f"{n.opdef.key}: only the split form (glu_split) is differentiable")
        return B.silu_back(B.mul(g, b), a) if part == "a" else B.mul(B.silu(a), g)
    return rule


def _step_between(B, x: Tensor, lo: float, hi: float) -> Tensor:
    """1 where lo < x < hi, else 0 (the derivative mask of clamp)."""
    return B.mul(B.step(B.scale_bias(x, 1.0, -lo)), B.step(B.scale_bias(x, -1.0, hi)))


_G = {  # unary sub-op -> rule for its source; the node n is y
    "ABS": lambda B, n, g: B.mul(B.sgn(n.src[0]), g),
    "NEG": lambda B, n, g: B.neg(g),
    "RELU": lambda B, n, g: B.mul(B.step(n.src[0]), g),
    "SILU": lambda B, n, g: B.silu_back(g, n.src[0]),
    "EXP": lambda B, n, g: B.mul(n, g),
    "EXPM1": lambda B, n, g: B.mul(g, B.exp(n.src[0])),
    "SOFTPLUS": lambda B, n, g: B.mul(g, B.sigmoid(n.src[0])),
    "TANH": lambda B, n, g: B.mul(g, B.scale_bias(B.sqr(n), -1.0, 1.0)),
    "SIGMOID": lambda B, n, g: B.mul(g, B.mul(n, B.scale_bias(n, -1.0, 1.0))),
    "GELU": lambda B, n, g: B.mul(g, _gelu_slope(B, n.src[0])),
    "GELU_QUICK": lambda B, n, g: B.mul(g, _gelu_quick_slope(B, n.src[0])),
    "ELU": lambda B, n, g: B.mul(g, B.add(B.step(n.src[0]), B.mul(B.scale_bias(B.step(n.src[0]), -1.0, 1.0),
                                                               B.scale_bias(n, 1.0, 1.0)))),
    "HARDSIGMOID": lambda B, n, g: B.mul(g, B.scale(_step_between(B, n.src[0], -3.0, 3.0), 1.0 / 6.0)),
    "HARDSWISH": lambda B, n, g: B.mul(g, B.add(B.hardsigmoid(n.src[0]), B.mul(
        B.scale(n.src[0], 1.0 / 6.0), _step_between(B, n.src[0], -3.0, 3.0)))),
}
_GELU_C, _GELU_A = math.sqrt(2.0 / math.pi), 0.044715


def _gelu_slope(B, x: Tensor) -> Tensor:
    """d/dx of 0.5 x (1 + tanh(u)), u = c (x + a x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)."""
    x2 = B.sqr(x)
    t = B.tanh(B.scale(B.mul(x, B.scale_bias(x2, _GELU_A, 1.0)), _GELU_C))
    du = B.scale_bias(x2, 3 * _GELU_A * _GELU_C, _GELU_C)
    return B.add(B.scale_bias(t, 0.5, 0.5), B.mul(B.scale(x, 0.5), B.mul(B.scale_bias(B.sqr(t), -1.0, 1.0), du)))


def _gelu_quick_slope(B, x: Tensor) -> Tensor:
    """d/dx of x s(1.702 x): s + 1.702 x s (1 - s)."""
    s = B.sigmoid(B.scale(x, 1.702))
    return B.add(s, B.mul(B.scale(x, 1.702), B.mul(s, B.scale_bias(s, -1.0, 1.0))))


def _norm_grad(B, n: Tensor, g: Tensor) -> Tensor:
    """(g - mean(g) - y mean(g y)) / sqrt(var + eps), per row."""
    x = n.src[0]
    sd = B.sqrt(B.scale_bias(B.mean(B.sqr(B.sub(x, B.mean(x)))), 1.0, n.params["eps"]))
    return B.div(B.sub(B.sub(g, B.mean(g)), B.mul(n, B.mean(B.mul(g, n)))), sd)
PIECEWISE_CONSTANT = {"SGN", "STEP", "FLOOR", "CEIL", "ROUND", "TRUNC"}


# ------------------------------------------------------------------ declarations
A = (Src("a", FLOATS),)
AB = (Src("a", FLOATS), Src("b", FLOATS))
EPS = (Param("eps", float, 0.0, min=0.0, doc="added to the variance / mean square"),)

define("DUP", Op.DUP, (Src("a", ANY_PLAIN | QUANTIZED),), same_as(), "copy of a", inplace=True,
       grad={"a": lambda B, n, g: g})
_BINARY_GRADS = {
    Op.ADD: {"a": lambda B, n, g: g, "b": lambda B, n, g: _unbroadcast(B, g, n.src[1])},
    Op.SUB: {"a": lambda B, n, g: g, "b": lambda B, n, g: _unbroadcast(B, B.neg(g), n.src[1])},
    Op.MUL: {"a": lambda B, n, g: B.mul(g, n.src[1]),
             "b": lambda B, n, g: _unbroadcast(B, B.mul(n.src[0], g), n.src[1])},
    Op.DIV: {"a": lambda B, n, g: B.div(g, n.src[1]),
             "b": lambda B, n, g: _unbroadcast(B, B.neg(B.mul(g, B.div(n, n.src[1]))), n.src[1])},
}
for _op, _f in ((Op.ADD, "a + b"), (Op.SUB, "a - b"), (Op.MUL, "a * b"), (Op.DIV, "a / b")):
    _add = _op == Op.ADD
    define(_op.name, _op, (Src("a", FLOATS | QUANT_WRITABLE), Src("b", FLOATS)) if _add else AB,
           _add_rule if _add else _broadcast_rule,
           f"{_f}, b broadcast into a by modulo indexing"
           + ("; a quantized a: dequantized, b (f32, same shape) added, requantized to a's type" if _add else ""),
           inplace=True, family="binary", grad=_BINARY_GRADS[_op])
define("ADD1", Op.ADD1, AB, _add1_rule, "a + b, b a one-element tensor", inplace=True,
       grad={"a": lambda B, n, g: g, "b": lambda B, n, g: _like(B, B.sum(g), n.src[1])})
define("ACC", Op.ACC, (Src("a", ONLY_F32), Src("b", ONLY_F32)), _region_rule,
       "copy of a with b added into the strided region (nb1, nb2, nb3, offset in bytes)",
       params=_REGION, inplace=True, grad={"a": lambda B, n, g: g, "b": lambda B, n, g: _region_of(B, n, g)})
define("SET", Op.SET, (Src("a", ANY_PLAIN), Src("b", ANY_PLAIN)), _set_rule,
       "copy of a with b written into the strided region (nb1, nb2, nb3, offset in bytes)",
       params=_REGION, inplace=True, grad={
           "a": lambda B, n, g: B.set(_contig(B, g), _zeros(n, n.src[1].ne), *(n.params[k] for k in _REGION_KEYS)),
           "b": lambda B, n, g: _region_of(B, n, g)})
_MATH_GRADS = {
    Op.SQR: lambda B, n, g: B.scale(B.mul(n.src[0], g), 2.0),
    Op.SQRT: lambda B, n, g: B.scale(B.div(g, n), 0.5),
    Op.LOG: lambda B, n, g: B.div(g, n.src[0]),
    Op.SIN: lambda B, n, g: B.mul(g, B.cos(n.src[0])),
    Op.COS: lambda B, n, g: B.neg(B.mul(g, B.sin(n.src[0]))),
}
for _op, _f in ((Op.SQR, "x^2"), (Op.SQRT, "sqrt(x)"), (Op.LOG, "ln(x)"), (Op.SIN, "sin(x)"),
                (Op.COS, "cos(x)")):
    define(_op.name, _op, A, same_as(), _f, inplace=True, family="unary", grad={"a": _MATH_GRADS[_op]})
define("SUM", Op.SUM, A, lambda d, s, p: Out(s["a"].type, (1, 1, 1, 1)), "sum of all elements",
       grad={"a": lambda B, n, g: B.repeat(g, n.src[0])})
define("SUM_ROWS", Op.SUM_ROWS, A, lambda d, s, p: Out(s["a"].type, _rows(s["a"])), "sum over dim 0",
       grad={"a": lambda B, n, g: B.repeat(g, n.src[0])})
define("MEAN", Op.MEAN, A, lambda d, s, p: Out(F32, _rows(s["a"])), "mean over dim 0 (per row)",
       grad={"a": lambda B, n, g: B.repeat(B.scale(g, 1.0 / n.src[0].ne[0]), n.src[0])})
define("ARGMAX", Op.ARGMAX, (Src("a", ONLY_F32),), _argmax_rule,
       "index of each row's maximum (the last one on ties)", nmse=0.0, nograd="integer result")
define("COUNT_EQUAL", Op.COUNT_EQUAL, (Src("a", frozenset({I32})), Src("b", frozenset({I32}))),
       _count_equal_rule, "number of equal elements of a and b", nmse=0.0, nograd="integer result")
define("REPEAT", Op.REPEAT, (Src("a", ANY_PLAIN), Src("b", ANY_PLAIN)), _repeat_rule,
       "a tiled to b's shape (only b's shape is read)",
       grad={"a": lambda B, n, g: B.repeat_back(g, n.src[0]), "b": IGNORE})
define("REPEAT_BACK", Op.REPEAT_BACK, (Src("a", FLOATS), Src("b", ANY_PLAIN)), _repeat_back_rule,
       "sum of a's tiles, giving b's shape (adjoint of REPEAT)",
       grad={"a": lambda B, n, g: B.repeat(g, n.src[0]), "b": IGNORE})
define("CONCAT", Op.CONCAT, (Src("a", ANY_PLAIN), Src("b", ANY_PLAIN)), _concat_rule,
       "a and b (same type) joined along dim; every other extent must match",
       params=(Param("dim", int, min=0, max=3, doc="dim to concatenate along, 0..3"),),
       grad={"a": _concat_part(0), "b": _concat_part(1)})
define("SILU_BACK", Op.SILU_BACK, (Src("grad", FLOATS), Src("x", FLOATS)), _pair_rule("grad", "x"),
       "grad * s(x) * (1 + x (1 - s(x))), s the logistic sigmoid")
define("NORM", Op.NORM, (Src("a", ONLY_F32),), same_as(), "(x - mean) / sqrt(var + eps) per row",
       params=EPS, inplace=True, grad={"a": _norm_grad})
define("RMS_NORM", Op.RMS_NORM, (Src("a", ONLY_F32),), same_as(), "x / sqrt(mean(x^2) + eps) per row",
       params=EPS, inplace=True, grad={"a": lambda B, n, g: B.rms_norm_back(g, n.src[0], n.params["eps"])})
define("RMS_NORM_BACK", Op.RMS_NORM_BACK, (Src("dz", ONLY_F32), Src("x", ONLY_F32)), _pair_rule("dz", "x"),
       "gradient of rms_norm: (dz - x <x,dz>/(sum x^2 + n eps)) / sqrt(mean(x^2) + eps)", params=EPS)
define("GROUP_NORM", Op.GROUP_NORM, (Src("a", ONLY_F32),), same_as(),
       "(x - mean) / sqrt(var + eps) over groups of ceil(ne2 / n_groups) channels (dim 2): "
       "mean and var over ne0*ne1*channels, per i3",
       params=(Param("n_groups", int, min=1, max=INT32_MAX), Param("eps", float, 1e-6, min=0.0)), inplace=True)
define("L2_NORM", Op.L2_NORM, (Src("a", ONLY_F32),), same_as(), "x / max(||x||_2, eps) per row",
       params=(Param("eps", float, 0.0, min=0.0, doc="lower bound of the row norm"),), inplace=True)
QAB = (Src("a", FLOATS | QUANT_WEIGHTS), Src("b", FLOATS))
define("MUL_MAT", Op.MUL_MAT, QAB, _mul_mat_rule,
       "out[m,n] = sum_k a[k,m] b[k,n]; a's dims 2,3 broadcast blockwise; a quantized a needs an f32 b "
       "(the reference uses a's dequantized values)", nmse=5e-4,
       grad={"a": _mul_mat_grad_a, "b": lambda B, n, g: B.out_prod(n.src[0], B.transpose(g))})
define("OUT_PROD", Op.OUT_PROD, QAB, _out_prod_rule,
       "out[i,j] = sum_t a[i,t] b[j,t]; a's dims 2,3 broadcast blockwise", nmse=5e-4)
define("SCALE", Op.SCALE, A, same_as(), "x * s + b",
       params=(Param("s", float), Param("b", float, 0.0)), inplace=True, family="unary",
       grad={"a": lambda B, n, g: B.scale(g, n.params["s"])})
define("CPY", Op.CPY, (Src("a", ANY_PLAIN | QUANTIZED), Src("b", ANY_PLAIN | QUANTIZED)), _cpy_rule,
       "a's elements, in row-major order, converted and written into b; the result is b (block types: "
       "f32 -> quantized with ggml's reference quantizer, quantized -> f32 dequantized, same type: blocks copied)",
       nmse=1e-6,
       grad={"a": lambda B, n, g: _like(B, g, n.src[0]), "b": IGNORE})
define("CONT", Op.CONT, (Src("a", ANY_PLAIN | QUANTIZED),), _cont_rule,
       "contiguous copy of a, optionally with a new shape of equal element count",
       params=(Param("ne", tuple, ()),), grad={"a": lambda B, n, g: _like(B, g, n.src[0])})
define("RESHAPE", Op.RESHAPE, (Src("a", ANY_PLAIN | QUANTIZED),), _reshape_rule,
       "view of contiguous a with a new shape", params=(Param("ne", tuple),), view_only=True,
       grad={"a": lambda B, n, g: _like(B, g, n.src[0])})
define("VIEW", Op.VIEW, (Src("a", ANY_PLAIN | QUANTIZED),), _view_rule,
       "view of a's memory with extents ne, strides (elem, nb1, nb2, nb3), byte offset",
       params=(Param("ne", tuple), Param("nb", tuple), Param("offset", int, 0, min=0)), view_only=True,
       grad={"a": _view_grad})
define("PERMUTE", Op.PERMUTE, (Src("a", ANY_PLAIN | QUANTIZED),), _permute_rule,
       "view with source dim k moved to position axes[k]",
       params=(Param("axes", tuple, length=4),), view_only=True, grad={"a": _inverse_permute})
define("TRANSPOSE", Op.TRANSPOSE, (Src("a", ANY_PLAIN | QUANTIZED),), _transpose_rule,
       "view with dims 0 and 1 swapped", view_only=True, grad={"a": lambda B, n, g: B.transpose(g)})
define("GET_ROWS", Op.GET_ROWS, (Src("a", FLOATS | {I32} | QUANTIZED), Src("b", frozenset({I32}))),
       _get_rows_rule, "out[:, i, j, k] = a[:, b[i, j, k], j, k] (f32 result; I32 rows copied exactly; "
       "quantized rows dequantized)", grad={"a": _get_rows_grad, "b": IGNORE})
define("GET_ROWS_BACK", Op.GET_ROWS_BACK,
       (Src("a", FLOATS), Src("b", frozenset({I32})), Src("c", ANY_PLAIN)), _get_rows_back_rule,
       "zeros of c's shape with row b[i] += a[:, i] (adjoint of GET_ROWS)")
define("DIAG", Op.DIAG, (Src("a", ONLY_F32),), _diag_rule,
       "a [n, 1, ne2, ne3] -> [n, n, ne2, ne3] with a on the diagonal and 0 elsewhere")
for _op, _f in ((Op.DIAG_MASK_INF, "-inf"), (Op.DIAG_MASK_ZERO, "0")):
    define(_op.name, _op, (Src("a", ONLY_F32),), same_as(),
           f"element (i, j) of each matrix set to {_f} where column i > n_past + row j",
           params=(Param("n_past", int, min=INT32_MIN, max=INT32_MAX),), inplace=True,
           grad={"a": lambda B, n, g: B.diag_mask_zero(g, n.params["n_past"])})
define("SOFT_MAX", Op.SOFT_MAX,
       (Src("a", ONLY_F32), Src("mask", frozenset({F16, F32}), True), Src("sinks", ONLY_F32, True)),
       _soft_max_rule, "row softmax of a*scale + slope*mask (ALiBi slope from max_bias; optional sinks)",
       params=(Param("scale", float, 1.0), Param("max_bias", float, 0.0, min=0.0)), inplace=True, nmse=1e-6,
       grad={"a": lambda B, n, g: B.soft_max_ext_back(g, n, n.params["scale"], n.params["max_bias"])},
       nograd="the gradients of the mask and the sinks are not implemented (as in ggml)")
define("SOFT_MAX_BACK", Op.SOFT_MAX_BACK, (Src("dy", ONLY_F32), Src("y", ONLY_F32)), _pair_rule("dy", "y"),
       "scale * y * (dy - <y, dy>) per row",
       params=(Param("scale", float, 1.0), Param("max_bias", float, 0.0, min=0.0)), nmse=1e-6)
define("CLAMP", Op.CLAMP, A, _clamp_rule, "min(max(x, min), max)",
       params=(Param("min", float), Param("max", float)), inplace=True, family="unary",
       grad={"a": lambda B, n, g: B.mul(g, _step_between(B, n.src[0], n.params["min"], n.params["max"]))})
define("PAD", Op.PAD, (Src("a", ONLY_F32),), _pad_rule,
       "a with lp_i / rp_i elements added before / after dim i: zeros, or a's values wrapped around "
       "(circular)",
       params=tuple(Param(n, int, 0, min=0, max=INT32_MAX) for n in _PADS) + (Param("circular", bool, False),))
define("PAD_REFLECT_1D", Op.PAD_REFLECT_1D, (Src("a", ONLY_F32),), _pad_reflect_rule,
       "a with p0 / p1 elements mirrored before / after each row, the edge not repeated",
       params=(Param("p0", int, min=0, max=INT32_MAX), Param("p1", int, min=0, max=INT32_MAX)))
define("ARANGE", Op.ARANGE, (), _arange_rule,
       "F32 [ceil((stop - start) / step)]: start + i * step (no source tensor)",
       params=(Param("start", float), Param("stop", float), Param("step", float, 1.0)))
define("TIMESTEP_EMBEDDING", Op.TIMESTEP_EMBEDDING, (Src("timesteps", ONLY_F32),), _timestep_rule,
       "F32 [dim, N]: cos(t f_j) at j, sin(t f_j) at j + dim/2, f_j = max_period^(-j / (dim/2)); "
       "odd dim: last column 0",
       params=(Param("dim", int, min=1, max=INT32_MAX), Param("max_period", int, 10000, min=1, max=INT32_MAX)))
define("ARGSORT", Op.ARGSORT, (Src("a", ONLY_F32),), _argsort_rule,
       "I32 indices that sort each row ASC or DESC (tie order unspecified in ggml; stable here)",
       params=(Param("order", SortOrder, SortOrder.ASC),), nmse=0.0, nograd="integer result")
define("LEAKY_RELU", Op.LEAKY_RELU, A, same_as(), "max(x, 0) + negative_slope * min(x, 0)",
       params=(Param("negative_slope", float),), inplace=True, family="unary",
       grad={"a": lambda B, n, g: B.mul(g, B.scale_bias(B.step(n.src[0]), 1.0 - n.params["negative_slope"],
                                                          n.params["negative_slope"]))})

UNARY_DOCS = {
    UnaryOp.ABS: "|x|", UnaryOp.SGN: "sign(x), 0 at 0", UnaryOp.NEG: "-x", UnaryOp.STEP: "1 if x > 0 else 0",
    UnaryOp.TANH: "tanh(x)", UnaryOp.ELU: "x if x > 0 else expm1(x)", UnaryOp.RELU: "max(x, 0)",
    UnaryOp.SIGMOID: "1 / (1 + exp(-x))",
    UnaryOp.GELU: "0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))",
    UnaryOp.GELU_QUICK: "x * sigmoid(1.702 x)", UnaryOp.SILU: "x * sigmoid(x)",
    UnaryOp.HARDSWISH: "x * clamp((x + 3) / 6, 0, 1)", UnaryOp.HARDSIGMOID: "clamp((x + 3) / 6, 0, 1)",
    UnaryOp.EXP: "exp(x)", UnaryOp.EXPM1: "exp(x) - 1", UnaryOp.SOFTPLUS: "x if x > 20 else ln(1 + exp(x))",
    UnaryOp.GELU_ERF: "0.5 x (1 + erf(x / sqrt(2)))",
    UnaryOp.XIELU: "x > 0: ap x^2 + beta x; else (expm1(min(x, eps)) - x) an + beta x, "
                   "with ap = softplus(alpha_p), an = beta + softplus(alpha_n)",
    UnaryOp.FLOOR: "floor(x)", UnaryOp.CEIL: "ceil(x)", UnaryOp.ROUND: "round half away from zero",
    UnaryOp.TRUNC: "round toward zero",
}
XIELU_PARAMS = (Param("alpha_n", float, 0.8), Param("alpha_p", float, 0.8), Param("beta", float, 0.5),
                Param("eps", float, -1e-6))
for _u in UnaryOp:
    define(_u.name, Op.UNARY, A, same_as(), UNARY_DOCS[_u], sub=_u, inplace=True, family="unary",
           params=XIELU_PARAMS if _u == UnaryOp.XIELU else (),
           grad={"a": IGNORE} if _u.name in PIECEWISE_CONSTANT else {"a": _G[_u.name]} if _u.name in _G else {},
           nograd="" if _u.name in _G or _u.name in PIECEWISE_CONSTANT else "derivative rule not written yet")

define("CROSS_ENTROPY_LOSS", Op.CROSS_ENTROPY_LOSS, (Src("a", ONLY_F32), Src("b", ONLY_F32)), _loss_rule,
       "-(1/nrows) sum_rows sum_i b_i log_softmax(a)_i; b holds label distributions",
       grad={"a": lambda B, n, g: B.cross_entropy_loss_back(g, n.src[0], n.src[1])},
       nograd="the gradient of the labels is not implemented (as in ggml)")
define("CROSS_ENTROPY_LOSS_BACK", Op.CROSS_ENTROPY_LOSS_BACK,
       (Src("grad", ONLY_F32), Src("a", ONLY_F32), Src("b", ONLY_F32)), _loss_back_rule,
       "(softmax(a) - b) * grad / nrows")
define("OPT_STEP_ADAMW", Op.OPT_STEP_ADAMW,
       tuple(Src(n, ONLY_F32) for n in ("a", "grad", "m", "v", "params")), _opt_step_rule(7, ("m", "v")),
       "AdamW step on a in place; params = [alpha, beta1, beta2, eps, wd, beta1h, beta2h]")
define("OPT_STEP_SGD", Op.OPT_STEP_SGD, tuple(Src(n, ONLY_F32) for n in ("a", "grad", "params")),
       _opt_step_rule(2, ()), "SGD step on a in place; params = [alpha, wd]: a = a (1 - alpha wd) - alpha grad")


GLU_DOCS = {
    GluOp.REGLU: "relu(x) * g", GluOp.GEGLU: "gelu(x) * g (tanh approximation)", GluOp.SWIGLU: "silu(x) * g",
    GluOp.SWIGLU_OAI: "x' sigmoid(alpha x') (g' + 1), x' = min(x, limit), g' = clamp(g, -limit, limit)",
    GluOp.GEGLU_ERF: "gelu_erf(x) * g", GluOp.GEGLU_QUICK: "x sigmoid(1.702 x) * g",
}
GLU_SRCS = (Src("a", FLOATS), Src("b", FLOATS, True))
GLU_SWAPPED = (Param("swapped", bool, False, doc="unsplit form: x is the second half of each row"),)
SWIGLU_OAI_PARAMS = (Param("alpha", float), Param("limit", float, min=0.0))
for _g in GluOp:
    define(_g.name, Op.GLU, GLU_SRCS, _glu_rule,
           GLU_DOCS[_g] + "; x, g = the halves of each row of a (result ne0 = a.ne0 / 2), or x = a, g = b",
           sub=_g, family="glu", params=GLU_SWAPPED + (SWIGLU_OAI_PARAMS if _g == GluOp.SWIGLU_OAI else ()),
           grad={"a": _glu_split_only("a"), "b": _glu_split_only("b")} if _g == GluOp.SWIGLU else {},
           nograd="" if _g == GluOp.SWIGLU else "derivative rule not written yet (ggml has SWIGLU only)")


def infer(d: OpDef, srcs: Mapping[str, Tensor | None], params: Mapping[str, Any]) -> Out | ViewOut:
    """Check source types against the table, then apply the op's shape/type rule."""
    for spec in d.srcs:
        t = srcs.get(spec.name)
        if t is None:
            if not spec.optional:
                raise InvalidArgument(f"{d.key}: source {spec.name!r} is required")
            continue
        if t.type not in spec.types:
            raise TypeMismatch(f"{d.key}: source {spec.name!r} has type {traits(t.type).name}; accepted: "
                               f"{', '.join(sorted(traits(x).name for x in spec.types))}")
    return d.rule(d, srcs, params)


# The table continues in sibling modules, one per op family; they register into OPS.
from . import optable_attn, optable_conv  # noqa: E402,F401,I001

# Listed in ggml's op order (sub-ops in their enum order), whichever module declared them.
for _d in sorted(OPS.values(), key=lambda d: (int(d.op), int(d.sub) if d.sub is not None else -1)):
    OPS[_d.key] = OPS.pop(_d.key)
