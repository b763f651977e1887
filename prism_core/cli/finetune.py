"""``prism finetune MODEL -f TEXT``: train LoRA adapters (or, with --full, every weight of an F32/F16 model)
on a text, with ggml-opt's progress bar, the validation perplexity after each epoch and a checkpoint of the
adapters and optimizer state after each epoch that ``--resume`` continues bit for bit."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..settings import ENV_THREADS
from .args import int_at_least, positive_float
from .run import _threads


def add_parser(sub) -> None:
    f = sub.add_parser("finetune", help="train LoRA adapters (llama.cpp's GGUF format) or an F32/F16 model on a text")
    f.add_argument("model", help="a GGUF file, or a known model name: gemma3-270m")
    f.add_argument("-f", "--file", required=True, help="the training text (UTF-8)")
    f.add_argument("-o", "--output", default=None,
                   help="the adapter to write (default lora-MODEL.gguf; with --full: MODEL-finetuned.gguf)")
    f.add_argument("--lora-rank", type=int_at_least(1), default=8, help="adapter rank r (default 8)")
    f.add_argument("--lora-alpha", type=positive_float, default=None,
                   help="adapter alpha: the product is scaled by alpha / r (default: r, scale 1)")
    f.add_argument("--lora-targets", default="attn_q,attn_k,attn_v,attn_output",
                   help="matrices to adapt, comma-separated from attn_q, attn_k, attn_v, attn_output, ffn_gate, "
                        "ffn_up, ffn_down (default: the attention ones)")
    f.add_argument("--full", action="store_true", help="train every weight (F32/F16 models only) and write a "
                                                       "complete GGUF instead of an adapter")
    f.add_argument("-c", "--ctx", type=int_at_least(2), default=256, help="tokens per training window (default 256)")
    f.add_argument("--stride", type=int_at_least(1), default=None, help="tokens between windows (default ctx / 2)")
    f.add_argument("-b", "--batch", type=int_at_least(1), default=1, help="windows per optimizer step (default 1)")
    f.add_argument("-ub", "--ubatch", type=int_at_least(1), default=None,
                   help="windows per graph; batch / ubatch graphs accumulate gradients per step (default: batch)")
    f.add_argument("--epochs", type=int_at_least(1), default=2, help="passes over the training windows (default 2)")
    f.add_argument("--lr", type=positive_float, default=None,
                   help="learning rate (default 1e-4 for LoRA, 1e-5 with --full)")
    f.add_argument("-wd", "--weight-decay", type=float, default=0.0, help="decoupled weight decay (default 0)")
    f.add_argument("-opt", "--optimizer", default="adamw", choices=("adamw", "sgd"))
    f.add_argument("--val-split", type=float, default=0.05, help="fraction of windows kept for validation "
                                                                "(default 0.05)")
    f.add_argument("--seed", type=int_at_least(0), default=None,
                   help="seed of the adapters' initialisation and of the data order (default 5489, ggml-opt's)")
    f.add_argument("--checkpoint", default=None, help="the checkpoint written after every epoch "
                                                      "(default OUTPUT with .checkpoint.gguf)")
    f.add_argument("--resume", action="store_true", help="continue from the checkpoint (same settings and text)")
    f.add_argument("--backend", default=None, help="backend name (default: the best available)")
    f.add_argument("-t", "--threads", type=_threads, default=None, help="threads per kernel")
    f.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="ggml-opt's progress bar on stderr (default: only when stderr is a terminal)")
    f.set_defaults(func=cmd_finetune)


def default_output(model: str, full: bool) -> str:
    stem = Path(model).name.removesuffix(".gguf")
    return f"{stem}-finetuned.gguf" if full else f"lora-{stem}.gguf"


def checkpoint_path(output: str) -> str:
    return output.removesuffix(".gguf") + ".checkpoint.gguf"


def cmd_finetune(args: argparse.Namespace) -> int:
    from ..finetune import FinetuneConfig, finetune
    from ..finetune.export import save_full
    from ..finetune.session import DEFAULT_SEED
    from ..models import load
    from .models import model_path
    if args.threads is not None:
        os.environ[ENV_THREADS] = str(args.threads)
    output = args.output or default_output(args.model, args.full)
    ckpt = args.checkpoint or checkpoint_path(output)
    try:
        with open(args.file, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        print(f"prism finetune: cannot read the training text {args.file}: {e}", file=sys.stderr)
        return 2  # a usage error, as prism_core.cli.exit_status maps an unreadable model file
    cfg = FinetuneConfig(rank=args.lora_rank, alpha=args.lora_alpha, targets=args.lora_targets, full=args.full,
                         n_ctx=args.ctx, stride=args.stride, batch=args.batch, ubatch=args.ubatch,
                         epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay, optimizer=args.optimizer,
                         val_split=args.val_split, seed=DEFAULT_SEED if args.seed is None else args.seed)
    model = None
    try:
        cfg = cfg.checked()
        model = load(model_path(args.model, args.progress), backend=args.backend, n_ctx=args.ctx, n_batch=args.ctx)
        t0 = time.perf_counter()
        res = finetune(model, text, cfg, checkpoint=ckpt, resume=args.resume, progress=args.progress)
        seconds = time.perf_counter() - t0
        if cfg.full:
            save_full(model.meta, model.weights.tensors, res.full, output)
        else:
            res.lora.save(output, model.hparams.arch, {"general.name": f"prism finetune of "
                                                                        f"{Path(args.model).name}"})
    except KeyboardInterrupt:
        kept = f"the last checkpoint, {ckpt}, is intact" if os.path.exists(ckpt) else "no checkpoint was written yet"
        print(f"\nprism finetune: interrupted; {kept} (continue with --resume)", file=sys.stderr)
        return 130
    n_tok = (len(res.history) - res.resumed_from) * res.n_train_windows * cfg.n_ctx
    print(f"prism finetune: wrote {output} ({'full model' if cfg.full else f'rank {cfg.rank} adapter on '}"
          f"{'' if cfg.full else ','.join(cfg.targets)}); {res.n_windows} windows of {cfg.n_ctx} tokens, "
          f"{res.n_train_windows} for training; {n_tok} training tokens in {seconds:.1f} s; "
          f"validation perplexity {res.val_perplexity:.4g}; checkpoint {ckpt}", file=sys.stderr)
    return 0
