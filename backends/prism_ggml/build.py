"""One Prism node as a ggml graph: leaf tensors over the sources' host memory, the op built by
ggml's own builder, the result's data pointer set to the node's memory.

A builder only runs after the checks here: ggml's builders abort the process (GGML_ASSERT) on
shapes they do not take, so a node whose shape ggml would refuse is declined (Unsupported) first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prism_core import Tensor
from prism_core.errors import Unsupported
from prism_core.ops.codes import GluOp, UnaryOp
from prism_core.types import GGMLType

_mod: list[Any] = []


def ggml_module():
    """ggml-python's module (imported once; ImportError when it is missing)."""
    if not _mod:
        import ggml  # noqa: PLC0415 - optional dependency
        _mod.append(ggml)
    return _mod[0]


@dataclass
class Built:
    ctx: Any
    out: Any
    graph: Any = None
    keep: list = field(default_factory=list)  # host arrays whose memory the tensors point at

    def free(self) -> None:
        if self.ctx is not None:
            ggml_module().ggml_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:  # the context's metadata only: the data is Prism's
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _address(t: Tensor, keep: list) -> int:
    buf = t.storage()
    keep.append(buf)
    return buf.ctypes.data + t.view_offs


def _leaf(g, ctx, t: Tensor, with_data: bool, keep: list):
    ne = (ctypes.c_int64 * 4)(*t.ne)
    x = g.ggml_new_tensor(ctx, int(t.type), 4, ne)
    c = x.contents
    for i in range(4):
        c.nb[i] = t.nb[i]
    if with_data:
        c.data = _address(t, keep)
    return x


def _same_shape(a: Tensor, b: Tensor) -> bool:
    return a.ne == b.ne


def _can_repeat(b: Tensor, a: Tensor) -> bool:
    return all(b.ne[i] > 0 and a.ne[i] % b.ne[i] == 0 for i in range(4))


def _rows_contiguous(t: Tensor) -> bool:
    return t.nb[0] == t.traits.type_size


# ---------------------------------------------------------------- builders (node, ggml, ctx, srcs)
Builder = Callable[[Tensor, Any, Any, list], Any]
BUILDERS: dict[str, Builder] = {}


def builder(*keys: str):
    def deco(f: Builder) -> Builder:
        for k in keys:
            BUILDERS[k] = f
        return f
    return deco


@builder("ADD", "SUB", "MUL", "DIV")
def _binary(n, g, ctx, s):
    a, b = n.src
    if not _can_repeat(b, a):
        raise Unsupported("b does not repeat onto a")
    if a.traits.is_quantized or b.traits.is_quantized:
        raise Unsupported("block-type operands (ggml-python 0.0.45's CPU binary ops abort on them)")
    if not (_rows_contiguous(a) and _rows_contiguous(b) and _rows_contiguous(n)):
        raise Unsupported("elements not contiguous in a row")
    return getattr(g, f"ggml_{n.opdef.key.lower()}")(ctx, s[0], s[1])


_SIMPLE_UNARY = {"SQR", "SQRT", "LOG", "SIN", "COS"}


@builder(*_SIMPLE_UNARY, *(u.name for u in UnaryOp))
def _unary(n, g, ctx, s):
    key = n.opdef.key
    if not _rows_contiguous(n.src[0]):
        raise Unsupported("a's elements are not contiguous in a row")
    if n.type == GGMLType.BF16:
        raise Unsupported("BF16 (ggml-python 0.0.45's CPU unary kernels abort on it)")
    if key == "XIELU":
        raise Unsupported("XIELU's parameters (ggml_unary would leave them zero)")
    if key in _SIMPLE_UNARY:
        return getattr(g, f"ggml_{key.lower()}")(ctx, s[0])
    code = getattr(g, f"GGML_UNARY_OP_{key}", None)
    if code is None:
        raise Unsupported(f"ggml-python has no GGML_UNARY_OP_{key}")
    return g.ggml_unary(ctx, s[0], code)


