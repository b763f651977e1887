"""The op table: every op Prism implements is declared here, once.

A declaration (:class:`OpDef`) holds the op's key (ggml's ``op_desc``: the op name,
or the sub-op name for UNARY and GLU), its sources with the types each accepts, its
parameter schema, its shape/type rule, whether an in-place variant exists, its
conformance error bound and a one-line formula. The builders (:mod:`prism_core.ops.build`),
backends' default ``supports``, the conformance suite and ``prism ops`` all read it.

Shapes in rules are ggml order: ``ne[0]`` is the row length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import BoundExceeded, InvalidArgument, ShapeMismatch, TypeMismatch
from ..quant import OUT_OF_SCOPE, can_quantize
from ..tensor import MAX_NE, Flag, Tensor, check_ne, contiguous_strides, nbytes_of, overlaps_itself
from ..types import BF16, F16, F32, I32, I64, PLAIN_TYPES, GGMLType, traits
from .codes import GluOp, Op, SortOrder, UnaryOp
from .params import Param

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
class Example:
    """A worked example of an op's page: small inputs and the result worked out by hand.

    ``inputs`` maps a source name to ``(type, ne, values)``, values flat in ggml order
    (``ne[0]`` fastest); ``expected`` is the result the same way. A test computes it on
    the reference, so a page's numbers cannot drift from what the suite certifies.
    """

    inputs: Mapping[str, tuple[GGMLType, tuple[int, ...], tuple[float, ...]]]
    expected: tuple[float, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    rtol: float = 1e-6  # relative tolerance of the hand-worked numbers (they are rounded to 7 digits)


@dataclass(frozen=True)
class Spec:
    """The long form of an op's specification, beside the rule it describes (``prism ops OP``).

    ``shape``: the shape/type rule in words; ``formula``: the exact computation beyond the
    one-line ``doc`` (broadcasting, masks, conversion and rounding rules); ``special``: what
    NaN, infinities and signed zeros give; ``example``: a worked example.
    """

    shape: str
    special: str
    example: Example
    formula: str = ""


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
    # contribution (B = prism_core.ops.build), or IGNORE for sources that only supply
    # indices/shapes and never receive a gradient. A source missing here cannot be
    # differentiated: asking for its gradient raises Unsupported with ``nograd``.
    grad: Mapping[str, Any] = field(default_factory=dict)
    nograd: str = ""
    spec: Spec | None = None  # the op page's long form; every op has one (tests/test_opspec.py)

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
NO_RULE_YET = "no derivative rule yet"


def define(key: str, op: Op, srcs: tuple[Src, ...], rule: Rule, doc: str, *,
           params: tuple[Param, ...] = (), **kw: Any) -> OpDef:
    assert key not in OPS, f"op {key} declared twice"
    if not kw.get("grad") and not kw.get("nograd"):
        kw["nograd"] = NO_RULE_YET  # an op is never silently "not differentiable"
    d = OpDef(key, op, srcs, params, rule, doc, **kw)
    OPS[key] = d
    return d


def spec(key: str, shape: str, special: str, example: Example, formula: str = "") -> None:
    """Attach the long form of op ``key``'s page; called right after its ``define``."""
    d = OPS[key]
    assert d.spec is None, f"op {key} specified twice"
    OPS[key] = replace(d, spec=Spec(shape, special, example, formula))


def f32(ne: tuple[int, ...], *values: float) -> tuple[GGMLType, tuple[int, ...], tuple[float, ...]]:
    """An example input of type F32 (values flat in ggml order)."""
    return (F32, ne, values)


def ex(expected: tuple[float, ...], note: str = "", rtol: float = 1e-6, **inputs_and_params: Any) -> Example:
    """An Example: tuple-valued keywords made with :func:`f32` (or ``(type, ne, values)``) are
    inputs, the others params."""
    inputs = {k: v for k, v in inputs_and_params.items() if isinstance(v, tuple) and len(v) == 3
              and isinstance(v[0], GGMLType)}
    params = {k: v for k, v in inputs_and_params.items() if k not in inputs}
    return Example(inputs, tuple(expected), params, note, rtol)


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


def _labels_rule(d, s) -> None:
    """b: label distributions of a's shape (F32), or one class index per row of a (I32 [a.ne1, a.ne2, a.ne3])."""
    a, b = s["a"], s["b"]
    if b.type != I32:
        _same_shape(d, s, "a", "b")
        return
    want = (a.ne[1], a.ne[2], a.ne[3], 1)
    if b.ne != want:
        _fail(d, f"an I32 b holds one class index per row of a: ne must be {list(want)}, got {list(b.ne)}")


def _loss_rule(d, s, p):
    _labels_rule(d, s)
    if s["a"].nelements == 0:  # no class to distribute over, or no row to average over
        _fail(d, f"a has no elements (ne={list(s['a'].ne)}): the loss needs rows of at least one class")
    return Out(F32, (1, 1, 1, 1))


def _loss_back_rule(d, s, p):
    _labels_rule(d, s)
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
    from ..errors import Unsupported
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


def _glu_split_only(part: str, act: GluOp):
    """SWIGLU: silu(a) b; GEGLU: gelu(a) b, its a-slope that of the tanh formula (the forward's F16 table
    follows it to within its rounding)."""
    def rule(B, n: Tensor, g: Tensor) -> Tensor:
        a, b = n.src[0], n.src[1] if len(n.src) > 1 else None
        if b is None:
            _unsupported(f"{n.opdef.key}: only the split form (glu_split) is differentiable")
        if act == GluOp.SWIGLU:
            return B.silu_back(B.mul(g, b), a) if part == "a" else B.mul(B.silu(a), g)
        return B.mul(B.mul(g, b), _gelu_slope(B, a)) if part == "a" else B.mul(B.gelu(a), g)
    return rule


GLU_DIFFERENTIABLE = (GluOp.SWIGLU, GluOp.GEGLU)


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
# Shared wording of the op pages (prism_core.ops.spec)
ELEMENTWISE_SHAPE = "a's type and shape (the float types); a may be any view"
IEEE_SPECIAL = ("IEEE 754 float arithmetic: NaN in gives NaN out, infinities follow the formula (inf - inf, 0 * inf "
                "and 0 / 0 give NaN; x / 0 gives a signed infinity)")
COPY_SPECIAL = "values are moved or converted, never computed on: NaN, infinities and -0.0 are kept"
REDUCE_SPECIAL = IEEE_SPECIAL + "; the order of summation is free (float32 accumulation at least), a NaN or an " \
    "infinity of both signs in a sum gives NaN"
NORM_SPECIAL = (IEEE_SPECIAL + "; a constant row with eps = 0 gives 0 / 0 = NaN (as in ggml); eps is added inside "
                "the square root")

define("DUP", Op.DUP, (Src("a", ANY_PLAIN | QUANTIZED),), same_as(), "copy of a", inplace=True,
       grad={"a": lambda B, n, g: g})
