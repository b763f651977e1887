"""The op specification: one page per op, generated from the op table.

Everything on a page comes from the op's :class:`~prism_core.ops.table.OpDef` (its sources
and types, params, rule, bound, derivative rules) and the long form beside it
(:class:`~prism_core.ops.table.Spec`: shape rule in words, formula, NaN/inf/-0 behaviour,
a worked example), so the text cannot drift from what the builders check and the
conformance suite certifies. ``prism ops OP``, ``prism ops --markdown DIR`` and
``prism ops --json`` print it.
"""

from __future__ import annotations

import enum
from typing import Any

from ..context import Context
from ..tensor import Tensor
from ..types import INT_TYPES, traits
from .codes import Op
from .params import Param
from .table import IGNORE, OPS, Example, OpDef, describe_types, opdef

# What holds for every op unless its page says otherwise (the reference computes this way,
# and the suite compares against it).
COMMON_RULES = (
    "Values are computed as if exactly from the sources' values (block types: their dequantized values) "
    "and rounded once, to nearest even, to the result type. A kernel that computes in float32 may round "
    "intermediates to float32 where ggml does (the page says where it matters); an F16/BF16 result must be "
    "rounded once from the float32 value: rounding through a second narrower type, or by truncation, "
    "fails the per-element check on ties.",
    "Sources may be strided views (permuted, transposed, sliced) unless the shape rule says contiguous; "
    "the result is contiguous, except for view ops and ops that write into a source.",
)


def _types(types: frozenset) -> list[str]:
    return sorted((traits(t).name for t in types), key=lambda n: (n not in ("f32", "f16", "bf16"), n))


def _kind(p: Param) -> str:
    k = p.kind
    if isinstance(k, type) and issubclass(k, enum.IntEnum):
        return f"{k.__name__} ({', '.join(m.name for m in k)})"
    if k is tuple:
        return f"tuple of {p.length} ints" if p.length else "tuple of ints"
    return k.__name__


def _default(p: Param) -> Any:
    if p.required:
        return None
    d = p.default
    return d.name if isinstance(d, enum.Enum) else list(d) if isinstance(d, tuple) else d


def _range(p: Param) -> str:
    lo = "" if p.min is None else f">= {p.min:g}"
    hi = "" if p.max is None else f"<= {p.max:g}"
    return ", ".join(x for x in (lo, hi) if x)


def derivative(d: OpDef) -> dict[str, str]:
    """Per source: how its gradient is formed, or why there is none."""
    out = {}
    for s in d.srcs:
        r = d.grad.get(s.name)
        if r is None:
            out[s.name] = f"none: {d.nograd or 'no derivative rule yet'}"
        elif r is IGNORE:
            out[s.name] = ("zero almost everywhere (the op is piecewise constant)" if d.key in _PIECEWISE
                           else "none needed: only its indices or shape are read")
        else:
            out[s.name] = "yes (prism_core.autodiff; checked against finite differences)"
    return out


def _piecewise() -> frozenset[str]:
    from .table import PIECEWISE_CONSTANT
    return frozenset(PIECEWISE_CONSTANT)


_PIECEWISE = _piecewise()


def _example(e: Example) -> dict[str, Any]:
    return {"inputs": {k: {"type": traits(t).name, "ne": list(ne), "values": list(v)}
                       for k, (t, ne, v) in e.inputs.items()},
            "params": {k: (v.name if isinstance(v, enum.Enum) else v) for k, v in e.params.items()},
            "expected": list(e.expected), "note": e.note}


def node_src_line(d: OpDef) -> str:
    """``node.src`` of a node of this op, from the table's sources: ``(a, mask|None, sinks|None)``."""
    return "(" + ", ".join(f"{s.name}|None" if s.optional else s.name for s in d.srcs) + ")"


def page(key: str) -> dict[str, Any]:
    """The specification of one op as a JSON-ready dict."""
    from .build import builders_for
    d = opdef(key)
    sp = d.spec
    return {
        "key": d.key, "op": d.op.name, "ggml_op": int(d.op),
        "sub_op": None if d.sub is None else {"name": d.sub.name, "value": int(d.sub)},
        "summary": d.doc,
        "node_src": node_src_line(d),
        "sources": [{"name": s.name, "optional": s.optional, "types": _types(s.types),
                     "types_short": describe_types(s.types)} for s in d.srcs],
        "params": [{"name": p.name, "kind": _kind(p), "required": p.required, "default": _default(p),
                    "range": _range(p), "doc": p.doc} for p in d.params],
        "fixed_params": {k: (v.name if isinstance(v, enum.Enum) else v) for k, v in d.fixed.items()},
        "shape": sp.shape if sp else "", "formula": sp.formula if sp else "",
        "special_values": sp.special if sp else "",
        "view_only": d.view_only, "inplace": d.inplace, "builders": builders_for(d),
        "derivative": derivative(d),
        "conformance": {"nmse_bound": d.nmse, "element_bound": _element_bound(d)},
        "example": _example(sp.example) if sp else None,
        "common_rules": list(COMMON_RULES),
    }


def example_params(d: OpDef, e: Example) -> dict[str, Any]:
    """The example's params as the builders take them (enum members may be written by name)."""
    kinds = {p.name: p.kind for p in d.params}
    out = {}
    for k, v in e.params.items():
        kind = kinds.get(k)
        if isinstance(v, str) and isinstance(kind, type) and issubclass(kind, enum.Enum):
            v = kind[v]
        out[k] = v
    return out


