"""Op-table declarations: rotary embeddings, fused attention, expert routing, row scatter.

Part of the one op table (:data:`prism_core.optable.OPS`); shapes are ggml order.
"""

from __future__ import annotations

from .errors import InvalidArgument
from .ops import Op, RopeMode
from .optable import (
    FLOATS,
    IGNORE,
    ONLY_F32,
    QUANT_WEIGHTS,
    QUANT_WRITABLE,
    Out,
    Src,
    ViewOut,
    _fail,
    _quantized_needs_f32,
    define,
    divides,
)
from .params import Param
from .semantics import rope_yarn_corr_dims
from .types import BF16, F16, F32, I32, I64

ROPE_PARAMS = (
    Param("n_dims", int, min=0, doc="rotated dims per row (even, <= ne0)"),
    Param("mode", RopeMode, RopeMode.NORMAL),
    Param("n_ctx_orig", int, 0, min=0, doc="training context length (YaRN)"),
    Param("freq_base", float, 10000.0, min=0.0), Param("freq_scale", float, 1.0),
    Param("ext_factor", float, 0.0), Param("attn_factor", float, 1.0),
    Param("beta_fast", float, 32.0), Param("beta_slow", float, 1.0),
    Param("sections", tuple, (0, 0, 0, 0), length=4, min=0, max=2**31 - 1,
          doc="MROPE/VISION/IMROPE section sizes (each >= 0, every mode)"),
    Param("n_offs", int, 0, min=0, doc="first rotated dim (even)"),
)
MROPE_MODES = (RopeMode.MROPE, RopeMode.VISION, RopeMode.IMROPE)


def _rope_rule(d, s, p):
    a, pos, ff = s["a"], s["pos"], s.get("freq_factors")
    n_dims, mode, ne0 = p["n_dims"], p["mode"], a.ne[0]
    if n_dims % 2 or n_dims > ne0 or n_dims == 0:
        _fail(d, f"n_dims={n_dims} must be even, positive and <= a.ne[0]={ne0}", InvalidArgument)
    if p["n_offs"] % 2 or p["n_offs"] + n_dims > ne0:
        _fail(d, f"n_offs={p['n_offs']} must be even with n_offs + n_dims <= {ne0}", InvalidArgument)
    if pos.ne[1:] != (1, 1, 1):
        _fail(d, f"positions must be a vector, have ne={list(pos.ne)}")
    streams = 4 if mode in MROPE_MODES else 1
    if pos.ne[0] != streams * a.ne[2]:
        _fail(d, f"{mode.name} needs {streams} position(s) per token: {streams * a.ne[2]} entries, "
                 f"got {pos.ne[0]}")
    if mode in MROPE_MODES and not any(x > 0 for x in p["sections"][:3]):
        _fail(d, f"{mode.name} needs positive sections, got {p['sections']}", InvalidArgument)
    if mode in MROPE_MODES and sum(p["sections"]) > ne0:
        _fail(d, f"sections {p['sections']} add up to more than a.ne[0]={ne0}", InvalidArgument)
    if mode == RopeMode.VISION and (n_dims * 2 != ne0 or p["n_offs"]):
        _fail(d, f"VISION needs n_dims = a.ne[0]/2 = {ne0 // 2} and n_offs 0", InvalidArgument)
    if p["freq_scale"] <= 0 or p["freq_base"] <= 0:
        _fail(d, "freq_base and freq_scale must be > 0", InvalidArgument)
    if p["ext_factor"] != 0.0:
        try:
            rope_yarn_corr_dims(n_dims, p["n_ctx_orig"], p["freq_base"], p["beta_fast"], p["beta_slow"])
        except (ArithmeticError, ValueError):
            _fail(d, f"YaRN (ext_factor={p['ext_factor']}) needs a finite correction range: beta_fast and "
                     f"beta_slow > 0, n_ctx_orig > 0 and freq_base != 1 (got {p['beta_fast']}, {p['beta_slow']}, "
                     f"{p['n_ctx_orig']}, {p['freq_base']})", InvalidArgument)
    if ff is not None and ff.nelements < n_dims // 2:
        _fail(d, f"freq_factors needs >= n_dims/2 = {n_dims // 2} entries, has {ff.nelements}")
    if not a.is_contiguous_rows():
        _fail(d, "a must have contiguous rows", InvalidArgument)
    return Out(a.type, a.ne)