spec("DUP", "a's type and shape; a may be any view, the result is contiguous", COPY_SPECIAL,
     ex((1.0, -2.0, 0.5), a=f32((3,), 1.0, -2.0, 0.5)),
     "the elements of a in row-major order (i0 fastest), bit for bit (block types: the blocks unchanged)")
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
_BIN_EXPECTED = {"ADD": (11, 22, 43, 14, 25, 46), "SUB": (-9, -18, -37, -6, -15, -34),
                 "MUL": (10, 40, 120, 40, 100, 240), "DIV": (0.1, 0.1, 0.075, 0.4, 0.25, 0.15)}
for _k, _e in _BIN_EXPECTED.items():
    spec(_k, "a's type and shape; each of a's extents a multiple of b's" + (
         "; a of a block type (ADD only): b F32 of a's shape, the result a's block type" if _k == "ADD" else ""),
         IEEE_SPECIAL, ex(_e, a=f32((3, 2), 1, 2, 3, 4, 5, 6), b=f32((3,), 10, 20, 40),
                          note="b (one row) is broadcast over a's two rows"),
         f"out[i0, i1, i2, i3] = a[i0, i1, i2, i3] {_k.lower()} b[i0 mod b.ne0, i1 mod b.ne1, i2 mod b.ne2, "
         "i3 mod b.ne3] (operator " + {"ADD": "+", "SUB": "-", "MUL": "*", "DIV": "/"}[_k] + "), computed exactly "
         "and rounded once to a's type. Block-type a (ADD): dequantize a's row, add b's, requantize with ggml's "
         "reference quantizer")
define("ADD1", Op.ADD1, AB, _add1_rule, "a + b, b a one-element tensor", inplace=True,
       grad={"a": lambda B, n, g: g, "b": lambda B, n, g: _like(B, B.sum(g), n.src[1])})
spec("ADD1", ELEMENTWISE_SHAPE + "; b holds one element", IEEE_SPECIAL,
     ex((1.5, 2.5, 3.5), a=f32((3,), 1.0, 2.0, 3.0), b=f32((1,), 0.5)), "out[i] = a[i] + b[0]")
define("ACC", Op.ACC, (Src("a", ONLY_F32), Src("b", ONLY_F32)), _region_rule,
       "copy of a with b added into the strided region (nb1, nb2, nb3, offset in bytes)",
       params=_REGION, inplace=True, grad={"a": lambda B, n, g: g, "b": lambda B, n, g: _region_of(B, n, g)})
spec("ACC", "a's type and shape (F32); a contiguous; the region of b's ne with strides (4, nb1, nb2, nb3) "
     "bytes starting at byte offset must lie inside a and must not overlap itself", IEEE_SPECIAL,
     ex((1.0, 12.0, 23.0, 4.0, 5.0, 6.0, 7.0, 8.0), a=f32((4, 2), 1, 2, 3, 4, 5, 6, 7, 8), b=f32((2,), 10, 20),
        nb1=16, nb2=32, nb3=32, offset=4, note="b is added at a's elements 1 and 2 (byte offset 4)"),
     "out = a; then out[offset + i0*4 + i1*nb1 + i2*nb2 + i3*nb3 (bytes)] += b[i0, i1, i2, i3] for every element of b")
define("SET", Op.SET, (Src("a", ANY_PLAIN), Src("b", ANY_PLAIN)), _set_rule,
       "copy of a with b written into the strided region (nb1, nb2, nb3, offset in bytes)",
       params=_REGION, inplace=True, grad={
           "a": lambda B, n, g: B.set(_contig(B, g), _zeros(n, n.src[1].ne), *(n.params[k] for k in _REGION_KEYS)),
           "b": lambda B, n, g: _region_of(B, n, g)})
spec("SET", "a's type and shape; b of a's type; the region as for ACC", COPY_SPECIAL,
     ex((1.0, 10.0, 20.0, 4.0, 5.0, 6.0, 7.0, 8.0), a=f32((4, 2), 1, 2, 3, 4, 5, 6, 7, 8), b=f32((2,), 10, 20),
        nb1=16, nb2=32, nb3=32, offset=4),
     "out = a; then the element of out at byte offset + i0*elem + i1*nb1 + i2*nb2 + i3*nb3 = b[i0, i1, i2, i3]")
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
_POSITIVE = (0.25, 1.0, 2.0, 4.0)
_X = (-2.0, -0.5, 0.0, 1.5)
for _k, _x, _e, _s in (
        ("SQR", _X, (4.0, 0.25, 0.0, 2.25), ""), ("SQRT", _POSITIVE, (0.5, 1.0, 1.4142136, 2.0), "; x < 0 gives NaN"),
        ("LOG", _POSITIVE, (-1.3862944, 0.0, 0.69314718, 1.3862944), "; log(0) = -inf, x < 0 gives NaN"),
        ("SIN", _X, (-0.90929743, -0.47942554, 0.0, 0.99749499), "; sin(+-inf) = NaN"),
        ("COS", _X, (-0.41614684, 0.87758256, 1.0, 0.070737202), "; cos(+-inf) = NaN")):
    spec(_k, ELEMENTWISE_SHAPE, IEEE_SPECIAL + _s, ex(_e, a=f32((4,), *_x), rtol=1e-6),
         "elementwise, as correctly rounded (or within a few ulp for sin/cos/log in float32) from the exact value")
define("SUM", Op.SUM, A, lambda d, s, p: Out(s["a"].type, (1, 1, 1, 1)), "sum of all elements",
       grad={"a": lambda B, n, g: B.repeat(g, n.src[0])})
spec("SUM", "a's type, ne [1, 1, 1, 1]", REDUCE_SPECIAL,
     ex((21.0,), a=f32((3, 2), 1, 2, 3, 4, 5, 6)), "out = sum over every element (accumulated in at least float32)")
define("SUM_ROWS", Op.SUM_ROWS, A, lambda d, s, p: Out(s["a"].type, _rows(s["a"])), "sum over dim 0",
       grad={"a": lambda B, n, g: B.repeat(g, n.src[0])})
spec("SUM_ROWS", "a's type, ne [1, ne1, ne2, ne3]", REDUCE_SPECIAL,
     ex((6.0, 15.0), a=f32((3, 2), 1, 2, 3, 4, 5, 6)), "out[0, i1, i2, i3] = sum_i0 a[i0, i1, i2, i3]")
define("MEAN", Op.MEAN, A, lambda d, s, p: Out(F32, _rows(s["a"])), "mean over dim 0 (per row)",
       # a zero-extent row holds no element, so its gradient is empty: any finite scale gives that, 1/0 raised
       grad={"a": lambda B, n, g: B.repeat(B.scale(g, 1.0 / max(n.src[0].ne[0], 1)), n.src[0])})
spec("MEAN", "F32, ne [1, ne1, ne2, ne3]", REDUCE_SPECIAL,
     ex((2.0, 5.0), a=f32((3, 2), 1, 2, 3, 4, 5, 6)), "out[0, i1, i2, i3] = (sum_i0 a[i0, i1, i2, i3]) / ne0")
