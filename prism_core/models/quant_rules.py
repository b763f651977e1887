"""Which type each tensor of a model gets when it is quantized to a file type: llama-quantize's presets and its
per-tensor mixture rules (llama.cpp 0.3.36, src/llama-quant.cpp), in Prism's words.

A preset (``Q4_K_M``) names a file type (``general.file_type``) and a default tensor type (Q4_K). Each tensor
that may be quantized (2-D and up, named ``*weight``, not a norm, not one of llama.cpp's exceptions) gets the
default or, in the mixes, a type by role and layer position: attention values (``attn_v``), ``ffn_down``, the
output matrix and the token embeddings get more bits, in the first and last eighths of the layers and every
third one between (``use_more_bits``). A tensor whose rows are not a multiple of its type's block falls back
to a type of 32-element blocks, or to F16. The rules walk the tensors in llama.cpp's order (by layer, then by
name): some of them count the ``attn_v`` tensors seen so far.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..errors import InvalidArgument, Unsupported
from ..types import GGMLType, traits

G = GGMLType


@dataclass(frozen=True)
class Preset:
    """A file type of llama-quantize: its name, ``general.file_type`` number and default tensor type."""

    name: str
    ftype: int
    default: GGMLType
    description: str = ""


def _p(name: str, ftype: int, default: GGMLType, description: str = "") -> Preset:
    return Preset(name, ftype, default, description)


_IM = "needs an importance matrix"
# llama-quantize's QUANT_OPTIONS (tools/quantize/quantize.cpp) and llama_ftype_get_default_type; Q1_0, Q2_0
# and NVFP4, formats Prism does not write, are left out. Aliases map to the same file type.
PRESETS: dict[str, Preset] = {p.name: p for p in (
    _p("Q4_0", 2, G.Q4_0), _p("Q4_1", 3, G.Q4_1), _p("Q5_0", 8, G.Q5_0), _p("Q5_1", 9, G.Q5_1),
    _p("Q8_0", 7, G.Q8_0), _p("MXFP4_MOE", 38, G.MXFP4, "MoE experts MXFP4, the rest Q8_0"),
    _p("IQ2_XXS", 19, G.IQ2_XXS, _IM), _p("IQ2_XS", 20, G.IQ2_XS, _IM), _p("IQ2_S", 28, G.IQ2_XS, _IM),
    _p("IQ2_M", 29, G.IQ2_S, _IM), _p("IQ1_S", 24, G.IQ1_S, _IM), _p("IQ1_M", 31, G.IQ1_M, _IM),
    _p("TQ1_0", 36, G.TQ1_0), _p("TQ2_0", 37, G.TQ2_0), _p("Q2_K", 10, G.Q2_K), _p("Q2_K_S", 21, G.Q2_K),
    _p("IQ3_XXS", 23, G.IQ3_XXS, _IM), _p("IQ3_S", 26, G.IQ3_S), _p("IQ3_M", 27, G.IQ3_S),
    _p("IQ3_XS", 22, G.IQ3_S), _p("Q3_K_S", 11, G.Q3_K), _p("Q3_K_M", 12, G.Q3_K), _p("Q3_K_L", 13, G.Q3_K),
    _p("IQ4_NL", 25, G.IQ4_NL), _p("IQ4_XS", 30, G.IQ4_XS), _p("Q4_K_S", 14, G.Q4_K), _p("Q4_K_M", 15, G.Q4_K),
    _p("Q5_K_S", 16, G.Q5_K), _p("Q5_K_M", 17, G.Q5_K), _p("Q6_K", 18, G.Q6_K), _p("F16", 1, G.F16),
    _p("BF16", 32, G.BF16), _p("F32", 0, G.F32),
)}
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "MXFP4": "MXFP4_MOE"}
F = {name: p.ftype for name, p in PRESETS.items()}  # file type numbers by preset name, for the rules below


def preset(name: str | int) -> Preset:
    """The preset called ``name`` (any case, an alias, or its file type number)."""
    if isinstance(name, int) or (isinstance(name, str) and name.strip().isdigit()):
        n = int(name)
        for p in PRESETS.values():
            if p.ftype == n:
                return p
    elif isinstance(name, str):
        key = name.strip().upper()
        key = ALIASES.get(key, key)
        if key in PRESETS:
            return PRESETS[key]
    names = ", ".join([*PRESETS, *ALIASES])
    raise InvalidArgument(f"quantize: unknown type {name!r}; the presets are {names}")


def tensor_type(name: str) -> GGMLType:
    """A ggml type by its name (any case), as llama-quantize's --output-tensor-type takes it."""
    key = name.strip().upper()
    for t in GGMLType:
        if traits(t).name.upper() == key and traits(t).usable:
            return t
    raise InvalidArgument(f"quantize: unknown tensor type {name!r}; e.g. q8_0, q6_k, f16")