@builder(*(x.name for x in GluOp if x != GluOp.SWIGLU_OAI))
def _glu(n, g, ctx, s):
    code = getattr(g, f"GGML_GLU_OP_{n.opdef.key}")
    a = n.src[0]
    b = n.src[1] if len(n.src) > 1 else None
    if not _rows_contiguous(a) or (b is not None and not _rows_contiguous(b)):
        raise Unsupported("rows not contiguous")
    if n.type == GGMLType.BF16:
        raise Unsupported("BF16 (ggml-python 0.0.45's CPU GLU kernels abort on it)")
    if b is None:
        return g.ggml_glu(ctx, s[0], code, bool(n.params["swapped"]))
    if n.params["swapped"]:
        raise Unsupported("swapped with a separate gate (ggml's split form has no swap)")
    return g.ggml_glu_split(ctx, s[0], s[1], code)


@builder("RMS_NORM", "NORM")
def _norm(n, g, ctx, s):
    if not _rows_contiguous(n.src[0]):
        raise Unsupported("a's rows are not contiguous")
    return getattr(g, f"ggml_{n.opdef.key.lower()}")(ctx, s[0], float(n.params["eps"]))


@builder("SCALE")
def _scale(n, g, ctx, s):
    if not n.src[0].is_contiguous():
        raise Unsupported("a is not contiguous (ggml's scale takes contiguous rows only)")
    if n.type != GGMLType.F32:
        raise Unsupported("types other than F32 (ggml-python 0.0.45's scale aborts on them)")
    return g.ggml_scale_bias(ctx, s[0], float(n.params["s"]), float(n.params["b"]))


@builder("GET_ROWS")
def _get_rows(n, g, ctx, s):
    a, b = n.src
    if b.ne[3] != 1 or a.ne[2] != b.ne[1] or a.ne[3] != b.ne[2]:
        raise Unsupported("indices shaped other than [m, a.ne2, a.ne3]")
    if a.type in (GGMLType.Q8_1, GGMLType.Q8_K):
        raise Unsupported(f"{a.type.name} rows (ggml has no to-float conversion of them)")
    return g.ggml_get_rows(ctx, s[0], s[1])


@builder("MUL_MAT")
def _mul_mat(n, g, ctx, s):
    a, b = n.src
    if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise Unsupported("shapes ggml_mul_mat does not take")
    if not (_rows_contiguous(a) and _rows_contiguous(b)):
        raise Unsupported("a or b with elements not contiguous in a row")
    return g.ggml_mul_mat(ctx, s[0], s[1])


@builder("SET_ROWS")
def _set_rows(n, g, ctx, s):
    b, c, a = n.src
    if b.ne[0] != a.ne[0] or b.ne[2] % c.ne[1] or b.ne[3] % c.ne[2] or c.ne[3] != 1 or b.ne[1] != c.ne[0]:
        raise Unsupported("shapes ggml_set_rows does not take")
    if b.ne[2] != a.ne[2] or b.ne[3] != a.ne[3]:
        raise Unsupported("values and destination differ in dims 2-3")
    if b.type != GGMLType.F32:
        raise Unsupported("values other than F32 (ggml-python 0.0.45's ggml_set_rows takes F32 only)")
    return g.ggml_set_rows(ctx, s[2], s[0], s[1])


@builder("CPY")
def _cpy(n, g, ctx, s):
    a, b = n.src
    if a.nelements != b.nelements:
        raise Unsupported("element counts differ")
    if {a.type, b.type} & {GGMLType.Q8_1, GGMLType.Q8_K}:
        raise Unsupported("Q8_1/Q8_K (ggml has no to-float conversion of them)")
    if (a.traits.is_quantized or b.traits.is_quantized) and not (a.is_contiguous() and b.is_contiguous()):
        raise Unsupported("a block-type copy of non-contiguous tensors")
    return g.ggml_cpy(ctx, s[0], s[1])