define("ARGMAX", Op.ARGMAX, (Src("a", ONLY_F32),), _argmax_rule,
       "index of each row's maximum (the last one on ties)", nmse=0.0, nograd="integer result")
spec("ARGMAX", "I32 [ne1]; a a matrix (ne2 = ne3 = 1)",
     "scan i0 = 0.. with max = -inf, idx = 0: max = MAX(max, x) (C's a > b ? a : b), then idx = i0 if max == x; "
     "so a tie gives the last index, a NaN is never the maximum, and a row of NaN gives 0",
     ex((2, 3), a=f32((4, 2), 1, 3, 3, 0, -1, -5, -2, -1), note="ties: the last index of the maximum"),
     "out[i1] = index of the maximum of row i1")
define("COUNT_EQUAL", Op.COUNT_EQUAL, (Src("a", frozenset({I32})), Src("b", frozenset({I32}))),
       _count_equal_rule, "number of equal elements of a and b", nmse=0.0, nograd="integer result")
spec("COUNT_EQUAL", "I64 [1, 1, 1, 1]; a and b I32 of one shape", "integers only: no special values",
     ex((2,), a=(I32, (4,), (1, 2, 3, 4)), b=(I32, (4,), (1, 0, 3, 0))), "out = number of i with a[i] == b[i]")
define("REPEAT", Op.REPEAT, (Src("a", ANY_PLAIN), Src("b", ANY_PLAIN)), _repeat_rule,
       "a tiled to b's shape (only b's shape is read)",
       grad={"a": lambda B, n, g: B.repeat_back(g, n.src[0]), "b": IGNORE})
spec("REPEAT", "a's type, b's shape; each of b's extents a multiple of a's (b's values are not read)",
     COPY_SPECIAL, ex((1, 2, 1, 2, 1, 2, 1, 2), a=f32((2,), 1, 2), b=f32((4, 2), 0, 0, 0, 0, 0, 0, 0, 0)),
     "out[i0, i1, i2, i3] = a[i0 mod a.ne0, i1 mod a.ne1, i2 mod a.ne2, i3 mod a.ne3]")
define("REPEAT_BACK", Op.REPEAT_BACK, (Src("a", FLOATS), Src("b", ANY_PLAIN)), _repeat_back_rule,
       "sum of a's tiles, giving b's shape (adjoint of REPEAT)",
       grad={"a": lambda B, n, g: B.repeat(g, n.src[0]), "b": IGNORE})
spec("REPEAT_BACK", "a's type, b's shape; each of a's extents a multiple of b's", REDUCE_SPECIAL,
     ex((4.0, 6.0), a=f32((4,), 1, 2, 3, 4), b=f32((2,), 0, 0)),
     "out[j] = sum of a[i] over every i with i_k mod b.ne_k = j_k in each dim k")
define("CONCAT", Op.CONCAT, (Src("a", ANY_PLAIN), Src("b", ANY_PLAIN)), _concat_rule,
       "a and b (same type) joined along dim; every other extent must match",
       params=(Param("dim", int, min=0, max=3, doc="dim to concatenate along, 0..3"),),
       grad={"a": _concat_part(0), "b": _concat_part(1)})
spec("CONCAT", "a's type; a and b of one type, equal extents except along dim; ne[dim] = a.ne[dim] + b.ne[dim]",
     COPY_SPECIAL, ex((1, 2, 3, 4, 5), a=f32((2,), 1, 2), b=f32((3,), 3, 4, 5), dim=0),
     "out[i] = a[i] where i[dim] < a.ne[dim], else b[i with i[dim] - a.ne[dim]]")
define("SILU_BACK", Op.SILU_BACK, (Src("grad", FLOATS), Src("x", FLOATS)), _pair_rule("grad", "x"),
       "grad * s(x) * (1 + x (1 - s(x))), s the logistic sigmoid")
spec("SILU_BACK", "grad's type and shape; grad and x of one shape", IEEE_SPECIAL,
     ex((0.072329488, 0.5, 2.1815685), grad=f32((3,), 1, 1, 2), x=f32((3,), -1, 0, 2)),
     "out = grad * s * (1 + x * (1 - s)), s = 1 / (1 + exp(-x)): the derivative of x * s(x) times grad")
define("NORM", Op.NORM, (Src("a", ONLY_F32),), same_as(), "(x - mean) / sqrt(var + eps) per row",
       params=EPS, inplace=True, grad={"a": _norm_grad})
spec("NORM", "a's type and shape (F32)", NORM_SPECIAL,
     ex((-1.3416408, -0.4472136, 0.4472136, 1.3416408), a=f32((4,), 1, 2, 3, 4), eps=0.0),
     "per row: mean = sum(x)/n, var = sum((x - mean)^2)/n (the biased variance), out = (x - mean) / sqrt(var + eps); "
     "eps is added inside the square root")
define("RMS_NORM", Op.RMS_NORM, (Src("a", ONLY_F32),), same_as(), "x / sqrt(mean(x^2) + eps) per row",
       params=EPS, inplace=True, grad={"a": lambda B, n, g: B.rms_norm_back(g, n.src[0], n.params["eps"])})
spec("RMS_NORM", "a's type and shape (F32)", NORM_SPECIAL,
     ex((0.36514837, 0.73029674, 1.0954451, 1.4605935), a=f32((4,), 1, 2, 3, 4), eps=0.0),
     "per row: out = x / sqrt(sum(x^2)/n + eps); eps is added inside the square root (not to the root)")
define("RMS_NORM_BACK", Op.RMS_NORM_BACK, (Src("dz", ONLY_F32), Src("x", ONLY_F32)), _pair_rule("dz", "x"),
       "gradient of rms_norm: (dz - x <x,dz>/(sum x^2 + n eps)) / sqrt(mean(x^2) + eps)", params=EPS)
spec("RMS_NORM_BACK", "dz's type and shape; dz and x of one shape (F32)", NORM_SPECIAL,
     ex((0.35297676, -0.024343225, -0.036514837, -0.04868645), dz=f32((4,), 1, 0, 0, 0), x=f32((4,), 1, 2, 3, 4),
        eps=0.0),
     "per row, n = ne0, ss = sum(x^2): out = (dz - x * sum(x*dz) / (ss + n*eps)) / sqrt(ss/n + eps)")
define("GROUP_NORM", Op.GROUP_NORM, (Src("a", ONLY_F32),), same_as(),
       "(x - mean) / sqrt(var + eps) over groups of ceil(ne2 / n_groups) channels (dim 2): "
       "mean and var over ne0*ne1*channels, per i3",
       params=(Param("n_groups", int, min=1, max=INT32_MAX), Param("eps", float, 1e-6, min=0.0)), inplace=True)