def build_example(key: str, ctx: Context | None = None) -> Tensor:
    """The node of op ``key``'s worked example, its inputs filled in (not computed yet)."""
    import numpy as np

    from .build import node
    d = opdef(key)
    e = d.spec.example
    ctx = ctx or Context()
    srcs = []
    for s in d.srcs:
        if s.name not in e.inputs:
            srcs.append(None)
            continue
        t, ne, values = e.inputs[s.name]
        ne4 = tuple(ne) + (1,) * (4 - len(ne))
        x = ctx.new_tensor(t, ne4, name=s.name)
        host = np.asarray(values, dtype=np.int64 if t in INT_TYPES else np.float32)
        x.set(host.reshape(tuple(reversed(ne4))))
        if d.op in (Op.OPT_STEP_ADAMW, Op.OPT_STEP_SGD) and s.name == "a":
            x.set_param()  # an optimizer step updates a parameter
        srcs.append(x)
    while srcs and srcs[-1] is None:
        srcs.pop()
    return node(d.key, *srcs, ctx=ctx, **example_params(d, e))


def _element_bound(d: OpDef) -> str:
    from ..conformance.accuracy import bound_text
    return bound_text(d)


def all_pages() -> list[dict[str, Any]]:
    return [page(k) for k in OPS]


def _fmt(v: Any) -> str:
    return f"{v:.7g}" if isinstance(v, float) else str(v)


def to_markdown(p: dict[str, Any]) -> str:
    sub = f", sub-op {p['sub_op']['name']} = {p['sub_op']['value']}" if p["sub_op"] else ""
    lines = [f"# {p['key']}", "", f"ggml op {p['op']} = {p['ggml_op']}{sub}.", "", p["summary"], "",
             "## Sources", "", "| `node.src` |", "|---|", "| `" + p["node_src"].replace("|", "\\|") + "` |", ""]
    if not p["sources"]:
        lines.append("none (the result is computed from the params alone)")
    for s in p["sources"]:
        lines.append(f"- `{s['name']}`{' (optional)' if s['optional'] else ''}: {', '.join(s['types'])}")
    lines += ["", "## Params", ""]
    if not p["params"]:
        lines.append("none")
    for q in p["params"]:
        extra = [q["kind"], "required" if q["required"] else f"default {q['default']!r}"]
        if q["range"]:
            extra.append(q["range"])
        lines.append(f"- `{q['name']}` ({'; '.join(extra)})" + (f": {q['doc']}" if q["doc"] else ""))
    if p["fixed_params"]:
        lines.append(f"- fixed by the key: {p['fixed_params']}")
    lines += ["", "## Result and shape rule", "", p["shape"], "", "## Formula", "", p["summary"] + "."]
    if p["formula"]:
        lines += ["", p["formula"]]
    lines += ["", "## NaN, infinities, signed zeros", "", p["special_values"], "",
              "## Variants and builders", "",
              ("result is a view: nothing is computed" if p["view_only"] else "computes a new tensor")
              + ("; in-place variant (result aliases the first source)" if p["inplace"] else "; no in-place variant")
              + "; builders: " + (", ".join(f"`{b}`" for b in p["builders"]) or f"`node({p['key']!r}, ...)`"),
              "", "## Derivative", ""]
    lines += [f"- `{k}`: {v}" for k, v in p["derivative"].items()] or ["no sources"]
    c = p["conformance"]
    lines += ["", "## Conformance", "", f"- NMSE bound: {c['nmse_bound']:g}", f"- per element: {c['element_bound']}",
              "", "## Worked example", ""]
    e = p["example"]
    for name, x in e["inputs"].items():
        lines.append(f"- `{name}`: {x['type']} ne={x['ne']} values {[_fmt(v) for v in x['values']]}")
    if e["params"]:
        lines.append(f"- params: {e['params']}")
    lines.append(f"- result: {[_fmt(v) for v in e['expected']]}")
    if e["note"]:
        lines += ["", e["note"]]
    lines += ["", "## Rules common to every op", ""] + [f"- {r}" for r in p["common_rules"]]
    return "\n".join(lines) + "\n"


def listing_line(d: OpDef) -> list[str]:
    """The lines of ``prism ops`` (the short listing) for one op."""
    from .build import builders_for
    srcs = ", ".join(f"{s.name}{'?' if s.optional else ''}" for s in d.srcs)
    params = ", ".join(p.name + ("" if p.required else f"={p.default!r}") for p in d.params)
    flags = [f for f, on in (("inplace", d.inplace), ("view", d.view_only)) if on]
    pad = " " * 24
    out = [f"{d.key:<24} {d.op.name}={int(d.op):<3} ({srcs})" + (f" [{params}]" if params else "")
           + (f" {{{', '.join(flags)}}}" if flags else ""),
           f"{pad} {d.doc}; builders: {', '.join(builders_for(d)) or 'node(' + repr(d.key) + ', ...)'}",
           f"{pad} types: " + "; ".join(f"{s.name}: {describe_types(s.types)}" for s in d.srcs)]
    der = derivative(d)
    out.append(f"{pad} derivative: " + ("; ".join(f"{k}: {v}" for k, v in der.items()) or "no sources"))
    return out