class Category(Enum):
    TOKEN_EMBD = "token_embd"
    ATTENTION_Q = "attn_q"
    ATTENTION_V = "attn_v"
    ATTENTION_K = "attn_k"
    ATTENTION_QKV = "attn_qkv"
    ATTENTION_KV_B = "attn_kv_b"
    ATTENTION_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OUTPUT = "output"
    OTHER = "other"


def category(name: str) -> Category:
    """The role of a tensor by its name, as llama-quant's tensor_get_category: substrings, first match wins."""
    if name == "output.weight":
        return Category.OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return Category.TOKEN_EMBD
    for part, cat in (("attn_qkv.weight", Category.ATTENTION_QKV), ("attn_kv_b.weight", Category.ATTENTION_KV_B),
                      ("attn_v.weight", Category.ATTENTION_V), ("attn_k.weight", Category.ATTENTION_K),
                      ("attn_q.weight", Category.ATTENTION_Q), ("attn_output.weight", Category.ATTENTION_OUTPUT),
                      ("ffn_up", Category.FFN_UP), ("ffn_gate", Category.FFN_GATE), ("ffn_down", Category.FFN_DOWN)):
        if part in name:
            return cat
    return Category.OTHER


_ATTN_V_LIKE = (Category.ATTENTION_V, Category.ATTENTION_QKV, Category.ATTENTION_KV_B)
# llama-quant's tensor_allows_quantization: parts of names that keep a tensor as it is
_KEEP_PARTS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
               "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
               "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
               "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
               "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
               "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
               "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
               "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_KEEP_PARTS_GLM5_NEXT = ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
                         "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
                         "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
                         "attn_v_b.weight")
_LAYER = re.compile(r"blk\.\s*([+-]?\d+)")  # sscanf("blk.%d.")


def n_dims(ne: Sequence[int]) -> int:
    """ggml_n_dims: the dimensions up to the last one above 1 (at least 1)."""
    n = 1
    for i, v in enumerate(ne):
        if v > 1:
            n = i + 1
    return n


def layer_of(name: str) -> int:
    """The layer a tensor's name gives (``blk.N``, as llama.cpp's sscanf reads it at the start), or -1."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def llama_order(names: Sequence[str]) -> list[str]:
    """llama.cpp's weight order (its weights_map): by layer (-1 for tensors outside the blocks), then by name."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode("utf-8")))


@dataclass(frozen=True)
class ModelInfo:
    """What the rules read of a model's hyperparameters."""

    arch: str
    n_layer: int
    n_head: int  # of layer 0
    n_head_kv: int
    n_expert: int
    is_70b: bool  # llama.cpp's LLM_TYPE_70B: a llama of 80 layers with grouped-query attention

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> ModelInfo:
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise InvalidArgument("quantize: the model has no general.architecture")

        def first(key: str, default: int | None = None) -> int:
            v = meta.get(f"{arch}.{key}", default)
            if v is None:
                raise InvalidArgument(f"quantize: the model's metadata has no {arch}.{key}")
            if not isinstance(v, (int, float)) and hasattr(v, "__len__"):  # a per-layer array: layer 0
                v = list(v)[0] if len(v) else 0
            return int(v)

        n_layer = first("block_count")
        if n_layer <= 0:
            raise InvalidArgument(f"quantize: {arch}.block_count is {n_layer}, not a layer count")
        n_head = first("attention.head_count", 0)
        n_head_kv = first("attention.head_count_kv", n_head)
        return cls(arch, n_layer, n_head, n_head_kv, first("expert_count", 0),
                   arch == "llama" and n_layer == 80 and n_head != n_head_kv)


@dataclass(frozen=True)
class Options:
    """llama-quantize's switches that change tensor types."""

    leave_output_tensor: bool = False
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    pure: bool = False
    has_imatrix: bool = False