spec("GROUP_NORM", "a's type and shape (F32)", NORM_SPECIAL,
     ex((-1.3416408, -0.4472136, 0.4472136, 1.3416408), a=f32((2, 1, 2), 1, 2, 3, 4), n_groups=1, eps=0.0),
     "channels are dim 2; group g holds channels [g*c, min((g+1)*c, ne2)) with c = ceil(ne2 / n_groups); for each "
     "group and each i3: mean and biased variance over the ne0*ne1*channels elements, out = (x - mean) / "
     "sqrt(var + eps)")
define("L2_NORM", Op.L2_NORM, (Src("a", ONLY_F32),), same_as(), "x / max(||x||_2, eps) per row",
       params=(Param("eps", float, 0.0, min=0.0, doc="lower bound of the row norm"),), inplace=True)
spec("L2_NORM", "a's type and shape (F32)", NORM_SPECIAL,
     ex((0.6, 0.8), a=f32((2,), 3, 4), eps=0.0), "per row: out = x / max(sqrt(sum(x^2)), eps)")
QAB = (Src("a", FLOATS | QUANT_WEIGHTS), Src("b", FLOATS))
define("MUL_MAT", Op.MUL_MAT, QAB, _mul_mat_rule,
       "out[m,n] = sum_k a[k,m] b[k,n]; a's dims 2,3 broadcast blockwise; a quantized a needs an f32 b "
       "(the reference uses a's dequantized values)", nmse=5e-4,
       grad={"a": _mul_mat_grad_a, "b": lambda B, n, g: B.out_prod(n.src[0], B.transpose(g))})
spec("MUL_MAT", "F32 [a.ne1, b.ne1, b.ne2, b.ne3]; a.ne0 = b.ne0 (the summed dim k); a.ne2 divides b.ne2 and "
     "a.ne3 divides b.ne3; a not transposed (nb0 <= nb1); a of a block type needs an F32 b", REDUCE_SPECIAL,
     ex((17.0, 39.0), a=f32((2, 2), 1, 2, 3, 4), b=f32((2,), 5, 6),
        note="a's rows are [1, 2] and [3, 4]: out[m] = a's row m . b (ggml's mul_mat(a, b) is b x a^T)"),
     "out[m, n, i2, i3] = sum_k a[k, m, i2 / (b.ne2 / a.ne2), i3 / (b.ne3 / a.ne3)] * b[k, n, i2, i3]: a's "
     "matrices broadcast blockwise (integer division), not by modulo. Block-type a: its dequantized values "
     "(the reference is exact; ggml's CPU quantizes b to the weight type's dot-product partner, Q8_0/Q8_1/Q8_K, "
     "which the NMSE bound allows). An F16/BF16 a with an F32 b: b's values are first rounded to a's type (ggml's "
     "CPU converts b to the weight's dot-product type, F16 or BF16 itself: a KV cache in F16 times F32 queries "
     "multiplies F16-rounded queries); then products of the exact values, summed in at least float32.")
define("OUT_PROD", Op.OUT_PROD, QAB, _out_prod_rule,
       "out[i,j] = sum_t a[i,t] b[j,t]; a's dims 2,3 broadcast blockwise", nmse=5e-4)
spec("OUT_PROD", "F32 [a.ne0, b.ne0, b.ne2, b.ne3]; a.ne1 = b.ne1 (the summed dim t); a's dims 2, 3 divide "
     "b's; a not transposed; a of a block type needs an F32 b", REDUCE_SPECIAL,
     ex((3.0, 6.0, 4.0, 8.0, 5.0, 10.0), a=f32((2,), 1, 2), b=f32((3,), 3, 4, 5)),
     "out[i, j, i2, i3] = sum_t a[i, t, i2 / (b.ne2 / a.ne2), i3 / (b.ne3 / a.ne3)] * b[j, t, i2, i3]")
define("SCALE", Op.SCALE, A, same_as(), "x * s + b",
       params=(Param("s", float), Param("b", float, 0.0)), inplace=True, family="unary",
       grad={"a": lambda B, n, g: B.scale(g, n.params["s"])})
spec("SCALE", ELEMENTWISE_SHAPE, IEEE_SPECIAL + "; with b = 0 ggml computes x * s only, so -0.0 * 2 = -0.0 "
     "(adding +0.0 would give +0.0)",
     ex((-3.0, 0.0, 1.0, 4.0), a=f32((4,), -2, -0.5, 0, 1.5), s=2.0, b=1.0), "out = x * s + b (b = 0: x * s)")
define("CPY", Op.CPY, (Src("a", ANY_PLAIN | QUANTIZED), Src("b", ANY_PLAIN | QUANTIZED)), _cpy_rule,
       "a's elements, in row-major order, converted and written into b; the result is b (block types: "
       "f32 -> quantized with ggml's reference quantizer, quantized -> f32 dequantized, same type: blocks copied)",
       nmse=1e-6,
       grad={"a": lambda B, n, g: _like(B, g, n.src[0]), "b": IGNORE})
spec("CPY", "the result is b (a view of it): b's type and shape; a and b hold the same number of elements; "
     "block types convert to and from F32 only", COPY_SPECIAL + ". Float to integer: truncation toward zero; NaN, "
     "infinities and values out of the integer range are undefined in ggml (C's conversion) and not tested",
     ex((0.0999755859375, 1.0009765625, -2.5, 65504.0), a=f32((4,), 0.1, 1.0005, -2.5, 65504.0),
        b=(F16, (4,), (0, 0, 0, 0)), note="F32 -> F16 rounds to nearest even (1.0005 lies between 1 and "
        "1 + 2^-10, nearer the latter)"),
     "element k of a in row-major order (i0 fastest) goes to element k of b in row-major order, converted to b's "
     "type: F16/BF16 round to nearest even (beyond the largest finite value: infinity); to an integer type: "
     "truncation toward zero; F32 -> block type: ggml's reference quantizer, row by row (no importance matrix); "
     "block type -> F32: dequantized; same type: bits (or blocks) copied unchanged")
define("CONT", Op.CONT, (Src("a", ANY_PLAIN | QUANTIZED),), _cont_rule,
       "contiguous copy of a, optionally with a new shape of equal element count",
       params=(Param("ne", tuple, ()),), grad={"a": lambda B, n, g: _like(B, g, n.src[0])})
spec("CONT", "a's type; ne = the param ne, or a's (same element count); a block type's ne0 a multiple of "
     "its block size", COPY_SPECIAL, ex((1, 2, 3, 4), a=f32((2, 2), 1, 2, 3, 4), ne=(4, 1, 1, 1)),
     "the elements of a in row-major order written contiguously (as CPY into a new tensor of a's type)")
define("RESHAPE", Op.RESHAPE, (Src("a", ANY_PLAIN | QUANTIZED),), _reshape_rule,
       "view of contiguous a with a new shape", params=(Param("ne", tuple),), view_only=True,
       grad={"a": lambda B, n, g: _like(B, g, n.src[0])})
spec("RESHAPE", "a view of a (contiguous) with extents ne (same element count)", "a view: nothing is computed",
     ex((1, 2, 3, 4), a=f32((2, 2), 1, 2, 3, 4), ne=(4, 1, 1, 1)),
     "the same memory read with contiguous strides for ne")
