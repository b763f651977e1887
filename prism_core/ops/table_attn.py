"""Op-table declarations: rotary embeddings, fused attention, expert routing, row scatter.

Part of the one op table (:data:`prism_core.ops.table.OPS`); shapes are ggml order.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..types import BF16, F16, F32, I32, I64
from .codes import Op, RopeMode
from .params import Param
from .semantics import rope_yarn_corr_dims
from .table import (
    COPY_SPECIAL,
    FLOATS,
    IEEE_SPECIAL,
    IGNORE,
    ONLY_F32,
    QUANT_WEIGHTS,
    QUANT_WRITABLE,
    REDUCE_SPECIAL,
    Out,
    Src,
    ViewOut,
    _fail,
    _quantized_needs_f32,
    define,
    divides,
    ex,
    f32,
    spec,
)

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
spec("ROPE", "a's type and shape: a [head_dim ne0, n_head ne1, n_tokens ne2, ne3] with contiguous rows; pos I32 "
     "[ne2] (MROPE/VISION/IMROPE: [4 * ne2], stream s at s * ne2 + i2); freq_factors F32 [>= n_dims/2]; n_dims "
     "even, 0 < n_dims, n_offs even, n_offs + n_dims <= ne0", IEEE_SPECIAL,
     ex((0.54030231, 0.84147098, 0.99995, 0.0099998333), a=f32((4,), 1, 0, 1, 0), pos=(I32, (1,), (1,)), n_dims=4,
        note="position 1: pair (0, 1) turns by 1 rad, pair (2, 3) by 10000^(-2/4) = 0.01 rad"),
     "Pairs k = 0 .. n_pairs - 1 (n_pairs = n_dims / 2; VISION: n_dims) rotate elements (first, second): NORMAL "
     "(n_offs + 2k, n_offs + 2k + 1); NEOX, MROPE, IMROPE (n_offs + k, n_offs + k + n_dims/2); VISION (k, k + n_dims). "
     "inv_freq(k) = freq_base^(-2k / n_dims). Position p of token i2: pos[i2], or for the multi-stream modes "
     "pos[s * ne2 + i2] with s chosen per pair from sect = k mod (t + h + w + e), sections = [t, h, w, e]: MROPE and "
     "VISION s = 0 if sect < t, 1 if sect < t + h, 2 if sect < t + h + w, else 3 (VISION also restarts the "
     "frequency per section: inv_freq = freq_base^(-2 (sect - start of its section) / n_dims)); IMROPE s = 1 if "
     "sect mod 3 = 1 and sect < 3h, 2 if sect mod 3 = 2 and sect < 3w, 0 if sect mod 3 = 0 and sect < 3t, else 3. "
     "theta_extrap = p * inv_freq(k) / freq_factors[k] (1 without freq_factors), theta_interp = freq_scale * "
     "theta_extrap, theta = theta_interp * (1 - mix) + theta_extrap * mix. YaRN (ext_factor != 0 only): low = "
     "max(0, floor(c(beta_fast))), high = min(n_dims - 1, ceil(c(beta_slow))), c(b) = n_dims ln(n_ctx_orig / (2 pi "
     "b)) / (2 ln freq_base); mix = ext_factor * (1 - clamp((k - low) / max(0.001, high - low), 0, 1)); mscale = "
     "attn_factor (1 + 0.1 ln(1 / freq_scale)); otherwise mix = 0 and mscale = attn_factor. Then first' = "
     "(first cos theta - second sin theta) mscale, second' = (first sin theta + second cos theta) mscale; every "
     "element not in a pair is copied unchanged.")
define("ROPE_BACK", Op.ROPE_BACK, ROPE_SRCS, _rope_rule,
       "the transpose (inverse rotation) of ROPE with the same parameters: ROPE's gradient",
       params=ROPE_PARAMS, grad={"a": _rope_grad(True), "pos": IGNORE},
       nograd="the gradient of freq_factors is not implemented")
spec("ROPE_BACK", "as ROPE: a's type and shape, the same sources and params", IEEE_SPECIAL,
     ex((0.54030231, -0.84147098, 0.99995, -0.0099998333), a=f32((4,), 1, 0, 1, 0), pos=(I32, (1,), (1,)), n_dims=4),
     "ROPE with every angle negated (sin -> -sin): the transpose of ROPE's rotation, with the same mscale")


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
spec("FLASH_ATTN_EXT", "F32 [Dv, n_head, n_q, B] (heads and queries swapped against q) for q F32 [Dk, n_q, "
     "n_head, B], k [Dk, n_kv, n_head_kv, B], v [Dv, n_kv, n_head_kv, B] (n_head_kv divides n_head), mask F16 "
     "[n_kv, >= n_q, m2, m3] contiguous (m2 divides n_head, m3 divides B), sinks F32 [n_head]",
     "a query whose scores are all -inf after the mask gives NaN (0/0) in ggml's reference; the suite avoids it",
     ex((1.5378828, 2.5378828), q=f32((2,), 1, 0), k=f32((2, 2), 1, 0, 0, 1), v=f32((2, 2), 1, 2, 3, 4),
        note="scores q.k = [1, 0]; weights e/(e+1), 1/(e+1) applied to the value rows [1, 2] and [3, 4]"),
     "for head h, query iq, batch b: kv head hk = h / (n_head / n_head_kv) (blockwise, GQA). s_j = scale * "
     "q[:, iq, h, b] . k[:, j, hk, b]; with logit_softcap c > 0: s_j = c * tanh(s_j / c); s_j += slope(h) * "
     "mask[j, iq, h mod m2, b mod m3] (slope as SOFT_MAX's ALiBi with n_head = q.ne2); w = softmax_j(s) (a sink "
     "joins the max and the denominator as in SOFT_MAX); out[:, h, iq, b] = sum_j w_j v[:, j, hk, b]. "
     "F16/BF16 k, v are converted exactly; the reference rounds the scores to float32")


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
spec("MUL_MAT_ID", "F32 [as.ne1, n_used, n_tokens, 1] for as [K, M, n_experts], b [K, b.ne1, n_tokens], ids "
     "I32 [n_used, n_tokens]; b.ne1 divides n_used; as of a block type needs an F32 b", REDUCE_SPECIAL
     + "; an id outside [0, n_experts) is an error in ggml (not tested)",
     ex((5.0, -6.0, 17.0, 39.0), **{"as": f32((2, 2, 2), 1, 2, 3, 4, 1, 0, 0, -1)}, b=f32((2,), 5, 6),
        ids=(I32, (2,), (1, 0)),
        note="token 0 uses expert 1 (rows [1, 0], [0, -1]) then expert 0 (rows [1, 2], [3, 4])"),
     "out[m, e, t] = sum_k as[k, m, ids[e, t]] * b[k, e mod b.ne1, t]; an F16/BF16 as takes an F32 b rounded to "
     "its type first, as MUL_MAT")


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
spec("SET_ROWS", "the result is a (a view of it); b F32/F16 [n, m, S2, S3], c I32/I64 [m, C1, C2] (C1 divides S2, "
     "C2 divides S3), a [n, R, S2, S3] with contiguous rows (as b)", COPY_SPECIAL
     + "; F32 -> F16/BF16 rounds to nearest even; an index outside [0, R) is an error in ggml (not tested)",
     ex((1.0, 2.0, 7.0, 8.0, 5.0, 6.0), b=f32((2,), 7, 8), c=(I32, (1,), (1,)), a=f32((2, 3), 1, 2, 3, 4, 5, 6)),
     "a[:, c[i, j mod C1, k mod C2], j, k] = b[:, i, j, k] converted to a's type (block types: ggml's reference "
     "quantizer per row); rows of a not named in c keep their values")

__all__ = ["ROPE_PARAMS", "MROPE_MODES"]