@dataclass(frozen=True)
class TensorPlan:
    """One tensor's fate: its target type, role, whether it may be quantized at all, whether that type needs an
    importance matrix, and the fallback taken (a note for the report, "" when none)."""

    name: str
    source: GGMLType
    target: GGMLType
    category: Category
    quantizable: bool
    needs_imatrix: bool
    fallback: str = ""


def allows_quantization(name: str, ne: Sequence[int], arch: str, opts: Options) -> bool:
    """llama-quant's tensor_allows_quantization (``only_copy`` aside)."""
    if n_dims(ne) < 2 or not name.endswith("weight"):
        return False
    if opts.leave_output_tensor and name == "output.weight":
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    if any(p in name for p in _KEEP_PARTS):
        return False
    return not (arch == "glm5-next" and any(p in name for p in _KEEP_PARTS_GLM5_NEXT))


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _fallback(name: str, ncols: int, target: GGMLType) -> tuple[GGMLType, str]:
    """A type whose block divides ncols: llama-quant's tensor_type_fallback."""
    bs = traits(target).blck_size
    if ncols % bs == 0:
        return target, ""
    if target in (G.IQ1_S, G.IQ1_M, G.IQ2_XXS, G.IQ2_XS, G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ4_XS):
        to = G.IQ4_NL
    elif target in (G.Q2_0, G.Q2_K, G.Q3_K, G.TQ1_0, G.TQ2_0):
        to = G.Q4_0
    elif target == G.Q4_K:
        to = G.Q5_0
    elif target == G.Q5_K:
        to = G.Q5_1
    elif target == G.Q6_K:
        to = G.Q8_0
    elif bs <= 32:
        to = target
    else:
        raise Unsupported(f"quantize: {name}: rows of {ncols} are not a multiple of {traits(target).name}'s block "
                          f"of {bs}, and llama.cpp defines no fallback for it")
    if ncols % traits(to).blck_size:
        to = G.F16
    note = f"{ncols} columns not divisible by {bs} ({traits(target).name}): {traits(to).name} instead"
    return to, note


@dataclass
class _Counters:
    """llama-quant's quantize_state_impl counters, advanced as the tensors are visited in order."""

    n_attention_wv: int = 0
    n_ffn_down: int = 0
    n_ffn_gate: int = 0
    n_ffn_up: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    has_tied_embeddings: bool = True
    notes: list[str] = field(default_factory=list)


def _layer_info(c_i: int, n: int, name: str, info: ModelInfo) -> tuple[int, int]:
    if info.n_expert > 1:  # experts' tensors are not in layer order: the layer comes from the name
        m = re.match(r"blk\.(\d+)\.", name)
        if not m:
            raise InvalidArgument(f"quantize: cannot tell the layer of tensor {name!r} (a MoE model's tensors are "
                                  "named blk.N....)")
        il = int(m.group(1))
        if not 0 <= il < n:
            raise InvalidArgument(f"quantize: tensor {name!r} names layer {il}, outside [0, {n})")
        return il, n
    return c_i, n