define("VIEW", Op.VIEW, (Src("a", ANY_PLAIN | QUANTIZED),), _view_rule,
       "view of a's memory with extents ne, strides (elem, nb1, nb2, nb3), byte offset",
       params=(Param("ne", tuple), Param("nb", tuple), Param("offset", int, 0, min=0)), view_only=True,
       grad={"a": _view_grad})
spec("VIEW", "a view of a's memory: extents ne, strides (element size, nb1, nb2, nb3) bytes, byte offset; it must "
     "lie inside a's storage", "a view: nothing is computed",
     ex((2.0, 3.0), a=f32((4,), 1, 2, 3, 4), ne=(2, 1, 1, 1), nb=(8, 8, 8), offset=4),
     "element [i0, i1, i2, i3] of the view is the element at byte offset + i0*elem + i1*nb1 + i2*nb2 + i3*nb3")
define("PERMUTE", Op.PERMUTE, (Src("a", ANY_PLAIN | QUANTIZED),), _permute_rule,
       "view with source dim k moved to position axes[k]",
       params=(Param("axes", tuple, length=4),), view_only=True, grad={"a": _inverse_permute})
spec("PERMUTE", "a view: source dim k becomes dim axes[k] (extents and strides move together)",
     "a view: nothing is computed", ex((1, 3, 5, 2, 4, 6), a=f32((2, 3), 1, 2, 3, 4, 5, 6), axes=(1, 0, 2, 3)),
     "result.ne[axes[k]] = a.ne[k], result.nb[axes[k]] = a.nb[k]")
define("TRANSPOSE", Op.TRANSPOSE, (Src("a", ANY_PLAIN | QUANTIZED),), _transpose_rule,
       "view with dims 0 and 1 swapped", view_only=True, grad={"a": lambda B, n, g: B.transpose(g)})
spec("TRANSPOSE", "a view with ne0/ne1 and nb0/nb1 swapped", "a view: nothing is computed",
     ex((1, 3, 5, 2, 4, 6), a=f32((2, 3), 1, 2, 3, 4, 5, 6)), "result[i0, i1] = a[i1, i0]")
define("GET_ROWS", Op.GET_ROWS, (Src("a", FLOATS | {I32} | QUANTIZED), Src("b", frozenset({I32}))),
       _get_rows_rule, "out[:, i, j, k] = a[:, b[i, j, k], j, k] (f32 result; I32 rows copied exactly; "
       "quantized rows dequantized)", grad={"a": _get_rows_grad, "b": IGNORE})
spec("GET_ROWS", "F32 [a.ne0, b.ne0, b.ne1, b.ne2] (I32 for an I32 a); b I32 [m, a.ne2, a.ne3]",
     COPY_SPECIAL + "; an index outside [0, a.ne1) is an error in ggml (not tested)",
     ex((5.0, 6.0, 1.0, 2.0), a=f32((2, 3), 1, 2, 3, 4, 5, 6), b=(I32, (2,), (2, 0))),
     "out[:, i, j, k] = a[:, b[i, j, k], j, k], converted to F32 (F16/BF16 exactly; block types dequantized)")
define("GET_ROWS_BACK", Op.GET_ROWS_BACK,
       (Src("a", FLOATS), Src("b", frozenset({I32})), Src("c", ANY_PLAIN)), _get_rows_back_rule,
       "zeros of c's shape with row b[i] += a[:, i] (adjoint of GET_ROWS)")
spec("GET_ROWS_BACK", "F32 of c's shape [n, rows]; a [n, m], b I32 [m]", REDUCE_SPECIAL,
     ex((0.0, 0.0, 4.0, 6.0, 0.0, 0.0), a=f32((2, 2), 1, 2, 3, 4), b=(I32, (2,), (1, 1)),
        c=f32((2, 3), 0, 0, 0, 0, 0, 0),
        note="both rows of a go to row 1"),
     "out = zeros of c's shape; for each i: out[:, b[i]] += a[:, i] (c's values are not read)")
define("DIAG", Op.DIAG, (Src("a", ONLY_F32),), _diag_rule,
       "a [n, 1, ne2, ne3] -> [n, n, ne2, ne3] with a on the diagonal and 0 elsewhere")
spec("DIAG", "a's type, [n, n, ne2, ne3] for a [n, 1, ne2, ne3]", COPY_SPECIAL,
     ex((1, 0, 0, 0, 2, 0, 0, 0, 3), a=f32((3,), 1, 2, 3)), "out[i, j] = a[i] if i == j else 0")