@builder("DUP")
def _dup(n, g, ctx, s):
    return g.ggml_dup(ctx, s[0])


@builder("CONT")
def _cont(n, g, ctx, s):
    ne = tuple(n.ne)
    return g.ggml_cont_4d(ctx, s[0], *ne)


@builder("SOFT_MAX")
def _soft_max(n, g, ctx, s):
    a = n.src[0]
    mask = n.src[1] if len(n.src) > 1 else None
    sinks = n.src[2] if len(n.src) > 2 else None
    if not _rows_contiguous(a):
        raise Unsupported("a's rows are not contiguous")
    if mask is not None and (mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1]
                             or a.ne[2] % mask.ne[2] or a.ne[3] % mask.ne[3]):
        raise Unsupported("a mask shaped other than ggml_soft_max_ext takes")
    out = g.ggml_soft_max_ext(ctx, s[0], s[1], float(n.params["scale"]), float(n.params["max_bias"]))
    if sinks is not None:
        if sinks.ne[0] < a.ne[2]:
            raise Unsupported("fewer sinks than heads")
        g.ggml_soft_max_add_sinks(out, s[2])
    return out


@builder("FLASH_ATTN_EXT")
def _flash(n, g, ctx, s):
    q, k, v = n.src[:3]
    mask = n.src[3] if len(n.src) > 3 else None
    sinks = n.src[4] if len(n.src) > 4 else None
    if k.ne[0] != q.ne[0] or v.ne[1] != k.ne[1] or q.ne[2] % k.ne[2] or q.ne[3] % k.ne[3]:
        raise Unsupported("shapes ggml_flash_attn_ext does not take")
    if mask is not None and (mask.ne[0] != k.ne[1] or mask.ne[1] < q.ne[1]):
        raise Unsupported("a mask shaped other than ggml_flash_attn_ext takes")
    out = g.ggml_flash_attn_ext(ctx, s[0], s[1], s[2], s[3], float(n.params["scale"]),
                                float(n.params["max_bias"]), float(n.params["logit_softcap"]))
    if sinks is not None:
        g.ggml_flash_attn_ext_add_sinks(out, s[4])
    return out


@builder("ROPE")
def _rope(n, g, ctx, s):
    a, pos = n.src[:2]
    p = n.params
    if int(p["n_offs"]) != 0:
        raise Unsupported("n_offs (a Prism extension) is not ggml's")
    sections = tuple(int(x) for x in p["sections"])
    args = (int(p["n_ctx_orig"]), float(p["freq_base"]), float(p["freq_scale"]), float(p["ext_factor"]),
            float(p["attn_factor"]), float(p["beta_fast"]), float(p["beta_slow"]))
    mode = int(p["mode"])
    if any(sections) or mode & 8:
        if pos.ne[0] != 4 * a.ne[2]:
            raise Unsupported("positions other than 4 per row")
        sec = (ctypes.c_int * 4)(*sections)
        return g.ggml_rope_multi(ctx, s[0], s[1], s[2], int(p["n_dims"]), sec, mode, *args)
    if pos.ne[0] != a.ne[2]:
        raise Unsupported("positions other than one per row of dim 2")
    return g.ggml_rope_ext(ctx, s[0], s[1], s[2], int(p["n_dims"]), mode, *args)


@builder("SUM", "MEAN")
def _reduce(n, g, ctx, s):
    a = n.src[0]
    if a.type != GGMLType.F32 or not _rows_contiguous(a):
        raise Unsupported("a not F32 with contiguous rows")
    return getattr(g, f"ggml_{n.opdef.key.lower()}")(ctx, s[0])


