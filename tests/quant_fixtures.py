"""Inputs of the quantize tests, generated the same way every time (the recorded llama.cpp outputs in
tests/data/llamacpp_quantize.json.gz name each input's sha256): small models of each architecture, wide enough
for the 256-element K and IQ blocks (n_embd 256), in F32 and F16, a seeded importance matrix for each, and
Gemma 3 270M dequantized to F16. Used by tests/test_quantize.py and tests/data/make_llamacpp_quantize_fixtures.py.

Shapes are chosen to reach the rules' corners: llama has 8 layers (``use_more_bits`` picks layers 0, 3, 6, 7)
and an output matrix; qwen3 has 8 query heads over 2 KV heads (GQA 4: the attn_v rules for n_gqa >= 4);
qwen2's feed-forward width of 384 makes ffn_down's rows fall back to a 32-element type; gemma3's of 264
(not a multiple of 32) makes them F16; gemma3 ties its output to the token embeddings.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np

import prism_core as pc
from prism_core.gguf import imatrix as imatrix_file
from prism_core.gguf.format import V
from prism_core.types import GGMLType as G

# arch -> (seed, n_layer, n_head, n_head_kv, head_dim, n_ff)
SHAPES = {"llama": (31, 8, 4, 2, 64, 256), "qwen2": (32, 4, 4, 2, 64, 384), "qwen3": (33, 4, 8, 2, 32, 256),
          "gemma3": (34, 4, 4, 2, 64, 264)}
N_EMBD, N_VOCAB = 256, 64
MODELS = tuple(f"{arch}-{dt}" for arch in SHAPES for dt in ("f32", "f16"))


def vocabulary(n_vocab: int) -> dict:
    from data.make_llamacpp_fixtures import vocabulary as minimal_spm
    return minimal_spm(n_vocab)


def weights(arch: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Metadata and float32 weights (NumPy order: [rows, cols]) of one model."""
    seed, n_layer, nh, nkv, d, f = SHAPES[arch]
    r = np.random.default_rng(seed)
    e = N_EMBD
    meta = {"general.architecture": arch, "general.name": f"prism-quantize-{arch}", f"{arch}.embedding_length": e,
            f"{arch}.block_count": n_layer, f"{arch}.feed_forward_length": f, f"{arch}.attention.head_count": nh,
            f"{arch}.attention.head_count_kv": nkv, f"{arch}.attention.key_length": d,
            f"{arch}.attention.value_length": d, f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
            f"{arch}.context_length": 512, f"{arch}.rope.freq_base": 1e6 if arch == "gemma3" else 1e4}
    if arch == "gemma3":
        meta["gemma3.attention.sliding_window"] = 8
    w = {"token_embd.weight": r.standard_normal((N_VOCAB, e)) * 0.5,
         "output_norm.weight": 1 + 0.1 * r.standard_normal(e)}
    if arch != "gemma3":
        w["output.weight"] = r.standard_normal((N_VOCAB, e)) * 0.2
    for il in range(n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
        w[p + "ffn_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
        for name, (rows, cols) in {"attn_q": (nh * d, e), "attn_k": (nkv * d, e), "attn_v": (nkv * d, e),
                                   "attn_output": (e, nh * d), "ffn_gate": (f, e), "ffn_up": (f, e),
                                   "ffn_down": (e, f)}.items():
            m = r.standard_normal((rows, cols)) / math.sqrt(cols)
            if name == "ffn_down":  # heavy-tailed columns, as real models have: the searches' rare paths
                m *= np.exp(r.standard_normal(cols) * 0.7)[None, :]
            w[p + name + ".weight"] = m
        if arch == "qwen2":
            for name, n in (("attn_q", nh * d), ("attn_k", nkv * d), ("attn_v", nkv * d)):
                w[p + name + ".bias"] = 0.1 * r.standard_normal(n)
        if arch in ("qwen3", "gemma3"):
            w[p + "attn_q_norm.weight"] = 1 + 0.1 * r.standard_normal(d)
            w[p + "attn_k_norm.weight"] = 1 + 0.1 * r.standard_normal(d)
        if arch == "gemma3":
            w[p + "post_attention_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
            w[p + "post_ffw_norm.weight"] = 1 + 0.1 * r.standard_normal(e)
    return meta, {k: v.astype(np.float32) for k, v in w.items()}


def write_model(name: str, out_dir: str | os.PathLike[str]) -> Path:
    """Model ``name`` (``llama-f32``, ``gemma3-f16``, ...) as OUT_DIR/NAME.gguf: matrices in F32 or F16, 1-D
    tensors in F32 (as llama.cpp's converter writes them); general.file_type 0 or 1."""
    arch, dt = name.rsplit("-", 1)
    meta, w = weights(arch)
    t = G.F16 if dt == "f16" else G.F32
    meta = {"general.architecture": arch, "general.file_type": 1 if dt == "f16" else 0,
            **{k: v for k, v in meta.items() if k != "general.architecture"}, **vocabulary(N_VOCAB)}
    ctx = pc.Context(mem_size=1 << 30)
    tensors = {k: ctx.from_numpy(v, type=t if v.ndim == 2 else G.F32, name=k) for k, v in w.items()}
    path = Path(out_dir) / f"{name}.gguf"
    pc.gguf.save(path, tensors, meta)
    return path


def importance(name: str) -> imatrix_file.Imatrix:
    """A seeded importance matrix for model ``name``: every matrix of the blocks (what llama-imatrix records),
    log-normal sums over a made-up count of tokens, a few columns never active."""
    arch = name.rsplit("-", 1)[0]
    _, w = weights(arch)
    r = np.random.default_rng(SHAPES[arch][0] + 1000)
    entries = {}
    for k in sorted(w):
        if k.startswith("blk.") and w[k].ndim == 2:
            sums = np.exp(r.standard_normal(w[k].shape[1]) * 1.5).astype(np.float32) * 512
            sums[r.integers(0, len(sums), len(sums) // 16)] = 0.0
            entries[k] = imatrix_file.Entry(sums[None, :], np.array([512], np.int64))
    return imatrix_file.Imatrix(entries, ["made-up.txt"], 1, 512)


def write_importance(name: str, out_dir: str | os.PathLike[str]) -> Path:
    path = Path(out_dir) / f"{name}.imatrix.gguf"
    imatrix_file.save(path, importance(name))
    return path


def write_gemma_f16(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Gemma 3 270M (the Q4_K_M test model) dequantized to F16: every quantized tensor's values (exact float32
    from its blocks) rounded to F16, the rest as stored, metadata as is but general.file_type 1."""
    with pc.gguf.load(source) as f:
        meta = {}
        for k in f.meta:
            t = f.meta_types[k]
            meta[k] = (f.meta[k], t, f.meta.element_types[k]) if t == V.ARRAY else (f.meta[k], t)
        meta["general.file_type"] = (1, V.UINT32)
        ctx = pc.Context(mem_size=1 << 34)
        out = {}
        for name, t in f.tensors.items():
            if t.traits.is_quantized:
                vals = pc.quant.dequantize(f.tensor_bytes(name).reshape(-1, t.nb[1]), t.type)
                shape = tuple(reversed(f.tensor_info[name].ne))  # NumPy order of the stored extents
                out[name] = ctx.from_numpy(vals.reshape(shape), type=G.F16, name=name)
            else:
                out[name] = t
        pc.gguf.save(path, out, meta)
    return Path(path)


def sha256(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_digests(path: str | os.PathLike[str]) -> tuple[list[tuple[str, str, str]], str]:
    """[(name, type, first 16 hex digits of its data's sha256)] in file order, and the header's digest (every
    byte before the tensor data: metadata and tensor infos)."""
    with pc.gguf.load(path) as f:
        out = [(ti.name, ti.type.name, hashlib.sha256(f.tensor_bytes(ti.name)).hexdigest()[:16])
               for ti in f.tensor_info.values()]
        with open(path, "rb") as fh:
            head = hashlib.sha256(fh.read(f.data_offset)).hexdigest()[:16]
    return out, head