def _mixture(c: _Counters, t: GGMLType, name: str, ncols: int, ne2: int, ftype: int, cat: Category,
             info: ModelInfo, opts: Options) -> GGMLType:
    """llama_tensor_get_type_impl: the mix's type for one tensor (t: the default)."""
    arch, gqa, nexp = info.arch, info.n_gqa, info.n_expert
    if arch == "glm5-next" and any(p in name for p in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
        if t not in (G.F32, G.BF16, G.F16):
            return G.Q8_0
    iq_low = (F["IQ2_XXS"], F["IQ2_XS"], F["IQ1_S"], F["IQ2_S"], F["IQ2_M"], F["IQ1_M"])
    if cat == Category.OUTPUT or (c.has_tied_embeddings and cat == Category.TOKEN_EMBD):
        if opts.output_tensor_type is not None:
            return opts.output_tensor_type
        if ftype == F["MXFP4_MOE"] or arch == "falcon" or ncols % traits(t).blck_size:
            return G.Q8_0
        if ftype in (F["IQ2_XXS"], F["IQ2_XS"], F["IQ3_XXS"], F["IQ1_S"], F["IQ2_S"], F["IQ2_M"], F["IQ1_M"]):
            return G.Q5_K
        return t if t == G.Q8_0 else G.Q6_K
    if ftype == F["MXFP4_MOE"]:
        experts = not (arch == "bailingmoe3") or cat in (Category.FFN_UP, Category.FFN_GATE, Category.FFN_DOWN)
        return G.MXFP4 if ne2 > 1 and experts else G.Q8_0
    if cat == Category.TOKEN_EMBD:
        if opts.token_embedding_type is not None:
            return opts.token_embedding_type
        if ftype in (F["IQ2_XXS"], F["IQ2_XS"], F["IQ1_S"], F["IQ1_M"]):
            return G.Q2_K
        if ftype in (F["IQ2_S"], F["IQ2_M"], F["IQ3_XXS"]):
            return G.IQ3_S
        if ftype in (F["TQ1_0"], F["TQ2_0"]):
            return G.Q4_K
        return t
    if ftype in iq_low:
        two_s = ftype in (F["IQ2_S"], F["IQ2_M"])
        if cat in _ATTN_V_LIKE:
            t = G.Q4_K if gqa >= 4 or nexp >= 4 else (G.IQ3_S if two_s else G.Q2_K)
            c.i_attention_wv += 1
        elif nexp == 8 and cat == Category.ATTENTION_K:
            t = G.Q4_K
        elif cat == Category.FFN_DOWN:
            if c.i_ffn_down < c.n_ffn_down // 8:
                t = G.IQ3_S if two_s else G.Q2_K
            c.i_ffn_down += 1
        elif cat == Category.ATTENTION_OUTPUT:
            if nexp == 8:
                t = G.Q5_K
            elif ftype in (F["IQ1_S"], F["IQ1_M"]):
                t = G.IQ2_XXS
            elif two_s:
                t = G.IQ3_S
        return t
    if cat in _ATTN_V_LIKE:
        if ftype == F["Q2_K"]:
            t = G.Q4_K if gqa >= 4 else G.Q3_K
        elif ftype == F["Q2_K_S"] and gqa >= 4:
            t = G.Q4_K
        elif ftype == F["IQ3_XXS"]:
            t = G.Q4_K if gqa >= 4 else (G.IQ3_S if not opts.has_imatrix else G.IQ3_XXS)
        elif ftype in (F["IQ3_XS"], F["IQ3_S"]) and gqa >= 4:
            t = G.Q4_K
        elif ftype == F["IQ3_M"]:
            t = G.Q4_K
        elif ftype == F["Q3_K_M"]:
            t = G.Q5_K if c.i_attention_wv < 2 else G.Q4_K
        elif ftype == F["Q3_K_L"]:
            t = G.Q5_K
        elif ftype in (F["IQ4_NL"], F["IQ4_XS"]) and gqa >= 4:
            t = G.Q5_K
        elif ftype in (F["Q4_K_M"], F["Q5_K_M"]) and _use_more_bits(c.i_attention_wv, c.n_attention_wv):
            t = G.Q6_K
        elif ftype == F["Q4_K_S"] and c.i_attention_wv < 4:
            t = G.Q5_K
        if info.is_70b and t in (G.Q3_K, G.Q4_K):
            t = G.Q5_K
        if nexp == 8:
            t = G.Q8_0
        c.i_attention_wv += 1
        return t
    if cat == Category.ATTENTION_K:
        if nexp == 8:
            return G.Q8_0
        if ftype == F["IQ3_XS"]:
            return G.IQ3_XXS
        if ftype == F["IQ3_XXS"]:
            return G.IQ2_S
        return t
    if cat == Category.ATTENTION_Q:
        if ftype == F["IQ3_XS"]:
            return G.IQ3_XXS
        if ftype == F["IQ3_XXS"]:
            return G.IQ2_S
        return t
    if cat == Category.FFN_DOWN:
        il, n = _layer_info(c.i_ffn_down, c.n_ffn_down, name, info)
        if ftype == F["Q2_K"]:
            t = G.Q3_K
        elif ftype == F["Q2_K_S"]:
            if il < n // 8:
                t = G.Q4_K
        elif ftype == F["IQ3_XXS"] and not opts.has_imatrix:
            t = G.Q4_K if il < n // 8 else G.Q3_K
        elif ftype == F["Q3_K_M"]:
            t = (G.Q5_K if il < n // 16 else G.Q4_K if arch != "falcon" or _use_more_bits(il, n) else G.Q3_K)
        elif ftype == F["IQ3_M"] and (il < n // 8 or (nexp == 8 and _use_more_bits(il, n))):
            t = G.Q4_K
        elif ftype == F["Q3_K_L"]:
            t = G.Q4_K if arch == "falcon" else G.Q5_K
        elif ftype == F["Q4_K_M"]:
            if arch == "falcon":
                t = G.Q6_K if il < n // 16 else G.Q5_K if _use_more_bits(il, n) else G.Q4_K
            elif _use_more_bits(il, n):
                t = G.Q6_K
        elif il < n // 8 and ftype in (F["IQ4_NL"], F["IQ4_XS"]) and not opts.has_imatrix:
            t = G.Q5_K
        elif ftype == F["Q5_K_M"] and _use_more_bits(il, n):
            t = G.Q6_K
        elif ftype == F["Q4_K_S"] and arch != "falcon" and il < n // 8:
            t = G.Q5_K
        elif ftype in (F["Q4_0"], F["Q5_0"]) and opts.has_imatrix and il < n // 8:
            t = G.Q4_1 if ftype == F["Q4_0"] else G.Q5_1
        c.i_ffn_down += 1
        return t
    if cat == Category.ATTENTION_OUTPUT:
        if arch != "falcon":
            if nexp == 8:
                if ftype in (F["Q2_K"], F["IQ3_XS"], F["IQ3_XXS"], F["Q3_K_S"], F["Q3_K_M"], F["IQ4_NL"],
                             F["Q4_K_S"], F["Q4_K_M"], F["IQ3_S"], F["IQ3_M"], F["IQ4_XS"]):
                    t = G.Q5_K
            else:
                t = {F["Q2_K"]: G.Q3_K, F["IQ3_XXS"]: G.IQ3_S, F["Q3_K_M"]: G.Q4_K, F["Q3_K_L"]: G.Q5_K,
                     F["IQ3_M"]: G.Q4_K}.get(ftype, t)
        elif ftype == F["Q3_K_L"]:
            t = G.Q4_K
        return t
    if cat == Category.ATTENTION_QKV:
        if ftype in (F["Q3_K_M"], F["Q3_K_L"], F["IQ3_M"]):
            return G.Q4_K
        if ftype == F["Q4_K_M"]:
            return G.Q5_K
        if ftype == F["Q5_K_M"]:
            return G.Q6_K
        return t
    if cat in (Category.FFN_GATE, Category.FFN_UP):
        up = cat == Category.FFN_UP
        il, n = _layer_info(c.i_ffn_up if up else c.i_ffn_gate, c.n_ffn_up if up else c.n_ffn_gate, name, info)
        if ftype == F["IQ3_XS"] and n // 8 <= il < 7 * n // 8:
            t = G.IQ3_XXS
        if up:
            c.i_ffn_up += 1
        else:
            c.i_ffn_gate += 1
        return t
    return t


def needs_imatrix(name: str, target: GGMLType, ftype: int) -> bool:
    """llama-quant's tensor_requires_imatrix."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    if target in (G.IQ3_XXS, G.IQ2_XXS, G.IQ2_XS, G.IQ2_S, G.IQ1_M, G.IQ1_S):
        return True
    return target == G.Q2_K and ftype == F["Q2_K_S"]


def plan(tensors: Sequence[tuple[str, GGMLType, Sequence[int]]], info: ModelInfo, p: Preset,
         opts: Options = Options()) -> list[TensorPlan]:
    """Each tensor's plan, for tensors (name, type, ne in ggml order) already in :func:`llama_order`."""
    c = _Counters()
    for name, _, _ in tensors:
        cat = category(name)
        c.n_attention_wv += cat in _ATTN_V_LIKE
        if cat == Category.OUTPUT:
            c.has_tied_embeddings = False
    c.n_ffn_down = c.n_ffn_gate = c.n_ffn_up = info.n_layer
    out = []
    for name, src, ne in tensors:
        cat = category(name)
        ok = allows_quantization(name, ne, info.arch, opts)
        target, note = src, ""
        if ok:
            if opts.token_embedding_type is not None and cat == Category.TOKEN_EMBD:
                target = opts.token_embedding_type
            elif opts.output_tensor_type is not None and cat == Category.OUTPUT:
                target = opts.output_tensor_type
            else:
                target = p.default
                if traits(target).is_quantized:
                    if not opts.pure:
                        ne2 = ne[2] if len(ne) > 2 else 1
                        target = _mixture(c, target, name, ne[0], ne2, p.ftype, cat, info, opts)
                    target, note = _fallback(name, ne[0], target)
        out.append(TensorPlan(name, src, target, cat, ok, needs_imatrix(name, target, p.ftype), note))
    return out