@builder("REPEAT", "REPEAT_BACK")
def _repeat(n, g, ctx, s):
    a, b = n.src
    if n.opdef.key == "REPEAT" and not _can_repeat(a, b) or n.opdef.key == "REPEAT_BACK" and not _can_repeat(b, a):
        raise Unsupported("extents that do not repeat")
    if a.type != GGMLType.F32 or not _rows_contiguous(a):
        raise Unsupported("a not F32 with contiguous rows")
    return getattr(g, f"ggml_{n.opdef.key.lower()}")(ctx, s[0], s[1])


# ---------------------------------------------------------------- graphs of one node or of a run
def _context(g, n_tensors: int, graph_size: int):
    size = g.ggml_tensor_overhead() * n_tensors + g.ggml_graph_overhead_custom(graph_size, False) + 1024
    return g.ggml_init(g.ggml_init_params(mem_size=size, mem_buffer=None, no_alloc=True))


def _build(g, ctx, node: Tensor, leaf: Callable[[Tensor], Any], keep: list | None) -> Any:
    """``node`` built by ggml's builder over ``leaf(source)`` tensors, its result pointed at the node's
    memory when ``keep`` is given (else left without data). Unsupported when ggml would build
    something else (other type, shape or strides)."""
    build = BUILDERS.get(node.opdef.key) if node.opdef is not None else None
    if build is None:
        raise Unsupported("no ggml builder for this op")
    for t in (node, *node.src):
        if t is not None and t.nelements == 0:
            raise Unsupported("an empty tensor")
    out = build(node, g, ctx, [None if t is None else leaf(t) for t in node.src])
    if not out:
        raise Unsupported("ggml's builder returned NULL")
    c = out.contents
    if c.type != int(node.type):
        raise Unsupported(f"ggml's result would be of type {c.type}, the node's is {node.type.name}")
    if tuple(c.ne) != tuple(node.ne):
        raise Unsupported(f"ggml's result would have extents {tuple(c.ne)}, the node's {node.ne}")
    if c.view_src:  # a view of a source (CPY, SET_ROWS): it must be the node's memory
        if tuple(c.nb) != tuple(node.nb):
            raise Unsupported("ggml's result view has other strides than the node")
        if keep is not None and c.data != _address(node, keep):
            raise Unsupported("ggml's result view is not the node's memory")
    else:
        if tuple(c.nb) != tuple(node.nb):
            raise Unsupported("the node's strides are not ggml's contiguous result")
        if keep is not None:
            c.data = _address(node, keep)
    return out


def node_graph(node: Tensor, *, with_data: bool) -> Built:
    """``node`` built with ggml's builder over leaf tensors of its sources; with ``with_data`` the
    tensors point at Prism's host memory and a one-node graph is made to compute it."""
    return run_graph((node,), with_data=with_data)


def run_graph(nodes: tuple[Tensor, ...], *, with_data: bool) -> Built:
    """``nodes`` (computed in this order) as one ggml graph. Every source is a leaf over its Prism
    memory, the result of an earlier node of the run included: ggml then computes each node exactly as
    alone (its graph links no nodes, so nothing is fused or reordered), in one graph compute.
    ``Built.out`` is the last node's ggml tensor."""
    g = ggml_module()
    n_srcs = sum(len(n.src) for n in nodes)
    graph_size = len(nodes) + n_srcs + 16
    built = Built(_context(g, 2 * len(nodes) + n_srcs + 8, graph_size), None)
    keep = built.keep if with_data else None
    leaves: dict[int, Any] = {}

    def leaf(t: Tensor) -> Any:
        x = leaves.get(id(t))
        if x is None:
            x = leaves[id(t)] = _leaf(g, built.ctx, t, with_data, built.keep)
        return x
    try:
        outs = [_build(g, built.ctx, n, leaf, keep) for n in nodes]
        built.out = outs[-1]
        if with_data:
            built.graph = g.ggml_new_graph_custom(built.ctx, graph_size, False)
            for out in outs:
                g.ggml_build_forward_expand(built.graph, out)
    except BaseException:
        built.free()
        raise
    return built