for _op, _f in ((Op.DIAG_MASK_INF, "-inf"), (Op.DIAG_MASK_ZERO, "0")):
    define(_op.name, _op, (Src("a", ONLY_F32),), same_as(),
           f"element (i, j) of each matrix set to {_f} where column i > n_past + row j",
           params=(Param("n_past", int, min=INT32_MIN, max=INT32_MAX),), inplace=True,
           grad={"a": lambda B, n, g: B.diag_mask_zero(g, n.params["n_past"])})
    _m = -math.inf if _op == Op.DIAG_MASK_INF else 0.0
    spec(_op.name, "a's type and shape (F32)", COPY_SPECIAL + " outside the masked triangle",
         ex((1, _m, _m, 4, 5, _m, 7, 8, 9), a=f32((3, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9), n_past=0),
         f"out[i0, i1, i2, i3] = {_f} if i0 > n_past + i1 else a[i0, i1, i2, i3] (i0 the column, i1 the row): "
         "a causal mask over each matrix")
define("SOFT_MAX", Op.SOFT_MAX,
       (Src("a", ONLY_F32), Src("mask", frozenset({F16, F32}), True), Src("sinks", ONLY_F32, True)),
       _soft_max_rule, "row softmax of a*scale + slope*mask (ALiBi slope from max_bias; optional sinks)",
       params=(Param("scale", float, 1.0), Param("max_bias", float, 0.0, min=0.0)), inplace=True, nmse=1e-6,
       grad={"a": lambda B, n, g: B.soft_max_ext_back(g, n, n.params["scale"], n.params["max_bias"])},
       nograd="the gradients of the mask and the sinks are not implemented (as in ggml)")
spec("SOFT_MAX", "F32 of a's shape; a contiguous; mask (F16/F32, contiguous) [a.ne0, >= a.ne1, m2, m3] with m2 "
     "dividing a.ne2 and m3 dividing a.ne3; sinks F32 [a.ne2]; max_bias > 0 needs a mask",
     "a row whose entries are all -inf (after the mask) gives NaN (0/0), as in ggml; a mask entry of -inf gives "
     "weight exactly 0; NaN in a propagates to its row",
     ex((0.09926141, 0.25347289, 0.6472657, 0.09058596, 0.24527818, 0.66413586),
        a=f32((3, 1, 2), 1, 2, 3, 1, 2, 3), mask=f32((3,), 0, -1, -2), max_bias=8.0,
        note="two heads: slopes 2^(-8/2)^1 = 1/16 and (1/16)^2 = 1/256 multiply the mask row [0, -1, -2]"),
     "x = a * scale + slope(i2) * mask[i0, i1, i2 mod m2, i3 mod m3] (mask 0 when absent), rounded to float32; "
     "per row: out = exp(x - max) / sum(exp(x - max)). ALiBi slope of head h = i2, with n_head = a.ne2, "
     "L = 2^floor(log2(n_head)), m0 = 2^(-max_bias / L), m1 = 2^(-max_bias / (2 L)): slope = m0^(h+1) if h < L "
     "else m1^(2(h - L) + 1); slope = 1 when max_bias = 0. Sinks: s = sinks[i2] takes part in the max "
     "(max = max(max_i x_i, s)) and adds exp(s - max) to the denominator only; it has no output column.")
define("SOFT_MAX_BACK", Op.SOFT_MAX_BACK, (Src("dy", ONLY_F32), Src("y", ONLY_F32)), _pair_rule("dy", "y"),
       "scale * y * (dy - <y, dy>) per row",
       params=(Param("scale", float, 1.0), Param("max_bias", float, 0.0, min=0.0)), nmse=1e-6)
spec("SOFT_MAX_BACK", "dy's type and shape; dy and y of one shape", IEEE_SPECIAL,
     ex((0.16, -0.06, -0.1), dy=f32((3,), 1, 0, 0), y=f32((3,), 0.2, 0.3, 0.5)),
     "per row: out = scale * y * (dy - sum(y * dy)); y is softmax's output; max_bias is carried for ggml's "
     "interface and not used")
define("CLAMP", Op.CLAMP, A, _clamp_rule, "min(max(x, min), max)",
       params=(Param("min", float), Param("max", float)), inplace=True, family="unary",
       grad={"a": lambda B, n, g: B.mul(g, _step_between(B, n.src[0], n.params["min"], n.params["max"]))})
spec("CLAMP", ELEMENTWISE_SHAPE + "; min <= max",
     "MAX(MIN(x, max), min) with C's MIN(a, b) = a < b ? a : b and MAX(a, b) = a > b ? a : b: NaN gives max",
     ex((-1.0, -0.5, 0.0, 1.0), a=f32((4,), -2, -0.5, 0, 1.5), min=-1.0, max=1.0), "out = MAX(MIN(x, max), min)")
define("PAD", Op.PAD, (Src("a", ONLY_F32),), _pad_rule,
       "a with lp_i / rp_i elements added before / after dim i: zeros, or a's values wrapped around "
       "(circular)",
       params=tuple(Param(n, int, 0, min=0, max=INT32_MAX) for n in _PADS) + (Param("circular", bool, False),))
spec("PAD", "a's type, ne_i = a.ne_i + lp_i + rp_i", COPY_SPECIAL,
     ex((0.0, 1.0, 2.0, 0.0, 0.0), a=f32((2,), 1, 2), lp0=1, rp0=2),
     "out[i] = a[i - lp] where every i_k - lp_k lies in [0, a.ne_k), else 0; circular: "
     "a[(i_k - lp_k) mod a.ne_k] in every dim")
define("PAD_REFLECT_1D", Op.PAD_REFLECT_1D, (Src("a", ONLY_F32),), _pad_reflect_rule,
       "a with p0 / p1 elements mirrored before / after each row, the edge not repeated",
       params=(Param("p0", int, min=0, max=INT32_MAX), Param("p1", int, min=0, max=INT32_MAX)))
spec("PAD_REFLECT_1D", "a's type, [ne0 + p0 + p1, ne1, ne2, ne3]; a contiguous; p0, p1 < ne0", COPY_SPECIAL,
     ex((2.0, 1.0, 2.0, 3.0, 2.0, 1.0), a=f32((3,), 1, 2, 3), p0=1, p1=2),
     "out[p0 + i] = a[i]; out[p0 - j] = a[j] and out[p0 + ne0 - 1 + j] = a[ne0 - 1 - j] for j = 1..p")
define("ARANGE", Op.ARANGE, (), _arange_rule,
       "F32 [ceil((stop - start) / step)]: start + i * step (no source tensor)",
       params=(Param("start", float), Param("stop", float), Param("step", float, 1.0)))
spec("ARANGE", "F32 [ceil((stop - start) / step)] computed in float32; stop > start, step > 0", "finite params only",
     ex((0.0, 0.25, 0.5, 0.75), start=0.0, stop=1.0, step=0.25), "out[i] = start + i * step")
define("TIMESTEP_EMBEDDING", Op.TIMESTEP_EMBEDDING, (Src("timesteps", ONLY_F32),), _timestep_rule,
       "F32 [dim, N]: cos(t f_j) at j, sin(t f_j) at j + dim/2, f_j = max_period^(-j / (dim/2)); "
       "odd dim: last column 0",
       params=(Param("dim", int, min=1, max=INT32_MAX), Param("max_period", int, 10000, min=1, max=INT32_MAX)))
spec("TIMESTEP_EMBEDDING", "F32 [dim, N] for timesteps F32 [N] (contiguous)", IEEE_SPECIAL,
     ex((-0.41614684, 0.99980001, 0.90929743, 0.019998667), timesteps=f32((1,), 2.0), dim=4, max_period=10000),
     "half = floor(dim / 2), f_j = exp(-ln(max_period) * j / half): out[j] = cos(t f_j), out[j + half] = sin(t f_j) "
     "for j < half; odd dim: out[dim - 1] = 0")
define("ARGSORT", Op.ARGSORT, (Src("a", ONLY_F32),), _argsort_rule,
       "I32 indices that sort each row ASC or DESC (tie order unspecified in ggml; stable here)",
       params=(Param("order", SortOrder, SortOrder.ASC),), nmse=0.0, nograd="integer result")
spec("ARGSORT", "I32 of a's shape (F32 a)", "NaN has no defined place (ggml's comparison sort); not tested",
     ex((1, 3, 0, 2), a=f32((4,), 0.5, -1, 2, 0)),
     "per row: the indices i0 ordered so that a[out[0]] <= a[out[1]] <= ... (DESC: >=); ties in any order in ggml, "
     "stable here; the suite uses distinct values")
define("LEAKY_RELU", Op.LEAKY_RELU, A, same_as(), "max(x, 0) + negative_slope * min(x, 0)",
       params=(Param("negative_slope", float),), inplace=True, family="unary",
       grad={"a": lambda B, n, g: B.mul(g, B.scale_bias(B.step(n.src[0]), 1.0 - n.params["negative_slope"],
                                                          n.params["negative_slope"]))})
spec("LEAKY_RELU", ELEMENTWISE_SHAPE,
     "(x > 0 ? x : 0) + negative_slope * (x < 0 ? x : 0): NaN gives +0.0, -0.0 gives +0.0",
     ex((-0.2, -0.05, 0.0, 1.5), a=f32((4,), -2, -0.5, 0, 1.5), negative_slope=0.1),
     "out = (x > 0 ? x : 0) + negative_slope * (x < 0 ? x : 0)")

UNARY_DOCS = {
    UnaryOp.ABS: "|x|", UnaryOp.SGN: "sign(x), 0 at 0", UnaryOp.NEG: "-x", UnaryOp.STEP: "1 if x > 0 else 0",
    UnaryOp.TANH: "tanh(x)", UnaryOp.ELU: "x if x > 0 else expm1(x)", UnaryOp.RELU: "max(x, 0)",
    UnaryOp.SIGMOID: "1 / (1 + exp(-x))",
    UnaryOp.GELU: "0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) read from ggml's F16 table: 0 for "
                  "x <= -10, x for x >= 10, else the table entry of f16(x) (the function in float32, rounded "
                  "to F16)",
    UnaryOp.GELU_QUICK: "x * sigmoid(1.702 x) read from ggml's F16 table at f16(x) (no clamp)",
    UnaryOp.SILU: "x * sigmoid(x)",
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
# Worked examples of the unary sub-ops (values from the formulas by hand, 8 digits) and what their C
# expressions give for NaN and signed zeros (comparisons with NaN are false). GELU and GELU_QUICK: the
# formula at x (exactly an F16 value here), rounded to the F16 grid by hand: gelu(-2) = -0.0454023 is
# -1487.74 steps of 2^-15, so -1488 * 2^-15; gelu(-0.5) = -0.1542860 -> -1264 * 2^-13; gelu(1.5) =
# 1.3995716 -> 1433 * 2^-10; quick: -0.0643414 -> -1054 * 2^-14, -0.1496116 -> -1226 * 2^-13,
# 1.3916622 -> 1425 * 2^-10 (none within 0.05 steps of a tie, where float32 evaluation could matter).
_ROUNDING_X = (-2.5, -0.5, 0.4, 1.5)
UNARY_EXAMPLES = {
    "ABS": (2.0, 0.5, 0.0, 1.5), "SGN": (-1.0, -1.0, 0.0, 1.0), "NEG": (2.0, 0.5, -0.0, -1.5),
    "STEP": (0.0, 0.0, 0.0, 1.0), "TANH": (-0.96402758, -0.46211716, 0.0, 0.90514825),
    "ELU": (-0.86466472, -0.39346934, 0.0, 1.5), "RELU": (0.0, 0.0, 0.0, 1.5),
    "SIGMOID": (0.11920292, 0.37754067, 0.5, 0.81757448), "GELU": (-0.04541015625, -0.154296875, 0.0, 1.3994140625),
    "GELU_QUICK": (-0.0643310546875, -0.149658203125, 0.0, 1.3916015625),
    "SILU": (-0.23840584, -0.18877033, 0.0, 1.2263617),
    "HARDSWISH": (-0.33333333, -0.20833333, 0.0, 1.125), "HARDSIGMOID": (0.16666667, 0.41666667, 0.5, 0.75),
    "EXP": (0.13533528, 0.60653066, 1.0, 4.4816891), "EXPM1": (-0.86466472, -0.39346934, 0.0, 3.4816891),
    "SOFTPLUS": (0.12692801, 0.47407698, 0.69314718, 1.7014133),
    "GELU_ERF": (-0.045500264, -0.15426877, 0.0, 1.3997892),
    "XIELU": (0.89725955, -0.071976544, -1.6710998e-06, 3.3849765),
    "FLOOR": (-3.0, -1.0, 0.0, 1.0), "CEIL": (-2.0, -0.0, 1.0, 2.0), "ROUND": (-3.0, -1.0, 0.0, 2.0),
    "TRUNC": (-2.0, -0.0, 0.0, 1.0),
}
UNARY_SPECIAL = {
    "SGN": "x > 0 ? 1 : (x < 0 ? -1 : 0): NaN gives 0, -0.0 gives +0.0",
    "RELU": "x > 0 ? x : 0: NaN gives 0, -0.0 gives +0.0",
    "STEP": "x > 0 ? 1 : 0: NaN gives 0",
    "HARDSIGMOID": "fminf(1, fmaxf(0, (x + 3) / 6)): NaN gives 0 (fmaxf drops the NaN)",
    "HARDSWISH": "x * fminf(1, fmaxf(0, (x + 3) / 6)): NaN gives NaN (x * 0 with x NaN)",
    "ELU": "x > 0 ? x : expm1(x): -0.0 gives -0.0, NaN gives NaN",
    "ROUND": "C's roundf: half away from zero, the sign kept (-0.4 gives -0.0)",
    "ABS": "|-0.0| = +0.0; NaN stays NaN", "NEG": "-(+0.0) = -0.0; NaN stays NaN",
    "SOFTPLUS": "x > 20 returns x itself (no overflow of exp); NaN gives NaN",
    "XIELU": "at x = 0 the negative branch applies: (expm1(eps) - 0) * an, a tiny negative value",
}
for _u in UnaryOp:
    spec(_u.name, ELEMENTWISE_SHAPE, UNARY_SPECIAL.get(_u.name, IEEE_SPECIAL),
         ex(UNARY_EXAMPLES[_u.name], a=f32((4,), *(_ROUNDING_X if _u.name in PIECEWISE_CONSTANT - {"SGN", "STEP"}
                                                 else _X)), rtol=2e-6),
         "elementwise: out = " + UNARY_DOCS[_u] + "; float32 math where ggml uses it (a few ulp), F16/BF16 "
         "results rounded once from the float32 value"
         + ("; defaults alpha_n = alpha_p = 0.8, beta = 0.5, eps = -1e-6; softplus(y) = ln(1 + e^y)"
            if _u == UnaryOp.XIELU else ""))

LABELS = ONLY_F32 | frozenset({I32})
SPARSE_LABELS = ("; or b I32 [a.ne1, a.ne2, a.ne3], one class index per row, the one-hot rows' sparse form (a "
                 "Prism extension: a language model's labels without an F32 [n_vocab, n_tokens] tensor; an index "
                 "outside [0, a.ne0) is refused when computed)")
define("CROSS_ENTROPY_LOSS", Op.CROSS_ENTROPY_LOSS, (Src("a", ONLY_F32), Src("b", LABELS)), _loss_rule,
       "-(1/nrows) sum_rows sum_i b_i log_softmax(a)_i; b holds label distributions, or class indices (I32)",
       grad={"a": lambda B, n, g: B.cross_entropy_loss_back(g, n.src[0], n.src[1])},
       nograd="the gradient of the labels is not implemented (as in ggml)")
spec("CROSS_ENTROPY_LOSS", "F32 [1, 1, 1, 1]; a (logits) and b (label distributions) of one shape" + SPARSE_LABELS,
     "log_softmax via the row max; b = 0 where a is -inf contributes 0 in ggml's form only if finite: not tested",
     ex((0.40760596,), a=f32((3,), 1, 2, 3), b=f32((3,), 0, 0, 1)),
     "loss = -(1 / nrows) * sum_rows sum_i b[i] * (a[i] - max - ln(sum_j exp(a[j] - max))); with class indices "
     "k = b[row]: -(1 / nrows) * sum_rows (a[k] - max - ln(sum_j exp(a[j] - max)))")
define("CROSS_ENTROPY_LOSS_BACK", Op.CROSS_ENTROPY_LOSS_BACK,
       (Src("grad", ONLY_F32), Src("a", ONLY_F32), Src("b", LABELS)), _loss_back_rule,
       "(softmax(a) - b) * grad / nrows (I32 b: its one-hot rows)")
spec("CROSS_ENTROPY_LOSS_BACK", "F32 of a's shape; grad a one-element tensor; b as CROSS_ENTROPY_LOSS's",
     IEEE_SPECIAL,
     ex((0.090030573, 0.24472847, -0.33475904), grad=f32((1,), 1.0), a=f32((3,), 1, 2, 3), b=f32((3,), 0, 0, 1)),
     "out = (softmax(a) - b) * grad[0] / nrows, softmax per row; class indices k = b[row]: b's row is 1 at k, "
     "0 elsewhere")
define("OPT_STEP_ADAMW", Op.OPT_STEP_ADAMW,
       tuple(Src(n, ONLY_F32) for n in ("a", "grad", "m", "v", "params")), _opt_step_rule(7, ("m", "v")),
       "AdamW step on a in place; params = [alpha, beta1, beta2, eps, wd, beta1h, beta2h]")
spec("OPT_STEP_ADAMW", "the result is a (updated in place, as are m and v); a a parameter; grad, m, v of a's shape; "
     "params F32 [7]", IEEE_SPECIAL,
     ex((0.9,), a=f32((1,), 1.0), grad=f32((1,), 0.5), m=f32((1,), 0.0), v=f32((1,), 0.0),
        params=f32((7,), 0.1, 0.9, 0.999, 1e-8, 0.0, 10.0, 1000.0),
        note="first step: beta1h = 1/(1 - 0.9) = 10, beta2h = 1/(1 - 0.999) = 1000; m = 0.05, v = 0.00025"),
     "with params = [alpha, beta1, beta2, eps, wd, beta1h, beta2h]: m = beta1 m + (1 - beta1) g; "
     "v = beta2 v + (1 - beta2) g^2; a = a (1 - alpha wd) - alpha (m beta1h) / (sqrt(v beta2h) + eps); "
     "beta1h = 1 / (1 - beta1^t), beta2h = 1 / (1 - beta2^t) are supplied by the caller")
define("OPT_STEP_SGD", Op.OPT_STEP_SGD, tuple(Src(n, ONLY_F32) for n in ("a", "grad", "params")),
       _opt_step_rule(2, ()), "SGD step on a in place; params = [alpha, wd]: a = a (1 - alpha wd) - alpha grad")
spec("OPT_STEP_SGD", "the result is a (updated in place); a a parameter; grad of a's shape; params F32 [2]",
     IEEE_SPECIAL, ex((0.9, 2.0), a=f32((2,), 1, 2), grad=f32((2,), 0.5, -1), params=f32((2,), 0.1, 0.5)),
     "a = a * (1 - alpha * wd) - alpha * grad, params = [alpha, wd]")


GLU_DOCS = {
    GluOp.REGLU: "relu(x) * g", GluOp.SWIGLU: "silu(x) * g",
    GluOp.GEGLU: "gelu(x) * g, gelu as the GELU op (ggml's F16 table; x <= -10 gives 0 whatever g is)",
    GluOp.SWIGLU_OAI: "x' sigmoid(alpha x') (g' + 1), x' = min(x, limit), g' = clamp(g, -limit, limit)",
    GluOp.GEGLU_ERF: "gelu_erf(x) * g",
    GluOp.GEGLU_QUICK: "gelu_quick(x) * g, gelu_quick as the GELU_QUICK op (ggml's F16 table)",
}
GLU_SRCS = (Src("a", FLOATS), Src("b", FLOATS, True))
GLU_SWAPPED = (Param("swapped", bool, False, doc="unsplit form: x is the second half of each row"),)
SWIGLU_OAI_PARAMS = (Param("alpha", float), Param("limit", float, min=0.0))
for _g in GluOp:
    define(_g.name, Op.GLU, GLU_SRCS, _glu_rule,
           GLU_DOCS[_g] + "; x, g = the halves of each row of a (result ne0 = a.ne0 / 2), or x = a, g = b",
           sub=_g, family="glu", params=GLU_SWAPPED + (SWIGLU_OAI_PARAMS if _g == GluOp.SWIGLU_OAI else ()),
           grad={"a": _glu_split_only("a", _g), "b": _glu_split_only("b", _g)} if _g in GLU_DIFFERENTIABLE else {},
           nograd="" if _g in GLU_DIFFERENTIABLE else "derivative rule not written yet (ggml has SWIGLU only)")
# GEGLU, GEGLU_QUICK: F16-rounded gelu(-1) = -0.1588080 -> -1301 * 2^-13 and gelu(2) = 1.9545977 -> 2002 * 2^-10
# (2001.51 steps: 0.01 from a tie, far beyond float32's error), times g; quick: -1263 * 2^-13, 1982 * 2^-10
GLU_EXAMPLES = {"REGLU": (0.0, 1.0), "GEGLU": (-0.4764404296875, 0.9775390625), "SWIGLU": (-0.80682426, 0.88079708),
                "SWIGLU_OAI": (-0.38551059, 2.0874933), "GEGLU_ERF": (-0.47596576, 0.97724987),
                "GEGLU_QUICK": (-0.4625244140625, 0.9677734375)}
for _g in GluOp:
    spec(_g.name, "a's type; split form: [a.ne0 / 2, ne1, ne2, ne3] (a.ne0 even); with b: a's shape (b of a's "
         "shape and type); a (and b) contiguous apart from the row stride", IEEE_SPECIAL,
         ex(GLU_EXAMPLES[_g.name], a=f32((4,), -1.0, 2.0, 3.0, 0.5), rtol=2e-6,
            **({"alpha": 1.702, "limit": 1.5} if _g == GluOp.SWIGLU_OAI else {}),
            note="the row [-1, 2, 3, 0.5] splits into x = [-1, 2] and g = [3, 0.5]"
                 + ("; x' = min(x, 1.5), g' = clamp(g, -1.5, 1.5)" if _g == GluOp.SWIGLU_OAI else "")),
         "split form: x = a[0 : n], g = a[n : 2n] of each row, n = a.ne0 / 2 (swapped: x the second half); "
         "with b: x = a, g = b; out = " + GLU_DOCS[_g])


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
from . import table_attn, table_conv  # noqa: E402,F401,I001

# Listed in ggml's op order (sub-ops in their enum order), whichever module declared them.
for _d in sorted(OPS.values(), key=lambda d: (int(d.op), int(d.sub) if d.sub is not None else -1)):
    OPS[_d.key] = OPS.pop(_d.key)
