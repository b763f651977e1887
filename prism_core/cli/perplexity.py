"""``prism perplexity MODEL -f TEXT``: a model's perplexity on a text, as llama.cpp's llama-perplexity measures it."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..settings import ENV_THREADS
from .args import int_at_least


def add_parser(sub) -> None:
    p = sub.add_parser("perplexity", help="a model's perplexity on a text, measured as llama.cpp's llama-perplexity")
    p.add_argument("model", help="a GGUF model (a path, or a known model name: gemma3-270m)")
    p.add_argument("-f", "--file", required=True, help="the text file")
    p.add_argument("-c", "--ctx-size", type=int_at_least(4), default=512, help="tokens per chunk (default 512)")
    p.add_argument("--chunks", type=int_at_least(1), default=None, help="at most this many chunks (default: all)")
    p.add_argument("--backend", default=None, help="backend name (default: the best available)")
    p.add_argument("-t", "--threads", type=int_at_least(1), default=None, help="threads per kernel")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the running estimates")
    p.set_defaults(func=cmd_perplexity)


def cmd_perplexity(args: argparse.Namespace) -> int:
    from ..models import load
    from ..models.perplexity import perplexity
    from .imatrix import read_text
    from .models import model_path
    if args.threads is not None:
        os.environ[ENV_THREADS] = str(args.threads)
    text = read_text(args.file)
    model = load(model_path(args.model), backend=args.backend, n_ctx=args.ctx_size)

    def show(i: int, n: int, ppl: float) -> None:  # llama-perplexity's running line: [1]12.3456,[2]...
        if not args.json:
            print(f"[{i}]{ppl:.4f},", end="" if i < n else "\n", flush=True)

    r = perplexity(model, text, n_ctx=args.ctx_size, n_chunks=args.chunks, on_chunk=show)
    if args.json:
        print(json.dumps({"ppl": r.ppl, "uncertainty": r.uncertainty, "scored_tokens": r.n_scored,
                          "ctx_size": r.n_ctx, "chunks": len(r.running), "running": r.running}))
    else:
        print(f"Final estimate: PPL = {r.ppl:.4f} +/- {r.uncertainty:.5f}")
    sys.stdout.flush()
    return 0
