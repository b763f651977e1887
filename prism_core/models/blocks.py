"""The building blocks every architecture shares (norms, attention over the KV cache, feed-forward
networks), written only with Prism's public builders so every backend runs them.

Shapes are ggml order: activations are [n_embd, n_tokens]; a weight [n_in, n_out] multiplies as
``mul_mat(w, x)``, plus the products of any LoRA adapters on it (:meth:`Weights.linear`). One
:class:`Step` holds the per-graph input tensors, whose values are set before each compute of a
planned graph (the graph itself is built once per shape).

The same blocks build a training forward (:mod:`prism_core.finetune`): called without a cache,
attention is causal inside each of ``Step.n_windows`` windows of ``Step.n_kv`` tokens, reading the
window's own keys and values (the gradient cannot flow through a cache written with SET_ROWS).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..ops import build as B
from ..ops.build_attn import flash_attn_ext, rope_ext, set_rows
from ..tensor import Tensor
from ..types import F32
from .hparams import HParams
from .kv_cache import KVCache


@dataclass
class Step:
    """Input tensors of one planned graph: ``n_tokens`` new tokens attending over ``n_kv`` cache cells."""

    tokens: Tensor  # I32 [n_tokens]
    pos: Tensor  # I32 [n_tokens]
    cells: Tensor  # I64 [n_tokens]: the cache rows the new keys and values go to
    mask: Tensor  # F16 [n_kv, n_tokens]: 0 where a key is visible, -inf elsewhere
    cells_swa: Tensor | None  # on sliding-window layers: their ring's rows
    mask_swa: Tensor | None  # F16 [n_kv_swa, n_tokens]: the ring's cells each token sees
    out_rows: Tensor  # I32 [n_out]: the positions (of the new tokens) whose logits are wanted
    n_kv: int
    n_kv_swa: int
    flash_attn: bool = True  # FLASH_ATTN_EXT; False: llama.cpp's unfused attention (K·q, softmax, V·p)
    n_windows: int = 1  # without a cache (training): the tokens are this many windows of n_kv tokens each


@dataclass(frozen=True)
class LoraProduct:
    """One LoRA adapter on one matrix: ``scale * mul_mat(b, mul_mat(a, x))`` is added to its product
    (llama.cpp's build_lora_mm); a ne [n_in, r], b ne [r, n_out]."""

    a: Tensor
    b: Tensor
    scale: float


class Weights:
    """Named tensors of a model file (``blk.N.attn_q.weight`` ...), looked up with clear errors."""

    def __init__(self, tensors: Mapping[str, Tensor], arch: str,
                 adapters: Mapping[str, Sequence[LoraProduct]] | None = None) -> None:
        self.tensors = tensors
        self.arch = arch
        self.adapters: dict[str, tuple[LoraProduct, ...]] = {k: tuple(v) for k, v in (adapters or {}).items()}

    def get(self, name: str, ne: tuple[int, ...] | None = None, *, required: bool = True) -> Tensor | None:
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise InvalidArgument(f"{self.arch} model: tensor {name!r} is missing from the file")
            return None
        if ne is not None:
            want = tuple(ne) + (1,) * (4 - len(ne))
            if t.ne != want:
                raise InvalidArgument(f"{self.arch} model: tensor {name!r} has ne={list(t.ne)}, "
                                      f"the metadata implies {list(want)}")
        return t

    def layer(self, il: int, name: str, ne: tuple[int, ...] | None = None, *, required: bool = True) -> Tensor | None:
        return self.get(f"blk.{il}.{name}", ne, required=required)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``mul_mat(weight, x)``, plus each adapter's scaled low-rank product, plus ``bias``."""
        y = B.mul_mat(weight, x)
        for lo in self.adapters.get(weight.name, ()):
            y = B.add(y, B.scale(B.mul_mat(lo.b, B.mul_mat(lo.a, x)), lo.scale))
        return B.add(y, bias) if bias is not None else y


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """rms_norm over dim 0, times ``weight`` (broadcast over the other dims)."""
    y = B.rms_norm(x, eps)
    return B.mul(y, weight) if weight is not None else y


def attention(hp: HParams, w: Weights, il: int, h: Tensor, step: Step, cache: KVCache, *,
              qk_norm: bool = False, biases: bool = False, scale_queries: bool = False) -> Tensor:
    """Self-attention of the new tokens over the cache: projections, optional per-head q/k RMS
    norms, RoPE, the cache write (SET_ROWS), attention with the causal (or sliding-window) mask and
    grouped-query heads, and the output projection. ``scale_queries``: the KQ scale multiplies the
    roped queries (llama.cpp's Gemma graph) instead of the scores in the softmax (its others): the
    queries' F16 rounding comes after the scale then, which matters when it is not a power of 2.
    Without a ``cache`` (a training forward) each window of the batch attends, unfused, over its own
    keys and values with ``step``'s masks."""
    n_tok = h.ne[1]
    d, dv, nh, nkv = hp.head_dim, hp.head_dim_v, hp.n_head, hp.n_head_kv
    e = hp.n_embd
    bias = (lambda n, size: w.layer(il, f"{n}.bias", (size,), required=False)) if biases else (lambda n, size: None)
    q = w.linear(h, w.layer(il, "attn_q.weight", (e, d * nh)), bias("attn_q", d * nh))
    k = w.linear(h, w.layer(il, "attn_k.weight", (e, d * nkv)), bias("attn_k", d * nkv))
    v = w.linear(h, w.layer(il, "attn_v.weight", (e, dv * nkv)), bias("attn_v", dv * nkv))
    q, k = B.reshape(q, (d, nh, n_tok)), B.reshape(k, (d, nkv, n_tok))
    if qk_norm:
        q = rms_norm(q, w.layer(il, "attn_q_norm.weight", (d,)), hp.eps)
        k = rms_norm(k, w.layer(il, "attn_k_norm.weight", (d,)), hp.eps)
    swa = hp.swa_layers[il]
    rope = {"n_dims": hp.rope_dims, "mode": hp.rope_mode, "n_ctx_orig": hp.n_ctx_train,
            "freq_base": hp.rope_base_swa if swa else hp.rope_base, "freq_scale": 1.0 if swa else hp.rope_scale,
            "beta_fast": 32.0, "beta_slow": 1.0}
    q = rope_ext(q, step.pos, None, **rope)
    k = rope_ext(k, step.pos, None, **rope)
    kq_scale = hp.attn_scale
    if scale_queries:
        q, kq_scale = B.scale(q, hp.attn_scale), 1.0

    mask = step.mask_swa if swa else step.mask
    if cache is None:
        out = attend(*windows(q, k, v, step), mask, kq_scale)
    else:
        cells, n_kv = (step.cells_swa, step.n_kv_swa) if swa else (step.cells, step.n_kv)
        kc = set_rows(cache.k[il], B.reshape(k, (d * nkv, n_tok)), cells)
        vc = set_rows(cache.v[il], v, cells)
        kv = B.view_3d(kc, d, n_kv, nkv, kc.nb[1], kc.nb[1] // nkv)
        vv = B.view_3d(vc, dv, n_kv, nkv, vc.nb[1], vc.nb[1] // nkv)
        if kv.traits.is_quantized:  # the products below read F32/F16 K and V
            kv = B.cpy(kv, h.ctx.new_tensor(F32, kv.ne))
            vv = B.cpy(vv, h.ctx.new_tensor(F32, vv.ne))
        qp = B.permute(q, 0, 2, 1, 3)
        out = (flash_attn_ext(qp, kv, vv, mask, scale=kq_scale) if step.flash_attn
               else attend(qp, kv, vv, mask, kq_scale))
    out = B.reshape(out, (dv * nh, n_tok))
    return w.linear(out, w.layer(il, "attn_output.weight", (dv * nh, e)), bias("attn_output", e))


def windows(q: Tensor, k: Tensor, v: Tensor, step: Step) -> tuple[Tensor, Tensor, Tensor]:
    """q [d, nh, n_tok], k [d, nkv, n_tok], v [dv nkv, n_tok] of ``step.n_windows`` windows of
    ``step.n_kv`` tokens as :func:`attend` reads them: [d, n_kv, heads, n_windows] (views)."""
    n, nw = step.n_kv, step.n_windows

    def split(t: Tensor, d: int, heads: int) -> Tensor:
        return B.permute(B.reshape(t, (d, heads, n, nw)), 0, 2, 1, 3)
    return split(q, q.ne[0], q.ne[1]), split(k, k.ne[0], k.ne[1]), split(v, v.ne[0] // k.ne[1], k.ne[1])


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """softmax(scale q k^T + mask) v for q [d, n_tok, nh], k [d, n_kv, nkv], v [dv, n_kv, nkv] (query
    head h reads kv head h / (nh / nkv)) -> [dv, nh, n_tok]; with a fourth dim (windows), per window.
    Unfused, as llama.cpp's graph without flash attention (its default in llama-cpp-python): k q and
    v^T softmax are MUL_MATs, so with the F16 cache the queries and the attention weights are rounded
    to F16 before the products, as there, and the softmax is SOFT_MAX's. (FLASH_ATTN_EXT,
    ``Model(flash_attn=True)``, keeps them in float32: 2e-4 relative apart, and decodes about 1.2x faster
    on csimd.)"""
    kq = B.mul_mat(k, q)  # [n_kv, n_tok, nh]
    kq = B.soft_max_ext(kq, mask, scale)
    kqv = B.mul_mat(B.cont(B.transpose(v)), kq)  # [dv, n_tok, nh]
    return B.cont(B.permute(kqv, 0, 2, 1, 3))


def feed_forward(hp: HParams, w: Weights, il: int, h: Tensor, act: str) -> Tensor:
    """The gated FFN: down(act(gate h) * up h); ``act`` "silu" (SwiGLU) or "gelu" (GeGLU, tanh GELU)."""
    e, f = hp.n_embd, hp.n_ff
    gate = w.linear(h, w.layer(il, "ffn_gate.weight", (e, f)))
    up = w.linear(h, w.layer(il, "ffn_up.weight", (e, f)))
    glu = {"silu": B.swiglu_split, "gelu": B.geglu_split}[act]
    return w.linear(glu(gate, up), w.layer(il, "ffn_down.weight", (f, e)))