ROPE_SRCS = (Src("a", frozenset({F32, F16})), Src("pos", frozenset({I32})), Src("freq_factors", ONLY_F32, True))


def _rope_grad(back: bool):
    def rule(B, n, g):
        p = dict(n.params)
        return B.rope_ext_back(g, n.src[1], n.src[2] if len(n.src) > 2 else None, **p) if not back else \
            B.rope_ext(g, n.src[1], n.src[2] if len(n.src) > 2 else None, **p)
    return rule


_ROPE_DOC = ("rotate dim pairs of each row by angle pos * freq_base^(-2k/n_dims) (YaRN-corrected, / freq_factors), "
             "times attn_factor; pairs per mode: NORMAL (2k, 2k+1), NEOX/MROPE/IMROPE (k, k + n_dims/2), "
             "VISION (k, k + n_dims); dims outside the rotated slice are copied")
define("ROPE", Op.ROPE, ROPE_SRCS, _rope_rule, _ROPE_DOC, params=ROPE_PARAMS, inplace=True,
       grad={"a": _rope_grad(False), "pos": IGNORE},
       nograd="the gradient of freq_factors is not implemented (as in ggml)")
define("ROPE_BACK", Op.ROPE_BACK, ROPE_SRCS, _rope_rule,
       "the transpose (inverse rotation) of ROPE with the same parameters: ROPE's gradient",
       params=ROPE_PARAMS, grad={"a": _rope_grad(True), "pos": IGNORE},
       nograd="the gradient of freq_factors is not implemented")


def _flash_attn_rule(d, s, p):
    q, k, v, mask, sinks = s["q"], s["k"], s["v"], s.get("mask"), s.get("sinks")
    if k.ne[0] != q.ne[0]:
        _fail(d, f"q and k head sizes differ: q.ne[0]={q.ne[0]}, k.ne[0]={k.ne[0]}")
    if v.ne[1] != k.ne[1]:
        _fail(d, f"k and v hold different numbers of positions: k.ne[1]={k.ne[1]}, v.ne[1]={v.ne[1]}")
    if not (divides(k.ne[2], q.ne[2]) and divides(v.ne[2], q.ne[2])):
        _fail(d, f"k/v head counts {k.ne[2]}/{v.ne[2]} must divide q's {q.ne[2]} (grouped-query broadcast)")
    if not (q.ne[3] == k.ne[3] == v.ne[3]):
        _fail(d, f"q, k, v must share dim 3: {q.ne[3]}, {k.ne[3]}, {v.ne[3]}")
    if mask is not None:
        if not mask.is_contiguous():
            _fail(d, "mask must be contiguous", InvalidArgument)
        if mask.ne[0] != k.ne[1] or mask.ne[1] < q.ne[1]:
            _fail(d, f"mask ne={list(mask.ne)} must have ne[0]=n_kv={k.ne[1]} and ne[1] >= n_q={q.ne[1]}")
        if not (divides(mask.ne[2], q.ne[2]) and divides(mask.ne[3], q.ne[3])):
            _fail(d, f"mask dims 2,3 {mask.ne[2:]} must divide q's {q.ne[2:]}")
    elif p["max_bias"] > 0:
        _fail(d, "max_bias > 0 (ALiBi) needs a mask", InvalidArgument)
    if sinks is not None and sinks.nelements != q.ne[2]:
        _fail(d, f"sinks must hold one value per head ({q.ne[2]}), has {sinks.nelements}")
    return Out(F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]))


define("FLASH_ATTN_EXT", Op.FLASH_ATTN_EXT,
       (Src("q", ONLY_F32), Src("k", frozenset({F32, F16, BF16})), Src("v", frozenset({F32, F16, BF16})),
        Src("mask", frozenset({F16}), True), Src("sinks", ONLY_F32, True)),
       _flash_attn_rule,
       "softmax over kv of (softcap tanh(scale q.k / softcap) or scale q.k) + slope * mask, times v; k/v heads "
       "broadcast blockwise (GQA); result F32 [Dv, n_head, n_q, B] (heads and queries swapped)",
       params=(Param("scale", float, 1.0), Param("max_bias", float, 0.0, min=0.0),
               Param("logit_softcap", float, 0.0, min=0.0)), nmse=5e-4,
       nograd="no backward rule yet (ggml has none either)")


def _mul_mat_id_rule(d, s, p):
    w, b, ids = s["as"], s["b"], s["ids"]
    _quantized_needs_f32(d, s, "as", "b")
    if w.ne[3] != 1 or b.ne[3] != 1:
        _fail(d, f"as and b must be 3-d, have ne={list(w.ne)} and {list(b.ne)}")
    if ids.ne[2] != 1 or ids.ne[3] != 1 or ids.ne[1] != b.ne[2]:
        _fail(d, f"ids must be [n_used, n_tokens={b.ne[2]}], has ne={list(ids.ne)}")
    if w.ne[0] != b.ne[0]:
        _fail(d, f"inner extents differ: as.ne[0]={w.ne[0]}, b.ne[0]={b.ne[0]}")
    if not divides(b.ne[1], ids.ne[0]):
        _fail(d, f"b.ne[1]={b.ne[1]} must divide the number of used experts {ids.ne[0]}")
    if w.is_transposed():
        _fail(d, "as must not be transposed", InvalidArgument)
    return Out(F32, (w.ne[1], ids.ne[0], b.ne[2], 1))


define("MUL_MAT_ID", Op.MUL_MAT_ID,
       (Src("as", FLOATS | QUANT_WEIGHTS), Src("b", FLOATS), Src("ids", frozenset({I32}))),
       _mul_mat_id_rule,
       "out[:, e, t] = as[:, :, ids[e, t]] x b[:, e mod b.ne[1], t]: each token through its chosen experts",
       nmse=5e-4, nograd="no backward rule yet (ggml has none either)")


def _set_rows_rule(d, s, p):
    b, c, a = s["b"], s["c"], s["a"]
    _quantized_needs_f32(d, s, "a", "b")
    if a.ne[0] != b.ne[0] or a.ne[2] != b.ne[2] or a.ne[3] != b.ne[3]:
        _fail(d, f"b ne={list(b.ne)} must match the destination a ne={list(a.ne)} in dims 0, 2, 3")
    if c.ne[0] != b.ne[1] or c.ne[3] != 1:
        _fail(d, f"indices c ne={list(c.ne)} must be [b.ne[1]={b.ne[1]}, C1, C2, 1]")
    if not (divides(c.ne[1], b.ne[2]) and divides(c.ne[2], b.ne[3])):
        _fail(d, f"indices dims 1,2 {c.ne[1:3]} must divide b's dims 2,3 {b.ne[2:]}")
    if not (a.is_contiguous_rows() and b.is_contiguous_rows()):
        _fail(d, "a and b must have contiguous rows", InvalidArgument)
    return ViewOut(a, a.type, a.ne, a.nb)


define("SET_ROWS", Op.SET_ROWS,
       (Src("b", frozenset({F32, F16})), Src("c", frozenset({I32, I64})), Src("a", FLOATS | QUANT_WRITABLE)),
       _set_rows_rule,
       "a[:, c[i, j mod C1, k mod C2], j, k] = b[:, i, j, k] converted to a's type; the result is a "
       "(sources in ggml's order: values, indices, destination)",
       nograd="scatter into an existing tensor: no backward rule (as in ggml)")

__all__ = ["ROPE_PARAMS", "MROPE_MODES"]
